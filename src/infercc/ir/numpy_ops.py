"""The ONNX ops numpy computes exactly as onnxruntime does: data movement (Identity, Unsqueeze,
Squeeze with axes, Concat, Gather, Reshape, Transpose, ConstantOfShape) and integer / float32 /
float64 Add, Sub and Mul, which put the same bits in the same places.

`MOVES[op](node, inputs, opset)` gives the output, or None where onnxruntime's own rules
decide (Squeeze without axes, float16 or integer division, ...). `node` is anything with
`attr(name, default)`: an IR `Node` (fold-constants) or `ProtoAttrs` over an `onnx.NodeProto`
(the shape tensors `infercc.ir.shapes` sizes values with).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import onnx


class HasAttrs(Protocol):
    def attr(self, name: str, default: Any = None) -> Any: ...


class ProtoAttrs:
    """An `onnx.NodeProto`'s attributes read as `Node.attr` reads them."""

    def __init__(self, node: onnx.NodeProto):
        self._attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

    def attr(self, name: str, default: Any = None) -> Any:
        return self._attrs.get(name, default)


def _axes(node: HasAttrs, a: list, opset: int) -> list[int] | None:
    if opset >= 13:
        axes = a[1] if len(a) > 1 else None
        return None if axes is None else [int(x) for x in axes.reshape(-1)]
    return node.attr("axes")


def _unsqueeze(node: HasAttrs, a: list, opset: int) -> np.ndarray | None:
    axes = _axes(node, a, opset)
    return None if not axes else np.expand_dims(a[0], tuple(axes))


def _squeeze(node: HasAttrs, a: list, opset: int) -> np.ndarray | None:
    axes = _axes(node, a, opset)  # no axes, or an empty axes tensor: onnxruntime's own rules
    return None if not axes else np.squeeze(a[0], tuple(axes))


def _reshape(node: HasAttrs, a: list, opset: int) -> np.ndarray | None:
    if len(a) < 2 or a[1] is None:
        return None  # opset 1-4 Reshape takes the shape as an attribute
    shape = [int(d) for d in a[1].reshape(-1)]
    if not node.attr("allowzero", 0):
        shape = [a[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return np.reshape(a[0], shape)


def _binary(fn: Callable) -> Callable:
    """Integer (wrapping) and float32/float64 (IEEE, correctly rounded) arithmetic only: the
    same bits in numpy and onnxruntime. float16 and integer division are left to onnxruntime."""

    def run(node: HasAttrs, a: list, opset: int) -> np.ndarray | None:
        if a[0].dtype != a[1].dtype or not (
            a[0].dtype.kind in "iu" or a[0].dtype in (np.float32, np.float64)
        ):
            return None
        return np.asarray(fn(a[0], a[1])).astype(a[0].dtype, copy=False)

    return run


def _constant_of_shape(node: HasAttrs, a: list, opset: int) -> np.ndarray:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    return np.full(tuple(int(d) for d in a[0].reshape(-1)), value.reshape(-1)[0], value.dtype)


def _transpose(node: HasAttrs, a: list, opset: int) -> np.ndarray:
    perm = node.attr("perm")
    return np.transpose(a[0], None if perm is None else tuple(perm))


def _identity(node: HasAttrs, a: list, opset: int) -> np.ndarray | None:
    return a[0] if isinstance(a[0], np.ndarray) else None


MOVES: dict[str, Callable[[HasAttrs, list, int], np.ndarray | None]] = {
    "Identity": _identity,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda n, a, o: np.concatenate([x for x in a if x is not None], n.attr("axis")),
    "Gather": lambda n, a, o: np.take(a[0], a[1], axis=n.attr("axis", 0)),
    "Reshape": _reshape,
    "Transpose": _transpose,
    "ConstantOfShape": _constant_of_shape,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
}
