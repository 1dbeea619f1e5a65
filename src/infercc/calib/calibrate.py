"""INT8 calibration end to end: samples -> fp32 optimization -> ranges -> QDQ model -> checks.

`calibrate(model, data, out_dir)` is the Python API under `infercc calibrate --int8`:

1. **Samples.** `data.samples.iter_samples` reads them (a .npz file, a directory of .npz files
   or of <input>.npy files, one .npz of stacked samples (every array has rank + 1: N samples on
   axis 0), or images with a `preprocess` spec (`infercc.data.images`)) and checks every
   input's presence, dtype and declared dims; pickled (object) arrays are refused.
   `num_samples` keeps the first N in file-name order (files past them are never opened). The
   last `holdout` fraction of them (rounded, at least one when holdout > 0 and there are two or
   more, never all) is held out for evaluation; the rest calibrates. With holdout 0, or a
   single sample, the evaluation runs on
   the calibration samples and the report says so (`samples.evaluated_on`).
2. **fp32 first.** The model goes through the calibrate-fp32 pipeline
   (`infercc.passes.pipelines`: the optimize passes, portable): constants are folded,
   BatchNormalization is folded into the Conv before it, and no onnxruntime contrib op
   (FusedConv, ...) appears, so the Q/DQ model stays standard ONNX that TensorRT also reads.
   Quantizable nodes (Conv, MatMul, Gemm) without a name get one (`exclude` and the report need
   names). With `outlier_channels` (default), the channel maxima of transformer projections'
   inputs are measured on the calibration samples (`infercc.calib.outliers`) and the int8
   pipeline's first stage, split-outlier-channels, splits a projection whose input has a few
   outlier channels exactly, those channels kept float. The result, `model_fp32.onnx`, is the
   reference for the ranges and for the evaluation, and it is written to `out_dir` too:
   `ranges.json` and `calibration.cache` name tensors of *this* graph (a fused Conv takes its
   BatchNormalization's output name, folded constants disappear), which is the graph a
   TensorRT < 11 implicit-INT8 build must be given with the cache.
3. **Ranges.** `collect_ranges` observes the activations `calibration_tensors` names (the inputs
   of the quantizable nodes and the outputs that get Q/DQ pairs) with `method` (minmax, entropy
   or percentile). Left out, the method and its percentile are chosen from the model
   (`infercc.calib.choices`): percentile 99.999 for a transformer, minmax otherwise.
4. **Quantize.** The int8 pipeline's second stage (quantize-qdq, then eliminate-dead-code)
   rewrites a fresh copy of the fp32 graph (per-channel int8 weights, per-tensor activations,
   in the form the target's CPU row runs exactly: `infercc.calib.forms`; 7-bit weights on
   CPUs without VNNI, whose u8 x s8 kernels sum pairs in int16 with saturation),
   keeping the user's `exclude` nodes float, and the nodes whose int8 kernel in the installed
   onnxruntime computes something else than their Q/DQ graph (`infercc.calib.kernels`: each
   node is cut out with its Q/DQ pairs and run fused and unfused on its values from the first
   calibration sample; onnxruntime 1.21 to 1.24 on AMX-INT8 CPUs get some Conv, MatMul and Gemm
   shapes wrong), each with the reason. `disable_passes` skips passes of both pipelines (all
   but quantize-qdq itself).
5. **Evaluate.** fp32 (onnxruntime CPU, graph optimizations off) and the int8 candidate
   (optimizations on, so onnxruntime fuses Q/DQ into int8 kernels) run on the evaluation
   samples. Per output: cosine similarity (the minimum over samples), max abs error (the
   maximum), and for classifier-like float outputs ([batch, classes] with classes >= 2, or a
   1-D score vector, not made by Div, LpNormalization, ReduceMean/Sum/L2 or
   LayerNormalization: those are embeddings) the top-1 agreement with fp32 over every row of
   every sample. Sample files carry no labels, so agreement with fp32 is the accuracy proxy:
   top1_drop = 100 * (1 - agreement), in points, the worst over classifier outputs.
6. **Accuracy target.** A transformer's `min_cosine` is 0.99 unless the user gives it (0: none)
   or gives `max_top1_drop`; other models have no target unless given. When the target (on the
   worst output) is not met, nodes move back to float one at a time. Each round ranks the nodes
   still in int8 by weight SQNR (`weight_sqnr` of their constant inputs, lowest first; a node
   with no constant weight, e.g. an attention MatMul of two activations, counts as -inf and is
   always measured) and measures only the `SENSITIVITY_CANDIDATES` (8) worst: each is
   re-quantized with that node also in float and evaluated. The node whose float version gives
   the best result (smallest top-1 drop when that target is set, then highest cosine) moves to
   float for good. Rounds repeat until the target holds. If every node ends in float the target
   could not be met with any int8 node: the run fails (`passed` False). A default target still
   unmet at the `max_trials` cap is said in the message; the run passes with the last candidate
   (a target the user gave fails there). A round costs up to 8 quantize+evaluate trials, so the
   worst case is 8 x (number of quantized nodes) trials.
7. **Write.** Everything is built in a staging directory beside `out_dir` and renamed into
   place only when the run passes (a failed run leaves nothing; the returned report says why).
   An existing `out_dir` must be empty or a previous calibration output (it holds
   `calibration_report.json`); anything else is refused untouched. Files: `model_int8.onnx`
   (Q/DQ), `model_fp32.onnx` (see 2), `ranges.json` (tensor name -> {min, max, scale,
   method}), `calibration.cache` (TensorRT's text cache, scales from the ranges) and
   `calibration_report.json` (`CalibrationReport.to_dict()`); a model over the external-data
   threshold gets its `.data` file beside it.

TensorRT has no percentile calibrator: the cache header says `EntropyCalibration2` for the
entropy and percentile methods (TensorRT's default calibrator, the one trtexec `--calib` uses)
and `MinMaxCalibration` for minmax. The header only tells TensorRT which calibrator produced
the scales; it takes the scales as written.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.backends.trt.calib_cache import DEFAULT_TRT_VERSION, write_calibration_cache
from infercc.calib import outliers
from infercc.calib.choices import Settings, choose
from infercc.calib.forms import Int8Plan, kernel_cause, plan_int8
from infercc.calib.kernels import broken_kernels
from infercc.calib.observers import (
    DEFAULT_PERCENTILE,
    Calibrator,
    Method,
    ProgressFn,
    TensorRange,
    collect_ranges,
    tensor_values,
)
from infercc.check.compare import compare_outputs, run_model
from infercc.check.tolerances import calibrated_criterion
from infercc.data.samples import iter_samples
from infercc.errors import InferccError
from infercc.ir import Model, export_model, load_model, save_model
from infercc.ir.output_types import reconcile_output_types, strictly_typed
from infercc.outputs import check_output_dir
from infercc.passes.manager import PassContext, QuantizeSettings, check_pass_names, run_passes
from infercc.passes.match import const_value
from infercc.passes.pipelines import CALIBRATE_FP32, INT8, check_disabled
from infercc.passes.quantize_qdq import (
    ACTIVATION_TYPES,
    INT8_MAX,
    TARGET_INPUTS,
    QuantizeReport,
    activation_params,
    calibration_tensors,
    check_opset,
    weight_axis,
    weight_max,
    weight_sqnr,
)
from infercc.passes.split_outliers import candidates as outlier_candidates
from infercc.runtime.artifact import MANIFEST, publish, staging_dir, write_manifest
from infercc.runtime.artifact import manifest as artifact_manifest
from infercc.runtime.ort_support import check_ir_version
from infercc.util import json_float

logger = logging.getLogger(__name__)

INT8_FILE = "model_int8.onnx"
FP32_FILE = "model_fp32.onnx"
RANGES_FILE = "ranges.json"
CACHE_FILE = "calibration.cache"
REPORT_FILE = "calibration_report.json"
_TRIAL_FILE = ".trial.onnx"
_KERNEL_FILE = ".kernel_check.onnx"
_PROBE_FILE = ".outlier_probe.onnx"

SENSITIVITY_CANDIDATES = 8
DEFAULT_MAX_TRIALS = 64
SQNR_SAMPLES = 4  # calibration samples used to measure each activation's quantization noise
SPEED_WARMUP, SPEED_ITERS = 10, 60
CACHE_METHOD = {"minmax": "minmax", "entropy": "entropy", "percentile": "entropy"}

Samples = list[dict[str, np.ndarray]]
Outputs = list[dict[str, np.ndarray]]


# --------------------------------------------------------------------------- report


@dataclass
class OutputQuality:
    """How one int8 output compares with fp32 over the evaluation samples."""

    name: str
    cosine: float | None
    max_abs: float | None
    top1_agreement: float | None = None  # None: not a classifier-like output

    @property
    def top1_drop(self) -> float | None:
        return None if self.top1_agreement is None else 100.0 * (1.0 - self.top1_agreement)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cosine": json_float(self.cosine),
            "max_abs": json_float(self.max_abs),
            "top1_agreement": json_float(self.top1_agreement),
            "top1_drop": json_float(self.top1_drop),
        }


@dataclass
class Evaluation:
    """Per-output quality of one candidate."""

    outputs: dict[str, OutputQuality]

    @property
    def cosine(self) -> float:
        """The worst cosine over outputs (0.0 for an output that could not be compared)."""
        values = [0.0 if o.cosine is None else o.cosine for o in self.outputs.values()]
        return min(values, default=1.0)

    @property
    def top1_drop(self) -> float | None:
        """The worst top-1 drop (points) over classifier-like outputs; None when there is none."""
        drops = [o.top1_drop for o in self.outputs.values() if o.top1_drop is not None]
        return max(drops) if drops else None


@dataclass
class KeptFloat:
    """A quantizable node left in float, and why."""

    node: str
    reason: str
    cause: str  # "user" | "quantizer" | "outliers" | "runtime" | "sensitivity"
    round: int | None = None
    weight_sqnr_db: float | None = None
    cosine_before: float | None = None
    cosine_after: float | None = None
    top1_drop_before: float | None = None
    top1_drop_after: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"node": self.node, "reason": self.reason, "cause": self.cause}
        if self.cause == "sensitivity":
            data.update(
                round=self.round,
                weight_sqnr_db=json_float(self.weight_sqnr_db),
                cosine_before=json_float(self.cosine_before),
                cosine_after=json_float(self.cosine_after),
                top1_drop_before=json_float(self.top1_drop_before),
                top1_drop_after=json_float(self.top1_drop_after),
            )
        return data


@dataclass
class CalibrationReport:
    """What `calibrate` did, as data (`to_dict()` is what calibration_report.json holds)."""

    model: str
    out_dir: str
    method: str
    percentile: float | None
    samples: dict[str, Any]
    outputs: dict[str, OutputQuality]
    quantized: list[str]
    kept_float: list[KeptFloat]
    targets: dict[str, float | None]
    passed: bool
    message: str
    files: list[str] = field(default_factory=list)
    ranges: int = 0
    trials: int = 0
    seconds: float = 0.0
    activations: str = "int8"
    speed: SpeedCheck | None = None
    outlier_channels: dict[str, list[int]] = field(default_factory=dict)
    settings: Settings | None = None  # the method, percentile and target: given or chosen
    int8: Int8Plan | None = None  # the form the target got, and what was not measured here

    @property
    def quantized_nodes(self) -> int:
        return len(self.quantized)

    def to_dict(self) -> dict[str, Any]:
        evaluation = Evaluation(self.outputs)
        return {
            "model": self.model,
            "out_dir": self.out_dir,
            "method": self.method,
            "percentile": json_float(self.percentile),
            "settings": None if self.settings is None else self.settings.to_dict(),
            "samples": dict(self.samples),
            "outputs": {name: q.to_dict() for name, q in self.outputs.items()},
            "cosine": json_float(evaluation.cosine),
            "top1_drop": json_float(evaluation.top1_drop),
            "quantized_nodes": self.quantized_nodes,
            "quantized": list(self.quantized),
            "kept_float": [k.to_dict() for k in self.kept_float],
            "targets": {k: json_float(v) for k, v in self.targets.items()},
            "passed": bool(self.passed),
            "message": self.message,
            "files": list(self.files),
            "ranges": self.ranges,
            "sensitivity_trials": self.trials,
            "activations": self.activations,
            "int8": None if self.int8 is None else self.int8.to_dict(),
            "outlier_channels": {k: list(v) for k, v in self.outlier_channels.items()},
            "speed": None if self.speed is None else self.speed.to_dict(),
            "seconds": round(self.seconds, 4),
        }


@dataclass
class SpeedCheck:
    """int8 against fp32 on this host, raced interleaved on one real sample (module doc 8)."""

    fp32_ms: float
    int8_ms: float
    ratio_median: float  # int8 time / fp32 time
    ratio_p10: float
    ratio_p90: float
    iters: int
    cpu: str
    vnni: bool

    @property
    def slower(self) -> bool:
        """int8 slower than fp32 beyond noise: the ratio's 10th percentile is above 1."""
        return self.ratio_p10 > 1.0

    @property
    def message(self) -> str:
        text = (
            f"int8 {self.int8_ms:.3f} ms vs fp32 {self.fp32_ms:.3f} ms median "
            f"({self.ratio_median:.2f}x the fp32 time, p10..p90 "
            f"{self.ratio_p10:.2f}..{self.ratio_p90:.2f})"
        )
        if not self.slower:
            return text
        why = "" if self.vnni else " (this CPU has no VNNI int8 dot-product instructions)"
        return f"int8 is SLOWER than fp32 on this host{why}: {text}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "fp32_ms": json_float(self.fp32_ms),
            "int8_ms": json_float(self.int8_ms),
            "ratio_median": json_float(self.ratio_median),
            "ratio_p10": json_float(self.ratio_p10),
            "ratio_p90": json_float(self.ratio_p90),
            "iters": self.iters,
            "cpu": self.cpu,
            "vnni": self.vnni,
            "slower": self.slower,
            "message": self.message,
        }


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Targets:
    """The accuracy target: worst-output cosine and/or worst top-1 drop in points."""

    min_cosine: float | None = None
    max_top1_drop: float | None = None
    chosen: bool = False  # the default target, not the user's: missing it is not a failure

    @property
    def given(self) -> bool:
        return self.min_cosine is not None or self.max_top1_drop is not None

    def met(self, evaluation: Evaluation) -> bool:
        if self.min_cosine is not None and not evaluation.cosine >= self.min_cosine:
            return False
        drop = evaluation.top1_drop
        return self.max_top1_drop is None or (drop is not None and drop <= self.max_top1_drop)

    def badness(self, evaluation: Evaluation) -> tuple[float, float]:
        """Smaller is better: the top-1 drop when that target is set, then -cosine."""
        drop = evaluation.top1_drop if self.max_top1_drop is not None else None
        return (drop or 0.0, -evaluation.cosine)

    def describe(self, evaluation: Evaluation) -> str:
        parts = [f"cosine {evaluation.cosine:.6f}"]
        if self.min_cosine is not None:
            parts[0] += f" (target >= {self.min_cosine})"
        if self.max_top1_drop is not None:
            parts.append(
                f"top-1 drop {evaluation.top1_drop:.2f} points (target <= {self.max_top1_drop})"
            )
        return ", ".join(parts)

    def to_dict(self) -> dict[str, float | None]:
        return {"min_cosine": self.min_cosine, "max_top1_drop": self.max_top1_drop}


# --------------------------------------------------------------------------- entry point


def calibrate(
    model: str | PathLike[str],
    data: str | PathLike[str],
    out_dir: str | PathLike[str],
    *,
    method: Method | None = None,
    percentile: float | None = None,
    num_samples: int | None = None,
    holdout: float = 0.2,
    min_cosine: float | None = None,
    max_top1_drop: float | None = None,
    exclude: Sequence[str] = (),
    trt_version: str = DEFAULT_TRT_VERSION,
    preprocess: str | None = None,
    target: str = "cpu",
    activations: str = "auto",
    weight_bits: str | int = "auto",
    activation_matmuls: bool = False,
    max_trials: int = DEFAULT_MAX_TRIALS,
    speed_check: bool = True,
    outlier_channels: bool = True,
    disable_passes: Sequence[str] = (),
    verify: bool = False,
    on_step: Callable[[str], None] | None = None,
    on_progress: ProgressFn | None = None,
) -> CalibrationReport:
    """Calibrate `model` on the samples in `data` and write an INT8 model to `out_dir`.

    See the module docstring for the method. `method`, `percentile` and `min_cosine` left at
    None are chosen from the model (`infercc.calib.choices`: percentile 99.999 and the target
    min cosine 0.99 for a transformer, unless `max_top1_drop` is given; minmax and no target
    otherwise); `min_cosine=0` means no cosine target. `target`, `activations` and
    `weight_bits` ("auto", 8 or 7) decide the int8 form (`infercc.calib.forms`: the target's
    CPU row gives 7-bit weights where the int8 kernels saturate 8-bit ones); the report's
    `int8` says which form, how it was evaluated and what this host could not measure. The
    report's `settings` says which were given and why the others were chosen.
    `disable_passes` skips passes of the calibrate-fp32 and int8 pipelines
    (`infercc.passes.pipelines`) by name; `verify` lints the graph after every pass (a pass
    that breaks it is named). `on_step(text)` is
    called at each stage and each sensitivity round; `on_progress(done, total)` after each
    calibration sample.
    """
    t0 = time.perf_counter()
    _check_given(method, percentile, min_cosine)
    _check_options(
        method or "minmax",
        DEFAULT_PERCENTILE if percentile is None else percentile,
        num_samples,
        holdout,
        Targets(min_cosine or None, max_top1_drop),
    )
    disabled = check_calibrate_passes(disable_passes)
    outlier_channels = outlier_channels and "split-outlier-channels" not in disabled
    resolve_activations(activations, target)  # an unknown type is refused first
    plan = plan_int8(target, activations, weight_bits)
    activations = plan.activations
    if max_trials < 0:
        raise InferccError(f"max_trials must be >= 0, got {max_trials}", "e.g. 64")
    src, dest = Path(model), Path(out_dir)
    check_calibration_destination(dest, src)
    step = on_step or (lambda _text: None)
    step("loading")
    ir = load_model(src)
    check_ir_version(ir.ir_version, str(src))
    check_opset(ir)
    settings = choose(ir, method, percentile, min_cosine, max_top1_drop)
    method = settings.method.value
    percentile = DEFAULT_PERCENTILE if settings.percentile is None else settings.percentile.value
    targets = Targets(settings.min_cosine.value, max_top1_drop, not settings.min_cosine.given)
    samples = read_samples(data, export_model(ir, with_weights=False), num_samples, preprocess)
    calib, evaluation_set, on_holdout = split_samples(samples, holdout)
    staging = staging_dir(dest)
    stage = staging.path
    try:
        job = _Job(stage, targets, evaluation_set, step)
        job.options = _QuantOptions(
            activations, activation_matmuls, max_trials, disabled, verify, plan.weight_bits
        )
        job.plan = plan
        job.prepare_fp32(ir, exclude, calib if outlier_channels else ())
        del ir
        job.calibrate(calib, method, percentile, on_progress)
        final = job.search(tuple(exclude))
        report = _report(src, dest, method, percentile, job, final, exclude)
        report.activations = activations
        report.int8 = plan
        report.settings = settings
        report.outlier_channels = dict(job.outlier_channels)
        report.samples = {
            "calibration": len(calib),
            "holdout": len(evaluation_set) if on_holdout else 0,
            "evaluated_on": "holdout" if on_holdout else "calibration",
        }
        if report.passed:
            step("writing")
            report.files = job.write(dest, final.exclude, method, trt_version)
            if speed_check and plan.on_host:
                step("racing int8 against fp32")
                report.speed = job.speed_check(src)
                logger.info("%s", report.speed.message)  # the report says it to the user
            report.seconds = time.perf_counter() - t0
            _write_json(stage / REPORT_FILE, report.to_dict())
            manifest = calibration_manifest(src, target, report.files)
            # the criterion it was accepted at, which infercc validate applies (one verdict)
            criterion = calibrated_criterion(
                Evaluation(report.outputs).cosine,
                "calibrate --int8",
                report.samples["evaluated_on"],
                "int8",
            )
            write_manifest(stage, {**manifest, "int8": plan.to_dict(), "criterion": criterion})
            publish(stage, dest)
    finally:
        staging.close()
    report.seconds = time.perf_counter() - t0
    return report


def calibration_manifest(
    src: Path,
    target: str,
    written: Sequence[str],
    model_file: str = INT8_FILE,
    precision: str = "int8",
) -> dict[str, Any]:
    """The manifest.json of a calibration output (`written`: the paths of its files): an
    artifact of the `none` backend whose model is the quantized one (`model_file`), so
    `infercc bench` and `infercc validate` take the directory."""
    from infercc.analysis.targets import get_target
    from infercc.runtime.tuning import file_sha256, host_fingerprint
    from infercc.version import __version__

    files = [Path(f).name for f in written if Path(f).name != MANIFEST]
    data = artifact_manifest(
        source=src,
        source_sha256=file_sha256(src),
        passes={},
        target=get_target(target).to_dict(),
        host=host_fingerprint(),
        backend={"name": "none", "version": __version__, "files": files, "points": []},
        profiles=(),
        precision=precision,
        memory=None,
        validation=None,
    )
    return {**data, "model": model_file, "calibration": REPORT_FILE}


def check_calibrate_passes(disable_passes: Sequence[str]) -> tuple[str, ...]:
    """The passes to skip, checked: known, run by calibrate, and not the quantization itself."""
    disabled = tuple(disable_passes)
    check_pass_names(disabled)
    check_disabled(disabled, [CALIBRATE_FP32, INT8], "calibrate")
    if "quantize-qdq" in disabled:
        raise InferccError(
            "--disable-pass quantize-qdq leaves calibrate nothing to do: it is the int8 rewrite",
            "to keep nodes in float, name them with --exclude",
        )
    return disabled


def resolve_activations(activations: str, target: str) -> str:
    """`auto`: uint8 (asymmetric) for the CPU, int8 (symmetric) for GPU targets (TensorRT)."""
    if activations == "auto":
        from infercc.analysis.targets import get_target

        return "int8" if get_target(target).kind == "gpu" else "uint8"
    if activations not in ACTIVATION_TYPES:
        raise InferccError(
            f"unknown activation type {activations!r}",
            "use auto, int8 (symmetric; TensorRT) or uint8 (asymmetric; onnxruntime CPU)",
        )
    return activations


def _check_given(method: str | None, percentile: float | None, min_cosine: float | None) -> None:
    """A percentile with another method would have no effect; min_cosine is in [0, 1]."""
    if percentile is not None and method is not None and method != "percentile":
        raise InferccError(
            f"a percentile applies to the percentile method only, not {method}",
            "drop --percentile, or pass --method percentile",
        )
    if min_cosine is not None and not 0.0 <= min_cosine <= 1.0:
        raise InferccError(
            f"min_cosine must be in [0, 1] (0: no target), got {min_cosine}", "e.g. 0.99"
        )


def _check_options(
    method: str, percentile: float, num_samples: int | None, holdout: float, targets: Targets
) -> None:
    Calibrator(method, percentile)  # raises on an unknown method or a bad percentile
    if num_samples is not None and num_samples < 1:
        raise InferccError(f"num_samples must be at least 1, got {num_samples}", "e.g. 500")
    if not 0.0 <= holdout < 1.0:
        raise InferccError(
            f"holdout {holdout} leaves no calibration samples"
            if holdout >= 1.0
            else f"holdout must be in [0, 1), got {holdout}",
            "hold out a fraction such as 0.2 (0 evaluates on the calibration samples)",
        )
    if targets.min_cosine is not None and not 0.0 < targets.min_cosine <= 1.0:
        raise InferccError(f"min_cosine must be in (0, 1], got {targets.min_cosine}", "e.g. 0.99")
    if targets.max_top1_drop is not None and not targets.max_top1_drop >= 0.0:
        raise InferccError(
            f"max_top1_drop must be >= 0 points, got {targets.max_top1_drop}", "e.g. 1.0"
        )


def check_calibration_destination(out_dir: Path, model: Path | None = None) -> None:
    """Refuse a file, or a non-empty directory that is not a previous calibration output."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InferccError(f"{out_dir} exists and is not a directory", "pick another output path")
    if model is not None and out_dir.resolve() in model.resolve().parents:
        raise InferccError(
            f"{out_dir} holds the input model; calibrate would replace it",
            "pick another output directory",
        )
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / REPORT_FILE).is_file():
        raise InferccError(
            f"{out_dir} is a non-empty directory that is not a calibration output",
            f"give a new or empty directory (or one holding {REPORT_FILE} to replace)",
        )
    check_output_dir(out_dir, "-o")


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


# --------------------------------------------------------------------------- the job


@dataclass
class _QuantOptions:
    activations: str = "int8"
    activation_matmuls: bool = False
    max_trials: int = DEFAULT_MAX_TRIALS
    disabled: tuple[str, ...] = ()
    verify: bool = False
    weight_bits: int = 8


@dataclass
class _Trial:
    """One candidate: the nodes kept float by name, what the quantizer did, how it scored."""

    exclude: tuple[str, ...]
    quantized: QuantizeReport
    evaluation: Evaluation


class _Job:
    """The staged files and the state shared by the steps of one calibration."""

    def __init__(
        self, stage: Path, targets: Targets, samples: Samples, step: Callable[[str], None]
    ):
        self.stage = stage
        self.targets = targets
        self.samples = samples
        self.step = step
        self.fp32_path = stage / FP32_FILE
        self.fp32_files: list[Path] = []
        self.tensors: list[str] = []
        self.sqnr: dict[str, float] = {}
        self.ranges: dict[str, TensorRange] = {}
        self.reference: Outputs = []
        self.sensitivity: dict[str, KeptFloat] = {}
        self.trials = 0
        self.options = _QuantOptions()
        self.activation_inputs: dict[str, list[str]] = {}  # node -> its activation inputs
        self.calibration: Samples = []
        self.not_scores: frozenset[str] = frozenset()
        self.float_nodes: dict[str, str] = {}  # outlier MatMul -> the MatMul it was split from
        self.outlier_channels: dict[str, list[int]] = {}
        self.broken_kernels: dict[str, str] = {}  # node -> why onnxruntime's int8 kernel is wrong
        self.plan: Int8Plan | None = None  # None: the host is the target (fused evaluation)

    def prepare_fp32(self, ir: Model, exclude: Sequence[str], samples: Samples = ()) -> None:
        """Run the portable fp32 pipeline, name the targets, split outlier channels (when
        `samples` are given), save the fp32 reference."""
        self.step("optimizing fp32")
        typed = strictly_typed(ir)
        ctx = PassContext(portable=True, verify=self.options.verify)
        run_passes(ir, ctx, CALIBRATE_FP32.passes, self.options.disabled)
        reconcile_output_types(ir, typed)  # every written model passes onnx's full checker
        _name_targets(ir)
        _check_exclude(ir, exclude)
        if samples:
            self.split_outliers(ir, samples)
        self.tensors = calibration_tensors(ir)
        if not self.tensors:
            raise InferccError(
                "the model has nothing to quantize (no Conv, MatMul or Gemm with float inputs)",
                "INT8 calibration quantizes Conv, MatMul and Gemm nodes",
            )
        self.sqnr = node_weight_sqnr(ir, weight_max(self.options.weight_bits))
        self.activation_inputs = _activation_inputs(ir)
        self.not_scores = _embedding_outputs(ir)
        self.fp32_files = save_model(ir, self.fp32_path)

    def split_outliers(self, ir: Model, samples: Samples) -> None:
        """Measure the candidates' channel maxima on `samples` and split the MatMuls whose
        inputs have outlier channels (`infercc.calib.outliers`)."""
        found = outlier_candidates(ir)
        if not found:
            return
        self.step("looking for outlier channels")
        probe = self.stage / _PROBE_FILE
        files = save_model(ir, probe)
        try:
            amax = outliers.channel_absmax(probe, samples, list(found.values()))
        finally:
            for f in files:
                f.unlink(missing_ok=True)
        channels: dict[str, list[int]] = {}
        for node, tensor in found.items():
            idx = outliers.outlier_channels(amax[tensor]) if tensor in amax else []
            if idx:
                channels[node] = idx
        if channels:
            ctx = PassContext(outlier_channels=channels, verify=self.options.verify)
            split = run_passes(ir, ctx, INT8.stages[0], self.options.disabled)
            self.float_nodes = split.details("split-outlier-channels") or {}
        self.outlier_channels = channels

    def calibrate(
        self, samples: Samples, method: Method, percentile: float, on_progress: ProgressFn | None
    ) -> None:
        self.step("calibrating")
        self.ranges = collect_ranges(
            self.fp32_path, samples, self.tensors, method, percentile, on_progress
        )
        self.calibration = samples[:SQNR_SAMPLES]
        self.step("running fp32 on the evaluation samples")
        self.reference = run_model(self.fp32_path, self.samples)
        scores = _classifier_outputs(self.reference, self.not_scores)
        if self.targets.max_top1_drop is not None and not scores:
            raise InferccError(
                "max_top1_drop needs a classifier-like output ([batch, classes] or 1-D scores)",
                "use min_cosine for this model",
            )

    def quantize(self, exclude: Sequence[str], path: Path) -> tuple[QuantizeReport, list[Path]]:
        ir = load_model(self.fp32_path)
        settings = QuantizeSettings(
            self.ranges,
            exclude=(*exclude, *self.float_nodes),
            activations=self.options.activations,
            activation_matmuls=self.options.activation_matmuls,
            weight_bits=self.options.weight_bits,
        )
        ctx = PassContext(quantize=settings, verify=self.options.verify)
        ran = run_passes(ir, ctx, INT8.stages[1], self.options.disabled)
        return ran.details("quantize-qdq"), save_model(ir, path)

    def trial(self, exclude: tuple[str, ...]) -> _Trial:
        report, files = self.quantize(exclude, self.stage / _TRIAL_FILE)
        try:
            actual = run_model(files[0], self.samples, optimize=self.fused)
        finally:
            for f in files:
                f.unlink(missing_ok=True)
        self.trials += 1
        return _Trial(exclude, report, evaluate(self.reference, actual, self.not_scores))

    def search(self, exclude: tuple[str, ...]) -> _Trial:
        """Quantize, evaluate, and move nodes to float until the target holds (module doc 6)."""
        if self.fused:  # the target's kernels are this host's: check them
            self.step("checking onnxruntime's int8 kernels")
            self.broken_kernels = self.check_kernels(exclude)
            exclude = (*exclude, *self.broken_kernels)
        self.step("quantizing")
        current = self.trial(exclude)
        self.trials = 0  # count sensitivity trials only
        logger.info("int8: %s", self.targets.describe(current.evaluation))
        round_ = 0
        if self.targets.given and not self.targets.met(current.evaluation):
            self.rank_nodes()
        while self.targets.given and not self.targets.met(current.evaluation):
            if not current.quantized.quantized:
                break
            if self.trials >= self.options.max_trials:
                break
            round_ += 1
            self.step(f"sensitivity round {round_}: {self.targets.describe(current.evaluation)}")
            current = self._move_one_to_float(current, round_)
        return current

    @property
    def fused(self) -> bool:
        """Evaluate with this host's fused int8 kernels (the host is the target)."""
        return self.plan is None or self.plan.fused_evaluation

    def check_kernels(self, exclude: tuple[str, ...]) -> dict[str, str]:
        """The quantized nodes whose fused int8 kernel in this onnxruntime disagrees with
        their Q/DQ graph (`infercc.calib.kernels`), on one calibration sample."""
        report, files = self.quantize(exclude, self.stage / _KERNEL_FILE)
        cause = None if self.plan is None else kernel_cause(self.plan)
        try:
            return broken_kernels(files[0], self.calibration[0], report.quantized, cause)
        finally:
            for f in files:
                f.unlink(missing_ok=True)

    def _move_one_to_float(self, current: _Trial, round_: int) -> _Trial:
        candidates = sorted(current.quantized.quantized, key=lambda n: self.sqnr.get(n, -math.inf))
        budget = min(SENSITIVITY_CANDIDATES, self.options.max_trials - self.trials)
        trials = [self.trial((*current.exclude, n)) for n in candidates[:budget]]
        best = min(trials, key=lambda t: self.targets.badness(t.evaluation))
        node = best.exclude[-1]
        before, after = current.evaluation, best.evaluation
        self.sensitivity[node] = KeptFloat(
            node,
            _sensitivity_reason(before, after, self.targets),
            "sensitivity",
            round=round_,
            weight_sqnr_db=self.sqnr.get(node),
            cosine_before=before.cosine,
            cosine_after=after.cosine,
            top1_drop_before=before.top1_drop,
            top1_drop_after=after.top1_drop,
        )
        logger.info("round %d: %s back to float (%s)", round_, node, self.sensitivity[node].reason)
        return best

    def rank_nodes(self) -> None:
        """Fold each node's activation quantization noise into its sensitivity figure.

        The weight SQNR alone misses what hurts transformers most: an activation whose range
        is set by a few outlier channels (the FFN output projection's GELU input). The noise
        of fake-quantizing every activation input with its calibrated (scale, zero point) is
        measured on `SQNR_SAMPLES` calibration samples; noise powers add, so a node's figure is
        -10 log10(sum of 10^(-sqnr/10)) over its weight and activation inputs.
        """
        self.step("measuring activation quantization noise")
        names = sorted({t for inputs in self.activation_inputs.values() for t in inputs})
        names = [n for n in names if n in self.ranges]
        if not names:
            return
        noise = dict.fromkeys(names, 0.0)
        signal = dict.fromkeys(names, 0.0)
        for values in tensor_values(self.fp32_path, self.calibration, names):
            for name, x in values.items():
                x = np.asarray(x, np.float64)
                params = activation_params(self.ranges[name], self.options.activations)
                noise[name] += float(
                    np.sum((x - fake_quantize(x, *params, self.options.activations)) ** 2)
                )
                signal[name] += float(np.sum(x**2))
        for node, inputs in self.activation_inputs.items():
            figures = [self.sqnr.get(node, math.inf)]
            figures += [_db(signal[t], noise[t]) for t in inputs if t in noise]
            self.sqnr[node] = _combine_db(figures)

    def speed_check(self, original: Path) -> SpeedCheck:
        """Race the int8 model against the original fp32 model (onnxruntime defaults, which
        optimize it too), interleaved, on one evaluation sample."""
        from infercc.analysis.targets import host_cpu_info
        from infercc.runtime.bench import race

        stats = race(
            original,
            self.stage / INT8_FILE,
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

    def write(
        self, dest: Path, exclude: tuple[str, ...], method: str, trt_version: str
    ) -> list[str]:
        """Stage the final files; returns their paths under `dest` (the report is added)."""
        _, int8_files = self.quantize(exclude, self.stage / INT8_FILE)
        _write_json(self.stage / RANGES_FILE, {n: _range_dict(r) for n, r in self.ranges.items()})
        scales = {name: r.scale for name, r in self.ranges.items()}
        write_calibration_cache(self.stage / CACHE_FILE, scales, CACHE_METHOD[method], trt_version)
        names = [p.name for p in (*int8_files, *self.fp32_files)]
        names += [RANGES_FILE, CACHE_FILE, REPORT_FILE, MANIFEST]
        return [str(dest / name) for name in names]


def _db(signal: float, noise: float) -> float:
    if noise <= 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _combine_db(figures: Sequence[float]) -> float:
    """SQNR of a sum of independent noises, each given by its own SQNR (dB)."""
    if any(f == -math.inf for f in figures):
        return -math.inf
    total = sum(10.0 ** (-f / 10.0) for f in figures if f != math.inf)
    return math.inf if total == 0.0 else -10.0 * math.log10(total)


def fake_quantize(x: np.ndarray, scale: float, zero_point: int, activations: str) -> np.ndarray:
    """What Q then DQ makes of `x` (int8 symmetric or uint8 asymmetric)."""
    low, high = (-128, 127) if activations == "int8" else (0, 255)
    q = np.clip(np.rint(x / scale) + zero_point, low, high)
    return (q - zero_point) * scale


def _range_dict(r: TensorRange) -> dict[str, Any]:
    return {
        "min": json_float(r.min),
        "max": json_float(r.max),
        "scale": json_float(r.scale),
        "method": r.method,
    }


def _sensitivity_reason(before: Evaluation, after: Evaluation, targets: Targets) -> str:
    text = f"sensitivity: cosine {before.cosine:.6f} -> {after.cosine:.6f}"
    if targets.max_top1_drop is not None and before.top1_drop is not None:
        text += f", top-1 drop {before.top1_drop:.2f} -> {after.top1_drop:.2f} points"
    return text + " with it in float"


# --------------------------------------------------------------------------- graph helpers


def _is_target(node) -> bool:
    return node.is_standard and node.op_type in TARGET_INPUTS


def _name_targets(ir: Model) -> None:
    """Give every unnamed quantizable node a name (exclude and the report refer to names)."""
    for node in ir.graph:
        if _is_target(node) and not node.name:
            node.name = ir.graph.fresh_node_name(node.op_type)


def _check_exclude(ir: Model, exclude: Sequence[str]) -> None:
    names = [node.name for node in ir.graph if _is_target(node)]
    unknown = [name for name in exclude if name not in names]
    if unknown:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise InferccError(
            f"exclude names node(s) that are not quantizable nodes of the optimized model: "
            f"{', '.join(map(repr, unknown))}",
            f"give Conv/MatMul/Gemm node names; they are: {shown or '(none)'}",
        )


def _activation_inputs(ir: Model) -> dict[str, list[str]]:
    """Quantizable node name -> the names of its non-constant quantized inputs."""
    result = {}
    for node in ir.graph:
        if _is_target(node):
            values = [node.input(i) for i in TARGET_INPUTS[node.op_type]]
            result[node.name] = [v.name for v in values if v is not None and const_value(v) is None]
    return result


def node_weight_sqnr(ir: Model, qmax: int = INT8_MAX) -> dict[str, float]:
    """Node name -> the lowest weight SQNR (dB) of its constant quantized inputs (weights
    quantized to [-qmax, qmax]).

    -inf for a node without a constant float32 weight (two activations): it has no weight
    figure, so the sensitivity search always measures it.
    """
    result = {}
    for node in ir.graph:
        if not _is_target(node):
            continue
        figures = []
        for i in TARGET_INPUTS[node.op_type]:
            value = node.input(i)
            array = None if value is None else const_value(value)
            if array is not None and array.dtype == np.float32 and np.isfinite(array).all():
                figures.append(weight_sqnr(array, weight_axis(node, i, array.ndim), qmax))
        result[node.name] = min(figures, default=-math.inf)
    return result


# --------------------------------------------------------------------------- evaluation


def evaluate(
    reference: Outputs, actual: Outputs, not_scores: frozenset[str] = frozenset()
) -> Evaluation:
    """Cosine, max abs error and (classifier-like outputs) top-1 agreement per output.

    `not_scores` names outputs that are shaped like scores but are not (an embedding)."""
    inf = math.inf
    compared = compare_outputs(reference, actual, atol=inf, rtol=inf, min_cosine=0.0)
    classifiers = _classifier_outputs(reference, not_scores)
    outputs = {}
    for name, metrics in compared.outputs.items():
        agreement = _top1_agreement(reference, actual, name) if name in classifiers else None
        outputs[name] = OutputQuality(name, metrics.cosine, metrics.max_abs, agreement)
    return Evaluation(outputs)


# An output made by these is an embedding or a normalized feature, not class scores.
EMBEDDING_OPS = frozenset(
    {"Div", "LpNormalization", "ReduceMean", "ReduceSum", "ReduceL2", "LayerNormalization"}
)


def _embedding_outputs(ir: Model) -> frozenset[str]:
    """Graph outputs produced by a normalization or pooling op: no top-1 for them."""
    return frozenset(
        v.name
        for v in ir.graph.outputs
        if v.producer is not None and v.producer.op_type in EMBEDDING_OPS
    )


def _classifier_outputs(reference: Outputs, not_scores: frozenset[str] = frozenset()) -> set[str]:
    """Float outputs shaped [batch, classes >= 2] or 1-D with >= 2 scores, in every sample,
    but for the embeddings in `not_scores`."""
    names = (set(reference[0]) - not_scores) if reference else set()
    for sample in reference:
        names &= {name for name, a in sample.items() if _looks_like_scores(a)}
    return names


def _looks_like_scores(array: Any) -> bool:
    if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
        return False
    return (array.ndim == 2 and array.shape[1] >= 2) or (array.ndim == 1 and array.size >= 2)


def _top1_agreement(reference: Outputs, actual: Outputs, name: str) -> float | None:
    same = total = 0
    for ref, got in zip(reference, actual, strict=True):
        r, a = ref[name], got.get(name)
        if not isinstance(a, np.ndarray) or a.shape != r.shape:
            return 0.0
        r2, a2 = r.reshape(-1, r.shape[-1]), a.reshape(-1, r.shape[-1])
        same += int(np.count_nonzero(r2.argmax(axis=-1) == a2.argmax(axis=-1)))
        total += r2.shape[0]
    return same / total if total else None


# --------------------------------------------------------------------------- report


def _report(
    src: Path,
    dest: Path,
    method: str,
    percentile: float,
    job: _Job,
    final: _Trial,
    user_exclude: Sequence[str],
) -> CalibrationReport:
    kept = _kept_float(
        final.quantized, job.sensitivity, set(user_exclude), job.float_nodes, job.broken_kernels
    )
    passed, message = _verdict(job.targets, final, job.trials)
    return CalibrationReport(
        model=str(src),
        out_dir=str(dest),
        method=method,
        percentile=percentile if method == "percentile" else None,
        samples={},
        outputs=final.evaluation.outputs,
        quantized=list(final.quantized.quantized),
        kept_float=kept,
        targets=job.targets.to_dict(),
        passed=passed,
        message=message,
        ranges=len(job.ranges),
        trials=job.trials,
    )


def _kept_float(
    quantized: QuantizeReport,
    sensitivity: Mapping[str, KeptFloat],
    user: set[str],
    split_from: Mapping[str, str] | None = None,
    runtime: Mapping[str, str] | None = None,
) -> list[KeptFloat]:
    """User, quantizer and runtime reasons in graph order, then the sensitivity moves in round
    order."""
    kept = []
    split_from = split_from or {}
    runtime = runtime or {}
    for node, reason in quantized.kept_float.items():
        if node in split_from:
            reason = f"the outlier channels of {split_from[node]}, kept float by design"
            kept.append(KeptFloat(node, reason, "outliers"))
        elif node in runtime:
            kept.append(KeptFloat(node, runtime[node], "runtime"))
        elif node in user:
            kept.append(KeptFloat(node, "excluded by the user", "user"))
        elif node not in sensitivity:
            kept.append(KeptFloat(node, f"quantize_qdq: {reason}", "quantizer"))
    return kept + sorted(sensitivity.values(), key=lambda k: k.round or 0)


def _verdict(targets: Targets, final: _Trial, trials: int) -> tuple[bool, str]:
    described = targets.describe(final.evaluation)
    if not final.quantized.quantized:
        if targets.given:
            return False, (
                f"the target could not be met with any node in int8 ({described} with every "
                "node in float)"
            )
        return False, "no node was quantized (see kept_float)"
    if targets.given and not targets.met(final.evaluation) and targets.chosen:
        count = len(final.quantized.quantized)
        return True, (
            f"{count} node(s) in int8; the default target was not met after {trials} "
            f"sensitivity trial(s), the max_trials cap: {described} (raise max_trials, or give "
            "min_cosine)"
        )
    if targets.given and not targets.met(final.evaluation):
        return False, (
            f"the target was not met after {trials} sensitivity trial(s), the max_trials cap: "
            f"{described}"
        )
    count = len(final.quantized.quantized)
    return True, f"{count} node(s) in int8; {described}"


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
