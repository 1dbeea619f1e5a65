"""Symbolic shapes of the IR's values, and the values of its shape tensors, element by element.

`SymbolicShapes(graph).info(value)` gives a value's `SymInfo`: its shape as dimensions of
`infercc.ir.symbolic` (ints or polynomials over the model's named dimensions; None where
unknown) and, for a small integer or boolean tensor (what Shape, Gather, Concat, ... compute),
its elements in row-major order, each an int, a polynomial or None.

Where each comes from:

- graph inputs: the declared dimensions (a dimension declared without name or value becomes the
  symbol `NAME[i]`, so two reads of the same dimension are equal); constants: their shape and,
  when small and integer, their elements;
- a node's outputs: the rule of its op (below) on its inputs' infos, and where the rule knows
  nothing (an op without a rule, a dimension it cannot tell), the shape onnx's inference left in
  the IR. A rule's integer never loses to an IR symbol, and an IR integer never loses to a
  rule's polynomial, except on a graph output, whose IR shape is the model's declaration: there
  the rule wins;
- rules exist for the shape ops (Shape with start/end, Size, Gather, Slice, Concat, Squeeze,
  Unsqueeze, Reshape with 0 and -1, Flatten, Expand, Tile, ConstantOfShape, Range, Split,
  Transpose), integer arithmetic (Add, Sub, Mul, Div, Mod, Neg, Abs, Min, Max), comparisons
  (Equal, Less, Greater, ... when the algebra decides them), Not/And/Or, Where, Cast, the
  broadcasting and shape-preserving ops, MatMul and Gemm, reductions, If (a dimension both
  branches agree on), and onnxruntime's shape-preserving contrib ops (Gelu, FastGelu,
  SkipLayerNormalization, RotaryEmbedding, ... and SimplifiedLayerNormalization, which
  onnxruntime registers in the ONNX domain) and attention with a KV cache (GroupQueryAttention,
  MultiHeadAttention, the standard Attention), after which onnx's inference knows nothing.

Everything is computed on demand and memoized: values are never mutated once defined, so an
info stays true while passes rewrite other nodes. The walk is iterative, so a chain of any
length never hits Python's recursion limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
from onnx import TensorProto

from infercc.ir import symbolic as S
from infercc.ir.graph import Node, Value
from infercc.ir.ops import MS_DOMAIN, STANDARD_DOMAINS
from infercc.ir.symbolic import Dim

ELEMENT_LIMIT = 64  # shape tensors are tracked element by element up to this many elements
INT_TYPES = frozenset(
    {
        TensorProto.INT64,
        TensorProto.INT32,
        TensorProto.INT16,
        TensorProto.INT8,
        TensorProto.UINT64,
        TensorProto.UINT32,
        TensorProto.UINT16,
        TensorProto.UINT8,
    }
)
TRACKED_TYPES = INT_TYPES | {TensorProto.BOOL}
_BIG = 2**62  # a Slice bound this large reaches past any dimension

Shape = tuple["Dim | None", ...]
Elems = tuple["Dim | None", ...]


@dataclass(frozen=True)
class SymInfo:
    """A value's symbolic shape (None: unknown rank) and, for small integer tensors, its
    elements (None: not tracked)."""

    shape: Shape | None
    elems: Elems | None = None

    @property
    def static_elems(self) -> list[int] | None:
        """The elements when every one is an int."""
        if self.elems is None:
            return None
        ints = [e for e in self.elems if isinstance(e, int)]
        return ints if len(ints) == len(self.elems) else None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


UNKNOWN = SymInfo(None)
Rule = Callable[[Node, list["SymInfo | None"]], "list[SymInfo | None] | None"]


class SymbolicShapes:
    """Memoized symbolic infos of the values of one model (module docstring)."""

    def __init__(self, algebra: S.Algebra | None = None) -> None:
        """`algebra`: the model's (`S.algebra_for(graph)`), so that the texts an earlier pass
        wrote into the IR read back as their expressions; a fresh one by default."""
        self._memo: dict[Value, SymInfo] = {}
        self.algebra = algebra if algebra is not None else S.current() or S.Algebra()

    def info(self, value: Value) -> SymInfo:
        got = self._memo.get(value)
        if got is not None:
            return got
        with S.using(self.algebra):
            return self._walk(value)

    def _walk(self, value: Value) -> SymInfo:
        stack = [value]
        while stack:
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                continue
            missing = [d for d in _deps(top) if d not in self._memo]
            if missing:
                stack.extend(missing)
                continue
            self._compute(top)
            stack.pop()
        return self._memo[value]

    def shape(self, value: Value) -> Shape | None:
        return self.info(value).shape

    def elems(self, value: Value) -> Elems | None:
        return self.info(value).elems

    def _compute(self, value: Value) -> None:
        node = value.producer
        if node is None:
            self._memo[value] = _leaf(value)
            return
        ins = [self._memo[v] if v is not None else None for v in node.inputs]
        rule = _rule_for(node)
        outs: list[SymInfo | None] | None = None
        if rule is not None:
            try:
                outs = rule(node, ins) if node.op_type != "If" else _if_rule(node, self._memo)
            except (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError):
                outs = None  # a malformed node: the IR's shapes stand
        for i, v in enumerate(node.outputs):
            if v is not None:
                got = outs[i] if outs is not None and i < len(outs) else None
                self._memo[v] = _with_ir(v, got)


def _deps(value: Value) -> list[Value]:
    node = value.producer
    if node is None:
        return []
    deps = [v for v in node.inputs if v is not None]
    if node.op_type == "If" and node.is_standard:
        for sub in node.subgraphs():
            deps.extend(sub.outputs)
    return deps


def _rule_for(node: Node) -> Rule | None:
    if node.domain in STANDARD_DOMAINS:
        if node.op_type in ORT_ONNX_DOMAIN_SAME_SHAPE:
            return _same_as_first
        if node.op_type == "Attention":
            return _cached_attention
        return RULES.get(node.op_type)
    if node.domain == MS_DOMAIN and node.op_type in MS_SAME_SHAPE:
        return _same_as_first
    if node.domain == MS_DOMAIN and node.op_type in ("GroupQueryAttention", "MultiHeadAttention"):
        return _cached_attention
    return None


def _cached_attention(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    """Attention with a KV cache on unpacked [B, S, width] Q, K and V (onnxruntime's
    GroupQueryAttention and MultiHeadAttention, the standard opset-23 Attention): the output
    has the query's shape, present_key and present_value the past's with the new length added
    (the pasts at inputs 3, 4 of GQA, 4, 5 of Attention, 6, 7 of MultiHeadAttention)."""
    query, key = ins[0], ins[1] if len(ins) > 1 else None
    if query is None or query.rank != 3 or key is None or key.rank != 3:
        return [UNKNOWN] * len(node.outputs)
    first = {"GroupQueryAttention": 3, "Attention": 4}.get(node.op_type, 6)
    outs: list[SymInfo | None] = [SymInfo(query.shape)]
    for past in ins[first : first + 2]:
        if past is None or past.rank != 4:
            outs.append(UNKNOWN)
            continue
        b, n, length, size = past.shape or (None, None, None, None)  # rank 4: a shape
        new = key.shape[1] if key.shape is not None else None
        total = None if length is None or new is None else S.add(length, new)
        outs.append(SymInfo((b, n, total, size)))
    return outs


# -- leaves and the IR ------------------------------------------------------------------------


def _leaf(value: Value) -> SymInfo:
    if value.const is not None:
        shape = tuple(int(d) for d in value.const.shape)
        elems = None
        if value.const.dtype in TRACKED_TYPES and value.const.size <= ELEMENT_LIMIT:
            if not value.const.is_external:
                elems = tuple(int(x) for x in np.asarray(value.numpy()).reshape(-1))
        return SymInfo(shape, elems)
    if value.shape is None:
        return UNKNOWN
    dims = tuple(
        S.from_ir(d) if d is not None else S.sym(f"{value.name}[{i}]")
        for i, d in enumerate(value.shape)
    )
    return SymInfo(dims)


def _with_ir(value: Value, got: SymInfo | None) -> SymInfo:
    """The rule's info, its unknown dimensions filled from the IR's shape."""
    ir = value.shape
    if got is None or got.shape is None:
        shape = None if ir is None else tuple(S.from_ir(d) for d in ir)
        elems = got.elems if got is not None else None
        return SymInfo(shape, elems if shape is not None and _static(shape) else None)
    if ir is None or len(ir) != len(got.shape):
        return got
    declared = value.is_graph_output
    merged = tuple(_pick(r, d, declared) for r, d in zip(got.shape, ir, strict=True))
    return SymInfo(merged, got.elems)


def _pick(rule: Dim | None, ir: int | str | None, declared: bool = False) -> Dim | None:
    """One dimension from the rule and the IR. A graph output's IR shape is what the model
    declares, not what was inferred: there the rule wins, so a declared 4 that the graph computes
    as `batch` is not believed (and a renamed output cannot change what is proven)."""
    if declared and rule is not None:
        return rule
    if isinstance(ir, int):
        return ir
    if rule is not None:
        return rule
    return S.from_ir(ir)


def _static(shape: Shape | None) -> TypeGuard[tuple[int, ...]]:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _known(dims: Sequence[Dim | None]) -> list[Dim] | None:
    """The dims when none is unknown (symbolic ones are known), else None."""
    found = [d for d in dims if d is not None]
    return found if len(found) == len(dims) else None


def _tracked(shape: Shape | None, elems: Sequence[Dim | None] | None) -> SymInfo:
    """An info whose elements are kept only for a small static shape."""
    if elems is not None and _static(shape) and _size(shape) <= ELEMENT_LIMIT:
        return SymInfo(shape, tuple(elems))
    return SymInfo(shape)


# -- helpers for rules ------------------------------------------------------------------------


def _ints(info: SymInfo | None) -> list[int] | None:
    return None if info is None else info.static_elems


def _one_int(info: SymInfo | None) -> int | None:
    got = _ints(info)
    return got[0] if got is not None and len(got) == 1 else None


def _axes_of(node: Node, ins: list[SymInfo | None], index: int = 1) -> list[int] | None:
    """Axes from the attribute (older opsets) or the input at `index`."""
    attr = node.attr("axes")
    if attr is not None:
        return [int(a) for a in attr]
    if len(ins) > index and ins[index] is not None:
        return _ints(ins[index])
    return None


def _norm(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return a


_WIDTHS: dict[int, int] = {
    TensorProto.INT64: 64,
    TensorProto.INT32: 32,
    TensorProto.INT16: 16,
    TensorProto.INT8: 8,
}


def _out_int(node: Node) -> bool:
    """Whether the node computes on signed integers (its first input's type): unsigned
    arithmetic wraps, which the algebra does not model."""
    v = node.input(0)
    return v is not None and v.dtype in _WIDTHS


def _width(node: Node) -> int:
    """The bits of the signed integers the node computes on (its first input's type: one of
    `_WIDTHS`, as `_out_int` checked)."""
    v = node.input(0)
    assert v is not None and v.dtype is not None
    return _WIDTHS[v.dtype]


def at_width(fn: Callable[..., Dim | None], bits: int) -> Callable[..., Dim | None]:
    """`fn` on elements of a `bits`-bit integer tensor: its result where that result fits the
    width for every value of the symbols (`S.fits`), else unknown. onnxruntime wraps on
    overflow and the algebra does not, so an element that might wrap is never claimed."""

    def checked(*xs: Dim) -> Dim | None:
        got = fn(*xs)
        return got if got is not None and S.fits(got, bits) else None

    return checked


def broadcast(shapes: Sequence[Shape]) -> Shape:
    """Numpy broadcasting of symbolic shapes (None where the algebra cannot tell)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim | None] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        out.append(_broadcast_dim(dims))
    return tuple(out)


def _broadcast_dim(dims: list[Dim | None]) -> Dim | None:
    unknown = any(d is None for d in dims)
    known = [d for d in dims if d is not None and d != 1]
    if not known:
        return None if unknown else 1
    static = [d for d in known if isinstance(d, int)]
    if static:
        return static[0]  # a valid model broadcasts every other dim to it
    if unknown or any(d != known[0] for d in known):
        return None
    return known[0]


def _elementwise(
    ins: list[SymInfo | None], fn: Callable[..., Dim | None]
) -> tuple[Shape | None, Elems | None]:
    shapes = [i.shape for i in ins if i is not None and i.shape is not None]
    if len(shapes) != len(ins):
        return None, None
    shape = broadcast(shapes)
    tracked = [(i.elems, i.shape) for i in ins if i is not None and i.elems is not None]
    if len(tracked) != len(ins) or not _static(shape):
        return shape, None
    if _size(shape) > ELEMENT_LIMIT:
        return shape, None
    arrays = []
    for elems, dims in tracked:
        if not _static(dims):  # elements are tracked for static shapes only
            return shape, None
        arr = np.empty(len(elems), dtype=object)
        arr[:] = list(elems)
        arrays.append(arr.reshape(dims))
    spread = np.broadcast_arrays(*arrays)
    flat = [a.reshape(-1).tolist() for a in spread]
    elems = tuple(None if any(x is None for x in xs) else fn(*xs) for xs in zip(*flat, strict=True))
    return shape, elems


# -- rules: same shape and broadcasting ---------------------------------------------------------


def _same_as_first(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    first = ins[0] if ins else None
    same = SymInfo(first.shape) if first is not None else None
    if node.op_type in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        return [same, None, None, same]  # output 3: the input + skip (+ bias) sum
    return [same]


def _broadcasting(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    present = [i for i in ins if i is not None]
    shapes = [i.shape for i in present if i.shape is not None]
    if not present or len(shapes) != len(present):
        return [None]
    return [SymInfo(broadcast(shapes))]


def _arith(fn: Callable[[Dim, Dim], Dim | None]) -> Rule:
    def rule(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
        if not _out_int(node) or len(ins) != 2:
            return _broadcasting(node, ins)
        shape, elems = _elementwise(ins, at_width(fn, _width(node)))
        return [_tracked(shape, elems)]

    return rule


def _variadic(fn: Callable[[Dim, Dim], Dim]) -> Rule:
    def rule(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
        if not _out_int(node) or not ins:
            return _broadcasting(node, ins)
        bits = _width(node)
        shape, elems = _elementwise(ins, at_width(lambda *xs: _fold(fn, xs), bits))
        return [_tracked(shape, elems)]

    return rule


def _fold(fn: Callable[[Dim, Dim], Dim], xs: Sequence[Dim]) -> Dim:
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


def _unary_int(fn: Callable[[Dim], Dim | None]) -> Rule:
    def rule(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
        first = ins[0] if ins else None
        if first is None:
            return [None]
        if not _out_int(node) or first.elems is None:
            return [SymInfo(first.shape)]
        checked = at_width(fn, _width(node))
        return [_tracked(first.shape, [None if e is None else checked(e) for e in first.elems])]

    return rule


def _fmod(a: Dim, b: Dim) -> Dim | None:
    """Mod with fmod=1 (the sign of the dividend) on ints."""
    if isinstance(a, int) and isinstance(b, int) and b != 0:
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    return None


def _abs(d: Dim) -> Dim | None:
    return abs(d) if isinstance(d, int) else None


def _comparison(fn: Callable[[Dim, Dim], bool | None]) -> Rule:
    def decide(a: Dim, b: Dim) -> int | None:
        got = fn(a, b)
        return None if got is None else int(got)

    def rule(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
        if len(ins) != 2 or not all(
            v is not None and v.dtype in TRACKED_TYPES for v in node.inputs
        ):
            return _broadcasting(node, ins)
        shape, elems = _elementwise(ins, decide)
        return [_tracked(shape, elems)]

    return rule


def _less(a: Dim, b: Dim) -> bool | None:
    if S.positive(S.sub(b, a)):
        return True
    if S.at_least(a, b):
        return False
    return None


def _less_eq(a: Dim, b: Dim) -> bool | None:
    if S.at_least(b, a):
        return True
    if S.positive(S.sub(a, b)):
        return False
    return None


def _logic(fn: Callable[[int, int], int]) -> Rule:
    def apply(a: Dim, b: Dim) -> Dim | None:
        if isinstance(a, int) and isinstance(b, int):
            return fn(int(bool(a)), int(bool(b)))
        return None

    def rule(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
        shape, elems = _elementwise(ins, apply)
        return [_tracked(shape, elems)]

    return rule


def _not(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    first = ins[0]
    if first is None:
        return [None]
    if first.elems is None:
        return [SymInfo(first.shape)]
    return [
        _tracked(first.shape, [None if not isinstance(e, int) else int(not e) for e in first.elems])
    ]


def _where(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    if len(ins) != 3 or any(i is None or i.shape is None for i in ins):
        return _broadcasting(node, ins)

    def pick(c: Dim, a: Dim, b: Dim) -> Dim | None:
        if isinstance(c, int):
            return a if c else b
        return a if S.equal(a, b) else None

    choice = node.input(1)
    if choice is None or choice.dtype not in TRACKED_TYPES:
        shapes = [i.shape for i in ins if i is not None and i.shape is not None]
        return [SymInfo(broadcast(shapes))]
    shape, elems = _elementwise(ins, pick)
    return [_tracked(shape, elems)]


# -- rules: shape ops -------------------------------------------------------------------------


def _shape(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    if data is None or data.shape is None:
        return [None]
    rank = len(data.shape)
    start, end = node.attr("start", 0), node.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    dims = data.shape[start:end]
    return [_tracked((len(dims),), dims)]


def _size_rule(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    dims = _known(data.shape) if data is not None and data.shape is not None else None
    if dims is None:
        return [SymInfo(())]
    return [SymInfo((), (S.prod(dims),))]


def _cast(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    first = ins[0]
    if first is None:
        return [None]
    to = node.attr("to")
    x = node.input(0)
    src = x.dtype if x is not None else None
    if first.elems is None or src not in TRACKED_TYPES or to not in TRACKED_TYPES:
        return [SymInfo(first.shape)]
    elems: list[Dim | None]
    if to == TensorProto.BOOL:
        elems = [int(e != 0) if isinstance(e, int) else None for e in first.elems]
    elif to in (TensorProto.INT64, TensorProto.INT32) and src != TensorProto.UINT64:
        elems = [_fits(e, to) for e in first.elems]
    else:
        elems = [e if isinstance(e, int) and 0 <= e < 128 else None for e in first.elems]
    return [_tracked(first.shape, elems)]


def _fits(e: Dim | None, to: int) -> Dim | None:
    """e cast to int64 or int32: itself where it fits that width for every value of its
    symbols (a dimension fits int32: `S.DIM_MAX`), else unknown (the cast wraps)."""
    bits = 64 if to == TensorProto.INT64 else 32
    return e if S.fits(e, bits) else None


def _identity_like(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    first = ins[0] if ins else None
    if first is None:
        return [None]
    return [first]


def _gather(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data, idx = ins[0], ins[1]
    if data is None or idx is None or data.shape is None or idx.shape is None:
        return [None]
    axis = _norm(node.attr("axis", 0), len(data.shape))
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1 :]
    picks = _ints(idx)
    if data.elems is None or picks is None or len(data.shape) != 1:
        return [SymInfo(shape)]
    n = len(data.elems)
    elems = [data.elems[p + n if p < 0 else p] for p in picks]
    return [_tracked(shape, elems)]


def _concat(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    present = [i for i in ins if i is not None]
    shapes = [i.shape for i in present if i.shape is not None]
    if not present or len(shapes) != len(present):
        return [None]
    rank = len(shapes[0])
    axis = _norm(node.attr("axis", 0), rank)
    shape = list(_merge_shapes(shapes, skip=axis))
    lengths = _known([dims[axis] for dims in shapes])
    shape[axis] = None if lengths is None else _fold(S.add, lengths)
    elems = None
    parts = [i.elems for i in present if i.elems is not None]
    if rank == 1 and len(parts) == len(present):
        elems = [e for part in parts for e in part]
    return [_tracked(tuple(shape), elems)]


def _merge_shapes(shapes: list[Shape], skip: int = -1) -> Shape:
    out: list[Dim | None] = []
    for i, dims in enumerate(zip(*shapes, strict=True)):
        if i == skip:
            out.append(None)
            continue
        known = [d for d in dims if d is not None]
        static = [d for d in known if isinstance(d, int)]
        out.append(static[0] if static else known[0] if known else None)
    return tuple(out)


def _unsqueeze(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    axes = _axes_of(node, ins)
    if data is None or data.shape is None or axes is None:
        return [None]
    rank = len(data.shape) + len(axes)
    norm = sorted(_norm(a, rank) for a in axes)
    dims = iter(data.shape)
    shape = tuple(1 if i in norm else next(dims) for i in range(rank))
    return [_tracked(shape, data.elems)]


def _squeeze(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    if data is None or data.shape is None:
        return [None]
    axes = _axes_of(node, ins)
    rank = len(data.shape)
    if axes is None:
        if any(not isinstance(d, int) for d in data.shape):
            return [None]
        drop = {i for i, d in enumerate(data.shape) if d == 1}
    else:
        drop = {_norm(a, rank) for a in axes}
    shape = tuple(d for i, d in enumerate(data.shape) if i not in drop)
    return [_tracked(shape, data.elems)]


def _flatten(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    dims = _known(data.shape) if data is not None and data.shape is not None else None
    if data is None or dims is None:
        return [None]
    rank = len(dims)
    axis = node.attr("axis", 1)
    axis = axis + rank if axis < 0 else axis
    shape = (S.prod(dims[:axis]), S.prod(dims[axis:]))
    return [_tracked(shape, data.elems)]


def reshape_dims(data: Shape, target: Elems, allowzero: bool) -> Shape:
    """The output shape of Reshape(data, target): 0 copies the input dimension (unless
    allowzero), -1 takes what the element count leaves."""
    out: list[Dim | None] = []
    for i, t in enumerate(target):
        if t == 0 and not allowzero:
            out.append(data[i] if i < len(data) else None)
        else:
            out.append(t)
    if -1 in out:
        k = out.index(-1)
        others = _known([d for j, d in enumerate(out) if j != k])
        known = _known(data)
        if others is None or known is None:
            out[k] = None
        else:
            total, rest = S.prod(known), S.prod(others)
            q = S.exact_div(total, rest)
            out[k] = q if q is not None else S.atom("div", total, rest, dim=True)
    return tuple(out)


def _reshape(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    target = ins[1] if len(ins) > 1 else None
    if data is None or data.shape is None:
        return [None]
    elems: Elems | None
    if target is None:
        shape_attr = node.attr("shape")
        if shape_attr is None:
            return [None]
        elems = tuple(int(x) for x in shape_attr)
    else:
        elems = target.elems
    if elems is None:
        if target is not None and target.shape is not None and isinstance(target.shape[0], int):
            return [SymInfo((None,) * target.shape[0])]
        return [None]
    shape = reshape_dims(data.shape, elems, bool(node.attr("allowzero", 0)))
    return [_tracked(shape, data.elems)]


def _expand(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data, target = ins[0], ins[1]
    if data is None or data.shape is None or target is None:
        return [None]
    if target.elems is None:
        return [None]
    shape = broadcast([data.shape, target.elems])
    elems = None
    if data.elems is not None and _static(shape):
        elems = _elementwise([data, SymInfo(shape, (0,) * _size(shape))], lambda a, b: a)[1]
    return [_tracked(shape, elems)]


def _tile(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data, reps = ins[0], ins[1]
    if data is None or data.shape is None or reps is None or reps.elems is None:
        return [None]
    shape = tuple(
        None if d is None or r is None else S.mul(d, r)
        for d, r in zip(data.shape, reps.elems, strict=True)
    )
    elems = None
    counts = _ints(reps)
    if data.elems is not None and counts is not None and _static(data.shape):
        arr = np.empty(len(data.elems), dtype=object)
        arr[:] = list(data.elems)
        elems = np.tile(arr.reshape(data.shape), counts).reshape(-1).tolist()
    return [_tracked(shape, elems)]


def _constant_of_shape(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    target = ins[0]
    if target is None or target.elems is None:
        return [None]
    shape = tuple(target.elems)
    value = node.attr("value")
    fill = 0 if value is None else value.reshape(-1)[0]
    elems = None
    if _static(shape) and (value is None or value.dtype.kind in "biu"):
        elems = [int(fill)] * _size(shape)
    return [_tracked(shape, elems)]


def _range(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    if len(ins) < 3 or any(i is None or i.elems is None or len(i.elems) != 1 for i in ins[:3]):
        return [SymInfo((None,))]
    start, limit, delta = (i.elems[0] for i in ins[:3] if i is not None and i.elems)
    if not _out_int(node) or start is None or limit is None or not isinstance(delta, int):
        return [SymInfo((None,))]
    if delta == 0:
        return [SymInfo((None,))]
    if isinstance(start, int) and isinstance(limit, int):
        values = list(range(start, limit, delta))
        return [_tracked((len(values),), values)]
    span = S.sub(limit, start) if delta > 0 else S.sub(start, limit)
    step = abs(delta)
    count = span if step == 1 else S.div(S.add(span, step - 1), step)
    return [SymInfo((S.dmax(count, 0) if count is not None else None,))]


def slice_params(
    node: Node, ins: list[SymInfo | None], rank: int
) -> list[tuple[int, Dim | None, Dim | None, Dim | None]] | None:
    """(axis, start, end, step) per sliced axis of a Slice (opset >= 10 inputs or attributes),
    elements as dimensions; None when the axes are not known."""
    if node.attr("starts") is not None:
        starts = list(node.attr("starts"))
        ends = list(node.attr("ends"))
        axes = list(node.attr("axes", range(len(starts))))
        steps: list[Dim | None] = [1] * len(starts)
    else:
        if len(ins) < 3 or ins[1] is None or ins[2] is None:
            return None
        if ins[1].elems is None or ins[2].elems is None:
            return None
        starts, ends = list(ins[1].elems), list(ins[2].elems)
        axes_info = ins[3] if len(ins) > 3 else None
        given = list(range(len(starts))) if axes_info is None else _ints(axes_info)
        if given is None:
            return None
        axes = given
        steps_info = ins[4] if len(ins) > 4 else None
        steps = [1] * len(starts) if steps_info is None else list(steps_info.elems or ())
        if axes is None or len(steps) != len(starts):
            return None
    return [
        (_norm(a, rank), s, e, st) for a, s, e, st in zip(axes, starts, ends, steps, strict=True)
    ]


def slice_length(
    dim: Dim | None, start: Dim | None, end: Dim | None, step: Dim | None
) -> Dim | None:
    """The length ONNX Slice gives along a dimension (None when undecided)."""
    if dim is None or start is None or end is None or not isinstance(step, int) or step == 0:
        return None
    if isinstance(dim, int) and isinstance(start, int) and isinstance(end, int):
        return len(range(*slice(*_clamp(dim, start, end, step)).indices(dim)))
    if step != 1:
        return None
    lo = _bound(dim, start)
    hi = _bound(dim, end)
    if lo is None or hi is None:
        return None
    return S.dmax(S.sub(S.dmin(hi, dim), lo), 0)


def _clamp(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """Python slice bounds for ONNX Slice as onnxruntime's kernel computes it: an end of
    INT32_MAX or INT64_MAX with a negative step runs through index 0 (onnx's inference
    reads it as dim - 1)."""
    if step < 0 and end in (2**31 - 1, 2**63 - 1):
        end = -dim - 1
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    if step < 0 and end == -1:
        return start, -dim - 1, step  # Python's slice needs an end before index 0
    return start, end, step


def _bound(dim: Dim, b: Dim) -> Dim | None:
    """A start or end (step 1) as a position in [0, dim] where the algebra can say so."""
    if isinstance(b, int):
        if b >= _BIG:
            return dim
        if b >= 0:
            return b if isinstance(dim, int) else S.dmin(b, dim)
        return S.dmax(S.add(dim, b), 0)
    return b if S.nonneg(b) else None  # a negative bound counts from the end: undecided


def _slice(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    if data is None or data.shape is None:
        return [None]
    rank = len(data.shape)
    params = slice_params(node, ins, rank)
    if params is None:
        return [SymInfo((None,) * rank)]
    shape = list(data.shape)
    for axis, start, end, step in params:
        shape[axis] = slice_length(data.shape[axis], start, end, step)
    elems = None
    if rank == 1 and data.elems is not None and len(params) == 1:
        _, start, end, step = params[0]
        if isinstance(start, int) and isinstance(end, int) and isinstance(step, int):
            n = len(data.elems)
            elems = data.elems[slice(*_clamp(n, start, end, step))]
            shape[0] = len(elems)
    return [_tracked(tuple(shape), elems)]


def _split(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None] | None:
    data = ins[0]
    if data is None or data.shape is None:
        return None
    axis = _norm(node.attr("axis", 0), len(data.shape))
    sizes: list[Dim | None] | None
    if node.attr("split") is not None:
        sizes = list(node.attr("split"))
    elif len(ins) > 1 and ins[1] is not None:
        sizes = list(ins[1].elems) if ins[1].elems is not None else None
    else:
        n = len(node.outputs)
        whole = data.shape[axis]
        q = S.exact_div(whole, n) if whole is not None else None
        sizes = [q] * n if q is not None else None
    if sizes is None or len(sizes) != len(node.outputs):
        return None
    outs: list[SymInfo | None] = []
    for size in sizes:
        shape = list(data.shape)
        shape[axis] = size
        outs.append(SymInfo(tuple(shape)))
    return outs


def _transpose(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    if data is None or data.shape is None:
        return [None]
    perm = node.attr("perm")
    perm = list(reversed(range(len(data.shape)))) if perm is None else list(perm)
    return [SymInfo(tuple(data.shape[p] for p in perm))]


def _matmul(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    a, b = ins[0], ins[1]
    if a is None or b is None or a.shape is None or b.shape is None:
        return [None]
    sa, sb = list(a.shape), list(b.shape)
    if not sa or not sb:
        return [None]
    a1, b1 = len(sa) == 1, len(sb) == 1
    if a1:
        sa = [1, *sa]
    if b1:
        sb = [*sb, 1]
    batch = broadcast([tuple(sa[:-2]), tuple(sb[:-2])]) if len(sa) > 2 or len(sb) > 2 else ()
    out = [*batch, sa[-2], sb[-1]]
    if a1:
        out.pop(-2)
    if b1:
        out.pop(-1)
    return [SymInfo(tuple(out))]


def _gemm(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    a, b = ins[0], ins[1]
    if a is None or b is None or a.shape is None or b.shape is None:
        return [None]
    if len(a.shape) != 2 or len(b.shape) != 2:
        return [None]
    m = a.shape[1] if node.attr("transA", 0) else a.shape[0]
    n = b.shape[0] if node.attr("transB", 0) else b.shape[1]
    return [SymInfo((m, n))]


def _reduce(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    data = ins[0]
    if data is None or data.shape is None:
        return [None]
    rank = len(data.shape)
    axes = _axes_of(node, ins)
    if axes is None and len(ins) > 1 and ins[1] is not None:
        return [None]
    if axes is None or not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [SymInfo(data.shape)]
        axes = list(range(rank))
    norm = {_norm(a, rank) for a in axes}
    keep = node.attr("keepdims", 1)
    shape = tuple(
        (1 if i in norm else d) for i, d in enumerate(data.shape) if keep or i not in norm
    )
    return [SymInfo(shape)]


def _if_rule(node: Node, memo: dict[Value, SymInfo]) -> list[SymInfo | None]:
    then, other = node.attr("then_branch"), node.attr("else_branch")
    outs: list[SymInfo | None] = []
    for a, b in zip(then.outputs, other.outputs, strict=True):
        ia, ib = memo.get(a), memo.get(b)
        if ia is None or ib is None or ia.shape is None or ib.shape is None:
            outs.append(None)
            continue
        if len(ia.shape) != len(ib.shape):
            outs.append(UNKNOWN)
            continue
        dims = tuple(x if S.equal(x, y) else None for x, y in zip(ia.shape, ib.shape, strict=True))
        same = ia.elems is not None and ia.elems == ib.elems
        outs.append(SymInfo(dims, ia.elems if same else None))
    return outs


SAME_SHAPE = (
    "Identity Abs Acos Asin Atan Ceil Cos Cosh Elu Erf Exp Floor HardSigmoid HardSwish IsInf "
    "IsNaN LeakyRelu Log LogSoftmax Mish Neg Reciprocal Relu Round Selu Sigmoid Sign Sin Sinh "
    "Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Celu Gelu Softmax Hardmax Clip CumSum "
    "Trilu Shrink CastLike Dropout LayerNormalization BatchNormalization InstanceNormalization "
    "GroupNormalization RMSNormalization LpNormalization MeanVarianceNormalization Bernoulli "
    "RandomNormalLike RandomUniformLike"
).split()
BROADCASTING = "Pow BitShift PRelu Xor BitwiseAnd BitwiseOr BitwiseXor Sum Mean".split()
MS_SAME_SHAPE = frozenset(
    {
        "Gelu",
        "FastGelu",
        "BiasGelu",
        "QuickGelu",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "BiasSoftmax",
        "RotaryEmbedding",
    }
)
# onnxruntime registers these in the ONNX domain, though no ONNX opset defines them
ORT_ONNX_DOMAIN_SAME_SHAPE = frozenset({"SimplifiedLayerNormalization"})


def _constant(node: Node, ins: list[SymInfo | None]) -> list[SymInfo | None]:
    """A Constant node's value (value, value_int, value_ints; others by their shape)."""
    for key in ("value_int", "value_ints"):
        if node.attributes.get(key) is not None:
            ints = node.attr(key)
            elems = [int(ints)] if key == "value_int" else [int(x) for x in ints]
            shape = () if key == "value_int" else (len(elems),)
            return [_tracked(shape, elems)]
    value = node.attr("value")
    if not isinstance(value, np.ndarray):
        return [None]
    tracked = None
    if value.dtype.kind in "biu" and value.size <= ELEMENT_LIMIT:
        tracked = [int(x) for x in value.reshape(-1)]
    return [_tracked(tuple(int(d) for d in value.shape), tracked)]


RULES: dict[str, Rule] = {
    "Constant": _constant,
    **dict.fromkeys(SAME_SHAPE, _same_as_first),
    **dict.fromkeys(BROADCASTING, _broadcasting),
    "Identity": _identity_like,
    "Add": _arith(S.add),
    "Sub": _arith(S.sub),
    "Mul": _arith(S.mul),
    "Div": _arith(S.div),
    "Mod": lambda node, ins: (_arith(_fmod) if node.attr("fmod", 0) else _arith(S.mod))(node, ins),
    "Neg": _unary_int(S.neg),
    "Abs": _unary_int(_abs),
    "Max": _variadic(S.dmax),
    "Min": _variadic(S.dmin),
    "Equal": _comparison(S.equal),
    "Less": _comparison(_less),
    "LessOrEqual": _comparison(_less_eq),
    "Greater": _comparison(lambda a, b: _less(b, a)),
    "GreaterOrEqual": _comparison(lambda a, b: _less_eq(b, a)),
    "And": _logic(lambda a, b: a & b),
    "Or": _logic(lambda a, b: a | b),
    "Not": _not,
    "Where": _where,
    "Shape": _shape,
    "Size": _size_rule,
    "Cast": _cast,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Expand": _expand,
    "Tile": _tile,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Slice": _slice,
    "Split": _split,
    "Transpose": _transpose,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "If": lambda node, ins: None,  # computed from the branches by SymbolicShapes
    **dict.fromkeys(
        "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 "
        "ReduceLogSum ReduceLogSumExp ReduceSumSquare".split(),
        _reduce,
    ),
}

__all__ = [
    "ELEMENT_LIMIT",
    "INT_TYPES",
    "TRACKED_TYPES",
    "SymInfo",
    "SymbolicShapes",
    "broadcast",
    "reshape_dims",
    "slice_length",
    "slice_params",
]
