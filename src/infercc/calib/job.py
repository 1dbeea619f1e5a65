"""One int8 calibration's job: the staged files and the state its steps share.

`Int8Job` runs the fp32 reference pipeline (naming the quantizable nodes, splitting outlier
channels), calibrates the ranges, checks onnxruntime's fused int8 kernels, hands the
sensitivity search (`infercc.calib.search`) its `trial` (quantize with some nodes float,
evaluate against fp32), races the result against fp32 and stages the files
(`infercc.calib.calibrate` describes each step).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infercc.backends.trt.calib_cache import write_calibration_cache
from infercc.calib import outliers
from infercc.calib.forms import Int8Plan, kernel_cause
from infercc.calib.kernels import broken_kernels
from infercc.calib.observers import Method, ProgressFn, TensorRange, collect_ranges, tensor_values
from infercc.calib.report import (
    REPORT_FILE,
    CalibrationReport,
    Outputs,
    SpeedCheck,
    Targets,
    Trial,
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
from infercc.errors import InferccError
from infercc.ir import Model, load_model, save_model
from infercc.ir.output_types import reconcile_output_types, strictly_typed
from infercc.passes.manager import PassContext, QuantizeSettings, run_passes
from infercc.passes.pipelines import CALIBRATE_FP32, INT8
from infercc.passes.quantize_qdq import (
    QuantizeReport,
    activation_params,
    calibration_tensors,
    weight_max,
)
from infercc.passes.split_outliers import candidates as outlier_candidates
from infercc.runtime.artifact import MANIFEST
from infercc.util import json_float

logger = logging.getLogger(__name__)

INT8_FILE = "model_int8.onnx"
FP32_FILE = "model_fp32.onnx"
RANGES_FILE = "ranges.json"
CACHE_FILE = "calibration.cache"
_TRIAL_FILE = ".trial.onnx"
_KERNEL_FILE = ".kernel_check.onnx"
_PROBE_FILE = ".outlier_probe.onnx"

SPEED_WARMUP, SPEED_ITERS = 10, 60
CACHE_METHOD = {"minmax": "minmax", "entropy": "entropy", "percentile": "entropy"}

Samples = list[dict[str, np.ndarray]]


@dataclass
class QuantOptions:
    activations: str = "int8"
    activation_matmuls: bool = False
    max_trials: int = DEFAULT_MAX_TRIALS
    disabled: tuple[str, ...] = ()
    verify: bool = False
    weight_bits: int = 8


class Int8Job:
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
        self.search: Search | None = None
        self.options = QuantOptions()
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
        name_targets(ir)
        check_exclude(ir, exclude)
        if samples:
            self.split_outliers(ir, samples)
        self.tensors = calibration_tensors(ir)
        if not self.tensors:
            raise InferccError(
                "the model has nothing to quantize (no Conv, MatMul or Gemm with float inputs)",
                "INT8 calibration quantizes Conv, MatMul and Gemm nodes",
            )
        self.sqnr = node_weight_sqnr(ir, weight_max(self.options.weight_bits))
        self.activation_inputs = activation_inputs(ir)
        self.not_scores = embedding_outputs(ir)
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
        scores = classifier_outputs(self.reference, self.not_scores)
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

    def trial(self, exclude: tuple[str, ...]) -> Trial:
        report, files = self.quantize(exclude, self.stage / _TRIAL_FILE)
        try:
            actual = run_model(files[0], self.samples, optimize=self.fused)
        finally:
            for f in files:
                f.unlink(missing_ok=True)
        return Trial(exclude, report, evaluate(self.reference, actual, self.not_scores))

    def run_search(self, exclude: tuple[str, ...]) -> Trial:
        """Check the kernels (when the host is the target), then search (module doc 6)."""
        if self.fused:  # the target's kernels are this host's: check them
            self.step("checking onnxruntime's int8 kernels")
            self.broken_kernels = self.check_kernels(exclude)
            exclude = (*exclude, *self.broken_kernels)
        self.search = Search(
            self.targets,
            self.trial,
            self.options.max_trials,
            dict(self.sqnr),
            self.activation_inputs,
            self.activation_sqnr,
            self.step,
        )
        return self.search.run(exclude)

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

    def activation_sqnr(self, names: Sequence[str]) -> dict[str, float]:
        """Tensor -> the SQNR (dB) of fake-quantizing it with its calibrated (scale, zero
        point), measured on the first `SQNR_SAMPLES` calibration samples (the tensors of
        `names` that have a range)."""
        names = [n for n in names if n in self.ranges]
        if not names:
            return {}
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
        return {name: db(signal[name], noise[name]) for name in names}

    def report(
        self, src: Path, dest: Path, settings: tuple[str, float], final: Trial, user: Sequence[str]
    ) -> CalibrationReport:
        """The report of the search's `final` candidate (`user`: the nodes the user excluded)."""
        assert self.search is not None
        search = self.search
        kept = kept_float(
            final.quantized, search.sensitivity, set(user), self.float_nodes, self.broken_kernels
        )
        return calibration_report(
            src, dest, settings, self.targets, final, kept, search.trials, len(self.ranges)
        )

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
        write_json(self.stage / RANGES_FILE, {n: _range_dict(r) for n, r in self.ranges.items()})
        scales = {name: r.scale for name, r in self.ranges.items()}
        write_calibration_cache(self.stage / CACHE_FILE, scales, CACHE_METHOD[method], trt_version)
        names = [p.name for p in (*int8_files, *self.fp32_files)]
        names += [RANGES_FILE, CACHE_FILE, REPORT_FILE, MANIFEST]
        return [str(dest / name) for name in names]


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
