"""The precision a candidate was built with, its default tolerances (the table of
`infercc.precisions`), and `--tol OUTPUT=ATOL:RTOL` specs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

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
