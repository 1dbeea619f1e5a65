"""schedule-memory: reorder the main graph's nodes to lower the peak of live intermediate bytes.

Exact because any topological order computes the same outputs: ONNX operators are pure, and a
node runs only after every value it reads (its inputs and the outer-scope values its subgraphs
read) is produced. Only the order of the main graph's node list changes; no node, value or
attribute is touched.

Method: a greedy list scheduler. Among the ready nodes (all producers already scheduled) it
picks the one with the smallest net increase of live bytes: the bytes of the tensors it
produces minus the bytes of the inputs it is the last reader of (graph outputs are never
freed); ties go to the earlier node of the current order. The peak of live bytes
(`infercc.analysis.memory.peak_live`) of the new order is compared with the current one, and the new
order is adopted only when its peak is strictly lower, so an already scheduled graph is left
alone and the pipeline reaches a fixpoint.

Sizes come from `infercc.analysis.memory.value_sizes` at the shape profile `ctx.shapes`
(defaults of `infercc.data.signature.resolve_shapes` for inputs it does not pin); a value of
unknown size counts as 0 bytes. The peak figures are the result's details, a `SchedulePeaks`
(byte figures are not counts the manager could sum).
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

from infercc.analysis.memory import peak_live, value_sizes
from infercc.data.signature import resolve_shapes
from infercc.errors import InferccError
from infercc.ir.exporter import export_model
from infercc.ir.graph import Graph, IRError, Node, Value, _free_inputs, _local_producer
from infercc.passes.manager import PassContext, PassResult, register_pass

log = logging.getLogger(__name__)


@register_pass("schedule-memory", final=True)
def schedule_memory(graph: Graph, ctx: PassContext) -> PassResult:
    """Reorder nodes to lower the peak of live intermediate bytes (greedy list scheduling)."""
    model = graph.model
    if model is None or graph is not model.graph or len(graph) < 2:
        return PassResult(changed=False, stats={"reordered": 0})
    try:
        skeleton = export_model(model, with_weights=False)
        shapes = resolve_shapes(skeleton, dict(ctx.shapes) if ctx.shapes is not None else None)
    except InferccError as e:  # an input it cannot size (a sequence, say): leave the order
        log.info("schedule-memory skipped: %s", e)
        return PassResult(changed=False, stats={"reordered": 0})
    sizes, _unknown = value_sizes(model, shapes)
    current = list(graph)
    proposed = greedy_order(graph, sizes)
    before = peak_live(current, graph, sizes)
    after = peak_live(proposed, graph, sizes)
    adopt = after < before
    if adopt:
        relink(graph, proposed)
    else:
        after = before
    log.debug("schedule-memory: peak %d -> %d bytes (adopted: %s)", before, after, adopt)
    peaks = SchedulePeaks(before, after)
    return PassResult(changed=adopt, stats={"reordered": int(adopt)}, details=peaks)


@dataclass(frozen=True)
class SchedulePeaks:
    """The peak of live intermediate bytes before and after scheduling."""

    peak_before: int
    peak_after: int

    def merged(self, later: SchedulePeaks) -> SchedulePeaks:
        return SchedulePeaks(self.peak_before, later.peak_after)


def _reads(graph: Graph, nodes: list[Node]) -> dict[Node, list[Value]]:
    """Distinct values each node reads (inputs and outer-scope reads of its subgraphs)."""
    return {n: list(dict.fromkeys(_free_inputs(n))) for n in nodes}


def greedy_order(graph: Graph, sizes: dict[str, int]) -> list[Node]:
    """A topological order of `graph`'s nodes, picking the smallest net increase of bytes first."""
    nodes = list(graph)
    index = {n: i for i, n in enumerate(nodes)}
    reads = _reads(graph, nodes)
    deps: dict[Node, set[Node]] = {n: set() for n in nodes}
    readers: dict[Value, list[Node]] = {}
    for n in nodes:
        for v in reads[n]:
            p = _local_producer(v, graph)
            if p is not None and p is not n:
                deps[n].add(p)
                readers.setdefault(v, []).append(n)
    keep = {id(v) for v in graph.outputs}
    state = _State(sizes, readers, keep, reads)
    users: dict[Node, list[Node]] = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    waiting = {n: len(ds) for n, ds in deps.items()}
    heap: list[tuple[int, int]] = []
    for n in nodes:
        if waiting[n] == 0:
            heapq.heappush(heap, (state.delta(n), index[n]))
    order: list[Node] = []
    done: set[Node] = set()
    while heap:
        delta, i = heapq.heappop(heap)
        n = nodes[i]
        if n in done or delta != state.delta(n):
            continue  # scheduled already, or a stale key
        done.add(n)
        order.append(n)
        for r in state.schedule(n):
            if waiting[r] == 0 and r not in done:
                heapq.heappush(heap, (state.delta(r), index[r]))
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (state.delta(u), index[u]))
    if len(order) != len(nodes):
        raise IRError("graph has a cycle")
    return order


class _State:
    """Remaining readers per value, and the net increase of live bytes a node would cause."""

    def __init__(
        self,
        sizes: dict[str, int],
        readers: dict[Value, list[Node]],
        keep: set[int],
        reads: dict[Node, list[Value]],
    ):
        self.sizes = sizes
        self.readers = readers
        self.remaining = {v: len(rs) for v, rs in readers.items()}
        self.keep = keep
        self.reads = reads
        self.done: set[Node] = set()

    def delta(self, n: Node) -> int:
        alloc = sum(self.sizes.get(v.name, 0) for v in n.outputs if v is not None)
        freed = sum(
            self.sizes.get(v.name, 0)
            for v in self.reads[n]
            if self.remaining.get(v) == 1 and id(v) not in self.keep
        )
        return alloc - freed

    def schedule(self, n: Node) -> list[Node]:
        """Mark `n` scheduled; the nodes that became the last reader of something."""
        self.done.add(n)
        changed: list[Node] = []
        for v in self.reads[n]:
            if v not in self.remaining:
                continue
            self.remaining[v] -= 1
            if self.remaining[v] == 1 and id(v) not in self.keep:
                changed.extend(r for r in self.readers[v] if r not in self.done)
        return changed


def relink(graph: Graph, order: list[Node]) -> None:
    """Relink `graph`'s node list in `order` (the same nodes, in a new order)."""
    current = list(graph)
    if len(order) != len(current) or {id(n) for n in order} != {id(n) for n in current}:
        raise IRError("relink: the new order does not hold exactly the graph's nodes")
    root = graph._root
    root._prev = root._next = root
    for n in order:
        n._prev, n._next = root._prev, root
        root._prev._next = n  # type: ignore[union-attr]
        root._prev = n
