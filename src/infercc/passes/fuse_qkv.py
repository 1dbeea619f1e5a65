"""fuse-qkv: merge the projections that read the same activation into one MatMul and a Split.

The rewrite, for n >= 2 MatMuls that read the same tensor X as their first operand (A) with a
constant 2-D weight W_i of shape [K, N_i] (the Q, K and V projections of an attention layer)::

    Y_i = MatMul(X, W_i)            [+ Add(Y_i, b_i), b_i constant of shape [N_i], either order]
    ==>
    Y   = MatMul(X, Concat(W_1..W_n, axis=-1))   [+ Add(Y, Concat(b_1..b_n))]
    Y_1..Y_n = Split(Y, axis=-1, split=[N_1..N_n])

Why it is exact: column j of X @ [W_1 | ... | W_n] is the dot product of a row of X with column
j of the concatenated weight, which is that column of exactly one W_i; so the slice of width N_i
at offset N_1 + ... + N_{i-1} equals X @ W_i (same operands, same dtype; only the kernel's
blocking may change the summation order, as it may between any two runs of a BLAS). A bias
broadcast along the last axis commutes with the slicing the same way. The outputs keep their
dtype and their shape X.shape[:-1] + [N_i]. The original weights are not touched: new
concatenated constants are made, and the old ones die through eliminate-dead-code (as do the
Constant nodes that produced them, if any).

Biases: when every member's MatMul output feeds exactly one Add with a constant [N_i] bias of
the same dtype, the Adds are merged into one Add before the Split and the Split outputs replace
the Adds' outputs. Otherwise (some members have no such bias, or a MatMul output has other
readers) only the MatMuls are merged: the Split outputs replace the MatMul outputs and every
existing Add stays in place, reading its slice. This choice never adds arithmetic (no zero
biases), so it stays exact even for -0.0.

Guards: only standard-domain MatMuls reading X as input A, whose output is still read (the
pass unlinks the MatMuls and Adds it replaced, so a rerun before DCE cannot fuse them again);
when X is itself a projection fused earlier in the same run, its readers now read a Split
output and wait for the next round;
weight constant (initializer or Constant node, also seen through Identity and through a 2-D
Transpose, so the pass works without fold-constants), 2-D, with the same K (= weight rows) and
dtype as the rest of the group and as X when X's dtype is known; a MatMul reading X as both
operands is never a member. Opsets below 11 need a non-negative Split axis, so there the rank of
X must be known. Split takes its sizes as an input from opset 13 and as an attribute before.

One rule (`infercc.passes.rules`) on MatMul: the first MatMul of a group (in graph order) is
the anchor, and the others' refusals are reported at them. For bisection one rewrite is one
group fused, named by its first MatMul.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.tensor import Tensor
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import (
    const_tensor,
    default_opset,
    is_live,
    producer,
    through_identity,
)
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)


@dataclass
class _Member:
    """One projection: its MatMul, weight, and (optionally) the bias Add that follows it."""

    matmul: Node
    weight: Tensor
    add: Node | None = None
    bias: Tensor | None = None

    @property
    def width(self) -> int:
        return int(self.weight.shape[1])


@register_pass("fuse-qkv")
def fuse_qkv(graph: Graph, ctx: PassContext) -> PassResult:
    """Merge MatMuls (+ bias Adds) that read the same input into one MatMul and a Split."""
    fuser = _Fuser()
    apply_rules(graph, ctx, [Rule("groups", ("MatMul",), fuser.check, fuser.rewrite)])
    return PassResult(changed=fuser.stats["groups"] > 0, stats=fuser.stats)


@dataclass(frozen=True)
class _Group:
    """Projections of `x` to fuse, in graph order (the first is the anchor), split on `axis`."""

    x: Value
    members: list[_Member]
    axis: int


class _Fuser:
    """The rule's state for one run: per graph, what each MatMul is (the first member of a
    group, or refused with a reason), planned from the graph as it was when the run reached it,
    so the MatMuls made by this run wait for the next round."""

    def __init__(self) -> None:
        self.plans: dict[Graph, dict[Node, list[_Member] | str]] = {}
        self.stats: dict[str, int] = {"groups": 0, "matmuls": 0, "biases": 0}

    def check(self, mm: Node, ctx: PassContext) -> _Group:
        graph = mm.owning_graph()
        if graph not in self.plans:
            self.plans[graph] = _plan(graph)
        found = self.plans[graph].get(mm)
        if found is None:
            raise NoMatch()
        if isinstance(found, str):
            raise NoMatch(found)
        x = mm.input(0)
        # An earlier group's rewrite may have moved these MatMuls onto its Split's outputs
        # (when x was one of its projections): they are fused on the next round, if at all.
        moved = [m for m in found if m.matmul.graph is not graph or m.matmul.input(0) is not x]
        if x is None or moved:
            raise NoMatch()
        axis = _split_axis(x, default_opset(graph))
        if axis is None:
            raise NoMatch("opset < 11 needs the activation's rank for the Split axis", x)
        return _Group(x, found, axis)

    def rewrite(self, mm: Node, group: _Group, ctx: PassContext) -> None:
        _rewrite(mm.owning_graph(), group)
        _count(self.stats, group.members)


def _plan(graph: Graph) -> dict[Node, list[_Member] | str]:
    """MatMul -> its group (for the group's first MatMul) or why it is no member."""
    order = {node: i for i, node in enumerate(graph)}
    plan: dict[Node, list[_Member] | str] = {}
    for x, matmuls in _shared_inputs(graph).items():
        for group in _groups(x, matmuls, plan):
            group.sort(key=lambda m: order[m.matmul])
            plan[group[0].matmul] = group
    return plan


def _count(stats: dict[str, int], group: list[_Member]) -> None:
    stats["groups"] += 1
    stats["matmuls"] += len(group)
    if all(m.add is not None for m in group):
        stats["biases"] += len(group)
    key = f"groups_of_{len(group)}"
    stats[key] = stats.get(key, 0) + 1


def _shared_inputs(graph: Graph) -> dict[Value, list[Node]]:
    """Activations read as input A by two or more live standard MatMuls of this graph."""
    found: dict[Value, list[Node]] = {}
    for node in graph:
        if node.op_type != "MatMul" or not node.is_standard or not is_live(node):
            continue
        a = node.input(0)
        if a is not None:
            found.setdefault(a, []).append(node)
    return {x: ms for x, ms in found.items() if len(ms) >= 2}


def _groups(
    x: Value, matmuls: list[Node], refused: dict[Node, list[_Member] | str]
) -> list[list[_Member]]:
    """Split the MatMuls on `x` into fusible groups keyed by (weight dtype, K); the reason
    each other MatMul is no member goes to `refused`."""
    buckets: dict[tuple[int, int], list[_Member]] = {}
    for mm in matmuls:
        member = _member(x, mm)
        if isinstance(member, str):
            refused[mm] = member
        else:
            key = (member.weight.dtype, int(member.weight.shape[0]))
            buckets.setdefault(key, []).append(member)
    groups = [ms for ms in buckets.values() if len(ms) >= 2]
    for key, ms in buckets.items():
        if len(ms) == 1:
            refused[ms[0].matmul] = _lonely_reason(x, key, buckets)
    return groups


def _lonely_reason(x: Value, key: tuple[int, int], buckets: dict) -> str:
    others = [k for k in buckets if k != key]
    if not others:
        return f"no other MatMul on {x.name!r} has a usable constant weight"
    if any(k[0] != key[0] for k in others):
        return f"weight dtype differs from the other projections of {x.name!r}"
    return f"weight rows (K) differ from the other projections of {x.name!r}"


def _member(x: Value, mm: Node) -> _Member | str:
    """The MatMul as a group member, or why it cannot be one."""
    w = mm.input(1)
    if w is None or w is x:
        return f"reads {x.name!r} as both operands"
    weight = _const_tensor(w)
    reason = _weight_problem(x, weight)
    if reason is not None:
        return reason
    assert weight is not None
    member = _Member(mm, weight)
    _attach_bias(member)
    return member


def _weight_problem(x: Value, weight: Tensor | None) -> str | None:
    """Why `weight` cannot be a member's weight (None when it can)."""
    if weight is None:
        return "weight (input B) is not a constant"
    if len(weight.shape) != 2:
        return f"weight is not 2-D (rank {len(weight.shape)})"
    if x.dtype is not None and weight.dtype != x.dtype:
        return "weight dtype differs from the activation dtype"
    return None


def _const_tensor(v: Value) -> Tensor | None:
    """The constant data of `v` (`infercc.passes.match.const_tensor`), or a 2-D Transpose of
    one (as the dynamo exporter emits before folding)."""
    tensor = const_tensor(v)
    if tensor is not None:
        return tensor
    node = producer(through_identity(v), "Transpose")
    return None if node is None else _transposed(node)


def _transposed(node: Node) -> Tensor | None:
    src = node.input(0)
    inner = _const_tensor(src) if src is not None else None
    if inner is None or len(inner.shape) != 2 or node.attr("perm", [1, 0]) != [1, 0]:
        return None
    return Tensor(np.ascontiguousarray(inner.numpy().T), dtype=inner.dtype)


def _attach_bias(member: _Member) -> None:
    """Record the Add that is the only reader of the MatMul output, if its bias is [N] const."""
    out = member.matmul.outputs[0]
    assert out is not None
    uses = out.uses()
    if len(uses) != 1 or out.is_graph_output:
        return
    add, i = uses[0]
    if add.op_type != "Add" or not add.is_standard or add.graph is not member.matmul.graph:
        return
    other = add.input(1 - i)
    bias = _const_tensor(other) if other is not None else None
    if bias is None or bias.dtype != member.weight.dtype or bias.shape != (member.width,):
        return
    member.add, member.bias = add, bias


def _split_axis(x: Value, opset: int) -> int | None:
    """-1 where Split accepts it (opset >= 11), else the last axis when the rank is known."""
    if opset >= 11:
        return -1
    return None if x.rank is None else x.rank - 1


def _rewrite(graph: Graph, found: _Group) -> None:
    x, group = found.x, found.members
    anchor = group[0].matmul
    fused = _fused_matmul(graph, x, group, anchor)
    with_bias = all(m.add is not None for m in group)
    if with_bias:
        fused = _fused_add(graph, fused, group, anchor)
    parts = _split(graph, fused, group, anchor, found.axis, default_opset(graph))
    for member, part in zip(group, parts, strict=True):
        old = member.add.outputs[0] if with_bias and member.add else member.matmul.outputs[0]
        assert old is not None
        part.dtype, part.shape = old.dtype, old.shape
        graph.replace_all_uses_with(old, part)
        _remove_replaced(graph, member, with_bias)
    log.debug("fuse-qkv: fused %d MatMuls on %s", len(group), x.name)


def _remove_replaced(graph: Graph, member: _Member, with_bias: bool) -> None:
    """Unlink the member's now unread Add and MatMul, so a rerun cannot fuse them again."""
    dead = [member.add, member.matmul] if with_bias else [member.matmul]
    for node in dead:
        out = node.outputs[0] if node is not None else None
        if node is not None and out is not None and not out.uses() and not out.is_graph_output:
            graph.remove(node)


def _fused_matmul(graph: Graph, x: Value, group: list[_Member], anchor: Node) -> Value:
    dtype = group[0].weight.dtype
    weight = np.concatenate([m.weight.numpy() for m in group], axis=-1)
    w = graph.make_constant(Tensor(weight, dtype=dtype), "qkv_weight")
    node = graph.make_node("MatMul", [x, w], before=anchor, name="qkv_matmul")
    out = node.outputs[0]
    assert out is not None
    out.dtype = dtype
    total = int(weight.shape[1])
    out.shape = None if x.shape is None else (*x.shape[:-1], total)
    return out


def _fused_add(graph: Graph, y: Value, group: list[_Member], anchor: Node) -> Value:
    dtype = group[0].weight.dtype
    bias = np.concatenate([m.bias.numpy() for m in group if m.bias is not None])
    b = graph.make_constant(Tensor(bias, dtype=dtype), "qkv_bias")
    node = graph.make_node("Add", [y, b], before=anchor, name="qkv_add")
    out = node.outputs[0]
    assert out is not None
    out.dtype, out.shape = y.dtype, y.shape
    return out


def _split(
    graph: Graph, y: Value, group: list[_Member], anchor: Node, axis: int, opset: int
) -> list[Value]:
    sizes = [m.width for m in group]
    attrs: dict[str, object]
    if opset >= 13:
        split = graph.make_constant(np.asarray(sizes, dtype=np.int64), "qkv_split")
        inputs, attrs = [y, split], {"axis": axis}
    else:
        inputs, attrs = [y], {"axis": axis, "split": sizes}
    node = graph.make_node(
        "Split", inputs, len(group), before=anchor, name="qkv_split", attributes=attrs
    )
    return [v for v in node.outputs if v is not None]
