"""--fp16 with calibrated ranges: a tensor whose range overflows float16 stays float32."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.api import optimize, read_ranges
from infercc.errors import InferccError
from tests.helpers import make_model


def _model(path):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        oh.make_node("Relu", ["h"], ["r"], name="relu"),
        oh.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w1, w2],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_calibrated_overflow_keeps_the_producer_in_fp32(tmp_path):
    src = _model(tmp_path / "m.onnx")
    plain = optimize(src, tmp_path / "plain.onnx", fp16=True)
    assert not any(k["node"] == "mm1" for k in plain.kept_fp32)
    ranges = tmp_path / "ranges.json"
    ranges.write_text(json.dumps({"h": {"min": -1.0, "max": 9.0e4, "scale": 1.0, "method": "x"}}))
    report = optimize(src, tmp_path / "ranged.onnx", fp16=True, fp16_ranges=ranges)
    kept = {k["node"]: k["reason"] for k in report.kept_fp32}
    assert "mm1" in kept and "overflows fp16 (calibrated range" in kept["mm1"]
    # mm1 computes in float32: its weight stays a float32 initializer
    out = onnx.load(tmp_path / "ranged.onnx")
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert TensorProto.FLOAT in types.values() and TensorProto.FLOAT16 in types.values()


def test_read_ranges_errors(tmp_path):
    assert read_ranges({"a": (0, 1)}) == {"a": (0.0, 1.0)}
    with pytest.raises(InferccError, match="does not exist"):
        read_ranges(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": [1, 2]}')
    with pytest.raises(InferccError, match="cannot read ranges"):
        read_ranges(bad)


def test_ranges_without_fp16_are_refused(tmp_path):
    src = _model(tmp_path / "m.onnx")
    with pytest.raises(InferccError, match="ranges are for --fp16 only"):
        optimize(src, tmp_path / "o.onnx", fp16_ranges={"h": (0.0, 1.0)})
    assert not (tmp_path / "o.onnx").exists()
