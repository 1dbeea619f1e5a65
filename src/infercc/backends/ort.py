"""The ONNX Runtime backend: per-shape autotuning of session settings, cached on disk.

What it tunes. An onnxruntime session is a model plus a configuration:

```
{"provider": "CPUExecutionProvider", "provider_options": {...},
 "session_options": {"graph_optimization_level", "intra_op_num_threads",
                     "inter_op_num_threads", "execution_mode"}}
```

`compile` picks one configuration per shape point. With no ranged profile there is one point,
`opt`; a ranged profile (`NAME=MIN:OPT:MAX`) gives up to three, `min`, `opt` and `max`, point k
taking every input's k-th shape (a fixed profile gives the same shape at every point; inputs
without a profile take `infercc.inputs.resolve_shapes` defaults, sharing symbols with the pinned
ones). Points with equal shapes are tuned once.

How. Coordinate descent, one pass: start from onnxruntime's defaults (ORT_ENABLE_ALL,
intra-op and inter-op threads 0 = onnxruntime decides, sequential), then sweep one knob at a
time, keeping the fastest configuration that validates before moving to the next knob:

1. provider: the target's providers onnxruntime has (`get_available_providers()`): the CPU
   provider for the `cpu` target; TensorRT and CUDA for GPU targets, in onnxruntime's order;
2. CUDA only: `cudnn_conv_algo_search` EXHAUSTIVE (the default) / HEURISTIC / DEFAULT;
3. CUDA only: TunableOp off / on (`tunable_op_enable`, `tunable_op_tuning_enable`); the kernel
   choices it makes (`session.get_tuning_results()`) are stored with the choice and handed back
   with `set_tuning_results` at load time;
4. graph optimization level: ORT_ENABLE_BASIC / EXTENDED / ALL;
5. intra-op threads: 1, half the cores, all cores, 0 (deduplicated);
6. execution mode: sequential, or parallel with one inter-op thread per core (only with more
   than one core: parallel changes nothing with a single inter-op thread).

A pass times 1 + sum over knobs of (values - 1) configurations instead of the product: on the
CPU 1 + 2 + 3 + 1 = 7 (6 on two cores, where half the cores is one thread) against 3 x 4 x 2 =
24; with CUDA 1 + 2 + 1 + 2 + 3 + 1 = 10 against 144. `candidate_count` computes it.

Timing: `options.warmup` untimed runs, then `options.iters` timed runs (`time.perf_counter`);
a configuration's figure is the median, in milliseconds. Validation: the last timed run's
outputs are compared with those of the reference configuration (CPU provider,
ORT_DISABLE_ALL) on the same random feeds, with `infercc.validate`'s element-wise rule (atol
1e-4 / rtol 1e-3 / cosine 0.9999 for fp32 graphs; 1e-2 / 1e-2 / 0.999 for fp16 and bf16;
5e-2 / 5e-2 / 0.99 for int8, whose fused integer kernels may round a step apart from Q/DQ
emulation; `options.extra` keys `atol`, `rtol`, `min_cosine` override). A configuration that
fails to load, to run or to validate is skipped and recorded with the reason.

The choice for a point is cached (`infercc.tuning.TuningCache`) under the model's hash, the
point's shapes, the onnxruntime version, the providers considered and the host fingerprint; a
hit reuses it without creating or timing any session (only saving the optimized model below
creates one). With `cache=None` every point is tuned. `options.tune=False` times nothing: a
point not in the cache takes onnxruntime's defaults (its `cache` field says "untuned").

Precision is a graph property: this backend runs what the graph says. The CPU provider runs
fp32, fp16 and int8 (Q/DQ) graphs, and bf16 ones where the CPU target lists bf16 (that is,
the CPU has bf16 instructions). On GPU targets the precisions are the target's, and only with
onnxruntime-gpu's CUDA provider present.

Files: `ort_config.json` (schema `infercc.ort_config/1`: per point its shapes, the chosen
configuration, median_ms, cache hit/miss and every candidate measured) and, when
`options.extra["save_optimized"]` is True (`--ort-optimized-model`) and the model's external
data is under 2 GB, `ort_optimized.onnx`: onnxruntime's own optimized graph for the default
point's provider and level (`SessionOptions.optimized_model_filepath`). Such a file is tied
to the machine and provider, so `load` uses it, with optimization off, only when the host
fingerprint and the onnxruntime version match those it was written with; otherwise it loads
`model.onnx`.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc import validate as _validate
from infercc.backends.base import (
    MODEL_FILE,
    Artifact,
    CompileOptions,
    Feeds,
    Runner,
    ShapeProfile,
    register_backend,
)
from infercc.errors import InferccError
from infercc.inputs import make_inputs, real_inputs, resolve_shapes
from infercc.ir.wire import read_model
from infercc.targets import Target
from infercc.util import first_line

try:
    import onnxruntime as ort
except ImportError:  # the core dependency, but a broken install must give a reason
    ort = None

log = logging.getLogger(__name__)

SCHEMA = "infercc.ort_config/1"
CONFIG_FILE = "ort_config.json"
OPTIMIZED_FILE = "ort_optimized.onnx"

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)
GPU_INSTALL_HINT = 'pip install "infercc[gpu]"'

LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
REFERENCE_LEVEL = "ORT_DISABLE_ALL"
CUDNN_SEARCH = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
EXTERNAL_DATA_LIMIT = 2 * 1024**3
POINT_NAMES = ("min", "opt", "max")

# (atol, rtol, min_cosine) per graph precision.
TOLERANCES = {
    "fp32": (1e-4, 1e-3, 0.9999),
    "fp16": (1e-2, 1e-2, 0.999),
    "bf16": (1e-2, 1e-2, 0.999),
    "int8": (5e-2, 5e-2, 0.99),
}

DEFAULT_SESSION_OPTIONS = {
    "graph_optimization_level": "ORT_ENABLE_ALL",
    "intra_op_num_threads": 0,
    "inter_op_num_threads": 0,
    "execution_mode": "ORT_SEQUENTIAL",
}
_TUNABLE_OFF = {"tunable_op_enable": "0", "tunable_op_tuning_enable": "0"}
_TUNABLE_ON = {"tunable_op_enable": "1", "tunable_op_tuning_enable": "1"}
# Provider options each provider starts from: onnxruntime's defaults, spelled out so that a
# knob value equal to the default is recognised as already measured.
_PROVIDER_DEFAULTS: dict[str, dict[str, str]] = {
    CPU: {},
    CUDA: {"cudnn_conv_algo_search": "EXHAUSTIVE", **_TUNABLE_OFF},
    TENSORRT: {},
}
_FALLBACKS = {TENSORRT: [CUDA, CPU], CUDA: [CPU], CPU: []}


# --------------------------------------------------------------------------- configurations


def default_config(provider: str = CPU) -> dict[str, Any]:
    """onnxruntime's default configuration on `provider`."""
    return {
        "provider": provider,
        "provider_options": dict(_PROVIDER_DEFAULTS.get(provider, {})),
        "session_options": dict(DEFAULT_SESSION_OPTIONS),
    }


def reference_config() -> dict[str, Any]:
    """What candidates are validated against: CPU provider, graph optimizations off."""
    config = default_config(CPU)
    config["session_options"]["graph_optimization_level"] = REFERENCE_LEVEL
    return config


def session_options(config: Mapping[str, Any]) -> tuple[Any, list[Any]]:
    """onnxruntime SessionOptions and the providers list for a configuration dict."""
    _require_ort()
    opts = ort.SessionOptions()
    settings = {**DEFAULT_SESSION_OPTIONS, **config.get("session_options", {})}
    level = settings["graph_optimization_level"]
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.intra_op_num_threads = int(settings["intra_op_num_threads"])
    opts.inter_op_num_threads = int(settings["inter_op_num_threads"])
    opts.execution_mode = getattr(ort.ExecutionMode, settings["execution_mode"])
    opts.log_severity_level = 3
    for key, value in config.get("session_config", {}).items():
        opts.add_session_config_entry(key, str(value))
    return opts, _providers(config)


def _providers(config: Mapping[str, Any]) -> list[Any]:
    provider = config.get("provider", CPU)
    options = {k: str(v) for k, v in config.get("provider_options", {}).items()}
    first = (provider, options) if options else provider
    return [first, *_FALLBACKS.get(provider, [CPU])]


def config_key(config: Mapping[str, Any]) -> str:
    """A configuration's identity (its canonical JSON)."""
    return json.dumps(config, sort_keys=True)


def _config_only(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: copy.deepcopy(record[k]) for k in ("provider", "provider_options", "session_options")
    }


# --------------------------------------------------------------------------- knobs


@dataclass(frozen=True)
class Knob:
    """One setting coordinate descent sweeps: each value is a patch of dotted paths."""

    name: str
    values: tuple[dict[str, Any], ...]
    provider: str | None = None  # the knob applies only to configurations on this provider

    def applies(self, config: Mapping[str, Any]) -> bool:
        return self.provider is None or config.get("provider") == self.provider


def apply_patch(config: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `config` with each dotted path of `patch` set to its value."""
    out = copy.deepcopy(dict(config))
    for path, value in patch.items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return out


def thread_counts(cores: int) -> list[int]:
    """Intra-op thread counts to try: 1, half the cores, all cores, 0 (default), deduplicated."""
    return list(dict.fromkeys([1, max(1, cores // 2), max(1, cores), 0]))


def knobs(providers: Sequence[str], cores: int) -> list[Knob]:
    """The knobs in sweep order for these candidate providers and core count."""
    found: list[Knob] = []
    if len(providers) > 1:
        found.append(Knob("provider", tuple(_provider_patch(p) for p in providers)))
    if CUDA in providers:
        found += _cuda_knobs()
    found.append(_patch_knob("graph_optimization_level", "session_options.", LEVELS))
    found.append(_patch_knob("intra_op_num_threads", "session_options.", thread_counts(cores)))
    if cores > 1:
        found.append(_execution_mode_knob(cores))
    return found


def _provider_patch(provider: str) -> dict[str, Any]:
    return {"provider": provider, "provider_options": dict(_PROVIDER_DEFAULTS.get(provider, {}))}


def _patch_knob(name: str, prefix: str, values: Sequence[Any], provider: str | None = None) -> Knob:
    return Knob(name, tuple({prefix + name: v} for v in values), provider)


def _cuda_knobs() -> list[Knob]:
    search = _patch_knob("cudnn_conv_algo_search", "provider_options.", CUDNN_SEARCH, CUDA)
    tunable = Knob(
        "tunable_op",
        tuple(
            {f"provider_options.{k}": v for k, v in s.items()} for s in (_TUNABLE_OFF, _TUNABLE_ON)
        ),
        CUDA,
    )
    return [search, tunable]


def _execution_mode_knob(cores: int) -> Knob:
    sequential = {
        "session_options.execution_mode": "ORT_SEQUENTIAL",
        "session_options.inter_op_num_threads": 0,
    }
    parallel = {
        "session_options.execution_mode": "ORT_PARALLEL",
        "session_options.inter_op_num_threads": cores,
    }
    return Knob("execution_mode", (sequential, parallel))


def candidate_providers(target_kind: str, available: Sequence[str]) -> list[str]:
    """Providers to consider: CPU for a CPU target; the GPU ones present for a GPU target."""
    if target_kind != "gpu":
        return [CPU] if CPU in available else []
    return [p for p in available if p in GPU_PROVIDERS]


def candidate_configs(providers: Sequence[str], cores: int) -> list[dict[str, Any]]:
    """Every configuration one descent pass could time if no knob changed the best: the
    default, then each knob's values applied to it (deduplicated, in sweep order)."""
    start = default_config(providers[0])
    configs = {config_key(start): start}
    for knob in knobs(providers, cores):
        base = start if knob.applies(start) else default_config(knob.provider or CPU)
        for patch in knob.values:
            config = apply_patch(base, patch)
            configs.setdefault(config_key(config), config)
    return list(configs.values())


def candidate_count(providers: Sequence[str], cores: int) -> int:
    """Configurations one pass times when the provider stays the first one."""
    start = default_config(providers[0])
    return 1 + sum(len(k.values) - 1 for k in knobs(providers, cores) if k.applies(start))


# --------------------------------------------------------------------------- descent


Evaluate = Callable[[dict[str, Any], str], dict[str, Any]]


def coordinate_descent(
    start: dict[str, Any],
    sweep: Sequence[Knob],
    evaluate: Evaluate,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """One pass of coordinate descent; returns (best record or None, every record).

    `evaluate(config, knob_name)` returns a record with `median_ms`, or `skipped` and why.
    Each knob's values are applied to the best configuration so far; a configuration already
    measured is not measured again.
    """
    configs = {config_key(start): start}
    records = {config_key(start): evaluate(start, "default")}
    best_key = config_key(start)
    for knob in sweep:
        if not knob.applies(configs[best_key]):
            continue
        base = configs[best_key]
        for patch in knob.values:
            config = apply_patch(base, patch)
            key = config_key(config)
            if key not in records:
                configs[key] = config
                records[key] = evaluate(config, knob.name)
                if _faster(records[key], records[best_key]):
                    best_key = key
    best = records[best_key]
    return (best if "median_ms" in best else None), list(records.values())


# A candidate replaces the best so far only when its median is lower by more than this
# fraction: timing noise on a busy machine must not move the choice away from onnxruntime's
# defaults (the first configuration measured) for a gain that is not there.
MIN_GAIN = 0.03


def _faster(record: Mapping[str, Any], best: Mapping[str, Any]) -> bool:
    if "median_ms" not in record:
        return False
    return "median_ms" not in best or record["median_ms"] < best["median_ms"] * (1 - MIN_GAIN)


# --------------------------------------------------------------------------- sessions and timing


def _require_ort() -> None:
    if ort is None:
        raise InferccError("onnxruntime is not installed", "pip install onnxruntime")


def _create_session(model: Path, config: Mapping[str, Any], save_to: Path | None = None) -> Any:
    """An InferenceSession for `config`; with `save_to`, onnxruntime writes its optimized graph."""
    opts, providers = session_options(config)
    if save_to is not None:
        opts.optimized_model_filepath = str(save_to)
    return ort.InferenceSession(str(model), opts, providers=providers)


def _time_runs(session: Any, feeds: Feeds, warmup: int, iters: int) -> tuple[float, list[Any]]:
    """(median latency in ms over `iters` timed runs after `warmup` runs, last outputs)."""
    for _ in range(max(0, warmup)):
        session.run(None, dict(feeds))
    times = []
    outputs: list[Any] = []
    for _ in range(max(1, iters)):
        start = time.perf_counter()
        outputs = session.run(None, dict(feeds))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, outputs


def _tuning_results(session: Any, config: Mapping[str, Any]) -> list[Any]:
    if config.get("provider_options", {}).get("tunable_op_enable") != "1":
        return []
    try:
        return list(session.get_tuning_results())
    except Exception as exc:  # onnxruntime raises its own exception types
        log.warning("could not read TunableOp results: %s", first_line(exc))
        return []


# --------------------------------------------------------------------------- validation


@dataclass
class _Trial:
    """What every candidate of one point is measured with."""

    model: Path
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    output_names: list[str]
    tolerance: tuple[float, float, float]  # atol, rtol, min cosine
    warmup: int
    iters: int


def tolerance(options: CompileOptions) -> tuple[float, float, float]:
    """(atol, rtol, min_cosine) for the graph's precision, with `options.extra` overrides."""
    atol, rtol, cosine = TOLERANCES.get(options.precision, TOLERANCES["fp32"])
    extra = options.extra
    return extra.get("atol", atol), extra.get("rtol", rtol), extra.get("min_cosine", cosine)


def _mismatch(trial: _Trial, outputs: Sequence[Any]) -> str | None:
    """Why `outputs` differ from the reference's beyond tolerance, or None."""
    actual = dict(zip(trial.output_names, outputs, strict=False))
    atol, rtol, min_cosine = trial.tolerance
    report = _validate.compare_outputs([trial.expected], [actual], atol, rtol, min_cosine)
    for metrics in report.failures():
        return f"output {metrics.name!r}: {metrics.reason}"
    return None


def _evaluate(trial: _Trial, config: dict[str, Any], knob: str) -> dict[str, Any]:
    """Create, time and validate one configuration; a record for ort_config's candidates."""
    record: dict[str, Any] = {"knob": knob, "config": copy.deepcopy(config)}
    try:
        session = _create_session(trial.model, config)
    except Exception as exc:  # onnxruntime raises its own exception types
        return {**record, "skipped": f"session failed: {first_line(exc)}"}
    try:
        median_ms, outputs = _time_runs(session, trial.feeds, trial.warmup, trial.iters)
    except Exception as exc:
        return {**record, "skipped": f"run failed: {first_line(exc)}"}
    reason = _mismatch(trial, outputs)
    if reason is not None:
        log.info("candidate %s rejected: %s", config_key(config), reason)
        return {**record, "skipped": f"outputs differ from the reference: {reason}"}
    record["median_ms"] = median_ms
    results = _tuning_results(session, config)
    if results:
        record["tuning_results"] = results
    return record


def _reference_outputs(model: Path, feeds: Feeds, names: list[str]) -> dict[str, np.ndarray]:
    session = _create_session(model, reference_config())
    try:
        return dict(zip(names, session.run(None, dict(feeds)), strict=False))
    except Exception as exc:
        raise InferccError(
            f"onnxruntime cannot run the model on the CPU: {first_line(exc)}",
            "check the model with onnx.checker.check_model and the input shapes",
        ) from exc


# --------------------------------------------------------------------------- shape points


def shape_points(
    proto: onnx.ModelProto, profiles: Sequence[ShapeProfile]
) -> list[tuple[str, dict[str, tuple[int, ...]]]]:
    """(name, concrete shape per input) for each point to tune, in min, opt, max order."""
    ranged = any(not p.is_fixed for p in profiles)
    names = POINT_NAMES if ranged else ("opt",)
    resolved = {n: resolve_shapes(proto, {p.name: getattr(p, n) for p in profiles}) for n in names}
    keep: dict[str, dict[str, tuple[int, ...]]] = {"opt": resolved["opt"]}
    for name in names:
        if resolved[name] not in keep.values():
            keep[name] = resolved[name]
    return [(n, keep[n]) for n in names if n in keep]


def _jsonable_shapes(shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    return {name: [int(d) for d in dims] for name, dims in shapes.items()}


# --------------------------------------------------------------------------- the tuner


@dataclass
class _Context:
    """What the whole compile shares across points."""

    model: Path
    proto: onnx.ModelProto
    providers: list[str]
    cores: int
    options: CompileOptions
    cache: Any
    model_hash: str | None = None
    fingerprint: str | None = None

    def step(self, message: str) -> None:
        log.info(message)
        if self.options.on_step is not None:
            self.options.on_step(message)


def _cache_key(ctx: _Context, shapes: Mapping[str, Sequence[int]]) -> Any:
    from infercc.tuning import CacheKey

    return CacheKey(
        model_hash=ctx.model_hash,
        shapes=CacheKey.canonical_shapes(shapes),
        backend="ort",
        backend_version=_version(),
        provider=",".join(ctx.providers),
        fingerprint=ctx.fingerprint,
    )


def _fingerprint() -> str:
    from infercc.tuning import fingerprint_hash, host_fingerprint

    return fingerprint_hash(host_fingerprint())


def _model_hash(model: Path) -> str:
    from infercc.tuning import file_sha256

    return file_sha256(model)


def _cached_choice(ctx: _Context, key: Any) -> dict[str, Any] | None:
    if ctx.cache is None:
        return None
    value = ctx.cache.get(key)
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        return None
    return value


def tune_point(ctx: _Context, name: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The ort_config point for one shape point: from the cache, by tuning, or the defaults."""
    key = _cache_key(ctx, shapes) if ctx.cache is not None else None
    cached = _cached_choice(ctx, key) if key is not None else None
    if cached is not None:
        ctx.step(f"{name} shape: cached choice reused")
        return _point(name, shapes, cached, "hit")
    if not ctx.options.tune:
        choice = {"config": default_config(ctx.providers[0]), "median_ms": None, "candidates": []}
        return _point(name, shapes, choice, "untuned")
    started = time.perf_counter()
    choice = _tune(ctx, name, shapes)
    seconds = time.perf_counter() - started
    if key is not None:
        ctx.cache.put(key, choice, tuning_seconds=seconds)
    return _point(name, shapes, choice, "miss", seconds)


def _tune(ctx: _Context, name: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    trial = _trial(ctx, shapes)
    start = default_config(ctx.providers[0])
    total = candidate_count(ctx.providers, ctx.cores)
    done = 0

    def evaluate(config: dict[str, Any], knob: str) -> dict[str, Any]:
        nonlocal done
        done += 1
        ctx.step(f"tuning {name} shape: {done}/{max(total, done)} candidates")
        return _evaluate(trial, config, knob)

    best, records = coordinate_descent(start, knobs(ctx.providers, ctx.cores), evaluate)
    if best is None:
        reasons = "; ".join(sorted({r.get("skipped", "") for r in records}))
        raise InferccError(
            f"no onnxruntime configuration ran the model at the {name} shape: {reasons}",
            "run `infercc optimize` without -o to check the model on the CPU",
        )
    choice = {"config": best["config"], "median_ms": best["median_ms"], "candidates": records}
    if config_key(best["config"]) != config_key(start):
        confirmed = _confirm(trial, best["config"], start)
        choice["confirmation"] = confirmed
        if not confirmed["kept"]:
            default = next(r for r in records if config_key(r["config"]) == config_key(start))
            choice.update(config=start, median_ms=default.get("median_ms"))
            return choice
    if best.get("tuning_results"):
        choice["tuning_results"] = best["tuning_results"]
    return choice


CONFIRM_ROUNDS = 4


def _interleaved_medians(
    sessions: Sequence[Any], feeds: Feeds, warmup: int, block: int
) -> tuple[float, ...]:
    """Median ms of each session over CONFIRM_ROUNDS rounds of `block` runs each, in turn."""
    for session in sessions:
        for _ in range(max(1, warmup)):
            session.run(None, dict(feeds))
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(CONFIRM_ROUNDS):
        for i, session in enumerate(sessions):
            for _ in range(block):
                start = time.perf_counter()
                session.run(None, dict(feeds))
                times[i].append(time.perf_counter() - start)
    return tuple(statistics.median(t) * 1e3 for t in times)


def _confirm(trial: _Trial, best: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """Time the winner against onnxruntime's defaults again, in alternating blocks of runs
    (defaults, winner, defaults, winner...), and keep the winner only if it still beats the
    defaults by MIN_GAIN: one lucky measurement during the sweep must not pick a slower
    configuration. Blocks, not single alternating runs, so that one session's idle threads
    spinning after its runs do not slow the other down."""
    sessions = [_create_session(trial.model, default), _create_session(trial.model, best)]
    default_ms, best_ms = _interleaved_medians(
        sessions, trial.feeds, trial.warmup, max(3, trial.iters // 2)
    )
    kept = best_ms < default_ms * (1 - MIN_GAIN)
    log.info("confirmation: defaults %.3f ms, winner %.3f ms, kept=%s", default_ms, best_ms, kept)
    return {"default_ms": default_ms, "winner_ms": best_ms, "kept": kept}


def _trial(ctx: _Context, shapes: dict[str, tuple[int, ...]]) -> _Trial:
    feeds = make_inputs(ctx.proto, shapes, seed=int(ctx.options.extra.get("seed", 0)))
    names = [o.name for o in ctx.proto.graph.output]
    atol, rtol, cosine = tolerance(ctx.options)
    return _Trial(
        model=ctx.model,
        feeds=feeds,
        expected=_reference_outputs(ctx.model, feeds, names),
        output_names=names,
        tolerance=(atol, rtol, cosine),
        warmup=ctx.options.warmup,
        iters=ctx.options.iters,
    )


def _point(
    name: str,
    shapes: Mapping[str, Sequence[int]],
    choice: Mapping[str, Any],
    cache: str,
    seconds: float = 0.0,
) -> dict[str, Any]:
    config = choice["config"]
    point = {
        "name": name,
        "shapes": _jsonable_shapes(shapes),
        "provider": config["provider"],
        "provider_options": dict(config.get("provider_options", {})),
        "session_options": {**DEFAULT_SESSION_OPTIONS, **config.get("session_options", {})},
        "median_ms": choice.get("median_ms"),
        "cache": cache,
        "tuning_seconds": round(seconds, 3),
        "candidates": list(choice.get("candidates", [])),
    }
    if choice.get("tuning_results"):
        point["tuning_results"] = choice["tuning_results"]
    if choice.get("confirmation"):
        point["confirmation"] = choice["confirmation"]
    return point


# --------------------------------------------------------------------------- optimized model


def _external_bytes(proto: onnx.ModelProto, directory: Path) -> int:
    """Bytes of main-graph initializers stored outside the model file."""
    total = 0
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        if "length" in info:
            total += int(info["length"])
        elif (directory / info.get("location", "")).is_file():
            total += (directory / info["location"]).stat().st_size
    return total


def _save_optimized(ctx: _Context, point: Mapping[str, Any], out_dir: Path) -> dict | None:
    """Write onnxruntime's optimized graph for `point`'s configuration; its description."""
    if _external_bytes(ctx.proto, ctx.model.parent) > EXTERNAL_DATA_LIMIT:
        log.info("external data over 2 GB: %s not written", OPTIMIZED_FILE)
        return None
    ctx.step(f"saving onnxruntime's optimized model ({OPTIMIZED_FILE})")
    target = out_dir / OPTIMIZED_FILE
    try:
        session = _create_session(ctx.model, _config_only(point), save_to=target)
        del session
    except Exception as exc:  # not fatal: load() falls back to model.onnx
        log.warning("could not save onnxruntime's optimized model: %s", first_line(exc))
        target.unlink(missing_ok=True)
        return None
    if not target.is_file():
        return None
    return {
        "file": OPTIMIZED_FILE,
        "provider": point["provider"],
        "provider_options": dict(point["provider_options"]),
        "graph_optimization_level": point["session_options"]["graph_optimization_level"],
        "fingerprint": ctx.fingerprint,
    }


# --------------------------------------------------------------------------- the backend


def _version() -> str:
    return str(ort.__version__) if ort is not None else ""


def gpu_providers() -> list[str]:
    """GPU execution providers this onnxruntime build has (empty on the CPU package)."""
    if ort is None:
        return []
    return [p for p in ort.get_available_providers() if p in GPU_PROVIDERS]


def gpu_reason() -> str:
    """Why GPU targets cannot run here ("" when they can)."""
    if ort is None:
        return "onnxruntime is not installed (pip install onnxruntime)"
    if CUDA not in ort.get_available_providers():
        return f"onnxruntime-gpu is not installed ({GPU_INSTALL_HINT})"
    return ""


def _host_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class OrtBackend:
    """ONNX Runtime: sessions tuned per shape point (see the module docstring)."""

    name = "ort"

    def available(self) -> tuple[bool, str]:
        if ort is None:
            return False, "onnxruntime is not installed (pip install onnxruntime)"
        return True, ""

    def version(self) -> str:
        return _version()

    def precisions(self, target: Target) -> tuple[str, ...]:
        """fp32, fp16, int8 (+ bf16 where the CPU has it) on the CPU; the GPU target's own
        precisions when onnxruntime has the CUDA provider, else none (see `gpu_reason`)."""
        if ort is None:
            return ()
        if target.kind == "gpu":
            if gpu_reason():
                return ()
            return tuple(p for p in ("fp32", "fp16", "bf16", "int8") if p in target.precisions)
        bf16 = ("bf16",) if "bf16" in target.precisions else ()
        return ("fp32", "fp16", *bf16, "int8")

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        """Tune each shape point, write ort_config.json (and ort_optimized.onnx); returns the
        manifest's backend section."""
        _require_ort()
        ctx = _context(Path(model), target, options, cache)
        points = [tune_point(ctx, n, s) for n, s in shape_points(ctx.proto, shapes)]
        default = next(i for i, p in enumerate(points) if p["name"] == "opt")
        optimized = None
        if options.extra.get("save_optimized", False):
            optimized = _save_optimized(ctx, points[default], Path(out_dir))
        config = _ort_config(ctx, points, default, optimized)
        (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return _manifest_section(ctx, points, default, optimized)

    def load(self, artifact: Artifact) -> Runner:
        _require_ort()
        config = read_config(artifact.path)
        optimized = _usable_optimized(artifact.path, config)
        return OrtRunner(artifact.model_path, config["points"], config["default"], optimized)


def _context(model: Path, target: Target, options: CompileOptions, cache: Any) -> _Context:
    providers = candidate_providers(target.kind, ort.get_available_providers())
    if not providers:
        raise InferccError(
            f"onnxruntime cannot run on the {target.name} target here: {gpu_reason()}",
            "compile for --target cpu, or install onnxruntime-gpu",
        )
    if not model.is_file():
        raise InferccError(f"model file {str(model)!r} does not exist", "check the path")
    ctx = _Context(model, read_model(model)[0], providers, _host_cores(), options, cache)
    ctx.fingerprint = _fingerprint()
    ctx.model_hash = _model_hash(model) if cache is not None else None
    return ctx


def _ort_config(
    ctx: _Context, points: list[dict[str, Any]], default: int, optimized: dict | None
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "onnxruntime": _version(),
        "fingerprint": ctx.fingerprint,
        "points": points,
        "default": default,
        "optimized_model": optimized,
    }


def _manifest_section(
    ctx: _Context, points: list[dict[str, Any]], default: int, optimized: dict | None
) -> dict[str, Any]:
    summary_keys = ("name", "shapes", "provider", "session_options", "median_ms", "cache")
    return {
        "name": "ort",
        "version": _version(),
        "files": [CONFIG_FILE] + ([OPTIMIZED_FILE] if optimized else []),
        "providers": list(ctx.providers),
        "default": default,
        "points": [{k: p[k] for k in summary_keys} for p in points],
    }


# --------------------------------------------------------------------------- loading


def read_config(directory: Path) -> dict[str, Any]:
    """The artifact's ort_config.json; InferccError when it is missing or of another schema."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise InferccError(
            f"{directory} has no {CONFIG_FILE}: it was not built by the ort backend",
            "rebuild it with `infercc optimize MODEL -o DIR --backend ort`",
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InferccError(f"cannot read {path}: {exc}", "rebuild the artifact") from exc
    schema = config.get("schema") if isinstance(config, dict) else None
    if schema != SCHEMA or not config.get("points"):
        raise InferccError(
            f"{path} has schema {schema!r}, this infercc reads {SCHEMA!r}",
            "rebuild the artifact with this version of infercc",
        )
    return config


def _usable_optimized(directory: Path, config: Mapping[str, Any]) -> dict | None:
    """The optimized-model description with its path, when it was made on this host."""
    optimized = config.get("optimized_model")
    if not optimized or not (Path(directory) / optimized["file"]).is_file():
        return None
    if config.get("onnxruntime") != _version() or optimized.get("fingerprint") != _fingerprint():
        log.info(
            "%s was written on another host or onnxruntime: using %s", OPTIMIZED_FILE, MODEL_FILE
        )
        return None
    return {**optimized, "path": Path(directory) / optimized["file"]}


class OrtRunner:
    """Runs an ort artifact: one session per distinct configuration, created on first use;
    each call uses the point whose shapes equal the feeds' shapes, else the default point."""

    def __init__(
        self,
        model: Path,
        points: Sequence[Mapping[str, Any]],
        default: int = 0,
        optimized: Mapping[str, Any] | None = None,
    ):
        if not Path(model).is_file():
            raise InferccError(f"model file {str(model)!r} does not exist", "check the path")
        proto = read_model(Path(model))[0]
        self.input_names = [vi.name for vi in real_inputs(proto)]
        self.output_names = [o.name for o in proto.graph.output]
        self.points = list(points)
        self.default = default
        self._model = Path(model)
        self._optimized = optimized
        self._sessions: dict[str, Any] = {}
        # Idle intra-op threads spin after a run by default (good for back-to-back latency);
        # a comparison that interleaves two runners turns it off so neither starves the other.
        self.spinning = True

    def select(self, feeds: Feeds) -> int:
        """Index of the point whose shapes equal the feeds' shapes, else the default's."""
        for index, point in enumerate(self.points):
            shapes = point.get("shapes") or {}
            if shapes and all(
                name in feeds and tuple(np.shape(feeds[name])) == tuple(dims)
                for name, dims in shapes.items()
            ):
                return index
        return self.default

    def run(self, feeds: Feeds) -> list[np.ndarray]:
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise InferccError(
                f"no value for model input(s) {', '.join(map(repr, missing))}",
                "feed every input the model declares",
            )
        session = self._session(self.points[self.select(feeds)])
        try:
            return session.run(None, {name: feeds[name] for name in self.input_names})
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InferccError(
                f"onnxruntime failed to run the model: {first_line(exc)}",
                "check the input shapes (--shape) and the batch size (--batch)",
            ) from exc

    def _session(self, point: Mapping[str, Any]) -> Any:
        model, config = self._source(point)
        if not self.spinning:
            config["session_config"] = {
                "session.intra_op.allow_spinning": "0",
                "session.inter_op.allow_spinning": "0",
            }
        key = config_key({"model": str(model), **config})
        if key not in self._sessions:
            try:
                session = _create_session(model, config)
            except Exception as exc:  # onnxruntime raises its own exception types
                raise InferccError(
                    f"onnxruntime cannot load {str(model)!r}: {first_line(exc)}",
                    "check the model with onnx.checker.check_model",
                ) from exc
            if point.get("tuning_results"):
                session.set_tuning_results(point["tuning_results"], error_on_invalid=False)
            self._sessions[key] = session
        return self._sessions[key]

    def _source(self, point: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
        """The model file and configuration a point runs with (the optimized file when it was
        made for this provider and level; it is then loaded with optimization off)."""
        config = _config_only(point)
        opt = self._optimized
        level = config["session_options"]["graph_optimization_level"]
        if (
            opt is not None
            and opt["provider"] == config["provider"]
            and opt["provider_options"] == config["provider_options"]
            and opt["graph_optimization_level"] == level
        ):
            config["session_options"]["graph_optimization_level"] = REFERENCE_LEVEL
            return Path(opt["path"]), config
        return self._model, config


def default_runner(model_path: str | os.PathLike[str]) -> OrtRunner:
    """A runner for a plain .onnx file: onnxruntime's default options on the CPU provider."""
    _require_ort()
    point = {"name": "default", "shapes": {}, **default_config(CPU)}
    return OrtRunner(Path(model_path), [point])


register_backend(OrtBackend())
