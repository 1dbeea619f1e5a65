"""schedule-memory: reorder the main graph's nodes to lower the peak of live intermediate bytes.

Exact because any topological order computes the same outputs: ONNX operators are pure, and a
node runs only after every value it reads (its inputs and the outer-scope values its subgraphs
read) is produced. Only the order of the main graph's node list changes; no node, value or
attribute is touched.

The dependencies are a `networkx.DiGraph` over the nodes (`Dependencies`: an edge from each
producer to each reader, an outer-scope read inside a subgraph counting as a read by the
subgraph's node), built once. A graph with a cycle is refused with an IRError naming nodes on
it (`networkx.find_cycle`, as the importer does).

Method: candidate orders, each scored by its peak of live bytes
(`infercc.analysis.memory.peak_live`), in this order (`CANDIDATES`):

- greedy: a list scheduler. Among the ready nodes (all producers already scheduled) it picks
  the one with the smallest net increase of live bytes: the bytes of the tensors it produces
  minus the bytes of the inputs it is the last reader of (graph outputs are never freed); ties
  go to the earlier node of the current order.
- depth_first: the postorder of the reversed graph from its sinks, each node's producers
  computed one branch at a time, the one needing the most bytes beyond what it leaves first
  (Sethi-Ullman's order, the graph read as a tree). Greedy starts every cheap branch first and
  holds their results while an expensive branch runs; this finishes the expensive one first.
  On Inception-like blocks of four branches (`tests/branchy.py`) it peaks 9.5% lower.

The lowest peak wins; ties keep the current order, then the earlier candidate. An order is
adopted only when its peak is strictly lower than the current one, and the candidates are
then made again from the adopted order until none is lower, so an already scheduled graph is
left alone and the pass reaches its fixpoint in one run. No order peaks below `floor`, the most
bytes one node reads and writes; once the best peak is there no further candidate is tried
(on the 100,000-node chain of `bench/large_graph.py`, none is). The stats count `reordered`
and, when an order is adopted, `by_<candidate>`.

Measured and left out (`bench/schedule_candidates.py` prints them): fork..join regions of the
post-dominator tree (`networkx.immediate_dominators`) scheduled as units, and breadth-first
`networkx.topological_generations`. On the models there (examples/, onnx's model-zoo subset,
a ResNet-like tower, Inception-like blocks, a U-Net) neither beats the better of greedy and
depth_first; the zoo models already peak at the floor or at greedy's order.

Sizes come from `infercc.analysis.memory.value_sizes` at the shape profile, its option `shapes`
(defaults of `infercc.data.signature.resolve_shapes` for inputs it does not pin); a value of
unknown size counts as 0 bytes. The peak figures are the result's details, a `SchedulePeaks`
(byte figures are not counts the manager could sum).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import networkx as nx

from infercc.analysis.memory import peak_live, value_sizes
from infercc.data.signature import resolve_shapes
from infercc.errors import InferccError
from infercc.ir.exporter import export_model
from infercc.ir.graph import Graph, IRError, Node, Value, _free_inputs, _local_producer, cycle_error
from infercc.passes.manager import (
    PassContext,
    PassOption,
    PassResult,
    register_option,
    register_pass,
)

log = logging.getLogger(__name__)

SHAPES: PassOption[Mapping[str, tuple[int, ...]] | None] = register_option(
    "shapes",
    Mapping | None,
    "the input shapes tensors are sized at (None: resolve_shapes' defaults)",
)


@register_pass("schedule-memory", final=True, reads=("shapes",))
def schedule_memory(graph: Graph, ctx: PassContext) -> PassResult:
    """Reorder nodes to lower the peak of live intermediate bytes (the best of several orders)."""
    model = graph.model
    if model is None or graph is not model.graph or len(graph) < 2:
        return PassResult(changed=False, stats={"reordered": 0})
    try:
        skeleton = export_model(model, with_weights=False)
        profile = SHAPES.read(ctx)
        shapes = resolve_shapes(skeleton, dict(profile) if profile is not None else None)
    except InferccError as e:  # an input it cannot size (a sequence, say): leave the order
        log.info("schedule-memory skipped: %s", e)
        return PassResult(changed=False, stats={"reordered": 0})
    sizes, _unknown = value_sizes(model, shapes)
    deps = Dependencies.of(graph)
    before = peak_live(deps.nodes, graph, sizes)
    winners, after = _schedule_to_fixpoint(graph, deps, sizes, before)
    stats = {"reordered": int(bool(winners))}
    stats.update({f"by_{w}": 1 for w in winners})
    log.debug("schedule-memory: peak %d -> %d bytes (orders: %s)", before, after, winners)
    return PassResult(changed=bool(winners), stats=stats, details=SchedulePeaks(before, after))


FIXPOINT_ROUNDS = 8


def _schedule_to_fixpoint(
    graph: Graph, deps: Dependencies, sizes: dict[str, int], peak: int
) -> tuple[list[str], int]:
    """Adopt the best order, then look again from it, until no candidate is strictly lower
    (the candidates start from the current order, so a second look can find a lower peak): a
    second run of the pass, or of the pipeline on its own output, then changes nothing. Each
    adopted order lowers the peak, so this ends; `FIXPOINT_ROUNDS` caps it all the same."""
    winners: list[str] = []
    for _ in range(FIXPOINT_ROUNDS):
        winner, order, lower = best_order(deps, sizes, peak)
        if winner is None:
            break
        relink(graph, order)
        winners.append(winner)
        peak = lower
        deps = Dependencies.of(graph)
    return list(dict.fromkeys(winners)), peak


@dataclass(frozen=True)
class SchedulePeaks:
    """The peak of live intermediate bytes before and after scheduling."""

    peak_before: int
    peak_after: int

    def merged(self, later: SchedulePeaks) -> SchedulePeaks:
        return SchedulePeaks(self.peak_before, later.peak_after)


# --------------------------------------------------------------------------- the dependencies


@dataclass
class Dependencies:
    """The main graph's nodes in their current order and what each reads, with `dag`: a
    `networkx.DiGraph` over the nodes, an edge from each producer to each of its readers (an
    outer-scope read inside a subgraph is a read by the subgraph's node)."""

    graph: Graph
    nodes: list[Node]
    index: dict[Node, int]
    reads: dict[Node, list[Value]]
    readers: dict[Value, list[Node]]
    dag: nx.DiGraph

    @classmethod
    def of(cls, graph: Graph) -> Dependencies:
        """The dependencies of `graph`'s nodes; an IRError naming the nodes of a cycle if any."""
        nodes = list(graph)
        index = {n: i for i, n in enumerate(nodes)}
        reads = {n: list(dict.fromkeys(_free_inputs(n))) for n in nodes}
        readers: dict[Value, list[Node]] = {}
        edges: list[tuple[Node, Node]] = []
        backward = False
        for n in nodes:
            for v in reads[n]:
                p = _local_producer(v, graph)
                if p is not None and p is not n:
                    edges.append((p, n))
                    readers.setdefault(v, []).append(n)
                    backward = backward or index[p] > index[n]
        dag = nx.DiGraph()
        dag.add_nodes_from(nodes)
        dag.add_edges_from(edges)
        if backward and not nx.is_directed_acyclic_graph(dag):
            raise cycle_error(dag)
        return cls(graph, nodes, index, reads, readers, dag)

    def out_bytes(self, sizes: dict[str, int]) -> dict[Node, int]:
        """Bytes each node produces (0 for a value of unknown size)."""
        return {
            n: sum(sizes.get(v.name, 0) for v in n.outputs if v is not None) for n in self.nodes
        }

    def kept_bytes(self, sizes: dict[str, int]) -> dict[Node, int]:
        """Bytes of the graph outputs each node produces (live to the end, never freed)."""
        kept: dict[Node, int] = {}
        for v in dict.fromkeys(self.graph.outputs):
            p = v.producer
            if p is not None and p in self.index:
                kept[p] = kept.get(p, 0) + sizes.get(v.name, 0)
        return kept


# --------------------------------------------------------------------------- choosing an order


Candidate = Callable[[Dependencies, dict[str, int]], list[Node]]


def best_order(
    deps: Dependencies, sizes: dict[str, int], current_peak: int
) -> tuple[str | None, list[Node], int]:
    """The candidate order of lowest peak, its name and peak; (None, current order, its peak)
    when none is strictly lower. Ties go to the earlier candidate of `CANDIDATES`. No order
    peaks below `floor`, so none is tried (or none more) once the best peak is there."""
    best: tuple[str | None, list[Node], int] = (None, deps.nodes, current_peak)
    least = floor(deps, sizes)
    for name, make in CANDIDATES:
        if best[2] <= least:
            break
        order = make(deps, sizes)
        peak = peak_live(order, deps.graph, sizes)
        log.debug("schedule-memory: %s order peaks at %d bytes", name, peak)
        if peak < best[2]:
            best = (name, order, peak)
    return best


def floor(deps: Dependencies, sizes: dict[str, int]) -> int:
    """The most bytes one node reads and writes (all live at its step): no order peaks lower."""
    most = 0
    for n in deps.nodes:
        names = {v.name for v in deps.reads[n]}
        names.update(v.name for v in n.outputs if v is not None)
        most = max(most, sum(sizes.get(name, 0) for name in names))
    return most


def greedy_order(graph: Graph, sizes: dict[str, int]) -> list[Node]:
    """A topological order of `graph`'s nodes, picking the smallest net increase of bytes first."""
    return _greedy(Dependencies.of(graph), sizes)


def _greedy(deps: Dependencies, sizes: dict[str, int]) -> list[Node]:
    nodes, index, dag = deps.nodes, deps.index, deps.dag
    keep = {id(v) for v in deps.graph.outputs}
    state = _State(sizes, deps.readers, keep, deps.reads)
    waiting = dict(dag.in_degree())
    heap: list[tuple[int, int]] = []
    for n in nodes:
        if waiting[n] == 0:
            heapq.heappush(heap, (state.delta(n), index[n]))
    order: list[Node] = []
    done: set[Node] = set()
    succ = dag.succ
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
        for u in succ[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (state.delta(u), index[u]))
    if len(order) != len(nodes):
        raise cycle_error(dag)
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


def _depth_first(deps: Dependencies, sizes: dict[str, int]) -> list[Node]:
    """Postorder of the graph reversed, from its sinks: each node's producers are computed one
    after the other, each one's own producers finished before the next starts, the one whose
    subtree needs the most bytes beyond what it leaves first (Sethi-Ullman, the graph read as a
    tree)."""
    pred, index = deps.dag.pred, deps.index
    out = deps.out_bytes(sizes)
    need: dict[Node, int] = {}
    firsts: dict[Node, list[Node]] = {}
    for n in deps.nodes:  # the current order is topological: producers first
        ps = sorted(pred[n], key=lambda p: (out[p] - need[p], index[p]))
        firsts[n] = ps
        need[n] = _need([(need[p], out[p]) for p in ps], out[n])
    sinks = [n for n in deps.nodes if not deps.dag.succ[n]]
    sinks.sort(key=lambda n: (out[n] - need[n], index[n]))
    return _postorder(sinks, firsts)


def _need(children: list[tuple[int, int]], own: int) -> int:
    """Peak bytes of computing `children` (need, bytes left) in turn, then a node of `own` bytes."""
    peak = running = 0
    for child_need, left in children:
        peak = max(peak, running + child_need)
        running += left
    return max(peak, running + own)


def _postorder(
    roots: list[Node],
    firsts: dict[Node, list[Node]],
    done: set[Node] | None = None,
    order: list[Node] | None = None,
) -> list[Node]:
    """Each root after the nodes of `firsts[root]` (recursively, in list order), appended to
    `order`, each node once: a node in `done` is not visited again."""
    order = [] if order is None else order
    done = set() if done is None else done
    for root in roots:
        if root in done:
            continue
        stack = [(root, iter(firsts[root]))]
        done.add(root)
        while stack:
            n, it = stack[-1]
            for p in it:
                if p not in done:
                    done.add(p)
                    stack.append((p, iter(firsts[p])))
                    break
            else:
                stack.pop()
                order.append(n)
    return order


# The orders tried, in the order ties are broken: a name (the pass counts `by_<name>` when its
# order is adopted) and the function that makes the order.
CANDIDATES: list[tuple[str, Candidate]] = [
    ("greedy", _greedy),
    ("depth_first", _depth_first),
]


def relink(graph: Graph, order: list[Node]) -> None:
    """Relink `graph`'s node list in `order` (the same nodes, in a new order)."""
    current = list(graph)
    if len(order) != len(current) or {id(n) for n in order} != {id(n) for n in current}:
        raise IRError("relink: the new order does not hold exactly the graph's nodes")
    root = graph._root
    root._prev = root._next = root
    for n in order:
        n._prev, n._next = root._prev, root
        root._prev._next = n
        root._prev = n
