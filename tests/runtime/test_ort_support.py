"""What the installed onnxruntime reads, and how infercc refuses a model it cannot load.

Python 3.10 gets onnxruntime 1.23 at most, which reads IR <= 11, while onnx 1.23 writes IR 14
by default: such a model must be refused up front with both versions named, not with
onnxruntime's C++ message after the passes ran.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from infercc import api
from infercc.check.compare import run_model
from infercc.cli import main
from infercc.errors import InferccError
from infercc.runtime import ort_support
from tests.helpers import IR_VERSION

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y) {
  a = Identity(x)
  y = Add(a, w)
}
"""


def _model(ir_version: int) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(MODEL)
    proto.graph.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "w"))
    proto.ir_version = ir_version
    return proto


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    return ort.InferenceSession(proto.SerializeToString(), opts, ["CPUExecutionProvider"])


def test_max_ir_version_is_what_onnxruntime_loads():
    limit = ort_support.max_ir_version()
    assert 8 <= limit <= onnx.IR_VERSION  # the examples are IR 8
    assert IR_VERSION == limit  # what test models are written at
    _session(_model(limit))
    if limit < onnx.IR_VERSION:  # onnxruntime 1.23 (Python 3.10): 11 < 14
        with pytest.raises(Exception, match="Unsupported model IR version"):
            _session(_model(limit + 1))


def test_check_ir_version_names_both_versions():
    limit = ort_support.max_ir_version()
    ort_support.check_ir_version(limit)
    with pytest.raises(InferccError) as e:
        ort_support.check_ir_version(limit + 1, "m.onnx")
    assert str(e.value.message) == (
        f"m.onnx has IR version {limit + 1}, but onnxruntime {ort.__version__} reads IR <= {limit}"
    )
    assert f"save the model at IR {limit}" in e.value.hint


def test_refused_ir_version_reads_onnxruntime_s_message():
    exc = RuntimeError(
        "[ONNXRuntimeError] : 1 : FAIL : Load model failed: Unsupported model IR version: 14, "
        "max supported IR version: 11"
    )
    assert ort_support.refused_ir_version(exc) == 14
    assert ort_support.refused_ir_version(RuntimeError("other")) is None


@pytest.mark.skipif(
    ort_support.max_ir_version() >= onnx.IR_VERSION,
    reason="this onnxruntime reads every IR the installed onnx writes",
)
def test_running_a_model_onnxruntime_refuses_says_why():
    too_new = _model(ort_support.max_ir_version() + 1)
    with pytest.raises(InferccError, match=r"has IR version \d+, but onnxruntime .* reads IR"):
        run_model(too_new, [{"x": np.zeros((2, 4), np.float32)}])


@pytest.fixture
def lower_limit(monkeypatch):
    """onnxruntime reading IR <= 7 only, so an IR 8 model is too new on any installation."""
    monkeypatch.setattr(ort_support, "max_ir_version", lambda: 7)


def test_optimize_refuses_before_any_work_and_writes_nothing(
    tmp_path, lower_limit, monkeypatch, capsys
):
    src = tmp_path / "m.onnx"
    onnx.save(_model(8), src)
    monkeypatch.setattr(sys, "argv", ["infercc", "optimize", str(src), "-o", f"{tmp_path}/o.onnx"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    out = capsys.readouterr()
    text = " ".join(out.err.split())
    assert f"m.onnx has IR version 8, but onnxruntime {ort.__version__} reads IR <= 7" in text
    assert "Traceback" not in out.err and out.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_optimize_without_validation_writes_it_and_warns(tmp_path, lower_limit, caplog):
    src = tmp_path / "m.onnx"
    onnx.save(_model(8), src)
    with caplog.at_level(logging.WARNING, logger="infercc.runtime.ort_support"):
        report = api.optimize(src, tmp_path / "out.onnx", run_validation=False)
    assert report.nodes_after == 1
    assert onnx.load(tmp_path / "out.onnx").ir_version == 8  # never changed by infercc
    assert any(re.search(r"IR version 8, but onnxruntime .* IR <= 7", m) for m in caplog.messages)


def test_calibrate_refuses_a_model_onnxruntime_cannot_load(tmp_path, lower_limit):
    from infercc.calib.calibrate import calibrate

    src = tmp_path / "m.onnx"
    onnx.save(_model(8), src)
    data = tmp_path / "samples"
    data.mkdir()
    np.savez(data / "0.npz", x=np.zeros((2, 4), np.float32))
    with pytest.raises(InferccError, match="IR version 8, but onnxruntime"):
        calibrate(src, data, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_optimize_keeps_the_ir_version_it_was_given(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(8), src)
    api.optimize(src, tmp_path / "out.onnx")
    assert onnx.load(tmp_path / "out.onnx").ir_version == 8


def test_tests_build_models_through_the_helper():
    """Every model a test builds with onnx.helper.make_model goes through tests.helpers'
    make_model, which writes an IR the installed onnxruntime reads."""
    root = Path(__file__).resolve().parents[1]
    direct = re.compile(r"\b(?:onnx\.helper|helper|oh)\.make_model\(")
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "helpers.py" and direct.search(p.read_text())
    ]
    assert offenders == []
