"""fuse-int8-matmul: a QDQ MatMul and its bias Add -> com.microsoft.MatMulIntegerToFloat with
the bias, on the cpu target; what it refuses, and that the int8 model onnxruntime runs computes
the same before and after at two values of each symbolic dimension."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from infercc.passes import PassContext
from tests.helpers import op_counts, optimize_proto, parse

PASSES = ["fuse-int8-matmul", "eliminate-dead-code"]


def _ints(n: int, lo: int, hi: int) -> str:
    return ", ".join(str(lo + (i * 7) % (hi - lo + 1)) for i in range(n))


def _floats(n: int, scale: float) -> str:
    return ", ".join(f"{((i * 5) % 11 - 5) * scale}" for i in range(n))


# x [B, S, 16] -> uint8 per tensor; w1 int8 per column (axis 1) + bias; w2 int8 per tensor + bias
# read from the left; w3 without a bias (not this pass's business).
QDQ = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[B,S,16] x) => (float[B,S,8] y1, float[B,S,8] y2, float[B,S,8] y3)
<float xs = {{0.02}}, uint8 xz = {{128}},
 int8[16,8] w1 = {{{_ints(128, -100, 100)}}}, float[8] s1 = {{{_floats(8, 0.0005)}}},
 int8[8] z1 = {{0, 0, 0, 0, 0, 0, 0, 0}}, float[8] b1 = {{{_floats(8, 0.3)}}},
 int8[16,8] w2 = {{{_ints(128, -120, 90)}}}, float s2 = {{0.004}}, int8 z2 = {{0}},
 float[8] b2 = {{{_floats(8, -0.2)}}}, int8[16,8] w3 = {{{_ints(128, -60, 60)}}}>
{{
  q = QuantizeLinear(x, xs, xz)
  a = DequantizeLinear(q, xs, xz)
  d1 = DequantizeLinear <axis = 1> (w1, s1, z1)
  ["proj1"] m1 = MatMul(a, d1)
  y1 = Add(m1, b1)
  d2 = DequantizeLinear(w2, s2, z2)
  m2 = MatMul(a, d2)
  y2 = Add(b2, m2)
  d3 = DequantizeLinear(w3, s2, z2)
  y3 = MatMul(a, d3)
}}
"""


def _session_outputs(proto, feeds) -> list[np.ndarray]:
    """onnxruntime with its default optimizations: how the int8 model is deployed (the QDQ
    MatMul becomes MatMulIntegerToFloat in the session)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _run(proto, ctx: PassContext | None = None):
    ctx = ctx or PassContext()
    out, report = optimize_proto(proto, PASSES, ctx)
    reasons = [r.reason for r in ctx.refusals if r.pass_name == "fuse-int8-matmul"]
    return out, report.passes["fuse-int8-matmul"].counts.get("fused", 0), reasons


def test_a_projection_and_its_bias_become_one_matmul_integer_to_float() -> None:
    proto = parse(QDQ)
    out, fused, _ = _run(proto)
    assert fused == 2
    counts = op_counts(out)
    assert counts["MatMulIntegerToFloat"] == 2 and "Add" not in counts
    assert counts["MatMul"] == 1 and counts["DequantizeLinear"] == 2  # w3's projection, as it was
    assert [o.name for o in out.graph.output] == ["y1", "y2", "y3"]
    fused_names = [n.name for n in out.graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert "proj1" in fused_names  # the projection keeps its name
    rng = np.random.default_rng(0)
    for b, s in ((1, 5), (3, 2)):
        feeds = {"x": rng.standard_normal((b, s, 16)).astype(np.float32)}
        want, got = _session_outputs(proto, feeds), _session_outputs(out, feeds)
        for w, g in zip(want, got, strict=True):
            assert w.shape == g.shape == (b, s, 8)
            np.testing.assert_array_equal(g, w)
    again, fused_again, _ = _run(out)
    assert fused_again == 0 and again.SerializeToString() == out.SerializeToString()


@pytest.mark.parametrize(
    ("ctx", "why"),
    [
        (PassContext(target="a100"), "a GPU target"),
        (PassContext(portable=True), "--portable"),
        (PassContext(backend="tensorrt"), "the TensorRT backend"),
    ],
)
def test_only_onnxruntime_on_the_cpu_gets_the_contrib_op(ctx: PassContext, why: str) -> None:
    out, fused, _ = _run(parse(QDQ), ctx)
    assert fused == 0, why
    assert "MatMulIntegerToFloat" not in op_counts(out)


def test_a_matmul_read_by_more_than_its_bias_add_is_refused_with_the_reason() -> None:
    text = QDQ.replace("(float[B,S,8] y1,", "(float[B,S,8] m1, float[B,S,8] y1,")
    out, fused, reasons = _run(parse(text))
    assert fused == 1
    assert "the MatMul's output is read by more than its bias Add" in reasons


def test_a_weight_scaled_per_row_is_refused_with_the_reason() -> None:
    text = QDQ.replace("float[8] s1", "float[16] s1").replace(
        "int8[8] z1 = {0, 0, 0, 0, 0, 0, 0, 0}", "int8[16] z1 = {" + ", ".join(["0"] * 16) + "}"
    )
    text = text.replace(_floats(8, 0.0005), _floats(16, 0.0005)).replace(
        "d1 = DequantizeLinear <axis = 1>", "d1 = DequantizeLinear <axis = 0>"
    )
    out, fused, reasons = _run(parse(text))
    assert fused == 1
    assert "the weight is not quantized per tensor or per column" in reasons
