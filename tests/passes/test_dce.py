"""eliminate-dead-code: what no output depends on goes (nodes, initializers, functions, opset
imports, inside subgraphs too); graph inputs, outputs and what they need stay."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infercc.ir import export_model, import_model
from infercc.passes import PassContext
from infercc.passes.dce import eliminate_dead_code
from tests.helpers import assert_same_outputs, make_model, op_counts, optimize_proto, parse

DEAD = """
<ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
g (float[2, 4] x) => (float[2, 4] y) <float[4] w = {1, 2, 3, 4}, float[4] unused = {0, 0, 0, 0}> {
  a = Relu(x)
  dead1 = Neg(a)
  dead2 = Sigmoid(dead1)
  y = Add(a, w)
}"""


def _dce(proto: onnx.ModelProto):
    model = import_model(proto)
    result = eliminate_dead_code(model.graph, PassContext())
    model.graph.lint()
    return model, result


def test_dead_nodes_initializers_and_opsets_go() -> None:
    proto = parse(DEAD)
    model, result = _dce(proto)
    assert result.changed
    assert result.stats == {"nodes": 2, "initializers": 1, "functions": 0, "opsets": 1}
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    assert op_counts(out) == {"Relu": 1, "Add": 1}
    assert [t.name for t in out.graph.initializer] == ["w"]
    assert {o.domain for o in out.opset_import} == {""}
    assert_same_outputs(proto, out)


def test_a_second_run_changes_nothing() -> None:
    model, _ = _dce(parse(DEAD))
    again = eliminate_dead_code(model.graph, PassContext())
    assert not again.changed
    assert again.stats == {"nodes": 0, "initializers": 0, "functions": 0, "opsets": 0}


def test_graph_inputs_outputs_and_a_constant_output_stay() -> None:
    proto = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, float[2] spare) => (float[2] y, float[2] k) <float[2] k = {5, 6}> {
  y = Neg(x)
}""")
    model, result = _dce(proto)
    assert not result.changed
    out = export_model(model)
    assert [i.name for i in out.graph.input] == ["x", "spare"]
    assert [o.name for o in out.graph.output] == ["y", "k"]
    assert [t.name for t in out.graph.initializer] == ["k"]


def test_a_node_with_one_live_output_stays_whole() -> None:
    proto = parse("""
<ir_version: 8, opset_import: ["" : 18]>
g (float[4, 2] x) => (float[2, 2] y) {
  a, b = Split <axis = 0, num_outputs = 2> (x)
  y = Neg(a)
}""")
    model, result = _dce(proto)
    assert result.stats["nodes"] == 0
    assert op_counts(export_model(model)) == {"Split": 1, "Neg": 1}


def _if_model() -> onnx.ModelProto:
    """An If whose then branch holds a dead node and reads an outer value; the outer graph has
    a dead node too."""
    then_nodes = [
        helper.make_node("Neg", ["x"], ["t_dead"]),
        helper.make_node("Relu", ["x"], ["t_out"]),
    ]
    then_g = helper.make_graph(
        then_nodes, "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [2])],
    )
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["outer_dead"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_dead_nodes_inside_subgraphs_go_and_outer_reads_stay() -> None:
    proto = _if_model()
    model, result = _dce(proto)
    assert result.stats["nodes"] == 2  # outer_dead, and t_dead inside the then branch
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    (then_branch,) = [a.g for a in out.graph.node[0].attribute if a.name == "then_branch"]
    assert [n.op_type for n in then_branch.node] == ["Relu"]
    x = np.array([-1.0, 2.0], np.float32)
    for cond in (True, False):
        feeds = {"c": np.array(cond), "x": x}
        assert_same_outputs(proto, out, feeds)


def _with_functions() -> onnx.ModelProto:
    """`used` calls `inner`; `orphan` is called by nobody."""
    std = [helper.make_opsetid("", 17)]
    inner = helper.make_function(
        "local", "inner", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], std
    )
    used = helper.make_function(
        "local",
        "used",
        ["a"],
        ["b"],
        [helper.make_node("inner", ["a"], ["b"], domain="local")],
        [*std, helper.make_opsetid("local", 1)],
    )
    orphan = helper.make_function(
        "other", "orphan", ["a"], ["b"], [helper.make_node("Abs", ["a"], ["b"])], std
    )
    graph = helper.make_graph(
        [helper.make_node("used", ["x"], ["y"], domain="local")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in (("", 17), ("local", 1), ("other", 1))]
    model = make_model(graph, opset_imports=opsets, functions=[inner, used, orphan])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_functions_nobody_calls_go_with_their_domain() -> None:
    proto = _with_functions()
    model, result = _dce(proto)
    assert result.stats["functions"] == 1 and result.stats["opsets"] == 1
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    assert sorted(f.name for f in out.functions) == ["inner", "used"]  # called through `used`
    assert {o.domain for o in out.opset_import} == {"", "local"}
    assert_same_outputs(proto, out, {"x": np.array([1.0, -2.0], np.float32)})


def test_the_default_domain_import_stays_without_standard_nodes() -> None:
    proto = _with_functions()
    model, _ = _dce(proto)
    assert "" in model.opset_imports


def test_in_the_pipeline_dead_code_left_by_other_passes_goes() -> None:
    proto = parse(DEAD)
    w2 = numpy_helper.from_array(np.ones(4, np.float32), "w2")
    proto.graph.initializer.append(w2)
    out, report = optimize_proto(proto, ["eliminate-dead-code"])
    assert report.reached_fixpoint and report.passes["eliminate-dead-code"].runs == 2
    assert report.passes["eliminate-dead-code"].counts["initializers"] == 2
    assert_same_outputs(proto, out)


FUNCTION_IN_A_BRANCH = """
<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
g (float[2] x, bool c) => (float[2] y) {
  y = local.outer(x, c)
}
<domain: "local", opset_import: ["" : 17, "local" : 1]>
outer (a, flag) => (b) {
  b = If(flag) <then_branch = t () => (float[2] tb) { tb = local.inner(a) },
                else_branch = e () => (float[2] eb) { eb = Neg(a) }>
}
<domain: "local", opset_import: ["" : 17]>
inner (p) => (q) {
  q = Relu(p)
}
"""


def test_a_function_called_only_from_a_branch_of_a_function_stays() -> None:
    # regression (issue 12 item 7): `inner` is called only inside an If of `outer`'s body;
    # it was removed and the model no longer loaded
    proto = onnx.parser.parse_model(FUNCTION_IN_A_BRANCH)
    onnx.checker.check_model(proto, full_check=True)
    model, result = _dce(proto)
    assert result.stats["functions"] == 0
    out = export_model(model)
    assert sorted(f.name for f in out.functions) == ["inner", "outer"]
    onnx.checker.check_model(out, full_check=True)
    for flag in (True, False):
        feeds = {"x": np.array([1.0, -2.0], np.float32), "c": np.array(flag)}
        assert_same_outputs(proto, out, feeds)
