"""The int8 form a calibration writes, chosen by its target's CPU row (infercc.calib.forms).

The test session states the host's row as x86-avx2 (tests/conftest.py), so `cpu` and
`x86-avx2` are this host here and every other row is not, on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import infercc
import infercc.calib.job as job_module
from infercc.calib import forms
from infercc.calib.calibrate import INT8_FILE, calibrate
from infercc.calib.forms import (
    Int4Row,
    accuracy_level_decision,
    int4_row,
    kernel_cause,
    plan_int8,
)
from infercc.errors import InferccError
from tests.helpers import run_cli

ENCODER = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"


def test_the_hosts_row_is_checked_and_measured_here():
    plan = plan_int8("cpu")
    assert (plan.row, plan.host_row, plan.on_host) == ("x86-avx2", "x86-avx2", True)
    assert plan.weight_bits == 7 and plan.activations == "uint8" and plan.format == "qdq"
    assert plan.fused_evaluation and plan.not_measured == ()
    assert "int16 with saturation" in plan.reason
    assert plan_int8("X86-AVX2").on_host  # the host's own row by name is the host


def test_another_row_is_built_for_and_not_measured():
    plan = plan_int8("x86-avx512-vnni")
    assert plan.weight_bits == 8 and not plan.on_host and not plan.fused_evaluation
    assert plan.evaluated_with.startswith("the Q/DQ graph in float")
    kernel, speed = plan.not_measured
    assert kernel.startswith("kernel check:") and "this host is x86-avx2" in kernel
    assert speed.startswith("speed:")
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["cpu_class"] == "x86-avx512-vnni" and d["host_cpu_class"] == "x86-avx2"
    assert plan_int8("arm64-neon-dot").weight_bits == 8


def test_a_gpu_takes_tensorrts_form():
    plan = plan_int8("a100")
    assert (plan.kind, plan.weight_bits, plan.activations) == ("gpu", 8, "int8")
    assert not plan.on_host and len(plan.not_measured) == 2


def test_the_user_overrides_the_row():
    plan = plan_int8("x86-avx512-vnni", activations="int8", weight_bits="7")
    assert plan.weight_bits == 7 and plan.activations == "int8"
    assert plan.given == ("weight_bits", "activations")
    assert "as given" in plan.reason


@pytest.mark.parametrize(
    "target, bits, message",
    [
        ("x86-avx2", "8", "--weight-bits 8 cannot run exactly on x86-avx2: without VNNI"),
        ("cpu", 8, "--weight-bits 8 cannot run exactly on x86-avx2"),
        ("a100", "7", "--weight-bits 7 has no use on the a100 target"),
        ("cpu", "6", "--weight-bits '6' is not a weight width"),
    ],
)
def test_a_form_the_target_cannot_run_is_refused(target, bits, message):
    with pytest.raises(InferccError) as err:
        plan_int8(target, weight_bits=bits)
    assert err.value.message.startswith(message)


def test_the_kernel_check_names_the_cause(monkeypatch):
    monkeypatch.setattr(forms, "_hardware_row", lambda: "x86-avx512-vnni")
    monkeypatch.setenv("INFERCC_CPU_CLASS", "x86-amx")
    plan = plan_int8("cpu")
    assert "onnxruntime#26324" in kernel_cause(plan, "1.23.2")
    assert "upgrade onnxruntime to 1.25" in kernel_cause(plan, "1.24.0")
    assert "no known cause in onnxruntime 1.25.0 on x86-amx" in kernel_cause(plan, "1.25.0")
    monkeypatch.setenv("INFERCC_CPU_CLASS", "x86-avx2")
    assert "no known cause" in kernel_cause(plan_int8("cpu"), "1.23.2")
    # a stated row decides the form, not the instructions onnxruntime runs: AMX hardware
    # under a stated x86-avx2 row still has the bug
    monkeypatch.setattr(forms, "_hardware_row", lambda: "x86-amx")
    assert "onnxruntime#26324" in kernel_cause(plan_int8("cpu"), "1.23.2")


def test_a_stated_row_that_does_not_exist_is_refused(monkeypatch):
    monkeypatch.setenv("INFERCC_CPU_CLASS", "x86-avx3")
    with pytest.raises(InferccError, match="INFERCC_CPU_CLASS='x86-avx3' is not a CPU row"):
        plan_int8("cpu")


# --- calibrate with each form ---------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("samples")
    rng = np.random.default_rng(0)
    for i in range(5):
        x = rng.standard_normal((1, 8, 64)).astype(np.float32)
        np.savez(directory / f"s{i}.npz", hidden_states=x)
    return directory


def _weight_codes(path: Path) -> list[np.ndarray]:
    model = onnx.load(path)
    return [
        numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.dims
    ]


def test_seven_bit_weights_for_the_hosts_avx2_row(samples, tmp_path):
    report = calibrate(ENCODER, samples, tmp_path / "o", speed_check=True)
    assert report.passed, report.message
    codes = _weight_codes(tmp_path / "o" / INT8_FILE)
    assert codes and max(int(np.abs(c).max()) for c in codes) == 64
    assert report.speed is not None  # the host is the target: raced
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["int8"]["weight_bits"] == 7 and manifest["int8"]["on_host"] is True
    assert manifest["target"]["cpu_class"]["name"] == "x86-avx2"
    # one verdict: the criterion calibrate accepted it at, which validate applies
    criterion = manifest["criterion"]
    assert criterion["by"] == "calibrate --int8" and criterion["min_cosine"] <= 0.99
    assert criterion["cosine"] == pytest.approx(report.to_dict()["cosine"])
    checked = infercc.validate(tmp_path / "o", ENCODER)
    assert checked.passed and checked.criterion.startswith("calibrate --int8 accepted")


def test_another_rows_form_is_evaluated_as_its_qdq_graph(samples, tmp_path, monkeypatch):
    def no_check(*_args, **_kwargs):
        raise AssertionError("the kernel check ran for a target that is not this host")

    monkeypatch.setattr("infercc.calib.job.broken_kernels", no_check)
    runs = []
    original_run = job_module.run_model

    def watched(path, samples, optimize=False, **kwargs):
        runs.append(optimize)
        return original_run(path, samples, optimize=optimize, **kwargs)

    monkeypatch.setattr(job_module, "run_model", watched)
    report = calibrate(ENCODER, samples, tmp_path / "o", target="x86-avx512-vnni")
    assert report.passed, report.message
    assert runs and not any(runs)  # every candidate and the reference ran unfused
    codes = _weight_codes(tmp_path / "o" / INT8_FILE)
    assert max(int(np.abs(c).max()) for c in codes) == 127
    assert report.speed is None  # not raced: the host is not the target
    d = report.to_dict()["int8"]
    assert d["cpu_class"] == "x86-avx512-vnni" and d["on_host"] is False
    assert [line.split(":")[0] for line in d["not_measured"]] == ["kernel check", "speed"]


def test_cli_says_the_form_and_what_was_not_measured(samples, tmp_path):
    out = tmp_path / "o"
    done = run_cli("calibrate", str(ENCODER), "--data", str(samples), "-o", str(out),
                   "--target", "x86-avx512-vnni")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "int8 form for x86-avx512-vnni: 8-bit weights, uint8 activations, QDQ" in done.stdout
    assert "evaluated with the Q/DQ graph in float" in done.stdout
    assert "not measured: kernel check: the x86-avx512-vnni target's" in done.stdout


def test_cli_refuses_a_form_the_target_cannot_run(samples, tmp_path):
    out = tmp_path / "o"
    done = run_cli("calibrate", str(ENCODER), "--data", str(samples), "-o", str(out),
                   "--target", "x86-avx2", "--weight-bits", "8")  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --weight-bits 8 cannot run exactly")
    assert not out.exists()


def test_weight_bits_is_an_int8_flag(samples, tmp_path):
    done = run_cli("calibrate", str(ENCODER), "--int4", "-o", str(tmp_path / "o"),
                   "--weight-bits", "7")  # fmt: skip
    assert done.returncode == 2
    assert "--weight-bits applies to int8 calibration, not --int4" in done.stderr


# --- int4: MatMulNBits' accuracy level and block size per row ---------------------------------


def test_int4_rows():
    assert int4_row("cpu", 64) == Int4Row("x86-avx2", 4, 32, True)
    assert int4_row("arm64-neon", 64) == Int4Row("arm64-neon", 0, 32, False)
    assert int4_row("a100", 64) == Int4Row(None, 0, 64, False)


AVX2 = Int4Row("x86-avx2", 4, 32, True)


@pytest.mark.parametrize(
    "facts, p10, p90, keeps, on_data, level, why",
    [
        (Int4Row("x86-sse", 0, 32, True), 0.3, 0.4, True, True, 0, "x86-sse has no int8 kernel"),
        (Int4Row("x86-sse", 0, 32, True), 0.3, 0.4, True, False, 0, "x86-sse has no int8"),
        (AVX2, 0.3, 0.4, True, True, 4, "int8 compute is faster"),
        (AVX2, 0.3, 0.4, False, True, 0, "int8 compute lost accuracy on the held-out"),
        # random logits: a top-1 drop is reported, not a veto (issue 28: Qwen2 at 0.31x)
        (AVX2, 0.3, 0.4, False, False, 4, "int8 compute is faster"),
        (AVX2, 1.1, 1.3, True, True, 0, "int8 compute is slower"),
        (AVX2, 1.1, 1.3, False, False, 0, "int8 compute is slower"),
        # a race that crosses 1 says nothing: the row's level stands
        (AVX2, 0.9, 1.1, True, False, 4, "the race was noisy"),
        (AVX2, 0.9, 1.1, False, True, 0, "int8 compute lost accuracy"),
        (Int4Row("arm64-sve", 4, 32, False), None, None, True, False, 4, "arm64-sve's level"),
        (Int4Row("arm64-sve", 4, 32, False), None, None, False, False, 4, "arm64-sve's level"),
        (Int4Row("arm64-sve", 4, 32, False), None, None, False, True, 0, "int8 compute lost"),
    ],
)
def test_accuracy_level_auto(facts, p10, p90, keeps, on_data, level, why):
    chosen, reason = accuracy_level_decision(facts, p10, p90, keeps, on_data)
    assert chosen == level and reason.startswith(why)
    if why == "the race was noisy":
        assert "0.90..1.10 crosses 1" in reason and "x86-avx2's level stands" in reason
    if chosen == 4:
        said = "as accurate on the held-out samples" if on_data else "not a veto"
        assert said in reason
