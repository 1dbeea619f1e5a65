"""calibrate's models pass onnx's full checker too: an output whose declared rank the folded
graph contradicts (a Reshape target that folding makes constant) gets the computed type, as
optimize gives it (tests/ir/test_output_types.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.calib.calibrate import FP32_FILE, INT8_FILE, calibrate
from infercc.calib.weight_only import INT4_FILE, calibrate_int4
from tests.helpers import make_model


def _model() -> onnx.ModelProto:
    """y = Reshape(Relu(x @ w), target), target [0, 1, -1] computed from x's static width: the
    declared [1, seqlen] contradicts the rank 3 the folded graph computes."""

    def c(name: str, v, dtype=np.int64) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(v, dtype), name)

    w = np.random.default_rng(0).standard_normal((8, 8)) / 3
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
        oh.make_node("Relu", ["m"], ["r"]),
        oh.make_node("Shape", ["x"], ["width"], start=2),
        oh.make_node("Sub", ["width", "five"], ["lim"]),
        oh.make_node("Squeeze", ["lim"], ["three"]),
        oh.make_node("Range", ["zero", "three", "one"], ["ids"]),
        oh.make_node("Equal", ["ids", "two"], ["last"]),
        oh.make_node("Where", ["last", "minus1", "ids"], ["target"]),
        oh.make_node("Reshape", ["r", "target"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "ocr",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seqlen", 8])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])],
        [c("w", w, np.float32), c("zero", 0), c("five", [5]), c("one", 1), c("two", 2),
         c("minus1", -1)],  # fmt: skip
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)  # the original passes
    return model


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ocr")
    onnx.save(_model(), root / "m.onnx")
    data = root / "samples"
    data.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        np.savez(data / f"{i}.npz", x=rng.standard_normal((1, 5, 8)).astype(np.float32))
    return root / "m.onnx", data


def test_int8_models_pass_the_full_checker(source, tmp_path):
    src, data = source
    report = calibrate(src, data, tmp_path / "o", speed_check=False, min_cosine=0)
    assert report.passed, report.message
    for name in (INT8_FILE, FP32_FILE):
        onnx.checker.check_model(onnx.load(tmp_path / "o" / name), full_check=True)


def test_int4_model_passes_the_full_checker(source, tmp_path):
    src, _ = source
    report = calibrate_int4(src, tmp_path / "o", speed_check=False, block_size=32)
    assert report.passed, report.message
    onnx.checker.check_model(onnx.load(tmp_path / "o" / INT4_FILE), full_check=True)
