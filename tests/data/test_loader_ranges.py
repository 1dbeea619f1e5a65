"""Validation inputs from a value range (`--input-range NAME=LOW:HIGH`) and from a Python
data-loader script (`--data-loader script.py:fn`), through the CLI, the API and the config."""

from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import onnx
import pytest

import infercc
from infercc.config import BuildConfig
from infercc.data.feeds import input_ranges, make_inputs
from infercc.errors import InferccError
from tests.helpers import parse, run_cli

# k must be 2: Reshape(x[6], [k, 3]); generated integers default to 1, which fails
RESHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[6] x, int64[1] k) => (float[?, 3] y) {
    three = Constant <value = int64[1] {3}> ()
    shape = Concat <axis = 0> (k, three)
    r = Reshape(x, shape)
    i = Identity(r)
    y = Relu(i)
}
"""

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x, int64[N] ids) => (float[N, 4] y) {
    a = Identity(x)
    f = Cast <to = 1> (ids)
    u = Unsqueeze(f, axes)
    y = Add(a, u)
}
"""


def run(*args: str) -> subprocess.CompletedProcess:
    """`infercc ARGS` in this process (`tests.helpers.run_cli`)."""
    return run_cli(*args)


# -- value ranges ------------------------------------------------------------------------------


def test_generated_inputs_follow_the_ranges(tmp_path):
    proto = parse(
        MODEL.replace("u = Unsqueeze(f, axes)", "u = Unsqueeze(f, one)").replace(
            "(float[N, 4] x, int64[N] ids)", "(float[N, 4] x, int64[N] ids, int64[1] one)"
        )
    )
    with input_ranges({"x": (5.0, 6.0), "ids": (8000, 8001)}):
        feeds = make_inputs(proto, {"x": (64, 4), "ids": (64,), "one": (1,)})
    assert feeds["x"].dtype == np.float32 and 5.0 <= feeds["x"].min() <= feeds["x"].max() < 6.0
    assert set(np.unique(feeds["ids"])) == {8000, 8001}  # both ends included
    outside = make_inputs(proto, {"x": (64, 4), "ids": (64,), "one": (1,)})
    assert outside["x"].min() < 5.0  # only inside the block
    with input_ranges({"nope": (0, 1)}), pytest.raises(InferccError, match="not a model input"):
        make_inputs(proto)


def test_optimize_validates_in_the_range(tmp_path):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    failed = run("optimize", str(src), "-o", str(tmp_path / "a.onnx"))
    assert failed.returncode == 2 and "original" in failed.stderr
    ok = run(
        "optimize", str(src), "-o", str(tmp_path / "b.onnx"), "--input-range", "k=2:2", "--json"
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["validation"]["passed"] and report["build"]["input_ranges"] == {"k": [2.0, 2.0]}
    check = run(
        "validate", str(tmp_path / "b.onnx"), "--reference", str(src), "--input-range", "k=2:2"
    )
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"input_ranges": ["k=3:1"]}, "bad --input-range for input 'k'"),
        ({"input_ranges": ["k"]}, "expected NAME=LOW:HIGH"),
        ({"input_ranges": ["q=1:2"]}, "'q', which is not a model input"),
        ({"input_ranges": ["k=2:2"], "run_validation": False}, "no effect with --no-validate"),
    ],
)
def test_bad_ranges_are_refused(tmp_path, options, message):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    out = tmp_path / "o.onnx"
    with pytest.raises(InferccError, match=message):
        infercc.optimize(src, out, **options)
    assert not out.exists()


def test_a_bad_range_on_the_cli_is_one_line(tmp_path):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    r = run("optimize", str(src), "--input-range", "k=3:1")
    assert r.returncode == 2 and "bad --input-range" in r.stderr and "Traceback" not in r.stderr


def test_ranges_in_the_config_round_trip():
    cfg = BuildConfig(input_ranges=("pixel_values=0:1", "sr=8000:16000"))
    assert cfg.input_ranges == (("pixel_values", 0.0, 1.0), ("sr", 8000.0, 16000.0))
    assert BuildConfig.from_dict(cfg.to_dict()) == cfg
    assert BuildConfig.from_dict({"input_ranges": {"sr": "8000:16000"}}).input_ranges == (
        ("sr", 8000.0, 16000.0),
    )
    with pytest.raises(InferccError, match="--input-range has no effect with --data"):
        BuildConfig(input_ranges=("sr=1:2",), data="samples/").check()


# -- data loaders ------------------------------------------------------------------------------

LOADER = """
import numpy as np

def load_data():
    for k in range(3):
        yield {"x": np.arange(6, dtype=np.float32) * k, "k": np.array([2], dtype=np.int64)}

def broken():
    raise ValueError("no such file: audio.wav")

def wrong_dtype():
    return [{"x": np.zeros(6), "k": np.array([2], dtype=np.int64)}]
"""


def test_data_loader_feeds_validation(tmp_path):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    (tmp_path / "samples.py").write_text(textwrap.dedent(LOADER))
    out = tmp_path / "o.onnx"
    r = run(
        "optimize",
        str(src),
        "-o",
        str(out),
        "--data-loader",
        str(tmp_path / "samples.py"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["validation"]["passed"] and report["validation"]["samples"] == 3
    check = infercc.validate(out, src, data=f"{tmp_path / 'samples.py'}:load_data")
    assert check.passed and check.validation.samples == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("samples.py:broken", "samples.py:broken raised ValueError when called: no such file"),
        ("samples.py:wrong_dtype", "input 'x' is float64, the model expects float"),
        ("samples.py:missing", "has no function 'missing'"),
        ("nothere.py", "data loader script"),
    ],
)
def test_data_loader_errors_are_refused(tmp_path, spec, message):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    (tmp_path / "samples.py").write_text(textwrap.dedent(LOADER))
    out = tmp_path / "o.onnx"
    with pytest.raises(InferccError, match=message):
        infercc.optimize(src, out, data=str(tmp_path / spec))
    assert not out.exists()


def test_a_data_loader_error_on_the_cli_is_one_line(tmp_path):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    (tmp_path / "samples.py").write_text(textwrap.dedent(LOADER))
    r = run("optimize", str(src), "--data-loader", f"{tmp_path / 'samples.py'}:broken")
    assert r.returncode == 2 and "raised ValueError" in r.stderr and "Traceback" not in r.stderr


def test_data_and_data_loader_together_are_refused(tmp_path):
    src = tmp_path / "reshape.onnx"
    onnx.save(parse(RESHAPE), src)
    r = run("optimize", str(src), "--data", str(tmp_path), "--data-loader", "x.py")
    assert r.returncode == 2 and "--data and --data-loader" in r.stderr
