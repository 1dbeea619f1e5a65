"""A decoder's calibration and evaluation samples: the calls a generation loop makes.

A decoder's sample (`infercc.analysis.decoder`) is one call of it: new tokens, the cache
before them, the mask and the positions. Samples start as prompts, token ids [batch, T] (a
`--data` sample's `input_ids`, or random ids), and are split into calibration and held-out
prompts before they become calls, so no prompt is on both sides. `prompt_calls` then feeds
each prompt as the calls the model takes:

- a decoder that takes any number of new tokens on an empty cache: one prefill per prompt,
  whose logits at every position are teacher-forced next-token predictions;
- a decoder whose calls are fixed (a decode-step export's `input_ids` [batch, 1], or
  `--shape input_ids=BxN`): the prompt in calls of that many tokens, the first on an empty
  cache and each later one on the presents of the call before, computed by the original
  model here, so every call sees the cache a real generation would have made;
- a decoder whose cache length is fixed too (a pinned cache, a static mask): calls after a
  random cache of that length (normal, 0.5), the only cache it takes.

Random prompts (no `--data`) are `RANDOM_PROMPTS` of `RANDOM_PROMPT` tokens for a prefill, of
`STEP_PROMPT` tokens (rounded up to whole calls) for fixed calls, at the batch the model fixes
(else 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from infercc.analysis.decoder import DecoderSignature, prefill_feeds, random_call, step_inputs
from infercc.check.compare import Runner
from infercc.errors import InferccError

RANDOM_PROMPTS = 8
RANDOM_PROMPT = 64
STEP_PROMPT = 32
ORIGINAL = "the original model"

Feeds = dict[str, np.ndarray]


def random_prompts(
    sig: DecoderSignature, count: int = RANDOM_PROMPTS, seed: int = 0
) -> list[Feeds]:
    """`count` prompts of random token ids (module docstring), each `{input_ids: [b, T]}`."""
    if sig.vocab is None:
        raise InferccError(
            "the decoder's vocabulary size is unknown, so no random prompt can be made",
            "pass token-id samples with --data",
        )
    batch = sig.fixed.batch or 1
    if sig.fixed.prefill:
        length = RANDOM_PROMPT
    else:
        new = sig.fixed.fit(1, 0, STEP_PROMPT)[2]
        length = new * -(-STEP_PROMPT // new)
    rng = np.random.default_rng(seed)
    return [{sig.input_ids: rng.integers(0, sig.vocab, (batch, length))} for _ in range(count)]


def prompt_skeleton(skeleton: onnx.ModelProto, sig: DecoderSignature) -> onnx.ModelProto:
    """The skeleton with `input_ids` its only input, [batch, prompt]: what a decoder's sample
    holds (a decode-step export's [batch, 1] would refuse a prompt; `prompt_calls` fits the
    batch)."""
    reduced = onnx.ModelProto()
    reduced.CopyFrom(skeleton)
    keep = [vi for vi in reduced.graph.input if vi.name == sig.input_ids]
    del reduced.graph.input[:]
    reduced.graph.input.extend(keep)
    for vi in reduced.graph.input:  # extend copied them
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 2:
            for dim, name in zip(dims, ("batch", "prompt"), strict=True):
                dim.Clear()
                dim.dim_param = name
    return reduced


def prompt_calls(src: str | Path, sig: DecoderSignature, prompts: Sequence[Feeds]) -> list[Feeds]:
    """The calls each prompt is fed as (module docstring), prompt by prompt."""
    ids = [_batched(sig, np.asarray(p[sig.input_ids]), i) for i, p in enumerate(prompts)]
    fixed = sig.fixed
    if fixed.prefill:
        return [prefill_feeds(sig, x) for x in ids]
    if fixed.past is not None or fixed.total is not None:
        rng = np.random.default_rng(0)
        return [_after_random_cache(sig, rng, x) for x in ids]
    new = fixed.fit(1, 0, 1)[2]
    for i, x in enumerate(ids):
        if x.shape[1] < new:
            raise InferccError(
                f"prompt {i} has {x.shape[1]} token(s), fewer than the {new} the decoder takes "
                "per call",
                f"give prompts of at least {new} tokens",
            )
    calls: list[Feeds] = []
    with Runner(src, role=ORIGINAL) as runner:
        for x in ids:
            calls += _chained(runner, sig, x, new)
    return calls


def _batched(sig: DecoderSignature, ids: np.ndarray, index: int) -> np.ndarray:
    """`ids` [b, T] at the batch the decoder fixes (a prompt's rows repeated to fill it)."""
    if ids.ndim != 2:
        raise InferccError(
            f"prompt {index}'s {sig.input_ids} has shape {list(ids.shape)}, not [batch, tokens]",
            f"give {sig.input_ids} as [batch, tokens]",
        )
    batch = sig.fixed.batch
    if batch is None or ids.shape[0] == batch:
        return ids
    return np.resize(ids, (batch, ids.shape[1]))


def _chained(runner: Runner, sig: DecoderSignature, ids: np.ndarray, new: int) -> list[Feeds]:
    """One prompt in calls of `new` tokens, each on the presents of the call before."""
    batch = ids.shape[0]
    usable = ids[:, : ids.shape[1] - ids.shape[1] % new]
    caches = {c.past: np.zeros(c.shape(batch, 0), c.dtype) for c in sig.caches}
    calls = []
    for start in range(0, usable.shape[1], new):
        feeds = step_inputs(sig, usable[:, start : start + new], start)
        feeds.update(caches)
        calls.append(feeds)
        if start + new < usable.shape[1]:
            outputs = runner.run(feeds)
            caches = {c.past: np.asarray(outputs[c.present], c.dtype) for c in sig.caches}
    return calls


def _after_random_cache(sig: DecoderSignature, rng: np.random.Generator, ids: np.ndarray) -> Feeds:
    batch, past, new = sig.fixed.fit(ids.shape[0], 0, ids.shape[1])
    feeds = random_call(sig, rng, batch, past, new)
    feeds[sig.input_ids] = _fit_tokens(ids, new).astype(sig.ids_dtype)
    return feeds


def _fit_tokens(ids: np.ndarray, new: int) -> np.ndarray:
    return ids[:, :new] if ids.shape[1] >= new else np.resize(ids, (ids.shape[0], new))
