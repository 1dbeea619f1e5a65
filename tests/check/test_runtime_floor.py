"""onnxruntime's own rounding as the floor of an fp32 validation (infercc.check.compare).

An element outside atol + rtol * |r| passes when it is within RUNTIME_ROUNDING_MULTIPLE times
what onnxruntime's default optimizations move that output by; the report says so. The zoo CNNs
with re-drawn weights and logits near 3,000 (ShuffleNet here, ResNet-50 under -m slow), which
a fixed tolerance refused, pass with defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import infercc
from infercc import api
from infercc.check import validation
from infercc.check.compare import compare_outputs
from infercc.check.validation import validate
from infercc.precisions import FP32, RUNTIME_ROUNDING_MULTIPLE, RUNTIME_ROUNDING_SHARE
from tests.helpers import make_model, run_cli
from tests.zoo import light_path, randomize, with_large_logits

LOGIT_SCALE = 3000.0
OWN_MOVE = 0.01  # what "onnxruntime's optimizer" moves the largest logit by, below


def _logits(small_moved_by: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference, candidate, own): logits up to 3,000 and one of 0.5, which the candidate moves
    by `small_moved_by`; `own` moves the largest logit by OWN_MOVE."""
    ref = np.linspace(-LOGIT_SCALE, LOGIT_SCALE, 1000, dtype=np.float32)
    ref[500] = 0.5
    cand, own = ref.copy(), ref.copy()
    cand[500] += np.float32(small_moved_by)
    own[-1] += np.float32(OWN_MOVE)
    return ref, cand, own


def _compare(ref: np.ndarray, cand: np.ndarray, own: np.ndarray | None):
    owns = [{"logits": own}] if own is not None else None
    report = compare_outputs([{"logits": ref}], [{"logits": cand}], own=owns, **FP32.to_dict())
    return report, report.outputs["logits"]


def _own_move(own: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(own.astype(np.float64) - ref.astype(np.float64)).max())


def test_an_element_within_the_multiple_of_onnxruntimes_rounding_passes() -> None:
    ref, cand, own = _logits()
    move = 0.9 * RUNTIME_ROUNDING_MULTIPLE * _own_move(own, ref)
    ref, cand, own = _logits(move)
    assert not _compare(ref, cand, None)[0].passed  # the table alone refuses it
    report, m = _compare(ref, cand, own)
    assert report.passed
    assert m.decided_by == "runtime-rounding"
    assert m.runtime_rounding == pytest.approx(_own_move(own, ref))
    assert m.note.startswith("within onnxruntime's own rounding: its optimizer moves this output")
    assert "1 of 1000 elements outside atol 0.0001, rtol 0.001" in m.note
    # the excused element's error apart from what the tolerance itself accepted (none moved)
    assert m.excused_max_abs == pytest.approx(move, rel=1e-3)
    assert m.within_tol_max_abs == 0.0 and m.max_abs == pytest.approx(move, rel=1e-3)
    assert f"max abs {m.excused_max_abs:.3g} on the excused elements, 0 on those within" in m.note
    data = report.to_dict()["outputs"]["logits"]
    assert data["excused_max_abs"] == pytest.approx(move, rel=1e-3)
    assert data["within_tol_max_abs"] == 0.0
    assert data["decided_by"] == "runtime-rounding" and data["note"] == m.note
    assert data["runtime_rounding"] == pytest.approx(m.runtime_rounding)


def test_an_element_beyond_the_multiple_fails_and_says_what_onnxruntime_moves() -> None:
    ref, cand, own = _logits()
    ref, cand, own = _logits(1.1 * RUNTIME_ROUNDING_MULTIPLE * _own_move(own, ref))
    report, m = _compare(ref, cand, own)
    assert not report.passed and m.decided_by == "elementwise"
    assert m.reason.startswith("1 of 1000 elements out of tolerance")
    assert "onnxruntime's own optimizer moves this output by 0.01" in m.reason
    assert m.note is None


def test_a_move_beyond_rounding_is_no_floor() -> None:
    """onnxruntime changing an output by more than RUNTIME_ROUNDING_SHARE of its scale has
    changed what it computes: that move lets nothing through."""
    ref, cand, own = _logits(0.05)
    own[-1] = ref[-1] + np.float32(2 * RUNTIME_ROUNDING_SHARE * LOGIT_SCALE)
    report, m = _compare(ref, cand, own)
    assert not report.passed and m.decided_by == "elementwise"
    assert m.runtime_rounding == pytest.approx(6.0, rel=1e-3)


def test_without_a_measurement_nothing_changes() -> None:
    ref, cand, _ = _logits(0.05)
    report, m = _compare(ref, cand, None)
    assert not report.passed and m.runtime_rounding is None
    assert "onnxruntime" not in m.reason
    assert report.to_dict()["outputs"]["logits"]["runtime_rounding"] is None


# --------------------------------------------------------------------------- validate()


def _scale_model(weight: float, bias_dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """y = x * w + 0 (the Add keeps something for onnxruntime to optimize)."""
    dtype = helper.tensor_dtype_to_np_dtype(bias_dtype)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["t"]),
            helper.make_node("Add", ["t", "b"], ["y"]),
        ],
        "scale",
        [helper.make_tensor_value_info("x", bias_dtype, [4, 8])],
        [helper.make_tensor_value_info("y", bias_dtype, [4, 8])],
        [
            numpy_helper.from_array(np.array(weight, dtype), "w"),
            numpy_helper.from_array(np.zeros((), dtype), "b"),
        ],
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def optimized_runs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The `optimize` flag of each onnxruntime run validation makes."""
    seen: list[bool] = []
    real = validation.run_model

    def spy(model, feeds, optimize=False, role="the model"):
        seen.append(optimize)
        return real(model, feeds, optimize=optimize, role=role)

    monkeypatch.setattr(validation, "run_model", spy)
    return seen


def test_a_passing_fp32_build_measures_onnxruntimes_move_once(optimized_runs) -> None:
    """The movement rule needs onnxruntime's own move on every fp32 build: one more run."""
    report = validate(_scale_model(2.0), _scale_model(2.0))
    assert report.passed
    assert optimized_runs.count(True) == 1
    y = report.outputs["y"]
    assert y.runtime_rounding == 0.0 and y.movement_ratio == 0.0


def test_a_failing_fp32_build_is_measured_against_onnxruntimes_rounding(optimized_runs) -> None:
    report = validate(_scale_model(2.0), _scale_model(2.5))
    assert not report.passed
    assert optimized_runs.count(True) == 1
    assert report.outputs["y"].runtime_rounding == 0.0  # onnxruntime computes x * 2 exactly
    assert report.outputs["y"].decided_by == "elementwise"


def test_an_fp16_build_keeps_its_criteria(optimized_runs) -> None:
    """A float16 candidate failing a user's elementwise bound is not measured against
    onnxruntime's fp32 rounding."""
    report = validate(
        _scale_model(2.0),
        _scale_model(2.0, TensorProto.FLOAT16),
        float_dtypes_may_differ=True,
        atol=1e-7,
        rtol=0.0,
    )
    assert not report.passed
    assert True not in optimized_runs
    assert report.outputs["y"].runtime_rounding is None


# --------------------------------------------------------------------------- the zoo CNNs


def _zoo_model(name: str, tmp_path: Path) -> Path:
    """The zoo model with weights re-drawn (seed 1) and logits near 3,000. Measured: ShuffleNet's
    build moves a logit of 0.20 by 0.0033, 10.8x the table's bound there, while onnxruntime's
    own optimizations move its logits by up to 0.0045; ResNet-50's moves 12 logits outside the
    table, by up to 0.090 where onnxruntime's own move is 0.075."""
    model = with_large_logits(randomize(onnx.load(light_path(name)), seed=1), LOGIT_SCALE)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _logits_output(report) -> str:
    return [name for name in report.outputs if "softmax" not in name][0]


def _assert_passes_on_rounding(name: str, tmp_path: Path) -> None:
    src = _zoo_model(name, tmp_path)
    report = api.optimize(src, tmp_path / "out.onnx")
    assert report.passed and report.written
    logits = report.validation.outputs[_logits_output(report.validation)]
    # runtime-rounding: some element was outside the table's bound, onnxruntime's rounding let
    # it through
    assert logits.decided_by == "runtime-rounding", logits
    assert 0 < logits.runtime_rounding <= RUNTIME_ROUNDING_SHARE * LOGIT_SCALE
    assert logits.max_abs <= RUNTIME_ROUNDING_MULTIPLE * logits.runtime_rounding
    checked = infercc.validate(tmp_path / "out.onnx", src)
    assert checked.passed
    assert checked.validation.outputs[logits.name].decided_by == "runtime-rounding"


def test_shufflenet_with_large_logits_passes_with_defaults(tmp_path: Path) -> None:
    _assert_passes_on_rounding("shufflenet", tmp_path)


@pytest.mark.slow
def test_resnet50_with_large_logits_passes_with_defaults(tmp_path: Path) -> None:
    _assert_passes_on_rounding("resnet50", tmp_path)


def test_the_cli_says_onnxruntimes_rounding_decided(tmp_path: Path) -> None:
    src = _zoo_model("shufflenet", tmp_path)
    out = tmp_path / "out.onnx"
    shown = run_cli("optimize", str(src), "-o", str(out))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "within onnxruntime's own rounding: its optimizer moves this output by" in shown.stdout
    as_json = run_cli("optimize", str(src), "-o", str(tmp_path / "again.onnx"), "--json")
    outputs = json.loads(as_json.stdout)["validation"]["outputs"]
    logits = [m for name, m in outputs.items() if "softmax" not in name][0]
    assert logits["decided_by"] == "runtime-rounding"
    assert logits["note"].startswith("within onnxruntime's own rounding")


def test_a_real_change_is_not_taken_for_rounding(tmp_path: Path) -> None:
    """The same zoo model with one Conv weight off by 1% fails, the figure beside."""
    src = _zoo_model("shufflenet", tmp_path)
    model = onnx.load(src)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    weight = next(t for t in model.graph.initializer if t.name == conv.input[1])
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.01, weight.name))
    report = validate(src, model)
    assert not report.passed
    logits = report.outputs[_logits_output(report)]
    assert logits.decided_by == "elementwise"
    assert "onnxruntime's own optimizer moves this output by" in logits.reason


# -- the movement rule: a bug far past onnxruntime's own move fails inside the fixed tolerance


def test_a_bug_inside_the_fixed_tolerance_fails_on_the_runtimes_movement() -> None:
    """x * 2 against x * 2.0002: inside atol 1e-4 + rtol 1e-3 everywhere, but onnxruntime's
    own optimizer moves it by nothing: far more than MOVEMENT_K times the floor."""
    from infercc.precisions import MOVEMENT_K

    report = validate(_scale_model(2.0), _scale_model(2.0002))
    y = report.outputs["y"]
    assert not report.passed and y.decided_by == "runtime-movement"
    assert y.movement_ratio > MOVEMENT_K
    assert f"more than {MOVEMENT_K:g}x is not rounding" in y.reason
    assert report.to_dict()["outputs"]["y"]["movement_ratio"] == pytest.approx(y.movement_ratio)
    # the fixed tolerance alone passes it; a tolerance the user states is the user's
    assert validate(_scale_model(2.0), _scale_model(2.0002), movement_k=None).passed
    loose = validate(_scale_model(2.0), _scale_model(2.0002), tolerances={"y": (1e-4, 1e-3)})
    assert loose.passed and loose.outputs["y"].decided_by != "runtime-movement"


def test_within_the_multiple_of_the_runtimes_move_passes() -> None:
    ref, cand, own = _logits()
    move = 0.9 * RUNTIME_ROUNDING_MULTIPLE * _own_move(own, ref)
    ref, cand, own = _logits(move)
    report, m = _compare(ref, cand, own)
    assert report.passed and m.movement_ratio == pytest.approx(0.9 * RUNTIME_ROUNDING_MULTIPLE)
