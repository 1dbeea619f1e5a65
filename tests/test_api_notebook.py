"""The Python API in a notebook: `optimize` without an output gives the optimized model back (as
onnxslim's `slim(model)` does), samples in memory wherever `--data` takes a path, and
`dir(infercc)` that lists the API alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import infercc
from infercc.api import OptimizedModel
from infercc.config import BuildConfig
from infercc.errors import InferccError
from tests.helpers import assert_same_outputs, mlp_model, parse

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) {
    a = Relu(x)
    b = Identity(a)
    y = Add(b, x)
}
"""

TWO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x, float[N, 4] z) => (float[N, 4] y) {
    y = Add(x, z)
}
"""


def samples(n: int = 3, batch: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((batch, 4)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("notebook") / "m.onnx"
    onnx.save(parse(MODEL), path)
    return path


# --------------------------------------------------------------------------- dir(infercc)


def test_dir_lists_the_api_alone() -> None:
    import infercc.api  # noqa: F401 - a loaded submodule is no public name either

    assert dir(infercc) == sorted(infercc.__all__)
    for stray in ("Any", "annotations", "importlib", "api", "version"):
        assert stray not in dir(infercc)


def test_a_fresh_import_binds_no_stray_names() -> None:
    code = (
        "import infercc\n"
        "names = [n for n in vars(infercc) if not n.startswith('_')]\n"
        "print(sorted(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['version']"  # the submodule __version__ comes from


# --------------------------------------------------------------------------- optimize


def test_optimize_without_output_returns_the_model_and_its_report(source, tmp_path) -> None:
    before = sorted(p.name for p in source.parent.iterdir())
    result = infercc.optimize(source)
    assert isinstance(result, OptimizedModel)
    model, report = result
    assert result.model is model and result.report is report
    onnx.checker.check_model(model)
    assert report.nodes_before == 3 and report.nodes_after == 2 and report.passed
    assert report.output == "<onnx.ModelProto>" and report.files == []
    for batch in (1, 5):  # N is symbolic: two values
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        assert_same_outputs(onnx.load(source), model, {"x": x})
    assert sorted(p.name for p in source.parent.iterdir()) == before  # nothing written
    again, _ = infercc.optimize(model)  # an optimized model is a fixpoint
    assert again.graph == model.graph


# --------------------------------------------------------------------------- samples in memory


@pytest.mark.parametrize(
    ("data", "count"),
    [
        (samples(), 3),  # a list of {name: array}
        (samples()[0], 1),  # one sample
        ({"x": np.stack([s["x"] for s in samples()])}, 3),  # N stacked on axis 0, as in an .npz
        (samples()[0]["x"], 1),  # an array, for a model of one input
        ([s["x"] for s in samples()], 3),  # arrays
        ((s for s in samples()), 3),  # a generator
    ],
    ids=["list", "dict", "stacked", "array", "arrays", "generator"],
)
def test_validate_takes_samples_in_memory(source, data, count) -> None:
    report = infercc.validate(source, source, data=data)
    assert report.passed
    first = report.validation.profiles[0]
    assert first["source"] == "data" and first["samples"] == count
    assert first["shapes"]["x"] == [2, 4]


def test_optimize_validates_on_samples_in_memory(source, tmp_path) -> None:
    report = infercc.optimize(source, tmp_path / "o.onnx", data=samples(4))
    assert report.passed and report.written
    first = report.validation.profiles[0]
    assert first["source"] == "data" and first["samples"] == 4
    assert report.build["data"] == "<in-memory samples>"  # the record names no samples


def test_calibrate_takes_samples_in_memory(tmp_path) -> None:
    source = mlp_model(tmp_path / "mlp.onnx")
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 64)).astype(np.float32)} for _ in range(10)]
    report = infercc.calibrate(source, data, tmp_path / "q", speed_check=False)
    assert report.samples == {"calibration": 8, "holdout": 2, "evaluated_on": "holdout"}
    assert (tmp_path / "q" / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (5, "data must be a path or samples in memory; got int"),
        ([{"x": np.zeros((2, 4), np.float32)}, 7], "sample 1 is a int"),
        ([], "the samples given are empty"),
        ([{"x": np.zeros((2, 4), np.float64)}], "'sample 0': input 'x' is float64"),
        ([{"y": np.zeros((2, 4), np.float32)}], "'sample 0' lacks input 'x'"),
    ],
)
def test_bad_samples_in_memory_are_one_line_errors(source, data, message) -> None:
    with pytest.raises(InferccError) as info:
        infercc.validate(source, source, data=data)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_array_needs_a_model_of_one_input(tmp_path) -> None:
    path = tmp_path / "two.onnx"
    onnx.save(parse(TWO_INPUTS), path)
    with pytest.raises(InferccError, match=r"is an array, and the model has 2 inputs \(x, z\)"):
        infercc.validate(path, path, data=np.zeros((2, 4), np.float32))


def test_a_build_config_records_a_path_not_samples() -> None:
    with pytest.raises(InferccError, match="BuildConfig.data is a path or SCRIPT.py:FN"):
        BuildConfig(data=samples())  # type: ignore[arg-type]
