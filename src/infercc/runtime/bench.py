"""Latency benchmarks: time a model or artifact per batch size, or race two of them.

The method:

- A plain `.onnx` file runs on onnxruntime's CPU provider with its default session options
  (all graph optimizations, memory arena on): that is what a user of onnxruntime gets. An
  artifact directory runs on the backend its `manifest.json` names.
- Feeds come from `infercc.data.feeds.make_inputs` on the model's skeleton (the graph without its
  weights). For each batch size, every symbol that sits on the first axis of some input
  (`batch`, or an unnamed first dim) is set to the batch size everywhere it appears, so inputs
  that share the symbol agree. `--shape` pins keep their other dimensions; a pin whose first
  dimension disagrees with the batch is overridden for that run, and the result's `notes` say
  so. A model whose inputs all have a fixed first dimension runs only at that batch: another
  batch is an error (with `batches=None` it runs at its own batch).
- Each batch size gets its own warm-up (onnxruntime plans memory per shape), then `iters`
  timed runs, each measured around `runner.run` alone (`infercc.runtime.timing`: the garbage
  collector is paused while timing); with `duration`, runs go on until that many seconds have
  passed (and at least `iters` were timed). Statistics are numpy's (linear-interpolated
  percentiles, sample standard deviation); throughput is samples per second, `batch / mean`.
- `profile=True` profiles each batch size after its timing, with a separate session (so the
  profiler's overhead is not in the latencies): `warmup` runs then the number of timed runs
  (at most `PROFILE_RUNS`), summarised by `infercc.runtime.kernel_profile` as the op types and nodes
  that take the time. It needs a runner on onnxruntime (a plain file or an ort artifact).
- `compare` runs the two runners interleaved on the same feeds (A B A B ..., warm-up included,
  so both see the same machine state: thermal drift or a noisy neighbour hits both alike) and
  summarizes the per-pair ratio `time_b / time_a`. Its onnxruntime sessions do not spin: with
  onnxruntime's default, the idle intra-op threads of one session spin after each run and
  steal the cores from the other, and a model raced against itself on 2 cores gave ratios
  0.52..1.93 (p10..p90, median 1.28); without spinning, 0.96..1.07. So compare's absolute
  latencies can be a little above bench's; the ratio is what it is for. `faster` is "same"
  when the 10th..90th percentile interval of the ratio contains 1.0, else the side that won.
  The outputs of A and B on the first feeds are compared (max abs difference per output), for
  information only: models may differ by design (fp16).

Everything a report holds is JSON-safe through `to_dict()`.
"""

from __future__ import annotations

import logging
import math
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from infercc.analysis.targets import host_cpu_info
from infercc.data.feeds import make_inputs
from infercc.data.signature import (
    declared_dims,
    input_dims,
    input_dtype,
    real_inputs,
    warn_shape_conflicts,
)
from infercc.errors import InferccError
from infercc.ir.graph import declared_dim
from infercc.runtime import timing
from infercc.runtime.artifact import Feeds, Runner, open_source
from infercc.runtime.kernel_profile import Profile, read_events, summarize
from infercc.runtime.ort_support import custom_op_libraries
from infercc.runtime.registry import load_runner
from infercc.util import json_float
from infercc.version import __version__

log = logging.getLogger(__name__)

Progress = Callable[[int, int | None], None]
PROFILE_RUNS = 100  # most profiled runs per batch size (each writes an event per node)
Shapes = Mapping[str, Sequence[int]]


# --------------------------------------------------------------------------- reports


@dataclass
class LatencyStats:
    """Latency of one runner at one batch size (milliseconds; throughput in samples/s)."""

    batch: int
    shapes: dict[str, tuple[int, ...]]
    iters: int
    warmup: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    stdev_ms: float
    throughput: float
    notes: list[str] = field(default_factory=list)
    profile: Profile | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._timings(),
            "profile": self.profile.to_dict() if self.profile is not None else None,
        }

    def _timings(self) -> dict[str, Any]:
        return {
            "batch": int(self.batch),
            "shapes": {name: [int(d) for d in dims] for name, dims in self.shapes.items()},
            "iters": int(self.iters),
            "warmup": int(self.warmup),
            **{key: float(getattr(self, key)) for key in _STAT_FIELDS},
            "throughput": float(self.throughput),
            "notes": list(self.notes),
        }


_STAT_FIELDS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "stdev_ms")


@dataclass
class BenchReport:
    """`bench` of one model or artifact over batch sizes."""

    path: str
    backend: str
    results: list[LatencyStats]
    host: dict[str, Any]
    duration_s: float | None = None  # the time asked for per batch size, if any

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "backend": self.backend,
            "duration_s": self.duration_s,
            "results": [r.to_dict() for r in self.results],
            "host": dict(self.host),
        }


@dataclass
class PairStats:
    """A against B at one batch size: each side's latency and the ratio time_b / time_a."""

    batch: int
    a: LatencyStats
    b: LatencyStats
    ratio_median: float
    ratio_p10: float
    ratio_p90: float
    ratio_mean: float
    faster: str  # "a", "b" or "same"

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": int(self.batch),
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "ratio_median": float(self.ratio_median),
            "ratio_p10": float(self.ratio_p10),
            "ratio_p90": float(self.ratio_p90),
            "ratio_mean": float(self.ratio_mean),
            "faster": self.faster,
        }


@dataclass
class OutputDiff:
    """How far B's output is from A's on the first feeds (None when they cannot be compared)."""

    name: str
    max_abs: float | None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_abs": json_float(self.max_abs), "reason": self.reason}


@dataclass
class CompareReport:
    """`compare` of two models or artifacts, per batch size, plus their output differences."""

    path_a: str
    path_b: str
    backend_a: str
    backend_b: str
    results: list[PairStats]
    outputs: list[OutputDiff]
    host: dict[str, Any]

    @property
    def max_abs_diff(self) -> float | None:
        values = [o.max_abs for o in self.outputs]
        if not values or any(v is None for v in values):
            return None
        return max(values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": {"path": self.path_a, "backend": self.backend_a},
            "b": {"path": self.path_b, "backend": self.backend_b},
            "results": [r.to_dict() for r in self.results],
            "outputs": [o.to_dict() for o in self.outputs],
            "max_abs_diff": json_float(self.max_abs_diff),
            "host": dict(self.host),
        }


# --------------------------------------------------------------------------- opening


def open_runner(path: Path, *, spinning: bool = True) -> tuple[Runner, onnx.ModelProto]:
    """A runner for an artifact directory or an .onnx file (`runtime.artifact.open_source`),
    and the model's skeleton; `spinning=False` for races (see `registry.load_runner`)."""
    source = open_source(path)
    return load_runner(source, spinning), source.skeleton()


def backend_name(path: Path) -> str:
    """The backend that `open_runner` uses for `path` (onnxruntime for a plain file)."""
    return open_source(path).backend


# --------------------------------------------------------------------------- batch shapes


@dataclass
class _BatchPlan:
    """What to build feeds from for one batch size."""

    batch: int
    model: onnx.ModelProto  # skeleton with the batch symbols fixed to `batch`
    shapes: dict[str, tuple[int, ...]]  # the user's pins, with the batch on batch axes
    notes: list[str]


def _plan_batch(model: onnx.ModelProto, pins: Shapes | None, batch: int | None) -> _BatchPlan:
    """Where the batch size goes: see the module docstring."""
    pins = {name: tuple(int(d) for d in dims) for name, dims in (pins or {}).items()}
    dims = {vi.name: declared_dims(vi) for vi in real_inputs(model)}
    symbols = _batch_symbols(dims)
    if not symbols:
        return _BatchPlan(_static_batch(dims, batch), model, pins, [])
    if batch is None:  # no --batch: a pinned shape's batch axis, else 1
        batch = _pinned_batch(pins, dims, symbols) or 1
    notes: list[str] = []
    for name, pinned in pins.items():
        pins[name] = _override_pin(name, pinned, dims.get(name), symbols, batch, notes)
    return _BatchPlan(batch, _fix_symbols(model, symbols, batch), pins, notes)


# An unnamed symbolic first dim joins the set as "" (declared_dims never gives an empty name), so
# a model whose only batch axis is unnamed still counts as batched; _is_batch_axis finds it.
_UNNAMED = ""


def _batch_symbols(dims: Mapping[str, list[int | str | None] | None]) -> set[str]:
    """Symbol names on axis 0 of some input (`_UNNAMED` for an unnamed one)."""
    return {_symbol(d[0]) for d in dims.values() if d and not isinstance(d[0], int)}


def _symbol(dim: int | str | None) -> str:
    return _UNNAMED if dim is None else str(dim)


def _is_batch_axis(dim: int | str | None, axis: int, symbols: set[str]) -> bool:
    if isinstance(dim, int):
        return False
    return (dim is not None and dim in symbols) or (dim is None and axis == 0)


def _pinned_batch(
    pins: Mapping[str, tuple[int, ...]],
    dims: Mapping[str, list[int | str | None] | None],
    symbols: set[str],
) -> int | None:
    """The batch the user's --shape pins give (the first pinned batch axis), if any."""
    for name, pinned in pins.items():
        declared = dims.get(name)
        if not declared or len(declared) != len(pinned):
            continue
        for axis, dim in enumerate(declared):
            if _is_batch_axis(dim, axis, symbols):
                return pinned[axis]
    return None


def _static_batch(dims: Mapping[str, list[int | str | None] | None], batch: int | None) -> int:
    """A model without a symbolic first axis runs at its fixed batch only."""
    first = next(((name, d[0]) for name, d in dims.items() if d), None)
    if first is None:
        return 1 if batch is None else batch
    name, fixed = first
    if batch is not None and batch != fixed:
        raise InferccError(
            f"input {name!r} has a fixed batch of {fixed}; --batch {batch} cannot apply",
            "re-export the model with a dynamic first axis (dynamic_axes / dynamic_shapes), "
            f"or bench it with --batch {fixed}",
        )
    return int(fixed)


def _override_pin(
    name: str,
    pinned: tuple[int, ...],
    dims: list[int | str | None] | None,
    symbols: set[str],
    batch: int,
    notes: list[str],
) -> tuple[int, ...]:
    """The pin with `batch` on every batch axis; a note for each value that changed."""
    if dims is None or len(dims) != len(pinned):
        return pinned  # unknown rank, or a rank error that resolve_shapes reports
    out = list(pinned)
    for axis, dim in enumerate(dims):
        if _is_batch_axis(dim, axis, symbols) and out[axis] != batch:
            notes.append(
                f"--shape for {name!r} sets axis {axis} to {out[axis]}; "
                f"batch {batch} wins for this run"
            )
            log.info("%s", notes[-1])  # the report's notes say it to the user
            out[axis] = batch
    return tuple(out)


def _fix_symbols(model: onnx.ModelProto, symbols: set[str], batch: int) -> onnx.ModelProto:
    """A copy of the skeleton whose inputs have `batch` in place of the batch symbols."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in real_inputs(fixed):
        if vi.type.WhichOneof("value") == "tensor_type":
            _fix_dims(vi.type.tensor_type.shape.dim, symbols, batch)
    return fixed


def _fix_dims(dims: Any, symbols: set[str], batch: int) -> None:
    for axis, dim in enumerate(dims):
        declared = declared_dim(dim)
        if not isinstance(declared, int) and _is_batch_axis(declared, axis, symbols):
            dim.dim_value = batch  # the oneof drops dim_param


def _feeds(plan: _BatchPlan, seed: int) -> dict[str, np.ndarray]:
    return make_inputs(plan.model, plan.shapes, seed)


def _shapes_of(feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(d) for d in array.shape) for name, array in feeds.items()}


# --------------------------------------------------------------------------- timing


class _Ticker:
    """Counts runs over the whole benchmark and reports them to `on_progress` (the total is
    None when a duration decides it)."""

    def __init__(self, total: int | None, on_progress: Progress | None):
        self.done, self.total, self.on_progress = 0, total, on_progress

    def __call__(self) -> None:
        self.done += 1
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)


def _stats(
    times_ms: np.ndarray, batch: int, shapes: dict[str, tuple[int, ...]], warmup: int
) -> LatencyStats:
    p50, p90, p99 = (float(v) for v in np.percentile(times_ms, [50, 90, 99]))
    mean = float(times_ms.mean())
    return LatencyStats(
        batch=batch,
        shapes=shapes,
        iters=int(times_ms.size),
        warmup=warmup,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        mean_ms=mean,
        min_ms=float(times_ms.min()),
        max_ms=float(times_ms.max()),
        stdev_ms=float(times_ms.std(ddof=1)) if times_ms.size > 1 else 0.0,
        throughput=batch / (mean / 1e3) if mean > 0 else math.inf,
    )


def _check_counts(
    batches: Sequence[int] | None, warmup: int, iters: int, duration: float | None = None
) -> list[int | None]:
    if duration is not None and not duration > 0:
        raise InferccError(f"--duration {duration!r} is not positive", "e.g. --duration 10s")
    if iters < 1:
        raise InferccError(f"--iters {iters} is not positive", "time at least one run")
    if warmup < 0:
        raise InferccError(f"--warmup {warmup} is negative", "use 0 or more warm-up runs")
    if batches is None:
        return [None]
    if not batches or any(int(b) < 1 for b in batches):
        raise InferccError(f"--batch {list(batches)} is not a list of positive sizes", "e.g. 1,8")
    return [int(b) for b in batches]


# --------------------------------------------------------------------------- host


def host_info() -> dict[str, Any]:
    """What the figures were measured on."""
    info, cores = host_cpu_info()  # /proc/cpuinfo, else py-cpuinfo (macOS, Windows)
    return {
        "cpu": info.model,
        "cpu_class": None if info.row is None else info.row.name,
        "cpu_features": list(info.features),
        "cores": cores,
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": ort.__version__,
        "infercc": __version__,
    }


# --------------------------------------------------------------------------- bench


def bench(
    path: str | os.PathLike[str],
    shapes: Shapes | None = None,
    batches: Sequence[int] | None = (1,),
    warmup: int = 10,
    iters: int = 100,
    seed: int = 0,
    on_progress: Progress | None = None,
    *,
    duration: float | None = None,
    profile: bool = False,
    ort_custom_op_libs: Sequence[str | os.PathLike[str]] = (),
) -> BenchReport:
    """Time the model or artifact at `path` at each batch size (None: the model's own batch).

    `duration` (seconds) times each batch size for that long (and at least `iters` runs);
    `profile` adds onnxruntime's per-op profile of each batch size (module doc);
    `ort_custom_op_libs` are registered in every onnxruntime session (`--ort-custom-op-lib`).
    `on_progress(done, total)` is called after every run, warm-up included, counted over all
    batch sizes (total None with a duration).
    """
    sizes = _check_counts(batches, warmup, iters, duration)
    with custom_op_libraries(ort_custom_op_libs):
        runner, skeleton = open_runner(Path(path))
        profiler = _profiler(Path(path)) if profile else None
        warn_shape_conflicts(input_dims(skeleton), shapes, path)
        plans = [_plan_batch(skeleton, shapes, batch) for batch in sizes]
        total = None if duration is not None else len(plans) * (warmup + iters)
        tick = _Ticker(total, on_progress)
        counts = (warmup, iters, duration)
        results = [_bench_one(runner, plan, counts, seed, tick, profiler) for plan in plans]
    return BenchReport(str(path), backend_name(Path(path)), results, host_info(), duration)


def _bench_one(
    runner: Runner,
    plan: _BatchPlan,
    counts: tuple[int, int, float | None],
    seed: int,
    tick: _Ticker,
    profiler: Runner | None = None,
) -> LatencyStats:
    warmup, iters, duration = counts
    feeds = _feeds(plan, seed)
    times = timing.time_runs(lambda: runner.run(feeds), warmup, iters, tick, duration).ms
    stats = _stats(times, plan.batch, _shapes_of(feeds), warmup)
    stats.notes = list(plan.notes)
    if profiler is not None:
        stats.profile = _profile(profiler, feeds, warmup, min(times.size, PROFILE_RUNS))
    log.info("batch %d: p50 %.3f ms, %.1f samples/s", stats.batch, stats.p50_ms, stats.throughput)
    return stats


def _profiler(path: Path) -> Runner:
    """A second runner of `path` whose sessions record onnxruntime's profile."""
    runner, _ = open_runner(path)
    if not hasattr(runner, "profile_prefix"):
        raise InferccError(
            f"--ort-profile reads onnxruntime's profiler, and {path} runs on {backend_name(path)}",
            "profile the .onnx model (or an ort artifact) instead",
        )
    return runner


def _profile(runner: Any, feeds: Feeds, warmup: int, runs: int) -> Profile:
    """`warmup` + `runs` runs on a fresh profiling session, summarised."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="infercc-profile-") as tmp:
        runner.profile_prefix = str(Path(tmp) / "ort")
        runner._sessions.clear()  # a new session per batch size: one profile each
        for _ in range(warmup + runs):
            runner.run(feeds)
        events = read_events(runner.end_profiling())
    return summarize(events, warmup)


# --------------------------------------------------------------------------- compare


@dataclass
class _Side:
    runner: Runner
    skeleton: onnx.ModelProto
    path: Path


def compare(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    shapes: Shapes | None = None,
    batches: Sequence[int] | None = (1,),
    warmup: int = 10,
    iters: int = 100,
    seed: int = 0,
    on_progress: Progress | None = None,
    *,
    duration: float | None = None,
    ort_custom_op_libs: Sequence[str | os.PathLike[str]] = (),
) -> CompareReport:
    """Race B against A, interleaved on the same feeds; ratios are time_b / time_a.

    `duration` (seconds) races each batch size for that long (and at least `iters` pairs).
    `on_progress(done, total)` is called after every run of either side.
    """
    sizes = _check_counts(batches, warmup, iters, duration)
    with custom_op_libraries(ort_custom_op_libs):
        side_a, side_b = _open_side(a), _open_side(b)
        _check_same_inputs(side_a, side_b)
        warn_shape_conflicts(input_dims(side_a.skeleton), shapes, a)
        plans = [
            (_plan_batch(side_a.skeleton, shapes, n), _plan_batch(side_b.skeleton, shapes, n))
            for n in sizes
        ]
        total = None if duration is not None else 2 * len(plans) * (warmup + iters)
        tick = _Ticker(total, on_progress)
        results, first = [], None
        for plan_a, plan_b in plans:
            counts = (warmup, iters, seed, duration)
            pair, outputs = _compare_one(side_a, side_b, plan_a, plan_b, counts, tick)
            results.append(pair)
            first = first or outputs
        diffs = _diff_outputs(side_a.runner, side_b.runner, *first)
    return CompareReport(
        str(a),
        str(b),
        backend_name(side_a.path),
        backend_name(side_b.path),
        results,
        diffs,
        host_info(),
    )


def race(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    feeds: Feeds,
    warmup: int = 10,
    iters: int = 100,
) -> PairStats:
    """Race model B against model A, interleaved, on the caller's feeds (real samples).

    `compare` makes random feeds; this takes real ones (token ids must be valid, say), one
    feed dict used by every run. B gets A's feeds in its own declared dtypes.
    """
    _check_counts((1,), warmup, iters)
    side_a, side_b = _open_side(a), _open_side(b)
    _check_same_inputs(side_a, side_b)
    names = {vi.name for vi in real_inputs(side_a.skeleton)}
    feeds_a = {name: np.asarray(x) for name, x in feeds.items() if name in names}
    feeds_b = _feeds_for_b(feeds_a, side_b.skeleton)
    tick = _Ticker(2 * (warmup + iters), None)
    times_a, times_b, _ = _time_pairs(
        side_a.runner, side_b.runner, (feeds_a, feeds_b), warmup, iters, tick
    )
    batch = next((int(x.shape[0]) for x in feeds_a.values() if np.ndim(x) > 0), 1)
    shapes = _shapes_of(feeds_a)
    stats_a = _stats(times_a, batch, shapes, warmup)
    stats_b = _stats(times_b, batch, shapes, warmup)
    return _pair_stats(stats_a, stats_b, times_b / times_a)


def _open_side(path: str | os.PathLike[str]) -> _Side:
    runner, skeleton = open_runner(Path(path), spinning=False)
    return _Side(runner, skeleton, Path(path))


def _check_same_inputs(a: _Side, b: _Side) -> None:
    names_a = sorted(vi.name for vi in real_inputs(a.skeleton))
    names_b = sorted(vi.name for vi in real_inputs(b.skeleton))
    if names_a != names_b:
        raise InferccError(
            f"the models take different inputs: A has {', '.join(names_a) or '(none)'}; "
            f"B has {', '.join(names_b) or '(none)'}",
            "compare models that take the same inputs (the names must match)",
        )


def _feeds_for_b(feeds: Mapping[str, np.ndarray], b: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A's feeds in B's declared dtypes (an fp16 model may take fp16 inputs): same values."""
    dtypes = {vi.name: input_dtype(vi) for vi in real_inputs(b)}
    return {name: np.asarray(x, dtype=dtypes.get(name, x.dtype)) for name, x in feeds.items()}


def _compare_one(
    a: _Side,
    b: _Side,
    plan_a: _BatchPlan,
    plan_b: _BatchPlan,
    counts: tuple[int, int, int, float | None],
    tick: _Ticker,
) -> tuple[PairStats, tuple[list[np.ndarray], list[np.ndarray]]]:
    warmup, iters, seed, duration = counts
    feeds_a = _feeds(plan_a, seed)
    feeds_b = _feeds_for_b(feeds_a, b.skeleton)
    times_a, times_b, first = _time_pairs(
        a.runner, b.runner, (feeds_a, feeds_b), warmup, iters, tick, duration
    )
    shapes = _shapes_of(feeds_a)
    stats_a = _stats(times_a, plan_a.batch, shapes, warmup)
    stats_b = _stats(times_b, plan_a.batch, shapes, warmup)
    stats_a.notes, stats_b.notes = list(plan_a.notes), list(plan_b.notes)
    return _pair_stats(stats_a, stats_b, times_b / times_a), first


def _time_pairs(
    a: Runner,
    b: Runner,
    feeds: tuple[Feeds, Feeds],
    warmup: int,
    iters: int,
    tick: _Ticker,
    duration: float | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[list[np.ndarray], list[np.ndarray]]]:
    """A B A B ...: warm-up pairs, then timed pairs; times in ms and the first pair's outputs."""
    timed = timing.interleave(
        [lambda: a.run(feeds[0]), lambda: b.run(feeds[1])], warmup, iters, 1, tick, duration
    )
    return timed.ms[0], timed.ms[1], (timed.first[0], timed.first[1])


def _pair_stats(a: LatencyStats, b: LatencyStats, ratios: np.ndarray) -> PairStats:
    p10, median, p90 = (float(v) for v in np.percentile(ratios, [10, 50, 90]))
    if p10 <= 1.0 <= p90:
        faster = "same"
    else:
        faster = "a" if p10 > 1.0 else "b"
    return PairStats(a.batch, a, b, median, p10, p90, float(ratios.mean()), faster)


# --------------------------------------------------------------------------- outputs


def _diff_outputs(
    a: Runner, b: Runner, outs_a: list[np.ndarray], outs_b: list[np.ndarray]
) -> list[OutputDiff]:
    """Pair outputs by name when both sides name the same outputs, else by position."""
    named_a = dict(zip(a.output_names, outs_a, strict=False))
    named_b = dict(zip(b.output_names, outs_b, strict=False))
    if set(named_a) == set(named_b):
        return [_diff(name, named_a[name], named_b[name]) for name in named_a]
    pairs = zip(named_a.items(), named_b.items(), strict=False)
    diffs = [_diff(f"{na} / {nb}", xa, xb) for (na, xa), (nb, xb) in pairs]
    if len(named_a) != len(named_b):
        diffs.append(
            OutputDiff("(count)", None, f"A has {len(named_a)} outputs, B has {len(named_b)}")
        )
    return diffs


def _diff(name: str, xa: Any, xb: Any) -> OutputDiff:
    xa, xb = np.asarray(xa), np.asarray(xb)
    if xa.shape != xb.shape:
        return OutputDiff(name, None, f"shape {list(xb.shape)} differs from A's {list(xa.shape)}")
    if xa.dtype.kind not in _NUMERIC or xb.dtype.kind not in _NUMERIC:
        equal = bool(np.array_equal(xa, xb))
        return OutputDiff(name, 0.0 if equal else None, None if equal else "not numeric; differs")
    if xa.size == 0:
        return OutputDiff(name, 0.0)
    ra, rb = _wide(xa), _wide(xb)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(ra - rb)
    diff[(ra == rb) | (np.isnan(ra) & np.isnan(rb))] = 0.0  # equal infs, NaN in both places
    return OutputDiff(name, float(np.max(diff)))


_NUMERIC = "biufc"


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
