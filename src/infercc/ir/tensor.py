"""Constant tensors of the IR: numpy arrays, decoded lazily from the TensorProto they came from.

A weight that no pass touches is never decoded: the exporter writes its original TensorProto back.
External data is memory-mapped when a pass asks for the array, never read whole into memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from infercc.errors import InferccError
from infercc.ir.dtypes import storage_dtype
from infercc.ir.wire import RawSlice


def _np_dtype(elem_type: int) -> np.dtype:
    return storage_dtype(elem_type)


def external_info(proto: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in proto.external_data}


def resolve_external_path(base_dir: Path | None, location: str, tensor: str) -> Path:
    """The file an external tensor lives in; refuses paths that leave the model's directory."""
    if base_dir is None:
        raise InferccError(
            f"tensor '{tensor}' stores its data in an external file but the model was not read "
            "from a path",
            "load the model from its file so its external data can be found",
        )
    loc = Path(location)
    base = base_dir.resolve()
    target = (base / loc).resolve()
    if loc.is_absolute() or os.path.commonpath([base, target]) != str(base):
        raise InferccError(
            f"tensor '{tensor}' points at external data outside the model's folder: {location!r}",
            "external data locations must be relative paths inside the model's directory",
        )
    if not target.exists():
        raise InferccError(
            f"external data file for tensor '{tensor}' not found: {target}",
            "keep the .data file next to the model",
        )
    if not target.is_file():
        raise InferccError(
            f"external data of tensor '{tensor}' is {_kind(target)}, not a regular file: {target}",
            "point the model's external data at the regular .data file written with it",
        )
    return target


def _kind(path: Path) -> str:
    """What a path that is not a regular file is, in words."""
    mode = path.stat().st_mode
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"


# Mapped arrays at least this large are re-mapped on each `Tensor.numpy()` instead of kept:
# resident mapped pages count in the process's RSS as long as the map lives.
MAP_KEEP_BYTES = 2**20


class Tensor:
    """An immutable constant: either an array, or a TensorProto decoded on first use."""

    __slots__ = ("_array", "proto", "dtype", "shape", "base_dir", "source")

    def __init__(
        self,
        array: np.ndarray | None = None,
        *,
        proto: TensorProto | None = None,
        dtype: int | None = None,
        base_dir: Path | None = None,
        source: RawSlice | None = None,
    ):
        if array is None and proto is None:
            raise ValueError("Tensor needs an array or a proto")
        self._array = array
        self.proto = proto
        self.base_dir = base_dir
        # Where raw_data still lies in the source model file (the proto then holds no data).
        self.source = source
        if proto is not None:
            self.dtype = proto.data_type
            self.shape = tuple(int(d) for d in proto.dims)
        else:
            arr = np.asarray(array)
            self._array = arr
            self.dtype = (
                dtype if dtype is not None else onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
            )
            self.shape = tuple(arr.shape)

    @classmethod
    def from_proto(
        cls, proto: TensorProto, base_dir: Path | None = None, source: RawSlice | None = None
    ) -> Tensor:
        return cls(proto=proto, base_dir=base_dir, source=source)

    @property
    def is_external(self) -> bool:
        return self.proto is not None and self.proto.data_location == TensorProto.EXTERNAL

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        if self.dtype in (TensorProto.STRING, TensorProto.UNDEFINED):
            return 0
        return self.size * _np_dtype(self.dtype).itemsize

    def numpy(self) -> np.ndarray:
        """The data as a read-only array (memory-mapped for external data and raw bytes left in
        the model file). A map of `MAP_KEEP_BYTES` or more is not kept: each caller gets its
        own, unmapped when the caller lets go of it, so that a pass reading every weight once
        holds one weight's pages at a time, not the whole model's until the IR is freed."""
        if self._array is not None:
            return self._array
        array = self._decode()
        array.flags.writeable = False
        if not (isinstance(array, np.memmap) and array.nbytes >= MAP_KEEP_BYTES):
            self._array = array
        return array

    def _decode(self) -> np.ndarray:
        assert self.proto is not None
        if self.is_external:
            return self._map_external()
        if self.source is not None:
            return self._map_source()
        return numpy_helper.to_array(self.proto)

    def _map_source(self) -> np.ndarray:
        src = self.source
        assert src is not None and self.proto is not None
        dtype = _np_dtype(self.dtype)
        fixed_width = dtype.kind in "biufc" and self.dtype not in _CUSTOM_TYPES
        if fixed_width and src.length != self.size * dtype.itemsize:
            raise InferccError(
                f"tensor '{self.proto.name}' holds {src.length} bytes but its shape needs "
                f"{self.size * dtype.itemsize}",
                "the model file is corrupt; re-export it",
            )
        if fixed_width and self.size > 0:
            return np.memmap(src.path, dtype=dtype, mode="r", offset=src.offset, shape=self.shape)
        return numpy_helper.to_array(self._full_proto(self.proto.name))

    def raw_bytes(self) -> bytes:
        """The raw_data bytes read from the source file (only for tensors with a source)."""
        assert self.source is not None
        name = self.proto.name if self.proto is not None else ""
        try:
            with open(self.source.path, "rb") as f:
                f.seek(self.source.offset)
                data = f.read(self.source.length)
        except OSError as e:
            raise InferccError(
                f"cannot read weights of tensor '{name}' from {self.source.path}: "
                f"{e.strerror or e}",
                "the input model must stay in place while infercc reads it",
            ) from None
        if len(data) != self.source.length:
            raise InferccError(
                f"model file {self.source.path} changed or was truncated while being read",
                "do not modify the input model while infercc runs",
            )
        return data

    def header(self, name: str) -> TensorProto:
        """The proto under `name` (a renamed copy when needed); for a tensor whose raw bytes
        stay in the source file, it holds no data."""
        assert self.proto is not None
        if self.proto.name == name:
            return self.proto
        copy = TensorProto()
        copy.CopyFrom(self.proto)
        copy.name = name
        return copy

    def _full_proto(self, name: str) -> TensorProto:
        copy = TensorProto()
        copy.CopyFrom(self.header(name))
        copy.raw_data = self.raw_bytes()
        return copy

    def external_slice(self) -> RawSlice:
        """Where an external tensor's bytes are, checked: inside the model's folder, and as
        long as its shape needs."""
        assert self.proto is not None and self.is_external
        info = external_info(self.proto)
        path = resolve_external_path(self.base_dir, info.get("location", ""), self.proto.name)
        needed = self.size * _np_dtype(self.dtype).itemsize
        offset = int(info.get("offset", 0))
        length = int(info.get("length", needed))
        if length < needed or offset + length > path.stat().st_size:
            raise InferccError(
                f"external data of tensor '{self.proto.name}' is shorter than its shape needs",
                "the .data file is truncated or does not belong to this model",
            )
        return RawSlice(path, offset, length)

    def _map_external(self) -> np.ndarray:
        where = self.external_slice()
        path, offset, length = where.path, where.offset, where.length
        dtype = _np_dtype(self.dtype)
        if self.size == 0:
            return np.zeros(self.shape, dtype=dtype)
        if dtype.kind not in "biufc" or self.dtype in _CUSTOM_TYPES:
            raw = np.fromfile(path, dtype=np.uint8, count=length, offset=offset).tobytes()
            copy = TensorProto()
            copy.CopyFrom(self.proto)
            del copy.external_data[:]
            copy.data_location = TensorProto.DEFAULT
            copy.raw_data = raw
            return numpy_helper.to_array(copy)
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=self.shape)

    def to_proto(self, name: str) -> TensorProto:
        """A TensorProto with inline data (external data is read in)."""
        if self.source is not None:
            return self._full_proto(name)
        if self.proto is not None and not self.is_external:
            return self.header(name)  # the proto holds its data inline
        arr = self.numpy()
        if self.dtype in _CUSTOM_TYPES or arr.dtype.kind not in "biufc":
            return numpy_helper.from_array(np.asarray(arr), name=name)
        proto = TensorProto()
        proto.name = name
        proto.data_type = self.dtype
        proto.dims.extend(self.shape)
        proto.raw_data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        return proto


_CUSTOM_TYPES = {
    TensorProto.BFLOAT16,
    TensorProto.FLOAT8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ,
    TensorProto.FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ,
    TensorProto.UINT4,
    TensorProto.INT4,
    TensorProto.STRING,
}
for _name in ("FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2"):
    if hasattr(TensorProto, _name):
        _CUSTOM_TYPES.add(getattr(TensorProto, _name))
