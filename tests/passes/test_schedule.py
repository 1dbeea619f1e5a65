"""schedule-memory: the greedy order lowers the peak and keeps outputs; a chain stays as it is."""

from __future__ import annotations

import numpy as np
import onnx

import infercc.passes.schedule  # noqa: F401  (registers schedule-memory)
from infercc.analysis.memory import peak_live, value_sizes
from infercc.ir import export_model, import_model
from infercc.passes import PassContext
from infercc.passes.schedule import SchedulePeaks, greedy_order, relink, schedule_memory
from tests.helpers import assert_same_outputs, optimize_proto, parse

# Two branches, each a big [N, N] tensor reduced to a scalar; the given order builds both big
# tensors before reducing either.
TWO_BRANCHES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 1] x) => (float[1, 1] y) {
  xt = Transpose(x)
  a_big = MatMul(x, xt)
  b_big = Mul(x, xt)
  a_small = ReduceSum <keepdims = 1> (a_big)
  b_small = ReduceMax <keepdims = 1> (b_big)
  y = Add(a_small, b_small)
}"""

BIG = 64 * 64 * 4


def run(proto: onnx.ModelProto, shapes: dict | None = None):
    model = import_model(proto)
    ctx = PassContext(options={"shapes": shapes})
    result = schedule_memory(model.graph, ctx)
    model.graph.lint()
    return model, result, ctx


def test_greedy_order_lowers_the_peak_and_keeps_outputs():
    proto = parse(TWO_BRANCHES)
    model, result, ctx = run(proto, {"x": (64, 1)})
    assert result.changed and result.stats["reordered"] == 1
    # before: xt + a_big + b_big; after: xt + b_big + a_small (a_big reduced first)
    assert result.details == SchedulePeaks(peak_before=256 + 2 * BIG, peak_after=256 + BIG + 4)
    assert [n.output.name for n in model.graph] == [
        "xt",
        "a_big",
        "a_small",
        "b_big",
        "b_small",
        "y",
    ]
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(proto, out)
    ctx2 = PassContext(options={"shapes": {"x": (64, 1)}})
    again = schedule_memory(model.graph, ctx2)
    assert not again.changed and again.stats["reordered"] == 0
    assert again.details == SchedulePeaks(256 + BIG + 4, 256 + BIG + 4)


def test_default_shapes_when_none_are_given():
    # N defaults to 1: every tensor is 4 bytes, three live at once in either order, so the
    # order is not strictly better and stays
    _, result, ctx = run(parse(TWO_BRANCHES))
    assert result.stats == {"reordered": 0}
    assert result.details == SchedulePeaks(12, 12)


def test_pipeline_reaches_a_fixpoint():
    proto = parse(TWO_BRANCHES)
    ctx = PassContext(options={"shapes": {"x": (64, 1)}})
    out, report = optimize_proto(proto, ["schedule-memory"], ctx)
    # a reordering pass runs once, after the fixpoint: no second round, no re-inference
    assert report.reached_fixpoint and report.iterations == 1
    assert report.passes["schedule-memory"].runs == 1
    assert report.passes["schedule-memory"].counts["reordered"] == 1
    assert report.details("schedule-memory") == SchedulePeaks(256 + 2 * BIG, 256 + BIG + 4)
    assert_same_outputs(proto, out)


def test_chain_is_left_alone():
    proto = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) {
  a = Relu(x)
  b = Neg(a)
  c = Sigmoid(b)
  y = Abs(c)
}""")
    model, result, ctx = run(proto, {"x": (4, 8)})
    assert not result.changed and result.stats["reordered"] == 0
    assert result.details == SchedulePeaks(2 * 4 * 8 * 4, 2 * 4 * 8 * 4)
    assert [n.output.name for n in model.graph] == ["a", "b", "c", "y"]
    again = schedule_memory(model.graph, ctx)
    assert not again.changed
    assert [n.output.name for n in model.graph] == ["a", "b", "c", "y"]


def test_outer_scope_reads_are_dependencies():
    # `If` reads big `t` only inside its branches; it must stay after t's producer even though
    # it has no direct input from it, and the order found must keep the outputs.
    proto = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 1] x, bool c) => (float[1, 1] y) {
  xt = Transpose(x)
  t = MatMul(x, xt)
  u = Mul(x, xt)
  r = If (c) <
    then_branch = then_g () => (float[1, 1] o1) { o1 = ReduceSum <keepdims = 1> (t) },
    else_branch = else_g () => (float[1, 1] o2) { o2 = ReduceMax <keepdims = 1> (t) }
  >
  s = ReduceMin <keepdims = 1> (u)
  y = Add(r, s)
}""")
    model, result, _ = run(proto, {"x": (64, 1), "c": ()})
    names = [n.output.name for n in model.graph]
    assert names.index("t") < names.index("r")
    assert result.stats["reordered"] == 1 and names.index("r") < names.index("u")
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(0).standard_normal((64, 1)).astype(np.float32)
    for flag in (True, False):
        assert_same_outputs(proto, out, {"x": x, "c": np.array(flag)})


def test_greedy_order_is_topological_and_relink_keeps_lint():
    model = import_model(parse(TWO_BRANCHES))
    sizes, _ = value_sizes(model, {"x": (64, 1)})
    order = greedy_order(model.graph, sizes)
    assert sorted(map(id, order)) == sorted(map(id, model.graph))
    assert peak_live(order, model.graph, sizes) < peak_live(model.graph.nodes, model.graph, sizes)
    relink(model.graph, order)
    model.graph.lint()
    assert model.graph.nodes == order and len(model.graph) == len(order)
    relink(model.graph, list(reversed(order)))  # relinking itself does not check the order
    try:
        model.graph.lint()
    except Exception as e:  # the IR's lint catches a non-topological order
        assert "before it is defined" in str(e)
    else:
        raise AssertionError("lint accepted a reversed order")
