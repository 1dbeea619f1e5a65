"""`ctx.rewrite_limits` inside the real passes: with a limit of k a pass makes exactly its first k
rewrites (the ones it makes without a limit, in the same order), the graph shows those and no
others, the outputs stay right, and a limit of 0 changes nothing and reports changed=False."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.ir import export_model, import_model
from infercc.ir.graph import Model, Node
from infercc.ir.shapes import infer_shapes
from infercc.passes import REGISTRY, PassContext, PassResult, run_passes
from tests.helpers import assert_same_outputs, make_model, parse

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'

FOLD = (
    HEADER
    + """
g (float[2, 3] x) => (float[2, 3] y) {
  [c1] k1 = Constant <value = float[3] {1, 2, 3}> ()
  [c2] k2 = Constant <value = float[3] {4, 5, 6}> ()
  [s] s = Add(k1, k2)
  [shape] sh = Shape(x)
  [cond] c = Constant <value = bool {1}> ()
  [if] b = If(c) <then_branch = t () => (float[2, 3] ty) { ty = Neg(x) },
                  else_branch = e () => (float[2, 3] ey) { ey = Identity(x) }>
  [add] a = Add(b, s)
  [reshape] y = Reshape(a, sh)
}"""
)

SHAPES = (
    HEADER
    + """
g (float[batch, 6, 8] x) => (float[batch, 6, 8] y) <int64[1] i1 = {1}, int64[1] i2 = {2}> {
  [shape] sh = Shape(x)
  [g1] a = Gather <axis = 0> (sh, i1)
  [g2] b = Gather <axis = 0> (sh, i2)
  [mul] m = Mul(a, b)
  [cast] f = Cast <to = 1> (m)
  [relu] r = Relu(x)
  [expand] e = Expand(r, sh)
  [div] y = Div(e, f)
}"""
)

NO_OPS = (
    HEADER
    + """
g (float[2, 3, 4] x) => (float[4, 6] y) <int64[2] s1 = {6, 4}, int64[2] s2 = {4, 6}> {
  [id] a = Identity(x)
  [relu] b = Relu(a)
  [t1] t1 = Transpose <perm = [1, 0, 2]> (b)
  [t2] t2 = Transpose <perm = [0, 2, 1]> (t1)
  [cast] c = Cast <to = 1> (t2)
  [neg] d = Neg(c)
  [r1] r1 = Reshape(d, s1)
  [r2] y = Reshape(r1, s2)
}"""
)

CSE = (
    HEADER
    + """
g (float[4] x) => (float[4] y) <float[4] k1 = {1, 2, 3, 4}, float[4] k2 = {1, 2, 3, 4}> {
  [a1] a1 = Relu(x)
  [a2] a2 = Relu(x)
  [b1] b1 = Sigmoid(x)
  [b2] b2 = Sigmoid(x)
  [p] p = Add(x, k1)
  [q] q = Mul(x, k2)
  [s] s = Sum(a1, a2, b1, b2)
  [y] y = Sum(s, p, q)
}"""
)

FP16 = (
    HEADER
    + """
g (float[2, 4] x) => (float[2, 4] y) {
  [relu] a = Relu(x)
  [neg] b = Neg(a)
  [exp] e = Exp(b)
  [tanh] c = Tanh(e)
  [abs] y = Abs(c)
}"""
)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def conv_bn_model() -> onnx.ModelProto:
    """Three Convs on x: two followed by BatchNormalization, one by a per-channel Mul; each
    then a Relu (fused into FusedConv on the CPU). A fourth Conv's BatchNormalization is refused
    (the Conv's output has another reader)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i in (1, 2, 3, 4):
        inits += [_init(f"w{i}", rng.standard_normal((4, 2, 3, 3))), _init(f"b{i}", rng.random(4))]
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}"))
        if i != 3:
            params = [f"g{i}", f"be{i}", f"m{i}", f"v{i}"]
            inits += [_init(p, rng.random(4) + 0.5) for p in params]
            nodes.append(
                helper.make_node("BatchNormalization", [f"c{i}", *params], [f"n{i}"], f"bn{i}")
            )
        else:
            inits.append(_init("scale", rng.random((4, 1, 1)) + 0.5))
            nodes.append(helper.make_node("Mul", ["c3", "scale"], ["n3"], "mul3"))
        if i != 4:
            nodes.append(helper.make_node("Relu", [f"n{i}"], [f"r{i}"], f"relu{i}"))
    nodes.append(helper.make_node("Sum", ["r1", "r2", "r3", "n4", "c4"], ["y"], "sum"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_act_model() -> onnx.ModelProto:
    """Three Convs on x, each read only by a Relu (each fuses into a FusedConv on the CPU); a
    fourth Conv's Relu is refused (the Conv's output has another reader)."""
    rng = np.random.default_rng(2)
    nodes, inits = [], []
    for i in (1, 2, 3, 4):
        inits += [_init(f"w{i}", rng.standard_normal((4, 2, 3, 3))), _init(f"b{i}", rng.random(4))]
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], f"relu{i}"))
    nodes.append(helper.make_node("Sum", ["r1", "r2", "r3", "r4", "c4"], ["y"], "sum"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def qkv_model() -> onnx.ModelProto:
    """Three activations of x, each read by two MatMuls with constant weights."""
    rng = np.random.default_rng(1)
    nodes, inits, outs = [], [], []
    for i, act in enumerate(("Relu", "Tanh", "Sigmoid"), start=1):
        nodes.append(helper.make_node(act, ["x"], [f"h{i}"], f"act{i}"))
        for part in "ab":
            inits.append(_init(f"w{i}{part}", rng.standard_normal((8, 4))))
            nodes.append(
                helper.make_node(
                    "MatMul", [f"h{i}", f"w{i}{part}"], [f"o{i}{part}"], f"mm{i}{part}"
                )
            )
            outs.append(f"o{i}{part}")
    nodes.append(helper.make_node("Sum", outs, ["y"], "sum"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


Key = Callable[[Node | None], Hashable]


def _present(node: Node | None) -> Hashable:
    """Folding, fusing and merging remove the node they are named by."""
    return node is not None


def _inputs(node: Node | None) -> Hashable:
    """No-op forwarding removes the node; rewiring a pair changes its input."""
    return None if node is None else tuple(v.name if v else "" for v in node.inputs)


def _dtypes(node: Node | None) -> Hashable:
    """A node converted to float16 has float16 outputs."""
    assert node is not None
    return tuple(v.dtype if v else None for v in node.outputs)


@dataclass
class Case:
    pass_name: str
    build: Callable[[], onnx.ModelProto]
    rewrites: list[str]  # the nodes named by the rewrites of one unlimited run, in order
    key: Key  # what a rewrite named by a node changes about that node
    atol: float = 1e-5


CASES = [
    Case("fold-constants", lambda: parse(FOLD), ["c1", "c2", "s", "shape", "cond", "if"], _present),
    Case("fold-shapes", lambda: parse(SHAPES), ["g1", "g2", "expand"], _present),
    Case("eliminate-no-ops", lambda: parse(NO_OPS), ["id", "t2", "cast", "r2"], _inputs),
    Case("eliminate-common-subexpressions", lambda: parse(CSE), ["q", "a2", "b2"], _inputs),
    Case("fuse-conv-bn-relu", conv_bn_model, ["bn1", "bn2", "mul3"], _present, atol=1e-4),
    Case("fuse-conv-activation", conv_act_model, ["relu1", "relu2", "relu3"], _present),
    Case("fuse-qkv", qkv_model, ["mm1a", "mm2a", "mm3a"], _present),
    Case("convert-fp16", lambda: parse(FP16), ["relu", "neg", "tanh", "abs"], _dtypes, atol=1e-2),
]
IDS = [c.pass_name for c in CASES]


def _model(case: Case) -> Model:
    model = import_model(case.build())
    infer_shapes(model)
    return model


def _run_once(case: Case, limit: int | None) -> tuple[Model, PassContext, PassResult]:
    """One run of the pass, as the pass manager would start it."""
    model = _model(case)
    ctx = PassContext()
    ctx.current_pass = case.pass_name
    if limit is not None:
        ctx.rewrite_limits = {case.pass_name: limit}
    result = REGISTRY[case.pass_name].fn(model.graph, ctx)
    model.graph.lint()
    return model, ctx, result


def _node(model: Model, name: str) -> Node | None:
    return next((n for n in model.graph.all_nodes() if n.name == name), None)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_without_a_limit_every_rewrite_is_logged_in_order(case: Case) -> None:
    _, ctx, result = _run_once(case, None)
    assert result.changed
    assert [name for name, _ in ctx.rewrites[case.pass_name]] == case.rewrites


@pytest.mark.parametrize("name", ["fuse-conv-bn-relu", "convert-fp16"])
def test_a_refused_rewrite_is_not_counted(name: str) -> None:
    """The hook comes after every check: bn4 and exp are refused, never logged."""
    _, ctx, _ = _run_once(CASES[IDS.index(name)], None)
    refused = {r.node for r in ctx.refusals}
    assert refused & {"bn4", "exp"}
    assert not refused & {node for node, _ in ctx.rewrites[name]}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_limit_of_k_makes_exactly_the_first_k_rewrites(case: Case) -> None:
    original = _model(case)
    before = {name: case.key(_node(original, name)) for name in case.rewrites}
    full = _run_once(case, None)[1].rewrites[case.pass_name]
    for k in range(1, len(case.rewrites) + 1):
        model, ctx, result = _run_once(case, k)
        assert ctx.rewrites[case.pass_name] == full[:k]
        assert result.changed
        after = {name: case.key(_node(model, name)) for name in case.rewrites}
        done = [name for name in case.rewrites if after[name] != before[name]]
        assert done == case.rewrites[:k], f"limit {k}"
        assert_same_outputs(case.build(), export_model(model), atol=case.atol, rtol=case.atol)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_limit_of_zero_leaves_the_graph_as_it_was(case: Case) -> None:
    untouched = export_model(_model(case)).SerializeToString()
    model, ctx, result = _run_once(case, 0)
    assert not result.changed
    assert ctx.rewrites[case.pass_name] == []
    assert not {r.node for r in ctx.refusals} & set(case.rewrites)  # a cut is no refusal
    assert export_model(model).SerializeToString() == untouched


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_limited_pass_reaches_the_fixpoint(case: Case) -> None:
    for k in range(len(case.rewrites)):
        model = import_model(case.build())
        ctx = PassContext(rewrite_limits={case.pass_name: k}, verify=True)
        report = run_passes(model, ctx, [case.pass_name])
        assert report.reached_fixpoint
        assert len(ctx.rewrites[case.pass_name]) == k
        assert report.passes[case.pass_name].changed == (1 if k else 0)


def test_a_cut_rewrite_is_not_recorded_as_a_refusal() -> None:
    case = CASES[IDS.index("convert-fp16")]
    _, ctx, result = _run_once(case, 1)
    assert [r.node for r in ctx.refusals] == ["exp"]  # neg, tanh, abs were cut off
    assert [k["node"] for k in result.details.kept_fp32] == ["exp"]
