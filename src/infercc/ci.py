"""`infercc ci`: compile, validate and time many models from one manifest; report for CI.

The manifest is a TOML file (`infercc.toml`), or the `[tool.infercc]` table of a
`pyproject.toml`. Paths in it are relative to the file:

```toml
[ci]                               # optional
out_dir = "build/infercc-ci"       # one artifact per model goes here (the default)
cache_dir = ".infercc-cache"       # the tuning cache [default: $INFERCC_CACHE_DIR, ~/.cache]
warmup = 5                         # benchmark runs, for models with a budget or baseline
iters = 50

[defaults]                         # optional: keys every model inherits
target = "cpu"

[[models]]
name = "small_cnn"                 # default: the file's stem; must be unique
path = "../small_cnn.onnx"
backend = "ort"                    # ort | tensorrt | none (none: an optimized .onnx file)
precision = "fp32"                 # fp32 | fp16 | int8 (int8: the model must already be QDQ)
shapes = { image = "1x3x32x32" }   # or [1, 3, 32, 32], or a range "1x3x32x32:8x3x32x32:..."
data = "samples/"                  # validate on these samples instead of random inputs
golden = "golden/"                 # or against goldens written by `infercc validate`
reference = "model_fp32.onnx"      # validate against this model instead of `path`
atol = 1e-4                        # rtol, min_cosine: defaults follow the precision
tolerances = { logits = "1e-3:1e-2" }   # per output ATOL:RTOL (or {atol=, rtol=})
latency_budget_ms = 5.0            # fail when the median latency is above it
baseline = "build/last/small_cnn"  # or: fail when slower than this model/artifact by more
max_slowdown = 1.10                #     than this ratio (median of interleaved pairs)
```

Each model is compiled with `infercc.api.optimize` (its own validation gates the write), then
its output is validated through the runner of its backend (`infercc.validate_cli`), so what
is checked is what will be deployed. Models run in parallel with `jobs > 1` (one process
each, `spawn`ed, so a crash, even a segfault, fails that model only); every exception is
caught per model and becomes its failure reason. Benchmarks run after all models are built,
one at a time (in a separate process when `jobs > 1`), so timings are not taken on a machine
busy compiling other models.

A bad manifest raises `InferccError` (exit 2); a failed model makes `CiReport.passed` false
(exit 1). Reports: `CiReport.to_dict()` (JSON), JUnit XML (one testcase per model, a
`failure` element with the reason), and Markdown (appended to `$GITHUB_STEP_SUMMARY`).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.data.profiles import ShapeProfile, parse_profile
from infercc.errors import InferccError
from infercc.util import first_line, json_float

log = logging.getLogger(__name__)

DEFAULT_OUT_DIR = "build/infercc-ci"
BACKENDS = ("ort", "tensorrt", "none")
PRECISIONS = ("fp32", "fp16", "int8")
_MODEL_KEYS = {
    "name": str,
    "path": str,
    "target": str,
    "backend": str,
    "precision": str,
    "shapes": dict,
    "data": str,
    "golden": str,
    "reference": str,
    "atol": float,
    "rtol": float,
    "min_cosine": float,
    "tolerances": dict,
    "latency_budget_ms": float,
    "baseline": str,
    "max_slowdown": float,
    "disable_passes": list,
    "portable": bool,
    "warmup": int,
    "iters": int,
}
_CI_KEYS = {"out_dir": str, "cache_dir": str, "warmup": int, "iters": int}
_TOP_KEYS = ("ci", "defaults", "models")

Event = Callable[[str, str], None]


# --------------------------------------------------------------------------- manifest


@dataclass
class ModelSpec:
    """One model of the manifest, with paths resolved."""

    name: str
    path: Path
    output: Path
    target: str = "cpu"
    backend: str | None = None
    precision: str = "fp32"
    profiles: list[ShapeProfile] = field(default_factory=list)
    data: Path | None = None
    golden: Path | None = None
    reference: Path | None = None
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    latency_budget_ms: float | None = None
    baseline: Path | None = None
    max_slowdown: float = 1.10
    disable_passes: list[str] = field(default_factory=list)
    portable: bool = False
    warmup: int = 5
    iters: int = 50
    cache_dir: Path | None = None

    @property
    def benched(self) -> bool:
        return self.latency_budget_ms is not None or self.baseline is not None


@dataclass
class CiConfig:
    path: Path
    out_dir: Path
    models: list[ModelSpec]


def load_config(path: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None):
    """Parse and check a manifest; `out_dir` overrides its `[ci] out_dir`."""
    path = Path(path)
    table = _read_table(path)
    unknown = sorted(set(table) - set(_TOP_KEYS))
    if unknown:
        _bad(path, f"unknown table {unknown[0]!r}", "the manifest has [ci], [defaults], [[models]]")
    ci = _checked(path, "[ci]", _table(path, table, "ci"), _CI_KEYS)
    defaults = _checked(path, "[defaults]", _table(path, table, "defaults"), _MODEL_KEYS)
    base = path.parent
    root = Path(out_dir) if out_dir is not None else _join(base, ci.get("out_dir", DEFAULT_OUT_DIR))
    models = table.get("models")
    if not isinstance(models, list) or not models:
        _bad(path, "no models", "add [[models]] tables, each with a path")
    specs = [
        _model_spec(path, i, {**defaults, **_checked(path, f"models[{i}]", m, _MODEL_KEYS)}, ci)
        for i, m in enumerate(_tables(path, models))
    ]
    _check_unique(path, specs)
    for spec in specs:
        spec.output = root / spec.output
    return CiConfig(path, root, specs)


def _read_table(path: Path) -> dict[str, Any]:
    tomllib = _tomllib()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InferccError(f"manifest {str(path)!r} does not exist", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InferccError(f"cannot read manifest {str(path)!r}: {exc}", "check the file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InferccError(
            f"manifest {str(path)!r} is not valid TOML: {first_line(exc)}", "fix the syntax"
        ) from None
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("infercc")
        if not isinstance(data, dict):
            _bad(path, "has no [tool.infercc] table", "add [[tool.infercc.models]] tables")
    return data


def _tomllib() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise InferccError(
                "reading TOML needs Python 3.11 or the tomli package", "pip install tomli"
            ) from None
    return tomllib


def _bad(path: Path, problem: str, hint: str) -> None:
    raise InferccError(f"manifest {path.name}: {problem}", hint)


def _table(path: Path, table: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        _bad(path, f"[{key}] must be a table", f"write [{key}] followed by key = value lines")
    return value


def _tables(path: Path, models: list[Any]) -> list[dict[str, Any]]:
    for i, m in enumerate(models):
        if not isinstance(m, dict):
            _bad(path, f"models[{i}] is not a table", "write each model as a [[models]] table")
    return models


def _checked(path: Path, where: str, table: Mapping[str, Any], keys: Mapping[str, type]):
    """The table with each key known and of its type (an int is a float where one is due)."""
    for key, value in table.items():
        expected = keys.get(key)
        if expected is None:
            _bad(path, f"{where}: unknown key {key!r}", "known keys: " + ", ".join(sorted(keys)))
        ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
        ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            _bad(path, f"{where}: {key} must be a {expected.__name__}", f"fix {key} = ...")
    return dict(table)


def _model_spec(path: Path, i: int, m: dict[str, Any], ci: Mapping[str, Any]) -> ModelSpec:
    where = f"models[{i}]"
    if "path" not in m:
        _bad(path, f"{where} has no path", 'give path = "model.onnx" (relative to the manifest)')
    base = path.parent
    model = _join(base, m["path"])
    name = m.get("name") or Path(m["path"]).stem
    precision = m.get("precision", "fp32")
    backend = m.get("backend")
    _check_choice(path, where, "precision", precision, PRECISIONS)
    if backend is not None:
        _check_choice(path, where, "backend", backend, BACKENDS)
    if "latency_budget_ms" in m and not m["latency_budget_ms"] > 0:
        _bad(path, f"{where}: latency_budget_ms must be positive", "give milliseconds, e.g. 5.0")
    return ModelSpec(
        name=name,
        path=model,
        output=Path(f"{name}.opt.onnx" if backend == "none" else name),
        target=m.get("target", "cpu"),
        backend=backend,
        precision=precision,
        profiles=_profiles(path, where, m.get("shapes", {})),
        data=_opt_path(base, m.get("data")),
        golden=_opt_path(base, m.get("golden")),
        reference=_opt_path(base, m.get("reference")),
        atol=_opt_float(m.get("atol")),
        rtol=_opt_float(m.get("rtol")),
        min_cosine=_opt_float(m.get("min_cosine")),
        tolerances=_tolerances(path, where, m.get("tolerances", {})),
        latency_budget_ms=_opt_float(m.get("latency_budget_ms")),
        baseline=_opt_path(base, m.get("baseline")),
        max_slowdown=float(m.get("max_slowdown", 1.10)),
        disable_passes=[str(p) for p in m.get("disable_passes", [])],
        portable=bool(m.get("portable", False)),
        warmup=int(m.get("warmup", ci.get("warmup", 5))),
        iters=int(m.get("iters", ci.get("iters", 50))),
        cache_dir=_opt_path(base, ci.get("cache_dir")),
    )


def _check_choice(path: Path, where: str, key: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        _bad(path, f"{where}: {key} {value!r} is not one of {', '.join(allowed)}", "pick one")


def _opt_path(base: Path, value: str | None) -> Path | None:
    return None if value is None else _join(base, value)


def _join(base: Path, value: str) -> Path:
    """`value` relative to the manifest's directory, `..` collapsed for readable reports."""
    return Path(os.path.normpath(base / value))


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _profiles(path: Path, where: str, shapes: Mapping[str, Any]) -> list[ShapeProfile]:
    profiles = []
    for name, value in shapes.items():
        if isinstance(value, list) and all(isinstance(d, int) for d in value):
            value = "x".join(str(d) for d in value)
        if not isinstance(value, str):
            _bad(path, f'{where}: shapes.{name} must be "1x3x224x224" or a list of ints', "fix it")
        try:
            profiles.append(parse_profile(f"{name}={value}"))
        except InferccError as exc:
            _bad(path, f"{where}: shapes.{name}: {exc.message}", exc.hint or "fix it")
    return profiles


def _tolerances(path: Path, where: str, table: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    from infercc.validate_cli import parse_tolerances

    result = {}
    for name, value in table.items():
        if isinstance(value, dict) and set(value) <= {"atol", "rtol"}:
            value = f"{value.get('atol', 0.0)}:{value.get('rtol', 0.0)}"
        try:
            result.update(parse_tolerances([f"{name}={value}"]))
        except InferccError:
            _bad(
                path,
                f"{where}: tolerances.{name} = {value!r}",
                'write "ATOL:RTOL" or {atol=, rtol=}',
            )
    return result


def _check_unique(path: Path, specs: Sequence[ModelSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            _bad(path, f"two models are named {spec.name!r}", "give each model a unique name")
        seen.add(spec.name)


# --------------------------------------------------------------------------- results


@dataclass
class ModelResult:
    """What happened to one model; `reason` says why it failed."""

    name: str
    path: str
    passed: bool
    reason: str | None = None
    stage: str = "compile"  # where it failed (compile, validate, bench), or done
    precision: str | None = None
    target: str | None = None
    backend: str | None = None
    output: str | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    validation: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "passed": self.passed,
            "reason": self.reason,
            "stage": self.stage,
            "precision": self.precision,
            "target": self.target,
            "backend": self.backend,
            "output": self.output,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "validation": self.validation,
            "latency": self.latency,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class CiReport:
    """Every model's result (`to_dict()` is the `--json` form)."""

    config: str
    out_dir: str
    jobs: int
    models: list[ModelResult]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.models)

    def failures(self) -> list[ModelResult]:
        return [m for m in self.models if not m.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "out_dir": self.out_dir,
            "jobs": self.jobs,
            "passed": self.passed,
            "total": len(self.models),
            "failed": len(self.failures()),
            "models": [m.to_dict() for m in self.models],
            "seconds": round(self.seconds, 4),
        }


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
        result.reason = _reason(exc)
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
    from infercc.validate_cli import default_tolerance

    if spec.precision == "int8":
        _require_qdq(spec.path)
    tol = default_tolerance(spec.precision, spec.atol, spec.rtol, spec.min_cosine)
    report = optimize(
        spec.path,
        spec.output,
        target=spec.target,
        profiles=spec.profiles,
        backend=spec.backend,
        cache_dir=spec.cache_dir,
        fp16=spec.precision == "fp16",
        data=spec.data,
        disable_passes=spec.disable_passes,
        portable=spec.portable,
        run_validation=not spec.tolerances,
        **tol,
    )
    result.output = str(spec.output)
    result.nodes_before, result.nodes_after = report.nodes_before, report.nodes_after
    result.backend = (report.artifact or {}).get("backend", {}).get("name", "none")
    if not report.passed:
        result.validation = report.validation.to_dict()
        result.reason = "validation failed: " + _failed_outputs(report.validation)


def _require_qdq(path: Path) -> None:
    from infercc.runtime.bench import read_skeleton
    from infercc.validate_cli import model_precision

    if model_precision(read_skeleton(path)) != "int8":
        raise InferccError(
            "precision int8 needs an already-calibrated QDQ model",
            "run infercc calibrate MODEL --int8 --data DIR first and point path at it",
        )


def _validate(spec: ModelSpec, result: ModelResult) -> None:
    from infercc.validate_cli import validate_candidate

    check = validate_candidate(
        spec.output,
        None if spec.golden is not None else (spec.reference or spec.path),
        golden=spec.golden,
        data=spec.data,
        shapes={p.name: p.opt for p in spec.profiles},
        atol=spec.atol,
        rtol=spec.rtol,
        min_cosine=spec.min_cosine,
        tolerances=spec.tolerances,
    )
    result.validation = check.validation.to_dict() if check.validation else None
    if not check.passed:
        result.reason = "validation failed: " + _failed_outputs(check.validation)


def _failed_outputs(validation: Any) -> str:
    return "; ".join(f"{m.name}: {m.reason}" for m in validation.failures())


def bench_model(spec: ModelSpec, output: str) -> dict[str, Any]:
    """Median latency against the budget, and the ratio to the baseline; `reason` on failure."""
    from infercc.runtime import bench

    shapes = {p.name: p.opt for p in spec.profiles}
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
    out_dir: str | os.PathLike[str] | None = None,
    only: Sequence[str] | None = None,
    junit: str | os.PathLike[str] | None = None,
    json_report: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    step_summary: bool = True,
    on_event: Event | None = None,
) -> CiReport:
    """Compile, validate and bench every model of the manifest; write the reports asked for.

    `only` keeps the named models; `on_event(name, what)` is called as each model starts
    ("compiling"), is timed ("benching") and ends ("passed" or "failed"). `step_summary`
    appends the Markdown summary to `$GITHUB_STEP_SUMMARY` when that is set.
    """
    t0 = time.perf_counter()
    if jobs < 1:
        raise InferccError(f"--jobs {jobs} is not a positive number", "give --jobs 1 or more")
    config = load_config(config_path, out_dir)
    specs = _select(config, only)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    event = on_event or (lambda _name, _what: None)
    results = _run_all(specs, jobs, event)
    _bench_all(specs, results, jobs, event)
    for r in results:
        event(r.name, "passed" if r.passed else "failed")
    report = CiReport(str(config.path), str(config.out_dir), jobs, results, 0.0)
    report.seconds = time.perf_counter() - t0
    write_reports(report, junit, json_report, markdown, step_summary)
    return report


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


def _run_all(specs: Sequence[ModelSpec], jobs: int, event: Event) -> list[ModelResult]:
    if jobs == 1 or len(specs) == 1:
        results = []
        for spec in specs:
            event(spec.name, "compiling")
            results.append(build_and_validate(spec))
        return results
    with ProcessPoolExecutor(min(jobs, len(specs)), mp_context=_context()) as pool:
        futures = []
        for spec in specs:
            event(spec.name, "compiling")
            futures.append(pool.submit(build_and_validate, spec))
        return [_collect(spec, f) for spec, f in zip(specs, futures, strict=True)]


def _context() -> Any:
    # spawn: a fresh interpreter per worker; forking a process that holds onnxruntime's thread
    # pools is not safe.
    return multiprocessing.get_context("spawn")


def _collect(spec: ModelSpec, future: Future) -> ModelResult:
    try:
        return future.result()
    except BrokenProcessPool:
        reason = "the worker process died (a crash in native code?)"
    except Exception as exc:  # e.g. a result that cannot be unpickled
        reason = _reason(exc)
    return ModelResult(spec.name, str(spec.path), False, reason, precision=spec.precision)


def _bench_all(
    specs: Sequence[ModelSpec], results: list[ModelResult], jobs: int, event: Event
) -> None:
    todo = [(s, r) for s, r in zip(specs, results, strict=True) if r.passed and s.benched]
    if not todo:
        return
    if jobs == 1:
        for spec, result in todo:
            event(spec.name, "benching")
            _apply_latency(result, bench_model(spec, result.output))
        return
    with ProcessPoolExecutor(1, mp_context=_context()) as pool:  # one at a time
        for spec, result in todo:
            event(spec.name, "benching")
            _apply_latency(result, _bench_isolated(pool, spec, result.output))


def _bench_isolated(pool: ProcessPoolExecutor, spec: ModelSpec, output: str) -> dict[str, Any]:
    try:
        return pool.submit(bench_model, spec, output).result()
    except BrokenProcessPool:
        return {"reason": "the benchmark process died (a crash in native code?)"}


def _apply_latency(result: ModelResult, latency: dict[str, Any]) -> None:
    reason = latency.pop("reason", None)
    result.latency = latency
    if reason is not None:
        result.passed, result.reason, result.stage = False, reason, "bench"


# --------------------------------------------------------------------------- reports


def write_reports(
    report: CiReport,
    junit: str | os.PathLike[str] | None = None,
    json_report: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    step_summary: bool = True,
) -> None:
    """Write the JUnit, JSON and Markdown files asked for, and the GitHub step summary."""
    if junit is not None:
        Path(junit).write_text(junit_xml(report))
    if json_report is not None:
        Path(json_report).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    text = None
    if markdown is not None or (step_summary and os.environ.get("GITHUB_STEP_SUMMARY")):
        from infercc.cli.render import ci_markdown

        text = ci_markdown(report)
    if markdown is not None:
        Path(markdown).write_text(text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(text + "\n")


def junit_xml(report: CiReport) -> str:
    """JUnit XML: one testsuite, one testcase per model, a failure element with the reason."""
    failures = len(report.failures())
    suites = ET.Element(
        "testsuites", tests=str(len(report.models)), failures=str(failures), errors="0"
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="infercc ci",
        tests=str(len(report.models)),
        failures=str(failures),
        errors="0",
        skipped="0",
        time=f"{report.seconds:.3f}",
    )
    for m in report.models:
        case = ET.SubElement(
            suite, "testcase", classname="infercc.ci", name=m.name, time=f"{m.seconds:.3f}"
        )
        if not m.passed:
            failure = ET.SubElement(case, "failure", message=m.reason or "failed", type=m.stage)
            failure.text = json.dumps(m.to_dict(), indent=1)
        ET.SubElement(case, "system-out").text = _summary_line(m)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _summary_line(m: ModelResult) -> str:
    parts = [f"{m.path} -> {m.output or '-'}", f"precision {m.precision}"]
    if m.nodes_before is not None:
        parts.append(f"nodes {m.nodes_before} -> {m.nodes_after}")
    cosine = _worst_cosine(m.validation)
    if cosine is not None:
        parts.append(f"worst cosine {cosine:.6f}")
    if m.latency and m.latency.get("p50_ms") is not None:
        parts.append(f"p50 {m.latency['p50_ms']:.3f} ms")
    return ", ".join(parts)


def _worst_cosine(validation: Mapping[str, Any] | None) -> float | None:
    """The smallest cosine over outputs of a validation dict (None when there is none)."""
    values = []
    for out in (validation or {}).get("outputs", {}).values():
        c = out.get("cosine")
        values.append(float(c) if isinstance(c, (int, float)) else math.nan)
    if not values:
        return None
    return min(values, key=lambda v: (not math.isnan(v), v))


def worst_metrics(validation: Mapping[str, Any] | None) -> dict[str, Any]:
    """Largest max_abs and smallest cosine over outputs, JSON-safe (for tables)."""
    outs = list((validation or {}).get("outputs", {}).values())
    max_abs = [o["max_abs"] for o in outs if isinstance(o.get("max_abs"), (int, float))]
    return {
        "max_abs": json_float(max(max_abs)) if max_abs else None,
        "cosine": json_float(_worst_cosine(validation)),
    }
