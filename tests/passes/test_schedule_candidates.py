"""schedule-memory's candidate orders: depth-first beats greedy on an Inception-like block, the
winner is counted, the result is a fixpoint, the floor bounds every order, a cycle is named."""

from __future__ import annotations

import onnx
import pytest

import infercc.passes.schedule  # noqa: F401  (registers schedule-memory)
from infercc.analysis.memory import peak_live, value_sizes
from infercc.ir import IRError, export_model, import_model
from infercc.passes import PassContext
from infercc.passes.schedule import (
    CANDIDATES,
    Dependencies,
    SchedulePeaks,
    best_order,
    floor,
    greedy_order,
    schedule_memory,
)
from tests import branchy
from tests.helpers import assert_same_outputs, optimize_proto, parse

SHAPE = {"x": (1, 3, 8, 8)}
KIB = 1024


def test_depth_first_beats_greedy_on_four_branches():
    # inception(1, 8, 8): x0 = Relu(Conv(x)) is 2 KiB and feeds four branches; the third
    # widens it to 64 channels (16 KiB, twice: Conv then Relu) before a 3x3 conv takes it back
    # to 4 channels (1 KiB, as every branch's result). The file's order runs two small branches
    # before the wide one: x0 + 2 results + 16 + 16 = 36 KiB. Greedy (smallest increase first)
    # runs all three small branches first, so x0 dies at the wide Conv, but three results are
    # live under the wide Relu: 3 + 16 + 16 = 35 KiB. Depth-first runs the branch that needs the
    # most first, while only x0 is live: 2 + 16 + 16 = 34 KiB.
    proto = branchy.inception(1, 8, 8)
    model = import_model(proto)
    sizes, _ = value_sizes(model, SHAPE)
    assert peak_live(model.graph.nodes, model.graph, sizes) == 36 * KIB
    assert peak_live(greedy_order(model.graph, sizes), model.graph, sizes) == 35 * KIB
    result = schedule_memory(model.graph, PassContext())
    model.graph.lint()
    assert result.stats == {"reordered": 1, "by_depth_first": 1}
    assert result.details == SchedulePeaks(peak_before=36 * KIB, peak_after=34 * KIB)
    names = [n.name for n in model.graph]
    assert names[:4] == ["conv2", "relu3", "conv14", "relu15"]  # stem, then the wide branch
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(proto, out)


def test_the_pipeline_counts_the_winner_and_reaches_a_fixpoint():
    proto = branchy.inception(2, 8, 8)
    out, report = optimize_proto(proto)
    stats = report.passes["schedule-memory"]
    assert stats.counts == {"reordered": 1, "by_depth_first": 1}
    peaks = report.details("schedule-memory")
    assert peaks.peak_after < peaks.peak_before
    assert_same_outputs(proto, out)
    again, report2 = optimize_proto(out)
    assert report2.passes["schedule-memory"].counts == {"reordered": 0}
    assert report2.details("schedule-memory") == SchedulePeaks(peaks.peak_after, peaks.peak_after)
    assert again.SerializeToString() == out.SerializeToString()


@pytest.mark.parametrize("build", [branchy.resnet_tower, branchy.inception, branchy.unet])
def test_floor_bounds_every_order(build):
    model = import_model(build())
    sizes, _ = value_sizes(model, {"x": tuple(model.graph.inputs[0].shape)})
    deps = Dependencies.of(model.graph)
    least = floor(deps, sizes)
    assert least > 0
    peaks = [peak_live(deps.nodes, model.graph, sizes)]
    peaks += [peak_live(make(deps, sizes), model.graph, sizes) for _, make in CANDIDATES]
    assert min(peaks) >= least
    winner, order, peak = best_order(deps, sizes, peaks[0])
    assert peak == min(peaks)
    assert sorted(map(id, order)) == sorted(map(id, deps.nodes))


def test_no_candidate_runs_when_the_order_is_at_the_floor(monkeypatch):
    # a residual tower peaks at one conv's input and output already: nothing can be lower
    model = import_model(branchy.resnet_tower())
    sizes, _ = value_sizes(model, {"x": (1, 3, 32, 32)})
    deps = Dependencies.of(model.graph)
    current = peak_live(deps.nodes, model.graph, sizes)
    assert current == floor(deps, sizes)

    def fail(*_args):
        raise AssertionError("a candidate ran")

    monkeypatch.setattr(infercc.passes.schedule, "CANDIDATES", [("greedy", fail)])
    assert best_order(deps, sizes, current) == (None, deps.nodes, current)


def test_dependency_graph_has_an_edge_per_producer_and_reader():
    proto = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 1] x, bool c) => (float[1, 1] y) {
  t = MatMul(x, x)
  u = Neg(t)
  r = If (c) <
    then_branch = then_g () => (float[1, 1] o1) { o1 = ReduceSum <keepdims = 1> (u) },
    else_branch = else_g () => (float[1, 1] o2) { o2 = ReduceMax <keepdims = 1> (t) }
  >
  y = Add(r, t)
}""")
    model = import_model(proto)
    deps = Dependencies.of(model.graph)
    t, u, r, y = model.graph.nodes
    # the If reads t and u only inside its branches; t's reads are counted once per reader
    assert set(deps.dag.edges) == {(t, u), (t, r), (u, r), (r, y), (t, y)}
    assert list(deps.dag.nodes) == [t, u, r, y]


def test_a_cycle_names_its_nodes():
    proto = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) {
  a = Relu(x)
  b = Neg(a)
  c = Sigmoid(b)
  d = Abs(c)
  y = Add(d, x)
}""")
    model = import_model(proto)
    a, b, c, d, _ = model.graph.nodes
    b.set_input(0, d.output)  # b -> c -> d -> b; a is not on it
    with pytest.raises(IRError, match="cycle") as err:
        schedule_memory(model.graph, PassContext())
    message = str(err.value)
    assert all(op in message for op in ("Neg", "Sigmoid", "Abs")), message
    assert "Relu" not in message and "Add" not in message
    with pytest.raises(IRError, match=r"cycle \(involving .*Neg"):
        model.graph.toposort()
