"""The Python API under the `optimize` command: load, run passes, write atomically, validate."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc import passes as _passes
from infercc.analysis.memory import MemoryPlan, plan_memory
from infercc.analysis.targets import get_target
from infercc.backends.base import MODEL_FILE, CompileOptions
from infercc.backends.registry import get_backend, require_available
from infercc.check.compare import ValidationReport, validate
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.ir import Model, export_model, load_model, save_model
from infercc.ir.ops import STANDARD_DOMAINS
from infercc.ir.tensor import external_info
from infercc.passes.manager import DEFAULT_FOLD_LIMIT, PassContext, check_pass_names, run_passes
from infercc.passes.pipelines import FP16, OPTIMIZE, check_disabled
from infercc.runtime.artifact import check_destination, publish, staging_dir, write_manifest
from infercc.runtime.artifact import manifest as artifact_manifest
from infercc.runtime.ort_support import check_ir_version, warn_ir_version
from infercc.util import first_line

log = logging.getLogger(__name__)

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
DEFAULT_MIN_COSINE = 0.9999
# fp16 is judged by cosine against the fp32 original (elementwise tolerances would flag the
# expected rounding of large logits); the user's --atol/--rtol still apply when given.
FP16_MIN_COSINE = 0.999


def validation_tolerance(
    precision: str, atol: float | None, rtol: float | None, min_cosine: float | None
) -> dict[str, float]:
    """Tolerances that follow the precision: tight for fp32, cosine-based for fp16."""
    if precision == "fp32":
        defaults = (DEFAULT_ATOL, DEFAULT_RTOL, DEFAULT_MIN_COSINE)
    else:
        defaults = (float("inf"), float("inf"), FP16_MIN_COSINE)
    given = (atol, rtol, min_cosine)
    chosen = [d if v is None else v for v, d in zip(given, defaults, strict=True)]
    return dict(zip(("atol", "rtol", "min_cosine"), chosen, strict=True))


@dataclass
class OptimizeReport:
    """What `optimize` did, as data (`to_dict()` is the `--json` form)."""

    input: str
    output: str
    target: str
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    size_before: int
    size_after: int
    passes: dict[str, dict[str, Any]]
    iterations: int
    reached_fixpoint: bool
    refusals: list[dict[str, str]]
    validation: ValidationReport | None
    seconds: float
    files: list[str] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    artifact: dict[str, Any] | None = None
    precision: str = "fp32"
    kept_fp32: list[dict[str, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.validation is None or self.validation.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "files": self.files,
            "target": self.target,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "size_before": self.size_before,
            "size_after": self.size_after,
            "passes": self.passes,
            "iterations": self.iterations,
            "reached_fixpoint": self.reached_fixpoint,
            "refusals": self.refusals,
            "validation": self.validation.to_dict() if self.validation else None,
            "memory": self.memory,
            "artifact": self.artifact,
            "precision": self.precision,
            "kept_fp32": self.kept_fp32,
            "seconds": round(self.seconds, 4),
        }


def op_histogram(model: Model) -> dict[str, int]:
    """Op type -> count over the main graph and its subgraphs (custom domains as domain.Op)."""
    counts = Counter(
        n.op_type if n.domain in STANDARD_DOMAINS else f"{n.domain}.{n.op_type}"
        for n in model.graph.all_nodes()
    )
    return dict(sorted(counts.items()))


def model_files_size(path: Path, model: Model | None = None) -> int:
    """Bytes on disk: the model file plus the external data files it references."""
    size = path.stat().st_size
    if model is None:
        return size
    locations = {
        external_info(v.const.proto).get("location")
        for v in model.graph.initializers.values()
        if v.const is not None and v.const.is_external
    }
    for loc in locations:
        if loc and (path.parent / loc).is_file():
            size += (path.parent / loc).stat().st_size
    return size


def default_output(path: Path) -> Path:
    return path.with_name(f"{path.stem}.opt.onnx")


def read_ranges(
    source: str | os.PathLike[str] | Mapping[str, tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """Tensor ranges for `--fp16`: a calibrate `ranges.json` (name -> {min, max, ...}) or a
    mapping name -> (min, max)."""
    if isinstance(source, Mapping):
        return {str(k): (float(v[0]), float(v[1])) for k, v in source.items()}
    path = Path(source)
    try:
        data = json.loads(path.read_text())
        return {str(k): (float(v["min"]), float(v["max"])) for k, v in data.items()}
    except FileNotFoundError:
        raise InferccError(f"ranges file {str(path)!r} does not exist", "check the path") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise InferccError(
            f"cannot read ranges from {str(path)!r}: {first_line(exc)}",
            "pass the ranges.json that `infercc calibrate` writes (name -> {min, max})",
        ) from None


def check_target(target: str) -> str:
    """The canonical name of a known target (unknown names raise with the list)."""
    return get_target(target).name if target.lower() != "cpu" else "cpu"


def _check_output(src: Path, out: Path) -> None:
    if out.resolve() == src.resolve():
        raise InferccError(f"refusing to overwrite the input model {src}", "choose another -o path")
    if out.suffix != ".onnx":
        raise InferccError(
            f"output path {out} does not end in .onnx",
            "name an .onnx file with -o (artifact directories come with backends)",
        )
    if not out.parent.is_dir():
        raise InferccError(
            f"output directory {out.parent} does not exist", "create it first, or pick another -o"
        )
    if out.is_dir():
        raise InferccError(f"output path {out} is a directory", "name an .onnx file with -o")


def optimize(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    target: str = "cpu",
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    profiles: Sequence[ShapeProfile] | None = None,
    backend: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    tune: bool = True,
    backend_options: Mapping[str, Any] | None = None,
    fp16: bool = False,
    fp16_io: bool = False,
    keep_fp32: Sequence[str] = (),
    fp16_ranges: str | os.PathLike[str] | Mapping[str, tuple[float, float]] | None = None,
    data: str | os.PathLike[str] | None = None,
    disable_passes: Iterable[str] = (),
    portable: bool = False,
    run_validation: bool = True,
    fold_limit: int = DEFAULT_FOLD_LIMIT,
    verify: bool = False,
    external_data: bool | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    alignment: int = 64,
    on_step: Callable[[str], None] | None = None,
) -> OptimizeReport:
    """Optimize an ONNX model file and write the result; returns the report.

    `fp16_ranges` (with `fp16`): calibrated tensor ranges, a `ranges.json` written by
    `infercc calibrate` or a mapping name -> (min, max); a tensor whose range overflows
    float16 keeps its producer in float32.

    `backend_options` go to the backend (`CompileOptions.extra`; for `ort`:
    `save_optimized` writes onnxruntime's own optimized model for fast start).

    `output` ending in `.onnx` gets the optimized model alone, with its memory plan
    (`<stem>.memory_plan.json`) beside it. Any other `output` is an artifact directory built
    with `backend` (default: `ort` for the cpu target, `tensorrt` for GPU targets): the
    optimized `model.onnx`, `memory_plan.json`, the backend's files (tuned per shape profile,
    choices cached in the tuning cache at `cache_dir`) and `manifest.json`.

    The input is never modified. Everything is written under a temporary name and moved into
    place only after validation passes (a failed validation leaves nothing behind; the report
    says why). `profiles` (from `--shape NAME=MIN:OPT:MAX`) are what the backend tunes for;
    validation and the memory plan use one concrete shape per input: `shapes`, else a
    profile's opt, else the defaults of `infercc.data.signature.resolve_shapes`.
    """
    t0 = time.perf_counter()
    src = Path(model)
    out = Path(output) if output is not None else default_output(src)
    profiles = list(profiles or [])
    shapes = {**{p.name: p.opt for p in profiles}, **dict(shapes or {})}
    disabled = list(disable_passes)
    check_pass_names(disabled)
    check_disabled(disabled, [OPTIMIZE, FP16] if fp16 else [OPTIMIZE], "optimize")
    target = check_target(target)
    if fp16_ranges is not None and not fp16:
        raise InferccError("ranges are for --fp16 only", "add --fp16, or drop --ranges")
    ranges = read_ranges(fp16_ranges) if fp16_ranges is not None else None
    build = _Build(src, out, target, backend)
    step = on_step or (lambda _s: None)
    step("loading")
    ir = load_model(src)
    # Validation runs the original under onnxruntime: refuse before any work if it cannot.
    (check_ir_version if run_validation else warn_ir_version)(ir.ir_version, str(src))
    check_shape_names(ir, shapes)
    size_before = model_files_size(src, ir)
    nodes_before, ops_before = sum(1 for _ in ir.graph.all_nodes()), op_histogram(ir)
    profile = shape_profile(ir, shapes)
    ctx = PassContext(target=target, portable=portable, fold_limit=fold_limit, verify=verify)
    ctx.backend = build.backend_name if build.backend_name in ("ort", "tensorrt") else "ort"
    ctx.shapes = profile
    pipe = run_passes(
        ir, ctx, _passes.DEFAULT_PIPELINE, disabled, on_pass=lambda n: step(f"pass {n}")
    )
    precision = "fp32"
    kept_fp32: list[dict[str, str]] = []
    if fp16:
        precision = "fp16"
        ctx.fp16_io, ctx.keep_fp32, ctx.ranges = fp16_io, tuple(keep_fp32), ranges or None
        lowered = run_passes(ir, ctx, FP16.passes, disabled, on_pass=lambda n: step(f"pass {n}"))
        pipe.passes.update(lowered.passes)
        plan = lowered.details("convert-fp16")
        kept_fp32 = list(plan.kept_fp32) if plan is not None else []
    tol = validation_tolerance(precision, atol, rtol, min_cosine)
    nodes_after, ops_after = sum(1 for _ in ir.graph.all_nodes()), op_histogram(ir)
    step("planning memory")
    plan = _plan(ir, profile, alignment, pipe.details("schedule-memory"))
    passes = {name: st.to_dict() for name, st in pipe.passes.items()}
    memory = _memory_summary(plan, profile, build.plan_path)
    step("writing")
    stage = build.stage()
    try:
        staged = save_model(ir, stage / build.model_name, external_data=external_data)
        if plan is not None:
            staged.append(_write_json(stage / build.plan_path.name, plan.to_dict()))
        del ir
        gc.collect()  # the IR is a web of cycles: free its arrays before onnxruntime loads
        report_validation = None
        if run_validation:
            step("validating")
            report_validation = validate(
                src, staged[0], shapes=shapes, data=data, float_dtypes_may_differ=fp16_io, **tol
            )
        size_after = sum(p.stat().st_size for p in staged if p.suffix != ".json")
        files: list[str] = []
        artifact = None
        if report_validation is None or report_validation.passed:
            if build.artifact_mode:
                options = CompileOptions(
                    precision=precision, tune=tune, on_step=step, extra=dict(backend_options or {})
                )
                artifact = build.finish_artifact(
                    stage, profiles, cache_dir, options, passes, memory, report_validation
                )
                files = [str(p) for p in sorted(out.iterdir())]
            else:
                files = build.finish_file(staged)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return OptimizeReport(
        input=str(src),
        output=str(out),
        target=target,
        nodes_before=nodes_before,
        nodes_after=nodes_after,
        ops_before=ops_before,
        ops_after=ops_after,
        size_before=size_before,
        size_after=size_after,
        passes=passes,
        iterations=pipe.iterations,
        reached_fixpoint=pipe.reached_fixpoint,
        refusals=[r.to_dict() for r in pipe.refusals],
        validation=report_validation,
        seconds=time.perf_counter() - t0,
        files=files,
        memory=memory,
        artifact=artifact,
        precision=precision,
        kept_fp32=kept_fp32,
    )


class _Build:
    """Where the result goes: an .onnx file, or an artifact directory built by a backend."""

    def __init__(self, src: Path, out: Path, target: str, backend: str | None):
        self.src, self.out, self.target = src, out, target
        self.artifact_mode = out.suffix != ".onnx"
        if not self.artifact_mode:
            if backend not in (None, "none"):
                raise InferccError(
                    f"--backend {backend} builds an artifact directory, but -o names an .onnx file",
                    "give a directory with -o (e.g. -o build/model) to build with a backend",
                )
            _check_output(src, out)
            self.backend_name = "none"
            self.model_name = out.name
            self.plan_path = out.parent / memory_plan_name(out)
            return
        if src.resolve() == out.resolve():
            raise InferccError(f"refusing to overwrite the input model {src}", "pick another -o")
        self.backend_name = backend or ("ort" if target == "cpu" else "tensorrt")
        self.backend = get_backend(self.backend_name)
        require_available(self.backend)
        check_destination(out)
        self.model_name = MODEL_FILE
        self.plan_path = out / "memory_plan.json"

    def stage(self) -> Path:
        if self.artifact_mode:
            return staging_dir(self.out)
        return Path(tempfile.mkdtemp(prefix=".infercc-", dir=self.out.parent))

    def finish_file(self, staged: list[Path]) -> list[str]:
        files = []
        for p in staged:
            os.replace(p, self.out.parent / p.name)
            files.append(str(self.out.parent / p.name))
        return files

    def finish_artifact(
        self,
        stage: Path,
        profiles: list[ShapeProfile],
        cache_dir: str | os.PathLike[str] | None,
        options: CompileOptions,
        passes: dict[str, Any],
        memory: dict[str, Any] | None,
        validation: ValidationReport | None,
    ) -> dict[str, Any]:
        from infercc.runtime.tuning import TuningCache, file_sha256, host_fingerprint

        if options.on_step is not None:
            options.on_step(f"compiling with {self.backend_name}")
        target = get_target(self.target)
        t0 = time.perf_counter()
        with TuningCache(cache_dir) as cache:
            section = self.backend.compile(
                stage / MODEL_FILE,
                target,
                profiles,
                options,
                cache if options.tune else None,
                stage,
            )
        compile_seconds = time.perf_counter() - t0
        write_manifest(
            stage,
            artifact_manifest(
                source=self.src,
                source_sha256=file_sha256(self.src),
                passes=passes,
                target=target.to_dict(),
                host=host_fingerprint(),
                backend=section,
                profiles=profiles,
                precision=options.precision,
                memory=memory,
                validation=validation.to_dict() if validation is not None else None,
            ),
        )
        publish(stage, self.out)
        return {
            "path": str(self.out),
            "backend": section,
            "compile_seconds": round(compile_seconds, 4),
        }


def check_shape_names(model: Model, shapes: Mapping[str, tuple[int, ...]] | None) -> None:
    names = [v.name for v in model.graph.inputs]
    for name, dims in (shapes or {}).items():
        if name not in names:
            raise InferccError(
                f"--shape names {name!r}, which is not an input of the model",
                "model inputs: " + ", ".join(names),
            )
        v = model.graph.inputs[names.index(name)]
        if v.shape is not None and len(v.shape) != len(dims):
            raise InferccError(
                f"--shape {name} has rank {len(dims)} but the input has rank {len(v.shape)}",
                "give one size per dimension, e.g. NAME=1x3x224x224",
            )


def memory_plan_name(out: Path) -> str:
    return f"{out.stem}.memory_plan.json"


def shape_profile(
    model: Model, shapes: Mapping[str, tuple[int, ...]] | None
) -> dict[str, tuple[int, ...]] | None:
    """Concrete input shapes for planning (the ones validation uses), or None if unresolvable."""
    from infercc.data.signature import resolve_shapes

    try:
        return resolve_shapes(export_model(model, with_weights=False), dict(shapes or {}))
    except InferccError as e:
        log.info("no shape profile for memory planning: %s", e)
        return None


def _plan(
    model: Model, profile: dict[str, tuple[int, ...]] | None, alignment: int, peaks: Any
) -> MemoryPlan | None:
    """The memory plan at `profile`, with schedule-memory's `SchedulePeaks` (None when it did
    not run)."""
    if profile is None:
        return None
    plan = plan_memory(model, profile, alignment=alignment)
    if peaks is not None:
        plan.peak_before_schedule = peaks.peak_before
        plan.peak_after_schedule = peaks.peak_after
    return plan


def _memory_summary(
    plan: MemoryPlan | None, profile: dict[str, tuple[int, ...]] | None, plan_path: Path
) -> dict[str, Any] | None:
    if plan is None:
        return None
    return {
        "naive_bytes": plan.naive_bytes,
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes,
        "weights_bytes": plan.weights_bytes,
        "arena_over_bound": round(plan.ratio, 4),
        "heuristic": plan.heuristic,
        "alignment": plan.alignment,
        "peak_before_schedule": plan.peak_before_schedule,
        "peak_after_schedule": plan.peak_after_schedule,
        "unplanned": len(plan.unknown),
        "shape_profile": {k: list(v) for k, v in (profile or {}).items()},
        "plan": str(plan_path),
    }


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path
