"""The precision a candidate was built with, its default tolerances (the table of
`infercc.precisions`), the criterion an artifact's manifest records, and `--tol
OUTPUT=ATOL:RTOL` specs.

**One verdict per artifact.** `calibrate --int4` accepts the int4 model it writes at the
quality it measured on its evaluation samples (it has no accuracy target), and `calibrate
--int8` at its target or, without one (a CNN), at what it measured; so each writes that
criterion into the manifest (`calibrated_criterion`): the worst-output cosine it measured, less
`CALIBRATED_COSINE_MARGIN` for other inputs, never above the int4 table's 0.99. `infercc
validate` of the directory applies it in place of the table (`artifact_criterion`), and says
so; a `--min-cosine` given wins.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from infercc.errors import InferccError
from infercc.ir.ops import QUANTIZATION_OPS
from infercc.precisions import TOLERANCES, tolerance
from infercc.runtime.artifact import open_source, read_skeleton

# --------------------------------------------------------------------------- precision


def detect_precision(
    candidate: str | os.PathLike[str], skeleton: onnx.ModelProto | None = None
) -> str:
    """The artifact manifest's precision (one `TOLERANCES` knows: int4 for calibrate --int4's
    output), or fp32, fp16, int8 or int4 read from the model (its `skeleton` when the caller
    has read it already)."""
    path = Path(candidate)
    if path.is_dir():
        precision = str(open_source(path).manifest.get("precision") or "fp32")
        return precision if precision in TOLERANCES else "fp32"
    return model_precision(skeleton if skeleton is not None else read_skeleton(path))


def model_precision(model: onnx.ModelProto) -> str:
    """int4 with onnxruntime's int4 weight ops (MatMulNBits, GatherBlockQuantized), int8 with
    quantize ops, fp16 with float16 weights or Casts to float16, else fp32."""
    nodes = list(model.graph.node)
    if any(n.op_type in ("MatMulNBits", "GatherBlockQuantized") for n in nodes):
        return "int4"
    if any(n.op_type in QUANTIZATION_OPS for n in nodes):
        return "int8"
    fp16 = onnx.TensorProto.FLOAT16
    if any(t.data_type == fp16 for t in model.graph.initializer):
        return "fp16"
    casts = (n for n in nodes if n.op_type == "Cast")
    if any(a.name == "to" and a.i == fp16 for n in casts for a in n.attribute):
        return "fp16"
    return "fp32"


def default_tolerance(
    precision: str,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
) -> dict[str, float]:
    """atol, rtol and min_cosine for `precision` (`infercc.precisions.TOLERANCES`), where the
    user gave none."""
    return tolerance(precision, atol, rtol, min_cosine).to_dict()


# --------------------------------------------------------------------------- a manifest's criterion

# validate accepts a calibrated artifact down to this much below the cosine calibrate measured
# (other inputs: 1 generated sample against calibrate's 8 evaluation samples moved an int4 MLP's
# cosine from 0.9821 to 0.9875)
CALIBRATED_COSINE_MARGIN = 0.005


def calibrated_criterion(
    cosine: float, by: str, evaluated_on: str, precision: str = "int4"
) -> dict[str, Any]:
    """The manifest's `criterion` for a model `by` (a command) accepted at worst-output
    `cosine` on `evaluated_on` (module docstring), never above `precision`'s table cosine."""
    table = TOLERANCES[precision].min_cosine
    floor = math.floor((cosine - CALIBRATED_COSINE_MARGIN) * 1000) / 1000 if cosine >= 0 else 0.0
    return {
        "min_cosine": min(table, max(floor, 0.0)),
        "by": by,
        "cosine": cosine,
        "evaluated_on": evaluated_on,
        "margin": CALIBRATED_COSINE_MARGIN,
    }


def artifact_criterion(candidate: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The criterion the artifact directory's manifest records, if any."""
    path = Path(candidate)
    if not path.is_dir():
        return None
    criterion = open_source(path).manifest.get("criterion")
    if not isinstance(criterion, dict) or not isinstance(criterion.get("min_cosine"), int | float):
        return None
    return criterion


def describe_criterion(criterion: dict[str, Any]) -> str:
    """One line: who accepted the artifact at what, and what validate applies."""
    cosine = criterion.get("cosine")
    measured = f"{cosine:.6f}" if isinstance(cosine, int | float) else "n/a"
    where = criterion.get("evaluated_on") or "its samples"
    return (
        f"{criterion.get('by', 'its build')} accepted this artifact at cosine {measured} on "
        f"{where}: validated at cosine >= {criterion['min_cosine']:g} (the manifest's criterion)"
    )


def parse_tolerances(specs: Sequence[str] | None) -> dict[str, tuple[float, float]]:
    """`["logits=1e-3:1e-2"]` -> `{"logits": (1e-3, 1e-2)}` (OUTPUT=ATOL:RTOL, repeatable)."""
    result: dict[str, tuple[float, float]] = {}
    for spec in specs or []:
        name, sep, values = spec.rpartition("=")
        parts = values.split(":")
        try:
            atol, rtol = (float(p) for p in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            atol = rtol = None
        if not sep or not name or atol is None or rtol is None or min(atol, rtol) < 0:
            raise InferccError(
                f"bad --tol {spec!r}", "write OUTPUT=ATOL:RTOL, e.g. --tol logits=1e-3:1e-2"
            )
        result[name] = (atol, rtol)
    return result
