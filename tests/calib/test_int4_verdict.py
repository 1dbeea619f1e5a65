"""One verdict per artifact: `calibrate --int4` writes the criterion it accepted the model at
into the manifest, and `infercc validate` of the directory applies it (a --min-cosine given
wins). Before, calibrate said done at cosine 0.982 and validate refused the same artifact at
0.9875 < 0.99."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import infercc
from infercc.calib.weight_only import calibrate_int4
from infercc.check.tolerances import CALIBRATED_COSINE_MARGIN, calibrated_criterion
from infercc.precisions import TOLERANCES
from tests.calib.test_weight_only import mlp
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """An int4 MLP at block 128 (cosine ~0.98 against fp32): (source, artifact, its cosine)."""
    root = tmp_path_factory.mktemp("int4")
    src = mlp(root)
    report = calibrate_int4(src, root / "out", block_size=128, symmetric=True, speed_check=False)
    assert report.passed
    return src, root / "out", report.quality.cosine


def test_the_manifest_records_the_criterion(calibrated) -> None:
    _, out, cosine = calibrated
    criterion = json.loads((out / "manifest.json").read_text())["criterion"]
    assert criterion["by"] == "calibrate --int4"
    assert criterion["cosine"] == pytest.approx(cosine)
    assert criterion["min_cosine"] <= cosine - CALIBRATED_COSINE_MARGIN
    assert criterion["min_cosine"] > cosine - CALIBRATED_COSINE_MARGIN - 0.001
    assert criterion["evaluated_on"]


def test_validate_honours_it(calibrated) -> None:
    src, out, cosine = calibrated
    assert cosine < TOLERANCES["int4"].min_cosine  # the table alone would refuse it...
    table = infercc.validate(out, src, min_cosine=TOLERANCES["int4"].min_cosine)
    assert not table.passed  # ...and did: the two verdicts differed
    report = infercc.validate(out, src)
    assert report.passed
    assert report.validation.min_cosine == pytest.approx(
        calibrated_criterion(cosine, "", "")["min_cosine"]
    )
    assert report.criterion.startswith("calibrate --int4 accepted this artifact at cosine")
    assert report.to_dict()["criterion"] == report.criterion


def test_a_broken_artifact_still_fails(calibrated, tmp_path: Path) -> None:
    src, out, _ = calibrated
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in out.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    model = onnx.load(broken / "model_int4.onnx")
    scales = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    for t in scales:
        t.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(t), t.name))
    onnx.save(model, broken / "model_int4.onnx")
    report = infercc.validate(broken, src)
    assert not report.passed and report.criterion is not None


def test_the_cli_says_which_criterion(calibrated) -> None:
    src, out, _ = calibrated
    shown = run_cli("validate", str(out), "--reference", str(src))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "criterion: calibrate --int4 accepted this artifact" in " ".join(shown.stdout.split())
    strict = run_cli("validate", str(out), "--reference", str(src), "--min-cosine", "0.99")
    assert strict.returncode == 1


def test_the_criterion_never_exceeds_the_table() -> None:
    assert calibrated_criterion(0.9999, "calibrate --int4", "x")["min_cosine"] == 0.99
    assert calibrated_criterion(0.98208, "calibrate --int4", "x")["min_cosine"] == 0.977
    assert calibrated_criterion(float(np.float32(0.5)), "b", "x")["min_cosine"] == 0.495
