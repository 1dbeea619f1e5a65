"""The integer shape ops concrete_types computes with numpy give onnxruntime's own result."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infercc.ir.shapes import _integer_value
from tests.helpers import make_model

I64 = np.int64
CASES = [
    ("Add", {}, [np.array([3, -2], I64), np.array([4, 5], I64)], 17),
    ("Sub", {}, [np.array([3, 2], I64), np.array(7, I64)], 17),
    ("Mul", {}, [np.array([2**40, 3], I64), np.array([2**30, -1], I64)], 17),
    ("Range", {}, [np.array(0, I64), np.array(10, I64), np.array(3, I64)], 17),
    ("Range", {}, [np.array(5, I64), np.array(-1, I64), np.array(-2, I64)], 17),
    ("Unsqueeze", {}, [np.array([4, 5], I64), np.array([0, -1], I64)], 17),
    ("Unsqueeze", {"axes": [1]}, [np.array([4, 5], I64)], 11),
    ("Squeeze", {}, [np.zeros((1, 3, 1), I64), np.array([-1], I64)], 17),
    ("Squeeze", {}, [np.zeros((1, 3, 1), I64), np.array([], I64)], 17),
    ("Squeeze", {}, [np.zeros((1, 3, 1), I64)], 17),
    ("Concat", {"axis": 0}, [np.array([1, 2], I64), np.array([3], I64)], 17),
    ("Gather", {"axis": 0}, [np.array([7, 8, 9], I64), np.array(-1, I64)], 17),
    ("Gather", {"axis": 0}, [np.array([7, 8, 9], I64), np.array([0, 2], I64)], 17),
    ("Cast", {"to": TensorProto.INT64}, [np.array([1, -2], np.int32)], 17),
]


def _onnxruntime(op, attrs, inputs, opset):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [onnx.numpy_helper.from_array(a, n) for a, n in zip(inputs, names, strict=True)],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {})[0], node


@pytest.mark.parametrize(("op", "attrs", "inputs", "opset"), CASES)
def test_numpy_value_is_onnxruntimes(op, attrs, inputs, opset):
    want, node = _onnxruntime(op, attrs, inputs, opset)
    data = {f"i{k}": a for k, a in enumerate(inputs)}
    got = _integer_value(node, data, opset)
    assert got is not None
    assert got[0].dtype == want.dtype and got[0].shape == want.shape
    np.testing.assert_array_equal(got[0], want)


def test_other_ops_and_float_inputs_are_left_to_the_evaluator():
    node = helper.make_node("Div", ["a", "b"], ["y"])
    assert _integer_value(node, {"a": np.array([7], I64), "b": np.array([2], I64)}, 17) is None
    node = helper.make_node("Add", ["a", "b"], ["y"])
    floats = {"a": np.array([1.0]), "b": np.array([2.0])}
    assert _integer_value(node, floats, 17) is None
    node = helper.make_node("Gather", ["a", "b"], ["y"], axis=0)
    out_of_range = {"a": np.array([1, 2], I64), "b": np.array(5, I64)}
    assert _integer_value(node, out_of_range, 17) is None
