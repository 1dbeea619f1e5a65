"""bench/gpu_check.sh: it refuses with the reason where TensorRT or a GPU is missing, and its
summary is built from the steps' outputs (the GPU run itself needs a GPU: see the script)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infercc.backends.trt.backend import TensorRTBackend

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _gpu_check():
    spec = importlib.util.spec_from_file_location(
        "infercc_bench_gpu_check", SCRIPT.parent / "gpu_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(TensorRTBackend().available()[0], reason="TensorRT and a GPU are here")
def test_it_exits_2_with_the_reason_where_tensorrt_or_a_gpu_is_missing(tmp_path):
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env)
    reason = TensorRTBackend().available()[1]
    assert done.returncode == 2
    assert done.stderr.strip() == f"gpu_check: cannot run here: {reason}"
    assert not out.exists() and "pytest" not in done.stdout


def test_a_missing_interpreter_is_a_reason_too(tmp_path):
    env = {**os.environ, "PYTHON": str(tmp_path / "no-python")}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "no Python interpreter" in done.stderr


def _steps(work: Path, rows: list[dict], failure: bool = False) -> None:
    cases = [
        '<testcase classname="tests.backends.test_tensorrt_gpu" name="test_fp16"/>',
        '<testcase classname="t" name="test_skipped"><skipped/></testcase>',
    ]
    if failure:
        cases.append('<testcase classname="t" name="test_bad"><failure message="x"/></testcase>')
    work.joinpath("tests.xml").write_text(
        f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>"
    )
    versions = {"tensorrt": "10.13.3.9", "onnxruntime": "1.31.1", "infercc": "0.1.0"}
    work.joinpath("models.json").write_text(
        json.dumps({"versions": versions, "rows": rows, "left_out": ["squeezenet-fp16"]})
    )


ROW = {
    "model": "resnet50",
    "precision": "fp16",
    "validated": True,
    "layers": {"fp16": 57},
    "build_s": 31.0,
    "rebuild_s": 6.2,
    "rebuild_timing_cache": "hit",
    "tensorrt_p50_ms": 0.9,
    "onnxruntime_cpu_p50_ms": 21.0,
    "fingerprint": {
        "gpu": "NVIDIA H200",
        "compute_capability": "9.0",
        "cuda": "12.8",
        "driver": "570.1",
    },
}


def test_the_summary_gathers_versions_gpu_tests_and_models(tmp_path):
    gpu_check = _gpu_check()
    _steps(tmp_path, [ROW])
    summary, passed = gpu_check.summarize(tmp_path, 0, 0, 312.4)
    assert passed
    assert summary["schema"] == "infercc.gpu_check/1" and summary["seconds"] == 312.4
    assert summary["versions"] == {
        "tensorrt": "10.13.3.9",
        "onnxruntime": "1.31.1",
        "infercc": "0.1.0",
        "cuda": "12.8",
        "driver": "570.1",
    }
    assert summary["gpu"] == {"gpu": "NVIDIA H200", "compute_capability": "9.0"}
    assert summary["tests"] == {
        "exit_code": 0,
        "timed_out": False,
        "total": 2,
        "failed": 0,
        "errors": 0,
        "skipped": 1,
        "failures": [],
    }
    assert summary["models"]["rows"] == [ROW]
    assert summary["models"]["left_out"] == ["squeezenet-fp16"]


def test_a_failed_test_a_failed_model_or_a_timeout_fails_the_check(tmp_path):
    gpu_check = _gpu_check()
    _steps(tmp_path, [ROW], failure=True)
    summary, passed = gpu_check.summarize(tmp_path, 1, 0, 10)
    assert not passed and summary["tests"]["failures"] == ["t::test_bad"]
    _steps(tmp_path, [ROW, {**ROW, "precision": "fp32", "validated": False}])
    assert not gpu_check.summarize(tmp_path, 0, 1, 10)[1]
    summary, passed = gpu_check.summarize(tmp_path, 124, 0, 10)
    assert not passed and summary["tests"]["timed_out"]


def test_summarize_writes_the_file_and_says_how_it_went(tmp_path, capsys):
    gpu_check = _gpu_check()
    _steps(tmp_path, [ROW])
    out = tmp_path / "out" / "summary.json"
    assert gpu_check.main(["summarize", str(out), str(tmp_path), "0", "0", "5"]) == 0
    assert json.loads(out.read_text())["models"]["rows"][0]["model"] == "resnet50"
    assert "passed" in capsys.readouterr().out
