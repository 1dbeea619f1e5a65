"""Building, validating and timing every model of a manifest, each in a child process."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from infercc.ci.isolate import ChildDied, Isolated
from infercc.ci.manifest import CiConfig, ModelSpec, load_config
from infercc.ci.reports import write_reports
from infercc.ci.results import CiReport, ModelResult
from infercc.errors import InferccError
from infercc.outputs import check_output_file
from infercc.util import first_line

log = logging.getLogger(__name__)


Event = Callable[[str, str], None]
CANCELLED = "cancelled: the run was interrupted (Ctrl-C)"
CANCELLED_BENCH = "cancelled before its benchmark: the run was interrupted"
# --------------------------------------------------------------------------- results


# --------------------------------------------------------------------------- one model


def build_and_validate(spec: ModelSpec) -> ModelResult:
    """Compile and validate one model; never raises (the reason is in the result)."""
    t0 = time.perf_counter()
    result = ModelResult(spec.name, str(spec.path), False, precision=spec.precision)
    result.target, result.backend = spec.target, spec.backend
    try:
        _compile(spec, result)
        if result.reason is None:
            result.stage = "validate"
            _validate(spec, result)
    except Exception as exc:  # one model's failure, whatever it is, must not stop the others
        result.reason, result.error = _reason(exc), True
        log.debug("model %s failed", spec.name, exc_info=True)
    result.passed = result.reason is None
    if result.passed:
        result.stage = "done"
    result.seconds = time.perf_counter() - t0
    return result


def _reason(exc: BaseException) -> str:
    if isinstance(exc, InferccError):
        return exc.message
    return f"{type(exc).__name__}: {first_line(exc)}"


def _compile(spec: ModelSpec, result: ModelResult) -> None:
    from infercc.api import optimize

    report = optimize(spec.path, spec.output, spec.build, cache_dir=spec.cache_dir)
    result.output, result.build = str(spec.output), report.build
    result.nodes_before, result.nodes_after = report.nodes_before, report.nodes_after
    result.backend = (report.artifact or {}).get("backend", {}).get("name", "none")
    if not report.passed:
        result.validation = report.validation.to_dict()
        result.reason = "validation failed: " + _failed_outputs(report.validation)


def _validate(spec: ModelSpec, result: ModelResult) -> None:
    from infercc.check.candidates import validate_candidate

    build = spec.build
    check = validate_candidate(
        spec.output,
        None if spec.golden is not None else (spec.reference or spec.path),
        golden=spec.golden,
        data=spec.data,
        shapes=build.shape_pins,
        atol=build.atol,
        rtol=build.rtol,
        min_cosine=build.min_cosine,
        tolerances=build.tolerance_map,
        second_shapes=build.second_pins,
        strict_coverage=build.strict_coverage,
    )
    result.validation = check.validation.to_dict() if check.validation else None
    if not check.passed:
        result.reason = "validation failed: " + _failed_outputs(check.validation)


def _failed_outputs(validation: Any) -> str:
    return validation.failure_reason()


def bench_model(spec: ModelSpec, output: str) -> dict[str, Any]:
    """Median latency against the budget, and the ratio to the baseline; `reason` on failure."""
    from infercc.runtime import bench

    shapes = spec.build.shape_pins
    latency: dict[str, Any] = {"reason": None}
    try:
        if spec.latency_budget_ms is not None:
            run = bench.bench(output, shapes, None, spec.warmup, spec.iters)
            median = run.results[0].p50_ms
            latency.update(p50_ms=median, budget_ms=spec.latency_budget_ms)
            if median > spec.latency_budget_ms:
                latency["reason"] = (
                    f"median latency {median:.3f} ms is over the budget of "
                    f"{spec.latency_budget_ms:g} ms"
                )
        if spec.baseline is not None and latency["reason"] is None:
            _against_baseline(spec, output, shapes, latency)
    except Exception as exc:  # a crash while timing fails this model only
        latency["reason"] = "benchmark failed: " + _reason(exc)
        latency["error"] = True
    return latency


def _against_baseline(
    spec: ModelSpec, output: str, shapes: dict[str, tuple[int, ...]], latency: dict[str, Any]
) -> None:
    from infercc.runtime import bench

    pair = bench.compare(spec.baseline, output, shapes, None, spec.warmup, spec.iters).results[0]
    latency.update(
        baseline=str(spec.baseline),
        baseline_p50_ms=pair.a.p50_ms,
        ratio=pair.ratio_median,
        max_slowdown=spec.max_slowdown,
    )
    if pair.ratio_median > spec.max_slowdown:
        latency["reason"] = (
            f"{pair.ratio_median:.2f}x the baseline's latency (allowed {spec.max_slowdown:g}x)"
        )


# --------------------------------------------------------------------------- the run


def run_ci(
    config_path: str | os.PathLike[str],
    jobs: int = 1,
    *,
    ray: str | bool | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    only: Sequence[str] | None = None,
    junit: str | os.PathLike[str] | None = None,
    json_report: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    step_summary: bool = True,
    on_event: Event | None = None,
    run: dict[str, Any] | None = None,
) -> CiReport:
    """Compile, validate and bench every model of the manifest; write the reports asked for.

    `run` (what ran: the CLI's command and options) goes into the JSON report as is.

    `only` keeps the named models; `on_event(name, what)` is called as each model starts
    ("compiling"), is timed ("benching") and ends ("passed" or "failed"). `step_summary`
    appends the Markdown summary to `$GITHUB_STEP_SUMMARY` when that is set.

    `ray` runs each model as a task on a Ray cluster instead of local processes
    (`infercc.ci.cluster`): True starts or joins a local cluster, "auto" joins the one in
    `RAY_ADDRESS`, any other string is a cluster address. A run interrupted (Ctrl-C), on Ray
    or in local processes, still writes its reports, with `interrupted` set: the models that
    had finished keep their results, the others fail as cancelled.
    """
    t0 = time.perf_counter()
    if jobs < 1:
        raise InferccError(f"--jobs {jobs} is not a positive number", "give --jobs 1 or more")
    if ray is not None and jobs != 1:
        raise InferccError(
            "--jobs has no effect with --ray: Ray runs as many models at once as the cluster fits",
            "drop --jobs; [ray] cpus in the manifest sets the CPUs each model asks for",
        )
    config = load_config(config_path, out_dir)
    specs = _select(config, only)
    check_report_paths(junit=junit, json_report=json_report, markdown=markdown)
    event = on_event or (lambda _name, _what: None)
    cluster, interrupted = None, False
    if ray is None:
        config.out_dir.mkdir(parents=True, exist_ok=True)
        results, interrupted = _run_all(specs, jobs, event)
        interrupted = _bench_all(specs, results, jobs, event, interrupted)
    else:
        from infercc.ci.cluster import run_fleet

        results, cluster, interrupted = run_fleet(
            config,
            specs,
            ray,
            event,
            build=build_and_validate,
            bench=bench_model,
            apply_latency=_apply_latency,
        )
    for r in results:
        event(r.name, "passed" if r.passed else "failed")
    report = CiReport(
        str(config.path),
        str(config.out_dir),
        None if ray is not None else jobs,
        results,
        0.0,
        ray=cluster,
        interrupted=interrupted,
        run=run,
    )
    report.seconds = time.perf_counter() - t0
    write_reports(report, junit, json_report, markdown, step_summary)
    return report


def check_report_paths(**paths: str | os.PathLike[str] | None) -> None:
    """Refuse, before any model is built, a report path that cannot be written (a directory,
    a parent that is a file or read-only); missing parent directories are created later."""
    for key, path in paths.items():
        if path is not None:
            check_output_file(path, "--" + key.replace("_", "-"))


def _select(config: CiConfig, only: Sequence[str] | None) -> list[ModelSpec]:
    if not only:
        return config.models
    names = [m.name for m in config.models]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InferccError(
            f"--only names {unknown[0]!r}, which is not in the manifest",
            "models: " + ", ".join(names),
        )
    return [m for m in config.models if m.name in only]


def _run_all(specs: Sequence[ModelSpec], jobs: int, event: Event) -> tuple[list[ModelResult], bool]:
    """Build and validate every model, each in a child process (`infercc.ci.isolate`): a
    crash in native code (a segfault, the out-of-memory killer) fails that model only, and
    the next model gets a fresh child. Returns the results and whether the run was
    interrupted (Ctrl-C): then the models that had finished keep their results, the others
    fail as cancelled, and the caller still writes every report."""
    workers = min(jobs, len(specs))
    children: queue.SimpleQueue[Isolated] = queue.SimpleQueue()
    pool = [Isolated() for _ in range(workers)]
    for child in pool:
        children.put(child)
    stop = threading.Event()
    done: dict[int, ModelResult] = {}

    def build(i: int, spec: ModelSpec) -> None:
        if stop.is_set():
            return
        child = children.get()
        try:
            result = _build_isolated(child, spec)
        finally:
            children.put(child)
        if not stop.is_set():  # a build the interrupt cut short is cancelled, not a crash
            done[i] = result

    interrupted = _run_builds(specs, workers, build, event, stop, pool)
    return [done.get(i) or _cancelled(spec) for i, spec in enumerate(specs)], interrupted


def _run_builds(
    specs: Sequence[ModelSpec],
    workers: int,
    build: Callable[[int, ModelSpec], None],
    event: Event,
    stop: threading.Event,
    pool: Sequence[Isolated],
) -> bool:
    """Run `build` on every spec (in `workers` threads); True when interrupted. On Ctrl-C the
    pending builds are cancelled and the children killed at once, so nothing more runs."""
    threads = ThreadPoolExecutor(workers, thread_name_prefix="infercc-ci") if workers > 1 else None
    try:
        if threads is None:
            for i, spec in enumerate(specs):
                event(spec.name, "compiling")
                build(i, spec)
        else:
            futures = []
            for i, spec in enumerate(specs):
                event(spec.name, "compiling")
                futures.append(threads.submit(build, i, spec))
            for f in futures:
                f.result()
        return False
    except KeyboardInterrupt:
        stop.set()
        log.warning("interrupted: cancelling the models that have not finished")
        return True
    finally:
        stop_all(threads, pool)


def stop_all(threads: ThreadPoolExecutor | None, pool: Sequence[Isolated]) -> None:
    """Cancel what has not started, kill the children (a build waiting on one returns), then
    wait for the threads; a second Ctrl-C meanwhile does not cut the cleanup short."""
    with _sigint_ignored():
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
        _end(pool)
        if threads is not None:
            threads.shutdown(wait=True)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _cancelled(spec: ModelSpec, reason: str = CANCELLED) -> ModelResult:
    result = ModelResult(
        spec.name, str(spec.path), False, reason, precision=spec.precision, error=True
    )
    result.target, result.backend = spec.target, spec.backend
    return result


def _end(pool: Sequence[Isolated]) -> None:
    """Stop the children: killed at once, so that an interrupted run does not wait for them
    (the threads waiting on them then see them die and return)."""
    for child in pool:
        child.kill()
    for child in pool:
        child.close(kill=True)


def _build_isolated(child: Isolated, spec: ModelSpec) -> ModelResult:
    try:
        return child.call(build_and_validate, spec)
    except ChildDied as died:
        reason = f"the build process {died.describe()}: a crash in native code"
    except Exception as exc:  # e.g. a result that cannot be pickled
        reason = _reason(exc)
    log.debug("model %s: %s", spec.name, reason)
    return ModelResult(
        spec.name, str(spec.path), False, reason, precision=spec.precision, error=True
    )


def _bench_all(
    specs: Sequence[ModelSpec],
    results: list[ModelResult],
    jobs: int,
    event: Event,
    interrupted: bool = False,
) -> bool:
    """Time the models that passed, one at a time (timings never overlap), in a child.
    Returns whether the run was interrupted (before or during the benchmarks): the models not
    timed then fail as cancelled before their benchmark."""
    todo = [(s, r) for s, r in zip(specs, results, strict=True) if r.passed and s.benched]
    if not todo:
        return interrupted
    child = Isolated()
    timed = 0
    try:
        for spec, result in todo:
            if interrupted:
                break
            event(spec.name, "benching")
            _apply_latency(result, _bench_isolated(child, spec, result.output))
            timed += 1
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted: cancelling the benchmarks that have not finished")
    finally:
        with _sigint_ignored():
            _end([child])
    for _spec, result in todo[timed:]:
        _apply_latency(result, {"reason": CANCELLED_BENCH})
    return interrupted


def _bench_isolated(child: Isolated, spec: ModelSpec, output: str) -> dict[str, Any]:
    try:
        return child.call(bench_model, spec, output)
    except ChildDied as died:
        reason = f"the benchmark process {died.describe()}: a crash in native code"
        return {"reason": reason, "error": True}
    except Exception as exc:  # e.g. a result that cannot be pickled
        return {"reason": "benchmark failed: " + _reason(exc), "error": True}


def _apply_latency(result: ModelResult, latency: dict[str, Any]) -> None:
    reason = latency.pop("reason", None)
    error = bool(latency.pop("error", False))
    result.latency = latency
    if reason is not None:
        result.passed, result.reason, result.stage = False, reason, "bench"
        result.error = error
