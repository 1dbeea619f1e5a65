"""eliminate-common-subexpressions: compute each distinct value once.

Two nodes with the same op (domain, type, overload), the same attributes and the same input
values compute the same outputs, because ONNX operators are pure functions of their inputs
and attributes; the later node's outputs are replaced by the earlier node's. Exporters write
many such duplicates (TorchScript builds the same head-shape Concat for each of Q, K and V).

Constants with equal dtype, shape and bytes are merged first, of any size and across the
whole model, so that nodes reading equal copies of a constant become duplicates too and
folding never leaves N copies of one weight (a weight read by both branches of an If folds
into one copy per branch; the copy is hoisted to the nearest graph that encloses every
reader, which subgraphs see as an outer-scope value). Candidates are grouped by dtype and
shape, then by a hash of a few sampled bytes (so a weight with no same-shaped twin is never
read in full), then by the digest of all bytes, and merged only when the bytes are equal.
Excluded: random ops (each call draws anew),
nodes with subgraphs, nodes of non-standard domains (their semantics are unknown), and nodes
whose outputs are graph outputs (each output keeps its own name).

Duplicate nodes are found by a rule (`infercc.passes.rules`) on every op; equal constants are
not anchored on a node, so that loop asks `ctx.allow_rewrite` itself. For bisection one rewrite
is one duplicate node merged into the first (named by the duplicate) or one duplicate constant
merged (named by its first reader, since a constant has no node).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import DRAWS_IN_TRAINING, RANDOM_OPS
from infercc.passes.manager import PassContext, PassResult, graphs_of, register_pass
from infercc.passes.rules import NoMatch, Rule, apply_rules

_SAMPLE = 4096  # bytes hashed at each end of a constant before its whole is read
_PROBES = 32  # and this many 64-byte probes spread over it
_UNHASHED = (TensorProto.STRING, TensorProto.UNDEFINED)
# Dropout draws a new mask per call in training mode, which this pass does not check.
_RANDOM = RANDOM_OPS | DRAWS_IN_TRAINING


@register_pass("eliminate-common-subexpressions")
def eliminate_common_subexpressions(graph: Graph, ctx: PassContext) -> PassResult:
    """Merge equal constants, then nodes computing the same thing from the same inputs."""
    constants = _merge_constants(graph, ctx)
    nodes = 0
    for g in graphs_of(graph):
        nodes += apply_rules(g, ctx, [_duplicates()], subgraphs=False).counts["nodes"]
    return PassResult(constants + nodes > 0, {"constants": constants, "nodes": nodes})


def _merge_constants(root: Graph, ctx: PassContext) -> int:
    """Merge every set of equal constants of the model into one; the number merged away."""
    merged = 0
    for members in _same_type_groups(root):
        for equal in _equal_sets(members):
            merged += _merge_equal(equal, ctx)
    return merged


def _same_type_groups(root: Graph) -> list[list[Value]]:
    """Live constants (not graph outputs) grouped by dtype and shape, parents first; only
    groups of two or more."""
    groups: dict[tuple, list[Value]] = {}
    for g in graphs_of(root):
        outputs = {id(v) for v in g.outputs}
        for v in g.initializers.values():
            t = v.const
            if t is None or id(v) in outputs or not v._uses or t.dtype in _UNHASHED:
                continue
            groups.setdefault((t.dtype, t.shape), []).append(v)
    return [m for m in groups.values() if len(m) > 1]


def _equal_sets(members: list[Value]) -> list[list[Value]]:
    """The sets (two or more, in the given order) of members holding equal bytes."""
    found: list[list[Value]] = []
    for bucket in _buckets(members, _sample_digest):
        for same in _buckets(bucket, _full_digest):
            found.extend(_byte_equal_sets(same))
    return found


def _buckets(members: list[Value], key: Callable[[np.ndarray], bytes | None]) -> list[list[Value]]:
    by_key: dict[bytes, list[Value]] = {}
    for v in members:
        k = key(_bytes_of(v))
        if k is not None:
            by_key.setdefault(k, []).append(v)
    return [b for b in by_key.values() if len(b) > 1]


def _bytes_of(v: Value) -> np.ndarray:
    """The constant's bytes as a flat uint8 array (memory-mapped weights stay mapped)."""
    arr = v.tensor.numpy()
    if arr.dtype.kind in "OUS":
        return np.empty(0, np.uint8)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _sample_digest(flat: np.ndarray) -> bytes | None:
    if flat.size == 0:
        return None
    if flat.size <= 3 * _SAMPLE:
        return hashlib.sha256(flat.data).digest()
    h = hashlib.sha256(flat[:_SAMPLE].data)
    h.update(flat[-_SAMPLE:].data)
    step = flat.size // _PROBES
    for i in range(1, _PROBES):
        h.update(flat[i * step : i * step + 64].data)
    return h.digest()


def _full_digest(flat: np.ndarray) -> bytes | None:
    return hashlib.sha256(flat.data).digest() if flat.size else None


def _byte_equal_sets(same: list[Value]) -> list[list[Value]]:
    """Split members with one digest by their bytes (a digest collision merges nothing)."""
    sets: list[list[Value]] = []
    for v in same:
        flat = _bytes_of(v)
        for s in sets:
            if np.array_equal(_bytes_of(s[0]), flat):
                s.append(v)
                break
        else:
            sets.append([v])
    return [s for s in sets if len(s) > 1]


def _merge_equal(equal: list[Value], ctx: PassContext) -> int:
    """Readers of every member read one of them, kept in the innermost graph that encloses
    all members' graphs (hoisted there if none of them is)."""
    graphs = [(v, v.graph) for v in equal if v.graph is not None]  # constants: in a graph
    home = _common_graph([g for _, g in graphs])
    keeper = next((v for v, g in graphs if g is home), graphs[0][0])
    merged = 0
    for v, graph in graphs:
        if v is keeper or not ctx.allow_rewrite(v.users()[0]):
            continue
        if keeper.graph is not home:
            _hoist(keeper, home)
        graph.replace_all_uses_with(v, keeper)
        merged += 1
    return merged


def _common_graph(graphs: list[Graph]) -> Graph:
    chains = [_ancestry(g) for g in graphs]
    common = chains[0]
    for chain in chains[1:]:
        ids = {id(g) for g in chain}
        common = [g for g in common if id(g) in ids]
    return common[0]  # innermost first


def _ancestry(graph: Graph) -> list[Graph]:
    """The graph and the graphs enclosing it, innermost first."""
    chain = []
    g: Graph | None = graph
    while g is not None:
        chain.append(g)
        g = g.parent
    return chain


def _hoist(value: Value, home: Graph) -> None:
    """Move an initializer to an enclosing graph: its readers see it there as an outer-scope
    value (names are unique across the model, so nothing is shadowed)."""
    old = value.graph
    assert old is not None
    del old.initializers[value.name]
    home.initializers[value.name] = value
    value.graph = home


def _node_key(node: Node) -> tuple | None:
    if not node.is_standard or node.op_type in _RANDOM or node.subgraphs():
        return None
    if any(v is None for v in node.outputs):
        return None
    attrs = tuple(sorted((k, a.SerializeToString()) for k, a in node.attributes.items()))
    inputs = tuple(id(v) if v is not None else None for v in node.inputs)
    return (node.domain, node.op_type, node.overload, len(node.outputs), inputs, attrs)


@dataclass(frozen=True)
class _Duplicate:
    """The node computes what `first`, earlier in the graph, computes: each of its outputs
    (every one present) is the one of `first` beside it in `outputs`."""

    first: Node
    outputs: tuple[tuple[Value, Value], ...]


def _duplicates() -> Rule[_Duplicate]:
    """A rule for one graph: its check remembers the first node of each key it sees."""
    seen: dict[tuple, Node] = {}

    def check(node: Node, ctx: PassContext) -> _Duplicate:
        key = _node_key(node)
        if key is None:
            raise NoMatch()
        first = seen.setdefault(key, node)
        pairs = tuple(
            (old, new)
            for old, new in zip(node.outputs, first.outputs, strict=True)
            if old is not None and new is not None  # every one: `_node_key` holds no omitted
        )
        if first is node or not _can_take_outputs(node, pairs):
            raise NoMatch()
        return _Duplicate(first, pairs)

    return Rule("nodes", None, check, _merge_node)


def _can_take_outputs(node: Node, outputs: tuple[tuple[Value, Value], ...]) -> bool:
    """Whether each of the duplicate's graph outputs can be served by `first`'s output taking its
    name (not when that output already is a graph output: two names need an Identity)."""
    graph = node.owning_graph()
    return all(graph.can_take_output_name(new) for old, new in outputs if old.is_graph_output)


def _merge_node(node: Node, found: _Duplicate, ctx: PassContext) -> None:
    graph = node.owning_graph()
    for old, new in found.outputs:
        graph.replace_all_uses_with(old, new)
    graph.remove(node)
