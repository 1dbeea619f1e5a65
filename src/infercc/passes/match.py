"""Helpers the rewrite rules match with: constants, producers, readers, the opset.

A *constant* is an initializer or the output of a standard Constant node (`value`,
`value_float(s)`, `value_int(s)`; strings and sparse tensors are not numbers and do not count),
seen through any chain of standard Identity nodes, since Identity(c) is c. Every pass asks
these, so a rule that works on an initializer also works on the Constant node an exporter
wrote in its place, before or without fold-constants.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, TensorProto

from infercc.ir.graph import Graph, Model, Node, Value
from infercc.ir.ops import default_opset as _opset_of
from infercc.ir.tensor import Tensor

# Constant attribute -> (numpy dtype, ONNX dtype) for the forms that are not a tensor.
CONSTANT_ATTRS: dict[str, tuple[type, int]] = {
    "value_float": (np.float32, TensorProto.FLOAT),
    "value_floats": (np.float32, TensorProto.FLOAT),
    "value_int": (np.int64, TensorProto.INT64),
    "value_ints": (np.int64, TensorProto.INT64),
    "value_string": (object, TensorProto.STRING),
    "value_strings": (object, TensorProto.STRING),
}


def producer(value: Value | None, op_type: str | None = None) -> Node | None:
    """The standard-domain node producing `value` (of type `op_type`, when given)."""
    p = value.producer if value is not None else None
    if p is None or not p.is_standard or (op_type is not None and p.op_type != op_type):
        return None
    return p


def through_identity(value: Value) -> Value:
    """`value`, or what the chain of standard Identity nodes producing it reads."""
    while True:
        p = producer(value, "Identity")
        source = p.input(0) if p is not None else None
        if source is None:
            return value
        value = source


def const_tensor(value: Value | None) -> Tensor | None:
    """The constant `value` holds (module docstring), or None."""
    if value is None:
        return None
    value = through_identity(value)
    if value.const is not None:
        return value.const
    p = producer(value, "Constant")
    return None if p is None else constant_node_tensor(p, numeric=True)


def const_value(value: Value | None) -> np.ndarray | None:
    """The constant `value` holds as a numpy array, or None."""
    tensor = const_tensor(value)
    return None if tensor is None else tensor.numpy()


def const_scalar(value: Value | None) -> float | None:
    """The constant `value` holds as a float, when it has exactly one element."""
    data = const_value(value)
    return None if data is None or data.size != 1 else float(data.reshape(()))


def has_perm(node: Node | None, perm: list[int]) -> bool:
    """Whether `node` (a Transpose) has exactly the permutation `perm`."""
    return node is not None and list(node.attr("perm", [])) == perm


def const_ints(value: Value | None) -> list[int] | None:
    """The constant as a list of ints, when it is an integer scalar or 1-D tensor."""
    data = const_value(value)
    if data is None or data.ndim > 1 or not np.issubdtype(data.dtype, np.integer):
        return None
    return [int(x) for x in data.reshape(-1)]


def constant_node_tensor(node: Node, numeric: bool = False) -> Tensor | None:
    """The tensor a Constant node outputs; None for a sparse value, an empty node, external
    data that cannot be read here, or (with `numeric`) strings."""
    model = node.graph.model if node.graph is not None else None
    for key, attr in node.attributes.items():
        if key == "value" and isinstance(attr, AttributeProto):
            if attr.type != AttributeProto.TENSOR:
                return None
            tensor = Tensor.from_proto(attr.t, model.base_dir if model is not None else None)
            if numeric and (tensor.is_external or tensor.dtype == TensorProto.STRING):
                return None
            return tensor
        if key in CONSTANT_ATTRS:
            np_dtype, dtype = CONSTANT_ATTRS[key]
            if numeric and dtype == TensorProto.STRING:
                return None
            return Tensor(np.array(node.attr(key), dtype=np_dtype), dtype=dtype)
    return None


def sole_reader(value: Value | None) -> Node | None:
    """The one node reading `value` (at one or more inputs), when it is no graph output."""
    if value is None or value.is_graph_output:
        return None
    users = value.users()
    return users[0] if len(users) == 1 else None


def bias_add(value: Value | None) -> tuple[Node, Value] | None:
    """The standard Add that alone reads `value` (no graph output) and adds a constant to it:
    that Add and the constant (a projection's bias, when `value` is a MatMul's output)."""
    add = sole_reader(value)
    if add is None or add.op_type != "Add" or not add.is_standard or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] is value else add.inputs[0]
    if other is None or other is value or const_value(other) is None:
        return None
    return add, other


def is_read(value: Value | None) -> bool:
    """Whether a node or the graph's outputs read `value`."""
    return value is not None and (bool(value._uses) or value.is_graph_output)


def is_live(node: Node) -> bool:
    """Whether anything reads one of the node's outputs."""
    return any(is_read(v) for v in node.outputs)


def default_opset(where: Graph | Node | Model | None) -> int:
    """The standard-domain opset of the model that holds `where` (`infercc.ir.ops`)."""
    if isinstance(where, Node):
        where = where.graph
    if isinstance(where, Graph):
        where = where.model
    return _opset_of(where.opset_imports if where is not None else {})
