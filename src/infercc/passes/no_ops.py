"""eliminate-no-ops: remove operators that provably return their input unchanged.

Each rule forwards the node's output to a value that already holds the same tensor (same dtype,
same shape, same elements), so every reader reads that value instead. It fires only when the
dtype, shape and broadcasting known in the graph prove it; fuzzers found peers removing
"no-ops" that were not (onnxoptimizer#274 dropout, #275 expand, #283 split, #285 mul-by-one).

- Identity: y = x.
- Dropout in inference: y = x when training_mode is absent or a constant False (and, before
  opset 7, is_test=1) and the mask output is unused; the ratio does not matter then.
- Cast / CastLike to the input's own (known) dtype: the conversion is the identity; a Cast
  back from a Cast into a type that holds every value of the first (float32 -> float64 ->
  float32, int8 -> int32 -> int8, ...) is too.
- Reshape / Flatten / Squeeze / Unsqueeze whose result has the input's shape: these only
  relabel the dimensions of a row-major buffer, so equal shapes mean equal tensors. The
  result's shape is computed from the input's shape and the node's own constants (never read
  off the inferred output, which onnx's inference can get wrong: negative axes before opset
  11, say): Unsqueeze with axes and Squeeze with axes always change the rank; Squeeze without
  axes keeps the shape when no dimension is 1 (all known); Flatten when the input is
  [prod(dims[:axis]), prod(dims[axis:])] already. For Reshape with a constant target the shape
  is checked entry by entry (0 copies the input dimension unless allowzero=1; a -1 is accepted
  only when every other dimension is proven equal); a Reshape whose target is not a constant
  is kept.
- Reshape(R(x), s2) = Reshape(x, s2), R a Reshape, Squeeze, Unsqueeze or Flatten, when s2 is a
  constant with no 0 that copies a dimension (allowzero=1, or no 0 at all): the result depends
  only on the element count and row-major order, which R preserves (-1 is computed from the
  element count).
- Unsqueeze(Squeeze(x, a), a) = x and Squeeze(Unsqueeze(x, a), a) = x for the same normalized
  constant axes (both sets of axes live in the same rank, and Squeeze only drops size-1 dims).
- Expand(x, s) = x when broadcasting x with s gives x's shape: s is a constant, len(s) <=
  rank(x) and every aligned entry of s is 1 or equal to x's (static) dimension.
- Transpose with the identity perm; Transpose(Transpose(x, p1), p2) = Transpose(x, q) with
  q[i] = p1[p2[i]], removed entirely when q is the identity.
- Slice covering every sliced axis fully with step 1 (start 0, end >= the dimension; for a
  symbolic dimension, end >= 2**62).
- Slice(Slice(x, ...), ...) with constant bounds, the inner one read by nothing else: one
  Slice of x. Bounds on axes only one of
  them slices are taken as they are (the other axes keep x's dimension, so they mean the same
  there); an axis both slice with positive steps is composed exactly when x's dimension there
  is static (Python's range of a range), else the pair is kept.
- Split with one output and no split sizes, or sizes equal to the whole dimension; Concat of a
  single input; Pad whose constant pads are all zero (any mode).
- A Concat input of length 0 along the Concat's axis adds nothing to the result: it goes
  (a constant of that shape, or a Slice whose constant bounds select nothing of a static
  dimension, as transformers' `x[..., rotary_dim:]` when the rotation takes the whole head);
  a Concat left with one input is that input.
- x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1, x ** 1 with a constant neutral operand, when
  broadcasting the constant with x gives x's shape (the dtype is x's: ONNX requires equal
  operand types, and Pow returns the base's type). The only difference is the sign of a zero:
  -0.0 + 0.0 is +0.0, which compares equal to -0.0.

A node whose output is a graph output stays when its input cannot take the output's name (a
graph input, another graph output, an outer-scope value): replacing it would only add an
Identity again and the pipeline would never reach a fixpoint. Nodes left dead by a rewrite of a
pair are removed by eliminate-dead-code. Runs on every subgraph too.

Each rule is a `infercc.passes.rules.Rule` on its op type: its check returns the rewrite (a
`_Forward` to the value that already holds the result, or a `_Rewire` of a Reshape or
Transpose past the one before it) or the reason it refused, and the driver makes it. For
bisection one rewrite is one node forwarded to its input (removed when nothing reads it any
more) or one pair merged, named by the node rewritten.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infercc.ir.graph import Dim, Graph, Node, Value
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_ints, const_value, default_opset, producer
from infercc.passes.rules import NoMatch, Rule, apply_rules, require

log = logging.getLogger(__name__)

_HUGE_END = 2**62  # a Slice end this large reaches past any dimension a tensor can have


@register_pass("eliminate-no-ops")
def eliminate_no_ops(graph: Graph, ctx: PassContext) -> PassResult:
    """Remove operators that provably return their input (Identity, same-type Cast, ...)."""
    counts = apply_rules(graph, ctx, RULES).counts
    return PassResult(changed=bool(counts), stats=dict(counts))


# -- the two rewrites ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Forward:
    """Every reader of the node's first output reads `src` instead; the node goes once nothing
    reads it."""

    src: Value
    key: str
    out: Value  # the node's first output


@dataclass(frozen=True)
class _Rewire:
    """The node reads `src` as its first input (and takes `perm`, when given)."""

    src: Value
    key: str
    perm: list[int] | None = None


@dataclass(frozen=True)
class _Keep:
    """The node keeps only its inputs at `indices` (a Concat's empty inputs dropped)."""

    indices: tuple[int, ...]
    key: str


@dataclass(frozen=True)
class _Merged:
    """The node slices `src` by (starts, ends, axes, steps): a Slice pair made one."""

    src: Value
    key: str
    bounds: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class _AsReshape:
    """The node (a Transpose that moves only dimensions of size 1) becomes Reshape(src,
    target): the same row-major elements, relabelled."""

    src: Value
    key: str
    target: tuple[int, ...]


Found = _Forward | _Rewire | _Keep | _Merged | _AsReshape


def _forward(node: Node, src: Value | None, kind: str) -> Found:
    """The forwarding of the node's first output to `src`, if its name can move."""
    graph = node.graph
    out = node.outputs[0]
    if graph is None or src is None or out is None:
        raise NoMatch()
    if out.is_graph_output and not graph.can_take_output_name(src):
        raise NoMatch("output is a graph output and its input cannot take the output's name")
    return _Forward(src, kind, out)


def _apply(node: Node, found: Found, ctx: PassContext) -> None:
    graph = node.owning_graph()
    if isinstance(found, _Keep):
        node.replace_inputs([node.input(i) for i in found.indices])
        return
    if isinstance(found, _AsReshape):
        base = node.name or node.op_type
        target = graph.make_constant(np.array(found.target, dtype=np.int64), f"{base}_shape")
        out = require(node.outputs[0])
        new = graph.make_node("Reshape", [found.src, target], before=node, name=base)
        reshaped = require(new.outputs[0])
        reshaped.dtype, reshaped.shape = out.dtype, out.shape
        graph.replace_all_uses_with(out, reshaped)
        graph.remove(node)
        return
    if isinstance(found, _Merged):
        base = node.name or node.op_type
        names = ("starts", "ends", "axes", "steps")
        consts = [
            graph.make_constant(np.array(b, dtype=np.int64), f"{base}_{n}")
            for b, n in zip(found.bounds, names, strict=True)
        ]
        node.replace_inputs([found.src, *consts])
        return
    if isinstance(found, _Rewire):
        node.set_input(0, found.src)
        if found.perm is not None:
            node.set_attr("perm", found.perm)
        return
    graph.replace_all_uses_with(found.out, found.src)
    if not any(v is not None and (v.uses() or v.is_graph_output) for v in node.outputs):
        graph.remove(node)
    log.debug("eliminate-no-ops: %s %s", found.key, node.name)


# -- constants, shapes and attributes ---------------------------------------------------------


def _ints_input_or_attr(node: Node, index: int, name: str) -> list[int] | None:
    """An int list given as a constant input (newer opsets) or as an attribute (older)."""
    if node.input(index) is not None:
        return const_ints(node.input(index))
    attr = node.attr(name)
    return None if attr is None else [int(x) for x in attr]


def _normalize(axes: Sequence[int], rank: int) -> list[int] | None:
    out = [a + rank if a < 0 else a for a in axes]
    if any(a < 0 or a >= rank for a in out) or len(set(out)) != len(out):
        return None
    return sorted(out)


def _broadcast_keeps(shape: tuple[Dim, ...], other: Sequence[int]) -> bool:
    """Whether broadcasting `shape` with a static `other` gives `shape` back."""
    if len(other) > len(shape):
        return False
    aligned = zip(reversed(shape), reversed(other), strict=False)
    return all(o == 1 or (isinstance(d, int) and d == o) for d, o in aligned)


# -- Identity, Dropout, Cast ------------------------------------------------------------------


def _identity(node: Node, ctx: PassContext) -> Found:
    return _forward(node, node.input(0), "identity")


def _dropout(node: Node, ctx: PassContext) -> Found:
    reason = _dropout_training(node)
    if reason is None:
        mask = node.outputs[1] if len(node.outputs) > 1 else None
        if mask is not None and (mask.uses() or mask.is_graph_output):
            reason = "the mask output is used"
    if reason is not None:
        raise NoMatch(reason)
    return _forward(node, node.input(0), "dropout")


def _dropout_training(node: Node) -> str | None:
    """Why the Dropout may be in training mode, or None when it provably is not."""
    if default_opset(node) < 7 and node.attr("is_test", 0) != 1:
        return "is_test is not set (training mode before opset 7)"
    mode = node.input(2)
    if mode is None:
        return None
    data = const_value(mode)
    if data is None:
        return "training_mode is not a constant"
    if data.size != 1 or bool(data.reshape(-1)[0]):
        return "training_mode is true"
    return None


def _cast(node: Node, ctx: PassContext) -> Found:
    x = node.input(0)
    if x is None or x.dtype is None:
        raise NoMatch("input dtype unknown")
    if node.attr("to") != x.dtype:
        return _cast_round_trip(node, x)
    return _forward(node, x, "cast")


# (from, through): every value of `from` is exactly a value of `through`, so casting there and
# back gives the input (NaN stays NaN, -0 stays -0, infinities stay): float32 -> float64,
# float16/bfloat16 -> float32/float64, integers into wider integers of a range that holds theirs.
_F32, _F64, _F16, _BF16 = 1, 11, 10, 16
_I8, _I16, _I32, _I64, _U8, _U16, _U32, _U64 = 3, 5, 6, 7, 2, 4, 12, 13
_EXACT_WIDENING = {
    (_F32, _F64),
    (_F16, _F32), (_F16, _F64), (_BF16, _F32), (_BF16, _F64),
    (_I8, _I16), (_I8, _I32), (_I8, _I64),
    (_I16, _I32), (_I16, _I64), (_I32, _I64),
    (_U8, _I16), (_U8, _I32), (_U8, _I64), (_U8, _U16), (_U8, _U32), (_U8, _U64),
    (_U16, _I32), (_U16, _I64), (_U16, _U32), (_U16, _U64),
    (_U32, _I64), (_U32, _U64),
}  # fmt: skip


def _cast_round_trip(node: Node, x: Value) -> Found:
    """Cast(Cast(a, to=B), to=A) = a when a is of type A and B holds every value of A."""
    first = producer(x, "Cast")
    if first is None:
        raise NoMatch()
    a = first.input(0)
    if a is None or a.dtype is None or node.attr("to") != a.dtype:
        raise NoMatch()
    if (a.dtype, x.dtype) not in _EXACT_WIDENING:
        raise NoMatch("the round trip goes through a type that does not hold every value")
    return _forward(node, a, "cast_round_trip")


def _cast_like(node: Node, ctx: PassContext) -> Found:
    x, like = node.input(0), node.input(1)
    if x is None or like is None or x.dtype is None or like.dtype is None:
        raise NoMatch("input dtype unknown")
    if x.dtype != like.dtype:
        raise NoMatch()
    return _forward(node, x, "cast")


# -- Reshape and friends ----------------------------------------------------------------------


def _reshape(node: Node, ctx: PassContext) -> Found:
    x = node.input(0)
    target = const_ints(node.input(1))
    allowzero = node.attr("allowzero", 0) == 1
    if x is not None and x.shape is not None and target is not None:
        if _reshape_keeps(x.shape, target, allowzero):
            return _forward(node, x, "reshape")
    return _reshape_chain(node, target, allowzero)


def _reshape_keeps(shape: tuple[Dim, ...], target: list[int], allowzero: bool) -> bool:
    """Whether Reshape(x of `shape`, target) provably has x's shape."""
    if len(target) != len(shape):
        return False
    unresolved = []
    for d, t in zip(shape, target, strict=True):
        if t == 0 and not allowzero:
            continue
        if t == -1:
            unresolved.append(d)
        elif not (isinstance(d, int) and d == t):
            return False
    if not unresolved:
        return True
    # One -1: it equals x's dimension when every other dimension is a known positive int.
    others = [d for d, t in zip(shape, target, strict=True) if t != -1]
    return len(unresolved) == 1 and all(isinstance(d, int) and d > 0 for d in others)


_RELABELS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _reshape_chain(node: Node, target: list[int] | None, allowzero: bool) -> Found:
    """Reshape(R(x), s2) -> Reshape(x, s2) for R a Reshape, Squeeze, Unsqueeze or Flatten,
    when s2 never copies a dimension (each only relabels x's row-major buffer)."""
    x = node.input(0)
    first = producer(x)
    if first is not None and first.op_type not in _RELABELS:
        first = None
    if first is None:
        if x is not None and x.shape is None:
            raise NoMatch("input shape unknown")
        raise NoMatch()
    if target is None:
        raise NoMatch("shape is not a constant (cannot merge with the Reshape before it)")
    if 0 in target and not allowzero:
        raise NoMatch("shape has a 0 copying a dimension of the Reshape before it")
    return _Rewire(require(first.input(0)), "reshape_chain")


def _flatten(node: Node, ctx: PassContext) -> Found:
    x = node.input(0)
    axis = node.attr("axis", 1)
    if x is None or x.rank is None or not -x.rank <= axis <= x.rank:
        raise NoMatch()
    if x.rank == 2 and axis in (1, -1):
        return _forward(node, x, "flatten")
    shape = x.static_shape
    if shape is None:
        raise NoMatch()
    axis = axis + x.rank if axis < 0 else axis
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    if flat != shape:
        raise NoMatch()
    return _forward(node, x, "flatten")


def _axes(node: Node) -> list[int] | None:
    if default_opset(node) >= 13:
        return const_ints(node.input(1)) if node.input(1) is not None else None
    attr = node.attr("axes")
    return None if attr is None else [int(a) for a in attr]


def _squeeze_pair(node: Node, ctx: PassContext) -> Found:
    """Squeeze(Unsqueeze(x, a), a) or Unsqueeze(Squeeze(x, a), a): x, for equal axes."""
    inverse = "Unsqueeze" if node.op_type == "Squeeze" else "Squeeze"
    x = node.input(0)
    first = producer(x, inverse)
    inner = None if first is None else first.input(0)
    if x is None or first is None or inner is None:
        return _squeeze_keeps(node)
    rank = x.rank if node.op_type == "Squeeze" else inner.rank
    a1, a2 = _axes(first), _axes(node)
    if rank is not None and a1 is not None and a2 is not None:
        n1, n2 = _normalize(a1, rank), _normalize(a2, rank)
        if n1 and n1 == n2:
            return _forward(node, first.input(0), "squeeze_unsqueeze")
    return _squeeze_keeps(node)


def _squeeze_keeps(node: Node) -> Found:
    """A Squeeze without axes (or an empty axes tensor: onnxruntime squeezes every 1 then) of
    an input with no dimension 1, all known. Unsqueeze, or Squeeze with axes, always changes
    the rank."""
    x = node.input(0)
    if node.op_type != "Squeeze" or x is None:
        raise NoMatch()
    given = node.input(1) is not None if default_opset(node) >= 13 else node.attr("axes")
    axes = _axes(node)
    if given and (axes is None or axes):
        raise NoMatch()
    shape = x.static_shape
    if shape is None or 1 in shape:
        raise NoMatch()
    return _forward(node, x, "squeeze")


def _expand(node: Node, ctx: PassContext) -> Found:
    x = node.input(0)
    shape = const_ints(node.input(1))
    if shape is None:
        raise NoMatch("target shape is not a constant")
    if x is None or x.shape is None:
        raise NoMatch("input shape unknown")
    if not _broadcast_keeps(x.shape, shape):
        raise NoMatch("Expand broadcasts to a larger shape")
    return _forward(node, x, "expand")


# -- Transpose --------------------------------------------------------------------------------


def _perm(node: Node) -> list[int] | None:
    perm = node.attr("perm")
    if perm is not None:
        return [int(p) for p in perm]
    x = node.input(0)
    rank = x.rank if x is not None else None
    return None if rank is None else list(range(rank))[::-1]


def _transpose(node: Node, ctx: PassContext) -> Found:
    perm = _perm(node)
    if perm is None:
        raise NoMatch("no perm and input rank unknown")
    if perm == list(range(len(perm))):
        return _forward(node, node.input(0), "transpose")
    first = producer(node.input(0), "Transpose")
    p1 = _perm(first) if first is not None else None
    if first is None:
        return _ones_transpose(node, perm)
    if p1 is None or len(p1) != len(perm):
        raise NoMatch()
    composed = [p1[p] for p in perm]
    if composed == list(range(len(composed))):
        return _forward(node, first.input(0), "transpose_pair")
    return _Rewire(require(first.input(0)), "transpose_pair", composed)


_RELABELS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _ones_transpose(node: Node, perm: list[int]) -> Found:
    """Transpose(R(x)) = Reshape(R(x), its output shape) when the Transpose moves only
    dimensions of size 1 (the others keep their order: the row-major elements are the same)
    and R relabels (a Reshape, ...), so that the Reshape pair then merges into one. The
    target is the output shape, one symbolic dimension written -1."""
    x = node.input(0)
    src = producer(x)
    if src is None or src.op_type not in _RELABELS or x is None or x.shape is None:
        raise NoMatch()
    if len(x.shape) != len(perm):
        raise NoMatch()
    out = node.outputs[0]
    if out is None or out.is_graph_output:
        raise NoMatch()
    moved = [a for a in perm if x.shape[a] != 1]
    if moved != sorted(moved):
        raise NoMatch()
    dims = [x.shape[a] for a in perm]
    loose = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(loose) > 1:
        raise NoMatch("more than one symbolic dimension: no constant target")
    target = tuple(d if isinstance(d, int) else -1 for d in dims)
    return _AsReshape(x, "transpose_of_ones", target)


# -- Slice, Split, Concat, Pad ----------------------------------------------------------------


def _slice(node: Node, ctx: PassContext) -> Found:
    x = node.input(0)
    if x is None or x.shape is None:
        raise NoMatch("input shape unknown")
    starts = _ints_input_or_attr(node, 1, "starts")
    ends = _ints_input_or_attr(node, 2, "ends")
    axes = _ints_input_or_attr(node, 3, "axes")
    steps = const_ints(node.input(4)) if node.input(4) is not None else None
    if starts is None or ends is None or len(starts) != len(ends):
        raise NoMatch()
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise NoMatch()
    if _normalize(axes, len(x.shape)) is None:
        raise NoMatch()
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        if step != 1 or not _covers(x.shape[axis], start, end):
            raise NoMatch()
    return _forward(node, x, "slice")


def _slice_bounds(node: Node, rank: int) -> dict[int, tuple[int, int, int]] | None:
    """{axis: (start, end, step)} of a Slice (opset >= 10) with constant bounds, axes
    normalized; None when any bound is not a constant."""
    if default_opset(node) < 10:
        return None
    starts, ends = const_ints(node.input(1)), const_ints(node.input(2))
    axes = const_ints(node.input(3)) if node.input(3) is not None else None
    steps = const_ints(node.input(4)) if node.input(4) is not None else None
    if starts is None or ends is None or len(starts) != len(ends):
        return None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if len(axes) != len(starts) or len(steps) != len(starts) or 0 in steps:
        return None
    normal = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in normal) or len(set(normal)) != len(normal):
        return None
    return {a: (st, en, sp) for a, st, en, sp in zip(normal, starts, ends, steps, strict=True)}


def _slice_pair(node: Node, ctx: PassContext) -> Found:
    inner = producer(node.input(0), "Slice")
    x = None if inner is None else inner.input(0)
    if inner is None or x is None or x.shape is None:
        raise NoMatch()
    sliced = require(node.input(0))
    if len(sliced.uses()) != 1 or sliced.is_graph_output:
        # the inner Slice stays for its other readers: merging removes nothing, and hides
        # the slice-of-a-slice that rotary matchers read (rotate_half of x[..., :rot])
        raise NoMatch()
    rank = len(x.shape)
    first, second = _slice_bounds(inner, rank), _slice_bounds(node, rank)
    if first is None or second is None:
        raise NoMatch("a Slice bound is not a constant")
    merged = dict(first)
    for axis, (start, end, step) in second.items():
        if axis not in merged:
            merged[axis] = (start, end, step)
            continue
        dim, (s1, e1, st1) = x.shape[axis], merged[axis]
        if not isinstance(dim, int) or st1 < 0 or step < 0:
            raise NoMatch("both slice a symbolic dimension, or step backwards, on one axis")
        both = range(*slice(s1, e1, st1).indices(dim))[slice(start, end, step)]
        merged[axis] = (both.start, both.stop, both.step) if len(both) else (0, 0, 1)
    axes = sorted(merged)
    bounds = tuple(tuple(merged[a][i] for a in axes) for i in range(3))
    return _Merged(x, "slice_pair", (bounds[0], bounds[1], tuple(axes), bounds[2]))


def _covers(dim: Dim, start: int, end: int) -> bool:
    """Whether [start:end] (step 1) covers a whole dimension."""
    if isinstance(dim, int):
        return (start == 0 or start <= -dim) and end >= dim
    return start == 0 and end >= _HUGE_END


def _split(node: Node, ctx: PassContext) -> Found:
    if len(node.outputs) != 1:
        raise NoMatch()
    x = node.input(0)
    sizes = _ints_input_or_attr(node, 1, "split")
    if sizes is not None:
        axis = node.attr("axis", 0)
        shape = x.shape if x is not None else None
        if shape is None or not -len(shape) <= axis < len(shape):
            raise NoMatch("input shape unknown")
        if sizes != [shape[axis]]:
            raise NoMatch("split size does not cover the whole axis")
    return _forward(node, x, "split")


def _concat(node: Node, ctx: PassContext) -> Found:
    if len(node.inputs) == 1:
        return _forward(node, node.input(0), "concat")
    axis = node.attr("axis")
    rank = next((v.rank for v in node.inputs if v is not None and v.rank is not None), None)
    if axis is None or rank is None or not -rank <= axis < rank:
        raise NoMatch()
    keep = [i for i, v in enumerate(node.inputs) if not _empty_along(v, axis % rank)]
    if not keep or len(keep) == len(node.inputs):
        raise NoMatch()
    if len(keep) == 1:
        return _forward(node, node.input(keep[0]), "concat_empty")
    return _Keep(tuple(keep), "concat_empty")


def _empty_along(value: Value | None, axis: int) -> bool:
    """Whether `value` provably has length 0 along `axis`: a constant of that shape, or a
    Slice with constant bounds that selects nothing of a static dimension (transformers'
    `x[..., rotary_dim:]` when the rotation takes the whole head). Along the Concat's axis
    only: an input empty along another axis makes the whole result empty, of its own shape."""
    if value is None:
        return False
    if value.const is not None:
        return len(value.const.shape) > axis and value.const.shape[axis] == 0
    node = producer(value, "Slice")
    x = None if node is None else node.input(0)
    if node is None or x is None or x.shape is None or default_opset(node) < 10:
        return False
    starts, ends = const_ints(node.input(1)), const_ints(node.input(2))
    axes = const_ints(node.input(3)) if node.input(3) is not None else None
    steps = const_ints(node.input(4)) if node.input(4) is not None else None
    if starts is None or ends is None or len(starts) != len(ends):
        return False
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    normal = _normalize(axes, len(x.shape))
    if normal is None or len(steps) != len(starts) or len(normal) != len(starts):
        return False
    for ax, start, end, step in zip(normal, starts, ends, steps, strict=True):
        dim = x.shape[ax]
        if ax == axis and step > 0 and isinstance(dim, int):
            return len(range(*slice(start, end, step).indices(dim))) == 0
    return False


def _pad(node: Node, ctx: PassContext) -> Found:
    pads = _ints_input_or_attr(node, 1, "pads") if default_opset(node) >= 11 else node.attr("pads")
    if pads is None or any(int(p) != 0 for p in pads):
        raise NoMatch()
    return _forward(node, node.input(0), "pad")


# -- arithmetic with a neutral constant -------------------------------------------------------

# op -> (neutral element, which operand may be the constant: 0 = left, 1 = right)
_NEUTRAL: dict[str, tuple[int, tuple[int, ...]]] = {
    "Add": (0, (0, 1)),
    "Sub": (0, (1,)),
    "Mul": (1, (0, 1)),
    "Div": (1, (1,)),
    "Pow": (1, (1,)),
}


def _arith(node: Node, ctx: PassContext) -> Found:
    neutral, sides = _NEUTRAL[node.op_type]
    for side in sides:
        data = const_value(node.input(side))
        if data is None or data.dtype == object or not np.all(data == neutral):
            continue
        x = node.input(1 - side)
        if x is None or x.shape is None:
            raise NoMatch("input shape unknown")
        if not _broadcast_keeps(x.shape, data.shape):
            raise NoMatch("the constant's broadcast changes the output shape")
        return _forward(node, x, node.op_type.lower())
    raise NoMatch()


RULES = [
    Rule("identity", ("Identity",), _identity, _apply),
    Rule("dropout", ("Dropout",), _dropout, _apply),
    Rule("cast", ("Cast",), _cast, _apply),
    Rule("cast", ("CastLike",), _cast_like, _apply),
    Rule("reshape", ("Reshape",), _reshape, _apply),
    Rule("flatten", ("Flatten",), _flatten, _apply),
    Rule("squeeze", ("Squeeze", "Unsqueeze"), _squeeze_pair, _apply),
    Rule("expand", ("Expand",), _expand, _apply),
    Rule("transpose", ("Transpose",), _transpose, _apply),
    Rule("slice", ("Slice",), _slice, _apply),
    Rule("slice_pair", ("Slice",), _slice_pair, _apply),
    Rule("split", ("Split",), _split, _apply),
    Rule("concat", ("Concat",), _concat, _apply),
    Rule("pad", ("Pad",), _pad, _apply),
    Rule("neutral", tuple(_NEUTRAL), _arith, _apply),
]
