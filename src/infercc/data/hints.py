"""What a model's own constants say about the inputs it accepts.

When random inputs at the default sizes make the original model fail, validation tries others
(`infercc.check.profiles`). Two kinds of hint come from the graph itself, every subgraph
included:

- **values**: an input compared with a constant (`Equal(sr, 16000)`, `Greater(mode, 2)`),
  directly or through Cast, Reshape, Squeeze, Unsqueeze, Flatten or Identity, is likely to
  need that value: `x == c` and `x <= c`, `x >= c` suggest c; `x > c` suggests c + 1 and
  `x < c` suggests c - 1 (mirrored when the constant is on the left).
- **sizes**: a shape value (the output of Shape or Size, through Gather, Slice, Squeeze,
  Unsqueeze, Cast, Reshape, Concat, Identity) compared with a constant suggests that constant
  (and the next integer, for strict comparisons) as a size for symbolic dimensions.

A constant is an initializer (of any graph) or the output of a Constant node; only small ones
(at most 16 elements, all equal) count. `skeleton_constants` reads the small main-graph
initializers of a model loaded without its weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from infercc.data.signature import real_inputs
from infercc.ir import dtypes
from infercc.ir.ops import STANDARD_DOMAINS
from infercc.ir.wire import RawSlice

logger = logging.getLogger(__name__)

_MAX_ELEMENTS = 16
_MAX_SIZE = 4096
_MAX_STEPS = 8
# op -> what `x OP c` suggests for x: c + offset
_COMPARISONS = {"Equal": 0, "LessOrEqual": 0, "GreaterOrEqual": 0, "Greater": 1, "Less": -1}
_MIRROR = {"Greater": "Less", "Less": "Greater", "LessOrEqual": "GreaterOrEqual"}
_MIRROR.update({"GreaterOrEqual": "LessOrEqual", "Equal": "Equal"})
_VALUE_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
_SHAPE_PASSTHROUGH = _VALUE_PASSTHROUGH | {"Gather", "Slice", "Concat"}
_SHAPE_SOURCES = frozenset({"Shape", "Size"})


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


def skeleton_constants(
    model: onnx.ModelProto, slices: Sequence[RawSlice | None]
) -> dict[str, np.ndarray]:
    """Small main-graph initializers of a model read by `infercc.ir.wire.read_model` (their
    raw data left in the file), read from the file."""
    found: dict[str, np.ndarray] = {}
    for tensor, where in zip(model.graph.initializer, slices, strict=False):
        row = dtypes.dtype(tensor.data_type)
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        if where is None or row is None or row.numpy is None or count > _MAX_ELEMENTS:
            continue
        if row.numpy.kind not in "iuf" or where.length != count * row.numpy.itemsize:
            continue
        with open(where.path, "rb") as f:
            f.seek(where.offset)
            raw = f.read(where.length)
        found[tensor.name] = np.frombuffer(raw, row.numpy).reshape(tuple(tensor.dims))
    return found


class _Index:
    """Producers and small constants over every graph of a model (names are unique in SSA)."""

    def __init__(self, model: onnx.ModelProto, extra: Mapping[str, np.ndarray] | None = None):
        self.producers: dict[str, onnx.NodeProto] = {}
        self.constants: dict[str, np.ndarray] = dict(extra or {})
        for graph in _graphs(model.graph):
            for init in graph.initializer:
                self._add(init.name, init)
        for node in _nodes(model.graph):
            for out in node.output:
                self.producers[out] = node
            if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS and node.output:
                self._add_constant_node(node)
        self.inputs = {vi.name: vi for vi in real_inputs(model)}

    def _add(self, name: str, tensor: onnx.TensorProto) -> None:
        if name in self.constants or int(np.prod(tensor.dims)) > _MAX_ELEMENTS:
            return
        try:
            self.constants[name] = numpy_helper.to_array(tensor)
        except Exception:  # weights left on disk, or a type numpy cannot hold
            return

    def _add_constant_node(self, node: onnx.NodeProto) -> None:
        for attr in node.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                self._add(node.output[0], attr.t)
            elif attr.name in ("value_int", "value_float"):
                self.constants[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attr))
            elif attr.name in ("value_ints", "value_floats") and len(attr.ints or attr.floats):
                self.constants[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attr))

    def scalar(self, name: str) -> float | None:
        """The value of a small constant whose elements are all equal, else None."""
        array = self.constants.get(name)
        if array is None or array.size == 0 or array.dtype.kind not in "iuf":
            return None
        first = array.flat[0]
        if not bool((array == first).all()):
            return None
        return float(first) if array.dtype.kind == "f" else int(first)

    def source(self, name: str, through: frozenset[str]) -> tuple[str, onnx.NodeProto | None]:
        """Walk back from `name` through `through` ops: the value reached and its producer."""
        for _ in range(_MAX_STEPS):
            node = self.producers.get(name)
            if node is None or node.op_type not in through or not node.input:
                return name, node
            name = node.input[0]
        return name, self.producers.get(name)


def _comparisons(index: _Index, model: onnx.ModelProto) -> Iterator[tuple[str, str, float]]:
    """(operand, op as `operand OP constant`, constant) for each comparison with a constant."""
    for node in _nodes(model.graph):
        offset_op = node.op_type if node.domain in STANDARD_DOMAINS else ""
        if offset_op not in _COMPARISONS or len(node.input) != 2:
            continue
        left, right = node.input
        for operand, other, op in ((left, right, offset_op), (right, left, _MIRROR[offset_op])):
            value = index.scalar(other)
            if value is not None and index.scalar(operand) is None:
                yield operand, op, value


def compared_values(
    model: onnx.ModelProto, constants: Mapping[str, np.ndarray] | None = None
) -> dict[str, list[float]]:
    """Input name -> the values it is compared with (module docstring), in graph order."""
    index = _Index(model, constants)
    found: dict[str, list[float]] = {}
    for operand, op, value in _comparisons(index, model):
        name, _ = index.source(operand, _VALUE_PASSTHROUGH)
        vi = index.inputs.get(name)
        if vi is None or not vi.type.HasField("tensor_type"):
            continue
        row = dtypes.dtype(vi.type.tensor_type.elem_type)
        if row is None or row.numpy is None or row.numpy.kind not in "iuf":
            continue
        if row.numpy.kind == "f" and op != "Equal":
            continue  # a float compared by order: any nearby value is as good as another
        suggestion = value + _COMPARISONS[op] if row.numpy.kind in "iu" else value
        if row.numpy.kind in "iu":
            suggestion = int(suggestion)
        values = found.setdefault(name, [])
        if suggestion not in values:
            values.append(suggestion)
    if found:
        logger.debug("inputs compared with constants: %s", found)
    return found


def compared_sizes(
    model: onnx.ModelProto, constants: Mapping[str, np.ndarray] | None = None
) -> list[int]:
    """Sizes shape values are compared with (module docstring), in graph order."""
    index = _Index(model, constants)
    sizes: list[int] = []
    for operand, op, value in _comparisons(index, model):
        _, node = index.source(operand, _SHAPE_PASSTHROUGH)
        if node is None or node.op_type not in _SHAPE_SOURCES or value != int(value):
            continue
        for size in dict.fromkeys([int(value), int(value) + _COMPARISONS[op]]):
            if 1 < size <= _MAX_SIZE and size not in sizes:
                sizes.append(size)
    return sizes
