"""The inputs validation runs on: shape profiles, the samples of each, and the original's
outputs on them.

**The first profile** is the user's samples (`--data`), or one random feed at the shapes
`--shape` pins, other symbolic dimensions at their defaults (1 on axis 0, 8 elsewhere). When
the *original* model fails on that random feed (a reflect Pad longer than 8, an `sr` that must
be 8000 or 16000), other feeds are tried before giving up: the symbolic dimensions that are not
a batch (axis 0 of an input of rank >= 2) at each size of a ladder (sizes the model compares
its shape values with first, then 8, 16, 32, 64, 128, 224, 256, 512, 640), each with the values
the model compares its inputs with (`infercc.data.hints`). The first feed the original runs on
is the profile, and a note says which it is and why the default failed. When none runs, the
error says that it is the original that fails, shows the inputs used, and names `--shape`,
`--data` and `--no-validate`. When the original runs but leaves a float output near-constant
(`infercc.check.compare.degenerate`: a sigmoid map of a 32x32 image, all near zero), up to
`MAX_DEGENERATE_ATTEMPTS` more sizes of the ladder (up to `MAX_DEGENERATE_SIZE`) are tried
first, and the first feed where every output varies is the profile; where none does, the
first feed stays, and a note names the outputs that stayed near-constant.

**A decoder** (KV-cache inputs and outputs, `infercc.analysis.decoder`, every input in its
signature), without `--data`: a prefill (batch 1, 8 tokens, empty cache) and a chunk after a
past (batch 3, 7 cached + 5 new tokens), the mask as long as cache and new tokens together and
the positions following the cache, which random dimensions never are. Every dim of a call the
model declares static, or `--shape` pins (the second profile: a range's other end, and
`--static-shapes`), stays as given, the other dims of the call following it: a decode-step
export (`input_ids` [batch, 1]) is validated at one new token after 8 and, at batch 3, after 37
cached tokens. Pins that contradict the model or each other are refused. Where the original
fails on them, the search below runs.

**The second profile** exists whenever an input has a symbolic dimension: a dimension baked
into a constant by a wrong rewrite passes at one shape and fails at another. Each symbolic
dimension takes a second value: from `second_shapes` where the user pinned it (`--shape
NAME=MIN:OPT:MAX` pins the first profile at OPT and the second at MAX, or MIN when MAX is OPT),
else derived from the first: a batch of 1 becomes 3 (then 2), any other size v becomes v + 29
(8 -> 37), then v + 32, v // 2 and 2 v, all symbols at once; when the original runs at none of
those, each symbol is varied alone and the ones that can vary are combined. Inputs whose shape
does not change keep the first profile's values (the `sr` it needs). A second profile the
original runs at nowhere is a note: the model was validated at one shape only.

The original runs in one onnxruntime session for all of this, released before the candidate
runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.analysis.decoder import decoder_signature, pinned_signature, random_call
from infercc.assumptions import honour
from infercc.check.compare import ModelRunError, ModelSource, Runner, degenerate
from infercc.data.feeds import describe_feeds, feed_bytes, make_inputs
from infercc.data.hints import compared_sizes, compared_values
from infercc.data.samples import SampleData, data_label, load_samples
from infercc.data.signature import (
    DEFAULT_DIM,
    SymbolKey,
    free_symbols,
    real_inputs,
    resolve_shapes,
    symbol_values,
)
from infercc.errors import InferccError

logger = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
Shapes = Mapping[str, tuple[int, ...]]

LADDER = (16, 32, 64, 128, 224, 256, 512, 640)
MAX_FIRST_ATTEMPTS = 48
MAX_SECOND_ATTEMPTS = 24
MAX_FEED_BYTES = 512 * 2**20  # a generated feed larger than this is not tried
# Where the default feed leaves a float output near-constant: at most this many more sizes of
# the ladder, none past MAX_DEGENERATE_SIZE, before judging it as it is.
MAX_DEGENERATE_ATTEMPTS = 4
MAX_DEGENERATE_SIZE = 256
ORIGINAL = "the original model"


@dataclass
class Profile:
    """One shape profile: its samples, the original's outputs on them, and where it came from
    (`default`, `pinned`, `ladder`, `data`, `derived` or `pinned range`)."""

    source: str
    feeds: list[Feeds]
    expected: list[dict[str, Any]]
    values: dict[str, float] = field(default_factory=dict)  # inputs filled with one value
    call: tuple[int, int, int] | None = None  # a decoder's (batch, cached, new tokens)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The input shapes of its first sample."""
        return {n: tuple(int(d) for d in np.shape(a)) for n, a in self.feeds[0].items()}

    def describe(self) -> str:
        return describe_feeds(self.feeds[0])

    def to_dict(self, passed: bool | None = None) -> dict[str, Any]:
        return {
            "source": self.source,
            "shapes": {n: list(s) for n, s in self.shapes.items()},
            "values": dict(self.values),
            "samples": len(self.feeds),
            "passed": passed,
        }


@dataclass
class FeedPlan:
    """The profiles validation runs (the first always, the second when it exists)."""

    profiles: list[Profile]
    notes: list[str] = field(default_factory=list)

    @property
    def feeds(self) -> list[Feeds]:
        return [f for p in self.profiles for f in p.feeds]

    @property
    def expected(self) -> list[dict[str, Any]]:
        return [e for p in self.profiles for e in p.expected]


def plan_feeds(
    reference: ModelSource,
    model: onnx.ModelProto,
    shapes: Shapes | None = None,
    data: SampleData | None = None,
    seed: int = 0,
    second_shapes: Shapes | None = None,
    constants: Mapping[str, np.ndarray] | None = None,
    skip_hint: str | None = "--no-validate",
    assumptions: Sequence[str] = (),
    fixed_shapes: Shapes | None = None,
) -> FeedPlan:
    """The profiles to validate at (module docstring), with the original's outputs.

    `model` is the reference's graph (weights may be left out; `constants` are its small
    initializers then); `second_shapes` pins inputs of the second profile; `skip_hint` is the
    flag that skips validation, named when the original fails (None: there is none);
    generated feeds satisfy `assumptions` (`infercc.assumptions`); inputs in `fixed_shapes`
    (--static-shapes: the candidate accepts no other shape) keep their shape in the second
    profile."""
    notes: list[str] = []
    with Runner(reference, role=ORIGINAL) as runner:
        search = _Search(runner, model, seed, tuple(assumptions))
        if data is not None:
            if shapes:
                logger.warning("--shape is ignored when --data gives the samples")
            first = _from_data(runner, model, data)
        else:
            decoder = search.decoder(shapes, {**(fixed_shapes or {}), **(second_shapes or {})})
            if decoder is not None:
                notes.append(decoder_note(decoder))
                return FeedPlan(decoder, notes)
            first = search.first(shapes, constants, notes, skip_hint)
        second = search.second(first, second_shapes, fixed_shapes, notes)
    return FeedPlan([first] if second is None else [first, second], notes)


# (source, batch, cached tokens, new tokens) of a decoder's two profiles: a prefill, and a chunk
# after a past at a batch above 1, which no decode loop at batch 1 reaches; for a decoder whose
# calls are fixed (a decode-step export's input_ids [batch, 1], a pinned cache), a call after a
# past and one after a longer past. `StepDims.fit` puts every fixed dim in place.
DECODER_PROFILES = (("decoder prefill", 1, 0, 8), ("decoder chunk after a past", 3, 7, 5))
DECODER_STEP_PROFILES = (
    ("decoder step after a past", 1, 8, 1),
    ("decoder step after a longer past", 3, 37, 1),
)


def decoder_note(profiles: Sequence[Profile]) -> str:
    """What a decoder was validated at, for the report's notes."""
    described = []
    for p in profiles:
        assert p.call is not None  # a decoder's profiles are calls
        batch, past, new = p.call
        described.append(f"{p.source} (batch {batch}, {past} cached + {new} new tokens)")
    note = "a decoder (KV-cache inputs and outputs): validated at " + "; ".join(described)
    if len(profiles) == 1:
        note += "; one call shape only: its inputs fix every dim of a call"
    return note


# --------------------------------------------------------------------------- the first profile


def _from_data(runner: Runner, model: onnx.ModelProto, data: SampleData) -> Profile:
    feeds = load_samples(data, model)
    expected = []
    for i, feed in enumerate(feeds):
        try:
            expected.append(runner.run(feed))
        except ModelRunError as exc:
            if exc.stage == "load":
                raise
            raise InferccError(
                f"the original model fails on sample {i} of --data {data_label(data)!r}: "
                f"{exc.detail} "
                f"(inputs: {describe_feeds(feed)})",
                "give samples the original model accepts",
            ) from None
    return Profile("data", feeds, expected)


@dataclass
class _Attempt:
    source: str
    symbols: dict[SymbolKey, int]
    values: dict[str, float]


def _tried_text(model: onnx.ModelProto, shapes: Shapes | None, tried: list[_Attempt]) -> str:
    """`n at 8, 16, ...; sr = 16000, 8000`: the sizes and values tried after the defaults."""
    labels = {k: s.label for k, s in free_symbols(model, shapes).items()}
    sizes: dict[str, list[int]] = {}
    values: dict[str, list[float]] = {}
    for attempt in tried:
        for key, size in attempt.symbols.items():
            sizes.setdefault(labels.get(key, str(key)), [])
            if size not in sizes[labels.get(key, str(key))]:
                sizes[labels.get(key, str(key))].append(size)
        for name, value in attempt.values.items():
            if value not in values.setdefault(name, []):
                values[name].append(value)
    parts = [f"{k} at {', '.join(map(str, v))}" for k, v in sizes.items()]
    parts += [f"{k} = {', '.join(map(str, v))}" for k, v in values.items()]
    return "; ".join(parts)


def _first_attempts(
    model: onnx.ModelProto, shapes: Shapes | None, constants: Mapping[str, np.ndarray] | None
) -> Iterator[_Attempt]:
    """The defaults, then each size of the ladder with each set of compared values."""
    free = free_symbols(model, shapes)
    sized = [key for key, sym in free.items() if not sym.batch_like]
    candidates = compared_values(model, constants)
    value_sets: list[dict[str, float]] = [{}]
    for i in range(max((len(v) for v in candidates.values()), default=0)):
        value_sets.append({n: v[min(i, len(v) - 1)] for n, v in candidates.items()})
    sizes: list[int | None] = [None]
    if sized:
        defaults = {free[k].default for k in sized}
        ladder = [*compared_sizes(model, constants), DEFAULT_DIM, *LADDER]
        sizes += [s for s in dict.fromkeys(ladder) if s not in defaults]
    for size in sizes:
        for values in value_sets:
            symbols = {} if size is None else dict.fromkeys(sized, size)
            source = "ladder" if size is not None or values else "pinned" if shapes else "default"
            yield _Attempt(source, symbols, values)


def _degenerate(expected: Mapping[str, Any]) -> list[str]:
    """The float outputs that are near-constant on one feed."""
    return [n for n, v in expected.items() if isinstance(v, np.ndarray) and degenerate(v)]


def _names(names: Sequence[str]) -> str:
    quoted = ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
    return f"output{'s' if len(names) > 1 else ''} {quoted} {'are' if len(names) > 1 else 'is'}"


def _ladder_note(failure: tuple[Feeds, ModelRunError], profile: Profile, tried: int) -> str:
    feeds, exc = failure
    return (
        f"the original model fails on the default inputs ({describe_feeds(feeds)}: "
        f"{exc.detail}); validated at {profile.describe()} instead (attempt {tried} of the "
        "size and value ladder)"
    )


def _original_fails(
    failures: list[tuple[Feeds, ModelRunError]], tried: str, skip_hint: str | None
) -> InferccError:
    if not failures:
        return InferccError(
            "the original model has no input feed small enough to validate with",
            "pin smaller shapes with --shape NAME=DIMS, or give samples with --data DIR",
        )
    feeds, exc = failures[0]
    others = f"; it fails with {tried} too" if tried else ""
    hint = "pin shapes with --shape NAME=DIMS, or give samples it accepts with --data DIR"
    if skip_hint:
        hint = (
            "pin shapes with --shape NAME=DIMS, give samples it accepts with --data DIR, or "
            f"skip validation with {skip_hint}"
        )
    return InferccError(
        f"the original model fails in onnxruntime on the generated inputs "
        f"({describe_feeds(feeds)}): "
        f"{exc.detail}{others}",
        hint,
    )


# --------------------------------------------------------------------------- the second profile


def second_values(value: int) -> list[int]:
    """The values a symbol of first value `value` is tried at in the second profile."""
    if value <= 1:
        found = [3, 2]
    else:
        found = [value + 29, value + 32, value // 2, value * 2]
    return [v for v in dict.fromkeys(found) if v >= 1 and v != value]


@dataclass
class _Search:
    """What every trial feed shares: the original's session, its graph, the seed and the
    assumptions generated feeds honour. The second profile's trials also share the first
    profile, the pinned shapes and a budget of attempts (`_Second`)."""

    runner: Runner
    model: onnx.ModelProto
    seed: int
    assumptions: tuple[str, ...]

    def inputs(self, shapes: Shapes | None, seed: int, symbols, values=None) -> Feeds:
        return honour(make_inputs(self.model, shapes, seed, symbols, values), self.assumptions)

    # -- the first profile ----------------------------------------------------------------

    def first(
        self,
        shapes: Shapes | None,
        constants: Mapping[str, np.ndarray] | None,
        notes: list[str],
        skip_hint: str | None,
    ) -> Profile:
        """The first feed the original runs on: the defaults, else the ladder."""
        failures: list[tuple[Feeds, ModelRunError]] = []
        tried: list[_Attempt] = []
        attempts = _first_attempts(self.model, shapes, constants)
        for attempt in attempts:
            if len(tried) >= MAX_FIRST_ATTEMPTS:
                break
            feeds = self.inputs(shapes, self.seed, attempt.symbols, attempt.values)
            if failures and feed_bytes(feeds) > MAX_FEED_BYTES:
                continue
            tried.append(attempt)
            try:
                expected = self.runner.run(feeds)
            except ModelRunError as exc:
                if exc.stage == "load":
                    raise
                failures.append((feeds, exc))
                continue
            profile = Profile(attempt.source, [feeds], [expected], attempt.values)
            if failures:
                notes.append(_ladder_note(failures[0], profile, len(tried)))
            flat = _degenerate(expected)
            if flat and attempt.symbols == {}:
                return self._varied(profile, flat, attempts, notes)
            return profile
        raise _original_fails(failures, _tried_text(self.model, shapes, tried), skip_hint)

    def _varied(
        self, first: Profile, flat: list[str], attempts: Iterator[_Attempt], notes: list[str]
    ) -> Profile:
        """A feed of the ladder at which no output is near-constant, else `first`."""
        tried = 0
        for attempt in attempts:
            if tried >= MAX_DEGENERATE_ATTEMPTS:
                break
            if attempt.values or any(v > MAX_DEGENERATE_SIZE for v in attempt.symbols.values()):
                continue
            feeds = self.inputs(None, self.seed, attempt.symbols, attempt.values)
            if feed_bytes(feeds) > MAX_FEED_BYTES:
                continue
            tried += 1
            try:
                expected = self.runner.run(feeds)
            except ModelRunError:
                continue
            if not _degenerate(expected):
                profile = Profile("ladder", [feeds], [expected], attempt.values)
                notes.append(
                    f"on the default inputs ({first.describe()}) {_names(flat)} near-constant; "
                    f"validated at {profile.describe()} instead, where every output varies"
                )
                return profile
        if tried:
            notes.append(
                f"{_names(flat)} near-constant on the generated inputs ({first.describe()} and "
                f"{tried} other size(s) of the ladder); give --data for a real check"
            )
        return first

    # -- a decoder --------------------------------------------------------------------------

    def decoder(self, shapes: Shapes | None, second_shapes: Shapes | None) -> list[Profile] | None:
        """A decoder with KV-cache I/O (`infercc.analysis.decoder`) whose inputs are all in its
        signature: its two profiles (DECODER_PROFILES, or DECODER_STEP_PROFILES where a
        call's tokens or cache length are fixed), every dim the model declares static or
        `shapes` pins (the second: `second_shapes`) in place, the attention mask as long as
        the cache and the new tokens together and the positions following the cache, which
        random dims never are; None where it is no such decoder or the original fails on
        them (the generic search follows). Pins the model contradicts are refused as
        everywhere (`resolve_shapes`)."""
        sig = decoder_signature(self.model)
        if sig is None:
            return None
        if {i.name for i in real_inputs(self.model)} != sig.inputs:
            return None
        if set(shapes or {}) - sig.inputs:
            resolve_shapes(self.model, shapes)  # unknown names: refused as everywhere
        profiles: list[Profile] = []
        for i, pins in enumerate((shapes, second_shapes)):
            fixed = pinned_signature(self.model, pins)
            assert fixed is not None
            table = DECODER_PROFILES if fixed.fixed.prefill else DECODER_STEP_PROFILES
            source, batch, past, new = table[i]
            call = fixed.fixed.fit(batch, past, new)
            if any(p.call == call for p in profiles):
                continue  # every dim of a call is fixed: one shape is all it takes
            rng = np.random.default_rng(self.seed + batch)
            feeds = honour(random_call(fixed, rng, *call), self.assumptions)
            try:
                expected = self.runner.run(feeds)
            except ModelRunError as exc:
                if exc.stage == "load":
                    raise
                return None
            profiles.append(Profile(source, [feeds], [expected], call=call))
        return profiles

    # -- the second profile ---------------------------------------------------------------

    def second(
        self,
        first: Profile,
        second_shapes: Shapes | None,
        fixed_shapes: Shapes | None,
        notes: list[str],
    ) -> Profile | None:
        model = self.model
        base = symbol_values(model, first.feeds[0])
        if not base:
            return None  # no symbolic dimension: one shape is all the model has
        seen = [symbol_values(model, feeds) for feeds in first.feeds]
        if not second_shapes and all(len({s.get(k) for s in seen}) > 1 for k in base):
            return None  # the samples already hold two values of every symbolic dimension
        fixed = dict(fixed_shapes or {})
        pins = {**fixed, **dict(second_shapes or {})}
        varying = [key for key in free_symbols(model, pins) if key in base]
        if fixed and not varying and pins.keys() == fixed.keys():
            return None  # every symbolic dimension is fixed: the candidate has one shape
        trials = _Second(self, first, pins)
        pinned = None
        if pins.keys() != fixed.keys():
            pinned = trials.run(dict(base), counted=False)
            if pinned is None:
                raise InferccError(
                    "the original model fails at the second shape profile --shape pins "
                    f"({', '.join(f'{n}={list(s)}' for n, s in pins.items() if n not in fixed)})",
                    "give a range NAME=MIN:OPT:MAX the original model accepts at MIN, OPT and MAX",
                )
            pinned.source = "pinned range"
            if not varying:
                return pinned
        found = trials.derive(base, varying, notes)
        return found if found is not None else pinned


@dataclass
class _Second:
    """The trials of one second profile: feeds at other values of the symbols, inputs whose
    shape stays keeping the first profile's values, within MAX_SECOND_ATTEMPTS."""

    search: _Search
    first: Profile
    pins: dict[str, tuple[int, ...]]
    budget: int = MAX_SECOND_ATTEMPTS

    def derive(
        self, base: dict[SymbolKey, int], varying: Sequence[SymbolKey], notes: list[str]
    ) -> Profile | None:
        symbols = free_symbols(self.search.model, None)
        options = {k: second_values(base[k]) for k in varying}
        for j in range(max((len(v) for v in options.values()), default=0)):
            chosen = {k: v[min(j, len(v) - 1)] for k, v in options.items()}
            found = self.run({**base, **chosen})
            if found is not None:
                return found
        alone: dict[SymbolKey, int] = {}
        for key, values in options.items():
            for value in values:
                if self.run({**base, key: value}) is not None:
                    alone[key] = value
                    break
        found, kept = self.combine(base, alone)
        fixed = [k for k in varying if k not in kept]
        label = {k: symbols[k].label if k in symbols else str(k) for k in varying}
        tried = "; ".join(f"{label[k]} at {', '.join(map(str, options[k]))}" for k in fixed)
        if found is not None and not fixed:
            return found
        if found is None:
            notes.append(
                "validated at one shape profile only: the original model runs at no second "
                f"shape tried ({tried}); pin one with --shape NAME=MIN:OPT:MAX"
            )
            return None
        notes.append(
            f"the second shape profile varies {', '.join(label[k] for k in kept)} only: the "
            f"original model does not run with {tried}"
        )
        return found

    def combine(
        self, base: dict[SymbolKey, int], alone: dict[SymbolKey, int]
    ) -> tuple[Profile | None, list[SymbolKey]]:
        """The symbols that vary alone, together as far as the original runs (greedy)."""
        found: Profile | None = None
        kept: list[SymbolKey] = []
        for key, value in alone.items():
            trial = self.run({**base, **{k: alone[k] for k in kept}, key: value})
            if trial is not None:
                found, kept = trial, [*kept, key]
        return found, kept

    def run(self, symbols: dict[SymbolKey, int], counted: bool = True) -> Profile | None:
        """A second-profile feed at `symbols` (inputs whose shape is the first profile's keep
        its values), if the original runs on it."""
        if counted:
            if self.budget <= 0:
                return None
            self.budget -= 1
        first = self.first.feeds[0]
        feeds = self.search.inputs(self.pins, self.search.seed + 1, symbols)
        for name, array in first.items():
            if name in feeds and np.shape(feeds[name]) == np.shape(array):
                feeds[name] = array
        if not feeds or feed_bytes(feeds) > MAX_FEED_BYTES:
            return None
        if all(np.shape(feeds[n]) == np.shape(a) for n, a in first.items() if n in feeds):
            return None  # the same shapes as the first profile: nothing new
        try:
            expected = self.search.runner.run(feeds)
        except ModelRunError as exc:
            if exc.stage == "load":
                raise
            logger.debug("second profile %s: the original fails: %s", symbols, exc.detail)
            return None
        return Profile("derived", [feeds], [expected], dict(self.first.values))


def reference_graph(reference: ModelSource) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The reference's graph for building feeds (weights in the file are not read) and its
    small main-graph initializers (for `infercc.data.hints`)."""
    from infercc.check.compare import _existing_path
    from infercc.data.hints import skeleton_constants
    from infercc.ir.wire import read_model

    if isinstance(reference, onnx.ModelProto):
        return reference, {}
    if isinstance(reference, bytes):
        return onnx.load_model_from_string(reference), {}
    path = _existing_path(reference)
    try:
        model, slices = read_model(Path(path))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InferccError(
            f"cannot read ONNX model {path!r}: {exc}", "is it an .onnx file?"
        ) from exc
    return model, skeleton_constants(model, slices)
