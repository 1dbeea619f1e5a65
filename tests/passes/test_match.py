"""The match helpers: constants in every form (through Identity), ints, producers, readers, and
the default opset with its one fallback."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.ir import import_model
from infercc.ir.graph import Graph, Model, Node, Value
from infercc.passes.match import (
    const_ints,
    const_tensor,
    const_value,
    default_opset,
    is_live,
    producer,
    sole_reader,
    through_identity,
)
from tests.helpers import make_model, parse

CONSTANTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x) => (float[3] y) <float[3] w = {1, 2, 3}> {
  t = Constant <value = float[3] {4, 5, 6}> ()
  f = Constant <value_float = 2.5> ()
  fs = Constant <value_floats = [1.0, 2.0]> ()
  i = Constant <value_int = 7> ()
  ints = Constant <value_ints = [1, -1, 0]> ()
  s = Constant <value_string = "hi"> ()
  w1 = Identity(w)
  w2 = Identity(w1)
  tt = Identity(t)
  a = Add(x, w2)
  b = Mul(a, tt)
  y = Sub(b, x)
}"""


@pytest.fixture(scope="module")
def values() -> dict[str, Value]:
    model = import_model(parse(CONSTANTS))
    found: dict[str, Value] = {v.name: v for v in model.graph.initializers.values()}
    for node in model.graph:
        for v in node.outputs:
            found[v.name] = v
    found.update({v.name: v for v in model.graph.inputs})
    return found


@pytest.mark.parametrize(
    ("name", "expected", "dtype"),
    [
        ("w", [1, 2, 3], np.float32),
        ("t", [4, 5, 6], np.float32),
        ("f", 2.5, np.float32),
        ("fs", [1.0, 2.0], np.float32),
        ("i", 7, np.int64),
        ("ints", [1, -1, 0], np.int64),
        ("w2", [1, 2, 3], np.float32),  # two Identities
        ("tt", [4, 5, 6], np.float32),  # Identity of a Constant node
    ],
)
def test_const_value_reads_every_constant_form(values, name, expected, dtype) -> None:
    data = const_value(values[name])
    assert data is not None and data.dtype == dtype
    np.testing.assert_array_equal(data, np.asarray(expected, dtype))
    assert const_tensor(values[name]) is not None


@pytest.mark.parametrize("name", ["x", "a", "y", "s"])
def test_what_is_not_a_numeric_constant(values, name) -> None:
    assert const_value(values[name]) is None and const_tensor(values[name]) is None


def test_const_value_of_none_is_none() -> None:
    assert const_value(None) is None and const_ints(None) is None


def test_const_ints(values) -> None:
    assert const_ints(values["ints"]) == [1, -1, 0]
    assert const_ints(values["i"]) == [7]
    assert const_ints(values["w"]) is None  # float
    assert const_ints(values["x"]) is None


def test_through_identity_and_producer(values) -> None:
    assert through_identity(values["w2"]) is values["w"]
    assert through_identity(values["a"]) is values["a"]
    assert producer(values["a"], "Add").op_type == "Add"
    assert producer(values["a"], "Mul") is None
    assert producer(values["a"]).op_type == "Add"
    assert producer(values["x"]) is None and producer(None) is None


def test_a_non_standard_identity_or_constant_is_not_seen_through() -> None:
    ones = numpy_helper.from_array(np.ones(2, np.float32))
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["w"], ["wi"], domain="custom"),
            helper.make_node("Constant", [], ["k"], domain="custom", value=ones),
            helper.make_node("Add", ["x", "wi"], ["a"]),
            helper.make_node("Add", ["a", "k"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]
    model = import_model(make_model(graph, opset_imports=opsets))
    adds = [n for n in model.graph if n.op_type == "Add"]
    assert const_value(adds[0].input(1)) is None
    assert const_value(adds[1].input(1)) is None


def test_sole_reader_and_liveness(values) -> None:
    a, b = values["a"], values["b"]
    assert sole_reader(a).op_type == "Mul"
    assert sole_reader(values["x"]) is None  # read by Add and Sub
    assert sole_reader(values["y"]) is None  # a graph output
    assert is_live(a.producer) and is_live(values["y"].producer)
    assert sole_reader(b).op_type == "Sub"


def test_a_node_reading_a_value_twice_is_its_sole_reader() -> None:
    model = import_model(
        parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  a = Relu(x)
  y = Add(a, a)
}""")
    )
    relu = model.graph.nodes[0]
    assert sole_reader(relu.output) is model.graph.nodes[1]


def _opset_model(imports: dict[str, int]) -> Model:
    graph = helper.make_graph(
        [],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in imports.items()]
    return import_model(make_model(graph, opset_imports=opsets))


def test_default_opset_reads_either_spelling_and_has_one_fallback() -> None:
    assert default_opset(_opset_model({"": 13})) == 13
    assert default_opset(_opset_model({"ai.onnx": 11})) == 11
    latest = onnx.defs.onnx_opset_version()
    assert default_opset(_opset_model({"custom": 1})) == latest
    assert default_opset(None) == latest
    assert default_opset(Graph("loose")) == latest  # a graph in no model


def test_default_opset_of_a_node_and_a_graph(values) -> None:
    node: Node = values["a"].producer
    assert default_opset(node) == 17 and default_opset(node.graph) == 17
