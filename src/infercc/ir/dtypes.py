"""ONNX element types as one table: name, bits per element, numpy type and precision.

Every module that needs a fact about an element type reads it here: the bytes of a tensor
(memory planning, the roofline; sub-byte types packed, `ceil(n * bits / 8)`), the numpy type
inputs are made in and fed as, the name in messages and reports (ONNX's own, lower case:
`float`, `float16`, which onnxruntime also writes as `tensor(float16)`), and the precision a
tensor of that type computes in (fp32, fp16, bf16, fp8, int8), which the roofline and the
TensorRT backend read.

`numpy` is numpy's own type, or None where numpy has none (bfloat16, float8, 4-bit and 2-bit
types: `onnx.helper` maps those to `ml_dtypes`, see `storage_dtype`). Types onnx does not
define in the installed version are left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto


@dataclass(frozen=True)
class DType:
    code: int  # TensorProto.DataType value
    name: str  # ONNX's name, lower case
    bits: int | None  # per element; None for strings
    numpy: np.dtype | None  # numpy's own type; None where numpy has none
    precision: str | None  # what a tensor of this type computes in, for the roofline

    @property
    def feedable(self) -> bool:
        """infercc can make and feed inputs of this type from numpy (onnxruntime takes them)."""
        return self.numpy is not None and self.numpy.kind != "c"


# ONNX name, bits, numpy type, precision.
_ROWS: tuple[tuple[str, int | None, type | None, str | None], ...] = (
    ("FLOAT", 32, np.float32, "fp32"),
    ("UINT8", 8, np.uint8, "int8"),
    ("INT8", 8, np.int8, "int8"),
    ("UINT16", 16, np.uint16, None),
    ("INT16", 16, np.int16, None),
    ("INT32", 32, np.int32, None),
    ("INT64", 64, np.int64, None),
    ("STRING", None, np.object_, None),
    ("BOOL", 8, np.bool_, None),
    ("FLOAT16", 16, np.float16, "fp16"),
    ("DOUBLE", 64, np.float64, None),
    ("UINT32", 32, np.uint32, None),
    ("UINT64", 64, np.uint64, None),
    ("COMPLEX64", 64, np.complex64, None),
    ("COMPLEX128", 128, np.complex128, None),
    ("BFLOAT16", 16, None, "bf16"),
    ("FLOAT8E4M3FN", 8, None, "fp8"),
    ("FLOAT8E4M3FNUZ", 8, None, "fp8"),
    ("FLOAT8E5M2", 8, None, "fp8"),
    ("FLOAT8E5M2FNUZ", 8, None, "fp8"),
    ("FLOAT8E8M0", 8, None, None),  # a power-of-two scale type, not a compute type
    ("UINT4", 4, None, None),
    ("INT4", 4, None, None),
    ("FLOAT4E2M1", 4, None, None),
    ("FLOAT6E2M3", 6, None, None),
    ("FLOAT6E3M2", 6, None, None),
    ("UINT2", 2, None, None),
    ("INT2", 2, None, None),
)

DTYPES: dict[int, DType] = {
    getattr(TensorProto, name): DType(
        getattr(TensorProto, name),
        name.lower(),
        bits,
        np.dtype(numpy) if numpy is not None else None,
        precision,
    )
    for name, bits, numpy, precision in _ROWS
    if hasattr(TensorProto, name)
}
_BY_NAME = {d.name: d for d in DTYPES.values()}


def dtype(code: int | None) -> DType | None:
    """The row of element type `code`, or None for an unknown or missing type."""
    return DTYPES.get(code) if code is not None else None


def by_name(name: str) -> DType | None:
    """The row named `name` (`float16`, or onnxruntime's `tensor(float16)`)."""
    if name.startswith("tensor(") and name.endswith(")"):
        name = name[len("tensor(") : -1]
    return _BY_NAME.get(name)


def name(code: int | None) -> str:
    """`TensorProto.FLOAT` -> `"float"`; `"?"` for a missing type, `"type N"` for an unknown."""
    if code is None:
        return "?"
    row = DTYPES.get(code)
    return row.name if row is not None else f"type {code}"


def precision(code: int | None) -> str | None:
    row = dtype(code)
    return row.precision if row is not None else None


def numpy_dtype(code: int | None) -> np.dtype | None:
    """numpy's own type for `code`, or None."""
    row = dtype(code)
    return row.numpy if row is not None else None


def storage_dtype(code: int) -> np.dtype:
    """The numpy type an array of this element type is held in: numpy's own, else the
    `ml_dtypes` type `onnx.helper` maps it to (bfloat16, float8...)."""
    row = DTYPES.get(code)
    if row is not None and row.numpy is not None:
        return row.numpy
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))


def tensor_bytes(code: int | None, shape: Sequence[int | str | None] | None) -> int | None:
    """Bytes of a dense tensor of this type and shape (sub-byte types packed); None for
    strings, unknown types and shapes that are not all known non-negative sizes."""
    row = dtype(code)
    if row is None or row.bits is None or shape is None:
        return None
    sizes = [d for d in shape if isinstance(d, int) and not isinstance(d, bool) and d >= 0]
    if len(sizes) != len(shape):
        return None
    return (math.prod(sizes) * row.bits + 7) // 8
