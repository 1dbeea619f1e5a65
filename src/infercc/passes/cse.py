"""eliminate-common-subexpressions: compute each distinct value once.

Two nodes with the same op (domain, type, overload), the same attributes and the same input
values compute the same outputs, because ONNX operators are pure functions of their inputs
and attributes; the later node's outputs are replaced by the earlier node's. Exporters write
many such duplicates (TorchScript builds the same head-shape Concat for each of Q, K and V).
Small constants with equal dtype, shape and bytes are merged first, so that nodes reading
equal copies of a constant become duplicates too. Excluded: random ops (each call draws anew),
nodes with subgraphs, nodes of non-standard domains (their semantics are unknown), and nodes
whose outputs are graph outputs (each output keeps its own name).

Duplicate nodes are found by a rule (`infercc.passes.rules`) on every op; equal constants are
not anchored on a node, so that loop asks `ctx.allow_rewrite` itself. For bisection one rewrite
is one duplicate node merged into the first (named by the duplicate) or one duplicate constant
merged (named by its first reader, since a constant has no node).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import DRAWS_IN_TRAINING, RANDOM_OPS
from infercc.passes.manager import PassContext, PassResult, graphs_of, register_pass
from infercc.passes.rules import Rule, apply_rules

MAX_CONSTANT_BYTES = 4096  # larger constants are not hashed (that would read every weight)
# Dropout draws a new mask per call in training mode, which this pass does not check.
_RANDOM = RANDOM_OPS | DRAWS_IN_TRAINING


@register_pass("eliminate-common-subexpressions")
def eliminate_common_subexpressions(graph: Graph, ctx: PassContext) -> PassResult:
    """Merge equal small constants, then nodes computing the same thing from the same inputs."""
    constants = nodes = 0
    for g in graphs_of(graph):
        constants += _merge_constants(g, ctx)
        nodes += apply_rules(g, ctx, [_duplicates()], subgraphs=False).counts["nodes"]
    return PassResult(constants + nodes > 0, {"constants": constants, "nodes": nodes})


def _constant_key(v: Value) -> tuple | None:
    t = v.const
    if t is None or t.nbytes > MAX_CONSTANT_BYTES or t.is_external:
        return None
    arr = t.numpy()
    if arr.dtype.kind not in "biufc":
        return None
    return (t.dtype, t.shape, hashlib.sha256(arr.tobytes()).hexdigest())


def _merge_constants(graph: Graph, ctx: PassContext) -> int:
    outputs = {id(v) for v in graph.outputs}
    seen: dict[tuple, Value] = {}
    merged = 0
    for v in list(graph.initializers.values()):
        if id(v) in outputs or not v._uses:
            continue
        key = _constant_key(v)
        if key is None:
            continue
        first = seen.setdefault(key, v)
        if first is not v and ctx.allow_rewrite(v.users()[0]):
            graph.replace_all_uses_with(v, first)
            merged += 1
    return merged


def _node_key(node: Node) -> tuple | None:
    if not node.is_standard or node.op_type in _RANDOM or node.subgraphs():
        return None
    if any(v is None or v.is_graph_output for v in node.outputs):
        return None
    attrs = tuple(sorted((k, a.SerializeToString()) for k, a in node.attributes.items()))
    inputs = tuple(id(v) if v is not None else None for v in node.inputs)
    return (node.domain, node.op_type, node.overload, len(node.outputs), inputs, attrs)


@dataclass(frozen=True)
class _Duplicate:
    """The node computes what `first`, earlier in the graph, computes."""

    first: Node


def _duplicates() -> Rule:
    """A rule for one graph: its check remembers the first node of each key it sees."""
    seen: dict[tuple, Node] = {}

    def check(node: Node, ctx: PassContext) -> _Duplicate | None:
        key = _node_key(node)
        if key is None:
            return None
        first = seen.setdefault(key, node)
        return None if first is node else _Duplicate(first)

    return Rule("nodes", None, check, _merge_node)


def _merge_node(node: Node, found: _Duplicate, ctx: PassContext) -> None:
    graph = node.graph
    assert graph is not None
    for old, new in zip(node.outputs, found.first.outputs, strict=True):
        graph.replace_all_uses_with(old, new)  # type: ignore[arg-type]
    graph.remove(node)
