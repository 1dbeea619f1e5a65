"""`infercc validate`: candidates (files and artifacts) against a reference or goldens,
precision-dependent tolerances, per-output tolerances, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from infercc.check.candidates import validate_candidate
from infercc.check.goldens import load_golden, save_golden
from infercc.check.tolerances import (
    default_tolerance,
    detect_precision,
    model_precision,
    parse_tolerances,
)
from infercc.errors import InferccError
from tests.helpers import run_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

ADD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
  s = Add(x, w)
  y = Relu(s)
  z = Mul(x, w)
}
"""


@pytest.fixture(autouse=True)
def private_tuning_cache(tmp_path: Path, monkeypatch) -> None:
    """Artifacts built here tune into a cache of their own, never the user's."""
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "tuning-cache"))


def add_model(path: Path, offset: float = 0.0, y_offset: float = 0.0) -> Path:
    """y = relu(x + w) (+ y_offset), z = x * w; w = 0..3 + offset."""
    proto = onnx.parser.parse_model(ADD)
    w = np.arange(4, dtype=np.float32) + np.float32(offset)
    proto.graph.initializer.append(numpy_helper.from_array(w, "w"))
    if y_offset:
        proto.graph.node[1].output[0] = "y0"
        k = numpy_helper.from_array(np.full(4, y_offset, np.float32), "k")
        proto.graph.initializer.append(k)
        proto.graph.node.append(onnx.helper.make_node("Add", ["y0", "k"], ["y"]))
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, path)
    return path


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("y = Relu(x)", "fp32"),
        ("h = Cast<to = 10>(x)\n y = Cast<to = 1>(h)", "fp16"),
        (
            "q = QuantizeLinear(x, s, zp)\n y = DequantizeLinear(q, s, zp)",
            "int8",
        ),
    ],
)
def test_model_precision_reads_the_graph(body: str, expected: str) -> None:
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y)
    <float s = {{0.1}}, int8 zp = {{0}}> {{
      {body}
    }}
    """
    assert model_precision(onnx.parser.parse_model(text)) == expected


def test_default_tolerance_follows_precision() -> None:
    assert default_tolerance("fp32") == {"atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999}
    fp16 = default_tolerance("fp16")
    assert fp16["min_cosine"] == 0.999 and fp16["atol"] == float("inf")
    assert default_tolerance("int8")["min_cosine"] == 0.99
    assert default_tolerance("int8", min_cosine=0.5)["min_cosine"] == 0.5
    assert default_tolerance("fp16", atol=0.1)["atol"] == 0.1


def test_parse_tolerances() -> None:
    assert parse_tolerances(["logits=1e-3:1e-2", "a/b:0=0:0.5"]) == {
        "logits": (1e-3, 1e-2),
        "a/b:0": (0.0, 0.5),
    }
    for bad in ("logits", "logits=1e-3", "=1:1", "x=a:b", "x=-1:0"):
        with pytest.raises(InferccError, match="--tol"):
            parse_tolerances([bad])


# --------------------------------------------------------------------------- validating


def test_validate_candidate_passes_and_fails(tmp_path: Path) -> None:
    ref = add_model(tmp_path / "ref.onnx")
    same = validate_candidate(add_model(tmp_path / "same.onnx"), ref)
    assert same.passed and same.precision == "fp32"
    off = validate_candidate(add_model(tmp_path / "off.onnx", offset=0.01), ref)
    assert not off.passed
    z = off.validation.outputs["z"]
    assert not z.passed and z.max_abs > 1e-3 and 0 < z.frac_out_of_tol <= 1
    data = off.to_dict()
    assert data["passed"] is False and data["bisect"] is None


def test_per_output_tolerance(tmp_path: Path) -> None:
    ref = add_model(tmp_path / "ref.onnx")
    cand = add_model(tmp_path / "cand.onnx", y_offset=1e-3)
    assert not validate_candidate(cand, ref).passed
    loose = validate_candidate(cand, ref, tolerances={"y": (1e-2, 0.0)})
    assert loose.passed
    assert loose.to_dict()["validation"]["tolerances"] == {"y": {"atol": 1e-2, "rtol": 0.0}}
    # the override is per output: z keeps the default and still fails when off
    off = add_model(tmp_path / "z.onnx", offset=0.01)
    wrong = validate_candidate(off, ref, tolerances={"y": (1.0, 0.0)})
    assert wrong.validation.outputs["y"].passed
    assert not wrong.validation.outputs["z"].passed


def test_goldens_round_trip_without_the_reference(tmp_path: Path) -> None:
    ref = add_model(tmp_path / "ref.onnx")
    only = validate_candidate(None, ref, save_golden_to=tmp_path / "gold", shapes={"x": (3, 4)})
    assert only.validation is None and only.saved_golden == str(tmp_path / "gold")
    feeds, outputs, meta = load_golden(tmp_path / "gold")
    assert feeds[0]["x"].shape == (3, 4) and set(outputs[0]) == {"y", "z"}
    assert meta["reference_sha256"] and meta["samples"] == 2  # two shape profiles
    ref.unlink()  # goldens need no reference
    assert validate_candidate(add_model(tmp_path / "c.onnx"), golden=tmp_path / "gold").passed
    bad = validate_candidate(add_model(tmp_path / "d.onnx", 0.5), golden=tmp_path / "gold")
    assert not bad.passed


def test_save_golden_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InferccError, match="holds no goldens"):
        save_golden(tmp_path / "mine", [{"x": np.zeros(1)}], [{"y": np.zeros(1)}])
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_source_conflicts_are_errors(tmp_path: Path) -> None:
    ref = add_model(tmp_path / "ref.onnx")
    with pytest.raises(InferccError, match="nothing to compare"):
        validate_candidate(ref)
    with pytest.raises(InferccError, match="exclude"):
        validate_candidate(ref, golden=tmp_path, data=tmp_path)
    with pytest.raises(InferccError, match="--bisect"):
        validate_candidate(ref, golden=tmp_path, bisect=True)


def test_artifact_candidate_runs_through_its_backend(tmp_path: Path) -> None:
    from infercc.api import optimize

    src = EXAMPLES / "small_cnn.onnx"
    optimize(src, tmp_path / "art", backend="ort", tune=False, cache_dir=tmp_path / "cache")
    assert detect_precision(tmp_path / "art") == "fp32"
    report = validate_candidate(tmp_path / "art", src)
    assert report.passed
    assert report.validation.outputs["logits"].cosine > 0.9999


# --------------------------------------------------------------------------- CLI


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    ref = add_model(tmp_path / "ref.onnx")
    good = add_model(tmp_path / "good.onnx")
    bad = add_model(tmp_path / "bad.onnx", offset=0.01)
    r = run_cli("validate", str(good), "--reference", str(ref), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["validation"]["outputs"]["y"]["passed"] is True
    r = run_cli("validate", str(bad), "--reference", str(ref))
    assert r.returncode == 1
    assert "FAILED" in r.stdout
    r = run_cli("validate", str(bad), "--reference", str(ref), "--tol", "nonsense")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--tol" in r.stderr


def test_cli_save_golden_then_golden(tmp_path: Path) -> None:
    ref = add_model(tmp_path / "ref.onnx")
    gold = tmp_path / "gold"
    r = run_cli("validate", "--reference", str(ref), "--save-golden", str(gold))
    assert r.returncode == 0, r.stderr
    assert (gold / "golden.json").is_file()
    r = run_cli("validate", str(add_model(tmp_path / "c.onnx")), "--golden", str(gold), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["golden"] == str(gold) and data["reference"] is None


def test_a_candidate_with_other_inputs_is_named(tmp_path: Path) -> None:
    r = run_cli(
        "validate",
        str(EXAMPLES / "small_cnn.onnx"),
        "--reference",
        str(EXAMPLES / "tiny_encoder.onnx"),
    )
    assert r.returncode == 2
    assert "the candidate takes input(s) 'image' that the reference does not provide" in r.stderr
    assert "Traceback" not in r.stderr
