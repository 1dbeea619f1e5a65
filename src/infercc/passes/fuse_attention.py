"""fuse-decoder-attention: attention with a KV cache into com.microsoft.MultiHeadAttention.

The pattern (the GPT-2 style eager attention torch.onnx's TorchScript exporter writes, after
fold-constants), for one layer with H heads of size D, new length S and past length P::

    Qh = Transpose(Reshape(q, [B, S, H, D]), perm=[0, 2, 1, 3])        (same for k, v)
    K  = Concat(past_key, Kh, axis=2)        -> present_key   [B, H, P + S, D]
    V  = Concat(past_value, Vh, axis=2)      -> present_value
    A  = Softmax(Div(MatMul(Qh, Transpose(K, perm=[0, 1, 3, 2])), c) + bias, axis=-1)
         (or Mul by 1 / c; or SDPA's split scale, MatMul(Mul(Qh, a), Mul(Transpose(K), b)),
          scale a * b)
    Y  = Reshape(Transpose(MatMul(A, V), perm=[0, 2, 1, 3]), [B, S, H * D])
         (GPT-2's Conv1D: Reshapes of that Transpose to rows [-1, H * D], with or without
          the Reshape to Y; the rows then read Y, the same elements in the same order)
    ==>
    Y, present_key, present_value = MultiHeadAttention(q, k, v, attention_bias=bias,
        past_key, past_value; num_heads=H, scale=1/c or a * b)

Why it is exact: MultiHeadAttention computes softmax(Q K^T * scale + attention_bias) V per
head, with K and V the past concatenated with the new keys and values along the sequence axis,
and returns those concatenations as present_key / present_value: the same arithmetic in one
kernel. H and D come from past_key's declared shape [batch, H, past, D] (fixed dims), checked
against q's width H * D. `bias` must be broadcastable to [B, 1, S, P + S] (rank 4, head axis 1).

Guards: the cache Concats' outputs may be read only by the attention and graph outputs; every
intermediate (the transposes, scores, probabilities) only by the next node of the pattern;
float32 throughout. Not under `--portable` (a contrib op); not for other targets than cpu.
A rule of `infercc.passes.rules` anchored on Softmax: one rewrite is one layer, named by its
Softmax (refusals for --explain, limits for --bisect).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from onnx import TensorProto

from infercc.ir import symbolic as S
from infercc.ir.graph import Graph, Node, Value
from infercc.ir.symbolic_shapes import SymbolicShapes
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_ints, const_scalar, has_perm, producer, sole_reader
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

MS = "com.microsoft"


@dataclass(frozen=True)
class _Match:
    softmax: Node
    q: Value
    k: Value
    v: Value
    bias: Value | None
    past_key: Value
    past_value: Value
    present_key: Value
    present_value: Value
    out: Merged
    heads: int
    scale: float
    removed: list[Node]


@dataclass(frozen=True)
class _Cache:
    """Concat(past, heads) -> present: the past input, the new [B, S, H * D] x, the present."""

    past: Value
    x: Value
    present: Value


def _only_reader(value: Value | None, op: str) -> Node | None:
    reader = sole_reader(value)
    if reader is None or reader.op_type != op or not reader.is_standard:
        return None
    return reader


_producer = producer


def _read_once(value: Value | None) -> bool:
    return value is not None and len(value.uses()) == 1


def split_heads(value: Value | None, removed: list[Node]) -> Value | None:
    """value = Transpose(Reshape(x, [*, *, H, D]), [0, 2, 1, 3]) -> x."""
    t = _producer(value, "Transpose")
    if t is None or not has_perm(t, [0, 2, 1, 3]):
        return None
    r = _producer(t.input(0), "Reshape")
    if r is None or not _read_once(t.input(0)):
        return None
    removed += [t, r]
    return r.input(0)


def _cache(concat: Node | None, removed: list[Node]) -> _Cache | None:
    """Concat(past, Transpose(Reshape(x)), axis=2 or -2) -> (past, x, present)."""
    if concat is None or concat.attr("axis") not in (2, -2) or len(concat.inputs) != 2:
        return None
    past, new = concat.inputs
    if past is None or new is None or not past.is_graph_input:
        return None
    if concat.attr("axis") == -2 and (past.shape is None or len(past.shape) != 4):
        return None  # -2 is the sequence axis of a [batch, heads, past, head_size] cache only
    x = split_heads(new, removed)
    return None if x is None else _Cache(past, x, concat.output)


@dataclass(frozen=True)
class _Scores:
    """The score MatMul, its two operands with any split scale taken off (Qh, K^T), the
    scale and the bias."""

    mm: Node
    qh: Value
    kt: Value
    scale: float
    bias: Value | None


def _unscaled(operand: Value, removed: list[Node]) -> tuple[Value, float]:
    """Mul(x, c) read by the score MatMul alone -> (x, c); anything else -> (operand, 1)."""
    mul = _producer(operand, "Mul")
    c = None if mul is None else const_scalar(mul.input(1))
    x = None if mul is None else mul.input(0)
    if mul is None or x is None or c is None or not _read_once(operand):
        return operand, 1.0
    removed.append(mul)
    return x, c


def _scores(softmax: Node, removed: list[Node]) -> _Scores | None:
    """Softmax(Add(Div|Mul(MatMul(Q, K^T), c), bias)) -> the MatMul, Q, K^T, scale, bias; or
    SDPA's split scale, MatMul(Mul(Q, a), Mul(K^T, b)) with scale a * b."""
    if softmax.attr("axis", -1) not in (-1, 3):
        return None
    x, bias = softmax.input(0), None
    add = _producer(x, "Add")
    if add is not None and _read_once(x) and len(add.inputs) == 2:
        a, b = add.inputs
        scored = any(_producer(a, op) for op in ("Div", "Mul", "MatMul"))
        scaled, bias = (a, b) if scored else (b, a)
        removed.append(add)
        x = scaled
    if not _read_once(x):
        return None
    scale = 1.0
    op = _producer(x, "Div") or _producer(x, "Mul")
    if op is not None:
        c = const_scalar(op.input(1))
        if c is None or c == 0.0 or not _read_once(op.input(0)):
            return None
        scale = 1.0 / c if op.op_type == "Div" else c
        removed.append(op)
        x = op.input(0)
    mm = _producer(x, "MatMul")
    left, right = (None, None) if mm is None or len(mm.inputs) != 2 else mm.inputs
    if mm is None or left is None or right is None:
        return None
    qh, q_scale = _unscaled(left, removed)
    kt, k_scale = _unscaled(right, removed)
    if op is None and q_scale == 1.0 and k_scale == 1.0:
        return None  # unscaled scores: not the attention this pass knows
    return _Scores(mm, qh, kt, scale * q_scale * k_scale, bias)


def untransposed(kt: Value, sym: SymbolicShapes, removed: list[Node]) -> Value | None:
    """kt = Transpose(x, [0, 1, 3, 2]), or the dynamo exporter's form of it,
    Reshape(Transpose(Reshape(x, [B * H, T, D]), [0, 2, 1]), [B, H, D, T]) -> x."""
    t = _producer(kt, "Transpose")
    if t is not None and has_perm(t, [0, 1, 3, 2]):
        removed.append(t)
        return t.input(0)
    outer = _producer(kt, "Reshape")
    t = None if outer is None else _producer(outer.input(0), "Transpose")
    inner = None if t is None or not has_perm(t, [0, 2, 1]) else _producer(t.input(0), "Reshape")
    x = None if inner is None else inner.input(0)
    if outer is None or t is None or inner is None or x is None or len(t.output.uses()) != 1:
        return None
    shape, merged, back = (sym.shape(v) for v in (x, inner.output, outer.output))
    if shape is None or merged is None or back is None:
        return None
    if [len(shape), len(merged), len(back)] != [4, 3, 4]:
        return None
    b, h, n, d = shape
    if b is None or h is None:
        return None
    want = [(S.mul(b, h), n, d), (b, h, d, n)]
    for got, expected in zip((merged, back), want, strict=True):
        if not all(S.equal(u, w) is True for u, w in zip(got, expected, strict=True)):
            return None
    if any(u.op_type != "Shape" for u in inner.output.users() if u is not t):
        return None
    removed += [outer, t, inner]
    return x


def match(softmax: Node) -> _Match:
    """The attention around `softmax`; NoMatch says why it is not one."""
    removed: list[Node] = [softmax]
    found = _scores(softmax, removed)
    if found is None:
        raise NoMatch("the Softmax does not read MatMul(Q, K^T) scaled by constants (+ a bias)")
    qk, scale, bias = found.mm, found.scale, found.bias
    sym = SymbolicShapes(S.algebra_for(softmax.owning_graph()))
    keys = untransposed(found.kt, sym, removed) if _read_once(found.kt) else None
    if keys is None:
        raise NoMatch("K is not transposed [0, 1, 3, 2] before the score MatMul", at=qk)
    key_concat = _producer(keys, "Concat")
    av = _only_reader(softmax.output, "MatMul")
    value_concat = None if av is None else _producer(av.input(1), "Concat")
    if av is None or av.input(0) is not softmax.output:
        raise NoMatch("the probabilities are not multiplied by V alone")
    removed += [qk, av]
    q = split_heads(found.qh, removed)
    key = _cache(key_concat, removed)
    value = _cache(value_concat, removed)
    if q is None or key is None or value is None:
        at = qk if q is None or key is None else av
        raise NoMatch(
            "Q, K or V is not Transpose(Reshape(x)) with K, V concatenated to a past input", at
        )
    out = merge_heads(av.output, removed)
    if out is None:
        raise NoMatch("the attention output is not Transpose [0, 2, 1, 3] then Reshape", at=av)
    return _finish(softmax, q, key, value, bias, out, scale, removed, sym)


@dataclass(frozen=True)
class Merged:
    """The attention's heads merged back: T = Transpose(A, [0, 2, 1, 3]) read by a Reshape to
    [B, S, H * D] (`out`, its value), by Reshapes to rows [-1, H * D] (`rows`: GPT-2's Conv1D
    views it as [B * S, H * D]; the dynamo export has only those), or both."""

    transpose: Node
    out: Value | None
    rows: tuple[Node, ...]

    @property
    def anchor(self) -> Node:
        """The first Reshape of T in the graph: a fused node goes before it."""
        readers = {id(n) for n in self.rows}
        if self.out is not None and self.out.producer is not None:
            readers.add(id(self.out.producer))
        return next(n for n in self.transpose.owning_graph() if id(n) in readers)

    @property
    def replaced(self) -> set[Value]:
        """The values the fused node's output takes over (T's own where rows read it)."""
        got = {self.out} if self.out is not None else set()
        return got | ({self.transpose.output} if self.rows else set())

    def rows_fit(self, width: int, sym: SymbolicShapes) -> bool:
        """Every row Reshape's target is [-1, width]: the same elements, row-major, as the
        [B, S, width] the fused node computes."""
        for r in self.rows:
            shape = r.input(1)
            target = sym.elems(shape) if shape is not None else None
            if target is None or len(target) != 2 or target[0] != -1 or target[1] != width:
                return False
        return True

    def hand_over(self, fused: Value) -> None:
        """After the rewrite: the rows read the fused [B, S, width] output."""
        for r in self.rows:
            r.set_input(0, fused)


def merge_heads(value: Value, removed: list[Node]) -> Merged | None:
    t = _only_reader(value, "Transpose")
    if t is None or not has_perm(t, [0, 2, 1, 3]):
        return None
    readers = t.output.users()
    if not readers or any(r.op_type != "Reshape" or not r.is_standard for r in readers):
        return None
    if len(set(map(id, readers))) != len(t.output.uses()):
        return None  # one Reshape reading T twice (as its target): no merge
    two_d = [r for r in readers if len(const_ints(r.input(1)) or ()) == 2]
    full = [r for r in readers if r not in two_d]
    if len(full) > 1:
        return None
    removed += [t, *full]
    return Merged(t, full[0].output if full else None, tuple(two_d))


def merged_to(m: Merged, flat: tuple | None, width: int, sym: SymbolicShapes) -> bool:
    """`m`'s Reshapes put the merged heads back in `flat`'s [B, S, width] or its rows."""
    return (m.out is None or merges_to(m.out, flat, sym)) and m.rows_fit(width, sym)


def merges_to(out: Value, flat: tuple | None, sym: SymbolicShapes) -> bool:
    """`out` = Reshape(heads, target) puts the merged heads back in `flat`'s [B, S, H * D]
    (the shape of the value they were split from): its target, read element by element, is
    [B or 0, S or 0, H * D] with at most one -1 in place of one of them (a 0 copies the
    heads' dimension unless `allowzero`, which the dynamo exporter sets: then its elements are
    B and S themselves). GPT-2's [B * S, H * D] rows for its Conv1D are `Merged.rows`."""
    reshape = out.producer
    if reshape is None or reshape.op_type != "Reshape":
        return False
    copies = not reshape.attr("allowzero", 0)
    shape = reshape.input(1)
    target = sym.elems(shape) if shape is not None else None
    if flat is None or len(flat) != 3 or target is None or len(target) != 3:
        return False
    if sum(1 for x in target if x == -1) > 1:
        return False
    for i, (x, want) in enumerate(zip(target, flat, strict=True)):
        if x == -1 or (x == 0 and i < 2 and copies):  # 0 copies the heads' B or S
            continue
        if x is None or S.equal(x, want) is not True:
            return False
    return True


def _finish(
    softmax: Node,
    q: Value,
    key: _Cache,
    value: _Cache,
    bias: Value | None,
    out: Merged,
    scale: float,
    removed: list[Node],
    sym: SymbolicShapes,
) -> _Match:
    past_key, k, present_key = key.past, key.x, key.present
    past_value, v, present_value = value.past, value.x, value.present
    heads, size = fixed_heads(past_key)
    width = q.shape[-1] if q.shape else None
    if width != heads * size or (k.shape and k.shape[-1] != width):
        raise NoMatch(f"q's width {width} is not heads x head_size = {heads} x {size}", q)
    if bias is not None and (bias.shape is None or len(bias.shape) != 4 or bias.shape[1] != 1):
        raise NoMatch("the attention bias is not of shape [batch or 1, 1, new, total]", bias)
    if not merged_to(out, sym.shape(q), width, sym):
        raise NoMatch(
            f"the attention output is not reshaped to q's (batch, new, {width}) or its rows",
            out.transpose,
        )
    for x in (q, k, v, past_key, past_value):
        if x.dtype != TensorProto.FLOAT:
            raise NoMatch("not float32", x)
    # the presents read by the pattern alone, or by shape arithmetic only the pattern reads
    # (the dynamo export's K^T Reshape targets): those die with it
    kept = {q, k, v, past_key, past_value, *([bias] if bias is not None else [])}
    caches = [p.producer for p in (present_key, present_value) if p.producer is not None]
    dead = dead_with([*removed, *caches], kept)
    for present in (present_key, present_value):
        if any(u not in dead for u in present.users()):
            raise NoMatch(f"{present.name} has readers outside the attention", present)
    removed += [n for n in in_order(softmax.owning_graph(), list(dead)) if n not in caches]
    if abs(scale * math.sqrt(size) - 1.0) > 1e-6:
        log.debug("attention scale %.6g is not 1/sqrt(head_size)", scale)
    return _Match(
        softmax,
        q,
        k,
        v,
        bias,
        past_key,
        past_value,
        present_key,
        present_value,
        out,
        heads,
        scale,
        removed,
    )


def fixed_heads(past_key: Value) -> tuple[int, int]:
    """(heads, head size) of a past_key [batch, heads, past, head_size] with those fixed."""
    dims = past_key.shape
    heads, size = (dims[1], dims[3]) if dims is not None and len(dims) == 4 else (None, None)
    if not isinstance(heads, int) or not isinstance(size, int):
        raise NoMatch("past_key has no fixed [batch, heads, past, head_size] shape", past_key)
    return heads, size


def _rewrite(graph: Graph, m: _Match) -> None:
    inputs = [m.q, m.k, m.v, None, None, m.bias, m.past_key, m.past_value]
    node = graph.make_node(
        "MultiHeadAttention",
        inputs,
        3,
        before=m.softmax,
        domain=MS,
        name=f"MultiHeadAttention_{m.softmax.name}",
        attributes={"num_heads": m.heads, "scale": float(m.scale)},
    )
    y = node.out(0)
    y.dtype, y.shape = (m.out.out or m.q).dtype, (m.out.out or m.q).shape
    for i, old in ((1, m.present_key), (2, m.present_value)):
        new = node.out(i)
        new.dtype, new.shape = old.dtype, old.shape
    for i, was in ((0, m.out.out), (1, m.present_key), (2, m.present_value)):
        if was is not None:
            graph.replace_all_uses_with(was, node.out(i))
    m.out.hand_over(y)
    for dead in reversed(in_order(graph, m.removed)):
        if not any(o is not None and (o.uses() or o.is_graph_output) for o in dead.outputs):
            graph.remove(dead)


def dies(value: Value, dead: set[Node]) -> bool:
    return not value.is_graph_output and all(u in dead for u in value.users())


def dead_with(pattern: list[Node], kept: set[Value]) -> set[Node]:
    """The pattern's nodes and every node whose outputs only they read, transitively: the
    shape arithmetic of the pattern's Reshape targets and the Shape readers of its values;
    never the producer of a value in `kept` (what the fused node reads)."""
    dead = set(pattern)
    work = [v.producer for n in pattern for v in n.inputs if v is not None and v.producer]
    while work:
        node = work.pop()
        if node in dead or any(o in kept for o in node.outputs):
            continue
        if all(o is None or dies(o, dead) for o in node.outputs):
            dead.add(node)
            work += [v.producer for v in node.inputs if v is not None and v.producer]
    return dead


def in_order(graph: Graph, nodes: list[Node]) -> list[Node]:
    order = {n: i for i, n in enumerate(graph)}
    return sorted(set(nodes), key=lambda n: order.get(n, -1))


def _check(node: Node, ctx: PassContext) -> _Match:
    if not has_cache_inputs(node.graph):
        raise NoMatch()
    if ctx.portable or ctx.target != "cpu":
        raise NoMatch("--portable or a GPU target keeps standard ops")
    return match(node)


def _apply(node: Node, m: _Match, ctx: PassContext) -> None:
    _rewrite(node.owning_graph(), m)


ATTENTION = Rule("fused", ("Softmax",), _check, _apply)


@register_pass("fuse-decoder-attention")
def fuse_decoder_attention(graph: Graph, ctx: PassContext) -> PassResult:
    """Attention with past/present KV cache -> com.microsoft.MultiHeadAttention (cpu only)."""
    run = apply_rules(graph, ctx, [ATTENTION], subgraphs=False)
    fused = run.counts["fused"]
    if fused:
        graph.ensure_opset(MS)
    return PassResult(changed=fused > 0, stats={"fused": fused})


def has_cache_inputs(graph: Graph | None) -> bool:
    return graph is not None and any("past" in v.name.lower() for v in graph.inputs)
