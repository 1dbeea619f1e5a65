"""The sensitivity search: which quantizable nodes move back to float so that the int8 model
meets its accuracy target (module doc 6 of `infercc.calib.calibrate`).

`Search.run` quantizes with every quantizable node in int8 and evaluates it; while the target
is not met, each round ranks the nodes still in int8 by SQNR (`node_weight_sqnr`, with the
activations' quantization noise folded in by `rank_nodes`: lowest first), tries the
`SENSITIVITY_CANDIDATES` worst each in float, and moves the one whose float version scores best
to float for good. The search sees the model only through `trial` (quantize with these nodes
kept float, evaluate against fp32) and `activation_sqnr` (measure activations' quantization
noise), which the calibration job supplies.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from infercc.calib.report import KeptFloat, Targets, Trial, sensitivity_reason
from infercc.ir import Model
from infercc.passes.match import const_value
from infercc.passes.quantize_qdq import INT8_MAX, TARGET_INPUTS, weight_axis, weight_sqnr

logger = logging.getLogger(__name__)

SENSITIVITY_CANDIDATES = 8
DEFAULT_MAX_TRIALS = 64
SQNR_SAMPLES = 4  # calibration samples used to measure each activation's quantization noise


@dataclass
class Search:
    """One sensitivity search over a calibrated fp32 model.

    `trial(exclude)`: the candidate with those nodes kept float, evaluated. `sqnr`: node ->
    its lowest weight SQNR (dB), into which `rank_nodes` folds its activations' noise.
    `activation_inputs`: node -> its non-constant quantized inputs. `activation_sqnr(names)`:
    tensor -> the SQNR (dB) of fake-quantizing it with its calibrated parameters."""

    targets: Targets
    trial: Callable[[tuple[str, ...]], Trial]
    max_trials: int
    sqnr: dict[str, float]
    activation_inputs: Mapping[str, Sequence[str]]
    activation_sqnr: Callable[[Sequence[str]], dict[str, float]]
    step: Callable[[str], None] = lambda _text: None
    sensitivity: dict[str, KeptFloat] = field(default_factory=dict)
    trials: int = 0  # sensitivity trials (the first, all-int8 candidate is not one)

    def first(self, exclude: tuple[str, ...]) -> Trial:
        """The all-int8 candidate (less `exclude`): quantized and evaluated."""
        self.step("quantizing")
        current = self.trial(exclude)
        logger.info("int8: %s", self.targets.describe(current.evaluation))
        return current

    def run(self, exclude: tuple[str, ...], first: Trial | None = None) -> Trial:
        """Quantize, evaluate, and move nodes to float until the target holds (from `first`,
        the all-int8 candidate, when it was already evaluated)."""
        current = self.first(exclude) if first is None else first
        round_ = 0
        if self.targets.given and not self.targets.met(current.evaluation):
            self.rank_nodes()
        while self.targets.given and not self.targets.met(current.evaluation):
            if not current.quantized.quantized:
                break
            if self.trials >= self.max_trials:
                break
            round_ += 1
            self.step(f"sensitivity round {round_}: {self.targets.describe(current.evaluation)}")
            current = self._move_one_to_float(current, round_)
        return current

    def _try(self, exclude: tuple[str, ...]) -> Trial:
        self.trials += 1
        return self.trial(exclude)

    def _move_one_to_float(self, current: Trial, round_: int) -> Trial:
        candidates = sorted(current.quantized.quantized, key=lambda n: self.sqnr.get(n, -math.inf))
        budget = min(SENSITIVITY_CANDIDATES, self.max_trials - self.trials)
        trials = [self._try((*current.exclude, n)) for n in candidates[:budget]]
        best = min(trials, key=lambda t: self.targets.badness(t.evaluation))
        node = best.exclude[-1]
        before, after = current.evaluation, best.evaluation
        self.sensitivity[node] = KeptFloat(
            node,
            sensitivity_reason(before, after, self.targets),
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
        measured = self.activation_sqnr(names)
        if not measured:
            return
        for node, inputs in self.activation_inputs.items():
            figures = [self.sqnr.get(node, math.inf)]
            figures += [measured[t] for t in inputs if t in measured]
            self.sqnr[node] = combine_db(figures)


def db(signal: float, noise: float) -> float:
    """The SQNR (dB) of a signal and noise given as powers."""
    if noise <= 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def combine_db(figures: Sequence[float]) -> float:
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


# --------------------------------------------------------------------------- graph figures


def is_target(node) -> bool:
    """A quantizable node: a standard Conv, MatMul or Gemm."""
    return node.is_standard and node.op_type in TARGET_INPUTS


def activation_inputs(ir: Model) -> dict[str, list[str]]:
    """Quantizable node name -> the names of its non-constant quantized inputs."""
    result = {}
    for node in ir.graph:
        if is_target(node):
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
        if not is_target(node):
            continue
        figures = []
        for i in TARGET_INPUTS[node.op_type]:
            value = node.input(i)
            array = None if value is None else const_value(value)
            if array is not None and array.dtype == np.float32 and np.isfinite(array).all():
                figures.append(weight_sqnr(array, weight_axis(node, i, array.ndim), qmax))
        result[node.name] = min(figures, default=-math.inf)
    return result
