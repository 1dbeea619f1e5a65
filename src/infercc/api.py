"""The Python API under the `optimize` command: load, run passes, write atomically, validate."""

from __future__ import annotations

import gc
import inspect
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, overload

import onnx

from infercc.analysis.decoder import pinned_signature
from infercc.analysis.memory import MemoryPlan, plan_memory
from infercc.analysis.model_info import model_files_size, op_histogram
from infercc.analysis.targets import get_target
from infercc.assumptions import check_used
from infercc.assumptions import describe as describe_assumptions
from infercc.assumptions import hints as assumption_hints
from infercc.build import Job, Stage, run_steps, stage_context
from infercc.check.compare import ValidationReport
from infercc.check.validation import validate
from infercc.config import BuildConfig, assumption_passes, canonical_target, read_ranges
from infercc.data.feeds import input_ranges as generated_ranges
from infercc.data.samples import IN_MEMORY_SAMPLES, SampleData, in_memory
from infercc.data.signature import check_shape_names, shape_profile, warn_shape_conflicts
from infercc.errors import InferccError, ValidationError
from infercc.ir import Model, export_model, load_model, save_model
from infercc.ir.sources import IN_MEMORY, ModelInput, is_proto, model_file
from infercc.ir.static_shapes import fix_input_shapes
from infercc.ir.tensor import external_info
from infercc.options import keyword_defaults
from infercc.outputs import Staging, check_output_file, publish_files
from infercc.passes.pipelines import FP16, OPTIMIZE, optimize_stages
from infercc.precisions import MOVEMENT_K, tolerance
from infercc.runtime.artifact import (
    MODEL_FILE,
    check_destination,
    publish,
    staging_dir,
    write_manifest,
)
from infercc.runtime.artifact import manifest as artifact_manifest
from infercc.runtime.backend import CompileOptions
from infercc.runtime.ort_support import check_ir_version, custom_op_libraries, warn_ir_version
from infercc.runtime.registry import get_backend, require_available
from infercc.util import json_text
from infercc.version import __version__

log = logging.getLogger(__name__)

__all__ = [
    "BuildConfig",
    "OptimizeReport",
    "OptimizedModel",
    "build_config",
    "optimize",
    "read_ranges",
]


@dataclass
class OptimizeReport:
    """What `optimize` did, as data (`to_dict()` is the `--json` form)."""

    input: str
    output: str
    target: str
    nodes_before: int  # the main graph's nodes, as the file's graph holds them
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
    build: dict[str, Any] | None = None  # the BuildConfig, as data
    # Initializers also listed as graph inputs: kept as inputs, or frozen into constants.
    overridable_inputs: dict[str, Any] = field(default_factory=dict)
    # A failed validation: the bisection's verdict (BisectReport.to_dict()), or when it was
    # too costly to run by itself, how to run it.
    bisect: dict[str, Any] | None = None
    bisect_hint: str | None = None
    static_shapes: dict[str, list[int]] | None = None  # --static-shapes: valid only for them
    assumptions: list[dict[str, Any]] = field(default_factory=list)
    # Assumptions not stated under which rewrites were refused only for want of them
    # (`infercc.assumptions.hints`).
    assumption_hints: list[dict[str, Any]] = field(default_factory=list)
    written: bool = False  # the output was published (False after a failed validation)
    # Graph outputs whose declared type the graph contradicts, replaced by the computed type
    # (infercc.ir.output_types): {"output", "declared", "computed"}.
    output_types: list[dict[str, Any]] = field(default_factory=list)
    # Nodes inside If/Loop/Scan bodies (at any depth), counted apart from the main graph's.
    body_nodes_before: int = 0
    body_nodes_after: int = 0

    @property
    def passed(self) -> bool:
        return self.validation is None or self.validation.passed

    def to_dict(self) -> dict[str, Any]:
        """`output` is the path written, or None when nothing was (`destination` is where the
        result was to go either way)."""
        return {
            "input": self.input,
            "output": self.output if self.written else None,
            "destination": self.output,
            "written": self.written,
            "files": self.files,
            "target": self.target,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "body_nodes_before": self.body_nodes_before,
            "body_nodes_after": self.body_nodes_after,
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
            "assumptions": self.assumptions,
            "assumption_hints": self.assumption_hints,
            "output_types": self.output_types,
            "build": self.build,
            "overridable_inputs": self.overridable_inputs,
            "bisect": self.bisect,
            "bisect_hint": self.bisect_hint,
            "static_shapes": self.static_shapes,
            "valid_only_for_static_shapes": self.static_shapes is not None,
            "seconds": round(self.seconds, 4),
        }


def default_output(path: Path) -> Path:
    return path.with_name(f"{path.stem}.opt.onnx")


def is_model_file(path: str | os.PathLike[str]) -> bool:
    """True when `path` names an .onnx file (any case: x.ONNX too), which optimize writes
    alone; any other path is an artifact directory."""
    return Path(path).suffix.lower() == ".onnx"


def check_target(target: str) -> str:
    """The canonical name of a known target (unknown names raise with the list)."""
    return canonical_target(target)


def _check_output(src: Path, out: Path) -> None:
    """The files an .onnx output writes (model, external data, memory plan) can be written:
    none is a directory, their folder is writable or can be created."""
    if _same_file(out, src):
        raise InferccError(f"refusing to overwrite the input model {src}", "choose another -o path")
    if out.is_dir():
        raise InferccError(f"output path {out} is a directory", "name an .onnx file with -o")
    for path in output_files(out):
        check_output_file(path, "-o")


def output_files(out: Path) -> list[Path]:
    """What `optimize` may write for an .onnx `out`: the model, its external data, its plan."""
    return [out, out.with_name(out.name + ".data"), out.parent / memory_plan_name(out)]


def input_files(src: Path, model: Model) -> list[Path]:
    """The files a model reads: the model itself and the external data files it names."""
    files = [src]
    for value in model.graph.initializers.values():
        tensor = value.const
        if tensor is not None and tensor.is_external:
            location = external_info(tensor.proto).get("location")
            if location and (src.parent / location) not in files:
                files.append(src.parent / location)
    return files


def _same_file(a: Path, b: Path) -> bool:
    """The same file: one path resolves to the other, or both are one inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_inputs_untouched(src: Path, model: Model, out: Path, artifact: bool) -> None:
    """Refuse an output (or side file) that is the input or one of the files it reads, and
    an artifact directory that holds one of them (publishing would replace it)."""
    reads = input_files(src, model)
    if artifact:
        root = out.resolve()
        for path in reads:
            if root == path.resolve() or root in path.resolve().parents:
                raise InferccError(
                    f"-o {out} holds {path}, which the input model reads; publishing would "
                    "replace it",
                    "pick an artifact directory that does not hold the input",
                )
        return
    for written in output_files(out):
        for path in reads:
            if _same_file(written, path):
                what = "the input model" if path == src else "a file the input model reads"
                raise InferccError(
                    f"-o {out} would overwrite {path} ({what}) with {written.name}",
                    "choose another -o path",
                )


def build_config(**options: Any) -> BuildConfig:
    """The `BuildConfig` that `optimize`'s keyword arguments stand for: one keyword per field
    of `BuildConfig` (its default as there; `infercc.config` declares each), `ort` and
    `tensorrt` as `OrtOptions`/`TrtOptions` or dicts of their fields. None means not given.

    Older names still work: `run_validation` is `validate`, `fp16=True` is
    `precision="fp16"`, `fp16_ranges` is `ranges` (with fp16: calibrated tensor ranges, a
    `ranges.json` written by `infercc calibrate` or a mapping name -> (min, max)), and
    `profiles` (`ShapeProfile`s, from `--shape NAME=MIN:OPT:MAX`) are what a backend tunes
    for. `shapes` pins one concrete shape per input (it wins over a profile of the same
    input), a tuple of ints or a `--shape` string (`{"image": (1, 3, 224, 224)}` or
    `{"image": "1x3x224x224"}`); a range's OPT is validation's first shape profile and its
    MAX the second. `strict_coverage` fails a rewritten If/Loop body the validation inputs
    never ran; `bisect` bisects a failed validation however long it takes (else only when that
    is cheap). `static_shapes` fixes inputs' dimensions in the model itself
    (`infercc.ir.static_shapes`): the result is valid only for those shapes, which the report
    and the manifest record. `assume` names assumptions about the inputs
    (`infercc.assumptions`) under which more rewrites are exact.

    An initializer the model (IR >= 4) also lists as a graph input is a default the caller
    may override: it stays an input, and nothing is folded or fused through it, unless
    `freeze_initializers` makes such initializers constants (and drops them from the inputs);
    on a model that has none it is refused (it would change nothing).

    An unknown keyword, or two names of one field given different values, is an
    `InferccError`.
    """
    return BuildConfig.from_keywords(options)


build_config.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
        for name, default in keyword_defaults(BuildConfig)
    ],
    return_annotation=BuildConfig,
)


class OptimizedModel(NamedTuple):
    """`optimize` without an output: the optimized model in memory and what was done to it
    (`model` is None when validation failed; `report.validation` says why)."""

    model: onnx.ModelProto | None
    report: OptimizeReport


@overload
def optimize(
    model: ModelInput,
    output: None = None,
    config: BuildConfig | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
    **options: Any,
) -> OptimizedModel: ...


@overload
def optimize(
    model: ModelInput,
    output: str | os.PathLike[str],
    config: BuildConfig | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
    **options: Any,
) -> OptimizeReport: ...


def optimize(
    model: ModelInput,
    output: str | os.PathLike[str] | None = None,
    config: BuildConfig | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
    **options: Any,
) -> OptimizeReport | OptimizedModel:
    """Optimize an ONNX model as `config` says; write the result to `output` and return the
    report, or, without an `output`, return the optimized model itself:

        model, report = infercc.optimize(onnx.load("model.onnx"))   # nothing is written
        onnx.save(model, "model.opt.onnx")
        report = infercc.optimize("model.onnx", "model.opt.onnx")    # written, validated

    `model` is a path or an in-memory `onnx.ModelProto`. Without `output` the result is an
    `OptimizedModel` named tuple, `(model, report)`: the optimized `onnx.ModelProto` (None
    when validation failed) and the report (its `output` is `"<onnx.ModelProto>"`); the
    build is the one a `.onnx` output gets, run in a private temporary directory.

    `config` is a `BuildConfig`; keyword `options` instead build one (`build_config` lists
    them: `target`, `precision`, `portable`, `validate`...). `config.check()` refuses
    combinations that would have no effect, before anything is read.

    `output` ending in `.onnx` gets the optimized model alone, with its memory plan
    (`<stem>.memory_plan.json`) beside it. Any other `output` is an artifact directory built
    with the config's backend (default: `ort` for the cpu target, `tensorrt` for GPU targets):
    the optimized `model.onnx`, `memory_plan.json`, the backend's files (tuned per shape
    profile, choices cached in the tuning cache at `cache_dir`) and `manifest.json`, whose
    `build` section is the config (`BuildConfig.from_dict` reads it back).

    The input is never modified. Everything is written under a temporary name and moved into
    place only after validation passes (a failed validation leaves nothing behind; the report
    says why). Validation and the memory plan use one concrete shape per input: the config's
    shapes (a range stands for its opt), else the defaults of
    `infercc.data.signature.resolve_shapes`.
    """
    t0 = time.perf_counter()
    if config is not None and options:
        raise InferccError(
            f"optimize got a config and keyword options ({', '.join(sorted(options))})",
            "put everything into the BuildConfig, or pass keyword options only",
        )
    if output is None:
        return _in_memory(model, config, cache_dir, on_step, options)
    samples = options.get("data")
    if in_memory(samples):  # the config records where samples came from, not the samples
        options = {**options, "data": IN_MEMORY_SAMPLES}
    with model_file(model) as src:
        out = Path(output)
        cfg = (config or build_config(**options)).resolve(artifact=not is_model_file(out))
        if cfg.backend == "auto":
            auto = _optimize_auto(src, out, cfg, cache_dir, on_step)
            auto.seconds = time.perf_counter() - t0
            return auto
        build = _Build(src, out, cfg)
        cfg.check()
        flow = OptimizeFlow(src, build, cache_dir, samples if in_memory(samples) else cfg.data)
        with custom_op_libraries(cfg.ort_custom_op_libs):
            run_steps(Job(flow, cfg, on_step or (lambda _s: None)))
        report = flow.report
        assert report is not None  # a build that ran to the end wrote its report
    if is_proto(model):
        report.input = IN_MEMORY
    report.seconds = time.perf_counter() - t0
    return report


def _optimize_auto(
    src: Path,
    out: Path,
    cfg: BuildConfig,
    cache_dir: str | os.PathLike[str] | None,
    on_step: Callable[[str], None] | None,
) -> OptimizeReport:
    """`--backend auto` (`infercc.runtime.race`): each candidate backend built and validated
    beside the output, the artifacts raced, the fastest published with the race in its
    manifest; a cached choice is built alone."""
    from dataclasses import replace

    from infercc.runtime import race
    from infercc.runtime.tuning import TuningCache

    cfg.check()
    check_destination(out)
    target = get_target(cfg.target)
    backends, left = race.candidates(target, cfg.precision)
    from infercc.data.signature import resolve_shapes
    from infercc.ir.wire import read_model

    shapes = resolve_shapes(read_model(src)[0], dict(cfg.shape_pins))
    key = race.cache_key(src, shapes, cfg.precision, backends)
    record: dict[str, Any] = {"precision": cfg.precision, "shapes": _lists(shapes)}
    with TuningCache(None if cache_dir is None else Path(cache_dir)) as cache:
        cached = cache.get(key) if target.host and len(backends) > 1 else None
        cached = cached if isinstance(cached, dict) else {}
        chosen = cached.get("backend")
        if chosen in backends:
            record.update(cache="hit", chosen=chosen, candidates=cached.get("candidates", []))
        elif len(backends) == 1 or not target.host:
            why = "one candidate" if len(backends) == 1 else f"{target.name} is not this host"
            record.update(cache="not raced", why=why, chosen=backends[0], candidates=left)
        else:
            raced = _race(src, out, cfg, backends, shapes, cache_dir, on_step, record)
            record["candidates"] += left
            kept = {"backend": record["chosen"], "candidates": record["candidates"]}
            cache.put(key, kept)
            return _with_race(raced, out, record)
    one = replace(cfg, backend=record["chosen"])
    report = optimize(src, out, one, cache_dir=cache_dir, on_step=on_step)
    return _with_race(report, out, record)


def _race(
    src: Path,
    out: Path,
    cfg: BuildConfig,
    backends: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    cache_dir: str | os.PathLike[str] | None,
    on_step: Callable[[str], None] | None,
    record: dict[str, Any],
) -> OptimizeReport:
    """Build each backend's artifact beside `out`, time those that validated, move the fastest
    into place; `record` gets the candidates and the choice."""
    from dataclasses import replace

    from infercc.errors import EXIT_BAD_INPUT
    from infercc.runtime import race

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.race-") as tmp:
        built: dict[str, OptimizeReport] = {}
        records: list[dict[str, Any]] = []
        for backend in backends:
            if on_step is not None:
                on_step(f"auto: building with {backend}")
            one = replace(cfg, backend=backend)
            try:
                report = optimize(
                    src, Path(tmp) / backend, one, cache_dir=cache_dir, on_step=on_step
                )
            except InferccError as exc:
                if exc.exit_code == EXIT_BAD_INPUT and not built and backend == backends[-1]:
                    raise
                records.append({"backend": backend, "skipped": exc.message})
                continue
            if not report.written:
                records.append({"backend": backend, "skipped": "validation failed"})
                continue
            built[backend] = report
            records.append({"backend": backend})
        if not built:
            reasons = "; ".join(f"{r['backend']}: {r['skipped']}" for r in records)
            raise ValidationError(f"--backend auto: no backend built the model ({reasons})")
        names = list(built)
        medians = race.time_artifacts([Path(tmp) / b for b in names], src, shapes, on_step)
        for r in records:
            if r["backend"] in built:
                r["median_ms"] = medians[names.index(r["backend"])]
        best = race.choose(records)
        assert best is not None
        record.update(cache="miss", chosen=best["backend"], candidates=records)
        publish(Path(tmp) / best["backend"], out)
        return built[best["backend"]]


def _with_race(report: OptimizeReport, out: Path, record: dict[str, Any]) -> OptimizeReport:
    """The chosen build's report and manifest, at `out`, with the race that chose it."""
    from infercc.runtime.artifact import read_manifest

    manifest = read_manifest(out)
    manifest["race"] = record
    write_manifest(out, manifest)
    report.output = str(out)
    report.files = [str(p) for p in sorted(out.iterdir())]
    if report.artifact is not None:
        report.artifact["path"] = str(out)
        report.artifact["race"] = record
    return report


def _lists(shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    return {k: [int(d) for d in v] for k, v in shapes.items()}


def _in_memory(
    model: ModelInput,
    config: BuildConfig | None,
    cache_dir: str | os.PathLike[str] | None,
    on_step: Callable[[str], None] | None,
    options: dict[str, Any],
) -> OptimizedModel:
    """`optimize` into a private temporary directory, the result read back into memory."""
    with tempfile.TemporaryDirectory(prefix="infercc-optimized-") as tmp:
        out = Path(tmp) / "model.opt.onnx"
        report = optimize(model, out, config, cache_dir=cache_dir, on_step=on_step, **options)
        optimized = onnx.load(out) if report.written else None  # external data too
    report.output, report.files = IN_MEMORY, []
    return OptimizedModel(optimized, report)


def pipelines(cfg: BuildConfig) -> list[tuple[str, ...]]:
    """The stages a build runs, in order (`passes.pipelines`: optimize, then fp16's lowering)."""
    return optimize_stages(cfg.precision)


def node_counts(model: Model) -> tuple[int, int]:
    """(the main graph's nodes, the nodes inside its If/Loop/Scan bodies at any depth)."""
    main = len(model.graph)
    return main, sum(1 for _ in model.graph.all_nodes()) - main


def check_freeze(model: Model, freeze: bool) -> None:
    """Refuse --freeze-initializers on a model with no overridable initializer."""
    if freeze and not (model.ir_version >= 4 and model.overridable):
        why = "lists no initializer as a graph input"
        if model.ir_version < 4:
            why = f"is IR {model.ir_version}, whose initializers are constants already"
        raise InferccError(
            f"--freeze-initializers has no effect: the model {why}",
            "drop --freeze-initializers",
        )


def overridable_summary(model: Model, frozen: bool) -> dict[str, Any]:
    """The initializers also listed as graph inputs (IR >= 4), and whether they were frozen."""
    if not model.overridable or model.ir_version < 4:
        return {}
    return {"names": list(model.overridable), "frozen": frozen}


def check_model(model: Model, cfg: BuildConfig, source: Path | None = None) -> None:
    """What the config asks of the model: shapes naming its inputs (and, with `source`, a
    warning where they give a symbol two values), Q/DQ pairs for int8."""
    check_shape_names(model, cfg.shape_pins)
    if cfg.shape_pins:  # a decoder's pins agree with its declared dims and with each other
        pinned_signature(export_model(model, with_weights=False), cfg.shape_pins, strict=False)
    if source is not None:  # pins that pass may still give a named symbol two values
        declared = {v.name: v.shape for v in model.graph.inputs}
        warn_shape_conflicts(declared, cfg.shape_pins, source)
    if cfg.precision != "int8" or (cfg.backend == "tensorrt" and cfg.tensorrt.calib_cache):
        return
    from infercc.check.tolerances import model_precision

    if model_precision(export_model(model, with_weights=False)) != "int8":
        raise InferccError(
            "--int8 needs an already-calibrated QDQ model (Q/DQ pairs): this one has none",
            "run infercc calibrate MODEL --int8 --data DIR first (or, with --backend "
            "tensorrt on TensorRT 10, give --calib-cache FILE)",
        )


class OptimizeFlow:
    """`infercc optimize` as a `Flow` of the build sequence (`infercc.build`): load and check
    the model, the optimize (and fp16) pipeline stages in one `PassContext`, the memory plan,
    the model and plan written, validation against the original (bisected when it fails and
    that is cheap), then the file or the artifact published."""

    def __init__(
        self,
        src: Path,
        build: _Build,
        cache_dir: str | os.PathLike[str] | None = None,
        samples: SampleData | None = None,
    ):
        self.src, self.build, self.cache_dir = src, build, cache_dir
        self.samples = samples  # validation's (in memory for the API), else the config's data
        self.report: OptimizeReport | None = None
        self.staged: list[Path] = []

    def load(self, job: Job) -> Model:
        cfg, src = job.config, self.src
        ir = load_model(src, freeze_initializers=cfg.freeze_initializers)
        check_freeze(ir, cfg.freeze_initializers)
        # Validation runs the original under onnxruntime: refuse before any work if it cannot.
        (check_ir_version if cfg.validate else warn_ir_version)(ir.ir_version, str(src))
        if cfg.static_map:
            fix_input_shapes(ir, cfg.static_map)
        check_model(ir, cfg, src)
        self.size_before = model_files_size(src, ir)
        self.nodes_before, self.body_nodes_before = node_counts(ir)
        self.ops_before = op_histogram(ir)
        self.profile = shape_profile(ir, cfg.shape_pins)
        check_inputs_untouched(src, ir, self.build.out, self.build.artifact_mode)
        return ir

    def stages(self, job: Job) -> Iterator[Stage]:
        """optimize's stages (then fp16's) in one context, so that what the report says about
        rewrites, refusals and assumptions covers all of them."""
        self.ctx = stage_context(job.config, self.profile)
        for i, passes in enumerate(pipelines(job.config)):
            yield Stage(FP16.name if i else OPTIMIZE.name, passes, self.ctx, each_pass=True)
        check_used(job.config.assume, self.ctx.assumed, assumption_passes)  # else: no effect

    def plan(self, job: Job) -> bool:
        """The memory plan of the result, at the shape profile."""
        plan = job.pipe.details("convert-fp16")
        self.kept_fp32 = list(plan.kept_fp32) if plan is not None else []
        self.nodes_after, self.body_nodes_after = node_counts(job.ir)
        self.ops_after = op_histogram(job.ir)
        job.step("planning memory")
        schedule = job.pipe.details("schedule-memory")
        self.memory_plan = _plan(job.ir, self.profile, job.config.alignment, schedule)
        return True

    def staging(self) -> Staging:
        return self.build.stage()

    def write(self, job: Job) -> None:
        """The report so far, then the model (and plan) staged."""
        passes = {name: st.to_dict() for name, st in job.pipe.passes.items()}
        memory = _memory_summary(self.memory_plan, self.profile, self.build.plan_path)
        report = self.report = self._report(job, passes, memory)
        job.step("writing")
        self.staged = self._save(job)
        report.size_after = sum(p.stat().st_size for p in self.staged if p.suffix != ".json")

    def _save(self, job: Job) -> list[Path]:
        cfg, build = job.config, self.build
        job.ir.metadata_props = provenance(job.ir.metadata_props, cfg)
        external = True if cfg.external_data else None
        staged = save_model(job.ir, job.stage_dir / build.model_name, external_data=external)
        if self.memory_plan is not None:
            plan = self.memory_plan.to_dict()
            staged.append(_write_json(job.stage_dir / build.plan_path.name, plan))
        del job.ir
        if cfg.validate:  # the IR is a web of cycles: free its arrays before onnxruntime loads
            gc.collect()
        return staged

    def validate(self, job: Job) -> bool:
        """The staged model against the original; a failure is diagnosed (`_diagnose`)."""
        report = self.report
        assert report is not None
        t0 = time.perf_counter()
        ranges = {name: (lo, hi) for name, lo, hi in job.config.input_ranges}
        with generated_ranges(ranges):  # validation and its bisection draw the same inputs
            report.validation = self._validate(job, self.staged[0])
            if report.validation is not None and not report.validation.outputs_passed:
                self._diagnose(job, self.staged[0], time.perf_counter() - t0)
        if report.passed:
            self._replan_at_validated(job)
        return report.passed

    def _replan_at_validated(self, job: Job) -> None:
        """The memory plan again at the shapes validation ran, where those are not the plan's
        (the default shapes failed or left an output flat, `infercc.check.profiles`): a plan
        at a shape the original cannot run at says nothing. The staged plan is rewritten."""
        v, report = self.report.validation if self.report else None, self.report
        if v is None or report is None or self.memory_plan is None or not v.profiles:
            return
        shapes = {k: tuple(d) for k, d in v.profiles[0]["shapes"].items()}
        if self.profile is None or shapes == {k: tuple(d) for k, d in self.profile.items()}:
            return
        if set(shapes) != set(self.profile):
            return  # validation fed another set of inputs (a decoder's calls): keep the plan
        job.step("planning memory at the validated shapes")
        self.memory_plan = _plan(load_model(self.staged[0]), shapes, job.config.alignment, None)
        plan_file = next((p for p in self.staged if p.name == self.build.plan_path.name), None)
        if self.memory_plan is not None and plan_file is not None:
            _write_json(plan_file, self.memory_plan.to_dict())
        self.profile = shapes
        report.memory = _memory_summary(self.memory_plan, shapes, self.build.plan_path)

    def _validate(self, job: Job, candidate: Path) -> ValidationReport | None:
        cfg = job.config
        if not cfg.validate:
            return None
        job.step("validating")
        tol = tolerance(graph_precision(cfg), cfg.atol, cfg.rtol, cfg.min_cosine)
        report = validate(
            self.src,
            candidate,
            shapes=cfg.shape_pins,
            data=self.samples if self.samples is not None else cfg.data,
            float_dtypes_may_differ=cfg.fp16_io,
            tolerances=cfg.tolerance_map,
            second_shapes=cfg.second_pins,
            rewritten=job.rewritten,
            strict_coverage=cfg.strict_coverage,
            assumptions=cfg.assume,
            fixed_shapes=cfg.static_map,
            movement_k=None if cfg.atol is not None or cfg.rtol is not None else MOVEMENT_K,
            atol=tol.atol,
            rtol=tol.rtol,
            min_cosine=tol.min_cosine,
        )
        target = get_target(cfg.target)
        if target.kind == "gpu":
            report.notes.append(
                f"the target is {target.name}, and validation ran the model on this host's "
                f"{report.ran_on} (graph optimizations off), not on {target.name}: its kernels' "
                "numerics and its speed there were not measured"
            )
        return report

    def _diagnose(self, job: Job, candidate: Path, validate_s: float) -> None:
        """A model infercc wrote fails: bisect the pipeline when it is cheap (or asked), else
        say how to; never when only rounding differs (`ValidationReport.rounding_only`)."""
        from infercc.check.bisection import PipelineConfig, bisect

        cfg, report = job.config, self.report
        assert report is not None and report.validation is not None
        validation = report.validation
        if validation.rounding_only() is not None:
            return  # the report says only rounding differs: no rewrite to name
        config = PipelineConfig(cfg, stages=pipelines(cfg), source="build")
        trials = bisect_trials(len(config.pass_names()), self.ctx.rewrites)
        estimate = trials * (job.pipelines_seconds + validate_s / 2)
        if not cfg.bisect and estimate > AUTO_BISECT_SECONDS:
            report.bisect_hint = (
                f"rerun with --bisect to name the pass that broke it (about {trials} rebuilds, "
                f"{estimate:.0f} s)"
            )
            return
        job.step("bisecting the pipeline")
        tol = tolerance(graph_precision(cfg), cfg.atol, cfg.rtol, cfg.min_cosine)
        result = bisect(
            self.src,
            _failing_feeds(validation),
            config,
            tolerance=tol.to_dict(),
            tolerances=cfg.tolerance_map,
            candidate=candidate,
        )
        report.bisect = result.to_dict()

    def publish(self, job: Job) -> None:
        """The model with its data and plan, or the artifact the backend compiles."""
        build, report = self.build, self.report
        assert report is not None
        if not build.artifact_mode:
            report.files = build.finish_file(self.staged)
        else:
            options = compile_options(job.config, self.cache_dir, job.step)
            report.artifact = build.finish_artifact(job.stage_dir, self.cache_dir, options, report)
            report.files = [str(p) for p in sorted(build.out.iterdir())]
        report.written = True

    def _report(
        self, job: Job, passes: dict[str, Any], memory: dict[str, Any] | None
    ) -> OptimizeReport:
        cfg = job.config
        return OptimizeReport(
            input=str(self.src),
            output=str(self.build.out),
            target=cfg.target,
            nodes_before=self.nodes_before,
            nodes_after=self.nodes_after,
            body_nodes_before=self.body_nodes_before,
            body_nodes_after=self.body_nodes_after,
            ops_before=self.ops_before,
            ops_after=self.ops_after,
            size_before=self.size_before,
            size_after=0,
            passes=passes,
            iterations=job.pipe.iterations,
            reached_fixpoint=job.pipe.reached_fixpoint,
            refusals=[r.to_dict() for r in job.pipe.refusals],
            validation=None,
            seconds=0.0,
            memory=memory,
            precision=cfg.precision,
            kept_fp32=self.kept_fp32,
            build=cfg.to_dict(),
            overridable_inputs=overridable_summary(job.ir, cfg.freeze_initializers),
            static_shapes={k: list(v) for k, v in cfg.static_map.items()} or None,
            assumptions=describe_assumptions(cfg.assume, self.ctx.assumed),
            assumption_hints=assumption_hints(self.ctx.wanted),
            output_types=[c.to_dict() for c in job.output_types],
        )


def graph_precision(cfg: BuildConfig) -> str:
    """The precision the written graph itself computes in: OpenVINO's bf16 is a kernel choice
    over an fp32 graph, which is validated as fp32 before the artifact is validated as bf16."""
    if cfg.precision == "bf16" and cfg.backend == "openvino":
        return "fp32"
    return cfg.precision


AUTO_BISECT_SECONDS = 20.0  # a failure is bisected by itself when that should take no longer


def bisect_trials(passes: int, rewrites: Mapping[str, Sequence[Any]]) -> int:
    """About how many rebuilds a bisection takes: the full pipeline, each pass disabled, a
    binary search over the most rewrites of one pass, and the divergence."""
    most = max((len(v) for v in rewrites.values()), default=0)
    return 2 + passes + max(1, most).bit_length()


def _failing_feeds(validation: ValidationReport) -> list[dict[str, Any]]:
    """The samples of the first profile that failed (all samples when none says so)."""
    start = 0
    for profile in validation.profiles:
        end = start + int(profile.get("samples", 0))
        if profile.get("passed") is False and validation.error is None:
            return validation.feeds[start:end]
        start = end
    return list(validation.feeds)


def compile_options(
    cfg: BuildConfig,
    cache_dir: str | os.PathLike[str] | None,
    on_step: Callable[[str], None] | None = None,
) -> CompileOptions:
    """What the backend gets from a build's config."""
    return CompileOptions(
        precision=cfg.precision,
        tune=cfg.tune,
        validate=cfg.validate,
        atol=cfg.atol,
        rtol=cfg.rtol,
        min_cosine=cfg.min_cosine,
        cache_dir=str(cache_dir) if cache_dir is not None else None,
        ort=cfg.ort,
        tensorrt=cfg.tensorrt,
        on_step=on_step,
    )


class _Build:
    """Where the result goes: an .onnx file, or an artifact directory built by a backend."""

    def __init__(self, src: Path, out: Path, cfg: BuildConfig):
        self.src, self.out, self.cfg = src, out, cfg
        self.artifact_mode = not is_model_file(out)
        if not self.artifact_mode:
            _check_output(src, out)
            self.model_name = out.name
            self.plan_path = out.parent / memory_plan_name(out)
            return
        if src.resolve() == out.resolve():
            raise InferccError(f"refusing to overwrite the input model {src}", "pick another -o")
        self.backend = get_backend(str(cfg.backend))
        require_available(self.backend)
        check_destination(out)
        check_source = getattr(self.backend, "check_source", None)
        if check_source is not None:  # a backend that cannot read the model says so first
            check_source(src)
        self.model_name = MODEL_FILE
        self.plan_path = out / "memory_plan.json"

    def stage(self) -> Staging:
        """A locked staging directory beside the output (missing parents created)."""
        if self.artifact_mode:
            return staging_dir(self.out)
        return Staging(self.out)

    def finish_file(self, staged: list[Path]) -> list[str]:
        """Publish the model with its data and plan: never a model beside foreign weights."""
        moves = [(p, self.out.parent / p.name) for p in staged]
        return [str(p) for p in publish_files(moves)]

    def finish_artifact(
        self,
        stage: Path,
        cache_dir: str | os.PathLike[str] | None,
        options: CompileOptions,
        report: OptimizeReport,
    ) -> dict[str, Any]:
        if options.on_step is not None:
            options.on_step(f"compiling with {self.cfg.backend}")
        target = get_target(self.cfg.target)
        t0 = time.perf_counter()
        section = self._compile(stage, target, cache_dir, options)
        compile_seconds = time.perf_counter() - t0
        manifest = self._manifest(target, section, report)
        write_manifest(stage, manifest)
        checked = self._validate_artifact(stage, options)
        if checked is not None:
            manifest["artifact_validation"] = checked
            write_manifest(stage, manifest)
        publish(stage, self.out)
        return {
            "path": str(self.out),
            "backend": section,
            "compile_seconds": round(compile_seconds, 4),
            "validation": checked,
        }

    def _validate_artifact(self, stage: Path, options: CompileOptions) -> dict[str, Any] | None:
        """The artifact as it will run, against the original under onnxruntime fp32, for a
        backend whose kernels compute otherwise than the graph says (`ARTIFACT_VALIDATED`):
        at every shape profile, with the build precision's criterion. A failure ends the
        build (exit 1), naming the worst output."""
        cfg = self.cfg
        if not cfg.validate or cfg.backend not in ARTIFACT_VALIDATED:
            return None
        from infercc.check.candidates import validate_candidate

        if options.on_step is not None:
            options.on_step(f"validating the {cfg.backend} artifact against the original")
        result = validate_candidate(
            stage,
            self.src,
            data=cfg.data,
            shapes=cfg.shape_pins,
            second_shapes=cfg.second_pins,
            atol=cfg.atol,
            rtol=cfg.rtol,
            min_cosine=cfg.min_cosine,
            tolerances=cfg.tolerance_map,
            ort_custom_op_libs=cfg.ort_custom_op_libs,
        )
        checked = result.to_dict()
        if not result.passed:
            raise ValidationError(artifact_failure(cfg, result.validation), _remedy(cfg))
        return checked

    def _compile(
        self,
        stage: Path,
        target: Any,
        cache_dir: str | os.PathLike[str] | None,
        options: CompileOptions,
    ) -> dict[str, Any]:
        from infercc.runtime.tuning import TuningCache

        with TuningCache(cache_dir) as cache:
            return self.backend.compile(
                stage / MODEL_FILE,
                target,
                list(self.cfg.shapes),
                options,
                cache if options.tune else None,
                stage,
            )

    def _manifest(self, target: Any, section: dict[str, Any], report: OptimizeReport) -> dict:
        from infercc.runtime.tuning import file_sha256, host_fingerprint

        validation = report.validation
        return artifact_manifest(
            source=self.src,
            source_sha256=file_sha256(self.src),
            passes=report.passes,
            target=target.to_dict(),
            host=host_fingerprint(),
            backend=section,
            profiles=self.cfg.shapes,
            precision=self.cfg.precision,
            build=self.cfg.to_dict(),
            static_shapes=self.cfg.static_map,
            memory=report.memory,
            validation=validation.to_dict() if validation is not None else None,
            assumptions=report.assumptions,
        )


# Backends whose artifact is validated itself, after compiling: their kernels may compute in
# another precision than the graph's (OpenVINO's bf16 and int8 on an fp32 or Q/DQ graph).
ARTIFACT_VALIDATED = ("openvino",)


def artifact_failure(cfg: BuildConfig, validation: ValidationReport | None) -> str:
    """One line: the artifact failed, its worst output and by how much."""
    what = f"the {cfg.backend} {cfg.precision} artifact"
    if validation is None or validation.error is not None:
        detail = validation.error if validation is not None else "no validation ran"
        return f"{what} failed validation against the original: {detail}"
    failed = validation.failures() or list(validation.outputs.values())
    worst = min(failed, key=lambda m: m.cosine if m.cosine is not None else -2.0)
    cosine = "n/a" if worst.cosine is None else f"{worst.cosine:.6f}"
    return (
        f"{what} failed validation against the original: worst output {worst.name!r}, "
        f"cosine {cosine} ({worst.reason or 'outside the tolerance'}); nothing written"
    )


def _remedy(cfg: BuildConfig) -> str:
    if cfg.precision == "bf16":
        return "build fp32 (drop --bf16), or calibrate int8 (infercc calibrate --int8)"
    if cfg.precision == "int8":
        return "calibrate again with a higher --min-cosine, or build with --backend ort"
    return "build with --backend ort, and report the model"


# What the written model records of its build (metadata_props, read by Netron and
# onnx.load): the options that change the model's bytes, so that the same build of the same
# input writes the same file (validation's options change nothing in it, and are left out).
PROVENANCE_PREFIX = "infercc."
_MODEL_OPTIONS = (
    "portable",
    "disable_passes",
    "fp16_io",
    "keep_fp32",
    "static_shapes",
    "fold_limit",
    "freeze_initializers",
)


def provenance(props: list[tuple[str, str]], cfg: BuildConfig) -> list[tuple[str, str]]:
    """`props` (the input's own metadata, an earlier build's `infercc.*` entries dropped)
    with this build's: infercc's version, the target, the precision, the options that shaped
    the model (those not at their defaults, as JSON) and, where any, the assumptions it is
    exact under: this build's and an earlier build's (a model built under one stays so)."""
    data, default = cfg.to_dict(), BuildConfig().to_dict()
    options = {k: data[k] for k in _MODEL_OPTIONS if data.get(k) != default.get(k)}
    earlier = dict(props).get(f"{PROVENANCE_PREFIX}assume", "")
    assumed = sorted({*cfg.assume, *(a for a in earlier.split(",") if a)})
    kept = [(k, v) for k, v in props if not k.startswith(PROVENANCE_PREFIX)]
    record = [
        (f"{PROVENANCE_PREFIX}version", __version__),
        (f"{PROVENANCE_PREFIX}target", cfg.target),
        (f"{PROVENANCE_PREFIX}precision", cfg.precision),
        (f"{PROVENANCE_PREFIX}options", json.dumps(options, sort_keys=True)),
    ]
    if assumed:
        record.append((f"{PROVENANCE_PREFIX}assume", ",".join(assumed)))
    return kept + record


def memory_plan_name(out: Path) -> str:
    return f"{out.stem}.memory_plan.json"


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
    path.write_text(json_text(data, indent=1, sort_keys=False) + "\n")
    return path
