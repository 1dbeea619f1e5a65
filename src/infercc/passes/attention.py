"""Attention in its cheapest exact form: the Softmax NaN guard, and onnxruntime's Attention op.

**remove-nan-guard.** torch.onnx writes scaled_dot_product_attention with a "safe softmax"
guard after the Softmax::

    p = Softmax(s, axis=-1);  p' = Where(IsNaN(p), 0, p)

A Softmax row is NaN exactly when every score of the row is -inf (a query whose every key is
masked out: a sequence whose attention_mask is all zeros), given finite scores (Q and K
finite, as anything downstream already needs). So the guard changes nothing, and goes, when:

- there is no mask: `s` is the scaled product `Q @ K^T` itself (Mul/Div by constants);
- the mask added to the scores is a constant in which every row (last axis) holds a finite
  value: a causal mask, which keeps the diagonal, or any other constant mask that empties no
  row (checked on its values);
- the user states `--assume nonempty-sequences` (`infercc.assumptions`).

Otherwise it stays, and the refusal says why. Every other reader of `p` is left as it is.

**emit-attention** (cpu target, onnxruntime contrib ops allowed). The self-attention block
as exporters write it, after fuse-qkv packed the projections::

    qkv = MatMul(X, W) [+ bias];  q, k, v = Split(qkv, axis=-1)
    Qh = Transpose<0,2,1,3>(Reshape(q, [B,S,H,D]))  [* c_q]
    Kt = Transpose<0,2,3,1>(Reshape(k, [B,S,H,D]))  [* c_k]
    s  = MatMul(Qh, Kt) [* c | / c]  [+ M]
    p  = Softmax(s, axis=-1)  [guard]
    O  = MatMul(p, Transpose<0,2,1,3>(Reshape(v, [B,S,H,Dv])))
    Y  = Reshape(Transpose<0,2,1,3>(O [-> Reshape to its own shape]), [B,S,H*Dv])

becomes `Y = com.microsoft.Attention(X, W, bias, attention_bias=M')` with `num_heads = H` and
`scale = c_q * c_k * c` (computed in float64, so `(Q c_q)(K c_k)^T c` and `scale * Q K^T`
differ by rounding only). onnxruntime computes `softmax(scale * Q K^T + attention_bias) V`
per head, which is the block above for every row the mask leaves a finite score in; for a
row the mask fills with finite values (transformers' eager mask, finfo.min) both give the
same uniform row. The mask goes as `attention_bias` (the exact additive tensor, not
onnxruntime's mask_index, whose filter value -10000 would differ on fully masked rows);
onnxruntime wants it [B|1, H|1, S, S], so `M' = Expand(M, [1, 1, S, S])` (a copy, made once
per mask and shared by every layer reading it). A fully masked row (all -inf) is NaN in
onnxruntime's kernel; where the original had the guard, zeros are restored on the output unless
the rows are proven non-empty or assumed so: for a mask with one head (its axis 1 statically
1), the attention_bias goes in as `Max(M, lowest float32)` (a row with any finite entry
computes exactly as with -inf; a fully masked one becomes a finite average) and the output is
multiplied by `keep` = (the mask row's maximum > -inf), [B|1, S|1, 1], made once per mask: one
Mul per block; for any other mask, `Where(IsNaN(Y), 0, Y)` on [B,S,E] instead of [B,H,S,S].
Without the guard the original's row is NaN too. (Like the guard itself, this reasons about
finite activations and masks: where the block's input already holds a NaN, the original
propagates it through `0 * V` and the guard makes that position zero; the filters may not.)

What the match proves: q, k, v are the three outputs of one Split of the packed projection of
X (constant 2-D weight, constant bias); every reshape target's batch and sequence entries are
X's own dimensions (seen through Shape/Gather/Unsqueeze/Slice/Concat, or 0, or a static size
equal to X's), the head entries constants with H * D equal to the split widths; the reshape
left on O by transformers' SDPA path keeps O's batch, sequence and head-size dimensions (so,
element count equal, it is an identity); Softmax on the last axis; no intermediate is read
outside the block except by Shape nodes (which die with it) or is a graph output. float32
only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.ir.tensor import Tensor
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_ints, const_value, default_opset, is_live, producer
from infercc.passes.rules import NoMatch, Rule, apply_rules, require

log = logging.getLogger(__name__)

FLOAT = 1  # onnx.TensorProto.FLOAT

# --------------------------------------------------------------------------- the NaN guard


@dataclass(frozen=True)
class _Guard:
    """A guard `Where(IsNaN(p), 0, p)` after `softmax`, and whether removing it rests on the
    nonempty-sequences assumption."""

    where: Node
    softmax: Node
    assumed: bool
    key: str = "guards"


def guard_of(where: Node) -> Node | None:
    """The Softmax whose output `where` guards (`Where(IsNaN(p), 0, p)`), or None."""
    if where.op_type != "Where" or len(where.inputs) != 3:
        return None
    isnan = producer(where.input(0), "IsNaN")
    p = where.input(2)
    if isnan is None or p is None or isnan.input(0) is not p:
        return None
    zero = const_value(where.input(1))
    if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0.0:
        return None
    softmax = producer(p, "Softmax")
    if softmax is None or not _last_axis(softmax):
        return None
    return softmax


def nan_guard(softmax: Node) -> tuple[Node, Node] | None:
    """The guard `Where(IsNaN(p), 0, p)` reading `softmax`'s output p, as (IsNaN, Where), or
    None."""
    p = _out(softmax)
    for node, _ in p.uses():
        if node.op_type == "Where" and guard_of(node) is softmax:
            isnan = producer(node.input(0), "IsNaN")
            assert isnan is not None  # guard_of found it
            return isnan, node
    return None


def _last_axis(softmax: Node) -> bool:
    axis = softmax.attr("axis", -1 if default_opset(softmax) >= 13 else 1)
    scores = softmax.input(0)
    rank = scores.rank if scores is not None else None
    return axis == -1 or (rank is not None and axis == rank - 1)


def rows_never_empty(scores: Value) -> str | None:
    """None when every Softmax row of `scores` provably keeps a finite score (module
    docstring), else why not."""
    mask = _additive_mask(scores)
    if mask is None:
        return None  # no mask: the scaled product itself
    if isinstance(mask, str):
        return mask
    values = const_value(mask)
    if values is None:
        return "the attention mask is computed from the inputs, so a row can be all -inf"
    if values.dtype.kind != "f":
        return "the attention mask is not a float tensor"
    if values.ndim == 0 or values.shape[-1] == 0:
        return None if values.ndim == 0 and np.isfinite(values) else "the mask is empty"
    if np.all(np.any(np.isfinite(values), axis=-1)):
        return None
    return "the constant attention mask empties a row"


def _additive_mask(scores: Value) -> Value | str | None:
    """The mask added to the scaled Q K^T product (None: no mask), or why it is no such sum."""
    if _scaled_product(scores) is not None:
        return None
    add = producer(scores, "Add")
    if add is None:
        return "the Softmax input is not Q @ K^T (scaled) plus a mask"
    for i in (0, 1):
        if _scaled_product(add.input(i)) is not None:
            return add.input(1 - i)
    return "the Softmax input is not Q @ K^T (scaled) plus a mask"


def _scaled_product(value: Value | None) -> tuple[Node, float] | None:
    """(MatMul, scale) when `value` is MatMul(a, b) times/divided by scalar constants."""
    scale = 1.0
    while value is not None:
        node = producer(value)
        if node is None:
            return None
        if node.op_type == "MatMul":
            return node, scale
        step = _scalar_step(node)
        if step is None:
            return None
        value, factor = step
        scale *= factor
    return None


def _scalar_step(node: Node) -> tuple[Value, float] | None:
    """(the other operand, factor) for Mul(x, c) / Mul(c, x) / Div(x, c), c a float scalar."""
    if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    for i in (1, 0) if node.op_type == "Mul" else (1,):
        c = const_value(node.input(i))
        if c is not None and c.size == 1 and c.dtype.kind == "f":
            factor = float(c.reshape(-1)[0])
            if node.op_type == "Div":
                factor = 1.0 / factor if factor != 0.0 else float("nan")
            if not np.isfinite(factor) or factor == 0.0:
                return None
            x = node.input(1 - i)
            return (x, factor) if x is not None else None
    return None


def _check_guard(where: Node, ctx: PassContext) -> _Guard:
    softmax = require(guard_of(where))
    if not is_live(where):
        raise NoMatch()  # replaced already (emit-attention), dead until eliminate-dead-code
    reason = rows_never_empty(require(softmax.input(0)))
    if reason is None:
        return _Guard(where, softmax, assumed=False)
    if ctx.stated(NONEMPTY_SEQUENCES):
        return _Guard(where, softmax, assumed=True)
    ctx.wants(NONEMPTY_SEQUENCES, where)
    raise NoMatch(f"{reason}; --assume {NONEMPTY_SEQUENCES} states it cannot", softmax)


def _remove_guard(where: Node, guard: _Guard, ctx: PassContext) -> None:
    graph = where.graph
    assert graph is not None
    if guard.assumed:
        ctx.assumes(NONEMPTY_SEQUENCES)
    graph.replace_all_uses_with(_out(where), _out(guard.softmax))
    if not _out(where).uses():
        graph.remove(where)


@register_pass("remove-nan-guard", assumptions=(NONEMPTY_SEQUENCES,))
def remove_nan_guard(graph: Graph, ctx: PassContext) -> PassResult:
    """Drop the Where(IsNaN(p), 0, p) after attention Softmax where no row can be all -inf."""
    run = apply_rules(graph, ctx, [Rule("guards", ("Where",), _check_guard, _remove_guard)])
    return PassResult(changed=bool(run.counts), stats=dict(run.counts))


# --------------------------------------------------------------------------- Attention


@dataclass(frozen=True)
class _Block:
    """A matched self-attention block (module docstring)."""

    scores: Value  # the Softmax input
    x: Value
    weight: Value
    bias: Value | None
    heads: int
    widths: tuple[int, int, int]
    scale: float
    mask: Value | None
    guard: Node | None
    output: Value
    anchor: Node  # the final Reshape: the new nodes go before it
    inside: set[Node]
    filter_nan: bool = False
    assumed: bool = False
    key: str = "attention"
    names: dict[Value, tuple[str, ...]] = field(default_factory=dict)


class _Emitter:
    """The rule's state for one run: the attention_bias made for each mask, shared."""

    def __init__(self) -> None:
        self.biases: dict[tuple[Value, bool], Value] = {}
        self.keeps: dict[Value, Value] = {}
        self.stats: dict[str, int] = {}

    def check(self, softmax: Node, ctx: PassContext) -> _Block:
        if ctx.target != "cpu" or not ctx.fused_ops_allowed:
            raise NoMatch()
        found = match_block(softmax)
        if found.guard is not None and found.mask is not None:
            reason = rows_never_empty(found.scores)
            if reason is not None:
                assumed = ctx.stated(NONEMPTY_SEQUENCES)
                found = replace(found, assumed=assumed, filter_nan=not assumed)
        return found

    def rewrite(self, softmax: Node, block: _Block, ctx: PassContext) -> None:
        graph = softmax.graph
        assert graph is not None
        if block.assumed:
            ctx.assumes(NONEMPTY_SEQUENCES)
        out = _emit(graph, block, self.biases, self.keeps)
        graph.replace_all_uses_with(block.output, out)
        _drop_dead(graph, block.inside)
        self.stats["attention"] = self.stats.get("attention", 0) + 1
        if block.filter_nan:
            self.stats["nan_filters"] = self.stats.get("nan_filters", 0) + 1


@register_pass("emit-attention", assumptions=(NONEMPTY_SEQUENCES,))
def emit_attention(graph: Graph, ctx: PassContext) -> PassResult:
    """Self-attention blocks on the packed QKV projection as onnxruntime's Attention (cpu)."""
    emitter = _Emitter()
    apply_rules(graph, ctx, [Rule("attention", ("Softmax",), emitter.check, emitter.rewrite)])
    return PassResult(changed=bool(emitter.stats), stats=emitter.stats)


def match_block(softmax: Node) -> _Block:
    """The self-attention block around `softmax`; NoMatch without a reason when it is no
    attention Softmax, with one naming what does not fit."""
    scores = require(softmax.input(0))
    mask = _additive_mask(scores)
    if isinstance(mask, str):
        raise NoMatch()
    qk, scale = require(_scaled_product(scores if mask is None else _other_addend(scores, mask)))
    if softmax.outputs[0] is None or softmax.outputs[0].dtype not in (None, FLOAT):
        raise NoMatch("attention is not float32")
    if not _last_axis(softmax):
        raise NoMatch("Softmax is not on the last axis")
    return _Matcher(softmax, scores, qk, scale, mask).run()


def _other_addend(scores: Value, mask: Value | None) -> Value | None:
    add = producer(scores, "Add")
    assert add is not None
    return add.input(1) if add.input(0) is mask else add.input(0)


class _Matcher:
    """Walks the block from the Softmax outwards; each step returns a reason on failure."""

    def __init__(self, softmax: Node, scores: Value, qk: Node, scale: float, mask: Value | None):
        self.softmax, self.qk, self.scale, self.mask = softmax, qk, scale, mask
        self.scores = scores
        self.inside: set[Node] = {softmax, qk}
        self.names: dict[Value, tuple[str, ...]] = {}
        self.transposes: dict[Node, Node] = {}
        value: Value | None = scores
        while value is not None and value is not qk.outputs[0]:
            node = producer(value)
            assert node is not None  # _scaled_product / _additive_mask walked this chain
            self.inside.add(node)
            self.names[value] = ("B", "H", "S", "S")
            step = _scalar_step(node) if node.op_type != "Add" else None
            value = _other_addend(value, mask) if step is None else step[0]

    def run(self) -> _Block:
        q_heads = self._scaled_input(self.qk.input(0), (0, 2, 1, 3))
        k_heads = self._scaled_input(self.qk.input(1), (0, 2, 3, 1))
        probs, guard = self._probabilities()
        pv = _sole_matmul_reader(probs)
        if pv is None:
            raise NoMatch("the attention probabilities are not only multiplied by V", probs)
        self.inside.add(pv)
        v_heads = self._heads(pv.input(1), (0, 2, 1, 3))
        split = self._split(q_heads, k_heads, v_heads)
        x, weight, bias, widths = self._projection(split)
        self.names[x] = ("B", "S", "Ein")
        for r in (q_heads, k_heads, v_heads):  # a last-axis Split of x @ W: [B, S, E]
            self._name(r.input(0), ("B", "S", "E"))
        heads, sizes = self._head_counts(q_heads, k_heads, v_heads, widths)
        self._name_block(q_heads, k_heads, v_heads, probs, pv, split)
        output, anchor = self._output(pv.outputs[0], heads, sizes[2])
        self._only_read_inside(anchor)
        return _Block(
            scores=self.scores,
            x=x,
            weight=weight,
            bias=bias,
            heads=heads,
            widths=widths,
            scale=self.scale,
            mask=self.mask,
            guard=guard,
            output=output,
            anchor=anchor,
            inside=self.inside,
            names=self.names,
        )

    # -- the Q, K, V heads ---------------------------------------------------------------

    def _scaled_input(self, value: Value | None, perm: tuple[int, ...]) -> Node:
        """The Reshape producing the heads of Q (or K^T), through Mul/Div by scalars."""
        while value is not None:
            node = producer(value)
            step = _scalar_step(node) if node is not None else None
            if node is None or step is None:
                break
            self.inside.add(node)
            value, factor = step
            self.scale *= factor
        return self._heads(value, perm)

    def _heads(self, value: Value | None, perm: tuple[int, ...]) -> Node:
        """The Reshape under `Transpose<perm>` producing `value`."""
        transpose = producer(value, "Transpose")
        if transpose is None or tuple(transpose.attr("perm", [])) != perm:
            at = value.producer if value is not None else None
            raise NoMatch(f"a head split is not Transpose<{list(perm)}>(Reshape(...))", at or value)
        reshape = producer(transpose.input(0), "Reshape")
        if reshape is None:
            raise NoMatch("a head split is not Transpose(Reshape(...))", transpose)
        self.inside.update((transpose, reshape))
        self.transposes[reshape] = transpose
        return reshape

    def _probabilities(self) -> tuple[Value, Node | None]:
        guard = nan_guard(self.softmax)
        if guard is None:
            return _out(self.softmax), None
        self.inside.update(guard)
        return _out(guard[1]), guard[1]

    def _split(self, *reshapes: Node) -> Node:
        split = producer(reshapes[0].input(0), "Split")
        if split is None or len(split.outputs) != 3:
            raise NoMatch(
                "Q, K and V are not the three outputs of one Split (fuse-qkv)", reshapes[0]
            )
        for i, reshape in enumerate(reshapes):
            if reshape.input(0) is not split.outputs[i]:
                raise NoMatch("Q, K and V are not outputs 0, 1, 2 of one Split", reshape)
        axis = split.attr("axis", 0)
        x = split.input(0)
        rank = x.rank if x is not None else None
        if not (axis == -1 or (rank is not None and axis == rank - 1)):
            raise NoMatch("the Q/K/V Split is not on the last axis", split)
        self.inside.add(split)
        return split

    def _projection(self, split: Node) -> tuple[Value, Value, Value | None, tuple[int, int, int]]:
        value = split.input(0)
        bias = None
        add = producer(value, "Add")
        if add is not None:
            mm, bias = self._biased(add)
        else:
            mm = producer(value, "MatMul")
        if mm is None:
            raise NoMatch("Q/K/V are not split from a MatMul of the block input", split)
        x, weight = mm.input(0), mm.input(1)
        w = const_value(weight)
        if x is None or weight is None or w is None or w.ndim != 2 or w.dtype != np.float32:
            raise NoMatch("the packed Q/K/V weight is not a constant float32 matrix", mm)
        widths = _split_widths(split, int(w.shape[1]))
        if widths is None:
            raise NoMatch("the Q/K/V Split sizes are not known", split)
        if widths[0] != widths[1]:
            raise NoMatch("Q and K have different widths", split)
        if x.rank is not None and x.rank != 3:
            raise NoMatch("the block input is not [batch, sequence, hidden]", x)
        self.inside.update(n for n in (add, mm) if n is not None)
        return x, weight, bias, widths

    def _biased(self, add: Node) -> tuple[Node | None, Value | None]:
        for i in (0, 1):
            mm = producer(add.input(i), "MatMul")
            b = const_value(add.input(1 - i))
            if mm is not None and b is not None and b.ndim == 1 and b.dtype == np.float32:
                return mm, add.input(1 - i)
        raise NoMatch("the Q/K/V bias is not a constant vector", add)

    def _head_counts(
        self, q: Node, k: Node, v: Node, widths: tuple[int, int, int]
    ) -> tuple[int, tuple[int, int, int]]:
        """(H, head sizes of Q, K, V) from the three head-split targets."""
        (hq, dq), (hk, dk), (hv, dv) = (
            self._split_target(r, w) for r, w in zip((q, k, v), widths, strict=True)
        )
        if not hq == hk == hv:
            raise NoMatch("Q, K and V are split into different numbers of heads", q)
        return hq, (dq, dk, dv)

    def _split_target(self, reshape: Node, width: int) -> tuple[int, int]:
        """(H, D) of a [B,S,E] -> [B,S,H,D] reshape whose B and S are the block input's."""
        entries = _target_entries(reshape)
        if entries is None or len(entries) != 4:
            raise NoMatch("a head-split Reshape target is not a known 4-element shape", reshape)
        if not all(self._is_dim(e, reshape, i, "BS"[i]) for i, e in enumerate(entries[:2])):
            raise NoMatch("a head-split Reshape does not keep the batch and sequence dims", reshape)
        h, d = entries[2], entries[3]
        if not (isinstance(h, int) and isinstance(d, int)):
            raise NoMatch("the head count and head size are not constants", reshape)
        if h == -1 and d > 0 and width % d == 0:
            h = width // d
        elif d == -1 and h > 0 and width % h == 0:
            d = width // h
        if h <= 0 or d <= 0 or h * d != width:
            raise NoMatch("heads x head size differs from the projection width", reshape)
        return h, d

    def _is_dim(self, entry: object, reshape: Node, index: int, symbol: str) -> bool:
        """Whether a target entry is the dimension `symbol` of the tensor reshaped."""
        if entry == 0 and not reshape.attr("allowzero", 0):
            names = self._names_of(reshape.input(0))
            return names is not None and index < len(names) and names[index] == symbol
        if isinstance(entry, tuple):
            names = self._names_of(entry[0])
            return names is not None and entry[1] < len(names) and names[entry[1]] == symbol
        if isinstance(entry, int) and entry > 0:
            return self._static(symbol) == entry
        return False

    def _static(self, symbol: str) -> int | None:
        for value, names in self.names.items():
            if value.shape is not None and symbol in names:
                dim = value.shape[names.index(symbol)]
                if isinstance(dim, int):
                    return dim
        return None

    def _names_of(self, value: Value | None) -> tuple[str, ...] | None:
        return self.names.get(value) if value is not None else None

    def _name(self, value: Value | None, dims: tuple[str, ...]) -> None:
        if value is not None:
            self.names[value] = dims

    def _name_block(self, q: Node, k: Node, v: Node, probs: Value, pv: Node, split: Node) -> None:
        """The dimension names of the block's tensors (what targets are checked against)."""
        bshd, bhsd = ("B", "S", "H", "D"), ("B", "H", "S", "D")
        for r in (q, k, v):
            self._name(r.input(0), ("B", "S", "E"))
            self.names[_out(r)] = bshd
            self.names[_out(self.transposes[r])] = ("B", "H", "D", "S") if r is k else bhsd
        for node in self.inside:
            if node.op_type in ("Mul", "Div") and node.outputs[0] is not None:
                src = node.input(0) if node.input(0) in self.names else node.input(1)
                if src in self.names:
                    self.names[_out(node)] = self.names[src]
        self.names[_out(self.qk)] = ("B", "H", "S", "S")
        self.names[probs] = ("B", "H", "S", "S")
        self.names[_out(self.softmax)] = ("B", "H", "S", "S")
        self.names[_out(pv)] = bhsd
        self._name(split.input(0), ("B", "S", "3E"))

    # -- the output ---------------------------------------------------------------------

    def _output(self, o: Value | None, heads: int, dv: int) -> tuple[Value, Node]:
        """The [B,S,H*Dv] output of the block and its final Reshape."""
        node = _sole_reader(o)
        if node is not None and node.op_type == "Reshape":
            self._identity_reshape(node, heads, dv)
            self.inside.add(node)
            self.names[_out(node)] = ("B", "H", "S", "D")
            o = node.outputs[0]
            node = _sole_reader(o)
        if node is None or node.op_type != "Transpose" or node.attr("perm") != [0, 2, 1, 3]:
            raise NoMatch("the attention output is not Transpose<0,2,1,3> then Reshape", o)
        self.inside.add(node)
        self.names[_out(node)] = ("B", "S", "H", "D")
        final = _sole_reader(node.outputs[0])
        if final is None or final.op_type != "Reshape":
            raise NoMatch("the attention output is not merged by a Reshape", node)
        entries = _target_entries(final)
        if entries is None or len(entries) != 3:
            raise NoMatch("the output Reshape target is not a known [B, S, E] shape", final)
        ok = [self._is_dim(e, final, i, "BS"[i]) for i, e in enumerate(entries[:2])]
        if not all(ok) or entries[2] not in (-1, heads * dv):
            raise NoMatch(
                "the output Reshape is not to [batch, sequence, heads x head size]", final
            )
        self.inside.add(final)
        return _out(final), final

    def _identity_reshape(self, node: Node, heads: int, dv: int) -> None:
        """A Reshape of O [B,H,S,D] whose target keeps B, S and D (so H too): an identity."""
        entries = _target_entries(node)
        if entries is None or len(entries) != 4:
            raise NoMatch("a Reshape of the attention output has an unknown target", node)
        checks = [
            self._is_dim(entries[0], node, 0, "B"),
            entries[1] in (-1, heads) or self._is_dim(entries[1], node, 1, "H"),
            self._is_dim(entries[2], node, 2, "S"),
            entries[3] in (-1, dv) or self._is_dim(entries[3], node, 3, "D"),
        ]
        if not all(checks) or entries.count(-1) > 1:
            raise NoMatch("a Reshape of the attention output changes its shape", node)

    def _only_read_inside(self, final: Node) -> None:
        """No intermediate of the block is read outside it (Shape nodes excepted, which die
        with it) or is a graph output."""
        for node in self.inside:
            if node is final:
                continue
            for out in node.outputs:
                if out is None:
                    continue
                if out.is_graph_output:
                    raise NoMatch(f"{out.name!r} is a graph output", out)
                for user, _ in out.uses():
                    if user not in self.inside and user.op_type != "Shape":
                        reason = f"{out.name!r} is also read by {user.op_type} {user.name!r}"
                        raise NoMatch(reason, user)


def _out(node: Node) -> Value:
    """The node's first output (every node matched here has one)."""
    value = node.outputs[0]
    assert value is not None
    return value


def _sole_reader(value: Value | None) -> Node | None:
    """The one reader of `value` that is not a Shape node, when there is exactly one."""
    if value is None:
        return None
    users = [u for u, _ in value.uses() if u.op_type != "Shape"]
    return users[0] if len(users) == 1 else None


def _sole_matmul_reader(value: Value) -> Node | None:
    node = _sole_reader(value)
    if node is None or node.op_type != "MatMul" or node.input(0) is not value:
        return None
    return node


def _split_widths(split: Node, total: int) -> tuple[int, int, int] | None:
    sizes = const_ints(split.input(1)) if len(split.inputs) > 1 else split.attr("split")
    if sizes is None:
        if total % 3:
            return None
        sizes = [total // 3] * 3
    sizes = [int(s) for s in sizes]
    if len(sizes) != 3 or sum(sizes) != total:
        return None
    return sizes[0], sizes[1], sizes[2]


# --------------------------------------------------------------------------- reshape targets


def _target_entries(reshape: Node) -> list[object] | None:
    """The Reshape target element by element: ints (constants) or (tensor, axis) for an element
    that is a dimension of a tensor; None when an element is neither."""
    return _entries(reshape.input(1))


def _entries(value: Value | None) -> list[object] | None:
    if value is None:
        return None
    ints = const_ints(value)
    if ints is not None:
        return list(ints)
    node = producer(value)
    if node is None:
        return None
    if node.op_type == "Concat":
        out: list[object] = []
        for part in node.inputs:
            found = _entries(part)
            if found is None:
                return None
            out.extend(found)
        return out
    if node.op_type in ("Unsqueeze", "Squeeze", "Cast", "Identity"):
        return _entries(node.input(0))
    if node.op_type == "Shape":
        return _shape_entries(node)
    if node.op_type == "Gather":
        return _gathered(node)
    if node.op_type == "Slice":
        return _sliced(node)
    return None


def _shape_entries(node: Node) -> list[object] | None:
    t = node.input(0)
    if t is None or t.rank is None:
        return None
    start, end = node.attr("start", 0), node.attr("end", t.rank)
    axes = range(t.rank)[slice(start, end)]
    return [(t, a) for a in axes]


def _gathered(node: Node) -> list[object] | None:
    if node.attr("axis", 0) != 0:
        return None
    data = _entries(node.input(0))
    idx = const_ints(node.input(1))
    if data is None or idx is None:
        return None
    try:
        return [data[i] for i in idx]
    except IndexError:
        return None


def _sliced(node: Node) -> list[object] | None:
    data = _entries(node.input(0))
    starts, ends = const_ints(node.input(1)), const_ints(node.input(2))
    if data is None or starts is None or ends is None or len(starts) != 1:
        return None
    axes = const_ints(node.input(3)) if len(node.inputs) > 3 else [0]
    steps = const_ints(node.input(4)) if len(node.inputs) > 4 else [1]
    if axes not in ([0], [-1]) or steps != [1]:
        return None
    return data[slice(starts[0], ends[0])]


# --------------------------------------------------------------------------- the rewrite


def _emit(
    graph: Graph, block: _Block, biases: dict[tuple[Value, bool], Value], keeps: dict[Value, Value]
) -> Value:
    inputs: list[Value | None] = [block.x, block.weight, block.bias]
    finite = block.filter_nan and _one_head(block.mask)
    if block.mask is not None:
        inputs += [None, None, _attention_bias(graph, block, biases, finite)]
    attrs: dict[str, object] = {"num_heads": block.heads, "scale": float(block.scale)}
    if block.widths[2] != block.widths[0]:
        attrs["qkv_hidden_sizes"] = list(block.widths)
    node = graph.make_node(
        "Attention",
        inputs,
        before=block.anchor,
        domain=MS_DOMAIN,
        name="attention",
        attributes=attrs,
    )
    graph.ensure_opset(MS_DOMAIN)
    out = node.outputs[0]
    assert out is not None
    out.dtype, out.shape = FLOAT, block.output.shape
    if finite:
        out = _zero_empty_rows(graph, out, block, keeps)
    elif block.filter_nan:
        out = _nan_to_zero(graph, out, block.anchor)
    return out


def _drop_dead(graph: Graph, nodes: set[Node]) -> None:
    """Remove the replaced block's nodes and what only they read (so that a later rule of the
    same round does not match a dead guard or block)."""
    work = list(nodes)
    while work:
        node = work.pop()
        if node.graph is not graph or is_live(node) or node.subgraphs():
            continue
        work.extend(p for p in (v.producer for v in node.inputs if v is not None) if p)
        graph.remove(node)


def _attention_bias(
    graph: Graph, block: _Block, biases: dict[tuple[Value, bool], Value], finite: bool
) -> Value:
    """The mask as [B|1, H|1, S, S] (onnxruntime's attention_bias), made once per mask; with
    `finite`, its -inf raised to float32's lowest value (`_zero_empty_rows`)."""
    mask = block.mask
    assert mask is not None
    key = (mask, finite)
    if key in biases:
        return biases[key]
    source = mask
    if finite:
        lowest = graph.make_constant(np.array(np.finfo(np.float32).min, np.float32), "lowest")
        raised = graph.make_node("Max", [mask, lowest], before=block.anchor, name="finite_mask")
        raised_out = raised.outputs[0]
        assert raised_out is not None
        raised_out.dtype, raised_out.shape = FLOAT, mask.shape
        source = raised_out
    if _is_square(mask, block):
        biases[key] = source
        return source
    shape = graph.make_node("Shape", [block.x], before=block.anchor, name="attention_bias_shape")
    seq = graph.make_node(
        "Gather",
        [shape.outputs[0], graph.make_constant(np.array([1, 1], dtype=np.int64), "seq_seq")],
        before=block.anchor,
        name="attention_bias_seq",
        attributes={"axis": 0},
    )
    ones = graph.make_constant(np.array([1, 1], dtype=np.int64), "ones_2")
    target = graph.make_node(
        "Concat",
        [ones, seq.outputs[0]],
        before=block.anchor,
        name="attention_bias_target",
        attributes={"axis": 0},
    )
    expand = graph.make_node(
        "Expand", [source, target.outputs[0]], before=block.anchor, name="attention_bias"
    )
    out = expand.outputs[0]
    assert out is not None
    out.dtype = FLOAT
    biases[key] = out
    return out


def _is_square(mask: Value, block: _Block) -> bool:
    """Whether the mask's last two dims are statically the sequence length (no Expand)."""
    x_shape = block.x.shape
    if mask.shape is None or len(mask.shape) != 4 or x_shape is None:
        return False
    seq = x_shape[1]
    return isinstance(seq, int) and mask.shape[2] == seq and mask.shape[3] == seq


def _one_head(mask: Value | None) -> bool:
    """A rank-4 mask whose head axis is statically 1: its empty rows are rows of the whole
    [B, S, E] output, not of one head's slice of it."""
    shape = None if mask is None else mask.shape
    return shape is not None and len(shape) == 4 and shape[1] == 1


def _zero_empty_rows(graph: Graph, value: Value, block: _Block, keeps: dict[Value, Value]) -> Value:
    """The output with the rows of fully masked queries set to zero, as the guard made them.

    The attention_bias went in with its -inf raised to float32's lowest value: a row with any
    finite entry computes exactly as before (exp of lowest - max is 0, as exp(-inf) is), and a
    fully masked row, all lowest, is a finite uniform average instead of NaN. Multiplying by
    `keep` (1 where the mask row holds a value above -inf, else 0; once per mask, [B|1, S|1, 1])
    then zeroes those rows: one Mul per block where the NaN filter took an IsNaN and a Where."""
    mask = block.mask
    assert mask is not None
    keep = keeps.get(mask)
    if keep is None:
        before, opset = block.anchor, default_opset(graph)
        if opset >= 18:
            axes = graph.make_constant(np.array([-1], np.int64), "last_axis")
            rowmax = graph.make_node("ReduceMax", [mask, axes], before=before, name="mask_row_max")
        else:
            rowmax = graph.make_node(
                "ReduceMax", [mask], before=before, name="mask_row_max", attributes={"axes": [-1]}
            )
        neg_inf = graph.make_constant(np.array(-np.inf, np.float32), "minus_inf")
        has = graph.make_node("Greater", [rowmax.outputs[0], neg_inf], before=before)
        as_float = graph.make_node(
            "Cast", [has.outputs[0]], before=before, name="mask_row_kept", attributes={"to": FLOAT}
        )
        if opset >= 13:
            head_axis = graph.make_constant(np.array([1], np.int64), "head_axis")
            squeezed = graph.make_node(
                "Squeeze", [as_float.outputs[0], head_axis], before=before, name="mask_row_keep"
            )
        else:
            squeezed = graph.make_node(
                "Squeeze",
                [as_float.outputs[0]],
                before=before,
                name="mask_row_keep",
                attributes={"axes": [1]},
            )
        keep = squeezed.outputs[0]
        assert keep is not None
        keep.dtype = FLOAT
        keeps[mask] = keep
    mul = graph.make_node("Mul", [value, keep], before=block.anchor, name="attention_empty_rows")
    out = mul.outputs[0]
    assert out is not None
    out.dtype, out.shape = value.dtype, value.shape
    return out


def _nan_to_zero(graph: Graph, value: Value, before: Node) -> Value:
    isnan = graph.make_node("IsNaN", [value], before=before, name="attention_empty_rows")
    zero = graph.make_constant(Tensor(np.zeros((1,), dtype=np.float32)), "zero")
    where = graph.make_node(
        "Where", [isnan.outputs[0], zero, value], before=before, name="attention_nan_to_zero"
    )
    out = where.outputs[0]
    assert out is not None
    out.dtype, out.shape = value.dtype, value.shape
    return out
