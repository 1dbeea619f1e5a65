"""fuse-group-query-attention: a decoder's attention with its KV cache into onnxruntime's
com.microsoft.GroupQueryAttention, exact on every input where torch's mask values allow a fix-up
of the rows that keep no key, else under `--assume nonempty-sequences`.

The pattern (Llama's attention as torch.onnx writes it, after fold-constants and, where the
model rotates, fuse-rotary-embedding), for one layer with H query heads and KV key/value heads
(G = H / KV) of size D, new length S and total length T (past + new)::

    Qh = Transpose(Reshape(q, [B, S, H, D]), [0, 2, 1, 3])     or RotaryEmbedding(that, ...)
    Kh = the same of k with KV heads;  Vh = the same of v, never rotated
    K  = Concat(past_key, Kh, axis=2)  -> present_key;   V likewise -> present_value
    Kx = Reshape(Tile(Unsqueeze(K, [2]), [1, 1, G, 1, 1]), [B, H, T, D])
         (repeat_interleave of the heads; an Expand in place of the Tile; absent when G = 1)
    A  = MatMul(Mul(Qh, a), Mul(Transpose(Kx, [0, 1, 3, 2]), b))       (SDPA: a split scale;
         the dynamo exporter transposes as Reshape(Transpose(Reshape(Kx, [B H, T, D]),
         [0, 2, 1]), [B, H, D, T]), the same elements)
      or Div|Mul(MatMul(Qh, Transpose(Kx, [0, 1, 3, 2])), c)            (eager attention)
    P  = Softmax(Add(A, bias), axis=-1)
    Y  = Reshape(Transpose(MatMul(P, Vx), [0, 2, 1, 3]), [B, S, H * D])
         (and/or, GPT-2's Conv1D, Reshapes of that Transpose to rows [-1, H * D], which
          then read Y: the same elements in the same order)
    ==>
    Y, present_key, present_value = GroupQueryAttention(q', k', v, past_key, past_value,
        seqlens_k, total, attention_bias=bias, query_seqlens; num_heads=H, kv_num_heads=KV,
        scale=a * b (or 1 / c, c), causal=1)

with q' = RotaryEmbedding(q, ids, cos, sin) on the [B, S, H * D] form where the heads were
rotated (the same ids and caches), else q. The lengths come from the bias' shape
[B, 1, S, T], built once per bias and shared by every layer: total = T, seqlens_k = T - 1 and
query_seqlens = S for every batch row.

Why it is exact on the inputs the assumption allows. GroupQueryAttention computes, for query
head h (reading key/value head h // G) and query row s at absolute position T - S + s, the
softmax over the keys j <= T - S + s of (q . k_j) * scale + bias[b, 0, s, j], and returns
past followed by the new keys and values as present:

- the original's Kx maps head h to cache head h // G (Unsqueeze at axis 2 and Tile or Expand
  along it: each cache head repeated G times in a row), which is GroupQueryAttention's grouping;
- the original's softmax runs over every key j < T. The pass proves that the bias is causal:
  it is Where(C, 0, NEG), NEG <= -1e9, with C an And of conditions one of which is
  `key index <= query position`, the key index Range(0, T, 1) along the last axis and the
  query position T - S + s (Range(T - S, T, 1), or Range(0, S, 1) + T - S) along the one
  before. So every key j > T - S + s adds exp(NEG + ...) = 0 to its row's softmax, provided the
  row keeps one key whose bias is 0. A decoder's row that keeps none (a padding token before
  a left-padded prompt's first real one, a sequence of padding only) gives, in the original, a
  softmax over all T keys, in GroupQueryAttention one over its causal keys. Such rows are
  fixed up where the mask value allows it exactly (`empty_row_form`): with a finite NEG <=
  -1e30 (torch's masks use float32's lowest) every masked score rounds to NEG, the row is the
  Softmax of T equal values, so the mean of V over all T keys; with -inf and the SDPA
  export's NaN guard, 0. The rewrite then adds, once per step for every layer, a flag of the
  rows whose bias row's largest value is a mask value (ReduceMax over the keys, Less), and
  per layer Where(flag, ReduceMean of the present value over the keys with each KV head
  repeated G times, or 0, the fused output). Under `--assume nonempty-sequences` ("every
  attention row keeps at least one position") no row needs it and none is added; with -1e9
  (its rounding reaches the row's softmax) or -inf with no guard (NaN) the fusion fires only
  under the assumption;
- RotaryEmbedding rotates each head's D values of a [B, S, H * D] row with that row's position
  id, the same numbers as on [B, H, S, D] (equal bit for bit in the tests); a partial rotation
  (rotary_embedding_dim r, num_heads H) rotates the first r of each head's D values on both;
- the split scale a, b becomes one scale a * b (the scores differ by rounding only).

Under `--portable` or a GPU target, where the model's opset is 23 or more, the standard
Attention instead: Attention(q', k', v, attn_mask=bias, past_key, past_value; q_num_heads=H,
kv_num_heads=KV, scale), is_causal=0, the rotation (if any) the standard RotaryEmbedding on
the [B, S, N * D] form (num_heads=N). It computes the softmax over every key with the bias
added, the original's arithmetic, so the bias need not be causal; onnxruntime's kernel
differs from the original on a row that keeps no key too (measured), so it also needs the
assumption. Below opset 23 nothing, and the refusal says so.

Guards: H, KV and D fixed, H = G * KV; float32; every intermediate read only by the next node
of the pattern, the presents only by the repeat, Shape nodes and the graph outputs; the bias
of shape [B or 1, 1, S, T]; the cache Concats along axis 2 (or -2); the installed
onnxruntime's GroupQueryAttention takes attention_bias and query_seqlens; the cpu target, not
`--portable`. A rule of `infercc.passes.rules` anchored on Softmax: one rewrite is one layer,
named by its Softmax. transformers' Llama export (its NaN guard removed first, by the same
assumption) fuses as torch's SDPA export does. The guard, `Where(IsNaN(P), 0, P)` between the
Softmax and the MatMul by V, is matched and removed along with the rest where it is still there
(without the assumption remove-nan-guard keeps it): under the assumption no row is all -inf, so
it never fires; without it the fix-up gives those rows the guard's 0, and remove-nan-guard's
want of the assumption at that guard is withdrawn (`PassContext.settled`). Without the
assumption, a layer that matches all the same but has no exact fix-up is counted as wanting
it (`PassContext.wants`): the report's hint.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from onnx import TensorProto

from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.ir import symbolic as S
from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.ir.symbolic_shapes import Shape as SymShape
from infercc.ir.symbolic_shapes import SymbolicShapes
from infercc.passes.attention import nan_guard
from infercc.passes.fuse_attention import (
    Merged,
    dead_with,
    dies,
    fixed_heads,
    has_cache_inputs,
    in_order,
    merge_heads,
    merged_to,
    split_heads,
    untransposed,
)
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

NEG_LIMIT = -1e9  # a masked score at most this: its exp is 0 beside any real score
# a finite mask value at most this absorbs any score a float32 attention makes: s + NEG
# rounds to NEG for |s| < ulp(NEG) / 2 (3.8e22 at -1e30), so a row that keeps no key is
# Softmax of T equal values, the mean of V over all T keys (float32's lowest: torch's mask)
ABSORBING = -1e30
ATTENTION_OPSET = 23  # the standard Attention, with past and present and grouped heads
_GQA_INPUTS = {"attention_bias": 10, "query_seqlens": 16}


@functools.cache
def runtime_support() -> str | None:
    """None when the installed onnxruntime's GroupQueryAttention takes attention_bias and
    query_seqlens at the indexes this pass writes; else why not."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as pybind
    except ImportError:  # pragma: no cover - onnxruntime is a core dependency
        return "onnxruntime is not importable"
    for schema in pybind.get_all_operator_schema():
        if schema.name == "GroupQueryAttention" and schema.domain == MS_DOMAIN:
            names = [i.name for i in schema.inputs]
            for name, index in _GQA_INPUTS.items():
                if index >= len(names) or names[index] != name:
                    return f"this onnxruntime's GroupQueryAttention has no input {name}"
            return None
    return "this onnxruntime has no GroupQueryAttention"


@dataclass(frozen=True)
class _Side:
    """Q, K or V of one layer: the [B, S, width] value the heads were split from, and the
    rotation applied to the split heads (a com.microsoft.RotaryEmbedding), if any."""

    flat: Value
    split: Value
    rotary: Node | None = None


@dataclass(frozen=True)
class _Cache:
    """Concat(past, heads, axis=2) -> present: the past input, the new heads' side."""

    past: Value
    side: _Side
    present: Value


@dataclass(frozen=True)
class _Match:
    softmax: Node
    q: _Side
    k: _Side
    v: _Side
    bias: Value
    past_key: Value
    past_value: Value
    present_key: Value
    present_value: Value
    out: Merged
    anchor: Node  # the output's producer: the fused node goes before it
    heads: int
    kv_heads: int
    scale: float
    new: S.Dim | None = None  # S, the new tokens' length
    removed: list[Node] = field(default_factory=list)
    form: str = "contrib"  # or "standard": the opset-23 Attention
    guarded: bool = False  # torch's NaN guard read the Softmax (removed with the rest)
    empty_rows: str | None = None  # the fix-up of rows that keep no key: "mean", "zero"


def _whole_heads(rotary: Node) -> bool:
    """The rotation reads as well on the [B, S, N * D] form: all of each head, or (a partial
    rotation, rotary_embedding_dim) its first channels of each of num_heads = N heads."""
    if not rotary.attr("rotary_embedding_dim", 0):
        return True
    x = rotary.input(0)
    heads = x.shape[1] if x is not None and x.shape and len(x.shape) == 4 else None
    return isinstance(heads, int) and rotary.attr("num_heads", 0) == heads


def _side(value: Value, removed: list[Node], may_rotate: bool) -> _Side | None:
    """value = [RotaryEmbedding](Transpose(Reshape(x, [B, S, N, D]), [0, 2, 1, 3]))."""
    rotary = value.producer
    if (
        may_rotate
        and rotary is not None
        and rotary.op_type == "RotaryEmbedding"
        and (rotary.domain == MS_DOMAIN or (rotary.is_standard and len(rotary.inputs) == 3))
        and rotary.attr("interleaved", 0) == 0
        and _whole_heads(rotary)
        and len(value.uses()) == 1
    ):
        heads = rotary.input(0)
        flat = split_heads(heads, removed)
        if flat is None or heads is None:
            return None
        removed.append(rotary)
        return _Side(flat, heads, rotary)
    flat = split_heads(value, removed)
    return None if flat is None else _Side(flat, value)


def _cache(value: Value, removed: list[Node], may_rotate: bool) -> _Cache | None:
    """Concat(past, heads, axis=2) -> (past, the side, present)."""
    concat = producer(value, "Concat")
    if concat is None or concat.attr("axis") not in (2, -2) or len(concat.inputs) != 2:
        return None
    past, new = concat.inputs
    if past is None or new is None or not past.is_graph_input or len(new.uses()) != 1:
        return None
    side = _side(new, removed, may_rotate)
    return None if side is None else _Cache(past, side, concat.output)


def _repeated(value: Value, sym: SymbolicShapes, removed: list[Node]) -> tuple[Value, int]:
    """value = Reshape(Tile|Expand(Unsqueeze(K, [2]), ...), [B, G * KV, T, D]) -> (K, G);
    anything else is K itself, G = 1."""
    reshape = producer(value, "Reshape")
    grow = None if reshape is None else producer(reshape.input(0))
    if reshape is None or grow is None or grow.op_type not in ("Tile", "Expand"):
        return value, 1
    unsq = producer(grow.input(0), "Unsqueeze")
    cache = None if unsq is None else unsq.input(0)
    if unsq is None or cache is None or const_ints(unsq.input(1)) != [2]:
        return value, 1
    src, mid, out = sym.shape(cache), sym.shape(grow.output), sym.shape(reshape.output)
    if src is None or mid is None or out is None or len(src) != 4 or len(mid) != 5:
        return value, 1
    groups, heads = mid[2], src[1]
    if not isinstance(groups, int) or heads is None or len(out) != 4:
        return value, 1
    want_mid = (src[0], heads, groups, src[2], src[3])
    want_out = (src[0], S.mul(heads, groups), src[2], src[3])
    same = all(S.equal(a, b) for a, b in zip(mid, want_mid, strict=True)) and all(
        S.equal(a, b) for a, b in zip(out, want_out, strict=True)
    )
    # the repeat's other readers may only be Shape nodes (the Reshape's target, dead after)
    others = [u for u in grow.output.users() if u is not reshape]
    if not same or len(unsq.output.uses()) != 1 or any(u.op_type != "Shape" for u in others):
        return value, 1
    removed += [unsq, grow, reshape]
    return cache, groups


@dataclass(frozen=True)
class _Scores:
    """Softmax(Add(scaled MatMul(Qh, K^T), bias)): Qh, K^T's input, the scale and the bias."""

    q: Value
    keys: Value
    scale: float
    bias: Value


def _read_once(value: Value | None) -> bool:
    return value is not None and len(value.uses()) == 1


def _scores(softmax: Node, removed: list[Node], sym: SymbolicShapes) -> _Scores | None:
    """Softmax(Add(scaled scores, bias)) -> (Qh, K^T's input, scale, bias)."""
    if softmax.attr("axis", -1) not in (-1, 3):
        return None
    add = producer(softmax.input(0), "Add")
    if add is None or not _read_once(softmax.input(0)) or len(add.inputs) != 2:
        return None
    a, b = add.inputs
    mm = producer(a, "MatMul") or producer(a, "Div") or producer(a, "Mul")
    scores, bias = (a, b) if mm is not None else (b, a)
    removed.append(add)
    if scores is None or bias is None or len(scores.uses()) != 1:
        return None
    node = scores.producer
    scale = 1.0
    if node is not None and node.is_standard and node.op_type in ("Div", "Mul"):
        c = const_scalar(node.input(1))
        if c is None or c == 0.0:
            return None
        scale = 1.0 / c if node.op_type == "Div" else c
        removed.append(node)
        scaled = node.input(0)
        if scaled is None or len(scaled.uses()) != 1:
            return None
        node = scaled.producer
    if node is None or not node.is_standard or node.op_type != "MatMul" or len(node.inputs) != 2:
        return None
    removed.append(node)
    q, kt = node.inputs
    if q is None or kt is None:
        return None
    for operand in (q, kt):  # SDPA's split scale: Mul(x, c) on each operand
        mul = producer(operand, "Mul")
        c = None if mul is None else const_scalar(mul.input(1))
        unscaled = None if mul is None else mul.input(0)
        if mul is not None and unscaled is not None and c is not None and _read_once(operand):
            scale *= c
            removed.append(mul)
            if operand is q:
                q = unscaled
            else:
                kt = unscaled
    if len(kt.uses()) != 1:
        return None
    keys = untransposed(kt, sym, removed)
    return None if keys is None else _Scores(q, keys, scale, bias)


def match(softmax: Node, sym: SymbolicShapes) -> _Match:
    """The attention around `softmax`; NoMatch says why it is not one."""
    removed: list[Node] = [softmax]
    found = _scores(softmax, removed, sym)
    if found is None:
        raise NoMatch("the Softmax does not read MatMul(Q, K^T) scaled by constants plus a bias")
    probabilities, guard = softmax.output, nan_guard(softmax)
    if guard is not None:  # torch's SDPA export: Where(IsNaN(P), 0, P), removed with the rest
        removed += guard  # (no reader outside the attention: _finish checks what dies)
        probabilities = guard[1].output
    av = sole_reader(probabilities)
    values = None if av is None else av.input(1)
    if av is None or values is None or av.op_type != "MatMul" or av.input(0) is not probabilities:
        raise NoMatch("the probabilities are not multiplied by V alone")
    removed.append(av)
    key_cache, groups = _repeated(found.keys, sym, removed)
    value_cache, value_groups = _repeated(values, sym, removed)
    if groups != value_groups:
        raise NoMatch("K and V are not repeated the same number of times", av)
    q = _side(found.q, removed, may_rotate=True)
    key = _cache(key_cache, removed, may_rotate=True)
    value = _cache(value_cache, removed, may_rotate=False)
    if q is None or key is None or value is None:
        at = found.q if q is None else key_cache if key is None else value_cache
        raise NoMatch(
            "Q, K or V is not Transpose(Reshape(x)) with K, V concatenated to a past input", at
        )
    if (q.rotary is None) != (key.side.rotary is None):
        raise NoMatch("Q and K are not rotated alike", q.rotary or key.side.rotary)
    out = merge_heads(av.output, removed)
    if out is None:
        raise NoMatch("the attention output is not Transpose [0, 2, 1, 3] then Reshape", av)
    anchor = out.anchor
    found_match = _finish(softmax, q, key, value, found, out, anchor, groups, removed, sym)
    return replace(found_match, guarded=guard is not None)


def _finish(
    softmax: Node,
    q: _Side,
    key: _Cache,
    value: _Cache,
    scores: _Scores,
    out: Merged,
    anchor: Node,
    groups: int,
    removed: list[Node],
    sym: SymbolicShapes,
) -> _Match:
    past_key, k, present_key = key.past, key.side, key.present
    past_value, v, present_value = value.past, value.side, value.present
    kv_heads, size = fixed_heads(past_key)
    heads = kv_heads * groups
    widths = _widths((q, k, v), sym)
    got = [w[2] for w in widths]
    if got != [heads * size, kv_heads * size, kv_heads * size]:
        raise NoMatch(f"Q, K, V widths {got} are not {heads}, {kv_heads} heads x {size}", q.flat)
    for side, n in ((q, heads), (k, kv_heads), (v, kv_heads)):
        split = sym.shape(side.split)
        if split is None or len(split) != 4 or (split[1], split[3]) != (n, size):
            raise NoMatch(f"the heads are not split as [batch, {n}, new, {size}]", side.split)
    # Q, K, V share the pasts' type: Concat and MatMul take operands of one type
    for past in (past_key, past_value):
        if past.dtype != TensorProto.FLOAT:
            raise NoMatch("not float32", past)
    bias = scores.bias
    kept = {q.flat, k.flat, v.flat, past_key, past_value, bias}
    kept |= {x for side in (q, k) if side.rotary for x in side.rotary.inputs[1:] if x is not None}
    caches = [present_key.producer, present_value.producer]  # replaced, as `out` is
    dead = dead_with([*removed, *(c for c in caches if c is not None)], kept)
    replaced = {*out.replaced, present_key, present_value}
    for node in dead:  # every value but the replaced ones dies with its readers
        for dying in node.outputs:
            if dying is not None and dying not in replaced and not dies(dying, dead):
                raise NoMatch(f"{dying.name} has readers outside the attention", dying)
    for present in (present_key, present_value):
        if any(u not in dead for u in present.users()):
            raise NoMatch(f"{present.name} has readers outside the attention", present)
    new = widths[0][1]
    if not merged_to(out, widths[0], heads * size, sym):
        raise NoMatch(
            f"the attention output is not reshaped to (batch, new, {heads * size}) or its rows",
            out.transpose,
        )
    bias_shape(bias, sym, new)
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
        anchor,
        heads,
        kv_heads,
        scores.scale,
        new,
        list(dead),
    )


def _widths(sides: tuple[_Side, ...], sym: SymbolicShapes) -> list[SymShape]:
    """The [B, S, width] shapes of the sides' flat values (NoMatch: one is not of rank 3)."""
    widths = [sym.shape(x.flat) for x in sides]
    found: list[SymShape] = [w for w in widths if w is not None and len(w) == 3]
    if len(found) != len(sides):
        raise NoMatch("Q, K or V is not of rank 3 before its heads are split")
    return found


# --------------------------------------------------------------------------- the causal proof


def _strip(value: Value | None, ops: tuple[str, ...]) -> Value | None:
    while True:
        p = producer(value)
        if p is None or p.op_type not in ops:
            return value
        if p.op_type == "Cast" and p.attr("to") != TensorProto.BOOL:
            return value
        value = p.input(0)


def bias_shape(bias: Value, sym: SymbolicShapes, new: S.Dim | None) -> SymShape:
    """The shape of `bias` when it is [B or 1, 1, S, T] with S = `new`; else NoMatch."""
    shape = sym.shape(bias)
    if shape is None or len(shape) != 4 or shape[1] != 1 or not S.equal(shape[2], new):
        raise NoMatch("the attention bias is not of shape [batch or 1, 1, new, total]", bias)
    return shape


def causal_bias(bias: Value, sym: SymbolicShapes, new: S.Dim | None) -> np.ndarray:
    """The mask values NEG when `bias` [B or 1, 1, S, T] is NEG at every key after its row's
    query position T - S + s (module docstring), with S = `new`; else NoMatch says why that
    is not proven."""
    total = bias_shape(bias, sym, new)[3]
    not_where = "the attention bias is not Where(condition, 0, a large negative number)"
    where = producer(bias, "Where")
    if where is None:
        raise NoMatch(not_where, bias)
    zero, neg = const_value(where.input(1)), const_value(where.input(2))
    if zero is None or neg is None or np.any(zero != 0) or neg.size == 0:
        raise NoMatch(not_where, where)
    if float(np.max(neg)) > NEG_LIMIT:
        reason = f"the attention bias masks with {float(np.max(neg)):g}, not at most {NEG_LIMIT:g}"
        raise NoMatch(reason, where)
    if not _has_causal_term(where.input(0), sym, new, total, depth=0):
        raise NoMatch(
            "the attention bias is not provably causal (no key <= query position term)", where
        )
    return neg


def empty_row_form(neg: np.ndarray, guarded: bool) -> str | None:
    """How the original computes a row that keeps no key, when a cheap fix-up can give it
    exactly: "mean" (a finite mask value that absorbs every score: Softmax of T equal values,
    the mean of V over all T keys), "zero" (-inf everywhere, the NaN guard turning the row's
    NaN probabilities into 0: the output 0); None otherwise (-1e9 leaves the scores' rounding
    in the row's softmax; -inf with no guard gives NaN)."""
    values = np.asarray(neg, np.float64)
    if np.all(np.isneginf(values)):
        return "zero" if guarded else None
    if np.all(np.isfinite(values)) and float(np.max(values)) <= ABSORBING:
        return "mean"
    return None


def _has_causal_term(
    cond: Value | None, sym: SymbolicShapes, new: S.Dim | None, total: S.Dim | None, depth: int
) -> bool:
    node = producer(_strip(cond, ("Unsqueeze", "Expand", "Cast", "Identity")))
    if node is None or depth > 8:
        return False
    if node.op_type == "And":
        return any(_has_causal_term(x, sym, new, total, depth + 1) for x in node.inputs)
    if len(node.inputs) != 2:
        return False
    if node.op_type == "LessOrEqual":
        keys, queries = node.inputs
    elif node.op_type == "GreaterOrEqual":
        queries, keys = node.inputs
    else:
        return False
    if keys is None or queries is None:
        return False
    return _key_index(keys, sym, total) and _query_position(queries, sym, new, total)


def _only_dim(value: Value, sym: SymbolicShapes, axis: int) -> S.Dim | None:
    """The size of `value` along `axis` when every other dimension is 1."""
    shape = sym.shape(value)
    if shape is None or len(shape) < 2:
        return None
    rank = len(shape)
    if any(d != 1 for i, d in enumerate(shape) if i != axis % rank):
        return None
    return shape[axis % rank]


def _range(value: Value | None, sym: SymbolicShapes) -> tuple[S.Dim, S.Dim] | None:
    """value = Unsqueeze*(Range(start, limit, 1)) -> (start, limit)."""
    r = producer(_strip(value, ("Unsqueeze",)), "Range")
    if r is None or len(r.inputs) != 3:
        return None
    elems = [sym.elems(x) if x is not None else None for x in r.inputs]
    found = [e[0] for e in elems if e is not None and len(e) == 1 and e[0] is not None]
    if len(found) != 3 or found[2] != 1:
        return None
    return found[0], found[1]


def _key_index(keys: Value, sym: SymbolicShapes, total: S.Dim | None) -> bool:
    """keys = Range(0, T, 1) laid along the last axis."""
    found = _range(keys, sym)
    size = _only_dim(keys, sym, -1)
    return (
        found is not None
        and found[0] == 0
        and S.equal(found[1], total) is True
        and S.equal(size, total) is True
    )


def _query_position(
    queries: Value, sym: SymbolicShapes, new: S.Dim | None, total: S.Dim | None
) -> bool:
    """queries = Range(T - S, T, 1), or Range(0, S, 1) + (T - S), along the last axis but one."""
    if new is None or total is None or S.equal(_only_dim(queries, sym, -2), new) is not True:
        return False
    offset = S.sub(total, new)
    found = _range(queries, sym)
    if found is not None:
        return S.equal(found[0], offset) is True and S.equal(found[1], total) is True
    add = producer(_strip(queries, ("Unsqueeze",)), "Add")
    x, y = add.inputs if add is not None and len(add.inputs) == 2 else (None, None)
    if x is None or y is None:
        return False
    for a, b in ((x, y), (y, x)):
        base, shift = _range(a, sym), sym.elems(b)
        if (
            base is not None
            and base[0] == 0
            and S.equal(base[1], new) is True
            and shift is not None
            and len(shift) == 1
            and S.equal(shift[0], offset) is True
        ):
            return True
    return False


# --------------------------------------------------------------------------- the rewrite


class _Lengths:
    """seqlens_k, total_sequence_length and query_seqlens, and the flag of the rows that keep
    no key, built once per bias."""

    def __init__(self) -> None:
        self.built: dict[int, tuple[Value, Value, Value]] = {}
        self.flags: dict[int, Value] = {}

    def get(self, graph: Graph, m: _Match, before: Node) -> tuple[Value, Value, Value]:
        if id(m.bias) not in self.built:
            self.built[id(m.bias)] = _lengths(graph, m.bias, m.past_key, before)
        return self.built[id(m.bias)]

    def empty(self, graph: Graph, m: _Match, before: Node) -> Value:
        """[B or 1, S, 1] bool: the query row keeps no key (its bias row's largest value is a
        mask value): one ReduceMax over the bias per step, shared by every layer."""
        if id(m.bias) not in self.flags:
            top = _reduce(graph, "ReduceMax", m.bias, [1, 3], before, keepdims=0)  # [B, S]
            if default_opset(graph) >= 13:
                last = graph.make_constant(np.array([-1], np.int64), "gqa_last_axis")
                top = graph.make_node("Unsqueeze", [top, last], 1, before=before).output
            else:
                top = graph.make_node(
                    "Unsqueeze", [top], 1, before=before, attributes={"axes": [-1]}
                ).output
            limit = graph.make_constant(np.array(NEG_LIMIT, np.float32), "gqa_neg_limit")
            flag = graph.make_node("Less", [top, limit], 1, before=before, name="gqa_empty_row")
            self.flags[id(m.bias)] = flag.output
        return self.flags[id(m.bias)]


def _lengths(
    graph: Graph, bias: Value, past_key: Value, before: Node
) -> tuple[Value, Value, Value]:
    """From the bias [., 1, S, T] and a past_key [B, ., ., .] (graph inputs both, or computed
    from them, so readable by every later layer)."""

    def op(op_type: str, inputs: list[Value], **attrs: int) -> Value:
        node = graph.make_node(
            op_type, inputs, 1, before=before, name=f"gqa_{op_type}", attributes=attrs
        )
        return node.output

    def dim(axis: int) -> Value:
        return op("Shape", [bias], start=axis, end=axis + 1)

    batch = op("Shape", [past_key], start=0, end=1)
    new, total = dim(2), dim(3)
    one = graph.make_constant(np.array([1], np.int64), "gqa_one")
    int32 = TensorProto.INT32
    seqlens_k = op("Cast", [op("Expand", [op("Sub", [total, one]), batch])], to=int32)
    scalar = op("Cast", [op("Squeeze", [total])], to=int32)
    query = op("Cast", [op("Expand", [new, batch])], to=int32)
    return seqlens_k, scalar, query


def _reduce(
    graph: Graph, op_type: str, x: Value, axes: list[int], before: Node, keepdims: int
) -> Value:
    """A Reduce* over `axes`: an input from opset 18, an attribute before."""
    if default_opset(graph) >= 18:
        ax = graph.make_constant(np.array(axes, np.int64), "gqa_axes")
        inputs: list[Value] = [x, ax]
        attrs: dict[str, int | list[int]] = {"keepdims": keepdims}
    else:
        inputs, attrs = [x], {"keepdims": keepdims, "axes": axes}
    node = graph.make_node(
        op_type, inputs, 1, before=before, name=f"gqa_{op_type}", attributes=attrs
    )
    return node.output


def _empty_rows_fixed(
    graph: Graph, m: _Match, out: Value, pv: Value, empty: Value, before: Node
) -> Value:
    """Where(empty, what the original gives such a row, out) (`empty_row_form`): the mean
    over all T keys of the present value, each of the KV heads repeated G times in a row as
    the original's repeat does, or 0."""
    if m.empty_rows == "zero":
        fill = graph.make_constant(np.array(0.0, np.float32), "gqa_zero")
    else:
        fill = _reduce(graph, "ReduceMean", pv, [2], before, keepdims=1)  # [B, KV, 1, D]
        groups = m.heads // m.kv_heads
        if groups > 1:  # [B, KV, G, D]: query head h reads KV head h // G
            reps = graph.make_constant(np.array([1, 1, groups, 1], np.int64), "gqa_repeat")
            fill = graph.make_node("Tile", [fill, reps], 1, before=before).output
        width = graph.make_constant(np.array([0, 1, -1], np.int64), "gqa_row_shape")
        fill = graph.make_node("Reshape", [fill, width], 1, before=before).output  # [B,1,H*D]
    fixed = graph.make_node(
        "Where", [empty, fill, out], 1, before=before, name=f"{m.softmax.name}_empty_rows"
    ).output
    fixed.dtype, fixed.shape = out.dtype, out.shape
    return fixed


def _rewrite_with(lengths: _Lengths) -> Callable[[Node, _Match, PassContext], None]:
    def rewrite(node: Node, m: _Match, ctx: PassContext) -> None:
        graph = node.owning_graph()
        anchor = m.anchor
        q = _flat_input(graph, m.q, m.heads, anchor)
        k = _flat_input(graph, m.k, m.kv_heads, anchor)
        heads = {"kv_num_heads": m.kv_heads, "scale": float(m.scale)}
        if m.form == "standard":
            op, domain = "Attention", ""
            inputs: list[Value | None] = [q, k, m.v.flat, m.bias, m.past_key, m.past_value]
            attributes: dict[str, object] = {"q_num_heads": m.heads, **heads}
        else:
            op, domain = "GroupQueryAttention", MS_DOMAIN
            seqlens_k, total, query = lengths.get(graph, m, anchor)
            inputs = [q, k, m.v.flat, m.past_key, m.past_value, seqlens_k, total]
            inputs += [None] * (_GQA_INPUTS["attention_bias"] - len(inputs)) + [m.bias]
            inputs += [None] * (_GQA_INPUTS["query_seqlens"] - len(inputs)) + [query]
            attributes = {"num_heads": m.heads, **heads, "causal": 1}
            graph.ensure_opset(MS_DOMAIN)
        fused = graph.make_node(
            op,
            inputs,
            3,
            before=anchor,
            domain=domain,
            name=f"{op}_{m.softmax.name}",
            attributes=attributes,
        )
        out, pk, pv = (fused.out(i) for i in range(3))
        for old, new in ((m.present_key, pk), (m.present_value, pv)):
            if old is not None:
                new.dtype, new.shape = old.dtype, old.shape
                graph.replace_all_uses_with(old, new)
        # onnx cannot infer a contrib op's output; the file states what is known (exporter)
        old_out = m.out.out
        if old_out is not None:
            out.dtype, out.shape = old_out.dtype, old_out.shape
        out.dtype = out.dtype if out.dtype is not None else q.dtype
        out.shape = out.shape if out.shape is not None else _output_shape(m, q)
        if m.empty_rows is not None:
            empty = lengths.empty(graph, m, anchor)
            out = _empty_rows_fixed(graph, m, out, pv, empty, anchor)
            for gone in m.removed:  # the NaN guard, exact now: remove-nan-guard's want is met
                ctx.settled(NONEMPTY_SEQUENCES, gone)
        if old_out is not None:
            graph.replace_all_uses_with(old_out, out)
        m.out.hand_over(out)
        for dead in reversed(in_order(graph, m.removed)):  # every reader is removed first
            graph.remove(dead)

    return rewrite


def _output_shape(m: _Match, q: Value) -> tuple[int | str | None, ...] | None:
    """The attention's output [B, S, heads * D]: the query's first two dims and the value's
    head size D (from V's split heads, the present value or V's width), None where unknown."""
    if q.shape is None or len(q.shape) != 3:
        return None
    head = _last_int(m.v.split) or _last_int(m.present_value)
    width = _last_int(m.v.flat)
    if head is None and width is not None and width % m.kv_heads == 0:
        head = width // m.kv_heads
    return None if head is None else (q.shape[0], q.shape[1], m.heads * head)


def _last_int(v: Value) -> int | None:
    last = v.shape[-1] if v.shape else None
    return last if isinstance(last, int) else None


def _flat_input(graph: Graph, side: _Side, heads: int, before: Node) -> Value:
    """The [B, S, N * D] input: the rotation moved onto it where the heads were rotated (the
    standard op on 3-D input takes its number of heads as an attribute)."""
    if side.rotary is None:
        return side.flat
    _x, *rest = side.rotary.inputs
    attributes = dict(side.rotary.attributes)
    if side.rotary.is_standard:
        attributes["num_heads"] = heads
    node = graph.make_node(
        "RotaryEmbedding",
        [side.flat, *rest],
        1,
        before=before,
        domain=side.rotary.domain,
        name="RotaryEmbedding",
        attributes=attributes,
    )
    node.output.dtype, node.output.shape = side.flat.dtype, side.flat.shape
    return node.output


def _check_with(sym: SymbolicShapes) -> Callable[[Node, PassContext], _Match]:
    def check(node: Node, ctx: PassContext) -> _Match:
        if not has_cache_inputs(node.graph):
            raise NoMatch()
        contrib = ctx.fused_ops_allowed and ctx.target == "cpu"
        opset = default_opset(node)
        if not contrib and opset < ATTENTION_OPSET:
            raise NoMatch(
                f"--portable or a GPU target keeps standard ops, and Attention needs opset "
                f"{ATTENTION_OPSET} (the model has {opset})"
            )
        found = match(node, sym)
        exact = None
        if contrib:
            support = runtime_support()
            if support is not None:
                raise NoMatch(support)
            exact = empty_row_form(causal_bias(found.bias, sym, found.new), found.guarded)
        else:
            for side in (found.q, found.k):
                if side.rotary is not None and not side.rotary.is_standard:
                    raise NoMatch(
                        "the heads are rotated by a contrib op; the standard form keeps them",
                        side.rotary,
                    )
            found = replace(found, form="standard")
        if ctx.assumes(NONEMPTY_SEQUENCES):
            return found
        if exact is not None:  # exact on every row: those that keep no key fixed up
            return replace(found, empty_rows=exact)
        ctx.wants(NONEMPTY_SEQUENCES, node)  # the one thing missing: the report's hint
        raise NoMatch(
            "GroupQueryAttention differs on a row that keeps no key (a left-padded prompt's "
            "padding) and this mask's value gives no exact fix-up (a finite one at most "
            f"{ABSORBING:g}, or -inf with the NaN guard): needs --assume nonempty-sequences"
        )

    return check


@register_pass("fuse-group-query-attention", assumptions=(NONEMPTY_SEQUENCES,))
def fuse_group_query_attention(graph: Graph, ctx: PassContext) -> PassResult:
    """A decoder's attention with its KV cache (grouped-query or not) ->
    com.microsoft.GroupQueryAttention (cpu, under --assume nonempty-sequences)."""
    rule = Rule(
        "fused",
        ("Softmax",),
        _check_with(SymbolicShapes(S.algebra_for(graph))),
        _rewrite_with(_Lengths()),
    )
    run = apply_rules(graph, ctx, [rule], subgraphs=False)
    fused = run.counts["fused"]
    return PassResult(changed=fused > 0, stats={"fused": fused} if fused else {})
