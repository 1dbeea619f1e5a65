"""Shape and type inference for the IR, through `onnx.shape_inference`.

Inference runs on a skeleton of the model: large weights become typed graph inputs, so no
weight bytes are serialized; small integer constants keep their data so that data propagation
can resolve Reshape targets and Shape arithmetic.
"""

from __future__ import annotations

import logging

import onnx

from infercc.ir.exporter import export_model, type_proto_of
from infercc.ir.graph import Model, Value
from infercc.ir.importer import apply_type

log = logging.getLogger(__name__)

_KEEP_DATA_ELEMENTS = 64


def infer_shapes(model: Model) -> None:
    """Fill in dtype and shape of every value that onnx's inference can type."""
    skeleton = export_model(model, with_weights=False)
    for v in model.graph.initializers.values():
        const = v.const
        assert const is not None
        if const.size <= _KEEP_DATA_ELEMENTS and not const.is_external:
            skeleton.graph.initializer.append(const.to_proto(v.name))
        else:
            vi = skeleton.graph.input.add(name=v.name)
            vi.type.CopyFrom(type_proto_of(v))
    try:
        inferred = onnx.shape_inference.infer_shapes(
            skeleton, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as e:  # inference is best effort: a custom op can stop it
        log.info("shape inference failed: %s", str(e).splitlines()[0] if str(e) else e)
        return
    for vi in _all_value_infos(inferred.graph):
        value = model.value(vi.name)
        if value is not None and value.const is None:
            _merge(value, vi.type)


def _all_value_infos(graph: onnx.GraphProto):
    yield from graph.value_info
    yield from graph.output
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_value_infos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_value_infos(g)


def _merge(value: Value, type_proto: onnx.TypeProto) -> None:
    before_shape = value.shape
    before_dtype = value.dtype
    apply_type(value, type_proto)
    if before_dtype is not None and value.dtype is None:
        value.dtype = before_dtype
    if before_shape is None or value.shape is None or len(before_shape) != len(value.shape):
        if value.shape is None:
            value.shape = before_shape
        return
    value.shape = tuple(_better(a, b) for a, b in zip(before_shape, value.shape, strict=True))


def _better(old, new):
    if isinstance(old, int):
        return old
    if isinstance(new, int):
        return new
    return old if old is not None else new
