"""fuse-rotary-embedding: RoPE (rotate_half, cos/sin multiply-add) into RotaryEmbedding.

The pattern (Llama's rotary embedding as torch.onnx writes it, after fold-constants), on
x [B, N, S, D] (heads split, D static and even, h = D / 2), with f [B, S, h] the angles
(position times inverse frequency) computed in the graph::

    e   = Unsqueeze(Concat(f, f, axis=-1), [1])           [B, 1, S, D]
    cos = Cos(e);  sin = Sin(e)
          (or transformers' Llama: cos = Unsqueeze(Cos(Concat(f, f)), [1]), sin alike)
    rot = Concat(Neg(x[..., h:]), x[..., :h], axis=-1)
          (the halves as Slices of the last axis, TorchScript, or the two outputs of one
           Split of it, the dynamo exporter's x.chunk(2, dim=-1))
    y   = Add(Mul(x, cos), Mul(rot, sin))                  (operands in either order)
    ==>
    y   = com.microsoft.RotaryEmbedding(x, P, Reshape(Cos(f), [-1, h]),
                                        Reshape(Sin(f), [-1, h]); interleaved=0)
          P = Reshape(Range(0, B * S), [B, S])

Why it is exact: onnxruntime's kernel computes, for i < h, `y[i] = x[i] cos[p, i] -
x[i + h] sin[p, i]` and `y[i + h] = x[i + h] cos[p, i] + x[i] sin[p, i]`, with p the row's
position id. The pattern's first half is `x[i] cos(f[i]) + (-x[i + h]) sin(f[i])` (negation
is exact) and its second `x[i + h] cos(f[i]) + x[i] sin(f[i])`, since both halves of e are f.
The cache passed is the graph's own Cos(f) and Sin(f), one row per (batch, position), and P
indexes row b * S + s for batch b and position s: the same numbers, whatever the positions
(no table of a maximum length, so nothing the graph does not compute). Angles of one batch
row broadcast over x's batch (f [1, S, h]: position ids [1, S], as transformers' Llama
computes them) give a cache of S rows and P = [0], which the kernel reads as position s for
row s of every batch row (nothing read from x, whose heads a later fusion may take away).
The cache is built once per f and shared by every layer.

Under `--portable` or a GPU target, the standard opset-23 RotaryEmbedding where the model's
opset allows: `RotaryEmbedding(x, Cos(f), Sin(f))` (without position ids its caches are
[B, S, h]), the same maths; else nothing, and the refusal says so.

Partial rotation (Phi-3 at partial_rotary_factor < 1, GPT-NeoX): transformers rotates the first
r channels and concatenates the rest back, which the rule above leaves as::

    y = Concat(RotaryEmbedding(x[..., :r], P, cos, sin), x[..., r:], axis=-1)
    ==>
    y = RotaryEmbedding(x, P, cos, sin; rotary_embedding_dim=r, num_heads=N)

(the `partial` rewrite, contrib or standard alike), the same numbers: both kernels rotate the
first `rotary_embedding_dim` channels of each head with caches of r / 2 columns and copy the
others (the contrib kernel needs `num_heads` with it). The Slices are of the last axis, from 0
to r and from r to the end, of one x [B, N, S, D] with N and D static, 0 < r < D, r even; the
rotation, its Slice and the pass-through Slice read only by the Concat. With the rotation on
whole heads, the attention fusions see Q and K as they see them at full rotary.

Guards: the Slices are of the last axis (starts and ends constant, steps 1), the Neg, the
Concat and the two Muls read only by the next node of the pattern; e is Cos'd and Sin'd from
one value; f's batch and sequence dimensions are x's (the same static size or symbol: the
kernel wants a cache row per batch row and position), or f's batch 1; x float32, rank 4,
D static. A rule anchored on Add: one rewrite is one rotation (of q or of k), named by its
Add.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from onnx import TensorProto

from infercc.ir import symbolic as S
from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.ir.symbolic_shapes import SymbolicShapes
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_ints, default_opset, producer, sole_reader
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

ROPE_OPSET = 23  # the standard RotaryEmbedding


@dataclass(frozen=True)
class _Match:
    key: str  # "contrib" or "standard"
    x: Value
    angles: Value  # f [B, S, h]
    half: int
    add: Node
    removed: list[Node]
    shared: bool = False  # f is [1, S, h], broadcast over x's batch


def _head_axis(value: Value | None) -> Node | None:
    """The Unsqueeze(., [1]) producing `value` (the axis of heads), if that is what it is."""
    unsq = producer(value, "Unsqueeze")
    axes = None if unsq is None else (const_ints(unsq.input(1)) or unsq.attr("axes"))
    return unsq if unsq is not None and list(axes or []) == [1] else None


@dataclass(frozen=True)
class _Product:
    """Mul(v, op(e)) or Mul(v, Unsqueeze(op(e), [1])): v, the op node, whether the Unsqueeze
    comes after it, and the Mul."""

    v: Value
    trig: Node
    outer: bool
    mul: Node


@dataclass(frozen=True)
class _Terms:
    """Add(Mul(x, Cos(e)), Mul(rot, Sin(e))): the two products."""

    cos: _Product
    sin: _Product


def _mul_by(node: Node | None, op: str) -> _Product | None:
    """Mul(v, op(e)) or Mul(v, Unsqueeze(op(e), [1])) in either order -> (v, the op node,
    whether the Unsqueeze comes after it)."""
    if node is None or node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    for i in (0, 1):
        v, other = node.input(i), node.input(1 - i)
        if v is None:
            continue
        trig = producer(other, op)
        if trig is not None:
            return _Product(v, trig, False, node)
        unsq = _head_axis(other)
        trig = None if unsq is None else producer(unsq.input(0), op)
        if trig is not None:
            return _Product(v, trig, True, node)
    return None


def _terms(add: Node) -> _Terms | None:
    """Add(Mul(x, Cos(e)), Mul(rot, Sin(e))) -> the cosine and the sine product (whose
    head axes are added alike: both before or both after Cos and Sin)."""
    if len(add.inputs) != 2:
        return None
    a, b = (producer(v, "Mul") for v in add.inputs)
    for m_cos, m_sin in ((a, b), (b, a)):
        c, s = _mul_by(m_cos, "Cos"), _mul_by(m_sin, "Sin")
        if c is not None and s is not None and c.outer == s.outer:
            return _Terms(c, s)
    return None


def _slice(value: Value | None, x: Value, d: int) -> tuple[int, int, Node] | None:
    """Slice(x, start, end) on the last axis, step 1 -> (start, end clipped to d, node)."""
    node = producer(value, "Slice")
    if node is None or node.input(0) is not x:
        return None
    starts, ends = const_ints(node.input(1)), const_ints(node.input(2))
    axes = const_ints(node.input(3)) if node.input(3) is not None else [0]
    steps = const_ints(node.input(4)) if len(node.inputs) > 4 and node.input(4) else [1]
    if starts is None or ends is None or axes is None or len(starts) != 1 or steps != [1]:
        return None
    if axes[0] not in (-1, 3):
        return None
    return starts[0], min(ends[0], d), node


def _rotated(rot: Value, x: Value, d: int, removed: list[Node]) -> bool:
    """rot = Concat(Neg(x[..., h:]), x[..., :h], axis=-1)."""
    cat = producer(rot, "Concat")
    if cat is None or cat.attr("axis") not in (-1, 3) or len(cat.inputs) != 2:
        return False
    neg = producer(cat.input(0), "Neg")
    if neg is None or sole_reader(neg.output) is not cat:
        return False
    halves = _halves(x, d)
    if halves is not None:  # the dynamo exporter's x.chunk(2, dim=-1)
        split, lo_v, hi_v = halves
        if neg.input(0) is not hi_v or cat.input(1) is not lo_v:
            return False
        removed += [cat, neg, split]
        return True
    hi, lo = _slice(neg.input(0), x, d), _slice(cat.input(1), x, d)
    h = d // 2
    if hi is None or lo is None or hi[:2] != (h, d) or lo[:2] != (0, h):
        return False
    for node in (hi[2], lo[2]):
        if sole_reader(node.output) is None:
            return False
    removed += [cat, neg, hi[2], lo[2]]
    return True


def _halves(x: Value, d: int) -> tuple[Node, Value, Value] | None:
    """A Split of x into two equal halves on the last axis, whose outputs only the rotation
    reads -> (the Split, low half, high half)."""
    for split in x.users():
        if split.op_type != "Split" or not split.is_standard or len(split.outputs) != 2:
            continue
        if split.attr("axis", 0) not in (-1, 3):
            continue
        sizes = const_ints(split.input(1)) if len(split.inputs) > 1 else split.attr("split")
        if sizes is not None and list(sizes) != [d // 2, d // 2]:
            continue
        lo, hi = split.outputs
        if lo is None or hi is None or sole_reader(lo) is None or sole_reader(hi) is None:
            continue
        return split, lo, hi
    return None


def _angles(cos: Node, sin: Node, outer: bool) -> Value | None:
    """Cos(e), Sin(e) of e = Unsqueeze(Concat(f, f, axis=-1), [1]) -> f; with `outer` (the
    head axis added after Cos and Sin, as transformers' Llama writes it) e = Concat(f, f)."""
    e = cos.input(0)
    if e is None or sin.input(0) is not e:
        return None
    if not outer:
        unsq = _head_axis(e)
        if unsq is None:
            return None
        e = unsq.input(0)
    cat = producer(e, "Concat")
    if cat is None or cat.attr("axis") not in (-1, 2) or len(cat.inputs) != 2:
        return None
    f = cat.input(0)
    if f is None or cat.input(1) is not f or f.rank != 3:
        return None
    return f


def match(add: Node, sym: SymbolicShapes) -> _Match:
    """The rotation whose sum `add` is; NoMatch: none (no reason: no cos/sin products)."""
    found = _terms(add)
    if found is None:
        raise NoMatch()
    x, rot, m_cos, m_sin = found.cos.v, found.sin.v, found.cos.mul, found.sin.mul
    xs = sym.shape(x)
    d = xs[-1] if xs else None
    if xs is None or len(xs) != 4 or not isinstance(d, int) or d % 2:
        raise NoMatch(
            "x is not [batch, heads, sequence, head_size] with a static even head_size", x
        )
    if x.dtype != TensorProto.FLOAT:
        raise NoMatch("not float32", x)
    removed = [add, m_cos, m_sin]
    if not _rotated(rot, x, d, removed):
        raise NoMatch(
            "the sine term is not rotate_half(x): Concat(Neg(x[..., h:]), x[..., :h])", m_sin
        )
    f = _angles(found.cos.trig, found.sin.trig, found.cos.outer)
    if f is None:
        raise NoMatch(
            "cos and sin are not of Unsqueeze(Concat(f, f, axis=-1), [1]) of one f [B, S, h]",
            found.cos.trig,
        )
    fs = sym.shape(f)
    width = fs[-1] if fs else None
    if isinstance(width, int) and width != d // 2:
        raise NoMatch(f"the angles' width {width} is not head_size / 2 = {d // 2}", f)
    if fs is None or len(fs) != 3 or S.equal(fs[1], xs[2]) is not True:
        raise NoMatch("the angles' sequence is not proven equal to x's", f)
    shared = fs[0] == 1 and xs[0] != 1
    if not shared and S.equal(fs[0], xs[0]) is not True:
        # The kernel wants a cache row per (batch row, position) of x: angles of one batch row
        # broadcast over x's (position ids [1, S]) get position ids s in every row instead.
        raise NoMatch("the angles' batch is neither x's nor 1", f)
    for node in (m_cos, m_sin):
        if sole_reader(node.output) is not add:
            raise NoMatch("a product of the rotation has readers outside it", node)
    return _Match("contrib", x, f, d // 2, add, removed, shared)


def _contrib(ctx: PassContext) -> bool:
    return ctx.fused_ops_allowed and ctx.target == "cpu"


def _check_with(sym: SymbolicShapes) -> Callable[[Node, PassContext], _Match]:
    def check(node: Node, ctx: PassContext) -> _Match:
        return _check(node, ctx, sym)

    return check


def _check(node: Node, ctx: PassContext, sym: SymbolicShapes) -> _Match:
    found = match(node, sym)
    if _contrib(ctx):
        return found
    opset = default_opset(node)
    if opset < ROPE_OPSET:
        raise NoMatch(
            f"--portable or a GPU target keeps standard ops, and RotaryEmbedding needs "
            f"opset {ROPE_OPSET} (the model has {opset})"
        )
    return replace(found, key="standard")


class _Caches:
    """The cos/sin caches (and position ids) built for each f, shared by every rotation."""

    def __init__(self) -> None:
        self.built: dict[tuple[int, str, bool], tuple[Value, ...]] = {}

    def get(self, graph: Graph, m: _Match) -> tuple[Value, ...]:
        key = (id(m.angles), m.key, m.shared)
        if key not in self.built:
            self.built[key] = _build(graph, m)
        return self.built[key]


def _build(graph: Graph, m: _Match) -> tuple[Value, ...]:
    """Before the first rotation of f (later ones come after it): Cos(f), Sin(f), reshaped
    to [B * S, h] with position ids 0 .. B * S - 1 as [B, S] for the contrib op (f shared
    over the batch: [S, h], and the one position id [0], the kernel's start for every row)."""

    def op(op_type: str, inputs: list[Value], **attrs: int) -> Value:
        node = graph.make_node(
            op_type, inputs, 1, before=m.add, name=f"rotary_{op_type}", attributes=attrs
        )
        return node.output

    f = m.angles
    cos, sin = op("Cos", [f]), op("Sin", [f])
    if m.key != "contrib":
        return cos, sin
    rows = graph.make_constant(np.array([-1, m.half], np.int64), "rotary_rows")
    zero = graph.make_constant(np.array(0, np.int64), "rotary_zero")
    one = graph.make_constant(np.array(1, np.int64), "rotary_one")
    if m.shared:  # one position id, 0: row s of the cache for position s of every batch row
        ids = graph.make_constant(np.array([0], np.int64), "rotary_start")
    else:
        shape = op("Shape", [f], start=0, end=2)
        count = op("ReduceProd", [shape], keepdims=0)
        ids = op("Reshape", [op("Range", [zero, count, one]), shape])
    return ids, op("Reshape", [cos, rows]), op("Reshape", [sin, rows])


def _rewrite_with(caches: _Caches) -> Callable[[Node, _Match, PassContext], None]:
    def rewrite(node: Node, m: _Match, ctx: PassContext) -> None:
        graph = node.owning_graph()
        parts = caches.get(graph, m)
        if m.key == "contrib":
            ids, cos, sin = parts
            inputs, domain, attrs = [m.x, ids, cos, sin], MS_DOMAIN, {"interleaved": 0}
            graph.ensure_opset(MS_DOMAIN)
        else:
            cos, sin = parts
            inputs, domain, attrs = [m.x, cos, sin], "", {"interleaved": 0}
        fused = graph.make_node(
            "RotaryEmbedding",
            inputs,
            1,
            before=m.add,
            domain=domain,
            name="RotaryEmbedding",
            attributes=attrs,
        )
        fused.output.dtype, fused.output.shape = m.add.output.dtype, m.add.output.shape
        graph.replace_all_uses_with(m.add.output, fused.output)
        for dead in m.removed:
            if dead.graph is graph and not any(o is not None and o.uses() for o in dead.outputs):
                graph.remove(dead)

    return rewrite


@dataclass(frozen=True)
class _Partial:
    rotary: Node
    x: Value
    dim: int
    heads: int
    removed: tuple[Node, ...]
    key: str = "partial"


def match_partial(cat: Node, sym: SymbolicShapes) -> _Partial:
    """Concat(RotaryEmbedding(x[..., :r]), x[..., r:], axis=-1) -> the rotation on x's first
    r channels; NoMatch without a reason where the Concat is no such thing."""
    if cat.attr("axis") not in (-1, 3) or len(cat.inputs) != 2:
        raise NoMatch()
    head = cat.input(0)
    rot = head.producer if head is not None else None
    if rot is None or rot.op_type != "RotaryEmbedding" or rot.domain not in ("", MS_DOMAIN):
        raise NoMatch()
    if sole_reader(rot.output) is not cat or rot.attr("rotary_embedding_dim", 0):
        raise NoMatch()
    lo = producer(rot.input(0), "Slice")
    x = lo.input(0) if lo is not None else None
    xs = sym.shape(x) if x is not None else None
    if x is None or xs is None or len(xs) != 4:
        raise NoMatch()
    heads, d = xs[1], xs[3]
    if not isinstance(d, int) or not isinstance(heads, int):
        raise NoMatch("x's heads or head_size is not static (the kernel needs num_heads)", x)
    first, rest = _slice(rot.input(0), x, d), _slice(cat.input(1), x, d)
    if first is None or rest is None:
        raise NoMatch()
    r = first[1]
    if first[0] != 0 or rest[:2] != (r, d) or not 0 < r < d or r % 2:
        raise NoMatch(f"not the first r channels rotated and the rest passed on (D = {d})", cat)
    for node in (first[2], rest[2]):
        if sole_reader(node.output) is None:
            raise NoMatch("a Slice of the partial rotation has readers outside it", node)
    return _Partial(rot, x, r, heads, (rot, first[2], rest[2]))


def _rewrite_partial(cat: Node, m: _Partial, ctx: PassContext) -> None:
    graph = cat.owning_graph()
    old = m.rotary
    attrs = {"interleaved": old.attr("interleaved", 0), "rotary_embedding_dim": m.dim}
    attrs["num_heads"] = m.heads
    fused = graph.make_node(
        "RotaryEmbedding",
        [m.x, *old.inputs[1:]],
        1,
        before=cat,
        domain=old.domain,
        name="RotaryEmbedding",
        attributes=attrs,
    )
    fused.output.dtype, fused.output.shape = cat.output.dtype, cat.output.shape
    graph.replace_all_uses_with(cat.output, fused.output)
    for dead in (cat, *m.removed):
        if not any(o is not None and o.uses() for o in dead.outputs):
            graph.remove(dead)


@register_pass("fuse-rotary-embedding")
def fuse_rotary_embedding(graph: Graph, ctx: PassContext) -> PassResult:
    """RoPE (rotate_half, cos/sin multiply-add) -> com.microsoft.RotaryEmbedding (cpu), or
    the standard RotaryEmbedding (opset >= 23); a partial rotation's Concat of the rotated and
    the passed-on channels -> one RotaryEmbedding with rotary_embedding_dim."""
    sym = SymbolicShapes(S.algebra_for(graph))
    rule = Rule("rotary", ("Add",), _check_with(sym), _rewrite_with(_Caches()))
    # a partial rotation's Concat comes after its rotation's Add: one sweep fuses both
    partial = Rule("partial", ("Concat",), lambda n, _ctx: match_partial(n, sym), _rewrite_partial)
    run = apply_rules(graph, ctx, [rule, partial], subgraphs=False)
    counts = {k: run.counts[k] for k in ("contrib", "standard", "partial") if run.counts[k]}
    return PassResult(changed=bool(counts), stats=counts)
