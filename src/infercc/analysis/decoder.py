"""Decoders with a KV cache: what the graph's inputs and outputs say, and what they cost.

`decoder_signature(model)` reads a decoder's I/O from the graph alone:

- the **cache**: inputs named like `past_key_values.0.key`, `past.0`, `past_key_0`, ... and
  outputs named like `present.0.key`, `present_key_values.0.value`, `present_0`. Each past is
  paired with the present whose name is the same once the words past / present (and
  `_key_values`) are taken out; when the names do not pair, the i-th past input pairs with the
  i-th present output when both lists have the same length and each pair has the same element
  type, rank and fixed dims (a present is its past one step later). A cache that pairs neither
  way is refused, naming the inputs left without a present. Each cache input has a batch axis
  (`input_ids`' first axis: its symbol, or its static size on axis 0, or 1 for GPT-2's stacked
  [2, batch, ...] form) and a sequence axis (its other symbolic axis); its other dims must be
  fixed;
- `input_ids` (by name, else the first rank-2 integer input), optional `attention_mask`
  ([batch, past + new]) and `position_ids` ([batch, new]);
- `logits`: the output of that name, else the first output that is not a present.

Anything else the model wants fed (a `use_cache_branch` flag, cache positions) is refused:
infercc would have to guess its meaning.

**What a call may be.** `DecoderSignature.fixed` holds the dims of one call the model declares
static (`StepDims`: the batch, the tokens per call, the mask's length): a decode-step export
declares `input_ids` [batch, 1] and takes one token per call. `pinned(shapes)` adds what
`--shape` fixes (the caches' length too), refusing pins that disagree with each other, and
`StepDims.fit(batch, past, new)` gives the call nearest to the one asked for that the model
takes: every feed infercc generates for a decoder (validation's profiles, calibration's
samples, the speed race's step) goes through it.

`prefill_feeds` and `decode_feeds` build what one step of a greedy loop feeds (the empty cache
of a prefill has sequence length 0); `kv_bytes_per_token` is the cache's size per token and
batch row: the product of each cache input's fixed dims times its element size, summed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from infercc.data.signature import declared_dims, elem_type_name, input_dtype, real_inputs
from infercc.errors import InferccError

_PAST = re.compile(r"past|cache", re.IGNORECASE)
_PRESENT = re.compile(r"present", re.IGNORECASE)
_STRIP = re.compile(r"(past_key_values|present_key_values|past_key_value|past|present)", re.I)


@dataclass
class CacheTensor:
    """One past input and the present output that feeds it on the next step."""

    past: str
    present: str
    dtype: np.dtype
    dims: list[int | str | None]
    batch_axis: int
    seq_axis: int

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token of one batch row: the fixed dims times the element size."""
        fixed = [d for i, d in enumerate(self.dims) if i not in (self.batch_axis, self.seq_axis)]
        return int(np.prod(fixed, dtype=np.int64)) * self.dtype.itemsize

    def shape(self, batch: int, length: int) -> tuple[int, ...]:
        out = list(self.dims)
        out[self.batch_axis], out[self.seq_axis] = batch, length
        return tuple(int(d) for d in out)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {
            "past": self.past,
            "present": self.present,
            "dtype": str(self.dtype),
            "dims": list(self.dims),
            "batch_axis": self.batch_axis,
            "seq_axis": self.seq_axis,
            "bytes_per_token": self.bytes_per_token,
        }


@dataclass(frozen=True)
class StepDims:
    """The dims of one decoder call that are fixed (None: free): the batch, the new tokens
    (`input_ids`' axis 1), the cached tokens (a `--shape` pin of a cache) and the mask's
    length (past + new)."""

    batch: int | None = None
    new: int | None = None
    past: int | None = None
    total: int | None = None

    @property
    def prefill(self) -> bool:
        """Whether a call may start from an empty cache with any number of new tokens."""
        return self.new is None and self.past is None and self.total is None

    def fit(self, batch: int, past: int, new: int) -> tuple[int, int, int]:
        """(batch, past, new) with every fixed dim in place of the one asked for."""
        b = batch if self.batch is None else self.batch
        n = new if self.new is None else self.new
        p = past if self.past is None else self.past
        if self.total is not None:
            if self.new is None and self.past is not None:
                n = self.total - p
            else:
                n = min(n, self.total)
                p = self.total - n
        return b, p, n


_FIELDS = ("batch", "new", "past", "total")
_WHAT = {
    "batch": "batch",
    "new": "new tokens per call",
    "past": "cached tokens",
    "total": "mask length (cached + new tokens)",
}


def _merge(a: StepDims, b: StepDims) -> StepDims | str:
    """Both sets of fixed dims, or the name of the field where they disagree."""
    values = {}
    for name in _FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x is not None and y is not None and x != y:
            return name
        values[name] = _first(x, y)
    found = StepDims(**values)
    return "total" if not _lengths_agree(found) else found


def _pin_conflict(
    name: str,
    dims: Sequence[int],
    field_name: str,
    found: StepDims,
    pin: StepDims,
    origin: Mapping[str, str],
) -> InferccError:
    spec = f"--shape {name}={'x'.join(map(str, dims))}"
    hint = (
        "pin the decoder's inputs consistently: one batch, one number of new tokens, the "
        "mask as long as the cached and new tokens together"
    )
    mine, theirs = getattr(pin, field_name), getattr(found, field_name)
    if mine is not None and theirs is not None and mine != theirs:
        return InferccError(
            f"{spec} sets the decoder's {_WHAT[field_name]} to {mine}, where "
            f"{origin.get(field_name, 'another input')} sets it to {theirs}",
            hint,
        )
    d = StepDims(**{k: _first(getattr(pin, k), getattr(found, k)) for k in _FIELDS})
    return InferccError(
        f"{spec} makes the decoder's attention mask {d.total} long, which is not its cached "
        f"({'?' if d.past is None else d.past}) and new ({'?' if d.new is None else d.new}) "
        "tokens together",
        hint,
    )


def _lengths_agree(d: StepDims) -> bool:
    if d.total is None:
        return True
    if d.new is not None and d.past is not None:
        return d.past + d.new == d.total
    if d.new is not None:
        return d.total >= d.new
    return d.total > (d.past or 0)


def _first(a: int | None, b: int | None) -> int | None:
    return a if a is not None else b


def _as_int(dim: Any) -> int | None:
    return dim if isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 else None


@dataclass
class DecoderSignature:
    input_ids: str
    ids_dtype: np.dtype
    logits: str
    caches: list[CacheTensor]
    attention_mask: str | None = None
    mask_dtype: np.dtype | None = None
    position_ids: str | None = None
    positions_dtype: np.dtype | None = None
    vocab: int | None = None
    outputs: list[str] = field(default_factory=list)
    fixed: StepDims = field(default_factory=StepDims)

    def pinned(self, shapes: Mapping[str, Sequence[int]] | None) -> DecoderSignature:
        """This signature with the call dims `shapes` (--shape) pins fixed too; InferccError
        where a pin disagrees with the model or with another pin."""
        found = self.fixed
        origin = {
            k: "the model's declared shapes" for k in _FIELDS if getattr(found, k) is not None
        }
        for name, dims in (shapes or {}).items():
            pin = self.call_dims(name, dims)
            if pin is None:
                continue
            merged = _merge(found, pin)
            if isinstance(merged, str):
                raise _pin_conflict(name, dims, merged, found, pin, origin)
            origin.update({k: f"--shape {name}" for k in _FIELDS if k not in origin})
            found = merged
        return replace(self, fixed=found)

    def call_dims(self, name: str, dims: Sequence[Any]) -> StepDims | None:
        """What input `name` at `dims` (ints; anything else is free) fixes of a call."""
        dims = [_as_int(d) for d in dims]
        if name in (self.input_ids, self.position_ids) and len(dims) == 2:
            return StepDims(batch=dims[0], new=dims[1])
        if name == self.attention_mask and len(dims) == 2:
            return StepDims(batch=dims[0], total=dims[1])
        for cache in self.caches:
            if cache.past == name and len(dims) == len(cache.dims):
                return StepDims(batch=dims[cache.batch_axis], past=dims[cache.seq_axis])
        return None

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(c.bytes_per_token for c in self.caches)

    def kv_bytes(self, batch: int, tokens: int) -> int:
        return self.kv_bytes_per_token * int(batch) * int(tokens)

    @property
    def inputs(self) -> set[str]:
        """Every input a call feeds."""
        named = (self.input_ids, self.attention_mask, self.position_ids)
        return {n for n in named if n} | {c.past for c in self.caches}

    @property
    def prompt_inputs(self) -> list[str]:
        """The inputs a prompt alone determines (samples for a decoder hold `input_ids`)."""
        return [self.input_ids]

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "logits": self.logits,
            "vocab": self.vocab,
            "caches": [c.to_dict() for c in self.caches],
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }


# --------------------------------------------------------------------------- detection


def decoder_signature(model: onnx.ModelProto) -> DecoderSignature | None:
    """The decoder I/O of `model` (a skeleton is enough), or None when it has no KV cache.

    InferccError when it has a cache but something about it cannot be driven."""
    inputs = {vi.name: vi for vi in real_inputs(model)}
    outputs = [vi.name for vi in model.graph.output]
    pasts = [n for n in inputs if _PAST.search(n)]
    presents = [n for n in outputs if _PRESENT.search(n)]
    if not pasts or not presents:
        return None
    pairs = _pair(inputs, {vi.name: vi for vi in model.graph.output}, pasts, presents)
    ids = _input_ids(inputs, set(pasts))
    batch_dim = _first_dim(inputs[ids])
    caches = [_cache(inputs[p], q, batch_dim) for p, q in pairs]
    mask = _named(inputs, "attention_mask")
    positions = _named(inputs, "position_ids")
    known = {ids, *pasts, *(n for n in (mask, positions) if n)}
    unknown = [n for n in inputs if n not in known]
    if unknown:
        raise InferccError(
            f"decoder input(s) {', '.join(map(repr, unknown))} are neither the prompt, the "
            "attention mask, the position ids nor the KV cache",
            "export the decoder with input_ids, attention_mask, position_ids and past_* "
            "inputs only (one graph with the cache, no use_cache_branch)",
        )
    logits = _logits(model, set(presents))
    sig = DecoderSignature(
        input_ids=ids,
        ids_dtype=input_dtype(inputs[ids]),
        logits=logits,
        caches=caches,
        attention_mask=mask,
        mask_dtype=input_dtype(inputs[mask]) if mask else None,
        position_ids=positions,
        positions_dtype=input_dtype(inputs[positions]) if positions else None,
        vocab=_vocab(model, logits),
        outputs=outputs,
    )
    return replace(sig, fixed=_declared_fixed(sig, inputs))


def _declared_fixed(sig: DecoderSignature, inputs: Mapping[str, onnx.ValueInfoProto]) -> StepDims:
    """The call dims the decoder's inputs declare static."""
    fixed = StepDims()
    names = [sig.input_ids, sig.attention_mask, sig.position_ids, *(c.past for c in sig.caches)]
    for name in names:
        dims = None if name is None else declared_dims(inputs[name])
        pin = None if name is None or dims is None else sig.call_dims(name, dims)
        if pin is None:
            continue
        merged = _merge(fixed, pin)
        if isinstance(merged, str):
            raise InferccError(
                f"the decoder's input {name!r} declares a {_WHAT[merged]} that its other "
                "inputs contradict",
                "re-export the decoder with one batch, one number of new tokens and the mask "
                "as long as the cached and new tokens together",
            )
        fixed = merged
    return fixed


def pinned_signature(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None, strict: bool = True
) -> DecoderSignature | None:
    """`model`'s decoder signature with the `--shape` pins fixed (None: no KV cache). Each pin
    is checked against its input's declared rank and static dims first, as everywhere
    (`infercc.data.signature.resolve_shape`), then against the other pins. `strict` False:
    None, not an error, for a cache infercc cannot drive (a build that need not drive it)."""
    from infercc.data.signature import resolve_shape

    for vi in real_inputs(model):
        if shapes is not None and vi.name in shapes:
            # rank and static dims, one input at a time
            resolve_shape(vi, {vi.name: tuple(shapes[vi.name])}, {})
    try:
        sig = decoder_signature(model)
    except InferccError:
        if strict:
            raise
        return None
    return None if sig is None else sig.pinned(shapes)


def require_decoder(model: onnx.ModelProto, path: str) -> DecoderSignature:
    sig = decoder_signature(model)
    if sig is None:
        raise InferccError(
            f"{path} has no KV-cache inputs and outputs (past_* inputs, present* outputs): "
            "it is not a decoder that --generate can drive",
            "export the decoder with its cache (use_cache=True; torch.onnx with "
            "past_key_values inputs), or bench it without --generate",
        )
    return sig


def _pair(
    inputs: Mapping[str, onnx.ValueInfoProto],
    outputs: Mapping[str, onnx.ValueInfoProto],
    pasts: list[str],
    presents: list[str],
) -> list[tuple[str, str]]:
    """Each past input with the present output that feeds it next step (module docstring)."""
    by_key = {_STRIP.sub("", name).lower(): name for name in presents}
    named = {p: by_key.get(_STRIP.sub("", p).lower()) for p in pasts}
    if all(named.values()) and len(set(named.values())) == len(pasts):
        pairs = [(p, q) for p, q in named.items() if q is not None]
        bad = [pair for pair in pairs if not _same_cache(inputs[pair[0]], outputs[pair[1]])]
        if not bad:
            return pairs
        p, q = bad[0]
        raise InferccError(
            f"the decoder's cache input {p!r} and the output {q!r} its name pairs it with "
            f"differ in element type or fixed dims ({_type_text(inputs[p])} vs "
            f"{_type_text(outputs[q])})",
            "export each present output as its past input one step later: same element type, "
            "heads and head size",
        )
    if len(pasts) == len(presents):
        pairs = list(zip(pasts, presents, strict=True))
        if all(_same_cache(inputs[p], outputs[q]) for p, q in pairs):
            return pairs
    alone = [p for p, q in named.items() if q is None] or pasts
    shown = ", ".join(map(repr, alone[:3])) + (
        f" and {len(alone) - 3} more" if len(alone) > 3 else ""
    )
    raise InferccError(
        f"the decoder's cache inputs cannot be paired with its outputs: {shown} match no "
        f"present output by name, and its {len(pasts)} past input(s) and {len(presents)} "
        "present output(s) do not pair in order (same count, element type and fixed dims)",
        "name them past_key_values.N.key/value and present.N.key/value",
    )


def _same_cache(past: onnx.ValueInfoProto, present: onnx.ValueInfoProto) -> bool:
    """A present can feed its past: the same element type and rank, and the same size on
    every axis both declare a size for."""
    a, b = past.type.tensor_type, present.type.tensor_type
    if a.elem_type != b.elem_type:
        return False
    dims_a, dims_b = declared_dims(past), declared_dims(present)
    if dims_a is None or dims_b is None:
        return True
    if len(dims_a) != len(dims_b):
        return False
    return all(
        x == y or not (isinstance(x, int) and isinstance(y, int))
        for x, y in zip(dims_a, dims_b, strict=True)
    )


def _type_text(vi: onnx.ValueInfoProto) -> str:
    dims = declared_dims(vi)
    shown = "?" if dims is None else ", ".join("?" if d is None else str(d) for d in dims)
    return f"{elem_type_name(vi.type.tensor_type.elem_type)}[{shown}]"


def _input_ids(inputs: Mapping[str, onnx.ValueInfoProto], pasts: set[str]) -> str:
    if "input_ids" in inputs:
        return "input_ids"
    for name, vi in inputs.items():
        if name in pasts or name in ("attention_mask", "position_ids"):
            continue
        dims = declared_dims(vi)
        if dims is not None and len(dims) == 2 and input_dtype(vi).kind in "iu":
            return name
    raise InferccError(
        "the decoder has no input_ids input (a rank-2 integer input)",
        "export it with an input_ids input of shape [batch, sequence]",
    )


def _named(inputs: Mapping[str, onnx.ValueInfoProto], word: str) -> str | None:
    return word if word in inputs else next((n for n in inputs if word in n.lower()), None)


def _first_dim(vi: onnx.ValueInfoProto) -> int | str | None:
    """`input_ids`' batch: its symbol, or its static size."""
    dims = declared_dims(vi)
    return dims[0] if dims else None


def _cache(vi: onnx.ValueInfoProto, present: str, batch_dim: int | str | None) -> CacheTensor:
    dims = declared_dims(vi)
    if dims is None:
        raise InferccError(f"cache input {vi.name!r} has no declared shape", "export its shape")
    symbolic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    batch = _batch_axis(dims, symbolic, batch_dim)
    seq = [i for i in symbolic if i != batch]
    if len(seq) != 1 or batch is None:
        raise InferccError(
            f"cache input {vi.name!r} has dims {dims}: need a batch axis, one symbolic "
            "sequence axis and every other dim fixed",
            "export the cache as [batch, heads, past_sequence, head_size] with fixed heads "
            "and head size",
        )
    return CacheTensor(vi.name, present, input_dtype(vi), dims, batch, seq[0])


def _batch_axis(
    dims: list[int | str | None], symbolic: list[int], batch_dim: int | str | None
) -> int | None:
    stacked = len(dims) == 5 and dims[0] == 2  # GPT-2's stacked [2, batch, heads, seq, dim]
    if isinstance(batch_dim, str) and batch_dim in dims:
        return dims.index(batch_dim)
    if isinstance(batch_dim, int):  # a static batch: the axis of that size, 0 (1 if stacked)
        axis = 1 if stacked else 0
        return axis if len(dims) > axis and dims[axis] == batch_dim else None
    if 0 in symbolic:
        return 0
    if dims and dims[0] == 2 and 1 in symbolic:
        return 1
    return None


def _logits(model: onnx.ModelProto, presents: set[str]) -> str:
    names = [vi.name for vi in model.graph.output]
    if "logits" in names:
        return "logits"
    rest = [n for n in names if n not in presents]
    if not rest:
        raise InferccError("the decoder has no logits output", "export its logits")
    return rest[0]


def _vocab(model: onnx.ModelProto, logits: str) -> int | None:
    for vi in model.graph.output:
        if vi.name == logits:
            dims = declared_dims(vi)
            if dims and isinstance(dims[-1], int):
                return dims[-1]
    return None


# --------------------------------------------------------------------------- feeds


def prefill_feeds(sig: DecoderSignature, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Feeds for a prefill of `ids` [batch, prompt] with an empty cache."""
    ids = np.asarray(ids)
    batch, length = ids.shape
    feeds = {sig.input_ids: ids.astype(sig.ids_dtype)}
    for cache in sig.caches:
        feeds[cache.past] = np.zeros(cache.shape(batch, 0), cache.dtype)
    feeds.update(_mask_and_positions(sig, batch, 0, length))
    return feeds


def step_inputs(
    sig: DecoderSignature, tokens: np.ndarray, past_length: int
) -> dict[str, np.ndarray]:
    """The non-cache feeds of a decode step of `tokens` [batch, 1] after `past_length`."""
    tokens = np.asarray(tokens)
    feeds = {sig.input_ids: tokens.astype(sig.ids_dtype)}
    feeds.update(_mask_and_positions(sig, tokens.shape[0], past_length, tokens.shape[1]))
    return feeds


def random_call(
    sig: DecoderSignature,
    rng: np.random.Generator,
    batch: int,
    past: int,
    new: int,
    scale: float = 0.5,
) -> dict[str, np.ndarray]:
    """Feeds of one call at `(batch, past, new)` as `sig.fixed` fits them: random token ids,
    random caches (normal, `scale`), the mask all ones and the positions following the cache."""
    batch, past, new = sig.fixed.fit(batch, past, new)
    feeds = step_inputs(sig, rng.integers(0, sig.vocab or 2, (batch, new)), past)
    for cache in sig.caches:
        values = rng.standard_normal(cache.shape(batch, past)) * scale
        feeds[cache.past] = values.astype(cache.dtype)
    return feeds


def _mask_and_positions(
    sig: DecoderSignature, batch: int, past: int, new: int
) -> dict[str, np.ndarray]:
    feeds = {}
    if sig.attention_mask is not None:
        feeds[sig.attention_mask] = np.ones((batch, past + new), sig.mask_dtype)
    if sig.position_ids is not None:
        positions = np.arange(past, past + new, dtype=np.int64)
        feeds[sig.position_ids] = np.broadcast_to(positions, (batch, new)).astype(
            sig.positions_dtype
        )
    return feeds


# --------------------------------------------------------------------------- memory budget

BUDGET_CONTEXTS = tuple(2**i for i in range(8, 18))  # 256 .. 131072 tokens
_FOUR_BIT = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}


def weight_bytes(model: Any) -> int:
    """Bytes of the initializers as stored (4-bit types at half a byte each)."""
    total = 0
    for value in model.graph.initializers.values():
        t = value.const
        if t is None:
            continue
        total += (t.size + 1) // 2 if t.dtype in _FOUR_BIT else t.nbytes
    return int(total)


def decode_profile(sig: DecoderSignature, batch: int, context: int) -> dict[str, tuple[int, ...]]:
    """Input shapes of the decode step that makes token `context` (context - 1 cached)."""
    shapes: dict[str, tuple[int, ...]] = {sig.input_ids: (batch, 1)}
    if sig.attention_mask is not None:
        shapes[sig.attention_mask] = (batch, context)
    if sig.position_ids is not None:
        shapes[sig.position_ids] = (batch, 1)
    for cache in sig.caches:
        shapes[cache.past] = cache.shape(batch, context - 1)
    return shapes


def max_positions(model: Any, sig: DecoderSignature) -> int | None:
    """Rows of the position-embedding table a Gather reads at `position_ids`, if there is one."""
    if sig.position_ids is None:
        return None
    passthrough = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}
    for node in model.graph:
        if node.op_type != "Gather" or not node.is_standard or node.attr("axis", 0) != 0:
            continue
        table, index = node.input(0), node.input(1)
        if table is None or table.const is None or index is None:
            continue
        while index.producer is not None and index.producer.op_type in passthrough:
            index = index.producer.input(0)
        if index.name == sig.position_ids:
            return int(table.const.shape[0])
    return None


def decoder_memory(model: Any, skeleton: onnx.ModelProto, target: Any) -> dict[str, Any] | None:
    """The memory budget of serving a decoder on `target` (None for a model without a cache).

    Per context length c (powers of two from 256, up to the position table's size when the
    model has one): the KV cache at batch b (kv_bytes_per_token x b x c), the activation arena
    of one decode step (planned at batch 1 and 2, linear in between and beyond), the weights
    (as stored) and the workspace rule of `infercc inspect` (max(64 MiB, 10% of the rest));
    the largest batch that fits the target's memory at c, and the largest c at batch 1. The
    arena holds the step's present outputs while its past inputs are live: the cache counts
    twice, as it does in a loop that feeds present back as past.
    """
    from infercc.analysis.memory import plan_memory
    from infercc.analysis.roofline import largest_batch, memory_budget

    sig = decoder_signature(skeleton)
    if sig is None:
        return None
    weights = weight_bytes(model)
    limit = max_positions(model, sig)
    contexts = [c for c in BUDGET_CONTEXTS if limit is None or c <= limit]
    rows = []
    for c in contexts:
        a1 = plan_memory(model, decode_profile(sig, 1, c)).arena_bytes
        a2 = plan_memory(model, decode_profile(sig, 2, c)).arena_bytes

        def arena(b: int, c: int = c, a1: int = a1, a2: int = a2) -> int:
            return a1 + (b - 1) * max(a2 - a1, 0) + sig.kv_bytes(b, c)

        at1 = memory_budget(weights, arena(1), target)
        rows.append(
            {
                "context": c,
                "kv_cache_bytes": sig.kv_bytes(1, c),
                "activation_bytes": a1,
                "total_bytes": at1["total_bytes"],
                "fits": at1["fits"],
                "largest_batch": largest_batch(arena, weights, target),
            }
        )
    fitting = [r["context"] for r in rows if r["fits"]]
    return {
        "kv_bytes_per_token": sig.kv_bytes_per_token,
        "weights_bytes": weights,
        "max_positions": limit,
        "memory_bytes": int(target.memory_bytes),
        "contexts": rows,
        "largest_context_at_batch_1": max(fitting) if fitting else None,
        "rule": "weights + KV cache (kv_bytes_per_token x batch x context) + one decode "
        "step's activation arena + workspace max(64 MiB, 10%)",
    }
