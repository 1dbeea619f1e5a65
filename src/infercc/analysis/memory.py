"""Static memory planning: one arena for every intermediate tensor, offsets chosen ahead of time.

What is planned. The intermediate tensors are the outputs of the main graph's nodes (graph
inputs, initializers and the outputs of Constant nodes are weights or feeds, not scratch).
Execution step `i` is the position of a node in the execution order. A tensor is live from the
step of its producer to the step of its last reader; a read inside a subgraph of a node (an
outer-scope reference of If/Loop/Scan) is a read by that node, so the tensor lives through that
node's step; a graph output lives to the last step; a tensor nobody reads lives at its own step
only. Values inside subgraphs are not planned: the runtime allocates them per iteration or
branch. Sizes come from the concrete shapes at one input shape profile (`value_sizes`); a value
whose shape or dtype stays unknown is left out of the plan and listed in `MemoryPlan.unknown`.

Placement is the offset-calculation problem of Pisarchyk & Lee (2020), the method of TFLite's
`ArenaPlanner`/`SimpleMemoryArena`. Every size is rounded up to the alignment, so every offset
is a multiple of it. Two heuristics run and the smaller arena wins (ties: greedy by size):

- greedy by size: tensors by size, largest first (ties by first step, then name). Each goes into
  the smallest gap, between tensors already placed whose lifetimes overlap its own, that holds
  it (best fit); with no such gap it goes above the highest of them.
- greedy by breadth: steps by breadth (the bytes live at the step), largest first; at each step
  the tensors live there that are not placed yet go in by size, largest first, with the same
  best-fit placement.

Speed. Best fit only needs the placed tensors whose lifetimes overlap, so placed tensors are
indexed by time (`_TimeIndex`): an interval of length `L < 2**k` goes into level `k`, bucket
`first >> k`; a query for `[f, l]` visits, per level, only the buckets whose intervals can reach
it. A tensor then looks at the placed tensors alive near its lifetime, not at all of them, and a
100,000-tensor chain plans in seconds in pure Python.

Bounds. No placement beats `lower_bound`: the largest sum of (aligned) sizes live at one step;
`naive` (every tensor its own buffer) is the sum of all sizes. The FIELD notes report that
greedy by size reaches the bound on many CNNs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infercc.ir.dtypes import tensor_bytes
from infercc.ir.graph import Graph, Model, Node, Value, _free_inputs
from infercc.ir.shapes import concrete_types

log = logging.getLogger(__name__)

SCHEMA = "infercc.memory_plan/1"
BY_SIZE = "greedy_by_size"
BY_BREADTH = "greedy_by_breadth"
HEURISTICS = (BY_SIZE, BY_BREADTH)
ALIGNMENT = 64  # bytes: every size rounded up to it (the default of --align)


class Interval(NamedTuple):
    """One tensor: its size in bytes and the first and last steps it is live (inclusive)."""

    name: str
    size: int
    first: int
    last: int


@dataclass
class Placement:
    offset: int
    size: int
    first: int
    last: int


@dataclass
class MemoryPlan:
    """An arena layout: every planned tensor's offset, and the figures to judge it by."""

    tensors: dict[str, Placement]
    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    weights_bytes: int = 0
    alignment: int = ALIGNMENT
    heuristic: str = BY_SIZE
    shape_profile: dict[str, list[int]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    peak_before_schedule: int | None = None
    peak_after_schedule: int | None = None

    @property
    def ratio(self) -> float:
        """Arena over the lower bound (1.0 when both are 0)."""
        if self.lower_bound_bytes == 0:
            return 1.0 if self.arena_bytes == 0 else math.inf
        return self.arena_bytes / self.lower_bound_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "arena_bytes": self.arena_bytes,
            "naive_bytes": self.naive_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "weights_bytes": self.weights_bytes,
            "ratio": self.ratio if math.isfinite(self.ratio) else None,
            "alignment": self.alignment,
            "heuristic": self.heuristic,
            "shape_profile": {k: list(v) for k, v in self.shape_profile.items()},
            "order": list(self.order),
            "unknown": list(self.unknown),
            "peak_before_schedule": self.peak_before_schedule,
            "peak_after_schedule": self.peak_after_schedule,
            "tensors": {
                name: {"offset": p.offset, "size": p.size, "first": p.first, "last": p.last}
                for name, p in self.tensors.items()
            },
        }


# --------------------------------------------------------------------------- sizes


def align(n: int, alignment: int = ALIGNMENT) -> int:
    """`n` rounded up to a multiple of `alignment`."""
    return -(-n // alignment) * alignment


def planned_values(graph: Graph) -> Iterator[Value]:
    """The main graph's intermediate tensors: outputs of its nodes, except Constant nodes."""
    for node in graph:
        if node.op_type == "Constant" and node.is_standard:
            continue
        for v in node.outputs:
            if v is not None:
                yield v


def value_sizes(
    model: Model, input_shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, int], list[str]]:
    """Bytes of each intermediate tensor at `input_shapes`, and the names whose size is unknown.

    Shapes come from `infercc.ir.shapes.concrete_types` (the IR is not modified).
    """
    types = concrete_types(model, input_shapes)
    sizes: dict[str, int] = {}
    unknown: list[str] = []
    for v in planned_values(model.graph):
        dtype, shape = types.get(v.name, (v.dtype, v.shape))
        n = tensor_bytes(dtype if dtype is not None else v.dtype, shape)
        if n is None:
            unknown.append(v.name)
        else:
            sizes[v.name] = n
    return sizes, unknown


# --------------------------------------------------------------------------- lifetimes


def tensor_lifetimes(order: list[Node], graph: Graph, sizes: dict[str, int]) -> list[Interval]:
    """Live interval of each sized intermediate tensor under the execution order `order`.

    Intervals come in order of production. Values missing from `sizes` are left out.
    """
    last_step = len(order) - 1
    first: dict[int, int] = {}
    values: list[Value] = []
    skip = {id(n) for n in order if n.op_type == "Constant" and n.is_standard}
    for step, node in enumerate(order):
        if id(node) in skip:
            continue
        for v in node.outputs:
            if v is not None and v.name in sizes:
                first[id(v)] = step
                values.append(v)
    last = dict(first)
    for step, node in enumerate(order):
        for v in _free_inputs(node):
            key = id(v)
            if key in last and last[key] < step:
                last[key] = step
    for v in graph.outputs:
        if id(v) in last:
            last[id(v)] = last_step
    return [Interval(v.name, sizes[v.name], first[id(v)], last[id(v)]) for v in values]


def live_profile(intervals: Iterable[Interval], alignment: int = 1) -> list[int]:
    """Bytes live at each step 0..max(last) (sizes rounded up to `alignment`)."""
    intervals = list(intervals)
    if not intervals:
        return []
    diff = [0] * (max(iv.last for iv in intervals) + 2)
    for iv in intervals:
        n = align(iv.size, alignment)
        diff[iv.first] += n
        diff[iv.last + 1] -= n
    profile, running = [], 0
    for d in diff[:-1]:
        running += d
        profile.append(running)
    return profile


def lower_bound(intervals: Iterable[Interval], alignment: int = ALIGNMENT) -> int:
    """The largest sum of aligned sizes live at one step: no arena can be smaller."""
    return max(live_profile(intervals, alignment), default=0)


def naive(intervals: Iterable[Interval], alignment: int = ALIGNMENT) -> int:
    """Every tensor in its own buffer: the sum of aligned sizes."""
    return sum(align(iv.size, alignment) for iv in intervals)


def peak_live(order: list[Node], graph: Graph, sizes: dict[str, int]) -> int:
    """Peak bytes of intermediate tensors live at one step under `order` (no alignment)."""
    return lower_bound(tensor_lifetimes(order, graph, sizes), 1)


# --------------------------------------------------------------------------- the time index


class _TimeIndex:
    """Intervals bucketed by length class and start, for queries "which ones overlap [f, l]".

    An interval of length L (steps) with L < 2**k sits in level k, bucket `first >> k`. One that
    overlaps [f, l] starts in [f - 2**k + 2, l], so a query visits, per level, the buckets of
    that range (or the level's non-empty buckets, when there are fewer).
    """

    def __init__(self, firsts: list[int], lasts: list[int]):
        self.firsts, self.lasts = firsts, lasts
        self.levels: dict[int, dict[int, dict[int, None]]] = {}

    def add(self, i: int) -> None:
        first = self.firsts[i]
        level = (self.lasts[i] - first + 1).bit_length()
        self.levels.setdefault(level, {}).setdefault(first >> level, {})[i] = None

    def remove(self, i: int) -> None:
        first = self.firsts[i]
        level = (self.lasts[i] - first + 1).bit_length()
        buckets = self.levels[level]
        bucket = buckets[first >> level]
        del bucket[i]
        if not bucket:
            del buckets[first >> level]

    def overlapping(self, f: int, l: int) -> list[int]:  # noqa: E741
        firsts, lasts = self.firsts, self.lasts
        out: list[int] = []
        for level, buckets in self.levels.items():
            lo = max(f - (1 << level) + 2, 0) >> level
            hi = l >> level
            if hi - lo + 1 <= len(buckets):
                found = [buckets[b] for b in range(lo, hi + 1) if b in buckets]
            else:
                found = [bk for b, bk in buckets.items() if lo <= b <= hi]
            for bucket in found:
                out.extend(j for j in bucket if lasts[j] >= f and firsts[j] <= l)
        return out


# --------------------------------------------------------------------------- placement


class _Arena:
    """Best-fit placement of intervals into one arena (sizes already aligned)."""

    def __init__(self, intervals: list[Interval], alignment: int):
        self.sizes = [align(iv.size, alignment) for iv in intervals]
        self.firsts = [iv.first for iv in intervals]
        self.lasts = [iv.last for iv in intervals]
        self.offsets: list[int | None] = [None] * len(intervals)
        self.index = _TimeIndex(self.firsts, self.lasts)
        self.top = 0

    def place(self, i: int) -> None:
        size = self.sizes[i]
        if size == 0:  # takes no bytes: conflicts with nothing
            self.offsets[i] = 0
            return
        offsets, sizes = self.offsets, self.sizes
        spans = sorted(
            (start, start + sizes[j])
            for j in self.index.overlapping(self.firsts[i], self.lasts[i])
            if (start := offsets[j]) is not None  # every overlapping one is placed already
        )
        best, best_gap, cur = -1, math.inf, 0
        for start, end in spans:
            gap = start - cur
            if size <= gap < best_gap:
                best, best_gap = cur, gap
            if end > cur:
                cur = end
        offset = cur if best < 0 else best
        offsets[i] = offset
        self.index.add(i)
        self.top = max(self.top, offset + size)


def _by_size_key(intervals: list[Interval]):
    return lambda i: (-intervals[i].size, intervals[i].first, intervals[i].name)


def greedy_by_size(intervals: list[Interval], alignment: int = ALIGNMENT) -> tuple[list[int], int]:
    """Offsets (in the order of `intervals`) and the arena size, greedy by size."""
    arena = _Arena(intervals, alignment)
    for i in sorted(range(len(intervals)), key=_by_size_key(intervals)):
        arena.place(i)
    return arena.offsets, arena.top  # type: ignore[return-value]


def greedy_by_breadth(
    intervals: list[Interval], alignment: int = ALIGNMENT
) -> tuple[list[int], int]:
    """Offsets (in the order of `intervals`) and the arena size, greedy by breadth."""
    arena = _Arena(intervals, alignment)
    profile = live_profile(intervals, alignment)
    pending = _TimeIndex(arena.firsts, arena.lasts)
    for i in range(len(intervals)):
        pending.add(i)
    key = _by_size_key(intervals)
    for step in sorted(range(len(profile)), key=lambda s: (-profile[s], s)):
        live = pending.overlapping(step, step)
        for i in sorted(live, key=key):
            pending.remove(i)
            arena.place(i)
    return arena.offsets, arena.top  # type: ignore[return-value]


_PLACERS = {BY_SIZE: greedy_by_size, BY_BREADTH: greedy_by_breadth}


def plan_intervals(
    intervals: list[Interval], alignment: int = ALIGNMENT, heuristics: Iterable[str] = HEURISTICS
) -> MemoryPlan:
    """Place `intervals` with each heuristic and keep the smallest arena (first one on ties)."""
    if alignment < 1:
        raise ValueError(f"alignment must be positive, got {alignment}")
    best: tuple[int, str, list[int]] | None = None
    for name in heuristics:
        offsets, arena = _PLACERS[name](intervals, alignment)
        log.debug("%s: arena %d bytes", name, arena)
        if best is None or arena < best[0]:
            best = (arena, name, offsets)
    assert best is not None, "no heuristic given"
    arena, name, offsets = best
    tensors = {
        iv.name: Placement(off, iv.size, iv.first, iv.last)
        for iv, off in zip(intervals, offsets, strict=True)
    }
    return MemoryPlan(
        tensors=tensors,
        arena_bytes=arena,
        naive_bytes=naive(intervals, alignment),
        lower_bound_bytes=lower_bound(intervals, alignment),
        alignment=alignment,
        heuristic=name,
    )


def node_labels(order: list[Node]) -> list[str]:
    """Node names in order; a node without a name is labelled by its position (`#12:Relu`)."""
    return [n.name or f"#{i}:{n.op_type}" for i, n in enumerate(order)]


def plan_memory(
    model: Model,
    input_shapes: dict[str, tuple[int, ...]],
    alignment: int = ALIGNMENT,
    order: list[Node] | None = None,
) -> MemoryPlan:
    """Plan the arena of `model`'s intermediate tensors at `input_shapes`.

    `order` is the execution order (default: the graph's node order).
    """
    graph = model.graph
    order = list(graph) if order is None else order
    sizes, unknown = value_sizes(model, input_shapes)
    plan = plan_intervals(tensor_lifetimes(order, graph, sizes), alignment)
    plan.weights_bytes = sum(v.tensor.nbytes for v in graph.initializers.values())
    plan.shape_profile = {k: [int(d) for d in v] for k, v in input_shapes.items()}
    plan.order = node_labels(order)
    plan.unknown = unknown
    if unknown:
        log.info("memory plan leaves out %d tensor(s) of unknown size", len(unknown))
    return plan


def check_plan(plan: MemoryPlan) -> None:
    """AssertionError when two tensors live at the same step share bytes, or an offset is
    misaligned or past the arena. Sizes are taken aligned (as the planner places them)."""
    names = list(plan.tensors)
    places = [plan.tensors[n] for n in names]
    firsts = [p.first for p in places]
    lasts = [p.last for p in places]
    index = _TimeIndex(firsts, lasts)
    for i, p in enumerate(places):
        size = align(p.size, plan.alignment)
        assert p.offset % plan.alignment == 0, f"{names[i]}: offset {p.offset} is misaligned"
        assert p.offset >= 0 and p.offset + size <= plan.arena_bytes or size == 0, (
            f"{names[i]}: [{p.offset}, {p.offset + size}) lies outside the arena"
        )
        if size == 0:
            continue
        for j in index.overlapping(p.first, p.last):
            q = places[j]
            assert p.offset + size <= q.offset or q.offset + align(q.size, plan.alignment) <= (
                p.offset
            ), f"{names[i]} and {names[j]} are live together and share bytes"
        index.add(i)
