"""Precisions: the ones a build can ask for, the ones a target has, and how far each may stray
from the fp32 original.

Two lists, because they answer different questions:

- `TARGET_PRECISIONS` are what hardware has peak figures for (the target database's keys, in
  this order): fp32, tf32 (fp32 matrix products on tensor cores, 10-bit mantissa), fp16, bf16,
  fp8 and int8.
- `BUILD_PRECISIONS` are what `optimize` (`BuildConfig.precision`) can be asked for: fp32;
  fp16 (a graph rewrite every backend runs); bf16 (a TensorRT 10 builder choice: no graph
  rewrite makes it); int8 (the graph's Q/DQ pairs from `infercc calibrate`, or on TensorRT 10 a
  calibration cache). tf32 and fp8 are not requests: TensorRT uses tf32 by itself for fp32
  engines on GPUs that have it, and nothing in infercc writes fp8 graphs.

`TOLERANCES` is the one table every comparison uses (the API's validation after `optimize`,
`infercc validate`, the ort backend's tuner and the TensorRT backend's engine check):

- fp32: atol 1e-4, rtol 1e-3 and cosine >= 0.9999 per output: infercc's rewrites are exact up
  to float rounding of reassociated sums.
- tf32: atol 1e-3, rtol 1e-2, cosine >= 0.9999: an fp32 TensorRT engine on a GPU with tf32
  runs its convolutions and matrix products on TF32 tensor cores by default
  (`BuilderFlag.TF32`, 10-bit mantissa: relative errors near 1e-3 on Ampere and later).
- fp16 and bf16: cosine >= 0.999 only; int8 and int4 (weight-only): cosine >= 0.99 only.
  Elementwise bounds would flag the expected rounding of large outputs (logits) and of values
  near zero after a large cancellation, so reduced precisions are judged by direction, per
  output.

`INT8_COSINE_FLOOR` (0.9) is not a tolerance but a floor: an int8 calibration that checked no
accuracy target (a CNN's default) fails below it (`infercc calibrate --min-cosine-floor`).

A user's atol, rtol or min_cosine replaces the table's figure (`tolerance()`). Help texts
state the defaults from the table (`defaults_text`), never as figures of their own.

An fp32 element outside the table's bounds still passes within `RUNTIME_ROUNDING_MULTIPLE`
times what onnxruntime's own optimizer moves that output by (`infercc.check.compare`), where
that move is rounding: at most `RUNTIME_ROUNDING_SHARE` of the output's largest magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TARGET_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
BUILD_PRECISIONS = ("fp32", "fp16", "bf16", "int8")

_UNBOUNDED = math.inf


@dataclass(frozen=True)
class Tolerance:
    """How close an output must stay to the reference: elementwise |c - r| <= atol + rtol * |r|
    and cosine >= min_cosine."""

    atol: float
    rtol: float
    min_cosine: float

    def to_dict(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine}

    def as_tuple(self) -> tuple[float, float, float]:
        return self.atol, self.rtol, self.min_cosine


TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(1e-4, 1e-3, 0.9999),
    "tf32": Tolerance(1e-3, 1e-2, 0.9999),
    "fp16": Tolerance(_UNBOUNDED, _UNBOUNDED, 0.999),
    "bf16": Tolerance(_UNBOUNDED, _UNBOUNDED, 0.999),
    "int8": Tolerance(_UNBOUNDED, _UNBOUNDED, 0.99),
    # weight-only int4 (calibrate --int4): an error of int8's order, judged alike
    "int4": Tolerance(_UNBOUNDED, _UNBOUNDED, 0.99),
}
FP32 = TOLERANCES["fp32"]

# A near-constant output (`infercc.check.compare`) of a reduced-precision build is judged at the
# resolution of the type it computes in, not by its cosine (the cosine of values near zero is
# rounding): |c - r| <= max(floor, RESOLUTION_ULPS * rel * max|r|). fp16's floor is its smallest
# normal, 2**-14 (kernels flush subnormals: a sigmoid map near 1e-6 becomes 0); bf16 has
# fp32's exponent range, so only its 8-bit mantissa counts.
RESOLUTION_ULPS = 16
RESOLUTIONS: dict[str, tuple[float, float]] = {
    "fp16": (2.0**-14, 2.0**-10),
    "bf16": (2.0**-126, 2.0**-7),
}


def resolution(precision: str | None, magnitude: float) -> float | None:
    """The largest error a near-constant output of `magnitude` may show at `precision`
    (None: judged as any output)."""
    if precision not in RESOLUTIONS:
        return None
    floor, rel = RESOLUTIONS[precision]
    return max(floor, RESOLUTION_ULPS * rel * magnitude)


# The worst-output cosine below which an int8 calibration without an accuracy target fails:
# such a model is not usable (a zoo CNN once "passed" at 0.414).
INT8_COSINE_FLOOR = 0.9

# An fp32 candidate may differ from the reference by this multiple of onnxruntime's own
# rounding (the largest move its default optimizations make to the output). Measured on the
# light zoo models with weights re-drawn and logits near 3,000 (tests/check/test_runtime_floor
# .py): infercc's builds moved the logits by 0.82-1.33x that on ShuffleNet (10 seeds), 0.90-1.20x
# on ResNet-50 (3 seeds), 0.94-1.03x on Inception-v2 (2 seeds).
RUNTIME_ROUNDING_MULTIPLE = 2.0
# onnxruntime's own move counts as rounding only up to this share of the output's largest
# magnitude (fp32 deep nets: ~1e-5); beyond it the optimizer changed what is computed.
RUNTIME_ROUNDING_SHARE = 1e-3
# An fp32 candidate whose error on an output is more than MOVEMENT_K times what onnxruntime's
# own optimizer moves that output by (at least MOVEMENT_FLOOR_ULPS ulps of fp32 at the
# output's largest magnitude) fails, whatever the fixed tolerance says: a real bug hides
# inside atol + rtol, never inside the runtime's own rounding. Chosen between the largest
# ratio of infercc's correct builds and the smallest of real bugs (bench/mutants.py;
# docs/validate.md gives the figures).
MOVEMENT_K = 20.0
MOVEMENT_FLOOR_ULPS = 16


def tolerance(
    precision: str,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
) -> Tolerance:
    """The table's tolerance for `precision` (fp32's for an unknown one), with the figures the
    user gave in its place."""
    base = TOLERANCES.get(precision, FP32)
    return Tolerance(
        base.atol if atol is None else float(atol),
        base.rtol if rtol is None else float(rtol),
        base.min_cosine if min_cosine is None else float(min_cosine),
    )


def figure(value: float) -> str:
    """A tolerance figure as help texts write it: 1e-4, 0.999, none (unbounded)."""
    if math.isinf(value):
        return "none"
    if 0 < value < 0.01:
        mantissa, exponent = f"{value:e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    return f"{value:g}"


def defaults_text(name: str) -> str:
    """The table's `name` (atol, rtol or min_cosine) for each precision a build can ask for,
    equal figures together: `1e-4 for fp32; none for fp16/bf16/int8`."""
    groups: dict[float, list[str]] = {}
    for precision in BUILD_PRECISIONS:
        groups.setdefault(getattr(TOLERANCES[precision], name), []).append(precision)
    return "; ".join(f"{figure(v)} for {'/'.join(names)}" for v, names in groups.items())
