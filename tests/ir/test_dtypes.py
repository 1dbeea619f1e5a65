"""`infercc.ir.dtypes`: the element-type table agrees with onnx and numpy."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from infercc.ir import dtypes


def test_names_are_onnx_names_and_numpy_types_match_onnx_helper() -> None:
    for code, row in dtypes.DTYPES.items():
        assert row.name == TensorProto.DataType.Name(code).lower()
        if row.numpy is not None:
            assert row.numpy == np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
            if row.bits is not None:
                assert row.bits == 8 * row.numpy.itemsize
        assert dtypes.by_name(f"tensor({row.name})") is row


def test_tensor_bytes_packs_sub_byte_types_and_refuses_what_it_cannot_size() -> None:
    assert dtypes.tensor_bytes(TensorProto.FLOAT, (2, 3)) == 24
    assert dtypes.tensor_bytes(TensorProto.INT4, (3,)) == 2
    assert dtypes.tensor_bytes(TensorProto.BFLOAT16, (4,)) == 8
    assert dtypes.tensor_bytes(TensorProto.STRING, (4,)) is None
    assert dtypes.tensor_bytes(TensorProto.FLOAT, ("batch", 4)) is None
    assert dtypes.tensor_bytes(None, (4,)) is None
    assert dtypes.tensor_bytes(12345, (4,)) is None


def test_precisions_names_and_feedable_types() -> None:
    assert dtypes.precision(TensorProto.FLOAT) == "fp32"
    assert dtypes.precision(TensorProto.UINT8) == dtypes.precision(TensorProto.INT8) == "int8"
    assert dtypes.precision(TensorProto.FLOAT8E4M3FN) == "fp8"
    assert dtypes.precision(TensorProto.INT64) is None
    assert dtypes.name(None) == "?" and dtypes.name(12345) == "type 12345"
    feedable = {d.name for d in dtypes.DTYPES.values() if d.feedable}
    assert {"float", "float16", "int64", "bool", "string"} <= feedable
    assert not feedable & {"bfloat16", "complex64", "int4"}
    assert dtypes.storage_dtype(TensorProto.BFLOAT16).itemsize == 2
