"""Refactoring changes no output byte: the optimized bytes of the shipped examples and of
onnx's light models (weights made random with numpy only, so the inputs are the same on every
machine) are compared with hashes recorded before the code was restructured.

A pass that changes on purpose changes these hashes: rerun with INFERCC_PRINT_HASHES=FILE to
write the new ones to FILE, and say in the commit why the bytes moved.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import infercc
from tests.zoo import SMALL, _roles, data_input, light_path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (case, sha256 of the optimized model's bytes). The examples' hashes were recomputed when the
# examples moved from IR 14 to IR 8; the optimized models are otherwise equal field for field.
# tiny_encoder's moved when fold-shapes came: its four head-split Reshape targets, computed from
# Shape(x) with a symbolic batch, became constants [0, 0, 4, 8] and the like (24 -> 19 nodes).
# tiny_encoder's (default and fp16) changed on purpose when emit-attention made its attention
# block one com.microsoft.Attention; the portable build, which keeps standard ONNX, did not.
# small_cnn-fp16 moved when fuse-conv-activation began to run after convert-fp16 (its Convs are
# float16 now, not FusedConv kept in float32).
# small_cnn (default and portable) and the light models with Conv+BatchNormalization moved when
# fuse-conv-bn-relu began to fold Conv+BN as onnxruntime's ConvBNFusion does (float32 steps in
# its order instead of float64 rounded once): the folded weights are onnxruntime's own bytes.
RECORDED = {
    "small_cnn": "1a552a2b2feba44cf8e5ee5f65ce28a5f003148e6e6011e5ba9ce607616bc938",
    "small_cnn-portable": "96bf4a5d899ea628d6be82d1a3f5a8b7c492f436d05b931cff1081a76b750030",
    "small_cnn-fp16": "9a1fd7d209d4be7d7996f1fa5d9d738b526bcb8f17f342a926f6ae5e28b1af1d",
    "tiny_encoder": "cf32df24510e5549d4f872afb911c79e5d9eb2d589bd8587dc614539a7fbbb42",
    "tiny_encoder-portable": "d8cf4a1203f5ee7dcfd433994303eccbefd0f0d3f0693f1a16892dc9063e5c99",
    "tiny_encoder-fp16": "0583fab1ba26b311d5c8fdac2ef1ab4bc47770ddec914be8b7f7f9bce57db953",
    "light_resnet50": "3c01c7b4cfe9430a7b94d7f5b2c192031949515f79b667302d399075570c3608",
    "light_densenet121": "e4fef0b98da9e1248628fdb864db4276e7e91ab8e3c8ef85f4a8a74c59494407",
    "light_inception_v1": "9bd43d61b29a10eeb27382afbbcfb240e2982cdf6870ab5c3527bb41059aa7b8",
    "light_inception_v2": "d3fdea20458a08f4783f351e4b437db3bfaf71072e17a89d6a851fabb7ad0b43",
    "light_shufflenet": "9e6d76901da0c6f4296584cf8bd2c43ae3e4520578e7477cb0682e56db220a6f",
    "light_squeezenet": "82b70c998e058d0768cf37c5922113d19854abf09c8ae7dc21c5ba2e3c329317",
}


def numpy_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """The light model with each ConstantOfShape weight replaced by seeded normal values."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    roles = _roles(g)
    keep = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = tuple(int(s) for s in consts[n.input[0]])
            arr = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            if roles.get(n.output[0]) == "bn_var":
                arr = np.abs(arr) + 0.5
            g.initializer.append(numpy_helper.from_array(arr, n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    used = {x for n in g.node for x in n.input}
    live = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(live)
    del g.input[:]
    g.input.append(data_input(model))
    out.ir_version = max(out.ir_version, 4)
    return out


def _cases() -> list[tuple[str, str, dict]]:
    cases = []
    for stem in ("small_cnn", "tiny_encoder"):
        cases.append((f"{stem}", stem, {}))
        cases.append((f"{stem}-portable", stem, {"portable": True}))
        cases.append((f"{stem}-fp16", stem, {"fp16": True}))
    cases += [(f"light_{name}", name, {}) for name in SMALL]
    return cases


def _source(stem: str, tmp_path: Path) -> Path:
    if (EXAMPLES / f"{stem}.onnx").is_file():
        return EXAMPLES / f"{stem}.onnx"
    path = tmp_path / f"{stem}.onnx"
    onnx.save(numpy_random_weights(onnx.load(light_path(stem))), path)
    return path


@pytest.mark.parametrize(("case", "stem", "options"), _cases(), ids=[c[0] for c in _cases()])
def test_optimized_bytes_unchanged(case: str, stem: str, options: dict, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    infercc.optimize(_source(stem, tmp_path), out, run_validation=False, **options)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    if os.environ.get("INFERCC_PRINT_HASHES"):
        with open(os.environ["INFERCC_PRINT_HASHES"], "a") as f:
            f.write(f'    "{case}": "{digest}",\n')
    assert digest == RECORDED[case], f"{case}: the optimized bytes changed"
