"""The memory planner: placements never collide, reach the bound where greedy is optimal,
lifetimes follow the rules (outputs to the end, subgraph reads, unread outputs), and the plans
of the light zoo models sit within 5% of the lower bound."""

from __future__ import annotations

import json

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infercc.analysis.memory import (
    BY_BREADTH,
    BY_SIZE,
    Interval,
    MemoryPlan,
    Placement,
    align,
    check_plan,
    lower_bound,
    naive,
    plan_intervals,
    plan_memory,
    tensor_lifetimes,
    value_sizes,
)
from infercc.data.signature import resolve_shapes
from infercc.ir import import_model, load_model
from tests.helpers import parse
from tests.zoo import SMALL, light_path

# --------------------------------------------------------------------------- placement

intervals_strategy = st.lists(
    st.tuples(st.integers(1, 10**6), st.integers(0, 200), st.integers(0, 200)),
    max_size=300,
).map(
    lambda rows: [
        Interval(f"t{i}", size, min(a, b), max(a, b)) for i, (size, a, b) in enumerate(rows)
    ]
)


@settings(max_examples=100, deadline=None)
@given(intervals_strategy, st.sampled_from([1, 64, 4096]))
def test_random_intervals_plan_validly_within_bounds(intervals, alignment):
    arenas = {}
    for heuristic in (BY_SIZE, BY_BREADTH):
        plan = plan_intervals(intervals, alignment, [heuristic])
        check_plan(plan)
        _check_pairwise(plan)
        assert set(plan.tensors) == {iv.name for iv in intervals}
        assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes
        arenas[heuristic] = plan.arena_bytes
    both = plan_intervals(intervals, alignment)
    assert both.arena_bytes == min(arenas.values())
    winner = BY_SIZE if arenas[BY_SIZE] <= arenas[BY_BREADTH] else BY_BREADTH
    assert both.heuristic == winner


def _check_pairwise(plan: MemoryPlan) -> None:
    """check_plan's property, by comparing every pair (independent of its time index)."""
    places = list(plan.tensors.values())
    for i, p in enumerate(places):
        p_end = p.offset + align(p.size, plan.alignment)
        assert p_end <= plan.arena_bytes
        for q in places[i + 1 :]:
            if p.first <= q.last and q.first <= p.last:
                q_end = q.offset + align(q.size, plan.alignment)
                assert p_end <= q.offset or q_end <= p.offset


def test_chain_of_mixed_sizes_reaches_the_bound():
    sizes = [10, 40, 20, 30, 5]
    intervals = [Interval(f"t{i}", s, i, i + 1) for i, s in enumerate(sizes)]
    plan = plan_intervals(intervals, 1, [BY_SIZE])
    check_plan(plan)
    assert plan.lower_bound_bytes == 60 and plan.arena_bytes == 60
    assert plan.naive_bytes == sum(sizes)


def test_best_fit_reuses_the_gap_below_a_placed_tensor():
    intervals = [
        Interval("l1", 100, 0, 1),
        Interval("l2", 90, 1, 3),
        Interval("l3", 80, 3, 5),
    ]
    plan = plan_intervals(intervals, 1, [BY_SIZE])
    check_plan(plan)
    offsets = {n: p.offset for n, p in plan.tensors.items()}
    assert offsets == {"l1": 0, "l2": 100, "l3": 0}
    assert plan.arena_bytes == plan.lower_bound_bytes == 190


def test_best_fit_takes_the_smallest_gap_that_holds_the_tensor():
    intervals = [
        Interval("f1", 70, 0, 4),  # [0, 70) until step 4
        Interval("l1", 60, 0, 9),  # [70, 130)
        Interval("f2", 30, 0, 4),  # [130, 160) until step 4
        Interval("l2", 29, 0, 9),  # [160, 189)
        Interval("x", 28, 5, 5),  # at step 5 the gaps are [0, 70) and [130, 160)
    ]
    plan = plan_intervals(intervals, 1, [BY_SIZE])
    check_plan(plan)
    offs = {n: p.offset for n, p in plan.tensors.items()}
    assert offs == {"f1": 0, "l1": 70, "f2": 130, "l2": 160, "x": 130}
    assert plan.arena_bytes == plan.lower_bound_bytes == 189


def test_alignment_rounds_sizes_and_offsets():
    intervals = [Interval("a", 1, 0, 1), Interval("b", 65, 1, 2), Interval("c", 3, 2, 2)]
    plan = plan_intervals(intervals, 64)
    check_plan(plan)
    assert all(p.offset % 64 == 0 for p in plan.tensors.values())
    assert plan.lower_bound_bytes == 64 + 128
    assert plan.naive_bytes == 64 + 128 + 64
    assert align(0) == 0 and align(1) == 64 and align(64) == 64 and align(65, 4096) == 4096


def test_lower_bound_and_naive_of_empty_and_zero_sized():
    assert lower_bound([], 64) == 0 and naive([], 64) == 0
    plan = plan_intervals([Interval("z", 0, 0, 3), Interval("a", 8, 0, 3)], 64)
    check_plan(plan)
    assert plan.arena_bytes == 64 and plan.ratio == 1.0
    assert plan_intervals([], 64).ratio == 1.0


def test_check_plan_catches_collisions_and_misalignment():
    def plan(offsets):
        tensors = {
            "a": Placement(offsets[0], 64, 0, 2),
            "b": Placement(offsets[1], 64, 2, 3),
        }
        return MemoryPlan(tensors, 256, 128, 128, alignment=64)

    check_plan(plan((0, 64)))
    with pytest.raises(AssertionError, match="share bytes"):
        check_plan(plan((0, 0)))
    with pytest.raises(AssertionError, match="misaligned"):
        check_plan(plan((0, 96)))
    with pytest.raises(AssertionError, match="outside"):
        check_plan(plan((0, 256)))


# --------------------------------------------------------------------------- lifetimes


def lifetimes(text: str, shapes: dict) -> dict[str, tuple[int, int, int]]:
    model = import_model(parse(text))
    sizes, unknown = value_sizes(model, shapes)
    assert unknown == []
    return {
        iv.name: (iv.size, iv.first, iv.last)
        for iv in tensor_lifetimes(model.graph.nodes, model.graph, sizes)
    }


def test_outputs_live_to_the_end_and_unread_outputs_one_step():
    got = lifetimes(
        """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y, float[N, 4] a) {
  a = Relu(x)
  b = Neg(x)
  u = Abs(x)
  c = Add(b, x)
  y = Sigmoid(c)
}""",
        {"x": (3, 4)},
    )
    assert got == {
        "a": (48, 0, 4),  # a graph output: to the last step
        "b": (48, 1, 3),
        "u": (48, 2, 2),  # nobody reads it: its own step only
        "c": (48, 3, 4),
        "y": (48, 4, 4),
    }


def test_outer_scope_read_in_a_subgraph_extends_life():
    got = lifetimes(
        """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x, bool c) => (float[4] y) {
  t = Neg(x)
  m = Relu(x)
  r = If (c) <
    then_branch = then_g () => (float[4] o1) { o1 = Abs(t) },
    else_branch = else_g () => (float[4] o2) { o2 = Identity(x) }
  >
  y = Add(r, m)
}""",
        {"x": (4,), "c": ()},
    )
    assert got == {"t": (16, 0, 2), "m": (16, 1, 3), "r": (16, 2, 3), "y": (16, 3, 3)}
    assert "o1" not in got and "o2" not in got  # values inside subgraphs are not planned


def test_dtype_sizes_and_constants_left_out():
    got = lifetimes(
        """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 5] x) => (bool[2, 5] b, float16[2, 5] h, int64[2, 5] i) {
  k = Constant <value = float[1] {2.0}> ()
  s = Mul(x, k)
  b = Cast <to = 9> (s)
  h = Cast <to = 10> (s)
  i = Cast <to = 7> (s)
}""",
        {"x": (2, 5)},
    )
    assert got == {
        "s": (40, 1, 4),
        "b": (10, 2, 4),
        "h": (20, 3, 4),
        "i": (80, 4, 4),
    }


def test_unknown_sizes_are_listed_and_left_out():
    model = import_model(
        parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (int64[M, 1] t, float[4] r) {
  r = Relu(x)
  nz = NonZero(r)
  t = Transpose(nz)
}""")
    )
    plan = plan_memory(model, {"x": (4,)})
    check_plan(plan)
    assert plan.unknown == ["nz", "t"]  # data-dependent shapes
    assert set(plan.tensors) == {"r"}
    assert plan.tensors["r"] == Placement(0, 16, 0, 2)


def test_plan_memory_figures_and_json():
    ones = ", ".join(["1.0"] * 16)
    model = import_model(
        parse(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 16] x) => (float[N, 16] y) <float[16] w = {{{ones}}}> {{
  a = Relu(x)
  b = Neg(a)
  c = Add(a, b)
  y = Mul(c, w)
}}""")
    )
    plan = plan_memory(model, {"x": (2, 16)}, alignment=64)
    check_plan(plan)
    # a [0, 2], b [1, 2], c [2, 3], y [3, 3]: at step 2 three 128-byte tensors are live
    assert plan.lower_bound_bytes == plan.arena_bytes == 384
    assert plan.naive_bytes == 512 and plan.weights_bytes == 64
    assert plan.order == [n.name or f"#{i}:{n.op_type}" for i, n in enumerate(model.graph)]
    assert len(plan.order) == 4 and all(plan.order)
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["schema"] == "infercc.memory_plan/1"
    assert d["shape_profile"] == {"x": [2, 16]} and d["heuristic"] == BY_SIZE
    a = plan.tensors["a"]
    assert d["tensors"]["a"] == {"offset": a.offset, "size": 128, "first": 0, "last": 2}
    assert d["peak_before_schedule"] is None and d["unknown"] == []


def test_explicit_order_changes_lifetimes():
    model = import_model(
        parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[8] x) => (float[8] y) {
  a = Relu(x)
  b = Neg(x)
  y = Add(a, b)
}""")
    )
    a, b, y = model.graph.nodes
    sizes, _ = value_sizes(model, {"x": (8,)})
    got = {iv.name: (iv.first, iv.last) for iv in tensor_lifetimes([b, a, y], model.graph, sizes)}
    assert got == {"b": (0, 2), "a": (1, 2), "y": (2, 2)}


# --------------------------------------------------------------------------- the zoo


@pytest.fixture(scope="module")
def optimized_zoo(optimized):
    """Each zoo model as optimize writes it (the session's shared build) and its shapes."""
    out = {}
    for name in SMALL:
        src = light_path(name)
        out[name] = (optimized(src).output, resolve_shapes(onnx.load(src)))
    return out


@pytest.mark.parametrize("name", SMALL)
def test_zoo_models_plan_within_five_percent_of_the_bound(optimized_zoo, name):
    path, shapes = optimized_zoo[name]
    model = load_model(path)
    plan = plan_memory(model, shapes)
    check_plan(plan)
    assert plan.unknown == []
    assert len(plan.tensors) >= 30  # squeezenet, the smallest: 39 after fusion
    assert plan.ratio <= 1.05, (name, plan.arena_bytes, plan.lower_bound_bytes, plan.heuristic)
    assert plan.arena_bytes * 3 < plan.naive_bytes
