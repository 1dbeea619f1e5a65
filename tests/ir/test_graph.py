"""IR invariants: use-def links, safe removal, output naming, topological order, lint."""

from __future__ import annotations

import numpy as np
import pytest

from infercc.ir import IRError, Model, Node, Value, export_model, import_model
from tests.helpers import parse, run_ort

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) {
  a = Relu(x)
  b = Sigmoid(a)
  y = Add(a, b)
}
"""


def load(text: str = TEXT) -> Model:
    return import_model(parse(text))


def node(model: Model, op: str) -> Node:
    return next(n for n in model.graph if n.op_type == op)


def test_uses_track_inputs():
    m = load()
    a = m.value("a")
    assert [(n.op_type, i) for n, i in a.uses()] == [("Sigmoid", 0), ("Add", 0)]
    add = node(m, "Add")
    add.set_input(0, m.value("x"))
    assert [(n.op_type, i) for n, i in a.uses()] == [("Sigmoid", 0)]
    assert (add, 0) in dict.fromkeys(m.value("x").uses())
    m.graph.lint()


def test_remove_refuses_while_used_and_for_outputs():
    m = load()
    with pytest.raises(IRError, match="still read"):
        m.graph.remove(node(m, "Relu"))
    with pytest.raises(IRError, match="graph output"):
        m.graph.remove(node(m, "Add"))


def test_replace_all_uses_keeps_output_name():
    m = load()
    g = m.graph
    relu = node(m, "Relu")
    g.replace_all_uses_with(m.value("y"), relu.output)
    g.remove(node(m, "Add"))
    g.remove(node(m, "Sigmoid"))
    g.lint()
    assert [v.name for v in g.outputs] == ["y"]
    assert relu.output.name == "y"
    out = export_model(m)
    x = np.array([[-1, 2, -3, 4]], np.float32)
    np.testing.assert_array_equal(run_ort(out, {"x": x})[0], np.maximum(x, 0))


def test_replace_output_by_graph_input_inserts_identity():
    m = load()
    g = m.graph
    g.replace_all_uses_with(m.value("y"), m.value("x"))
    g.remove(node(m, "Add"))
    g.remove(node(m, "Sigmoid"))
    g.remove(node(m, "Relu"))
    g.lint()
    assert [n.op_type for n in g] == ["Identity"]
    assert g.outputs[0].name == "y"
    assert not g.can_take_output_name(m.value("x"))


def test_replace_output_by_constant_renames_constant():
    m = load()
    g = m.graph
    c = g.make_constant(np.ones((1, 4), np.float32), "ones")
    g.replace_all_uses_with(m.value("y"), c)
    for op in ("Add", "Sigmoid", "Relu"):
        g.remove(node(m, op))
    g.lint()
    assert len(g) == 0 and g.outputs[0] is c and c.name == "y"
    out = export_model(m)
    assert out.graph.output[0].name == "y" and out.graph.initializer[0].name == "y"


def test_make_node_fresh_names_and_insert_before():
    m = load()
    g = m.graph
    add = node(m, "Add")
    neg = g.make_node("Neg", [m.value("b")], before=add)
    add.set_input(1, neg.output)
    g.lint()
    assert [n.op_type for n in g] == ["Relu", "Sigmoid", "Neg", "Add"]
    other = g.make_node("Neg", [m.value("b")], before=add)
    assert other.output.name != neg.output.name and other.name != neg.name


def test_lint_catches_order_and_stale_use():
    m = load()
    g = m.graph
    relu = node(m, "Relu")
    add = node(m, "Add")
    # move Add first: it reads values defined later
    add._prev._next = add._next
    add._next._prev = add._prev
    add._prev = add._next = None
    add.graph = None
    g._len -= 1
    g.insert_before(relu, add)
    with pytest.raises(IRError, match="before it is defined"):
        g.lint()
    g.toposort()
    g.lint()
    assert [n.op_type for n in g] == ["Relu", "Sigmoid", "Add"]


def test_duplicate_value_names_rejected():
    m = load()
    with pytest.raises(IRError, match="duplicate"):
        m.graph.append(Node("Relu", [m.value("x")], [Value("a")]))


def test_toposort_detects_cycle():
    m = load()
    relu, sig = node(m, "Relu"), node(m, "Sigmoid")
    relu.set_input(0, sig.output)
    with pytest.raises(IRError, match="cycle"):
        m.graph.toposort()
