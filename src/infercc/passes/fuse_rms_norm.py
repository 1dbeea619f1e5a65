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

When x0 is a residual sum `Add(a, b)` of two tensors of one shape [B, S, D] (rank 3), the
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
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import (
    const_ints,
    const_scalar,
    const_value,
    default_opset,
    producer,
    sole_reader,
)
from infercc.passes.rules import Refuse, Rule, apply_rules

log = logging.getLogger(__name__)

FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)
RMS_OPSET = 23  # the standard RMSNormalization


@dataclass
class _Match:
    key: str  # the counter: "simplified", "skip" or "rms"
    x: Value  # the normalized input (x0)
    out: Value  # y
    weight: Value | None  # None: no Mul by a weight (a weight of ones)
    eps: float
    anchor: Node
    removed: list[Node] = field(default_factory=list)
    skip: tuple[Value, Value] | None = None  # the residual Add's inputs
    residual: Value | None = None  # the residual Add's output


def _next(value: Value, *ops: str) -> Node | None:
    """The one standard node reading `value`, when it is one of `ops`."""
    node = sole_reader(value)
    if node is None or not node.is_standard or node.op_type not in ops:
        return None
    return node


def _other(node: Node, value: Value) -> Value | None:
    a, b = node.input(0), node.input(1)
    return b if a is value else a if b is value else None


def _squared(mean: Node) -> tuple[Value, Node] | str:
    """ReduceMean's input is x * x or x ** 2: (x, the square node)."""
    sq = producer(mean.input(0))
    if sq is None or sq.op_type not in ("Pow", "Mul") or len(mean.input(0).uses()) != 1:
        return "the mean is not of a square Pow(x, 2) or Mul(x, x) read only by it"
    x = sq.input(0)
    if sq.op_type == "Mul" and sq.input(1) is not x:
        return "the mean is not of a square Pow(x, 2) or Mul(x, x) read only by it"
    if sq.op_type == "Pow":
        if const_scalar(sq.input(1)) != 2.0:
            return "the Pow's exponent is not the constant 2"
    return x, sq


def _last_axis(mean: Node, x: Value) -> bool:
    axes = mean.attr("axes") if mean.input(1) is None else const_ints(mean.input(1))
    if axes is None or len(axes) != 1 or mean.attr("keepdims", 1) != 1:
        return False
    return axes[0] == -1 or (x.rank is not None and axes[0] == x.rank - 1)


def _root(mean: Node, removed: list[Node]) -> tuple[Value, float] | str:
    """Sqrt(Add(mean, eps)) -> (the root, eps)."""
    add = _next(mean.output, "Add")
    eps = None if add is None else const_scalar(_other(add, mean.output))
    if eps is None:
        return "the mean is not read by one Add of a constant epsilon alone"
    if not math.isfinite(eps) or eps < 0:
        return f"epsilon {eps} is not finite and non-negative"
    sqrt = _next(add.output, "Sqrt")
    if sqrt is None:
        return "mean + epsilon is not read by one Sqrt alone"
    removed += [add, sqrt]
    return sqrt.output, eps


def _normalized(root: Value, x: Value, removed: list[Node]) -> Value | str:
    """Div(x, root), or Mul(x, Reciprocal(root) | Div(1, root)) -> the quotient."""
    reader = _next(root, "Div", "Reciprocal")
    if reader is not None and reader.op_type == "Div" and not _is_one(reader.input(0)):
        if reader.input(0) is not x or reader.input(1) is not root:
            return "the Div does not divide x by the root"
        removed.append(reader)
        return reader.output
    if reader is not None and reader.op_type == "Div" and reader.input(1) is not root:
        return "the Div does not divide x by the root"
    if reader is not None:
        mul = _next(reader.output, "Mul")
        if mul is not None and _other(mul, reader.output) is x:
            removed += [reader, mul]
            return mul.output
    return "the root is not read by Div(x, root) or Mul(x, Reciprocal(root)) alone"


def _is_one(value: Value | None) -> bool:
    return const_scalar(value) == 1.0


def _upcast(x: Value) -> tuple[Value, Node | None]:
    """x = Cast(x0, to=float) with x0 float16 or float32 -> (x0, the Cast)."""
    cast = producer(x, "Cast")
    if cast is None or cast.attr("to") != TensorProto.FLOAT or cast.input(0) is None:
        return x, None
    if cast.input(0).dtype not in FLOATS:
        return x, None
    return cast.input(0), cast


def match(mean: Node) -> _Match | str:
    """The RMSNorm around `mean`, or why it is not one."""
    found = _squared(mean)
    if isinstance(found, str):
        return found
    x, sq = found
    if not _last_axis(mean, x):
        return "the mean is not over the last axis alone with keepdims=1"
    removed = [sq, mean]
    root = _root(mean, removed)
    if isinstance(root, str):
        return root
    root, eps = root
    n = _normalized(root, x, removed)
    if isinstance(n, str):
        return n
    x0, up = _upcast(x)
    if up is not None:
        down = _next(n, "Cast")
        if down is None or down.attr("to") != x0.dtype:
            return "x was cast to float32 but the result is not cast back to its type"
        removed.append(down)
        n = down.output
        if not set(x.users()) <= set(removed):
            return "the cast of x to float32 has readers outside the normalization"
        removed.append(up)
    return _weighted(mean, x0, n, eps, removed)


def _weighted(mean, x0: Value, n: Value, eps: float, removed: list[Node]) -> _Match | str:
    """The Mul by the weight, when there is one (eliminate-no-ops drops a Mul by ones)."""
    width = x0.shape[-1] if x0.shape else None
    if x0.dtype not in FLOATS:
        return "x is not float32 or float16"
    if not isinstance(width, int):
        return "x's last dimension is not static"
    mul = _next(n, "Mul")
    w = None if mul is None else _other(mul, n)
    weight = const_value(w)
    if weight is None:
        return _Match("simplified", x0, n, None, eps, mean, removed)
    if weight.ndim != 1 or weight.shape[0] != width:
        return f"the weight's shape {list(weight.shape)} is not [D] with D x's last dim {width}"
    if weight.dtype != _np(x0.dtype):
        return "x and the weight are not both float32 or both float16"
    removed.append(mul)
    return _Match("simplified", x0, mul.output, w, eps, mean, removed)


def _np(dtype: int) -> np.dtype:
    return np.dtype(np.float32 if dtype == TensorProto.FLOAT else np.float16)


def _residual(m: _Match) -> None:
    """Make `m` the skip form when x0 is Add(a, b) of two rank-3 tensors of one shape."""
    add = producer(m.x, "Add")
    if add is None or len(add.inputs) != 2 or m.x.shape is None or len(m.x.shape) != 3:
        return
    a, b = add.inputs
    if a is None or b is None or a.shape != m.x.shape or b.shape != m.x.shape:
        return
    if a.dtype != m.x.dtype or b.dtype != m.x.dtype or a.is_constant or b.is_constant:
        return
    m.key, m.skip, m.residual = "skip", (a, b), m.x
    m.removed.append(add)


def _contrib(ctx: PassContext) -> bool:
    return ctx.fused_ops_allowed and ctx.target == "cpu"


def _check(node: Node, ctx: PassContext) -> _Match | Refuse | None:
    found = match(node)
    if isinstance(found, str):
        # Not every ReduceMean is a norm: refuse only where a square feeds it.
        sq = producer(node.input(0))
        return Refuse(found) if sq is not None and sq.op_type in ("Pow", "Mul") else None
    if _contrib(ctx):
        _residual(found)
        return found
    opset = default_opset(node)
    if opset < RMS_OPSET:
        return Refuse(
            f"--portable or a GPU target keeps standard ops, and RMSNormalization needs "
            f"opset {RMS_OPSET} (the model has {opset})"
        )
    found.key = "rms"
    return found


def _rewrite(node: Node, m: _Match, ctx: PassContext) -> None:
    graph = node.graph
    if m.weight is None:
        ones = np.ones(m.x.shape[-1], _np(m.x.dtype))  # type: ignore[index]
        m.weight = graph.make_constant(ones, "rms_norm_weight")
    if m.key == "skip":
        fused = _skip_node(graph, m)
    else:
        op = "SimplifiedLayerNormalization" if m.key == "simplified" else "RMSNormalization"
        attrs = {"axis": -1, "epsilon": m.eps, "stash_type": 1}
        fused = graph.make_node(op, [m.x, m.weight], 1, before=m.anchor, name=op, attributes=attrs)
    out = fused.outputs[0]
    out.dtype, out.shape = m.out.dtype, m.out.shape
    graph.replace_all_uses_with(m.out, out)
    _drop(graph, m.removed)


def _skip_node(graph: Graph, m: _Match) -> Node:
    """SkipSimplifiedLayerNormalization right after the residual Add (the sum's other readers
    may come before the ReduceMean), its fourth output taking over the sum's readers."""
    add = m.residual.producer  # type: ignore[union-attr]
    name = graph.fresh_node_name("SkipSimplifiedLayerNormalization")
    # Outputs 1 and 2 (mean, inverse deviation) are left out: nothing reads them.
    outs = [Value(graph.fresh_name(f"{name}_out")), None, None, Value(graph.fresh_name(name))]
    fused = Node(
        "SkipSimplifiedLayerNormalization",
        [*m.skip, m.weight],  # type: ignore[misc]
        outs,
        domain=MS_DOMAIN,
        name=name,
        attributes={"epsilon": m.eps},
    )
    graph.insert_after(add, fused)
    graph.model.opset_imports.setdefault(MS_DOMAIN, 1)
    outs[3].dtype, outs[3].shape = m.residual.dtype, m.residual.shape  # type: ignore[union-attr]
    graph.replace_all_uses_with(m.residual, outs[3])  # type: ignore[arg-type]
    return fused


def _drop(graph: Graph, nodes: list[Node]) -> None:
    order = {n: i for i, n in enumerate(graph)}
    for dead in sorted(set(nodes), key=lambda n: -order.get(n, -1)):
        if dead.graph is graph and not any(
            o is not None and (o.uses() or o.is_graph_output) for o in dead.outputs
        ):
            graph.remove(dead)


RMS_NORM = Rule("rms-norm", ("ReduceMean",), _check, _rewrite)


@register_pass("fuse-rms-norm")
def fuse_rms_norm(graph: Graph, ctx: PassContext) -> PassResult:
    """RMSNorm (+ its residual Add) -> SimplifiedLayerNormalization /
    SkipSimplifiedLayerNormalization (cpu), or RMSNormalization (opset >= 23)."""
    run = apply_rules(graph, ctx, [RMS_NORM], subgraphs=False)
    counts = {k: run.counts[k] for k in ("simplified", "skip", "rms") if run.counts[k]}
    return PassResult(changed=bool(counts), stats=counts)
