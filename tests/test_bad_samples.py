"""Samples that measure nothing are bad input: zero rows on the batch axis, or NaN/infinity.

Calibrating on them used to write a model and report cosine 1.0 (the metric of no data, or of
NaN against NaN); every path that reads samples refuses them in one line naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

from infercc.data.samples import load_samples
from infercc.errors import InferccError
from tests.helpers import make_model, mlp_model
from tests.inproc import run_main


def _model(path: Path) -> Path:
    """tests.helpers.mlp_model (seed 3)."""
    return mlp_model(path, seed=3)


def _samples(directory: Path, bad: str) -> Path:
    directory.mkdir()
    rng = np.random.default_rng(4)
    for i in range(4):
        x = rng.standard_normal((2, 64)).astype(np.float32)
        np.savez(directory / f"s{i}.npz", x=x)
    if bad == "empty":
        x = np.zeros((0, 64), np.float32)
    else:
        x = rng.standard_normal((2, 64)).astype(np.float32)
        x[1, 5] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[bad]
    np.savez(directory / "s2.npz", x=x)
    return directory / "s2.npz"


WHAT = {
    "empty": "0 rows along the batch axis",
    "nan": "holds NaN (1 of 128 elements)",
    "inf": "holds infinity (1 of 128 elements)",
    "-inf": "holds infinity (1 of 128 elements)",
}


@pytest.mark.parametrize("bad", sorted(WHAT))
def test_load_samples_refuses(tmp_path: Path, bad: str) -> None:
    model = onnx.load(_model(tmp_path / "m.onnx"))
    bad_file = _samples(tmp_path / "data", bad)
    with pytest.raises(InferccError) as info:
        load_samples(tmp_path / "data", model)
    assert str(bad_file) in info.value.message
    assert "'x'" in info.value.message and WHAT[bad] in info.value.message


def test_stacked_file_with_empty_batch_is_refused(tmp_path: Path) -> None:
    model = onnx.load(_model(tmp_path / "m.onnx"))
    np.savez(tmp_path / "all.npz", x=np.zeros((3, 0, 64), np.float32))
    with pytest.raises(InferccError, match=r"all.npz\[0\]'.*0 rows along the batch axis"):
        load_samples(tmp_path / "all.npz", model)


def test_an_empty_later_axis_stays_allowed(tmp_path: Path) -> None:
    """A decoder's empty past ([batch, heads, 0, dim]) is a real input."""
    graph = oh.make_graph(
        [oh.make_node("Identity", ["past"], ["y"])],
        "past",
        [oh.make_tensor_value_info("past", TensorProto.FLOAT, ["b", 2, "p", 4])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2, "p", 4])],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    np.savez(tmp_path / "s.npz", past=np.zeros((1, 2, 0, 4), np.float32))
    (sample,) = load_samples(tmp_path / "s.npz", model)
    assert sample["past"].shape == (1, 2, 0, 4)


RUNS = {
    "int8": ["--int8"],
    "int4-rtn": ["--int4", "--method", "rtn"],
    "int4-gptq": ["--int4", "--method", "gptq"],
    "int4-awq": ["--int4", "--method", "awq"],
}


@pytest.mark.parametrize("bad", ["empty", "nan"])
@pytest.mark.parametrize("run", sorted(RUNS))
def test_calibrate_refuses_in_one_line_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    run: str,
    bad: str,
) -> None:
    model = _model(tmp_path / "m.onnx")
    bad_file = _samples(tmp_path / "data", bad)
    out = tmp_path / "out"
    args = ["calibrate", str(model), "-o", str(out), "--data", str(tmp_path / "data")]
    result = run_main(monkeypatch, capsys, *args, *RUNS[run])
    assert result.code == 2, result.text
    text = result.text
    assert "Traceback" not in text and "internal error" not in text
    assert str(bad_file) in text and WHAT[bad] in text
    assert "the weight holds" not in text
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "m.onnx"]
