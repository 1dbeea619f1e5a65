"""fuse-gemm: MatMul by a constant plus a constant bias into one Gemm, at rank 2 and through
the Reshapes around a windowed or token-wise linear layer."""

from __future__ import annotations

import numpy as np
import pytest

from infercc.passes import PassContext
from tests.helpers import op_counts, optimize_proto, parse, random_feeds, run_ort

PASSES = ["fuse-gemm", "eliminate-dead-code"]
W = "float[8,6] w = {" + ", ".join(f"{(i % 7) * 0.25 - 0.75}" for i in range(48)) + "}"
B = "float[6] b = {0.5, -1.0, 0.25, 2.0, -0.125, 1.5}"


def _run(body: str, opset: int = 17):
    proto = parse(f'<ir_version: 8, opset_import: ["" : {opset}]>\n' + body)
    ctx = PassContext()
    out, report = optimize_proto(proto, PASSES, ctx)
    counts = _fired(report)
    reasons = [r.reason for r in ctx.refusals if r.pass_name == "fuse-gemm"]
    return proto, out, counts, reasons


def _fired(report) -> dict[str, int]:
    return {k: v for k, v in report.passes["fuse-gemm"].counts.items() if v and k != "refused"}


def _same_bits_at_two_sizes(a, b) -> None:
    """onnxruntime runs the Gemm it made of MatMul + Add before: the same bits, at N = 1 and 3."""
    for n in (1, 3):
        feeds = random_feeds(a, seed=n, dims=n)
        for x, y in zip(run_ort(a, feeds), run_ort(b, feeds), strict=True):
            assert x.shape == y.shape
            np.testing.assert_array_equal(x, y)


def test_rank_2_matmul_and_bias_become_one_gemm():
    proto, out, counts, _ = _run(
        f"g (float[N,8] x) => (float[N,6] y) <{W}, {B}>"
        ' { ["fc1"] m = MatMul(x, w)  y = Add(m, b) }'
    )
    assert op_counts(out) == {"Gemm": 1}
    assert out.graph.node[0].name == "fc1"  # the layer keeps its name (--exclude names it)
    assert counts == {"rank2": 1}
    assert [o.name for o in out.graph.output] == ["y"]
    _same_bits_at_two_sizes(proto, out)


WINDOWED = f"""
g (float[N,2,4,8] x) => (float[N,2,4,6] y)
<{W}, {B}, int64[3] t1 = {{-1, 4, 8}}, int64[4] t2 = {{-1, 2, 4, 6}}> {{
  r = Reshape(x, t1)
  m = MatMul(r, w)
  a = Add(b, m)
  o = Reshape(a, t2)
  y = Relu(o)
}}
"""


def test_windowed_linear_through_reshapes_loses_one_node():
    proto, out, counts, _ = _run(WINDOWED)
    assert op_counts(out) == {"Reshape": 2, "Gemm": 1, "Relu": 1}
    assert counts == {"through_reshapes": 1}
    _same_bits_at_two_sizes(proto, out)
    _, again, counts2, _ = _run_proto(out)
    assert counts2 == {} and again.SerializeToString() == out.SerializeToString()


def _run_proto(proto):
    ctx = PassContext()
    out, report = optimize_proto(proto, PASSES, ctx)
    return proto, out, _fired(report), ctx


@pytest.mark.parametrize(
    ("t2", "reason"),
    [
        ("int64[4] t2 = {0, 2, 4, 6}", "copies a dimension"),
        ("int64[4] t2 = {-1, 2, 4, 6}", None),
    ],
)
def test_an_outer_target_that_copies_a_dimension_is_refused(t2, reason):
    body = WINDOWED.replace("int64[4] t2 = {-1, 2, 4, 6}", t2)
    proto, out, counts, reasons = _run(body)
    if reason is None:
        assert counts == {"through_reshapes": 1}
        return
    assert counts == {} and op_counts(out)["MatMul"] == 1
    assert any(reason in r for r in reasons), reasons


def test_a_computed_outer_target_is_refused():
    body = f"""
g (float[N,2,4,8] x) => (float[N,2,4,6] y)
<{W}, {B}, int64[3] t1 = {{-1, 4, 8}}, int64[3] tail = {{2, 4, 6}}, int64[1] i0 = {{0}}> {{
  r = Reshape(x, t1)
  m = MatMul(r, w)
  a = Add(m, b)
  s = Shape(x)
  n = Gather(s, i0)
  t2 = Concat<axis=0>(n, tail)
  y = Reshape(a, t2)
}}
"""
    _, out, counts, reasons = _run(body)
    assert counts == {} and op_counts(out)["MatMul"] == 1
    assert any("no constant target" in r for r in reasons), reasons


@pytest.mark.parametrize(
    "body",
    [
        # a bias that varies along rows is no Gemm C broadcast over [M, N]
        f"g (float[4,8] x) => (float[4,6] y) <{W}, float[4,6] b = {{"
        + ", ".join(["0.5"] * 24)
        + "}> { m = MatMul(x, w)  y = Add(m, b) }",
        # the MatMul's result has another reader
        f"g (float[N,8] x) => (float[N,6] y, float[N,6] m) <{W}, {B}> "
        "{ m = MatMul(x, w)  y = Add(m, b) }",
        # the weight is no constant
        "g (float[N,8] x, float[8,6] w) => (float[N,6] y) <" + B + "> "
        "{ m = MatMul(x, w)  y = Add(m, b) }",
        # a rank-3 MatMul with no Reshape around it: Gemm would need two new nodes
        f"g (float[N,4,8] x) => (float[N,4,6] y) <{W}, {B}> {{ m = MatMul(x, w)  y = Add(m, b) }}",
    ],
)
def test_what_is_no_gemm_is_left_alone(body):
    proto, out, counts, _ = _run(body)
    assert counts == {} and op_counts(out)["MatMul"] == 1
    assert op_counts(out) == op_counts(proto)


def test_opsets_below_11_are_refused():
    _, out, counts, reasons = _run(
        f"g (float[N,8] x) => (float[N,6] y) <{W}, {B}> {{ m = MatMul(x, w)  y = Add(m, b) }}",
        opset=10,
    )
    assert counts == {} and any("opset below 11" in r for r in reasons)
