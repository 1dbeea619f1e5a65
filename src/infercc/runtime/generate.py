"""Generation benchmark for decoders with a KV cache: TTFT, TPOT, decode tokens/s, peak memory.

`generate(path, new_tokens=N, prompt_len=P, batch=B)` runs a greedy loop under onnxruntime's
CPU provider with its default session options (what a user of onnxruntime gets), less one:
the idle intra-op threads do not spin between runs (`spinning=True`, `--spin`: onnxruntime's
default). In a decode loop the Python work between steps (the argmax, the next feeds) runs
while spinning threads hold the cores: on a 2-core host that ran 0.5x-0.7x the decode
tokens/s of the same session without spinning, each alone in its process (docs/bench.md);
onnxruntime-genai's Generator, which users compare with, steps without that Python work.

1. **prefill**: the prompt (P token ids per batch row; random in [0, vocab) with a fixed seed,
   or the caller's) with an empty cache (sequence length 0), `attention_mask` all ones and
   `position_ids` 0..P-1 when the model takes them; the next token is the argmax of the last
   position's logits. Its time, feeds built to token chosen, is the **time to first token**
   (TTFT).
2. **decode**: N - 1 more steps, each feeding the chosen token [B, 1], the mask grown by one,
   the next position, and every `present` output of the step before as the matching `past`
   input (kept as onnxruntime values: no copy through numpy). Each step's time is one **time
   per output token** (TPOT) sample. So N tokens come out: the first from the prefill.

The decoder's I/O comes from `infercc.analysis.decoder` (graph names and shapes only). Warm-up
generations run first (untimed; onnxruntime plans memory per shape), then `runs` timed ones;
the report gives TTFT (median over runs, and p90), TPOT p50/p90/p99 over every decode step of
every timed run, and decode tokens/s = B x (N - 1) / (time of the N - 1 decode steps), the
median over runs. The garbage collector is paused while timing.

**Peak memory** (`memory=True`): one more generation in a fresh process (spawned, so the
figure is this model's alone): its peak resident set (VmHWM on Linux, not `ru_maxrss`, which
exec keeps from the parent), the resident set before the model was loaded, and the
difference; plus the KV cache's bytes at the last step and the model file's bytes.

`compare(a, b, ...)` runs the two models **interleaved per step** on the same prompt: A's
prefill, B's prefill, then A's step 1, B's step 1, ... (both sides' sessions with thread
spinning off, as `bench --compare`), each side feeding its own greedy tokens back (after an
int4 quantization they may diverge; shapes stay equal, so the timing compares like with like).
It reports each side's figures, the ratios B / A of TTFT (per run), of TPOT (per step pair,
p10 / p50 / p90) and of decode tokens/s, and how many generated tokens agree.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from infercc.analysis.decoder import (
    DecoderSignature,
    prefill_feeds,
    require_decoder,
    step_inputs,
)
from infercc.data.signature import _format_dims, declared_dims
from infercc.errors import InferccError
from infercc.runtime.artifact import read_skeleton
from infercc.runtime.bench import host_info
from infercc.runtime.ort_support import load_refusal, session_options
from infercc.util import first_line, gc_paused, json_float

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
DEFAULT_PROMPT_LEN = 64
DEFAULT_RUNS = 3
DEFAULT_WARMUP = 1


# --------------------------------------------------------------------------- prompts


def read_prompt(path: str | os.PathLike[str]) -> np.ndarray:
    """Token ids from a file: integers separated by whitespace or commas (a text file), or a
    1-D / 2-D integer .npy array. One row is one prompt."""
    p = Path(path)
    if not p.is_file():
        raise InferccError(f"prompt file {str(p)!r} does not exist", "check the path")
    if p.suffix == ".npy":
        return _npy_prompt(p)
    text = p.read_text(errors="replace").replace(",", " ").split()
    try:
        ids = [int(t) for t in text]
    except ValueError:
        bad = next(t for t in text if not _is_int(t))
        raise InferccError(
            f"prompt file {str(p)!r} holds {bad[:20]!r}, not a token id",
            "write integer token ids separated by spaces, commas or newlines (no tokenizer "
            "runs here)",
        ) from None
    if not ids:
        raise InferccError(f"prompt file {str(p)!r} holds no token id", "write at least one")
    return np.asarray(ids, np.int64)[None, :]


def _is_int(token: str) -> bool:
    try:
        int(token)
    except ValueError:
        return False
    return True


def _npy_prompt(p: Path) -> np.ndarray:
    try:
        ids = np.load(p, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InferccError(
            f"cannot read {str(p)!r}: {first_line(exc)}", "save ids with np.save"
        ) from None
    if ids.dtype.kind not in "iu" or ids.ndim not in (1, 2) or ids.size == 0:
        raise InferccError(
            f"{str(p)!r} holds a {ids.dtype} array of shape {list(ids.shape)}, not token ids",
            "save a 1-D or 2-D integer array",
        )
    return ids.astype(np.int64).reshape(-1 if ids.ndim == 1 else ids.shape[0], ids.shape[-1])


@dataclass
class Plan:
    """What one generation does: the prompt [batch, prompt_len] and the tokens to make."""

    prompt: np.ndarray
    new_tokens: int

    @property
    def batch(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.shape[1])


def make_plan(
    sig: DecoderSignature,
    new_tokens: int,
    prompt_len: int | None = None,
    batch: int | None = None,
    prompt: np.ndarray | None = None,
    seed: int = 0,
) -> Plan:
    """Check the options and build the prompt (random ids in [0, vocab) unless given)."""
    if new_tokens < 1:
        raise InferccError(f"--generate {new_tokens} is not positive", "generate 1 or more")
    if batch is not None and batch < 1:
        raise InferccError(f"--batch {batch} is not positive", "e.g. --batch 1")
    if prompt_len is not None and prompt_len < 1:
        raise InferccError(f"--prompt-len {prompt_len} is not positive", "e.g. --prompt-len 64")
    if sig.fixed.batch is not None:
        if batch is not None and batch != sig.fixed.batch:
            raise InferccError(
                f"--batch {batch}: input {sig.input_ids!r} is declared with batch "
                f"{sig.fixed.batch}",
                f"drop --batch (it is {sig.fixed.batch}) or export with a dynamic batch axis",
            )
        batch = sig.fixed.batch
    if prompt is not None:
        return Plan(_sized_prompt(sig, prompt, prompt_len, batch), int(new_tokens))
    if sig.vocab is None:
        raise InferccError(
            f"the vocabulary size is unknown (output {sig.logits!r} has no fixed last dim)",
            "give the prompt as token ids with --prompt FILE",
        )
    rng = np.random.default_rng(seed)
    shape = (batch or 1, prompt_len or DEFAULT_PROMPT_LEN)
    return Plan(rng.integers(0, sig.vocab, shape, dtype=np.int64), int(new_tokens))


def _sized_prompt(
    sig: DecoderSignature, prompt: np.ndarray, prompt_len: int | None, batch: int | None
) -> np.ndarray:
    ids = np.asarray(prompt, np.int64)
    if prompt_len is not None:
        if ids.shape[1] < prompt_len:
            raise InferccError(
                f"--prompt-len {prompt_len} is longer than the prompt file's "
                f"{ids.shape[1]} token(s)",
                "drop --prompt-len (the whole file is the prompt) or give a longer prompt",
            )
        ids = ids[:, :prompt_len]
    if batch is not None and batch != ids.shape[0]:
        if ids.shape[0] != 1:
            raise InferccError(
                f"--batch {batch} differs from the prompt file's {ids.shape[0]} rows",
                "give one row (repeated over the batch) or as many rows as --batch",
            )
        ids = np.repeat(ids, batch, axis=0)
    if sig.vocab is not None and (ids.min() < 0 or ids.max() >= sig.vocab):
        raise InferccError(
            f"the prompt holds token id {int(ids.max() if ids.max() >= sig.vocab else ids.min())}"
            f", outside the vocabulary [0, {sig.vocab})",
            "use ids of this model's tokenizer",
        )
    return ids


# --------------------------------------------------------------------------- the loop


class Decoder:
    """One onnxruntime session of a decoder, stepping a greedy loop."""

    def __init__(self, path: Path, sig: DecoderSignature, spinning: bool = False):
        self.sig = sig
        self.path = path
        options = session_options()
        options.log_severity_level = 3
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise load_refusal(repr(str(path)), exc) from exc
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.logits_index = self.outputs.index(sig.logits)
        self.present_index = {c.past: self.outputs.index(c.present) for c in sig.caches}
        self.stepwise = sig.fixed.new == 1  # a decode-step graph: the prompt token by token

    def _run(self, feeds: dict[str, Any]) -> list[ort.OrtValue]:
        values = {
            k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
            for k, v in feeds.items()
        }
        try:
            return self.session.run_with_ort_values(self.outputs, values)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InferccError(
                f"onnxruntime failed to run {str(self.path)!r}: {first_line(exc)}",
                self._fed_shapes(values),
            ) from exc

    def _fed_shapes(self, values: dict[str, ort.OrtValue]) -> str:
        """What was fed, against what the model declares, input by input."""
        declared = {i.name: i.shape for i in self.session.get_inputs()}
        parts = [
            f"{name} {list(v.shape())} (declared {declared.get(name)})"
            for name, v in values.items()
        ]
        return "fed " + "; ".join(parts)

    def _next(self, outs: list[ort.OrtValue]) -> tuple[np.ndarray, dict[str, ort.OrtValue]]:
        logits = outs[self.logits_index].numpy()
        tokens = logits[:, -1, :].argmax(axis=-1).astype(np.int64)[:, None]
        cache = {past: outs[i] for past, i in self.present_index.items()}
        return tokens, cache

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, dict[str, ort.OrtValue]]:
        """The first token after `prompt`: one call, or (a graph whose `input_ids` is fixed at
        one token) one call per prompt token, each feeding the cache of the one before."""
        if not self.stepwise:
            return self._next(self._run(prefill_feeds(self.sig, prompt)))
        tokens, cache = self._next(self._run(prefill_feeds(self.sig, prompt[:, :1])))
        for i in range(1, prompt.shape[1]):
            tokens, cache = self.step(prompt[:, i : i + 1], cache, i)
        return tokens, cache

    def step(
        self, tokens: np.ndarray, cache: dict[str, ort.OrtValue], past_length: int
    ) -> tuple[np.ndarray, dict[str, ort.OrtValue]]:
        feeds: dict[str, Any] = dict(step_inputs(self.sig, tokens, past_length))
        feeds.update(cache)
        return self._next(self._run(feeds))


@dataclass
class _Timed:
    """One generation: its tokens [batch, N], the prefill time and each step's (ms)."""

    tokens: np.ndarray
    ttft_ms: float
    steps_ms: list[float]
    kv_bytes: int


def _ms_since(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def run_generation(decoder: Decoder, plan: Plan) -> _Timed:
    """One greedy generation of `plan.new_tokens` tokens, timed per step."""
    return _lockstep([decoder], plan)[0]


def _lockstep(decoders: Sequence[Decoder], plan: Plan) -> list[_Timed]:
    """Generate with each decoder, step by step in turn (one decoder: a plain loop)."""
    states, caches = [], []
    for d in decoders:
        t0 = time.perf_counter_ns()
        tokens, cache = d.prefill(plan.prompt)
        states.append(_Timed(tokens, _ms_since(t0), [], 0))
        caches.append(cache)
    for step in range(1, plan.new_tokens):
        past = plan.prompt_len + step - 1
        for i, (d, s) in enumerate(zip(decoders, states, strict=True)):
            t0 = time.perf_counter_ns()
            tokens, caches[i] = d.step(s.tokens[:, -1:], caches[i], past)
            s.steps_ms.append(_ms_since(t0))
            s.tokens = np.concatenate([s.tokens, tokens], axis=1)
    for s, cache in zip(states, caches, strict=True):
        s.kv_bytes = _cache_bytes(cache)
    return states


def _cache_bytes(cache: dict[str, ort.OrtValue]) -> int:
    total = 0
    for value in cache.values():
        shape = value.shape()
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(_np_type(value)).itemsize
    return total


def _np_type(value: ort.OrtValue) -> str:
    kind = value.data_type()  # e.g. "tensor(float)"
    return {"tensor(float)": "float32", "tensor(float16)": "float16"}.get(kind, "float32")


# --------------------------------------------------------------------------- reports


@dataclass
class MemoryFigures:
    """Peak resident memory of one generation in a fresh process, and its parts."""

    peak_rss_bytes: int
    baseline_rss_bytes: int
    kv_cache_bytes: int
    model_bytes: int

    @property
    def generation_bytes(self) -> int:
        return max(0, self.peak_rss_bytes - self.baseline_rss_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_rss_bytes": self.peak_rss_bytes,
            "baseline_rss_bytes": self.baseline_rss_bytes,
            "generation_rss_bytes": self.generation_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "model_bytes": self.model_bytes,
        }


@dataclass
class GenerationStats:
    """One model's figures over the timed generations."""

    ttft_ms: float  # median over runs
    ttft_p90_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    tpot_mean_ms: float
    decode_tokens_per_s: float  # median over runs
    steps: int
    runs: int
    tokens: list[list[int]]  # the first timed run's generated tokens, per batch row
    kv_cache_bytes: int
    memory: MemoryFigures | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ttft_ms": json_float(self.ttft_ms),
            "ttft_p90_ms": json_float(self.ttft_p90_ms),
            "tpot_p50_ms": json_float(self.tpot_p50_ms),
            "tpot_p90_ms": json_float(self.tpot_p90_ms),
            "tpot_p99_ms": json_float(self.tpot_p99_ms),
            "tpot_mean_ms": json_float(self.tpot_mean_ms),
            "decode_tokens_per_s": json_float(self.decode_tokens_per_s),
            "steps": self.steps,
            "runs": self.runs,
            "tokens": self.tokens,
            "kv_cache_bytes": self.kv_cache_bytes,
            "memory": None if self.memory is None else self.memory.to_dict(),
        }


@dataclass
class GenerateReport:
    path: str
    batch: int
    prompt_len: int
    new_tokens: int
    warmup: int
    stats: GenerationStats
    decoder: dict[str, Any]
    host: dict[str, Any]
    spinning: bool = False  # onnxruntime's idle threads spun between steps
    prefill: str = "one call"  # or "token by token": input_ids fixed at one token

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "batch": self.batch,
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "warmup": self.warmup,
            "spinning": self.spinning,
            "prefill": self.prefill,
            **self.stats.to_dict(),
            "decoder": self.decoder,
            "host": self.host,
        }


@dataclass
class Ratio:
    """B / A per pair: median, p10, p90."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Ratio:
        p10, med, p90 = (float(v) for v in np.percentile(np.asarray(values), [10, 50, 90]))
        return cls(med, p10, p90)

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "p10": self.p10, "p90": self.p90}


@dataclass
class GenerateCompareReport:
    path_a: str
    path_b: str
    batch: int
    prompt_len: int
    new_tokens: int
    a: GenerationStats
    b: GenerationStats
    ttft_ratio: Ratio  # B / A per run
    tpot_ratio: Ratio  # B / A per step pair
    tokens_per_s_ratio: float  # B / A of the medians
    token_agreement: float  # fraction of generated tokens equal (first timed run)
    host: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": {"path": self.path_a, **self.a.to_dict()},
            "b": {"path": self.path_b, **self.b.to_dict()},
            "batch": self.batch,
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "ttft_ratio": self.ttft_ratio.to_dict(),
            "tpot_ratio": self.tpot_ratio.to_dict(),
            "tokens_per_s_ratio": self.tokens_per_s_ratio,
            "token_agreement": self.token_agreement,
            "host": self.host,
        }


def _summarize(runs: list[_Timed], batch: int, memory: MemoryFigures | None) -> GenerationStats:
    ttft = np.asarray([r.ttft_ms for r in runs])
    steps = np.asarray([t for r in runs for t in r.steps_ms]) if runs[0].steps_ms else None
    per_run = [batch * len(r.steps_ms) / (sum(r.steps_ms) / 1e3) for r in runs if r.steps_ms]
    p50 = p90 = p99 = mean = float("nan")
    if steps is not None:
        p50, p90, p99 = (float(v) for v in np.percentile(steps, [50, 90, 99]))
        mean = float(steps.mean())
    return GenerationStats(
        ttft_ms=float(np.median(ttft)),
        ttft_p90_ms=float(np.percentile(ttft, 90)),
        tpot_p50_ms=p50,
        tpot_p90_ms=p90,
        tpot_p99_ms=p99,
        tpot_mean_ms=mean,
        decode_tokens_per_s=float(np.median(per_run)) if per_run else float("nan"),
        steps=len(runs[0].steps_ms),
        runs=len(runs),
        tokens=runs[0].tokens.tolist(),
        kv_cache_bytes=runs[0].kv_bytes,
        memory=memory,
    )


# --------------------------------------------------------------------------- entry points


def _check_counts(warmup: int, runs: int) -> None:
    if runs < 1:
        raise InferccError(f"{runs} timed generation(s)", "time at least one (--iters 1)")
    if warmup < 0:
        raise InferccError(f"--warmup {warmup} is negative", "use 0 or more warm-up generations")


def open_decoder(path: str | os.PathLike[str], spinning: bool = False) -> Decoder:
    p = Path(path)
    if p.is_dir():
        raise InferccError(
            f"{str(p)!r} is a directory: --generate runs a decoder .onnx file",
            "pass the artifact's model.onnx",
        )
    skeleton = read_skeleton(p)
    sig = require_decoder(skeleton, str(p))
    _check_drivable(sig, skeleton)
    return Decoder(p, sig, spinning)


def _check_drivable(sig: DecoderSignature, model: Any) -> None:
    """Refuse a decoder whose declared shapes leave no greedy loop: `input_ids` fixed at more
    than one token (a step feeds one), or a mask of fixed length (each step grows it; a cache
    of fixed length is refused by its signature). The error names the input and its shape."""
    declared = {vi.name: declared_dims(vi) for vi in model.graph.input}

    def shape(name: str) -> str:
        return _format_dims(declared.get(name) or [])

    fixed = sig.fixed
    if fixed.new is not None and fixed.new != 1:
        raise InferccError(
            f"input {sig.input_ids!r} is declared {shape(sig.input_ids)}: {fixed.new} new "
            "tokens per call, but each decode step feeds 1",
            "export the decoder with a dynamic sequence axis on input_ids (or one fixed at 1: "
            "then the prompt is fed one token at a time)",
        )
    if fixed.total is not None and sig.attention_mask is not None:
        raise InferccError(
            f"input {sig.attention_mask!r} is declared {shape(sig.attention_mask)}: a fixed "
            "mask length, but each step adds one token",
            "export the decoder with a dynamic axis 1 on attention_mask",
        )


def generate(
    path: str | os.PathLike[str],
    new_tokens: int,
    prompt_len: int | None = None,
    batch: int | None = None,
    prompt: np.ndarray | None = None,
    warmup: int = DEFAULT_WARMUP,
    runs: int = DEFAULT_RUNS,
    seed: int = 0,
    memory: bool = True,
    on_progress: Progress | None = None,
    spinning: bool = False,
) -> GenerateReport:
    """Benchmark greedy generation of `new_tokens` tokens (module docstring); `spinning`:
    onnxruntime's idle threads spin between steps, its default."""
    _check_counts(warmup, runs)
    decoder = open_decoder(path, spinning=spinning)
    plan = make_plan(decoder.sig, new_tokens, prompt_len, batch, prompt, seed)
    total = warmup + runs + (1 if memory else 0)
    for i in range(warmup):
        run_generation(decoder, plan)
        _tick(on_progress, i + 1, total)
    timed = []
    with gc_paused():
        for i in range(runs):
            timed.append(run_generation(decoder, plan))
            _tick(on_progress, warmup + i + 1, total)
    figures = measure_memory(Path(path), plan) if memory else None
    _tick(on_progress, total, total)
    stats = _summarize(timed, plan.batch, figures)
    return GenerateReport(
        str(path),
        plan.batch,
        plan.prompt_len,
        plan.new_tokens,
        warmup,
        stats,
        decoder.sig.to_dict(),
        host_info(),
        spinning,
        "token by token" if decoder.stepwise else "one call",
    )


def compare_generation(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    new_tokens: int,
    prompt_len: int | None = None,
    batch: int | None = None,
    prompt: np.ndarray | None = None,
    warmup: int = DEFAULT_WARMUP,
    runs: int = DEFAULT_RUNS,
    seed: int = 0,
    memory: bool = True,
    on_progress: Progress | None = None,
) -> GenerateCompareReport:
    """Race decoder B against decoder A, interleaved per step (module docstring)."""
    _check_counts(warmup, runs)
    side_a, side_b = open_decoder(a, spinning=False), open_decoder(b, spinning=False)
    _check_same_decoders(side_a.sig, side_b.sig)
    plan = make_plan(side_a.sig, new_tokens, prompt_len, batch, prompt, seed)
    total = warmup + runs + (2 if memory else 0)
    for i in range(warmup):
        _lockstep([side_a, side_b], plan)
        _tick(on_progress, i + 1, total)
    pairs = []
    with gc_paused():
        for i in range(runs):
            pairs.append(_lockstep([side_a, side_b], plan))
            _tick(on_progress, warmup + i + 1, total)
    mem_a = measure_memory(Path(a), plan) if memory else None
    mem_b = measure_memory(Path(b), plan) if memory else None
    _tick(on_progress, total, total)
    runs_a, runs_b = [p[0] for p in pairs], [p[1] for p in pairs]
    stats_a = _summarize(runs_a, plan.batch, mem_a)
    stats_b = _summarize(runs_b, plan.batch, mem_b)
    step_ratios = [
        tb / ta
        for ra, rb in zip(runs_a, runs_b, strict=True)
        for ta, tb in zip(ra.steps_ms, rb.steps_ms, strict=True)
    ]
    ttft_ratios = [rb.ttft_ms / ra.ttft_ms for ra, rb in zip(runs_a, runs_b, strict=True)]
    agree = float(np.mean(runs_a[0].tokens == runs_b[0].tokens))
    return GenerateCompareReport(
        str(a),
        str(b),
        plan.batch,
        plan.prompt_len,
        plan.new_tokens,
        stats_a,
        stats_b,
        Ratio.of(ttft_ratios),
        Ratio.of(step_ratios) if step_ratios else Ratio(float("nan"), float("nan"), float("nan")),
        stats_b.decode_tokens_per_s / stats_a.decode_tokens_per_s,
        agree,
        host_info(),
    )


def _check_same_decoders(a: DecoderSignature, b: DecoderSignature) -> None:
    if a.vocab != b.vocab or len(a.caches) != len(b.caches):
        raise InferccError(
            f"the decoders differ: vocab {a.vocab} vs {b.vocab}, {len(a.caches)} vs "
            f"{len(b.caches)} cache inputs",
            "compare two versions of the same decoder",
        )


def _tick(on_progress: Progress | None, done: int, total: int) -> None:
    if on_progress is not None:
        on_progress(done, total)


# --------------------------------------------------------------------------- memory


def measure_memory(path: Path, plan: Plan) -> MemoryFigures:
    """Peak RSS of one generation in a fresh Python process (`python -m
    infercc.runtime.generate MODEL PROMPT.npy N` prints the figures as JSON)."""
    with tempfile.TemporaryDirectory(prefix="infercc-mem-") as tmp:
        prompt = Path(tmp) / "prompt.npy"
        np.save(prompt, plan.prompt)
        cmd = [sys.executable, "-m", "infercc.runtime.generate", str(path), str(prompt)]
        done = subprocess.run(
            [*cmd, str(plan.new_tokens)], capture_output=True, text=True, check=False
        )
    try:
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InferccError(
            f"peak memory measurement failed: {tail}", "rerun with --debug"
        ) from None
    return MemoryFigures(
        int(figures["peak"]), int(figures["baseline"]), int(figures["kv"]), _model_bytes(path)
    )


def _probe_main(argv: Sequence[str]) -> None:
    """The child of `measure_memory`: load, generate once, print the figures."""
    path, prompt_file, new_tokens = argv
    baseline = _rss_now()
    decoder = open_decoder(path)
    timed = run_generation(decoder, Plan(np.load(prompt_file), int(new_tokens)))
    sys.stdout.write(json.dumps({"peak": _peak_rss(), "baseline": baseline, "kv": timed.kv_bytes}))


def _peak_rss() -> int:
    """This process's own peak resident set: VmHWM on Linux. ru_maxrss is kept across exec,
    so a child of a large parent would report the parent's peak (measured: every model of one
    bench run read the same 1016 MiB, the fp32 model's parent)."""
    try:
        with open("/proc/self/status") as f:
            hwm = next(line for line in f if line.startswith("VmHWM:"))
        return int(hwm.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model_bytes(path: Path) -> int:
    data = [p for p in path.parent.glob(path.name + ".data")] + [
        p for p in path.parent.glob(path.stem + ".onnx.data")
    ]
    return path.stat().st_size + sum(p.stat().st_size for p in set(data))


if __name__ == "__main__":
    _probe_main(sys.argv[1:])
