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
# Every case with a com.microsoft node (FusedConv, Attention) moved when the file began to
# state those nodes' output types (value_info), which onnx cannot infer: a model read back is
# sized (and scheduled) as it was written; the graphs are otherwise byte for byte the same.
RECORDED = {
    "small_cnn": "b4d88b50707fc702fa4d0d7247921a1d2d057c11741c3abefc3628bceec72fcb",
    "small_cnn-portable": "96bf4a5d899ea628d6be82d1a3f5a8b7c492f436d05b931cff1081a76b750030",
    "small_cnn-fp16": "9a1fd7d209d4be7d7996f1fa5d9d738b526bcb8f17f342a926f6ae5e28b1af1d",
    "tiny_encoder": "6f3637f11feb42bd0e78d15b959294f21e8e37a1683bf84cfe864e9aa65b4228",
    "tiny_encoder-portable": "d8cf4a1203f5ee7dcfd433994303eccbefd0f0d3f0693f1a16892dc9063e5c99",
    "tiny_encoder-fp16": "84143a0fb9eb93819237ab33530b006db7e99eb31e187449ce2d1f8a3970437d",
    "light_resnet50": "40173158df572b7c45127620ccf3592f5ffdde11f9c1e701aed404d2e78de760",
    "light_densenet121": "62bd1929c8e20bba3fbcf4f9920fd098989c3b6a0855cca7fb7c9a4a600bbe53",
    "light_inception_v1": "e456270690573add4ee05898398588bee3a47e667a5d1c4e1a81c4decda60b62",
    "light_inception_v2": "755cb649513a456f40cb7e08cd0957e3107f3bbf6a2a2380a036adf965a18aac",
    "light_shufflenet": "21f9508e7bddf0449c37c1c646abd74d9228f3dcdf0f9e3417e122b610ba1821",
    "light_squeezenet": "e1222e47998c660de03672d94195fe86f4c7ad7e66fa9716148fcb15cb9c20fc",
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


def _without_provenance(path: Path) -> bytes:
    """The file's bytes less the build's own record (`infercc.*` metadata_props, whose version
    moves with every release; tests/test_provenance.py checks it). The writer puts the model's
    fields but the graph first (its shell), then the graph: the shell is cut out, the record
    dropped from it, and the rest of the file kept byte for byte."""
    data = path.read_bytes()
    model = onnx.load_from_string(data)
    model.ClearField("graph")
    shell = model.SerializeToString()
    assert data.startswith(shell)
    assert any(p.key == "infercc.version" for p in model.metadata_props)
    kept = [p for p in model.metadata_props if not p.key.startswith("infercc.")]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model.SerializeToString() + data[len(shell) :]


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
    digest = hashlib.sha256(_without_provenance(out)).hexdigest()
    if os.environ.get("INFERCC_PRINT_HASHES"):
        with open(os.environ["INFERCC_PRINT_HASHES"], "a") as f:
            f.write(f'    "{case}": "{digest}",\n')
    assert digest == RECORDED[case], f"{case}: the optimized bytes changed"
