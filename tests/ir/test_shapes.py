"""concrete_types: every value's shape at a pinned input shape, without touching the IR."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from infercc.ir import import_model, infer_shapes
from infercc.ir.shapes import concrete_types

# position ids built at run time from the input's length: Shape -> Gather -> Range -> Gather
# (onnx's own data propagation does not reach the Range's length).
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64[batch, seq] ids) => (float[batch, seq, 4] y) {
  shp = Shape(ids)
  one = Constant <value = int64[1] {1}> ()
  seqlen = Gather <axis = 0> (shp, one)
  n = Squeeze(seqlen)
  zero = Constant <value = int64 {0}> ()
  step = Constant <value = int64 {1}> ()
  pos = Range(zero, n, step)
  pe = Gather(table, pos)
  te = Gather(table, ids)
  y = Add(te, pe)
}
"""


def model():
    proto = onnx.parser.parse_model(TEXT)
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((16, 4), np.float32), "table"))
    m = import_model(proto)
    infer_shapes(m)
    return m


def test_shapes_resolved_through_range():
    m = model()
    types = concrete_types(m, {"ids": (2, 5)})
    assert types["pos"][1] == (5,)
    assert types["pe"][1] == (5, 4)
    assert types["y"] == (onnx.TensorProto.FLOAT, (2, 5, 4))
    assert types["shp"][1] == (2,)


def test_ir_keeps_symbolic_dims():
    m = model()
    concrete_types(m, {"ids": (2, 5)})
    assert m.value("ids").shape == ("batch", "seq")
    assert m.value("y").shape == ("batch", "seq", 4)
    assert len(m.graph) == 10
