"""The Python API a newcomer meets: `import infercc`, `help(infercc)`, `infercc.optimize` and
`infercc.validate` with paths, in-memory models and `--shape`-style strings."""

from __future__ import annotations

import pkgutil
import pydoc
import subprocess
import sys
from pathlib import Path

import onnx
import onnx.numpy_helper
import pytest

import infercc
from infercc.errors import InferccError
from tests.helpers import parse

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) {
    a = Relu(x)
    b = Identity(a)
    y = Add(b, x)
}
"""

SRC = Path(infercc.__file__).resolve().parent


def test_public_names_are_no_submodule_names():
    submodules = {m.name for m in pkgutil.iter_modules([str(SRC)])}
    assert not set(infercc.__all__) & submodules
    assert "validation" in submodules  # the module behind infercc.validate


def test_validate_stays_callable_after_optimize(tmp_path):
    # A fresh interpreter: the lazily loaded names must survive every submodule import.
    model = tmp_path / "m.onnx"
    onnx.save(parse(MODEL), model)
    code = (
        "import infercc, pkgutil, importlib\n"
        f"r = infercc.optimize({str(model)!r}, {str(tmp_path / 'o.onnx')!r})\n"
        "for m in ('infercc.cli', 'infercc.cli.validate', 'infercc.cli.optimize'):\n"
        "    importlib.import_module(m)\n"
        f"v = infercc.validate({str(tmp_path / 'o.onnx')!r}, {str(model)!r})\n"
        "assert v.passed, v.to_dict()\n"
        "assert all(callable(getattr(infercc, n)) for n in infercc.__all__ if n != '__version__')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_dir_and_help_show_the_api():
    names = dir(infercc)
    for name in ("optimize", "validate", "calibrate", "inspect_model"):
        assert name in names
    text = pydoc.render_doc(infercc, renderer=pydoc.plaintext)
    assert "optimize(model" in text
    assert "validate(candidate" in text


def test_package_is_typed():
    assert (SRC / "py.typed").is_file()
    pyproject = (SRC.parent.parent / "pyproject.toml").read_text()
    assert '"py.typed"' in pyproject


def test_validate_takes_the_cli_order(tmp_path):
    ref, cand = tmp_path / "ref.onnx", tmp_path / "cand.onnx"
    onnx.save(parse(MODEL), ref)
    infercc.optimize(ref, cand)
    report = infercc.validate(cand, ref)
    assert report.passed
    assert report.candidate == str(cand) and report.reference == str(ref)


def test_optimize_and_validate_accept_a_model_proto(tmp_path):
    proto = parse(MODEL)
    out = tmp_path / "o.onnx"
    report = infercc.optimize(proto, out, shapes={"x": "2x4"})
    assert report.input == "<onnx.ModelProto>"
    assert report.nodes_before == 3 and report.nodes_after == 2  # the Identity went
    assert report.validation is not None and report.validation.passed
    check = infercc.validate(onnx.load(out), proto, shapes={"x": "3x4"})
    assert check.passed
    assert check.candidate == check.reference == "<onnx.ModelProto>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.memory_plan.json", "o.onnx"]


def test_proto_without_an_output_comes_back_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, report = infercc.optimize(parse(MODEL))
    assert isinstance(model, onnx.ModelProto) and len(model.graph.node) == 2
    assert report.input == report.output == "<onnx.ModelProto>" and report.passed
    assert list(tmp_path.iterdir()) == []  # nothing written


WEIGHTED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) <float[4] w = {1.0, 2.0, 3.0, 4.0}> {
    y = Add(x, w)
}
"""


def test_proto_with_unloaded_external_weights_is_refused(tmp_path):
    path = tmp_path / "ext.onnx"
    model = parse(WEIGHTED)
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, "w"))  # raw_data
    onnx.save(model, path, save_as_external_data=True, location="d", size_threshold=0)
    lazy = onnx.load(path, load_external_data=False)
    with pytest.raises(InferccError, match="external files"):
        infercc.optimize(lazy, tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()
    report = infercc.optimize(onnx.load(path), tmp_path / "o.onnx")  # weights loaded: fine
    assert report.passed


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ({"x": "2x4"}, (2, 4)),
        ({"x": (2, 4)}, (2, 4)),
        ({"x": [2, 4]}, (2, 4)),
        ({"x": "1x4:2x4:8x4"}, (2, 4)),
    ],
)
def test_shapes_as_strings_or_tuples(shapes, expected):
    cfg = infercc.api.build_config(shapes=shapes)
    assert cfg.shape_pins == {"x": expected}


def test_bad_shape_string_is_one_clear_error():
    with pytest.raises(InferccError, match="not a non-negative integer"):
        infercc.api.build_config(shapes={"x": "2xfour"})
    with pytest.raises(InferccError, match="not non-negative integers"):
        infercc.api.build_config(shapes={"x": (2, -1)})
