"""`--static-shapes NAME=DIMS`: fix the inputs' dimensions in the model itself.

The inputs named get the given dimensions in their declared types, so shape inference and
fold-shapes see every dimension that follows as an int and fold the shape arithmetic away
(onnxsim's `--overwrite-input-shape`, onnxslim's `--input-shapes`). The model is then valid
only for those input shapes; the report and the manifest say so, and onnxruntime refuses any
other shape at the inputs.

Outputs whose declared dimensions became known ints after the passes are declared with them
(`declare_static_outputs`), so the model says what it computes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import onnx

from infercc.errors import InferccError
from infercc.ir.graph import Model, Value

log = logging.getLogger(__name__)


def fix_input_shapes(model: Model, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Give each named input its fixed dimensions; refuses unknown names, a rank or a static
    dimension that disagrees, and an input whose dimensions are all static already."""
    inputs = {v.name: v for v in model.graph.inputs}
    for name, dims in shapes.items():
        v = inputs.get(name)
        if v is None:
            raise InferccError(
                f"--static-shapes names {name!r}, which is not an input of the model",
                "model inputs: " + ", ".join(inputs),
            )
        _check_dims(v, tuple(int(d) for d in dims))
        _set_dims(v, tuple(int(d) for d in dims))


def _check_dims(v: Value, dims: tuple[int, ...]) -> None:
    if v.shape is None:
        return  # an input of unknown rank: any fixed shape is a choice
    if len(v.shape) != len(dims):
        raise InferccError(
            f"--static-shapes {v.name} has rank {len(dims)} but the input has rank {len(v.shape)}",
            "give one size per dimension, e.g. NAME=1x3x224x224",
        )
    for i, (old, new) in enumerate(zip(v.shape, dims, strict=True)):
        if isinstance(old, int) and old != new:
            raise InferccError(
                f"--static-shapes {v.name}: dimension {i} is {old} in the model, not {new}",
                "fix only the symbolic dimensions; the static ones must stay as declared",
            )
    if all(isinstance(d, int) for d in v.shape):
        raise InferccError(
            f"--static-shapes {v.name} has no effect: every dimension of the input is static",
            "drop it, or name an input with symbolic dimensions",
        )


def _set_dims(v: Value, dims: tuple[int, ...]) -> None:
    v.shape = dims
    if v.type_proto is not None and v.type_proto.HasField("tensor_type"):
        tp = onnx.TypeProto()
        tp.CopyFrom(v.type_proto)
        shape = tp.tensor_type.shape
        shape.Clear()
        for d in dims:
            shape.dim.add().dim_value = d
        v.type_proto = tp


def declare_static_outputs(model: Model) -> list[str]:
    """Write the inferred int dimensions into the declared types of the graph outputs where
    they were symbolic; returns the names of the outputs changed."""
    changed = []
    for v in model.graph.outputs:
        tp = v.type_proto
        if tp is None or not tp.HasField("tensor_type") or v.shape is None:
            continue
        dims = tp.tensor_type.shape.dim
        if len(dims) != len(v.shape):
            continue
        new = onnx.TypeProto()
        new.CopyFrom(tp)
        touched = False
        for d, inferred in zip(new.tensor_type.shape.dim, v.shape, strict=True):
            if not d.HasField("dim_value") and isinstance(inferred, int):
                d.Clear()
                d.dim_value = inferred
                touched = True
        if touched:
            v.type_proto = new
            changed.append(v.name)
    return changed
