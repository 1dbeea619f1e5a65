"""Reading a model file without reading its weights: a scan of protobuf's wire format.

`onnx.load` parses every weight into memory (and holds the file's bytes while it does, so a
400 MB model peaks near 800 MB). Here the file is memory-mapped, the top-level ModelProto and
GraphProto fields are walked with a varint reader, and each main-graph initializer's `raw_data`
is recorded as (offset, length) in the file instead of being parsed. Everything else (nodes,
value_info, subgraphs, small tensors without raw_data) is parsed by protobuf as usual. The
tensors then read their bytes from the file only when a pass asks for them.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import onnx

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_LEN = 2


class WireError(ValueError):
    """The file is not valid protobuf (truncated or not a model)."""


@dataclass(frozen=True)
class RawSlice:
    """Where an initializer's raw bytes live in the source file."""

    path: Path
    offset: int
    length: int


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _fields(buf, start: int, end: int):
    """Yield (field number, wire type, field start, value start, value end) for each field."""
    pos = start
    while pos < end:
        fstart = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        vstart = pos
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == _LEN:
            n, pos = _varint(buf, pos, end)
            vstart = pos
            pos += n
        elif wire == 5:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")
        if pos > end or number == 0:
            raise WireError("truncated or corrupt message")
        yield number, wire, fstart, vstart, pos


def read_model(path: Path) -> tuple[onnx.ModelProto, list[RawSlice | None]]:
    """The model with main-graph initializers' raw_data left in the file.

    Returns the parsed model (those initializers have empty raw_data) and, per main-graph
    initializer in order, where its raw bytes are (None when it had no raw_data).
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return onnx.ModelProto(), []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _read(buf, size, path)


def _read(buf, size: int, path: Path) -> tuple[onnx.ModelProto, list[RawSlice | None]]:
    model_parts: list[bytes] = []
    graph_parts: list[bytes] = []
    tensors: list[tuple[bytes, RawSlice | None]] = []
    for number, wire, fstart, vstart, vend in _fields(buf, 0, size):
        if number == _MODEL_GRAPH and wire == _LEN:
            _scan_graph(buf, vstart, vend, path, graph_parts, tensors)
        else:
            model_parts.append(buf[fstart:vend])
    model = onnx.ModelProto()
    model.ParseFromString(b"".join(model_parts))
    graph = model.graph
    graph.ParseFromString(b"".join(graph_parts))
    slices: list[RawSlice | None] = []
    for header, raw in tensors:
        graph.initializer.add().ParseFromString(header)
        slices.append(raw)
    return model, slices


def _scan_graph(buf, start: int, end: int, path: Path, parts: list[bytes], tensors) -> None:
    for number, wire, fstart, vstart, vend in _fields(buf, start, end):
        if number == _GRAPH_INITIALIZER and wire == _LEN:
            tensors.append(_scan_tensor(buf, vstart, vend, path))
        else:
            parts.append(buf[fstart:vend])


def _scan_tensor(buf, start: int, end: int, path: Path) -> tuple[bytes, RawSlice | None]:
    header: list[bytes] = []
    raw = None
    for number, wire, fstart, vstart, vend in _fields(buf, start, end):
        if number == _TENSOR_RAW_DATA and wire == _LEN:
            raw = RawSlice(path, vstart, vend - vstart)
        else:
            header.append(buf[fstart:vend])
    return b"".join(header), raw
