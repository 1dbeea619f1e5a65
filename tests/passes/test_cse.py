"""eliminate-common-subexpressions: duplicates merge; random ops, outputs and attributes guard."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tests.helpers import assert_same_outputs, op_counts, optimize_proto, parse

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
