"""fold-shapes: fold the shape arithmetic of exported graphs while dimensions stay symbolic.

Reads the symbolic shapes and shape-tensor elements of `infercc.ir.symbolic_shapes` (each
dimension an int or a polynomial over the model's named dimensions) and rewrites, in every graph
and subgraph:

- **static values**: a node of the shape ops (Shape, Size, Gather, Slice, Concat, Squeeze,
  Unsqueeze, Reshape, Expand, Tile, ConstantOfShape, Range, Cast, integer arithmetic, Equal and
  the comparisons, Not/And/Or, Where, Min, Max, ...) whose integer or boolean output has every
  element an int becomes an initializer holding those elements (fold-constants then folds what
  reads it: a Cast, a Sqrt). `Shape(x)[3]` of `x: [batch, 6, 197, 64]` is 64 whatever `batch`
  is. An Equal, Where or Max decided by the algebra (the same symbol on both sides,
  `batch*seq / seq` against `batch`) is static too;
- **Reshape targets**: a computed target whose every element is an int, or the input's
  dimension at the same position (written 0: Reshape copies it, unless allowzero), or one
  element the others leave (written -1, only when every other element is a non-zero int, so
  the inference cannot divide by zero) becomes a constant target;
- **Expand shapes**: a computed shape whose every element is an int or equals the input's
  aligned dimension (written 1: broadcasting keeps the input's dimension) becomes constant;
- **Slice bounds**: computed starts/ends that are ints, or the sliced dimension itself
  (written 2**63-1, which Slice clamps to the dimension), become constants;
- **layout Transposes**: a Reshape reads x instead of Transpose(x) when the Transpose moves
  only dimensions of size 1 (the others keep their order, so the elements are in the same
  row-major order) and the target copies no dimension;
- **identities**: a Reshape, Flatten, Squeeze, Unsqueeze or Expand whose output shape equals
  its input's, a Slice that keeps every element (start 0, step 1, end at or past the dimension),
  a Tile by ones, and a Where whose condition is constant (or whose two branches are one value)
  and whose output has the chosen input's shape are replaced by that input.

Exact by construction: a value is folded only when every element is an integer the algebra
derives from the node's semantics (never a dimension the user can change: those stay symbols,
and a value holding one stays computed, which the refusal says); a rewritten Reshape target or
Expand shape denotes the same shape at every value of every symbol; an identity is removed only
when the shapes are proven equal as polynomials.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from infercc.ir import symbolic as S
from infercc.ir.graph import Graph, Node, Value
from infercc.ir.symbolic_shapes import (
    TRACKED_TYPES,
    SymbolicShapes,
    SymInfo,
    slice_params,
)
from infercc.ir.tensor import Tensor
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_ints, is_live
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1
_BIG = 2**62

VALUE_OPS = frozenset(
    (
        "Shape Size Gather Slice Concat Squeeze Unsqueeze Reshape Flatten Expand Tile "
        "ConstantOfShape Range Cast Identity Add Sub Mul Div Mod Neg Abs Min Max Equal Less "
        "LessOrEqual Greater GreaterOrEqual Not And Or Where"
    ).split()
)
_KINDS = (
    "static_values",
    "reshape_targets",
    "expand_shapes",
    "slice_bounds",
    "identities",
    "layout_transposes",
)


@register_pass("fold-shapes")
def fold_shapes(graph: Graph, ctx: PassContext) -> PassResult:
    """Fold shape arithmetic symbolically: static elements become constants, identities go."""
    if not _has_shape_work(graph):
        return PassResult(changed=False, stats={**dict.fromkeys(_KINDS, 0), "refused": 0})
    algebra = S.algebra_for(graph)
    with S.using(algebra):
        return _fold(graph, ctx, _ShapeFolder(SymbolicShapes(algebra)))


def _fold(graph: Graph, ctx: PassContext, folder: _ShapeFolder) -> PassResult:
    rules: list[Rule[Any]] = [
        Rule("static_values", sorted(VALUE_OPS), folder.check_static, _fold_static),
        Rule("identities", _IDENTITY_OPS, folder.check_identity, _forward),
        Rule("reshape_targets", ("Reshape",), folder.check_reshape, _set_input),
        Rule("layout_transposes", ("Reshape",), folder.check_reshape_source, _set_input),
        Rule("expand_shapes", ("Expand",), folder.check_expand, _set_input),
        Rule("slice_bounds", ("Slice",), folder.check_slice, _set_input),
    ]
    run = apply_rules(graph, ctx, rules)
    stats = {**dict.fromkeys(_KINDS, 0), **run.counts, "refused": len(run.refused)}
    changed = any(stats[k] for k in _KINDS)
    stats["shapes_refined"] = folder.write_back(graph)
    return PassResult(changed=changed, stats=stats)


# Every rewrite starts from one of these: a shape read off a tensor, or an op that takes one.
_TRIGGERS = frozenset(
    "Shape Size Reshape Expand Slice Tile Where Flatten Squeeze Unsqueeze".split()
)


def _has_shape_work(graph: Graph) -> bool:
    """Whether any node (in any subgraph) is one the rewrites start from: a graph without
    one is left as it is at the cost of one scan."""
    for node in graph:
        if node.op_type in _TRIGGERS:
            return True
        if node.attributes and any(_has_shape_work(sub) for sub in node.subgraphs()):
            return True
    return False


# -- what the checks return ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Static:
    tensors: list[Tensor | None]
    key: str = "static_values"


@dataclass(frozen=True)
class _Forward:
    src: Value
    out: Value  # the node's first output, whose readers read `src` instead
    key: str = "identities"


@dataclass(frozen=True)
class _Inputs:
    """Replace inputs by new int64 constants (index -> elements), or by values (index ->
    Value)."""

    values: Mapping[int, Sequence[int] | Value]
    key: str


_IDENTITY_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Slice", "Tile", "Where")


class _ShapeFolder:
    def __init__(self, sym: SymbolicShapes):
        self.sym = sym

    # -- static values ------------------------------------------------------------------------

    def check_static(self, node: Node, ctx: PassContext) -> _Static:
        if not is_live(node) or not node.inputs:
            raise NoMatch()
        if all(v is None or v.const is not None for v in node.inputs):
            raise NoMatch()  # every input constant: fold-constants' work
        tensors: list[Tensor | None] = []
        for v in node.outputs:
            if v is None or not (v._uses or v.is_graph_output):
                tensors.append(None)
                continue
            tensors.append(self._static_tensor(v))
        if all(t is None for t in tensors):
            raise NoMatch()
        return _Static(tensors)

    def _static_tensor(self, v: Value) -> Tensor:
        dtype = v.dtype or _implied_dtype(v)
        if dtype not in TRACKED_TYPES:
            raise NoMatch()  # activations: never a shape value (and no walk up their ancestry)
        info = self.sym.info(v)
        if info.elems is None or info.shape is None:
            raise NoMatch()
        for i, e in enumerate(info.elems):
            if not isinstance(e, int):
                what = "unknown" if e is None else f"{e} (from a symbolic dimension)"
                raise NoMatch(f"element {i} of {v.name!r} is {what}: kept computed")
        shape = [d for d in info.shape if isinstance(d, int)]
        if len(shape) != len(info.shape):  # elements are tracked for static shapes only
            raise NoMatch()
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
        arr = np.array(info.elems, dtype=np.int64).reshape(shape)
        return Tensor(arr.astype(np_dtype), dtype=dtype)

    # -- identities ---------------------------------------------------------------------------

    def check_identity(self, node: Node, ctx: PassContext) -> _Forward:
        src = node.input(0)
        if node.op_type == "Where":
            src = self._where_choice(node)
        elif node.op_type == "Slice" and not self._slice_keeps_all(node):
            raise NoMatch()
        elif node.op_type == "Tile" and not self._tile_by_ones(node):
            raise NoMatch()
        out = node.outputs[0]
        if src is None or not self._same_shape(out, src):
            raise NoMatch()
        if out is None or not is_live(node):
            raise NoMatch()
        if out.is_graph_output and not node.owning_graph().can_take_output_name(src):
            raise NoMatch("output is a graph output and its input cannot take the output's name")
        return _Forward(src, out)

    def _same_shape(self, out: Value | None, src: Value) -> bool:
        if out is None:
            return False
        a, b = self.sym.shape(out), self.sym.shape(src)
        if a is None or b is None or len(a) != len(b):
            return False
        return all(x is not None and S.equal(x, y) is True for x, y in zip(a, b, strict=True))

    def _where_choice(self, node: Node) -> Value | None:
        cond, a, b = node.input(0), node.input(1), node.input(2)
        if cond is None or a is None or b is None:
            return None
        if a is b:
            return a
        elems = self.sym.info(cond).static_elems
        if not elems:
            return None
        if all(elems):
            return a
        if not any(elems):
            return b
        return None

    def _slice_keeps_all(self, node: Node) -> bool:
        data = node.input(0)
        shape = self.sym.shape(data) if data is not None else None
        if shape is None:
            return False
        params = slice_params(node, [self._info(v) for v in node.inputs], len(shape))
        if params is None:
            return False
        return all(_keeps_axis(shape[a], s, e, st) for a, s, e, st in params)

    def _tile_by_ones(self, node: Node) -> bool:
        reps = node.input(1)
        elems = self.sym.info(reps).static_elems if reps is not None else None
        return elems is not None and all(r == 1 for r in elems)

    def _info(self, v: Value | None) -> SymInfo | None:
        return None if v is None else self.sym.info(v)

    # -- Reshape targets, Expand shapes, Slice bounds -----------------------------------------

    def check_reshape(self, node: Node, ctx: PassContext) -> _Inputs:
        data, target = node.input(0), node.input(1)
        if data is None or target is None or target.const is not None or not is_live(node):
            raise NoMatch()
        elems = self.sym.info(target).elems
        shape = self.sym.shape(data)
        if elems is None or shape is None:
            raise NoMatch()
        allowzero = bool(node.attr("allowzero", 0))
        out: list[int | None] = []
        for i, e in enumerate(elems):
            if isinstance(e, int):
                out.append(e)
            elif not allowzero and i < len(shape) and S.equal(e, shape[i]) is True:
                out.append(0)
            else:
                out.append(None)
        loose = [i for i, x in enumerate(out) if x is None]
        if (
            len(loose) == 1
            and -1 not in out
            and all(x not in (0, None) for x in _others(out, loose[0]))
        ):
            out[loose[0]] = -1
            loose = []
        if loose:
            e = elems[loose[0]]
            what = "unknown" if e is None else str(e)
            raise NoMatch(
                f"target element {loose[0]} ({what}) is neither static nor the input's "
                "dimension: the target stays computed"
            )
        return _Inputs({1: [x for x in out if x is not None]}, "reshape_targets")  # no None left

    def check_reshape_source(self, node: Node, ctx: PassContext) -> _Inputs:
        """Reshape(Transpose(x, perm)) = Reshape(x) when the Transpose moves only dimensions of
        size 1 (the others keep their order, so the row-major elements are in the same order)
        and the target copies no dimension (no 0 unless allowzero)."""
        t = node.input(0)
        p = t.producer if t is not None else None
        if p is None or p.op_type != "Transpose" or not p.is_standard or not is_live(node):
            raise NoMatch()
        x = p.input(0)
        target = node.input(1)
        shape = self.sym.shape(x) if x is not None else None
        elems = self.sym.info(target).static_elems if target is not None else None
        if shape is None or elems is None or x is None:
            raise NoMatch()
        if 0 in elems and not node.attr("allowzero", 0):
            raise NoMatch()
        perm = p.attr("perm")
        perm = list(reversed(range(len(shape)))) if perm is None else list(perm)
        moved = [a for a in perm if shape[a] != 1]
        if moved != sorted(moved) or any(shape[a] is None for a in moved):
            raise NoMatch()
        return _Inputs({0: x}, "layout_transposes")

    def check_expand(self, node: Node, ctx: PassContext) -> _Inputs:
        data, target = node.input(0), node.input(1)
        if data is None or target is None or target.const is not None or not is_live(node):
            raise NoMatch()
        elems = self.sym.info(target).elems
        shape = self.sym.shape(data)
        if elems is None or shape is None:
            raise NoMatch()
        out: list[int] = []
        offset = len(elems) - len(shape)
        for i, e in enumerate(elems):
            j = i - offset
            if isinstance(e, int):
                out.append(e)
            elif j >= 0 and S.equal(e, shape[j]) is True:
                out.append(1)
            else:
                raise NoMatch(
                    f"shape element {i} ({e}) is neither static nor the input's dimension: "
                    "the shape stays computed"
                )
        return _Inputs({1: out}, "expand_shapes")

    def check_slice(self, node: Node, ctx: PassContext) -> _Inputs:
        if node.attr("starts") is not None or not is_live(node):
            raise NoMatch()
        data = node.input(0)
        shape = self.sym.shape(data) if data is not None else None
        if shape is None:
            raise NoMatch()
        computed = [i for i in range(1, len(node.inputs)) if _computed(node.input(i))]
        if not computed and not _may_end_at_int_max(node):
            raise NoMatch()
        params = slice_params(node, [self._info(v) for v in node.inputs], len(shape))
        if params is None:
            raise NoMatch()
        values: dict[int, list[int]] = {}
        for index in computed:
            info = self._info(node.input(index))
            elems = None if info is None else info.elems
            if elems is None:
                raise NoMatch()
            got = [
                _bound_value(e, shape[a] if index in (1, 2) else None, step)
                for e, (a, _, _, step) in zip(elems, params, strict=False)
            ]
            if any(x is None for x in got):
                k = got.index(None)
                raise NoMatch(
                    f"input {index} element {k} ({elems[k]}) is neither static nor the "
                    "sliced dimension: kept computed"
                )
            values[index] = [x for x in got if x is not None]  # every one, checked above
        ends = _ends_before_index_0(params, values.get(2))
        if ends is not None:
            values[2] = ends
        if not values:
            raise NoMatch()
        return _Inputs(values, "slice_bounds")

    # -- refined shapes back into the IR --------------------------------------------------------

    def write_back(self, graph: Graph) -> int:
        """Put what the algebra knows into `Value.shape` where onnx's inference left a
        dimension unknown (never on graph inputs and outputs: their declared dims stand)."""
        count = 0
        for v in list(self.sym._memo):
            if v.producer is None or v.graph is None or v.keep_info or v.is_graph_output:
                continue
            count += self._refine(v)
        return count

    def _refine(self, v: Value) -> int:
        known = self.sym._memo.get(v)
        if known is None or known.shape is None:
            return 0
        if v.shape is not None and (len(v.shape) != len(known.shape) or None not in v.shape):
            return 0
        old = v.shape or (None,) * len(known.shape)
        new = tuple(
            o if o is not None else S.to_text(k) for o, k in zip(old, known.shape, strict=True)
        )
        if new == v.shape:
            return 0
        v.shape = new
        return 1


def _others(out: list[int | None], k: int) -> list[int | None]:
    return [x for i, x in enumerate(out) if i != k]


def _computed(v: Value | None) -> bool:
    from infercc.passes.match import const_tensor

    return v is not None and const_tensor(v) is None


def _bound_value(e, dim, step) -> int | None:
    """A start or end as a constant: itself when static; the sliced dimension as INT64_MAX
    (clamped to it) with a positive step, as -1 (dim - 1, where both clamp) with a negative
    one: INT64_MAX there would mean "through index 0" to onnxruntime."""
    if isinstance(e, int):
        return e
    if e is not None and dim is not None and S.equal(e, dim) is True and isinstance(step, int):
        if step > 0:
            return INT64_MAX
        if step < 0:
            return -1
    return None


_INT_MAXES = (2**31 - 1, INT64_MAX)


def _may_end_at_int_max(node: Node) -> bool:
    ends = node.input(2)
    got = const_ints(ends) if ends is not None else None
    return got is not None and any(e in _INT_MAXES for e in got)


def _ends_before_index_0(params, computed: list[int] | None) -> list[int] | None:
    """An end of INT32_MAX or INT64_MAX with a negative step means "through index 0" to
    onnxruntime's kernel but "from dim - 1" to onnx's inference, which onnxruntime also runs
    when it loads a model: written as INT64_MIN, both read it as the kernel does."""
    ends = computed if computed is not None else [e for _, _, e, _ in params]
    if not all(isinstance(e, int) for e in ends):
        return None
    new = [
        -INT64_MAX - 1 if e in _INT_MAXES and isinstance(st, int) and st < 0 else e
        for e, (_, _, _, st) in zip(ends, params, strict=True)
    ]
    return new if new != ends else None


def _keeps_axis(dim, start, end, step) -> bool:
    if step != 1 or dim is None:
        return False
    starts_at_zero = start == 0 or (
        isinstance(start, int) and isinstance(dim, int) and start <= -dim
    )
    if not starts_at_zero:
        return False
    if isinstance(end, int):
        return end >= _BIG or (isinstance(dim, int) and end >= dim)
    return end is not None and S.equal(end, dim) is True


def _implied_dtype(v: Value) -> int | None:
    p = v.producer
    if p is not None and p.op_type in ("Shape", "Size"):
        return TensorProto.INT64
    return None


# -- rewrites -----------------------------------------------------------------------------------


def _fold_static(node: Node, found: _Static, ctx: PassContext) -> None:
    graph = node.graph
    assert graph is not None and graph.model is not None
    renames: list[tuple[Value, str]] = []
    for v, tensor in zip(node.outputs, found.tensors, strict=True):
        if v is None or tensor is None:
            continue
        const = graph.make_constant(tensor, v.name)
        renames.append((const, v.name))
        graph.replace_all_uses_with(v, const)
    graph.remove(node)
    for const, name in renames:
        if const.name != name and graph.model.value(name) is None:
            graph.model.rename_value(const, name)


def _forward(node: Node, found: _Forward, ctx: PassContext) -> None:
    graph = node.owning_graph()
    graph.replace_all_uses_with(found.out, found.src)
    if not any(v is not None and (v._uses or v.is_graph_output) for v in node.outputs):
        graph.remove(node)


def _set_input(node: Node, found: _Inputs, ctx: PassContext) -> None:
    graph = node.graph
    assert graph is not None
    for index, elems in found.values.items():
        if isinstance(elems, Value):
            node.set_input(index, elems)
            continue
        old = node.input(index)
        dtype = old.dtype if old is not None and old.dtype == TensorProto.INT32 else None
        if dtype == TensorProto.INT32:
            arr = np.array([min(max(e, -(2**31)), 2**31 - 1) for e in elems], dtype=np.int32)
        else:
            arr = np.array(elems, dtype=np.int64)
        base = f"{node.name or node.op_type}_{'shape' if index == 1 else 'bound'}"
        node.set_input(index, graph.make_constant(arr, base))
