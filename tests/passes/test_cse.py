"""eliminate-common-subexpressions: duplicates merge; random ops, outputs and attributes guard."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tests.helpers import assert_same_outputs, make_model, op_counts, optimize_proto, parse

PASSES = ["eliminate-common-subexpressions", "eliminate-dead-code"]


def counts(text: str):
    proto = parse(text)
    out, report = optimize_proto(proto, PASSES)
    assert_same_outputs(proto, out)
    return op_counts(out), report.passes["eliminate-common-subexpressions"].counts, out


def test_duplicate_shape_chains_merge():
    ops, stats, _ = counts("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] x) => (float[B, S, 2, 4] q, float[B, S, 2, 4] k) {
  s1 = Shape(x)
  s2 = Shape(x)
  i0 = Constant <value = int64[1] {0}> ()
  i1 = Constant <value = int64[1] {0}> ()
  b1 = Gather <axis = 0> (s1, i0)
  b2 = Gather <axis = 0> (s2, i1)
  tail = Constant <value = int64[3] {-1, 2, 4}> ()
  shp1 = Concat <axis = 0> (b1, tail)
  shp2 = Concat <axis = 0> (b2, tail)
  q = Reshape(x, shp1)
  k = Reshape(x, shp2)
}""")
    assert ops == {"Shape": 1, "Gather": 1, "Concat": 1, "Reshape": 2, "Constant": 2}
    assert stats["nodes"] == 4  # the Shape, the two equal Constant nodes, Gather, Concat


def test_equal_small_constants_merge_then_their_readers():
    proto = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
  a = Add(x, c1)
  b = Add(x, c2)
  y = Mul(a, b)
}""")
    for name in ("c1", "c2"):
        proto.graph.initializer.append(
            numpy_helper.from_array(np.arange(4, dtype=np.float32), name)
        )
    out, report = optimize_proto(proto, PASSES)
    assert_same_outputs(proto, out)
    assert report.passes["eliminate-common-subexpressions"].counts == {"constants": 1, "nodes": 1}
    assert op_counts(out) == {"Add": 1, "Mul": 1} and len(out.graph.initializer) == 1


def test_different_attributes_or_inputs_do_not_merge():
    ops, stats, _ = counts("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x, float[2, 3] z) => (float[3, 2] a, float[3, 2] b, float[2, 3] c, float[2, 3] d) {
  a = Transpose <perm = [1, 0]> (x)
  b = Transpose <perm = [1, 0]> (z)
  c = Softmax <axis = 0> (x)
  d = Softmax <axis = 1> (x)
}""")
    assert stats == {"constants": 0, "nodes": 0}
    assert ops == {"Transpose": 2, "Softmax": 2}


def test_random_ops_and_graph_outputs_stay():
    ops, stats, _ = counts("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y1, float[2] y2, float[2] s) <float zero = {0.0}> {
  y1 = Relu(x)
  y2 = Relu(x)
  r1 = RandomNormalLike(x)
  r2 = RandomNormalLike(x)
  z = Add(r1, r2)
  s = Mul(z, zero)
}""")
    assert ops["Relu"] == 2 and ops["RandomNormalLike"] == 2
    assert stats["nodes"] == 0


def test_second_run_changes_nothing():
    _, _, once = counts("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  a = Neg(x)
  b = Neg(x)
  y = Add(a, b)
}""")
    again, report = optimize_proto(once, PASSES)
    assert report.passes["eliminate-common-subexpressions"].changed == 0
    assert again.SerializeToString() == once.SerializeToString()


# -- large constants, the silero-VAD shape: one LSTM weight read in both branches of an If ----


def _silero_like(hidden: int = 128) -> onnx.ModelProto:
    """Stored weights [4H, H] (as torch keeps them), unsqueezed to LSTM's [1, 4H, H] inside
    both branches of an If on the sample rate, and twice more (two LSTM steps) in the main
    graph: folding makes one [1, 4H, H] copy per Unsqueeze."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    h4 = 4 * hidden
    weights = {
        "W2": rng.standard_normal((h4, hidden)).astype(np.float32) * 0.05,
        "R2": rng.standard_normal((h4, hidden)).astype(np.float32) * 0.05,
        "B": rng.standard_normal((1, 2 * h4)).astype(np.float32) * 0.05,
    }
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")

    def lstm(prefix: str, x: str, y: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("Unsqueeze", ["W2", "axes"], [f"{prefix}W"]),
            helper.make_node("Unsqueeze", ["R2", "axes"], [f"{prefix}R"]),
            helper.make_node(
                "LSTM", [x, f"{prefix}W", f"{prefix}R", "B"], [f"{prefix}Y"], hidden_size=hidden
            ),
            helper.make_node("Squeeze", [f"{prefix}Y", "axes1"], [y]),
        ]

    def branch(name: str, scale: float) -> onnx.GraphProto:
        k = numpy_helper.from_array(np.array(scale, np.float32), f"{name}_k")
        nodes = [helper.make_node("Mul", ["h", f"{name}_k"], [f"{name}_x"])]
        nodes += lstm(f"{name}_", f"{name}_x", f"{name}_out")
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, ["T", 1, hidden])
        return helper.make_graph(nodes, name, [], [out], [k])

    nodes = lstm("a_", "x", "h0") + [
        helper.make_node("Relu", ["h0"], ["h"]),
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
        helper.make_node(
            "If", ["is16k"], ["y"], then_branch=branch("then", 1.0), else_branch=branch("el", 0.5)
        ),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in weights.items()] + [
        axes,
        numpy_helper.from_array(np.array([1], np.int64), "axes1"),
        numpy_helper.from_array(np.array(16000, np.int64), "sr16k"),
    ]
    graph = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 1, hidden]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, hidden])],
        inits,
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weight_bytes(proto: onnx.ModelProto) -> int:
    total = 0
    for g in [proto.graph] + [
        a.g for n in proto.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
    ]:
        total += sum(numpy_helper.to_array(t).nbytes for t in g.initializer)
    return total


def test_folded_copies_of_one_weight_merge_across_if_branches():
    proto = _silero_like()
    out, report = optimize_proto(proto, ["fold-constants", *PASSES])
    before, after = _weight_bytes(proto), _weight_bytes(out)
    assert report.passes["fold-constants"].counts["folded"] == 6  # the six Unsqueezes
    # One [1, 512, 128] W and one R remain of the six folded copies (two hoisted out of the
    # branches into the main graph): the weights are as large as before, never larger.
    assert report.passes["eliminate-common-subexpressions"].counts["constants"] == 4
    assert after <= before, (before, after)
    big = [t for t in out.graph.initializer if numpy_helper.to_array(t).size >= 512 * 128]
    assert sorted(tuple(t.dims) for t in big) == [(1, 512, 128), (1, 512, 128)]
    for a in out.graph.node[-1].attribute:
        assert all(numpy_helper.to_array(t).size < 64 for t in a.g.initializer)
    for rate, steps in ((16000, 3), (8000, 5)):
        rng = np.random.default_rng(rate)
        feeds = {
            "x": rng.standard_normal((steps, 1, 128)).astype(np.float32),
            "sr": np.array(rate, np.int64),
        }
        assert_same_outputs(proto, out, feeds)


def test_large_equal_constants_merge_and_unequal_twins_do_not():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 256)).astype(np.float32)  # 64 KiB, over the old 4 KiB cap
    b = a.copy()
    b[32, 100] += 1.0  # same shape, same sampled ends, differs in the middle
    proto = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 64] x) => (float[N, 256] y) {
  p = MatMul(x, w1)
  q = MatMul(x, w2)
  r = MatMul(x, w3)
  s = Add(p, q)
  y = Add(s, r)
}""")
    for name, arr in (("w1", a), ("w2", a.copy()), ("w3", b)):
        proto.graph.initializer.append(numpy_helper.from_array(arr, name))
    out, report = optimize_proto(proto, PASSES)
    assert report.passes["eliminate-common-subexpressions"].counts == {"constants": 1, "nodes": 1}
    assert sorted(t.name for t in out.graph.initializer) == ["w1", "w3"]
    assert_same_outputs(proto, out)


def test_a_later_duplicate_that_is_a_graph_output_merges_into_the_first():
    ops, stats, out = counts("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 2] x) => (float[N, 2] a, float[N, 2] y) {
  s = Softmax <axis = -1> (x)
  y = Softmax <axis = -1> (x)
  a = Add(s, s)
}""")
    assert ops == {"Softmax": 1, "Add": 1} and stats["nodes"] == 1
    assert [o.name for o in out.graph.output] == ["a", "y"]


def test_a_duplicate_of_a_graph_output_that_is_itself_an_output_is_kept():
    ops, stats, _ = counts("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 2] x) => (float[N, 2] y, float[N, 2] z) {
  y = Softmax <axis = -1> (x)
  z = Softmax <axis = -1> (x)
}""")
    assert ops == {"Softmax": 2} and stats.get("nodes", 0) == 0
