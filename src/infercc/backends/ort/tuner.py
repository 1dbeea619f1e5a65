"""Per-shape tuning: coordinate descent over the knobs, each candidate timed and validated."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.backends.ort.config import (
    DEFAULT_SESSION_OPTIONS,
    EXTERNAL_DATA_LIMIT,
    OPTIMIZED_FILE,
    POINT_NAMES,
    Knob,
    _config_only,
    _create_session,
    _time_runs,
    _tuning_results,
    _version,
    apply_patch,
    candidate_count,
    config_key,
    default_config,
    disabled_optimizers,
    knobs,
    reference_config,
)
from infercc.check import compare as _validate
from infercc.data.feeds import make_inputs
from infercc.data.profiles import ShapeProfile
from infercc.data.signature import resolve_shapes
from infercc.errors import InferccError
from infercc.precisions import tolerance as table_tolerance
from infercc.runtime import timing
from infercc.runtime.artifact import Feeds
from infercc.runtime.backend import CompileOptions
from infercc.util import first_line

try:
    import onnxruntime as ort
except ImportError:  # the core dependency, but a broken install must give a reason
    ort = None


log = logging.getLogger(__name__)


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
    """(atol, rtol, min_cosine) for the graph's precision (`infercc.precisions`), with the
    user's figures in their place."""
    given = (options.atol, options.rtol, options.min_cosine)
    return table_tolerance(options.precision, *given).as_tuple()


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
    from infercc.runtime.tuning import CacheKey

    return CacheKey(
        model_hash=ctx.model_hash,
        shapes=CacheKey.canonical_shapes(shapes),
        backend="ort",
        backend_version=_version(),
        provider=",".join(ctx.providers),
        fingerprint=ctx.fingerprint,
    )


def _fingerprint() -> str:
    from infercc.runtime.tuning import fingerprint_hash, host_fingerprint

    return fingerprint_hash(host_fingerprint())


def _model_hash(model: Path) -> str:
    from infercc.runtime.tuning import file_sha256

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
    runs = [lambda s=session: s.run(None, dict(feeds)) for session in sessions]
    timed = timing.interleave(runs, max(1, warmup), CONFIRM_ROUNDS * block, block)
    return tuple(float(np.median(row)) for row in timed.ms)


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
    feeds = make_inputs(ctx.proto, shapes, seed=ctx.options.seed)
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
        "disabled_optimizers": disabled_optimizers(config),
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
        "disabled_optimizers": disabled_optimizers(point),
        "fingerprint": ctx.fingerprint,
    }
