"""One decoder fusion pipeline: what `optimize --assume nonempty-sequences` fuses on a decoder,
`calibrate --int4` fuses too, on the export and on optimize's own output (the chain), and
each build computes what the model it came from computes (under onnxruntime, at a prefill, a
decode step, a chunk at batch 3 and right padding)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc import api
from infercc.calib.weight_only import calibrate_int4
from infercc.passes.fuse_gqa import runtime_support
from tests.decoders import DECODER_SHAPES, cache_feeds, tiny_decoder
from tests.helpers import run_ort

pytestmark = pytest.mark.skipif(runtime_support() is not None, reason=str(runtime_support()))

ASSUME = ["nonempty-sequences"]
# torch's SDPA export (the Softmax's NaN guard) of a Llama-style decoder; transformers' Phi-3
# rotation at a partial_rotary_factor of 1.0 (each rotated head concatenated with x[..., D:])
FORMS = {
    "sdpa-guard": dict(norm="rms", rotary=True, kv_heads=2, attention="sdpa", guard=True),
    "empty-tail": dict(norm="rms", rotary=True, attention="bias", empty_tail=True),
}
FUSED = ("GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization")


def ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def assert_same(a: Path, b: Path, tol: float) -> None:
    pa, pb = onnx.load(a), onnx.load(b)
    for shape in DECODER_SHAPES:
        feeds = cache_feeds(pa, *shape)
        for want, got in zip(run_ort(pa, feeds), run_ort(pb, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(shape))


@pytest.fixture(scope="module", params=sorted(FORMS))
def builds(request, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp(request.param)
    src = root / "model.onnx"
    onnx.save(tiny_decoder(layers=2, hidden=64, heads=4, vocab=50, **FORMS[request.param]), src)
    api.optimize(src, root / "opt.onnx", assume=ASSUME, run_validation=False)
    paths = {"export": src, "optimize": root / "opt.onnx"}
    # the chain needs no --assume: what it allows, optimize fused already (and an assumption
    # nothing uses is refused)
    for name, model, assume in (("int4", src, ASSUME), ("chain", root / "opt.onnx", [])):
        report = calibrate_int4(
            model, root / name, speed_check=False, accuracy_level=0, assume=assume
        )
        paths[name] = root / name / "model_int4.onnx"
        paths[f"{name}-report"] = report  # type: ignore[assignment]
    return paths


def test_optimize_fuses_every_layer(builds) -> None:
    got = ops(builds["optimize"])
    assert got["GroupQueryAttention"] == 2 and got["RotaryEmbedding"] == 4
    assert got["IsNaN"] == got["Softmax"] == 0
    assert got["Concat"] == 0  # the caches are GroupQueryAttention's; no empty tail is kept
    assert_same(builds["export"], builds["optimize"], 1e-4)


@pytest.mark.parametrize("build", ["int4", "chain"])
def test_int4_fuses_what_optimize_fuses_and_more(builds, build) -> None:
    got, fp32 = ops(builds[build]), ops(builds["optimize"])
    for op in ("GroupQueryAttention", "RotaryEmbedding"):
        assert got[op] == fp32[op], op
    # every norm reads a residual sum (the first: token + position embeddings)
    assert got["SkipSimplifiedLayerNormalization"] == 5
    assert got["IsNaN"] == got["Softmax"] == got["ReduceMean"] == 0
    assert got["MatMulNBits"] == 9  # per layer Q/K/V, O, the two MLP MatMuls; the LM head
    if build == "int4":  # the chain's input has its attention fused already
        report = builds["int4-report"].to_dict()
        assert report["fusions"]["fuse-group-query-attention"] == {"fused": 2}
        (assumed,) = report["assumptions"]
        assert assumed["rewrites"]["fuse-group-query-attention"] == 2


def test_the_sdpa_guard_goes_under_the_assumption(builds) -> None:
    report = builds["int4-report"].to_dict()
    if ops(builds["export"])["IsNaN"] == 0:
        assert "remove-nan-guard" not in report["fusions"]
        return
    assert report["fusions"]["remove-nan-guard"] == {"guards": 2}
    assert report["assumptions"][0]["rewrites"]["remove-nan-guard"] == 2


def test_the_chain_is_the_int4_of_the_export(builds) -> None:
    """int4 of optimize's output: the same fused ops, the same numbers (the same weights,
    rounded the same)."""
    a, b = ops(builds["int4"]), ops(builds["chain"])
    assert {op: a[op] for op in (*FUSED, "MatMulNBits")} == {
        op: b[op] for op in (*FUSED, "MatMulNBits")
    }
    assert_same(builds["int4"], builds["chain"], 1e-4)
