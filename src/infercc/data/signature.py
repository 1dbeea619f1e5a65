"""A model's real inputs: names, dtypes, declared dimensions, and the concrete shapes that
resolve its symbolic dimensions (one value per symbol across inputs; unless pinned with
`--shape` or preset by the caller, 1 on axis 0 and 8 elsewhere).

A symbol is the name of a `dim_param`; an unnamed unknown dimension is a symbol of its own,
keyed `(input name, axis)`. `free_symbols` lists the symbols a profile may still choose (those
no pinned input fixes) and `symbol_values` reads back the value of each symbol in a feed:
validation uses both to run a model at a second shape profile, and at other sizes when the
default ones fail (`infercc.check.profiles`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from infercc.errors import InferccError
from infercc.ir import Model, dtypes, export_model
from infercc.ir.graph import declared_dim

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 1
DEFAULT_DIM = 8

# Ops that pass integer values through unchanged (up to layout), so an index can flow through.
_INDEX_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
_MAX_PASSTHROUGH_STEPS = 8

Shapes = Mapping[str, tuple[int, ...]]
SymbolKey = str | tuple[str, int]  # a dim_param, or (input, axis) for an unnamed unknown dim


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
    return [declared_dim(dim) for dim in tensor_type.shape.dim]


def resolve_shape(
    vi: onnx.ValueInfoProto, shapes: Shapes | None, symbols: dict[SymbolKey, int]
) -> tuple[int, ...]:
    """Concrete shape for one input.

    A `--shape` pin wins (it must have the declared rank and agree with fixed dims); fixed dims
    stay; a symbolic dim takes the value already chosen for its symbol in `symbols` (shared
    across inputs, updated here), else 1 on axis 0 and 8 elsewhere. Unnamed unknown dims get
    the same defaults unless `symbols` holds a value for `(input, axis)`.
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
    return tuple(_resolve_dim(vi.name, dim, axis, symbols) for axis, dim in enumerate(dims))


def _default_dim(axis: int) -> int:
    return DEFAULT_BATCH if axis == 0 else DEFAULT_DIM


def _resolve_dim(name: str, dim: int | str | None, axis: int, symbols: dict[SymbolKey, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim is None:
        return symbols.get((name, axis), _default_dim(axis))
    return symbols.setdefault(dim, _default_dim(axis))


def _check_pin(
    name: str,
    dims: list[int | str | None] | None,
    pinned: tuple[int, ...],
    symbols: dict[SymbolKey, int],
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
    symbols: dict[SymbolKey, int],
) -> None:
    if isinstance(dim, int) and dim != value:
        raise InferccError(
            f"--shape for {name!r} sets axis {axis} to {value}, "
            f"the model fixes it to {dim} ({_format_dims(dims)})",
            f"use {dim} on axis {axis}",
        )
    if isinstance(dim, str):
        symbols.setdefault(dim, value)  # a second value is `shape_conflicts`'s to say


def shape_conflicts(
    dims: Mapping[str, Sequence[int | str | None] | None],
    shapes: Mapping[str, Sequence[int]] | None,
) -> list[str]:
    """Where `--shape` pins give one named symbol two values (`dims`: each input's declared
    dims): one line per symbol. The first value is the one shapes are resolved with."""
    first: dict[str, tuple[int, str]] = {}
    lines: dict[str, str] = {}
    for name, pinned in (shapes or {}).items():
        declared = dims.get(name)
        if declared is None or len(declared) != len(pinned):
            continue  # a rank the checks of the pins refuse
        for axis, (dim, value) in enumerate(zip(declared, pinned, strict=True)):
            if not isinstance(dim, str):
                continue
            seen, where = first.setdefault(dim, (int(value), f"{name}[{axis}]"))
            if seen != value and dim not in lines:
                lines[dim] = (
                    f"--shape sets symbol {dim!r} to {seen} on {where} and to {value} on "
                    f"{name}[{axis}]; the model names them alike, and may need them equal"
                )
    return list(lines.values())


def warn_shape_conflicts(
    dims: Mapping[str, Sequence[int | str | None] | None],
    shapes: Mapping[str, Sequence[int]] | None,
    source: str | os.PathLike[str],
) -> None:
    """Warn once per `shape_conflicts` line, naming the model; called where a command first
    holds the user's pins and the model (not in `resolve_shapes`, which runs many times)."""
    for line in shape_conflicts(dims, shapes):
        logger.warning("%s: %s", os.fspath(source), line)


def input_dims(model: onnx.ModelProto) -> dict[str, list[int | str | None] | None]:
    """Each real input's declared dims (`declared_dims`), by name."""
    return {vi.name: declared_dims(vi) for vi in real_inputs(model)}


def _format_dims(dims: Iterable[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def resolve_shapes(
    model: onnx.ModelProto,
    shapes: Shapes | None = None,
    symbols: Mapping[SymbolKey, int] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every real input; pinned inputs first so their symbols propagate.
    `symbols` presets the value of symbols (pins still win) in place of the defaults."""
    inputs = real_inputs(model)
    _check_shape_names(inputs, shapes or {})
    chosen: dict[SymbolKey, int] = {}
    pinned_first = sorted(inputs, key=lambda vi: vi.name not in (shapes or {}))
    pinned = sum(1 for vi in inputs if vi.name in (shapes or {}))
    resolved = {vi.name: resolve_shape(vi, shapes, chosen) for vi in pinned_first[:pinned]}
    chosen = {**dict(symbols or {}), **chosen}
    for vi in pinned_first[pinned:]:
        resolved[vi.name] = resolve_shape(vi, None, chosen)
    return {vi.name: resolved[vi.name] for vi in inputs}


def _check_shape_names(inputs: list[onnx.ValueInfoProto], shapes: Shapes) -> None:
    known = {vi.name for vi in inputs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise InferccError(
            f"--shape names unknown input(s) {', '.join(map(repr, unknown))}",
            f"the model's inputs are: {', '.join(sorted(known)) or '(none)'}",
        )


def check_shape_names(
    model: Model,
    shapes: Mapping[str, tuple[int, ...]] | None,
    source: str | os.PathLike[str] | None = None,
) -> None:
    """Refuse pins naming no input or of the wrong rank; with `source`, warn where they give
    a symbol two values (`warn_shape_conflicts`)."""
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
    if source is not None:
        declared = {v.name: v.shape for v in model.graph.inputs}
        warn_shape_conflicts(declared, shapes, source)


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


# --------------------------------------------------------------------------- symbols


@dataclass(frozen=True)
class Symbol:
    """A symbolic dimension a profile may choose: where it appears and its default."""

    key: SymbolKey
    where: tuple[tuple[str, int, int], ...]  # (input, axis, the input's rank) per occurrence

    @property
    def default(self) -> int:
        return _default_dim(self.where[0][1])

    @property
    def batch_like(self) -> bool:
        """Axis 0 of an input of rank >= 2 somewhere: a batch, not a size the model needs."""
        return any(axis == 0 and rank >= 2 for _, axis, rank in self.where)

    @property
    def label(self) -> str:
        """How a message names it: the dim_param, or `input[axis]`."""
        if isinstance(self.key, str):
            return self.key
        name, axis = self.key
        return f"{name}[{axis}]"


def free_symbols(model: onnx.ModelProto, shapes: Shapes | None = None) -> dict[SymbolKey, Symbol]:
    """The symbols of the real inputs that no pinned input fixes, in order of appearance."""
    pins = shapes or {}
    fixed: set[SymbolKey] = set()
    found: dict[SymbolKey, list[tuple[str, int, int]]] = {}
    for vi in real_inputs(model):
        dims = declared_dims(vi) or []
        for axis, dim in enumerate(dims):
            if isinstance(dim, int):
                continue
            key: SymbolKey = dim if isinstance(dim, str) else (vi.name, axis)
            if vi.name in pins:
                fixed.add(key)
            else:
                found.setdefault(key, []).append((vi.name, axis, len(dims)))
    return {k: Symbol(k, tuple(w)) for k, w in found.items() if k not in fixed}


def symbol_values(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[SymbolKey, int]:
    """The value each symbolic dimension has in `feeds` (the first input that shows it)."""
    values: dict[SymbolKey, int] = {}
    for vi in real_inputs(model):
        array = feeds.get(vi.name)
        dims = declared_dims(vi)
        if array is None or dims is None or np.ndim(array) != len(dims):
            continue
        for axis, dim in enumerate(dims):
            if not isinstance(dim, int):
                key: SymbolKey = dim if isinstance(dim, str) else (vi.name, axis)
                values.setdefault(key, int(np.shape(array)[axis]))
    return values
