"""A model's real inputs: names, dtypes, declared dimensions, and the concrete shapes that
resolve its symbolic dimensions (one value per symbol across inputs; unless pinned with
`--shape`, 1 on axis 0 and 8 elsewhere).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
import onnx

from infercc.errors import InferccError
from infercc.ir import Model, dtypes, export_model

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 1
DEFAULT_DIM = 8

# Ops that pass integer values through unchanged (up to layout), so an index can flow through.
_INDEX_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
_MAX_PASSTHROUGH_STEPS = 8

Shapes = Mapping[str, tuple[int, ...]]


# --------------------------------------------------------------------------- which inputs


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that must be fed: those that are not also initializers (IR<4 lists both)."""
    initializers = {init.name for init in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in initializers]


def elem_type_name(elem_type: int) -> str:
    """`TensorProto.FLOAT` -> `"float"`, for messages."""
    return dtypes.name(elem_type)


def input_dtype(vi: onnx.ValueInfoProto) -> np.dtype:
    """The numpy dtype onnxruntime expects for a tensor input; InferccError when unsupported."""
    elem_type = _tensor_type(vi).elem_type
    row = dtypes.dtype(elem_type)
    if row is None or not row.feedable:
        raise InferccError(
            f"input {vi.name!r} has element type {elem_type_name(elem_type)}, "
            "which infercc cannot feed from numpy",
            "supported: " + ", ".join(d.name for d in dtypes.DTYPES.values() if d.feedable),
        )
    return row.numpy


def _tensor_type(vi: onnx.ValueInfoProto) -> onnx.TypeProto.Tensor:
    if vi.type.WhichOneof("value") != "tensor_type":
        raise InferccError(
            f"input {vi.name!r} is not a tensor ({vi.type.WhichOneof('value')})",
            "only tensor inputs can be generated or loaded",
        )
    return vi.type.tensor_type


# --------------------------------------------------------------------------- shapes


def declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The declared dims (int, symbol name, or None for unknown); None when the rank is unknown."""
    tensor_type = _tensor_type(vi)
    if not tensor_type.HasField("shape"):
        return None
    return [_declared_dim(dim) for dim in tensor_type.shape.dim]


def _declared_dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    kind = dim.WhichOneof("value")
    if kind == "dim_value":
        return dim.dim_value
    if kind == "dim_param" and dim.dim_param:
        return dim.dim_param
    return None


def resolve_shape(
    vi: onnx.ValueInfoProto, shapes: Shapes | None, symbols: dict[str, int]
) -> tuple[int, ...]:
    """Concrete shape for one input.

    A `--shape` pin wins (it must have the declared rank and agree with fixed dims); fixed dims
    stay; a symbolic dim takes the value already chosen for its symbol in `symbols` (shared
    across inputs, updated here), else 1 on axis 0 and 8 elsewhere. Unnamed unknown dims get
    the same defaults.
    """
    dims = declared_dims(vi)
    pinned = (shapes or {}).get(vi.name)
    if pinned is not None:
        return _check_pin(vi.name, dims, tuple(pinned), symbols)
    if dims is None:
        raise InferccError(
            f"input {vi.name!r} has no declared shape (unknown rank)",
            f"pin it with --shape {vi.name}=D0xD1x...",
        )
    return tuple(_resolve_dim(dim, axis, symbols) for axis, dim in enumerate(dims))


def _default_dim(axis: int) -> int:
    return DEFAULT_BATCH if axis == 0 else DEFAULT_DIM


def _resolve_dim(dim: int | str | None, axis: int, symbols: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim is None:
        return _default_dim(axis)
    return symbols.setdefault(dim, _default_dim(axis))


def _check_pin(
    name: str,
    dims: list[int | str | None] | None,
    pinned: tuple[int, ...],
    symbols: dict[str, int],
) -> tuple[int, ...]:
    if dims is None:
        return pinned
    if len(dims) != len(pinned):
        raise InferccError(
            f"--shape for {name!r} has rank {len(pinned)}, the model declares rank {len(dims)} "
            f"({_format_dims(dims)})",
            f"give {len(dims)} dimensions",
        )
    for axis, (dim, value) in enumerate(zip(dims, pinned, strict=True)):
        _check_pinned_dim(name, axis, dim, value, dims, symbols)
    return pinned


def _check_pinned_dim(
    name: str,
    axis: int,
    dim: int | str | None,
    value: int,
    dims: list[int | str | None],
    symbols: dict[str, int],
) -> None:
    if isinstance(dim, int) and dim != value:
        raise InferccError(
            f"--shape for {name!r} sets axis {axis} to {value}, "
            f"the model fixes it to {dim} ({_format_dims(dims)})",
            f"use {dim} on axis {axis}",
        )
    if isinstance(dim, str):
        chosen = symbols.setdefault(dim, value)
        if chosen != value:
            logger.warning(
                "--shape for %r sets symbol %r to %d, another input already uses %d",
                name,
                dim,
                value,
                chosen,
            )


def _format_dims(dims: Iterable[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def resolve_shapes(
    model: onnx.ModelProto, shapes: Shapes | None = None
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every real input; pinned inputs first so their symbols propagate."""
    inputs = real_inputs(model)
    _check_shape_names(inputs, shapes or {})
    symbols: dict[str, int] = {}
    pinned_first = sorted(inputs, key=lambda vi: vi.name not in (shapes or {}))
    resolved = {vi.name: resolve_shape(vi, shapes, symbols) for vi in pinned_first}
    return {vi.name: resolved[vi.name] for vi in inputs}


def _check_shape_names(inputs: list[onnx.ValueInfoProto], shapes: Shapes) -> None:
    known = {vi.name for vi in inputs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise InferccError(
            f"--shape names unknown input(s) {', '.join(map(repr, unknown))}",
            f"the model's inputs are: {', '.join(sorted(known)) or '(none)'}",
        )


def check_shape_names(model: Model, shapes: Mapping[str, tuple[int, ...]] | None) -> None:
    names = [v.name for v in model.graph.inputs]
    for name, dims in (shapes or {}).items():
        if name not in names:
            raise InferccError(
                f"--shape names {name!r}, which is not an input of the model",
                "model inputs: " + ", ".join(names),
            )
        v = model.graph.inputs[names.index(name)]
        if v.shape is not None and len(v.shape) != len(dims):
            raise InferccError(
                f"--shape {name} has rank {len(dims)} but the input has rank {len(v.shape)}",
                "give one size per dimension, e.g. NAME=1x3x224x224",
            )


def shape_profile(
    model: Model, shapes: Mapping[str, tuple[int, ...]] | None
) -> dict[str, tuple[int, ...]] | None:
    """Concrete input shapes for planning (the ones validation uses), or None if unresolvable."""
    from infercc.data.signature import resolve_shapes

    try:
        return resolve_shapes(export_model(model, with_weights=False), dict(shapes or {}))
    except InferccError as e:
        logger.info("no shape profile for memory planning: %s", e)
        return None
