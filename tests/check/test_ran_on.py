"""The report says where validation ran: onnxruntime's CPU provider for a plain model, whatever
the target, and for a GPU target that nothing ran on that GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercc import api

SMALL_CNN = Path(__file__).resolve().parents[2] / "examples" / "small_cnn.onnx"


@pytest.mark.parametrize("target", ["cpu", "a100"])
def test_the_report_says_where_validation_ran(tmp_path, target):
    report = api.optimize(SMALL_CNN, tmp_path / "m.onnx", target=target, precision="fp16")
    v = report.validation
    assert v.passed
    assert v.ran_on.startswith("onnxruntime ") and v.ran_on.endswith("CPUExecutionProvider")
    assert report.to_dict()["validation"]["ran_on"] == v.ran_on
    gpu_notes = [n for n in v.notes if "not on a100" in n and "speed there" in n]
    assert len(gpu_notes) == (1 if target == "a100" else 0)
