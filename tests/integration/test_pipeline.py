"""The default pipeline as a whole: it optimizes around ops it does not know."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import make_model, op_counts, optimize_proto


def test_optimization_continues_around_custom_domain_ops():
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mystery", ["r"], ["m"], domain="vendor.ops"),
        helper.make_node("Identity", ["m"], ["i"]),
        helper.make_node("Conv", ["i", "w"], ["c"]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["y"]),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    inits += [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), n)
        for n in ("s", "b", "mu", "var")
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    proto = make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor.ops", 1)]
    )
    out, report = optimize_proto(proto)
    assert op_counts(out) == {"Relu": 1, "Mystery": 1, "FusedConv": 1}
    assert report.passes["fuse-conv-bn-relu"].counts["bn_into_conv"] == 1
    assert {o.domain for o in out.opset_import} == {"", "vendor.ops", "com.microsoft"}
    mystery = next(n for n in out.graph.node if n.op_type == "Mystery")
    assert mystery.domain == "vendor.ops" and list(mystery.input) == ["r"]
    onnx.checker.check_model(out)
