"""calibrate's models pass onnx's full checker too: an output whose declared rank the folded
graph contradicts (a Reshape target that folding makes constant) gets the computed type, as
optimize gives it (tests/ir/test_output_types.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as oh
from onnx import numpy_helper

from infercc.calib.calibrate import FP32_FILE, INT8_FILE, calibrate
from infercc.calib.weight_only import INT4_FILE, calibrate_int4
from tests.ir.test_output_types import _ocr


def _model() -> onnx.ModelProto:
    """tests/ir/test_output_types.py's model, y = Reshape(Relu(x), target) declared [1, seqlen]
    where the folded graph computes rank 3, with a MatMul before the Relu to quantize."""
    model = _ocr([1, "seqlen"])
    w = np.random.default_rng(0).standard_normal((8, 8)) / 3
    model.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), "proj_w"))
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.input[0] = "m"
    model.graph.node.insert(0, oh.make_node("MatMul", ["x", "proj_w"], ["m"], name="proj"))
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
