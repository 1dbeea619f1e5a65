"""fuse-rms-norm: RMSNorm (and the residual Add before it) into one normalization op.

The pattern (Llama's RMSNorm as both torch exporters write it, after fold-constants), over
the last axis of x, of width D::

    x  = [Cast(x0, to=float)]                      (transformers' upcast, optional)
    m  = ReduceMean(Pow(x, 2) | Mul(x, x), axes=[-1], keepdims=1)
    s  = Sqrt(Add(m, eps))
    n  = Mul(x, r) | Div(x, s),  r = Reciprocal(s) | Div(1, s)
                                   (torch.rsqrt: TorchScript writes Div(1, Sqrt), dynamo
                                    Reciprocal(Sqrt))
    n  = [Cast(n, to=dtype(x0))]                   (the cast back, when x was upcast)
    y  = Mul(n, w) | Mul(w, n)                     (w a constant of shape [D]; without
                                                    the Mul, as eliminate-no-ops leaves a
                                                    weight of ones, y = n and w = ones)
    ==>
    y  = SimplifiedLayerNormalization(x0, w; axis=-1, epsilon=eps, stash_type=1)

When x0 is a residual sum `Add(a, b)` of two tensors of one shape [B, S, D] (rank 3, proven
by the symbolic shapes of `infercc.ir.symbolic_shapes`, not by the names an exporter's
value_info gives: TorchScript names a dimension `unk__N` afresh at every layer), the
Add joins in: `y, _, _, x0 = com.microsoft.SkipSimplifiedLayerNormalization(a, b, w)`, whose
fourth output is the sum itself, for the sum's other readers (the residual stream).

Why it is exact: onnxruntime's kernels compute `x / sqrt(mean(x^2) + eps) * w` over the
last axis, in float32 (stash_type=1): the same arithmetic as the pattern, in one pass over
the row; for a float16 x0 the pattern's upcast and cast back are the kernel's stash type. The
results differ by float rounding only (the reduction's order). SimplifiedLayerNormalization
is an onnxruntime op that onnxruntime registers in the standard domain (version 1; it has no
com.microsoft one), as its transformers optimizer writes it, so onnx.checker, which does not
know it, rejects the fused model; SkipSimplifiedLayerNormalization is a com.microsoft op.
Both only for the cpu target with onnxruntime's ops allowed. Otherwise
(`--portable`, a GPU target) the standard opset-23 `RMSNormalization` (the same maths, an
ONNX op) where the model's opset is 23 or more, else nothing, and the refusal says so.

Guards: every intermediate (the square, mean, sum, root, reciprocal, quotient, casts) is read
only by the next node of the pattern, and none is a graph output; the exponent is 2 and eps
a finite non-negative scalar constant; the mean is over the last axis alone, kept; x's last
dimension is static, and w a constant vector of that length; float32 or float16 x0 (the cast
form: x0 cast to float32 and back to its own type). A rule of `infercc.passes.rules`
anchored on ReduceMean: one rewrite is one normalization, named by its ReduceMean.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np
from onnx import TensorProto

from infercc.ir import symbolic as S
from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.ir.symbolic_shapes import SymbolicShapes
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import (
    const_ints,
    const_scalar,
    const_value,
    default_opset,
    producer,
    sole_reader,
)
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)
RMS_OPSET = 23  # the standard RMSNormalization


@dataclass(frozen=True)
class _Skip:
    """The residual Add joining in: its inputs and its output (the sum), of one shape."""

    a: Value
    b: Value
    add: Node
    sum: Value


@dataclass(frozen=True)
class _Match:
    key: str  # the counter: "simplified", "skip" or "rms"
    x: Value  # the normalized input (x0)
    out: Value  # y
    weight: Value | None  # None: no Mul by a weight (a weight of ones)
    eps: float
    anchor: Node
    width: int  # D, x's static last dimension
    removed: list[Node] = field(default_factory=list)
    skip: _Skip | None = None  # the residual Add, in the skip form


def _next(value: Value, *ops: str) -> Node | None:
    """The one standard node reading `value`, when it is one of `ops`."""
    node = sole_reader(value)
    if node is None or not node.is_standard or node.op_type not in ops:
        return None
    return node


def _other(node: Node, value: Value) -> Value | None:
    a, b = node.input(0), node.input(1)
    return b if a is value else a if b is value else None


def _squared(mean: Node) -> tuple[Value, Node]:
    """ReduceMean's input is x * x or x ** 2: (x, the square node). Not every ReduceMean is a
    norm: NoMatch gives a reason only where a square feeds it."""
    squares = mean.input(0)
    sq = producer(squares)
    if squares is None or sq is None or sq.op_type not in ("Pow", "Mul"):
        raise NoMatch()
    x = sq.input(0)
    if x is None or len(squares.uses()) != 1 or (sq.op_type == "Mul" and sq.input(1) is not x):
        raise NoMatch("the mean is not of a square Pow(x, 2) or Mul(x, x) read only by it", sq)
    if sq.op_type == "Pow":
        if const_scalar(sq.input(1)) != 2.0:
            raise NoMatch("the Pow's exponent is not the constant 2", sq)
    return x, sq


def _last_axis(mean: Node, x: Value) -> bool:
    axes = mean.attr("axes") if mean.input(1) is None else const_ints(mean.input(1))
    if axes is None or len(axes) != 1 or mean.attr("keepdims", 1) != 1:
        return False
    return axes[0] == -1 or (x.rank is not None and axes[0] == x.rank - 1)


def _root(mean: Node, removed: list[Node]) -> tuple[Value, float]:
    """Sqrt(Add(mean, eps)) -> (the root, eps)."""
    add = _next(mean.output, "Add")
    eps = None if add is None else const_scalar(_other(add, mean.output))
    if add is None or eps is None:
        raise NoMatch("the mean is not read by one Add of a constant epsilon alone")
    if not math.isfinite(eps) or eps < 0:
        raise NoMatch(f"epsilon {eps} is not finite and non-negative", add)
    sqrt = _next(add.output, "Sqrt")
    if sqrt is None:
        raise NoMatch("mean + epsilon is not read by one Sqrt alone", add)
    removed += [add, sqrt]
    return sqrt.output, eps


def _normalized(root: Value, x: Value, removed: list[Node]) -> Value:
    """Div(x, root), or Mul(x, Reciprocal(root) | Div(1, root)) -> the quotient."""
    reader = _next(root, "Div", "Reciprocal")
    if reader is not None and reader.op_type == "Div" and not _is_one(reader.input(0)):
        if reader.input(0) is not x or reader.input(1) is not root:
            raise NoMatch("the Div does not divide x by the root", reader)
        removed.append(reader)
        return reader.output
    if reader is not None and reader.op_type == "Div" and reader.input(1) is not root:
        raise NoMatch("the Div does not divide x by the root", reader)
    if reader is not None:
        mul = _next(reader.output, "Mul")
        if mul is not None and _other(mul, reader.output) is x:
            removed += [reader, mul]
            return mul.output
    raise NoMatch("the root is not read by Div(x, root) or Mul(x, Reciprocal(root)) alone", root)


def _is_one(value: Value | None) -> bool:
    return const_scalar(value) == 1.0


def _upcast(x: Value) -> tuple[Value, Node | None]:
    """x = Cast(x0, to=float) with x0 float16 or float32 -> (x0, the Cast)."""
    cast = producer(x, "Cast")
    x0 = None if cast is None else cast.input(0)
    if cast is None or x0 is None or cast.attr("to") != TensorProto.FLOAT:
        return x, None
    if x0.dtype not in FLOATS:
        return x, None
    return x0, cast


def match(mean: Node, sym: SymbolicShapes | None = None) -> _Match:
    """The RMSNorm around `mean`; NoMatch says why it is not one (x's width read from `sym`,
    the symbolic shapes, where given; else from the IR)."""
    x, sq = _squared(mean)
    if not _last_axis(mean, x):
        raise NoMatch("the mean is not over the last axis alone with keepdims=1")
    removed = [sq, mean]
    root, eps = _root(mean, removed)
    n = _normalized(root, x, removed)
    x0, up = _upcast(x)
    if up is not None:
        down = _next(n, "Cast")
        if down is None or down.attr("to") != x0.dtype:
            raise NoMatch("x was cast to float32 but the result is not cast back to its type", up)
        removed.append(down)
        n = down.output
        if not set(x.users()) <= set(removed):
            raise NoMatch("the cast of x to float32 has readers outside the normalization", up)
        removed.append(up)
    shape = sym.shape(x0) if sym is not None else x0.shape
    last = shape[-1] if shape else None
    width = last if isinstance(last, int) else None
    return _weighted(mean, x0, width, n, eps, removed)


def _weighted(
    mean: Node, x0: Value, width: int | None, n: Value, eps: float, removed: list[Node]
) -> _Match:
    """The Mul by the weight, when there is one (eliminate-no-ops drops a Mul by ones)."""
    if x0.dtype not in FLOATS:
        raise NoMatch("x is not float32 or float16", x0)
    if not isinstance(width, int):
        raise NoMatch("x's last dimension is not static", x0)
    mul = _next(n, "Mul")
    w = None if mul is None else _other(mul, n)
    weight = const_value(w)
    if mul is None or w is None or weight is None:
        return _Match("simplified", x0, n, None, eps, mean, width, removed)
    if weight.ndim != 1 or weight.shape[0] != width:
        raise NoMatch(
            f"the weight's shape {list(weight.shape)} is not [D] with D x's last dim {width}", w
        )
    if weight.dtype != _np(x0.dtype):
        raise NoMatch("x and the weight are not both float32 or both float16", w)
    removed.append(mul)
    return _Match("simplified", x0, mul.output, w, eps, mean, width, removed)


def _np(dtype: int | None) -> np.dtype:
    return np.dtype(np.float32 if dtype == TensorProto.FLOAT else np.float16)


def _residual(m: _Match, sym: SymbolicShapes) -> _Match:
    """`m` in the skip form when x0 is Add(a, b) of two rank-3 tensors proven of one shape
    (symbolically: an exporter's value_info may name one dimension differently at a and b)."""
    add = producer(m.x, "Add")
    if add is None or len(add.inputs) != 2:
        return m
    a, b = add.inputs
    if a is None or b is None or a.is_constant or b.is_constant:
        return m  # (a, b and the sum are of one type: Add's type constraint)
    x, sa, sb = (sym.shape(v) for v in (m.x, a, b))
    if x is None or sa is None or sb is None or not len(x) == len(sa) == len(sb) == 3:
        return m
    pairs = [*zip(sa, x, strict=True), *zip(sb, x, strict=True)]
    if not all(S.equal(u, w) is True for u, w in pairs):
        return m
    return replace(m, key="skip", skip=_Skip(a, b, add, m.x), removed=[*m.removed, add])


def _contrib(ctx: PassContext) -> bool:
    return ctx.fused_ops_allowed and ctx.target == "cpu"


def _check(node: Node, ctx: PassContext, sym: SymbolicShapes) -> _Match:
    found = match(node, sym)
    if _contrib(ctx):
        return _residual(found, sym)
    opset = default_opset(node)
    if opset < RMS_OPSET:
        raise NoMatch(
            f"--portable or a GPU target keeps standard ops, and RMSNormalization needs "
            f"opset {RMS_OPSET} (the model has {opset})"
        )
    return replace(found, key="rms")


def _rewrite(node: Node, m: _Match, ctx: PassContext) -> None:
    graph = node.owning_graph()
    weight = m.weight
    if weight is None:
        weight = graph.make_constant(np.ones(m.width, _np(m.x.dtype)), "rms_norm_weight")
    if m.skip is not None:
        fused = _skip_node(graph, m.skip, weight, m.eps)
    else:
        op = "SimplifiedLayerNormalization" if m.key == "simplified" else "RMSNormalization"
        attrs = {"axis": -1, "epsilon": m.eps, "stash_type": 1}
        fused = graph.make_node(op, [m.x, weight], 1, before=m.anchor, name=op, attributes=attrs)
    out = fused.out(0)
    out.dtype, out.shape = m.out.dtype, m.out.shape
    graph.replace_all_uses_with(m.out, out)
    _drop(graph, m.removed)


def _skip_node(graph: Graph, skip: _Skip, weight: Value, eps: float) -> Node:
    """SkipSimplifiedLayerNormalization right after the residual Add (the sum's other readers
    may come before the ReduceMean), its fourth output taking over the sum's readers."""
    name = graph.fresh_node_name("SkipSimplifiedLayerNormalization")
    # Outputs 1 and 2 (mean, inverse deviation) are left out: nothing reads them.
    out, total = Value(graph.fresh_name(f"{name}_out")), Value(graph.fresh_name(name))
    fused = Node(
        "SkipSimplifiedLayerNormalization",
        [skip.a, skip.b, weight],
        [out, None, None, total],
        domain=MS_DOMAIN,
        name=name,
        attributes={"epsilon": eps},
    )
    graph.insert_after(skip.add, fused)
    graph.ensure_opset(MS_DOMAIN)
    total.dtype, total.shape = skip.sum.dtype, skip.sum.shape
    graph.replace_all_uses_with(skip.sum, total)
    return fused


def _drop(graph: Graph, nodes: list[Node]) -> None:
    order = {n: i for i, n in enumerate(graph)}
    for dead in sorted(set(nodes), key=lambda n: -order.get(n, -1)):
        if dead.graph is graph and not any(
            o is not None and (o.uses() or o.is_graph_output) for o in dead.outputs
        ):
            graph.remove(dead)


@register_pass("fuse-rms-norm")
def fuse_rms_norm(graph: Graph, ctx: PassContext) -> PassResult:
    """RMSNorm (+ its residual Add) -> SimplifiedLayerNormalization /
    SkipSimplifiedLayerNormalization (cpu), or RMSNormalization (opset >= 23)."""
    sym = SymbolicShapes(S.algebra_for(graph))
    rule = Rule("rms-norm", ("ReduceMean",), lambda node, c: _check(node, c, sym), _rewrite)
    run = apply_rules(graph, ctx, [rule], subgraphs=False)
    counts = {k: run.counts[k] for k in ("simplified", "skip", "rms") if run.counts[k]}
    return PassResult(changed=bool(counts), stats=counts)
