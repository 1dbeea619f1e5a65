"""The rule contract's driver: dispatch by op type, refusals (NoMatch, with the node or value
matching failed at) and bisection limits handled for the rule, rule order, nodes a rewrite
creates, subgraphs."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from infercc.ir import export_model, import_model
from infercc.ir.graph import Node, Value
from infercc.passes import PassContext
from infercc.passes.match import producer
from infercc.passes.rules import NoMatch, Rule, apply_rules, require
from tests.helpers import assert_same_outputs, make_model, op_counts, parse

NEGS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y, float[4] z) {
  [n1] a = Neg(x)
  [n2] b = Neg(a)
  [r] c = Relu(b)
  [n3] d = Neg(c)
  [n4] y = Neg(d)
  [n5] e = Neg(x)
  [n6] z = Neg(e)
}"""


def _double_neg(node: Node, ctx: PassContext) -> Value:
    inner = require(producer(node.input(0), "Neg"))
    if node.output.is_graph_output:
        raise NoMatch("output is a graph output")
    return require(inner.input(0))


def _drop(node: Node, x: Value, ctx: PassContext) -> None:
    graph = node.owning_graph()
    graph.replace_all_uses_with(node.output, x)
    graph.remove(node)


DOUBLE_NEG = Rule("double_neg", ("Neg",), _double_neg, _drop)


def _ctx(limit: int | None = None) -> PassContext:
    ctx = PassContext(current_pass="test")
    if limit is not None:
        ctx.rewrite_limits = {"test": limit}
    return ctx


def test_a_rule_fires_on_its_anchors_and_the_driver_records_refusals() -> None:
    proto = parse(NEGS)
    model = import_model(proto)
    ctx = _ctx()
    run = apply_rules(model.graph, ctx, [DOUBLE_NEG])
    model.graph.lint()
    assert run.counts == {"double_neg": 1}  # n2; n4 and n6 are graph outputs
    assert [(n.name, r) for n, r in run.refused] == [
        ("n4", "output is a graph output"),
        ("n6", "output is a graph output"),
    ]
    assert [(r.node, r.reason) for r in ctx.refusals] == [(n.name, r) for n, r in run.refused]
    # no `at`: matching failed at the anchor itself
    assert [r.at for r in ctx.refusals] == ["'n4' (Neg)", "'n6' (Neg)"]
    assert ctx.rewrites["test"] == [("n2", "Neg")]
    out = export_model(model)
    assert op_counts(out) == {"Neg": 5, "Relu": 1}
    assert_same_outputs(proto, out)


def test_the_driver_asks_allow_rewrite_and_stops_at_the_limit() -> None:
    text = NEGS.replace("=> (float[4] y, float[4] z)", "=> (float[4] w)")
    proto = parse(text.replace("[n6] z = Neg(e)", "[n6] z = Neg(e)\n  [s] w = Sum(y, z)"))
    full = apply_rules(import_model(proto).graph, _ctx(), [DOUBLE_NEG])
    assert full.counts["double_neg"] == 3  # n2, n4, n6
    model = import_model(proto)
    ctx = _ctx(limit=1)
    run = apply_rules(model.graph, ctx, [DOUBLE_NEG])
    assert run.counts == {"double_neg": 1} and run.refused == []
    assert ctx.rewrites["test"] == [("n2", "Neg")]
    assert op_counts(export_model(model))["Neg"] == 5


def test_standard_only_and_wildcard_rules() -> None:
    seen: list[str] = []

    def look(node: Node, ctx: PassContext):
        seen.append(node.op_type)
        raise NoMatch()

    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Thing", ["a"], ["b"], domain="custom"),
            helper.make_node("Neg", ["b"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]
    proto = make_model(graph, opset_imports=opsets)
    model = import_model(proto)
    apply_rules(model.graph, _ctx(), [Rule("look", None, look, _drop)])
    assert seen == ["Relu", "Neg"]
    seen.clear()
    apply_rules(model.graph, _ctx(), [Rule("look", None, look, _drop, standard_only=False)])
    assert seen == ["Relu", "Thing", "Neg"]


def test_rules_are_tried_in_order_a_refusal_lets_the_next_try_a_match_ends_it() -> None:
    calls: list[str] = []

    def refuse(node, ctx):
        calls.append("refuse")
        raise NoMatch("not this way")

    def match(node, ctx):
        calls.append("match")
        return node.input(0)

    def never(node, ctx):
        calls.append("never")
        return node.input(0)

    rules = [
        Rule("a", ("Relu",), refuse, _drop),
        Rule("b", ("Relu",), match, _drop),
        Rule("c", ("Relu",), never, _drop),
    ]
    model = import_model(parse(NEGS))
    run = apply_rules(model.graph, _ctx(), rules)
    assert calls == ["refuse", "match"]
    assert run.counts == {"b": 1} and [r for _, r in run.refused] == ["not this way"]


def test_a_match_with_a_key_counts_under_it() -> None:
    class Keyed:
        key = "relu_gone"

        def __init__(self, x):
            self.x = x

    def check(node, ctx):
        return Keyed(node.input(0))

    def rewrite(node, found, ctx):
        _drop(node, found.x, ctx)

    rule = Rule("relu", ("Relu",), check, rewrite)
    run = apply_rules(import_model(parse(NEGS)).graph, _ctx(), [rule])
    assert run.counts == {"relu_gone": 1}


def test_nodes_a_rewrite_creates_are_visited_next() -> None:
    """Relu -> Abs(Neg(.)) is rewritten, and the created Neg meets the Neg rule at once."""
    order: list[str] = []

    def relu(node: Node, ctx):
        return True

    def expand(node: Node, _, ctx) -> list[Node]:
        graph = node.graph
        neg = graph.make_node("Neg", [node.input(0)], before=node, name="made_neg")
        node.op_type = "Abs"
        node.set_input(0, neg.output)
        return [neg]

    def neg(node: Node, ctx):
        order.append(node.name)
        raise NoMatch()

    model = import_model(parse(NEGS))
    rules = [Rule("relu", ("Relu",), relu, expand), Rule("neg", ("Neg",), neg, _drop)]
    apply_rules(model.graph, _ctx(), rules)
    assert [n.split("__")[0] for n in order] == ["n1", "n2", "made_neg", "n3", "n4", "n5", "n6"]


def _loop_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Neg", ["v"], ["n"], name="inner1"),
            helper.make_node("Neg", ["n"], ["v_out"], name="inner2"),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)],
        "g",
        [
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("subgraphs", [True, False])
def test_subgraphs_are_walked_unless_asked_not_to(subgraphs: bool) -> None:
    model = import_model(_loop_model())
    run = apply_rules(model.graph, _ctx(), [DOUBLE_NEG], subgraphs=subgraphs)
    assert not run.counts  # inner2's output is the body's output
    assert [n.name for n, _ in run.refused] == (["inner2"] if subgraphs else [])


def test_a_refusal_names_the_node_or_value_where_matching_failed() -> None:
    """NoMatch(reason, at=...) records the anchor and where the match failed (a node by name
    and op, a value as a tensor); a bare NoMatch() is no refusal, and require() narrows."""

    def at_producer(node: Node, ctx: PassContext) -> Value:
        inner = require(producer(node.input(0), "Neg"))  # no Neg before: quietly none
        if node.output.is_graph_output:
            raise NoMatch("output is a graph output", at=inner)
        raise NoMatch("the input is not wanted", at=require(inner.input(0)))

    ctx = _ctx()
    rule = Rule("t", ("Neg",), at_producer, _drop)
    run = apply_rules(import_model(parse(NEGS)).graph, ctx, [rule])
    assert not run.counts
    got = [(r.node, r.op_type, r.reason, r.at) for r in ctx.refusals]
    assert got == [
        ("n2", "Neg", "the input is not wanted", "tensor 'x'"),
        ("n4", "Neg", "output is a graph output", "'n3' (Neg)"),
        ("n6", "Neg", "output is a graph output", "'n5' (Neg)"),
    ]
    assert ctx.refusals[0].to_dict()["at"] == "tensor 'x'"
