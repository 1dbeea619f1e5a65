"""`infercc inspect`: what a model holds — inputs, outputs, opsets, ops, parameters, FLOPs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.api import _check_shape_names, model_files_size, op_histogram
from infercc.ir import Model, Node, Value, infer_shapes, load_model


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list[int | str | None] | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape}


@dataclass
class InspectReport:
    path: str
    size: int
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    nodes: int
    ops: dict[str, int]
    parameters: int
    parameter_bytes: int
    flops: int
    flops_by_op: dict[str, int]
    flops_unknown_nodes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "opsets": self.opsets,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "nodes": self.nodes,
            "ops": self.ops,
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "flops": self.flops,
            "flops_by_op": self.flops_by_op,
            "flops_unknown_nodes": self.flops_unknown_nodes,
        }


def dtype_name(dtype: int | None) -> str:
    if dtype is None:
        return "?"
    return onnx.TensorProto.DataType.Name(dtype).lower()


def _info(v: Value) -> TensorInfo:
    return TensorInfo(v.name, dtype_name(v.dtype), list(v.shape) if v.shape is not None else None)


def inspect_model(
    path: str | os.PathLike[str], shapes: Mapping[str, tuple[int, ...]] | None = None
) -> InspectReport:
    """Describe a model; FLOPs of Conv/ConvTranspose/MatMul/Gemm at the pinned input shapes."""
    model = load_model(Path(path))
    _check_shape_names(model, shapes)
    inputs = [_info(v) for v in model.graph.inputs]
    outputs = [_info(v) for v in model.graph.outputs]
    _pin_shapes(model, shapes or {})
    infer_shapes(model)
    flops_by_op: dict[str, int] = {}
    unknown: list[str] = []
    for node in model.graph.all_nodes():
        f = node_flops(node)
        if f is None:
            unknown.append(node.name or node.op_type)
        elif f:
            flops_by_op[node.op_type] = flops_by_op.get(node.op_type, 0) + f
    params = [v.const for v in model.graph.initializers.values() if v.const is not None]
    return InspectReport(
        path=str(path),
        size=model_files_size(Path(path), model),
        ir_version=model.ir_version,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        opsets=dict(model.opset_imports),
        inputs=inputs,
        outputs=outputs,
        nodes=sum(1 for _ in model.graph.all_nodes()),
        ops=op_histogram(model),
        parameters=sum(t.size for t in params),
        parameter_bytes=sum(t.nbytes for t in params),
        flops=sum(flops_by_op.values()),
        flops_by_op=flops_by_op,
        flops_unknown_nodes=unknown,
    )


def _pin_shapes(model: Model, shapes: Mapping[str, tuple[int, ...]]) -> None:
    by_name = {v.name: v for v in model.graph.inputs}
    symbols: dict[str, int] = {}
    for name, dims in shapes.items():
        v = by_name[name]
        for d, n in zip(v.shape or (), dims, strict=False):
            if isinstance(d, str):
                symbols[d] = n
    for v in model.graph.inputs:
        if v.name in shapes:
            v.shape = tuple(shapes[v.name])
        elif v.shape is not None:
            v.shape = tuple(symbols.get(d, d) if isinstance(d, str) else d for d in v.shape)
        v.type_proto = None  # export the pinned shape to inference, not the declared one


_FLOP_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul")


def node_flops(node: Node) -> int | None:
    """Multiply-adds x 2 for the compute-heavy ops; 0 for others; None when shapes are unknown."""
    if node.op_type not in _FLOP_OPS:
        return 0
    x, w = node.input(0), node.input(1)
    if x is None or w is None or node.outputs[0] is None:
        return None
    xs, ws, ys = x.static_shape, w.static_shape, node.output.static_shape
    if xs is None or ws is None or ys is None:
        return None
    if node.op_type in ("Conv", "FusedConv"):
        # each output element: C/g * prod(kernel) multiply-adds
        return 2 * int(np.prod(ys)) * int(np.prod(ws[1:]))
    if node.op_type == "ConvTranspose":
        # each input element scatters into M/g * prod(kernel) outputs
        return 2 * int(np.prod(xs)) * int(np.prod(ws[1:]))
    if node.op_type == "Gemm":
        k = xs[0] if node.attr("transA", 0) else xs[-1]
        return 2 * int(np.prod(ys)) * int(k)
    k = xs[-1] if len(xs) >= 1 else 1
    return 2 * int(np.prod(ys)) * int(k)
