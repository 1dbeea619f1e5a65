"""An output (near-)constant on the validation inputs is named: its cosine shows as n/a (null
in JSON) and the report says validation is weak for it, naming --data on generated inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infercc.check.compare import compare_outputs
from infercc.check.validation import WEAK_GENERATED, validate
from tests.helpers import make_model, run_cli


def _saturated(offset: float, scale: float = 10.0) -> onnx.ModelProto:
    """`map` = Sigmoid(-(|x|·scale + offset)): below 2.1e-9 everywhere, a sigmoid map saturated
    at 0 (as a text detector's on random images); `score` = x·2, which varies."""
    graph = helper.make_graph(
        [
            helper.make_node("Abs", ["x"], ["a"]),
            helper.make_node("Mul", ["a", "k"], ["s"]),
            helper.make_node("Add", ["s", "c"], ["t"]),
            helper.make_node("Neg", ["t"], ["n"]),
            helper.make_node("Sigmoid", ["n"], ["map"]),
            helper.make_node("Mul", ["x", "two"], ["score"]),
        ],
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [
            helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, 8, 8]),
            helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 1, 8, 8]),
        ],
        [
            numpy_helper.from_array(np.array(scale, np.float32), "k"),
            numpy_helper.from_array(np.array(offset, np.float32), "c"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        ],
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_saturated_map_is_named_and_its_cosine_is_na() -> None:
    report = validate(_saturated(20.0), _saturated(20.5))
    assert report.passed
    m, score = report.outputs["map"], report.outputs["score"]
    assert m.near_constant and m.cosine is None and m.note == WEAK_GENERATED
    assert m.decided_by == "atol"
    assert not score.near_constant and score.cosine is not None and score.note is None
    data = report.to_dict()["outputs"]["map"]
    assert data["cosine"] is None and data["near_constant"] is True
    assert data["note"] == "validation is weak on generated inputs for this output: give --data"


def test_a_constant_that_fails_on_its_cosine_keeps_it() -> None:
    """A near-constant reference whose candidate turns within a loose rtol: the cosine decided
    the failure and is shown."""
    ref = np.ones(8, np.float32)
    cand = np.where(np.arange(8) % 2 == 0, 1.4, 0.6).astype(np.float32)
    report = compare_outputs([{"y": ref}], [{"y": cand}], rtol=0.5)
    y = report.outputs["y"]
    assert y.near_constant and y.decided_by == "cosine" and not y.passed
    assert y.cosine is not None


def test_the_cli_shows_na_and_names_data(tmp_path: Path) -> None:
    reference, candidate = tmp_path / "ref.onnx", tmp_path / "cand.onnx"
    onnx.save(_saturated(20.0), reference)
    onnx.save(_saturated(20.5), candidate)
    shown = run_cli("validate", str(candidate), "--reference", str(reference))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    row = next(line for line in shown.stdout.splitlines() if " map " in line)
    assert "n/a" in row
    assert f"map: {WEAK_GENERATED}" in " ".join(shown.stdout.split())
    as_json = run_cli("validate", str(candidate), "--reference", str(reference), "--json")
    outputs = json.loads(as_json.stdout)["validation"]["outputs"]
    assert outputs["map"]["cosine"] is None and outputs["score"]["cosine"] is not None


def test_samples_given_say_so(tmp_path: Path) -> None:
    samples = tmp_path / "samples.npz"
    rng = np.random.default_rng(0)
    np.savez(samples, x=rng.standard_normal((1, 1, 8, 8)).astype(np.float32))
    report = validate(_saturated(20.0), _saturated(20.5), data=samples)
    assert report.outputs["map"].note.startswith("validation is weak for this output")


def test_a_near_zero_map_flushed_by_fp16_is_judged_at_fp16s_resolution() -> None:
    """A sigmoid map near 1e-6 that fp16 flushes to 0: the cosine of rounding fails it; at
    fp16's resolution (its smallest normal, 2**-14) it passes, and the note says so. fp32 and
    a real error keep their verdicts."""
    rng = np.random.default_rng(0)
    ref = (rng.random(256) * 1.3e-6).astype(np.float32)
    flushed = np.where(ref < 1e-6, 0.0, ref).astype(np.float32)
    cos = dict(atol=float("inf"), rtol=float("inf"), min_cosine=0.999)
    assert not compare_outputs([{"map": ref}], [{"map": flushed}], **cos).passed
    report = compare_outputs([{"map": ref}], [{"map": flushed}], precision="fp16", **cos)
    m = report.outputs["map"]
    assert report.passed and m.decided_by == "resolution" and m.near_constant
    assert "judged at fp16's resolution" in m.note and f"within {2.0**-14:.3g}" in m.note
    wrong = (ref + 2e-4).astype(np.float32)  # past fp16's resolution at this magnitude
    assert not compare_outputs([{"map": ref}], [{"map": wrong}], precision="fp16", **cos).passed
    bf16 = compare_outputs([{"map": ref}], [{"map": flushed}], precision="bf16", **cos)
    assert not bf16.passed  # bf16 keeps fp32's exponent: a flush is past its resolution


def _grows_with_width() -> onnx.ModelProto:
    """`map` = Sigmoid(x + W - 60) for x of width W: saturated near 0 at the default width,
    varying from W = 64 on; `score` = x, which always varies."""
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"], start=3, end=4),
            helper.make_node("Cast", ["s"], ["w"], to=TensorProto.FLOAT),
            helper.make_node("Sub", ["w", "sixty"], ["shift"]),
            helper.make_node("Add", ["x", "shift"], ["t"]),
            helper.make_node("Sigmoid", ["t"], ["map"]),
            helper.make_node("Identity", ["x"], ["score"]),
        ],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, "W"])],
        [
            helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, 4, "W"]),
            helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 1, 4, "W"]),
        ],
        [numpy_helper.from_array(np.array([60.0], np.float32), "sixty")],
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_generated_inputs_that_leave_an_output_flat_are_replaced_by_a_size_where_it_varies():
    model = _grows_with_width()
    report = validate(model, model)
    assert report.passed
    first = report.profiles[0]
    assert first["source"] == "ladder" and first["shapes"]["x"][3] >= 64
    note = next(n for n in report.notes if "near-constant" in n)
    assert "output 'map' is near-constant" in note and "where every output varies" in note
    assert not report.outputs["map"].near_constant


def test_a_pinned_shape_is_kept_even_where_an_output_stays_flat() -> None:
    model = _grows_with_width()
    report = validate(model, model, shapes={"x": (1, 1, 4, 8)})
    assert report.profiles[0]["shapes"]["x"] == [1, 1, 4, 8]
    assert report.outputs["map"].near_constant
