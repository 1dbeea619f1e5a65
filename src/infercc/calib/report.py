"""What an int8 calibration measured and decided, as data.

`evaluate` scores a candidate against fp32 per output (cosine, max abs error, and top-1
agreement for classifier-like outputs: module doc 5 of `infercc.calib.calibrate`); `Targets`
is the accuracy target a candidate must meet (module doc 6), with the cosine floor a run
without a target is held to; `KeptFloat` names a quantizable node left in float and why;
`verdict` says whether the final candidate passes, and what was checked (`VERDICTS`);
`CalibrationReport.to_dict()` is what calibration_report.json holds, and
`calibration_manifest` the manifest.json beside it (int8 and int4 outputs alike), whose
directory `check_calibration_destination` checks before anything is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from infercc.calib.choices import Settings
from infercc.calib.forms import Int8Plan
from infercc.check.compare import compare_outputs
from infercc.errors import InferccError
from infercc.ir import Model
from infercc.outputs import check_output_dir
from infercc.passes.quantize_qdq import QuantizeReport
from infercc.runtime.artifact import MANIFEST
from infercc.runtime.artifact import manifest as artifact_manifest
from infercc.util import json_float

REPORT_FILE = "calibration_report.json"

# What a calibration's verdict says (`CalibrationReport.verdict`): "passed" only when an
# accuracy target was checked and met.
PASSED = "passed"  # a target was checked and met
NO_TARGET = "no accuracy target"  # no target: the cosine was measured, held to the floor only
TARGET_MISSED = "default target missed"  # the chosen target, missed at the max_trials cap
FAILED = "failed"  # a target the user gave missed, the floor missed, or nothing quantized
VERDICTS = (PASSED, NO_TARGET, TARGET_MISSED, FAILED)

Outputs = list[dict[str, np.ndarray]]


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
    outlier_channels: dict[str, list[int]] = field(default_factory=dict)  # the split ones
    # where outlier channels were found: {"split", "why", "found"[, "unsplit": the all-int8
    # candidate's cosine and top1_drop without the split, "projections": how many were split,
    # "tried": each smaller set tried ({"projections", "cosine", "top1_drop"})]}
    outlier_split: dict[str, Any] | None = None
    settings: Settings | None = None  # the method, percentile and target: given or chosen
    int8: Int8Plan | None = None  # the form the target got, and what was not measured here
    verdict: str = PASSED  # one of VERDICTS: what `passed` rests on
    min_cosine_floor: float | None = None  # the floor a run without a met target is held to
    opset_conversion: dict[str, Any] | None = None  # {"from", "to", "reference"} when converted
    # Every rewrite refused by the passes that built the model (calibrate-fp32, the outlier
    # split, the final candidate's quantize-qdq), as optimize's report lists them (--explain).
    refusals: list[dict[str, str]] = field(default_factory=list)

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
            "verdict": self.verdict,
            "target_checked": any(v is not None for v in self.targets.values()),
            "min_cosine_floor": json_float(self.min_cosine_floor),
            "message": self.message,
            "opset_conversion": self.opset_conversion,
            "refusals": list(self.refusals),
            "files": list(self.files),
            "ranges": self.ranges,
            "sensitivity_trials": self.trials,
            "activations": self.activations,
            "int8": None if self.int8 is None else self.int8.to_dict(),
            "outlier_channels": {k: list(v) for k, v in self.outlier_channels.items()},
            "outlier_split": self.outlier_split,
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


@dataclass(frozen=True)
class Targets:
    """The accuracy target: worst-output cosine and/or worst top-1 drop in points."""

    min_cosine: float | None = None
    max_top1_drop: float | None = None
    chosen: bool = False  # the default target, not the user's: missing it is not a failure
    floor: float | None = None  # min cosine of a run whose target is not met or not set

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


@dataclass
class Trial:
    """One candidate: the nodes kept float by name, what the quantizer did, how it scored."""

    exclude: tuple[str, ...]
    quantized: QuantizeReport
    evaluation: Evaluation
    refusals: list[dict[str, str]] = field(default_factory=list)  # its int8 stage's


# --------------------------------------------------------------------------- evaluation


def evaluate(
    reference: Outputs, actual: Outputs, not_scores: frozenset[str] = frozenset()
) -> Evaluation:
    """Cosine, max abs error and (classifier-like outputs) top-1 agreement per output.

    `not_scores` names outputs that are shaped like scores but are not (an embedding)."""
    inf = math.inf
    compared = compare_outputs(reference, actual, atol=inf, rtol=inf, min_cosine=0.0)
    classifiers = classifier_outputs(reference, not_scores)
    outputs = {}
    for name, metrics in compared.outputs.items():
        agreement = _top1_agreement(reference, actual, name) if name in classifiers else None
        outputs[name] = OutputQuality(name, metrics.cosine, metrics.max_abs, agreement)
    return Evaluation(outputs)


# An output made by these is an embedding or a normalized feature, not class scores.
EMBEDDING_OPS = frozenset(
    {"Div", "LpNormalization", "ReduceMean", "ReduceSum", "ReduceL2", "LayerNormalization"}
)


def embedding_outputs(ir: Model) -> frozenset[str]:
    """Graph outputs produced by a normalization or pooling op: no top-1 for them."""
    return frozenset(
        v.name
        for v in ir.graph.outputs
        if v.producer is not None and v.producer.op_type in EMBEDDING_OPS
    )


def classifier_outputs(reference: Outputs, not_scores: frozenset[str] = frozenset()) -> set[str]:
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


def argmax_last(scores: np.ndarray) -> np.ndarray:
    """The last axis' argmax; float16 read as float32 first (exact, and numpy's float16
    argmax is ~20x slower: 4 s of a 2 GB decoder's int4 calibration)."""
    if scores.dtype == np.float16:
        scores = scores.astype(np.float32)
    return scores.argmax(axis=-1)


def _top1_agreement(reference: Outputs, actual: Outputs, name: str) -> float | None:
    same = total = 0
    for ref, got in zip(reference, actual, strict=True):
        r, a = ref[name], got.get(name)
        if not isinstance(a, np.ndarray) or a.shape != r.shape:
            return 0.0
        r2, a2 = r.reshape(-1, r.shape[-1]), a.reshape(-1, r.shape[-1])
        same += int(np.count_nonzero(argmax_last(r2) == argmax_last(a2)))
        total += r2.shape[0]
    return same / total if total else None


# --------------------------------------------------------------------------- verdict


def sensitivity_reason(before: Evaluation, after: Evaluation, targets: Targets) -> str:
    text = f"sensitivity: cosine {before.cosine:.6f} -> {after.cosine:.6f}"
    if targets.max_top1_drop is not None and before.top1_drop is not None:
        text += f", top-1 drop {before.top1_drop:.2f} -> {after.top1_drop:.2f} points"
    return text + " with it in float"


def calibration_report(
    src: Path,
    dest: Path,
    settings: tuple[str, float],
    targets: Targets,
    final: Trial,
    kept: list[KeptFloat],
    trials: int,
    ranges: int,
) -> CalibrationReport:
    """The report of a search's `final` candidate (`settings`: the method and percentile)."""
    method, percentile = settings
    passed, message, said = verdict(targets, final, trials)
    return CalibrationReport(
        model=str(src),
        out_dir=str(dest),
        method=method,
        percentile=percentile if method == "percentile" else None,
        samples={},
        outputs=final.evaluation.outputs,
        quantized=list(final.quantized.quantized),
        kept_float=kept,
        targets=targets.to_dict(),
        passed=passed,
        message=message,
        ranges=ranges,
        trials=trials,
        verdict=said,
        min_cosine_floor=None if targets.given and not targets.chosen else targets.floor,
    )


def kept_float(
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


def verdict(targets: Targets, final: Trial, trials: int) -> tuple[bool, str, str]:
    """(passed, message, one of `VERDICTS`) of the search's `final` candidate.

    "passed" only when a target was checked and met. Without a target (a CNN's default), or
    with the default target missed at the max_trials cap, the run passes when the cosine is at
    least `targets.floor` (None or 0: no floor) and fails below it."""
    described = targets.describe(final.evaluation)
    count = len(final.quantized.quantized)
    if not count:
        if not targets.given:
            return False, "no node was quantized (see kept_float)", FAILED
        why = f"the target could not be met with any node in int8 ({described} with every node"
        return False, why + " in float)", FAILED
    if targets.given and targets.met(final.evaluation):
        return True, f"{count} node(s) in int8; {described}", PASSED
    capped = f"after {trials} sensitivity trial(s), the max_trials cap: {described}"
    if targets.given and not targets.chosen:
        return False, f"the target was not met {capped}", FAILED
    cosine = final.evaluation.cosine
    if targets.given:  # the default target, missed at the cap
        what, said = f"the default target was not met {capped}", TARGET_MISSED
        fix = "raise max_trials, or give min_cosine"
    else:
        what, said = f"no accuracy target: cosine {cosine:.6f}", NO_TARGET
        fix = "give min_cosine or max_top1_drop to have sensitive layers moved to float"
    floor = targets.floor or None
    if floor is not None and not cosine >= floor:
        why = f"below {floor}: this model is not usable; {fix}, or lower min_cosine_floor"
        return False, f"{count} node(s) in int8; {what} ({why} to accept it)", FAILED
    above = f", at or above the floor {floor}" if floor is not None else ", no floor"
    return True, f"{count} node(s) in int8; {what}{above} ({fix})", said


def default_calibration_dir(model: str | PathLike[str], precision: str) -> Path:
    """Where a calibration writes when no output is given: `<stem>.int8/` (or `.int4/`) beside
    the input model, as optimize writes `<stem>.opt.onnx` beside it."""
    path = Path(model)
    return path.with_name(f"{path.stem}.{precision}")


# --------------------------------------------------------------------------- the output directory


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


def calibration_manifest(
    src: Path,
    target: str,
    written: Sequence[str],
    model_file: str,
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
