"""Outputs that are not tensors: sequences, maps, sequences of maps and optionals, as
onnxruntime returns them (lists, dicts, None), taken apart for comparison element by element.

A value is split into its *structure* (the kind of each level, sequence lengths, map keys in
sorted order, and each tensor's dtype and shape) and its *leaves* (the tensors and map values,
in a fixed order: sequence index, then sorted key). Two values are comparable when their
structures are equal; a difference is described in words ("element 2: map keys [0, 1, 2]
differ from the reference's [0, 1]"). Their leaves, raveled and concatenated into one array
each, are then compared like any tensor output. skl2onnx classifiers end in ZipMap, whose
output is a sequence of maps from class label to probability: the labels are compared
exactly (as keys) and the probabilities within the tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Structure = tuple[Any, ...]


def is_tensor(value: Any) -> bool:
    return isinstance(value, np.ndarray)


def split(value: Any, loose_floats: bool = False) -> tuple[Structure, list[np.ndarray]]:
    """(structure, leaves) of an output value. `loose_floats`: float leaves are described as
    "float" whatever their width (a candidate may change float types on purpose)."""
    leaves: list[np.ndarray] = []
    structure = _split(value, leaves, loose_floats)
    return structure, leaves


def _split(value: Any, leaves: list[np.ndarray], loose: bool) -> Structure:
    if value is None:
        return ("none",)
    if isinstance(value, (list, tuple)):
        return ("seq", len(value), tuple(_split(v, leaves, loose) for v in value))
    if isinstance(value, dict):
        keys = sorted(value)
        inner = tuple(_split(value[k], leaves, loose) for k in keys)
        return ("map", tuple(keys), inner)
    array = np.asarray(value)
    leaves.append(array)
    dtype = "float" if loose and array.dtype.kind == "f" else str(array.dtype)
    return ("tensor", dtype, tuple(int(d) for d in array.shape))


def joined(leaves: Sequence[np.ndarray]) -> np.ndarray:
    """The leaves raveled into one 1-D array (empty float64 for none)."""
    if not leaves:
        return np.zeros(0, np.float64)
    return np.concatenate([np.asarray(leaf).ravel() for leaf in leaves])


def difference(ref: Structure, cand: Structure, where: str = "") -> str | None:
    """The first difference between two structures, in words; None when equal."""
    if ref == cand:
        return None
    prefix = f"{where}: " if where else ""
    if ref[0] != cand[0]:
        return f"{prefix}{_kind(cand)} where the reference has {_kind(ref)}"
    if ref[0] == "tensor":
        if ref[1] != cand[1]:
            return f"{prefix}dtype {cand[1]} differs from the reference's {ref[1]}"
        return f"{prefix}shape {list(cand[2])} differs from the reference's {list(ref[2])}"
    if ref[0] == "seq" and ref[1] != cand[1]:
        return f"{prefix}sequence length {cand[1]} differs from the reference's {ref[1]}"
    if ref[0] == "map" and ref[1] != cand[1]:
        return f"{prefix}map keys {_keys(cand[1])} differ from the reference's {_keys(ref[1])}"
    for i, (r, c) in enumerate(zip(ref[2], cand[2], strict=True)):
        label = f"element {i}" if ref[0] == "seq" else f"key {ref[1][i]!r}"
        found = difference(r, c, f"{where} {label}".strip())
        if found is not None:
            return found
    return None


def describe(value: Any) -> str:
    """The type of an output value in ONNX's words: seq(map(int64,float32)), optional..."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return f"seq({describe(value[0])})" if value else "seq()"
    if isinstance(value, dict):
        if not value:
            return "map()"
        key = next(iter(value))
        return f"map({_scalar_type(key)},{describe(value[key])})"
    if isinstance(value, float):
        return "float"  # onnxruntime hands map values over as Python floats
    return str(np.asarray(value).dtype)


def leaf_kind(leaves: Sequence[np.ndarray]) -> str:
    """The numpy kind shared by the leaves ("f" when any is floating), "f" for none."""
    kinds = {np.asarray(leaf).dtype.kind for leaf in leaves}
    if not kinds or kinds & {"f", "c"}:
        return "c" if "c" in kinds else "f"
    return kinds.pop() if len(kinds) == 1 else "O"


def _kind(s: Structure) -> str:
    return {"none": "an empty optional", "seq": "a sequence", "map": "a map"}.get(s[0], "a tensor")


def _keys(keys: tuple[Any, ...], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}]"


def _scalar_type(key: Any) -> str:
    if isinstance(key, str):
        return "string"
    if isinstance(key, (int, np.integer)):
        return "int64"
    return type(key).__name__
