from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.check import compare as validate_module
from infercc.check.compare import (
    OutputMetrics,
    ValidationReport,
    compare_models,
    run_model,
)
from infercc.check.validation import validate
from infercc.errors import InferccError
from tests.helpers import make_model

NO_FEEDS: list[dict[str, np.ndarray]] = [{}]


def const_model(**outputs: np.ndarray) -> onnx.ModelProto:
    """A model without inputs whose outputs are the given constants."""
    nodes = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(a)))
        for name, a in outputs.items()
    ]
    infos = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in outputs.items()
    ]
    graph = helper.make_graph(nodes, "consts", [], infos)
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def add_model(offset: float, ir3: bool = False, unused_input: bool = False) -> onnx.ModelProto:
    """y = x + W with W = 0.5 + offset; in IR3 form W is also a graph input."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])]
    if ir3:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [3]))
    if unused_input:
        inputs.append(helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1]))
    weight = np.full(3, 0.5, np.float32) + np.float32(offset)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "add",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(weight, "W")],
    )
    opset, ir_version = (8, 3) if ir3 else (17, 8)
    return make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def compare_consts(ref: dict[str, np.ndarray], cand: dict[str, np.ndarray], **tol: float):
    return compare_models(const_model(**ref), const_model(**cand), NO_FEEDS, **tol)


# --------------------------------------------------------------------------- run_model


def test_run_model_accepts_path_bytes_and_proto(tmp_path: Path) -> None:
    model = add_model(0.0)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    feeds = [{"x": np.ones((2, 3), np.float32)}, {"x": np.zeros((1, 3), np.float32)}]
    for source in (model, model.SerializeToString(), path, str(path)):
        outs = run_model(source, feeds)
        assert [o["y"].tolist() for o in outs] == [[[1.5] * 3] * 2, [[0.5] * 3]]
    assert run_model(model, feeds, optimize=True)[0]["y"][0, 0] == 1.5


def test_run_model_large_proto_goes_through_external_data(monkeypatch) -> None:
    monkeypatch.setattr(validate_module, "MAX_INLINE_BYTES", 0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.eye(64, dtype=np.float32) * 2, "W")],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    x = np.arange(64, dtype=np.float32).reshape(1, 64)
    (out,) = run_model(model, [{"x": x}])
    np.testing.assert_array_equal(out["y"], x * 2)
    # The caller's proto keeps its weights in memory, unchanged.
    assert model.SerializeToString() == before


def test_run_model_reports_missing_input_and_bad_model(tmp_path: Path) -> None:
    with pytest.raises(InferccError, match="no value for model input.*'x'"):
        run_model(add_model(0.0), [{}])
    with pytest.raises(InferccError, match="onnxruntime cannot load the model"):
        run_model(b"not a model", [{}])
    with pytest.raises(InferccError, match="does not exist"):
        run_model(tmp_path / "missing.onnx", [{}])
    with pytest.raises(InferccError, match="failed to run"):
        run_model(add_model(0.0), [{"x": np.ones((2, 4), np.float32)}])


# --------------------------------------------------------------------------- tolerances


@pytest.mark.parametrize(("offset", "passes"), [(1e-2, False), (1e-7, True), (0.0, True)])
def test_candidate_within_or_beyond_tolerance(offset: float, passes: bool) -> None:
    feeds = [{"x": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)}]
    report = compare_models(add_model(0.0), add_model(offset), feeds)
    assert report.passed is passes
    y = report.outputs["y"]
    assert y.passed is passes and y.shape == (4, 3) and y.dtype == "float32"
    assert y.max_abs == pytest.approx(offset, rel=0.1, abs=1e-6)
    if not passes:
        assert y.frac_out_of_tol == 1.0
        assert "12 of 12 elements out of tolerance" in y.reason


def test_worst_sample_decides() -> None:
    ref = const_model(y=np.array([1.0, 2.0, 3.0, 4.0], np.float32))
    bad = const_model(y=np.array([1.0, 2.0, 3.0, 4.5], np.float32))
    report = compare_models(ref, bad, [{}, {}])
    assert report.samples == 2 and not report.passed
    assert report.outputs["y"].frac_out_of_tol == 0.25
    assert report.outputs["y"].max_rel == pytest.approx(0.125)


def test_an_output_within_atol_everywhere_passes_whatever_its_cosine() -> None:
    # A near-zero output (a probability map whose maximum is 3.6e-6): its cosine is rounding
    # noise, but every element is within atol, so it passes, and the report says why.
    rng = np.random.default_rng(0)
    ref = (rng.random(64) * 3.6e-6).astype(np.float32)
    cand = ref + (rng.standard_normal(64) * 1.5e-7).astype(np.float32)
    report = compare_consts({"y": ref}, {"y": cand})
    y = report.outputs["y"]
    assert y.max_abs < 1e-4 and y.cosine < 0.9999  # the cosine alone would fail it
    assert report.passed and y.decided_by == "atol"


def test_cosine_alone_can_fail() -> None:
    # Every element within atol + rtol * |r| (a loose rtol), not within atol: the cosine decides.
    ref = {"y": np.array([1.0, 1.0], np.float32)}
    cand = {"y": np.array([1.4, 0.6], np.float32)}
    report = compare_consts(ref, cand, rtol=0.5)
    assert report.outputs["y"].frac_out_of_tol == 0.0
    assert not report.passed and "cosine" in report.outputs["y"].reason
    assert report.outputs["y"].decided_by == "cosine"


def test_the_deciding_criterion_is_reported() -> None:
    ref = np.array([1.0, 2.0, 3.0], np.float32)
    checks = {
        "elementwise": (ref + 0.5, {}),
        "elementwise+cosine": (ref * (1 + 5e-4), {}),
        "cosine": (ref * (1 + 5e-4), {"atol": math.inf, "rtol": math.inf}),
        "atol": (ref + 1e-5, {}),
    }
    for expected, (cand, tol) in checks.items():
        y = compare_consts({"y": ref}, {"y": cand.astype(np.float32)}, **tol).outputs["y"]
        assert y.decided_by == expected, (expected, y)
    exact = compare_consts({"k": np.array([1, 2])}, {"k": np.array([1, 3])}).outputs["k"]
    assert exact.decided_by == "exact" and not exact.passed
    missing = compare_consts({"y": ref}, {"z": ref}).outputs["y"]
    assert missing.decided_by == "structure"
    json.dumps(compare_consts({"y": ref}, {"y": ref}).to_dict(), allow_nan=False)


def test_cosine_of_zero_vectors() -> None:
    zeros = {"y": np.zeros(4, np.float32)}
    assert compare_consts(zeros, zeros).outputs["y"].cosine == 1.0
    tiny = {"y": np.full(4, 1e-6, np.float32)}
    assert compare_consts(zeros, tiny).passed  # within atol everywhere
    report = compare_consts(zeros, tiny, atol=math.inf, rtol=math.inf)  # fp16's: cosine only
    assert report.outputs["y"].cosine == 0.0 and not report.passed


def test_empty_tensors_pass() -> None:
    empty = {"y": np.zeros((0, 3), np.float32), "i": np.zeros((2, 0), np.int64)}
    report = compare_consts(empty, empty)
    assert report.passed and report.outputs["y"].shape == (0, 3)


# --------------------------------------------------------------------------- NaN and inf


def test_nan_in_same_places_is_equal() -> None:
    y = {"y": np.array([1.0, np.nan, -np.inf, np.inf], np.float32)}
    report = compare_consts(y, y)
    assert report.passed and report.outputs["y"].cosine == 1.0


@pytest.mark.parametrize(
    "cand",
    [
        [1.0, 2.0, np.nan, 4.0],  # NaN where the reference has a number
        [np.nan, np.nan, 3.0, 4.0],  # NaN moved
        [1.0, np.nan, 3.0, np.inf],  # inf where the reference has a number
    ],
)
def test_nan_or_inf_mismatch_fails(cand: list[float]) -> None:
    ref = {"y": np.array([1.0, np.nan, 3.0, 4.0], np.float32)}
    report = compare_consts(ref, {"y": np.array(cand, np.float32)})
    assert not report.passed
    assert report.outputs["y"].max_abs == math.inf
    json.dumps(report.to_dict(), allow_nan=False)


def test_inf_sign_must_match() -> None:
    ref = {"y": np.array([np.inf, 1.0], np.float32)}
    assert compare_consts(ref, ref).passed
    assert not compare_consts(ref, {"y": np.array([-np.inf, 1.0], np.float32)}).passed


# --------------------------------------------------------------------------- exact outputs


def test_integer_and_bool_outputs_must_match_exactly() -> None:
    ref = {"i": np.array([1, 2, 3], np.int64), "b": np.array([True, False])}
    assert compare_consts(ref, ref).passed
    off_by_one = {"i": np.array([1, 2, 4], np.int64), "b": ref["b"]}
    report = compare_consts(off_by_one, ref, atol=10.0, rtol=10.0, min_cosine=0.0)
    assert not report.outputs["i"].passed and report.outputs["b"].passed
    assert report.outputs["i"].max_abs == 1.0


def test_large_int64_difference_is_not_lost_in_float64() -> None:
    big = 2**60
    ref = {"i": np.array([big], np.int64)}
    assert not compare_consts(ref, {"i": np.array([big + 1], np.int64)}).passed


# --------------------------------------------------------------------------- structure


def test_missing_and_extra_outputs_fail() -> None:
    ref = {"y": np.ones(2, np.float32), "z": np.ones(2, np.float32)}
    cand = {"y": np.ones(2, np.float32), "w": np.ones(2, np.float32)}
    report = compare_consts(ref, cand)
    assert not report.passed
    assert report.outputs["y"].passed
    assert not report.outputs["z"].passed and "missing" in report.outputs["z"].reason
    assert report.outputs["z"].max_abs is None
    assert not report.outputs["w"].passed and "not an output of the reference" in (
        report.outputs["w"].reason
    )
    assert [m.name for m in report.failures()] == ["z", "w"]


def test_shape_and_dtype_differences_fail() -> None:
    ref = {"y": np.ones((2, 3), np.float32), "z": np.ones(3, np.float32)}
    cand = {"y": np.ones((3, 2), np.float32), "z": np.ones(3, np.float16)}
    report = compare_consts(ref, cand)
    assert "shape [3, 2] differs from the reference's [2, 3]" in report.outputs["y"].reason
    assert "dtype float16 differs" in report.outputs["z"].reason
    assert not report.outputs["y"].passed and not report.outputs["z"].passed


def test_float_dtype_change_allowed_when_declared() -> None:
    from infercc.check.compare import compare_outputs

    ref = [{"z": np.linspace(-1, 1, 8).astype(np.float32), "i": np.arange(3)}]
    cand = [{"z": ref[0]["z"].astype(np.float16), "i": np.arange(3).astype(np.int32)}]
    report = compare_outputs(ref, cand, atol=1e-3, rtol=1e-3, float_dtypes_may_differ=True)
    assert report.outputs["z"].passed and report.outputs["z"].max_abs < 1e-3
    assert "dtype int32 differs" in report.outputs["i"].reason  # only float types may change


# --------------------------------------------------------------------------- report


def test_to_dict_is_plain_json() -> None:
    ref = {"y": np.array([1.0, np.nan], np.float32), "z": np.ones(1, np.float32)}
    cand = {"y": np.array([1.0, 2.0], np.float32)}
    report = compare_consts(ref, cand)
    data = report.to_dict()
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text) == data
    y, z = data["outputs"]["y"], data["outputs"]["z"]
    assert y["max_abs"] is None and y["shape"] == [2] and y["passed"] is False  # inf: null
    assert z["max_abs"] is None and z["reason"] == "missing from the candidate"
    assert data["atol"] == 1e-4 and type(data["samples"]) is int


def test_to_dict_renders_numpy_scalars_as_floats() -> None:
    metrics = OutputMetrics(
        "y",
        (2,),
        "float32",
        np.float64(0.5),
        np.float32(-np.inf),
        np.float64(np.nan),
        np.float64(0.0),
        np.bool_(True),
    )
    report = ValidationReport(np.bool_(True), {"y": metrics}, 1, 1e-4, 1e-3, 0.9999)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["outputs"]["y"]["max_abs"] == 0.5
    assert data["outputs"]["y"]["max_rel"] is None and data["outputs"]["y"]["cosine"] is None
    assert data["passed"] is True


# --------------------------------------------------------------------------- validate


def test_validate_feeds_candidate_only_what_it_declares(tmp_path: Path) -> None:
    reference = add_model(0.0, ir3=True, unused_input=True)
    candidate = add_model(0.0)
    onnx.save(reference, tmp_path / "ref.onnx")
    report = validate(tmp_path / "ref.onnx", candidate, shapes={"x": (5, 3)})
    assert report.passed and report.samples == 2  # the pinned profile and a second one
    assert report.outputs["y"].shape == (5, 3)
    assert [p["shapes"]["x"] for p in report.profiles] == [[5, 3], [34, 3]]
    assert [p["source"] for p in report.profiles] == ["pinned", "derived"]


def test_validate_detects_a_changed_weight() -> None:
    report = validate(add_model(0.0, ir3=True), add_model(1e-2).SerializeToString(), seed=1)
    assert not report.passed


def test_validate_with_data(tmp_path: Path) -> None:
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", x=np.full((i + 1, 3), i, np.float32))
    report = validate(add_model(0.0), add_model(1e-7), data=tmp_path, atol=1e-5)
    assert report.passed and report.samples == 3
    assert report.atol == 1e-5


def test_validate_with_bad_data_names_the_problem(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", x=np.zeros((1, 3), np.float64))
    with pytest.raises(InferccError, match="input 'x' is float64"):
        validate(add_model(0.0), add_model(0.0), data=tmp_path)


def test_no_samples_is_an_error() -> None:
    with pytest.raises(InferccError, match="no samples"):
        compare_models(add_model(0.0), add_model(0.0), [])


def test_external_data_restores_subgraph_weights(monkeypatch) -> None:
    monkeypatch.setattr(validate_module, "MAX_INLINE_BYTES", 0)
    weights = np.arange(512, dtype=np.float32)

    def branch(name: str, scale: float) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Identity", [f"{name}_w"], [f"{name}_out"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [512])],
            [numpy_helper.from_array(weights * scale, f"{name}_w")],
        )

    graph = helper.make_graph(
        [
            helper.make_node(
                "If", ["cond"], ["y"], then_branch=branch("then", 1), else_branch=branch("else", 2)
            )
        ],
        "if",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    outs = run_model(model, [{"cond": np.array(True)}, {"cond": np.array(False)}])
    np.testing.assert_array_equal(outs[1]["y"], weights * 2)
    assert model.SerializeToString() == before
