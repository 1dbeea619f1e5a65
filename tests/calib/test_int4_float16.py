"""int4 of float16 models (what `model.half()` exports): the scales, a Gemm's bias and the
embedding scales are stored as float16, so the rewritten nodes compute in the model's own
type, and onnxruntime gives the float16 dequantized product."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as oh

from infercc.passes.quantize_int4 import quantize_rtn
from tests.calib.test_int4 import _model, quantized, rel_err, run


def _f16_matmul(k: int, n: int) -> tuple:
    w = (0.05 * np.random.default_rng(3).standard_normal((k, n))).astype(np.float16)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", "seq", k])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", "seq", n])
    node = oh.make_node("MatMul", ["x", "w"], ["y"], name="proj")
    return _model([node], [x], [y], {"w": w}), w


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("form", ["nbits", "dq"])
def test_float16_matmul_stays_float16(form, symmetric):
    proto, w = _f16_matmul(96, 24)
    out, report = quantized(proto, form=form, symmetric=symmetric, block_size=32)
    assert report.quantized == ["proj"]
    assert report.weight_bytes_before == w.nbytes  # 2 bytes a weight, not 4
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops == ({"MatMulNBits": 1} if form == "nbits" else {"DequantizeLinear": 1, "MatMul": 1})
    scales = [t for t in out.graph.initializer if "scale" in t.name]
    assert [t.data_type for t in scales] == [TensorProto.FLOAT16]
    reference = quantize_rtn(w, 32, symmetric).dequantize()
    for shape in [(1, 1, 96), (2, 5, 96)]:  # symbolic batch and sequence at two shapes
        x = np.random.default_rng(7).standard_normal(shape).astype(np.float16)
        got = run(out, {"x": x})
        assert got.dtype == np.float16 and got.shape == (*shape[:2], 24)
        want = x.astype(np.float32) @ reference
        assert rel_err(got.astype(np.float32), want) < 5e-3  # float16 arithmetic
        assert rel_err(got.astype(np.float32), x.astype(np.float32) @ w) < 0.2


def test_float16_scales_are_the_ones_the_codes_were_rounded_to():
    w = (0.05 * np.random.default_rng(4).standard_normal((64, 8))).astype(np.float16)
    blocks = quantize_rtn(w, 32, False)
    assert np.array_equal(blocks.scales, blocks.scales.astype(np.float16).astype(np.float32))


def test_float16_gemm_bias_and_embedding():
    rng = np.random.default_rng(5)
    table = (0.1 * rng.standard_normal((50, 64))).astype(np.float16)
    w = (0.05 * rng.standard_normal((64, 16))).astype(np.float16)
    b = (0.1 * rng.standard_normal(16)).astype(np.float16)
    ids = oh.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 16])
    nodes = [
        oh.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        oh.make_node("Gemm", ["e", "w", "b"], ["y"], name="fc"),
    ]
    proto = _model(nodes, [ids], [y], {"table": table, "w": w, "b": b})
    out, report = quantized(proto, form="nbits", symmetric=False, embeddings=True)
    assert report.quantized == ["fc"] and report.embeddings == ["embed"]
    assert Counter(n.op_type for n in out.graph.node) == {
        "GatherBlockQuantized": 1,
        "MatMulNBits": 1,
    }
    kinds = {t.name: t.data_type for t in out.graph.initializer}
    assert kinds["fc_bias"] == kinds["fc_int4_scales"] == TensorProto.FLOAT16
    assert kinds["embed_int4_scales"] == TensorProto.FLOAT16
    feeds = {"ids": np.array([0, 7, 49], np.int64)}
    got = run(out, feeds).astype(np.float32)
    e = quantize_rtn(table.T, 32, False).dequantize().T[feeds["ids"]]
    want = e @ quantize_rtn(w, 32, False).dequantize() + b.astype(np.float32)
    assert rel_err(got, want) < 5e-3
