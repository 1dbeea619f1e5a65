"""INT8 calibration end to end: samples -> fp32 optimization -> ranges -> QDQ model -> checks.

`calibrate(model, data, out_dir)` is the Python API under `infercc calibrate --int8` (without
`out_dir`: `<stem>.int8/` beside the model, as the command line writes by default; the
calibration's output is a directory of files, so there is no in-memory result as optimize's):

0. **Opset.** int8 Q/DQ needs opset 13 (per-axis DequantizeLinear): an older model (onnx's
   zoo CNNs are opset 9, PP-OCR 11 and 12) is converted with onnx.version_converter first,
   the report says so (`opset_conversion`, in the manifest too) and every evaluation below
   then runs against the original model, so the conversion is checked with the quantization.
   A conversion that fails is an error naming the opset (nothing is written).

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
   inputs are measured on the calibration samples (`infercc.calib.outliers`); the int8
   pipeline's first stage, split-outlier-channels, can split a projection whose input has a
   few outlier channels exactly, those channels kept float. With an accuracy target (6) the
   split waits: it is made only when the all-int8 candidate misses the target without it,
   and then on as few projections as the target needs, the most severe first (all of them
   split and calibrated once; 1, 2, 4, ... tried with those ranges, then the counts between
   the first that met and the last that missed bisected); the search starts from the split
   model. Without a target every projection with outliers is split at once.
   The result, `model_fp32.onnx`, is the reference for the ranges and for the evaluation,
   and it is written to `out_dir` too: `ranges.json` and `calibration.cache` name tensors of
   *this* graph (a fused Conv takes its BatchNormalization's output name, folded constants
   disappear), which is the graph a TensorRT < 11 implicit-INT8 build must be given with
   the cache.
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
   worst case is 8 x (number of quantized nodes) trials. The report's `verdict` is "passed"
   only when a target was checked and met; a run without a target (a CNN's default) says "no
   accuracy target" with the cosine measured, and it, like a default target missed at the
   cap, fails below `min_cosine_floor` (default 0.9, `infercc.calib.choices`; 0: no floor).
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

import time
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path

from infercc.backends.trt.calib_cache import DEFAULT_TRT_VERSION
from infercc.build import Job, run_steps
from infercc.calib.choices import DEFAULT_MIN_COSINE_FLOOR
from infercc.calib.forms import plan_int8
from infercc.calib.job import (
    CACHE_FILE,
    FP32_FILE,
    INT8_FILE,
    RANGES_FILE,
    SPEED_ITERS,
    Int8Flow,
    Int8Request,
    read_samples,
    split_samples,
)
from infercc.calib.observers import DEFAULT_PERCENTILE, Calibrator, Method, ProgressFn
from infercc.calib.report import (
    REPORT_FILE,
    CalibrationReport,
    Evaluation,
    KeptFloat,
    OutputQuality,
    SpeedCheck,
    Targets,
    calibration_manifest,
    check_calibration_destination,
    default_calibration_dir,
    evaluate,
)
from infercc.calib.search import (
    DEFAULT_MAX_TRIALS,
    SENSITIVITY_CANDIDATES,
    fake_quantize,
    node_weight_sqnr,
)
from infercc.config import BuildConfig
from infercc.errors import InferccError
from infercc.passes.manager import check_pass_names
from infercc.passes.pipelines import CALIBRATE_FP32, INT8, check_disabled
from infercc.passes.quantize_qdq import ACTIVATION_TYPES

__all__ = [
    "CACHE_FILE",
    "DEFAULT_MAX_TRIALS",
    "FP32_FILE",
    "INT8_FILE",
    "RANGES_FILE",
    "REPORT_FILE",
    "SENSITIVITY_CANDIDATES",
    "SPEED_ITERS",
    "CalibrationReport",
    "Evaluation",
    "KeptFloat",
    "OutputQuality",
    "SpeedCheck",
    "Targets",
    "calibrate",
    "calibration_manifest",
    "check_calibrate_passes",
    "check_calibration_destination",
    "evaluate",
    "fake_quantize",
    "node_weight_sqnr",
    "read_samples",
    "resolve_activations",
    "split_samples",
]


def calibrate(
    model: str | PathLike[str],
    data: str | PathLike[str],
    out_dir: str | PathLike[str] | None = None,
    *,
    method: Method | None = None,
    percentile: float | None = None,
    num_samples: int | None = None,
    holdout: float = 0.2,
    min_cosine: float | None = None,
    max_top1_drop: float | None = None,
    min_cosine_floor: float | None = None,
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
    """Calibrate `model` on the samples in `data` and write an INT8 model to `out_dir`
    (None: `<stem>.int8/` beside `model`; the report's `out_dir` names it).

    See the module docstring for the method. `method`, `percentile` and `min_cosine` left at
    None are chosen from the model (`infercc.calib.choices`: percentile 99.999 and the target
    min cosine 0.99 for a transformer, unless `max_top1_drop` is given; minmax and no target
    otherwise); `min_cosine=0` means no cosine target. Without a target (or with the default
    target missed at the `max_trials` cap) the run fails when the worst cosine is below
    `min_cosine_floor` (None: 0.9; 0: no floor); with a target given, the target decides and
    `min_cosine_floor` is refused (it would have no effect). `target`, `activations` and
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
    _check_floor(min_cosine_floor, min_cosine, max_top1_drop)
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
    if max_trials < 0:
        raise InferccError(f"max_trials must be >= 0, got {max_trials}", "e.g. 64")
    src = Path(model)
    dest = default_calibration_dir(src, "int8") if out_dir is None else Path(out_dir)
    check_calibration_destination(dest, src)
    request = Int8Request(
        data,
        plan,
        method=method,
        percentile=percentile,
        min_cosine=min_cosine,
        max_top1_drop=max_top1_drop,
        min_cosine_floor=min_cosine_floor,
        num_samples=num_samples,
        holdout=holdout,
        preprocess=preprocess,
        exclude=tuple(exclude),
        target=target,
        trt_version=trt_version,
        outlier_channels=outlier_channels,
        speed_check=speed_check,
        activation_matmuls=activation_matmuls,
        max_trials=max_trials,
    )
    # the build's passes: the fp32 reference's (portable) and the int8 pipeline's
    config = BuildConfig(target=target, precision="int8", verify=verify, disable_passes=disabled)
    flow = Int8Flow(src, dest, request, on_progress, t0)
    run_steps(Job(flow, config, on_step or (lambda _text: None)))
    report = flow.report
    assert report is not None  # the search reported, or an error was raised before it
    report.seconds = time.perf_counter() - t0
    return report


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


def _check_floor(
    floor: float | None, min_cosine: float | None, max_top1_drop: float | None
) -> None:
    """The floor is in [0, 1], and it has an effect: no target is given (a given target
    decides the verdict alone)."""
    if floor is None:
        return
    if not 0.0 <= floor <= 1.0:
        raise InferccError(
            f"min_cosine_floor must be in [0, 1] (0: no floor), got {floor}",
            f"e.g. {DEFAULT_MIN_COSINE_FLOOR}",
        )
    if min_cosine or max_top1_drop is not None:
        given = "min_cosine" if min_cosine else "max_top1_drop"
        raise InferccError(
            f"min_cosine_floor has no effect with {given}: the target given decides the verdict",
            "drop min_cosine_floor (it holds runs without a target), or drop the target",
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
