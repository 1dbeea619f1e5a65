"""`infercc calibrate --int8` as a flow of the build sequence (`infercc.build`).

`Int8Flow` says what each step does for an int8 calibration (`infercc.calib.calibrate`
describes the method):

- load: the model read and checked (a model below opset 13, which per-axis DequantizeLinear
  needs, converted with onnx.version_converter by `load_at_opset`: the report says so, and the
  int8 model is then evaluated against the original model, not the converted one), the method,
  percentile and target chosen (`infercc.calib.choices`), the samples read and split into
  calibration and evaluation;
- pipelines: calibrate-fp32 on the model (portable, assuming nothing: `reference_config`),
  the quantizable nodes named and the user's exclusions checked, then the outlier channels
  measured on the calibration samples (and, for a run without an accuracy target, the int8
  pipeline's outlier split made at once);
- plan: the fp32 reference saved, the ranges calibrated, onnxruntime's fused int8 kernels
  checked (when this host is the target), and the sensitivity search (`infercc.calib.search`)
  over `trial`s (each the int8 pipeline's quantize-qdq stage on a fresh copy of the reference,
  evaluated against fp32); the build fails here when no candidate meets the target. Where
  outlier channels were found, the split is the first remedy: the all-int8 candidate is
  evaluated without it, and only when it misses the target are projections split, as few as
  the target needs, most severe first (`split_outliers`), and searched from there: a split
  projection costs a Gather, a small float MatMul and an Add, so a build that meets its
  target without them ships without them;
- write: the int8 model, ranges.json and calibration.cache staged;
- validate: the int8 model raced against the original on this host (a slower int8 is said);
- publish: calibration_report.json and the manifest written, the directory moved into place.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import islice
from os import PathLike
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from infercc.backends.trt.calib_cache import DEFAULT_TRT_VERSION, write_calibration_cache
from infercc.build import Job, Stage, stage_context
from infercc.calib import outliers
from infercc.calib.choices import DEFAULT_MIN_COSINE_FLOOR, Settings, choose
from infercc.calib.forms import Int8Plan, kernel_cause
from infercc.calib.kernels import broken_kernels
from infercc.calib.observers import (
    DEFAULT_PERCENTILE,
    Method,
    ProgressFn,
    TensorRange,
    UnobservableTensor,
    collect_ranges,
    tensor_values,
)
from infercc.calib.report import (
    REPORT_FILE,
    CalibrationReport,
    Evaluation,
    Outputs,
    SpeedCheck,
    Targets,
    Trial,
    calibration_manifest,
    calibration_report,
    classifier_outputs,
    embedding_outputs,
    evaluate,
    kept_float,
)
from infercc.calib.search import (
    DEFAULT_MAX_TRIALS,
    SQNR_SAMPLES,
    Search,
    activation_inputs,
    db,
    fake_quantize,
    is_target,
    node_weight_sqnr,
)
from infercc.check.compare import run_model
from infercc.check.tolerances import calibrated_criterion
from infercc.config import BuildConfig
from infercc.data.samples import iter_samples
from infercc.errors import InferccError, InternalError
from infercc.ir import Model, export_model, import_model, load_model, save_model
from infercc.outputs import Staging
from infercc.passes.manager import run_passes
from infercc.passes.pipelines import CALIBRATE_FP32, INT8
from infercc.passes.quantize_qdq import (
    MIN_OPSET,
    QuantizeReport,
    QuantizeSettings,
    activation_params,
    calibration_tensors,
    check_opset,
    weight_max,
)
from infercc.passes.split_outliers import candidates as outlier_candidates
from infercc.runtime.artifact import MANIFEST, publish, staging_dir, write_manifest
from infercc.runtime.ort_support import check_ir_version
from infercc.util import json_float

logger = logging.getLogger(__name__)

INT8_FILE = "model_int8.onnx"
FP32_FILE = "model_fp32.onnx"
RANGES_FILE = "ranges.json"
CACHE_FILE = "calibration.cache"
_TRIAL_FILE = ".trial.onnx"
_KERNEL_FILE = ".kernel_check.onnx"
_PROBE_FILE = ".outlier_probe.onnx"
_UNSPLIT_DIR = ".unsplit"  # the reference before an outlier split, while it is made
FUSE_INT8 = "fuse-int8-matmul"

SPEED_WARMUP, SPEED_ITERS = 10, 60
CACHE_METHOD = {"minmax": "minmax", "entropy": "entropy", "percentile": "entropy"}

Samples = list[dict[str, np.ndarray]]


@dataclass(frozen=True)
class Int8Request:
    """What one int8 calibration was asked for, checked by `calibrate` (its keywords)."""

    data: str | PathLike[str]
    plan: Int8Plan  # the int8 form the target takes (infercc.calib.forms)
    method: str | None = None
    percentile: float | None = None
    min_cosine: float | None = None
    max_top1_drop: float | None = None
    min_cosine_floor: float | None = None  # None: DEFAULT_MIN_COSINE_FLOOR; 0: no floor
    num_samples: int | None = None
    holdout: float = 0.2
    preprocess: str | None = None
    exclude: tuple[str, ...] = ()
    target: str = "cpu"
    trt_version: str = DEFAULT_TRT_VERSION
    outlier_channels: bool = True
    speed_check: bool = True
    activation_matmuls: bool = False
    max_trials: int = DEFAULT_MAX_TRIALS

    @property
    def activations(self) -> str:
        return self.plan.activations

    @property
    def weight_bits(self) -> int:
        return self.plan.weight_bits


def reference_config(config: BuildConfig) -> BuildConfig:
    """The config the fp32 reference's pipeline (calibrate-fp32) runs under: the build's,
    portable (no onnxruntime contrib op, so the quantized model stays standard ONNX that
    TensorRT reads too) and assuming nothing about the inputs."""
    return replace(config, portable=True, assume=())


class Int8Flow:
    """The state an int8 calibration's steps share (module docstring)."""

    def __init__(
        self,
        src: Path,
        dest: Path,
        request: Int8Request,
        on_progress: ProgressFn | None = None,
        t0: float | None = None,
    ):
        self.src, self.dest, self.request = src, dest, request
        self.on_progress = on_progress
        self.t0 = time.perf_counter() if t0 is None else t0
        self.report: CalibrationReport | None = None
        self.settings: Settings | None = None
        self.targets = Targets()
        self.calib: Samples = []  # the calibration samples
        self.samples: Samples = []  # the evaluation samples
        self.on_holdout = False
        self.fp32_path = Path(FP32_FILE)
        self.fp32_files: list[Path] = []
        self.tensors: list[str] = []
        self.sqnr: dict[str, float] = {}
        self.ranges: dict[str, TensorRange] = {}
        self.reference: Outputs = []
        self.search: Search | None = None
        self.final: Trial | None = None
        self.activation_inputs: dict[str, list[str]] = {}  # node -> its activation inputs
        self.calibration: Samples = []  # the samples activation noise is measured on
        self.not_scores: frozenset[str] = frozenset()
        self.float_nodes: dict[str, str] = {}  # outlier MatMul -> the MatMul it was split from
        self.outlier_channels: dict[str, list[int]] = {}  # found on the calibration samples
        self.outlier_severity: dict[str, float] = {}  # MatMul -> `outliers.severity`
        self.split_pending = False  # found, split only if the all-int8 candidate misses
        self.outlier_split: dict[str, Any] | None = None  # what was decided, and on what
        self.kernels_checked = False
        self.broken_kernels: dict[str, str] = {}  # node -> why onnxruntime's int8 kernel is wrong
        self.converted_from: int | None = None  # the model's opset, when converted to MIN_OPSET
        self.refusals: list[dict[str, str]] = []  # the pipeline stages' (--explain)
        self.quantize_refusals: list[dict[str, str]] = []  # the last quantize stage's

    @property
    def method(self) -> Method:
        assert self.settings is not None
        return cast(Method, self.settings.method.value)  # one of Method: choose() says which

    @property
    def percentile(self) -> float:
        assert self.settings is not None
        chosen = self.settings.percentile
        return DEFAULT_PERCENTILE if chosen is None else chosen.value

    # -- the steps --------------------------------------------------------------------------

    def load(self, job: Job) -> Model:
        """The model, checked; the settings chosen from it; the samples read and split."""
        o = self.request
        ir, self.converted_from = load_at_opset(self.src, MIN_OPSET, "int8 QDQ quantization")
        check_ir_version(ir.ir_version, str(self.src))
        check_opset(ir)
        settings = choose(ir, o.method, o.percentile, o.min_cosine, o.max_top1_drop)
        cosine = settings.min_cosine
        self.settings = settings
        floor = DEFAULT_MIN_COSINE_FLOOR if o.min_cosine_floor is None else o.min_cosine_floor
        self.targets = Targets(cosine.value, o.max_top1_drop, not cosine.given, floor or None)
        skeleton = export_model(ir, with_weights=False)
        samples = read_samples(o.data, skeleton, o.num_samples, o.preprocess)
        self.calib, self.samples, self.on_holdout = split_samples(samples, o.holdout)
        return ir

    def stages(self, job: Job) -> Iterator[Stage]:
        """calibrate-fp32, then the targets named and the exclusions checked, then the outlier
        split where the calibration samples show outlier channels."""
        context = stage_context(reference_config(job.config))
        fp32 = CALIBRATE_FP32
        yield Stage(fp32.name, fp32.passes, context, announce="optimizing fp32")
        self.refusals = [r.to_dict() for r in context.refusals]
        name_targets(job.ir)
        check_exclude(job.ir, self.request.exclude)
        if not self.request.outlier_channels:
            return
        self.outlier_channels = self.find_outliers(job)
        if not self.outlier_channels:
            return
        if self.targets.given:  # the split waits for the all-int8 candidate's verdict (plan)
            self.split_pending = True
            return
        self.outlier_split = {"split": True, "why": "no accuracy target: split where found"}
        yield self.split_stage(job, self.outlier_channels)
        self.split_done(job)

    def split_stage(self, job: Job, channels: dict[str, list[int]]) -> Stage:
        split = stage_context(job.config, outlier_channels=channels)
        return Stage(INT8.name, INT8.stages[0], split)

    def split_done(self, job: Job) -> None:
        stage = job.reports[INT8.name]
        self.refusals += [r.to_dict() for r in stage.refusals]
        self.float_nodes = stage.details("split-outlier-channels") or {}

    def plan(self, job: Job) -> bool:
        """The fp32 reference, the ranges, the kernel check and the search; False when the
        final candidate misses the target."""
        self.save_reference(job)
        self.calibrate(job)
        final = self.run_search(job, self.request.exclude)
        if final is None:  # the all-int8 candidate missed the target: split, then search
            first = self.split_outliers(job, (*self.request.exclude, *self.broken_kernels))
            final = self.run_search(job, self.request.exclude, first)
        assert final is not None
        self.final = final
        self.report = report = self.make_report(final)
        return report.passed

    def split_outliers(self, job: Job, exclude: tuple[str, ...]) -> Trial | None:
        """The pending outlier split, as few projections as the target needs.

        Every projection with outliers is split once and calibrated (its split projections
        read new tensors, named after the projection). Then the most severe ones first
        (`outliers.severity`), 1, 2, 4, ... of them are split on a copy of the unsplit
        reference and the all-int8 candidate evaluated, with the ranges of both calibrations
        (no third one: each tensor keeps its name in every subset), until one meets the
        target; then the counts between it and the largest that missed are bisected. The
        smallest count that met is kept, and its candidate returned for the search to start
        from.
        None when only the full split is left: it is the reference then, the search starts
        afresh from it."""
        job.step("splitting outlier channels")
        # the IR reads its weights from the saved files as it needs them: they move aside
        # (with any external data beside them) until the split reference is saved
        unsplit_dir = job.stage_dir / _UNSPLIT_DIR
        unsplit_dir.mkdir()
        for f in self.fp32_files:
            f.rename(unsplit_dir / f.name)
        unsplit = unsplit_dir / self.fp32_path.name
        found = self.outlier_channels
        ranked = sorted(found, key=lambda n: (-self.outlier_severity.get(n, 0.0), n))
        plain_ranges = self.ranges
        self.split_reference(job, unsplit, found)
        self.calibrate(job)
        split_ranges = self.ranges
        every_range = {**plain_ranges, **split_ranges}
        tried: list[dict[str, Any]] = []

        def attempt(count: int) -> Trial | None:
            """The `count` most severe split, the reference now; its trial if it met."""
            job.step(f"outlier split of the {count} most severe projection(s)")
            self.split_reference(job, unsplit, {n: found[n] for n in ranked[:count]})
            self.ranges = every_range
            trial = self.trial(job, exclude)
            evaluation = trial.evaluation
            drop = evaluation.top1_drop
            tried.append({"projections": count, "cosine": evaluation.cosine, "top1_drop": drop})
            return trial if self.targets.met(evaluation) else None

        # 1, 2, 4, ... until one meets (`high`, else the full split, not evaluated here), then
        # halve the gap to the largest that missed (`low`): the fewest the target needs when
        # the cosine grows with the count, a set that meets it in any case
        first, low, high, count = None, 0, len(ranked), 1
        while count < high and first is None:
            first = attempt(count)
            if first is None:
                low, count = count, count * 2
            else:
                high = count
        while high - low > 1:
            middle = (low + high) // 2
            trial = attempt(middle)
            if trial is None:
                low = middle
            else:
                first, high = trial, middle
        if not tried or tried[-1]["projections"] != high:  # on disk: another split than `high`'s
            # `high` is every projection when none met (its ranges those of its calibration)
            self.split_reference(job, unsplit, {n: found[n] for n in ranked[:high]})
            self.ranges = every_range if first is not None else split_ranges
        assert self.outlier_split is not None
        self.outlier_split["projections"] = len(self.float_nodes)
        self.outlier_split["tried"] = tried
        self.split_done(job)  # the kept split's refusals (and its float MatMuls, again)
        self.split_pending = False
        shutil.rmtree(unsplit_dir)
        return first

    def split_reference(self, job: Job, unsplit: Path, channels: dict[str, list[int]]) -> None:
        """The unsplit reference with `channels` split, saved as the reference."""
        job.ir = load_model(unsplit)
        stage = self.split_stage(job, channels)
        job.reports[INT8.name] = run_passes(
            job.ir, stage.context, stage.passes, job.config.disable_passes
        )
        self.float_nodes = job.reports[INT8.name].details("split-outlier-channels") or {}
        self.save_reference(job)

    def staging(self) -> Staging:
        return staging_dir(self.dest)

    def write(self, job: Job) -> None:
        """The int8 model, its ranges and TensorRT's calibration cache, staged."""
        assert self.report is not None and self.final is not None
        job.step("writing")
        self.report.files = self.write_files(job, self.final.exclude)

    def validate(self, job: Job) -> bool:
        """The int8 model raced against the original, when this host is the target."""
        assert self.report is not None
        if self.request.speed_check and self.request.plan.on_host:
            job.step("racing int8 against fp32")
            self.report.speed = self.speed_check(job, self.src)
            logger.info("%s", self.report.speed.message)  # the report says it to the user
        return True

    def publish(self, job: Job) -> None:
        """The report and the manifest (with the criterion the model was accepted at, which
        `infercc validate` applies: one verdict), then the directory moved into place."""
        report, plan = self.report, self.request.plan
        assert report is not None
        stage = job.stage_dir
        report.seconds = time.perf_counter() - self.t0
        write_json(stage / REPORT_FILE, report.to_dict())
        manifest = calibration_manifest(self.src, self.request.target, report.files, INT8_FILE)
        if report.opset_conversion is not None:
            manifest["opset_conversion"] = report.opset_conversion
        criterion = calibrated_criterion(
            Evaluation(report.outputs).cosine,
            "calibrate --int8",
            report.samples["evaluated_on"],
            "int8",
        )
        write_manifest(stage, {**manifest, "int8": plan.to_dict(), "criterion": criterion})
        publish(stage, self.dest)

    # -- pipelines: outlier channels --------------------------------------------------------

    def find_outliers(self, job: Job) -> dict[str, list[int]]:
        """The candidates' channel maxima on the calibration samples: MatMul -> the input
        channels that are outliers (`infercc.calib.outliers`)."""
        found = outlier_candidates(job.ir)
        if not found:
            return {}
        job.step("looking for outlier channels")
        probe = job.stage_dir / _PROBE_FILE
        files = save_model(job.ir, probe)
        try:
            with _infercc_named_them():
                amax = outliers.channel_absmax(probe, self.calib, list(found.values()))
        finally:
            for f in files:
                f.unlink(missing_ok=True)
        channels: dict[str, list[int]] = {}
        for node, tensor in found.items():
            idx = outliers.outlier_channels(amax[tensor]) if tensor in amax else []
            if idx:
                channels[node] = idx
                self.outlier_severity[node] = outliers.severity(amax[tensor], idx)
        return channels

    # -- plan: the reference, the ranges, the search ----------------------------------------

    def save_reference(self, job: Job) -> None:
        """What the search needs of the fp32 reference, and the reference saved."""
        ir = job.ir
        self.tensors = calibration_tensors(ir)
        if not self.tensors:
            raise InferccError(
                "the model has nothing to quantize (no Conv, MatMul or Gemm with float inputs)",
                "INT8 calibration quantizes Conv, MatMul and Gemm nodes",
            )
        self.sqnr = node_weight_sqnr(ir, weight_max(self.request.weight_bits))
        self.activation_inputs = activation_inputs(ir)
        self.not_scores = embedding_outputs(ir)
        self.fp32_path = job.stage_dir / FP32_FILE
        self.fp32_files = save_model(ir, self.fp32_path)
        del job.ir  # the reference is read back from its file by each trial

    def calibrate(self, job: Job) -> None:
        job.step("calibrating")
        with _infercc_named_them():
            self.ranges = collect_ranges(
                self.fp32_path,
                self.calib,
                self.tensors,
                self.method,
                self.percentile,
                self.on_progress,
            )
        self.calibration = self.calib[:SQNR_SAMPLES]
        job.step("running fp32 on the evaluation samples")
        # a converted model is judged against the original: the conversion is checked too
        reference = self.fp32_path if self.converted_from is None else self.src
        self.reference = run_model(reference, self.samples)
        scores = classifier_outputs(self.reference, self.not_scores)
        if self.targets.max_top1_drop is not None and not scores:
            raise InferccError(
                "max_top1_drop needs a classifier-like output ([batch, classes] or 1-D scores)",
                "use min_cosine for this model",
            )

    def quantize(
        self, job: Job, exclude: Sequence[str], path: Path, qdq_only: bool = False
    ) -> tuple[QuantizeReport, list[Path]]:
        """A fresh copy of the reference through the int8 pipeline's quantize stage (with
        `qdq_only`, its QDQ form: the quantized nodes as they are before fuse-int8-matmul
        takes projections into onnxruntime's op, as the kernel check reads them)."""
        ir = load_model(self.fp32_path)
        settings = QuantizeSettings(
            self.ranges,
            exclude=(*exclude, *self.float_nodes),
            activations=self.request.activations,
            activation_matmuls=self.request.activation_matmuls,
            weight_bits=self.request.weight_bits,
        )
        ctx = stage_context(job.config, quantize=settings)
        disabled = (*job.config.disable_passes, *((FUSE_INT8,) if qdq_only else ()))
        ran = run_passes(ir, ctx, INT8.stages[1], disabled)
        self.quantize_refusals = [r.to_dict() for r in ran.refusals]
        return ran.details("quantize-qdq"), save_model(ir, path)

    def trial(self, job: Job, exclude: tuple[str, ...]) -> Trial:
        report, files = self.quantize(job, exclude, job.stage_dir / _TRIAL_FILE)
        try:
            actual = run_model(files[0], self.samples, optimize=self.fused)
        finally:
            for f in files:
                f.unlink(missing_ok=True)
        evaluation = evaluate(self.reference, actual, self.not_scores)
        return Trial(exclude, report, evaluation, self.quantize_refusals)

    def run_search(
        self, job: Job, exclude: tuple[str, ...], first: Trial | None = None
    ) -> Trial | None:
        """Check the kernels (when the host is the target), then search (module doc 6 of
        `infercc.calib.calibrate`); None, with the search not run, when an outlier split is
        pending and the all-int8 candidate misses the target without it."""
        if self.fused and not self.kernels_checked:  # the target's kernels are this host's
            job.step("checking onnxruntime's int8 kernels")
            # once: an outlier split keeps each projection's name, shapes and kernel
            self.broken_kernels = self.check_kernels(job, exclude)
            self.kernels_checked = True
        exclude = (*exclude, *self.broken_kernels)
        self.search = Search(
            self.targets,
            lambda names: self.trial(job, names),
            self.request.max_trials,
            dict(self.sqnr),
            self.activation_inputs,
            self.activation_sqnr,
            job.step,
        )
        if not self.split_pending:
            return self.search.run(exclude, first)
        first = self.search.first(exclude)
        unsplit = {"cosine": first.evaluation.cosine, "top1_drop": first.evaluation.top1_drop}
        if self.targets.met(first.evaluation):
            self.split_pending = False
            why = f"not needed: without it {self.targets.describe(first.evaluation)}"
            self.outlier_split = {"split": False, "why": why, "unsplit": unsplit}
            return self.search.run(exclude, first)
        why = f"the all-int8 candidate without it missed: {self.targets.describe(first.evaluation)}"
        self.outlier_split = {"split": True, "why": why, "unsplit": unsplit}
        logger.info("outlier channels: %s; splitting", why)
        return None

    @property
    def fused(self) -> bool:
        """Evaluate with this host's fused int8 kernels (the host is the target)."""
        return self.request.plan.fused_evaluation

    def check_kernels(self, job: Job, exclude: tuple[str, ...]) -> dict[str, str]:
        """The quantized nodes whose fused int8 kernel in this onnxruntime disagrees with
        their Q/DQ graph (`infercc.calib.kernels`), on one calibration sample."""
        # onnxruntime makes the QDQ MatMul the same MatMulIntegerToFloat fuse-int8-matmul
        # writes: the QDQ form is what the check cuts nodes out of
        report, files = self.quantize(job, exclude, job.stage_dir / _KERNEL_FILE, qdq_only=True)
        cause = kernel_cause(self.request.plan)
        try:
            with _infercc_named_them():
                return broken_kernels(files[0], self.calibration[0], report.quantized, cause)
        finally:
            for f in files:
                f.unlink(missing_ok=True)

    def activation_sqnr(self, names: Sequence[str]) -> dict[str, float]:
        """Tensor -> the SQNR (dB) of fake-quantizing it with its calibrated (scale, zero
        point), measured on the first `SQNR_SAMPLES` calibration samples (the tensors of
        `names` that have a range)."""
        names = [n for n in names if n in self.ranges]
        if not names:
            return {}
        activations = self.request.activations
        noise = dict.fromkeys(names, 0.0)
        signal = dict.fromkeys(names, 0.0)
        with _infercc_named_them():
            for values in tensor_values(self.fp32_path, self.calibration, names):
                for name, x in values.items():
                    x = np.asarray(x, np.float64)
                    params = activation_params(self.ranges[name], activations)
                    q = fake_quantize(x, *params, activations)
                    noise[name] += float(np.sum((x - q) ** 2))
                    signal[name] += float(np.sum(x**2))
        return {name: db(signal[name], noise[name]) for name in names}

    def make_report(self, final: Trial) -> CalibrationReport:
        """The report of the search's `final` candidate."""
        assert self.search is not None and self.settings is not None
        o, search = self.request, self.search
        kept = kept_float(
            final.quantized, search.sensitivity, set(o.exclude), self.float_nodes,
            self.broken_kernels,
        )  # fmt: skip
        report = calibration_report(
            self.src,
            self.dest,
            (self.method, self.percentile),
            self.targets,
            final,
            kept,
            search.trials,
            len(self.ranges),
        )
        report.activations = o.activations
        report.refusals = [*self.refusals, *final.refusals]
        report.int8 = o.plan
        report.settings = self.settings
        split = set(self.float_nodes.values())
        report.outlier_channels = {n: c for n, c in self.outlier_channels.items() if n in split}
        if self.outlier_split is not None:
            found = {k: list(v) for k, v in self.outlier_channels.items()}
            report.outlier_split = {**self.outlier_split, "found": found}
        if self.converted_from is not None:
            report.opset_conversion = {
                "from": self.converted_from,
                "to": MIN_OPSET,
                "reason": "int8 quantization (per-axis DequantizeLinear)",
                "reference": "the original model",
            }
        report.samples = {
            "calibration": len(self.calib),
            "holdout": len(self.samples) if self.on_holdout else 0,
            "evaluated_on": "holdout" if self.on_holdout else "calibration",
        }
        return report

    # -- validate and write -----------------------------------------------------------------

    def speed_check(self, job: Job, original: Path) -> SpeedCheck:
        """Race the int8 model against the original fp32 model (onnxruntime defaults, which
        optimize it too), interleaved, on one evaluation sample."""
        from infercc.analysis.targets import host_cpu_info
        from infercc.runtime.bench import race

        stats = race(
            original,
            job.stage_dir / INT8_FILE,
            self.samples[0],
            warmup=SPEED_WARMUP,
            iters=SPEED_ITERS,
        )
        cpu, _cores = host_cpu_info()
        vnni = any(f in cpu.features for f in ("avx512_vnni", "avx_vnni", "asimddp"))
        return SpeedCheck(
            fp32_ms=stats.a.p50_ms,
            int8_ms=stats.b.p50_ms,
            ratio_median=stats.ratio_median,
            ratio_p10=stats.ratio_p10,
            ratio_p90=stats.ratio_p90,
            iters=stats.a.iters,
            cpu=cpu.model,
            vnni=vnni,
        )

    def write_files(self, job: Job, exclude: tuple[str, ...]) -> list[str]:
        """Stage the final files; returns their paths under the destination (the report and
        the manifest are added)."""
        stage = job.stage_dir
        _, int8_files = self.quantize(job, exclude, stage / INT8_FILE)
        write_json(stage / RANGES_FILE, {n: _range_dict(r) for n, r in self.ranges.items()})
        scales = {name: r.scale for name, r in self.ranges.items()}
        method = CACHE_METHOD[self.method]
        write_calibration_cache(stage / CACHE_FILE, scales, method, self.request.trt_version)
        names = [p.name for p in (*int8_files, *self.fp32_files)]
        names += [RANGES_FILE, CACHE_FILE, REPORT_FILE, MANIFEST]
        return [str(self.dest / name) for name in names]


@contextmanager
def _infercc_named_them() -> Iterator[None]:
    """The tensors observed here were named by infercc, not the user: one it cannot observe is
    infercc's failure (exit 1), not bad input."""
    try:
        yield
    except UnobservableTensor as e:
        raise InternalError(
            f"calibration asked for a tensor it cannot observe: {e.message}",
            "this is a bug in infercc; please report it with the model",
        ) from e


def _range_dict(r: TensorRange) -> dict[str, Any]:
    return {
        "min": json_float(r.min),
        "max": json_float(r.max),
        "scale": json_float(r.scale),
        "method": r.method,
    }


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


# --------------------------------------------------------------------------- the model


def default_opset(model: Model) -> int | None:
    """The model's ai.onnx opset (None: it imports none)."""
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


def load_at_opset(src: Path, opset: int, purpose: str) -> tuple[Model, int | None]:
    """The model's IR at opset >= `opset`, and the opset it was converted from (None: it was
    not): an older model goes through onnx.version_converter (int8's per-axis
    DequantizeLinear needs 13, int4's blocked one 21). A conversion that fails is an error
    naming the opset and the fix; nothing has been written then."""
    ir = load_model(src)
    version = default_opset(ir)
    if version is None or version >= opset:
        return ir, None
    from onnx import version_converter

    proto = onnx.load(str(src))
    try:
        converted = version_converter.convert_version(proto, opset)
    except Exception as exc:  # the converter raises its own error types
        raise InferccError(
            f"{purpose} needs opset {opset}; converting the model from opset {version} "
            f"failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}",
            f"re-export the model with opset_version={opset} or later "
            "(torch.onnx.export(..., opset_version=17))",
        ) from None
    logger.info("converted opset %d -> %d for %s", version, opset, purpose)
    return import_model(converted), version


# --------------------------------------------------------------------------- samples


def read_samples(
    data: str | PathLike[str],
    model: onnx.ModelProto,
    num_samples: int | None,
    preprocess: str | None = None,
) -> Samples:
    """The first `num_samples` samples of `infercc.data.samples.iter_samples` (all when None).

    Files are read lazily in name order, so the files (or images) past the first
    `num_samples` samples are never opened. `preprocess` is the `--preprocess` spec for images.
    """
    samples = list(islice(iter_samples(data, model, preprocess), num_samples))
    logger.info("read %d sample(s) from %s", len(samples), data)
    return samples


def split_samples(samples: Samples, holdout: float) -> tuple[Samples, Samples, bool]:
    """(calibration, evaluation, evaluation is a holdout): the last `holdout` fraction held out.

    At least one sample is held out when holdout > 0 and there are two or more, and at least
    one always calibrates; without a holdout the evaluation uses the calibration samples.
    """
    n = len(samples)
    if n == 0:
        raise InferccError("no samples to calibrate with", "pass at least one sample with --data")
    held = min(n - 1, max(1, math.floor(n * holdout + 0.5))) if holdout > 0 and n >= 2 else 0
    if held == 0:
        logger.warning("no holdout: evaluating on the calibration samples")
        return samples, samples, False
    return samples[: n - held], samples[n - held :], True


# --------------------------------------------------------------------------- graph helpers


def name_targets(ir: Model) -> None:
    """Give every unnamed quantizable node a name (exclude and the report refer to names)."""
    for node in ir.graph:
        if is_target(node) and not node.name:
            node.name = ir.graph.fresh_node_name(node.op_type)


def check_exclude(ir: Model, exclude: Sequence[str]) -> None:
    names = [node.name for node in ir.graph if is_target(node)]
    unknown = [name for name in exclude if name not in names]
    if unknown:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise InferccError(
            f"exclude names node(s) that are not quantizable nodes of the optimized model: "
            f"{', '.join(map(repr, unknown))}",
            f"give Conv/MatMul/Gemm node names; they are: {shown or '(none)'}",
        )
