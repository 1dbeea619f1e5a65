"""The graph IR: Value, Node, Graph, Model, and the ONNX importer and exporter."""

from __future__ import annotations

from infercc.ir.exporter import export_model, save_model
from infercc.ir.graph import Graph, IRError, Model, Node, Value
from infercc.ir.importer import import_model, load_model
from infercc.ir.shapes import infer_shapes
from infercc.ir.tensor import Tensor

__all__ = [
    "Graph",
    "IRError",
    "Model",
    "Node",
    "Tensor",
    "Value",
    "export_model",
    "import_model",
    "infer_shapes",
    "load_model",
    "save_model",
]
