"""Models onnxruntime runs are read as it reads them (issue 12 items 4, 5, 15): a dim_value
of -1 is an unknown dimension, initializers listed as graph inputs are overridable defaults
(IR >= 4), sparse initializers are constants."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc import api
from infercc.errors import InferccError
from infercc.ir import export_model, import_model, load_model
from infercc.passes import DEFAULT_PIPELINE
from tests.helpers import make_model, op_counts, optimize_proto, run_cli, run_ort

FLOAT = TensorProto.FLOAT


# --------------------------------------------------------------------------- dim_value: -1


def _dynamic_axis_model() -> onnx.ModelProto:
    """What Paddle and TensorFlow exports write for a dynamic batch: dim_value -1."""
    x = helper.make_tensor_value_info("x", FLOAT, [-1, 3])
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Shape", ["r"], ["s"]),
            helper.make_node("MatMul", ["r", "w"], ["y"]),
        ],
        "paddle_like",
        [x],
        [
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("y", FLOAT, [-1, 2]),
        ],
        [numpy_helper.from_array(np.ones((3, 2), np.float32), "w")],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`infercc ARGS` in this process (`tests.helpers.run_cli`)."""
    return run_cli(*args)


def test_a_negative_dim_is_an_unknown_dim():
    model = import_model(_dynamic_axis_model())
    assert model.graph.inputs[0].shape == (None, 3)


@pytest.mark.parametrize("batch", [1, 4])
def test_shape_of_a_dynamic_axis_is_never_folded_to_minus_one(batch):
    # regression (item 4): with --no-validate Shape(x) was folded to the constant [-1, 3]
    original = _dynamic_axis_model()
    optimized, _ = optimize_proto(original, DEFAULT_PIPELINE, check=False)
    assert op_counts(optimized)["Shape"] == 1
    x = np.ones((batch, 3), np.float32)
    got = run_ort(optimized, {"x": x})
    assert got[0].tolist() == [batch, 3]
    np.testing.assert_array_equal(got[1], run_ort(original, {"x": x})[1])


def test_optimize_validates_and_accepts_a_shape_for_a_dynamic_axis(tmp_path):
    # regression (item 4): "internal error: negative dimensions are not allowed"; --shape x=2x3
    # refused ("the model fixes it to -1")
    src = tmp_path / "m.onnx"
    onnx.save(_dynamic_axis_model(), src)
    assert api.optimize(src, tmp_path / "a.onnx").passed
    assert api.optimize(src, tmp_path / "b.onnx", shapes={"x": (2, 3)}).passed
    out = str(tmp_path / "c.onnx")
    result = _cli("optimize", str(src), "-o", out, "--shape", "x=5x3", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"]


# --------------------------------------------------------------------------- initializers as inputs


def _overridable_model(ir_version: int) -> onnx.ModelProto:
    """y = x * b + c: b is an initializer also listed as a graph input (a default)."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "b"], ["m"]),
            helper.make_node("Add", ["m", "bb"], ["y"]),
            helper.make_node("Mul", ["b", "two"], ["bb"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", FLOAT, [3]),
            helper.make_tensor_value_info("b", FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", FLOAT, [3])],
        [
            numpy_helper.from_array(np.float32([1, 2, 3]), "b"),
            numpy_helper.from_array(np.float32(2), "two"),
        ],
    )
    if ir_version < 4:
        graph.input.append(helper.make_tensor_value_info("two", FLOAT, []))
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = ir_version
    return model


def test_an_overridable_initializer_stays_an_input_and_is_never_folded_through():
    # regression (item 5): b became a constant; the optimized model answered
    # "Invalid input name: b" to a caller that overrides it
    original = _overridable_model(8)
    optimized, report = optimize_proto(original, DEFAULT_PIPELINE)
    assert [i.name for i in optimized.graph.input] == ["x", "b"]
    assert "b" in {t.name for t in optimized.graph.initializer}
    assert op_counts(optimized)["Mul"] == 2  # Mul(b, two) is not folded: b may change
    x = np.float32([1, 1, 1])
    for feeds in ({"x": x}, {"x": x, "b": np.float32([5, 6, 7])}):
        np.testing.assert_array_equal(run_ort(optimized, feeds)[0], run_ort(original, feeds)[0])
    again, _ = optimize_proto(optimized, DEFAULT_PIPELINE)
    assert again.SerializeToString() == optimized.SerializeToString()


def test_freeze_initializers_makes_them_constants(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_overridable_model(8), src)
    report = api.optimize(src, tmp_path / "out.onnx", freeze_initializers=True)
    assert report.passed and report.overridable_inputs == {"names": ["b"], "frozen": True}
    out = onnx.load(tmp_path / "out.onnx")
    assert [i.name for i in out.graph.input] == ["x"]
    assert op_counts(out) == {"Mul": 1, "Add": 1}  # Mul(b, two) folded
    kept = api.optimize(src, tmp_path / "kept.onnx")
    assert kept.overridable_inputs == {"names": ["b"], "frozen": False}


def test_freeze_initializers_without_effect_is_refused(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_dynamic_axis_model(), src)
    with pytest.raises(InferccError, match="no effect"):
        api.optimize(src, tmp_path / "out.onnx", freeze_initializers=True)
    result = _cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--freeze-initializers")
    assert result.returncode == 2
    assert "--freeze-initializers has no effect" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_before_ir4_initializers_listed_as_inputs_are_constants():
    model = import_model(_overridable_model(3))
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert {"b", "two"} <= set(model.graph.initializers)
    optimized, _ = optimize_proto(_overridable_model(3), DEFAULT_PIPELINE, check=False)
    assert op_counts(optimized) == {"Mul": 1, "Add": 1}


# --------------------------------------------------------------------------- sparse_initializer


def _sparse_model(coordinates: bool) -> onnx.ModelProto:
    values = numpy_helper.from_array(np.float32([5, 7]), "w")
    idx = np.array([[0, 1], [2, 0]] if coordinates else [1, 4], np.int64)
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(idx, "w_idx"), [3, 2])
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Transpose", ["w"], ["t"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("y", FLOAT, [2, 2]),
            helper.make_tensor_value_info("t", FLOAT, [2, 3]),
        ],
        sparse_initializer=[sparse],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("coordinates", [False, True])
def test_sparse_initializers_are_read_and_written_back(coordinates, tmp_path):
    # regression (item 15): models with a sparse_initializer were refused as incomplete
    original = _sparse_model(coordinates)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = run_ort(original, {"x": x})
    optimized, report = optimize_proto(original, DEFAULT_PIPELINE, check=False)
    assert [s.values.name for s in optimized.graph.sparse_initializer] == ["w"]
    assert report.passes["fold-constants"].counts["folded"] == 1  # Transpose(w)
    for w, g in zip(want, run_ort(optimized, {"x": x}), strict=True):
        np.testing.assert_array_equal(g, w)
    src = tmp_path / "m.onnx"
    onnx.save(original, src)
    assert api.optimize(src, tmp_path / "out.onnx").passed
    written = onnx.load(tmp_path / "out.onnx")
    assert [s.values.name for s in written.graph.sparse_initializer] == ["w"]
    assert export_model(load_model(tmp_path / "out.onnx")).graph.sparse_initializer
