"""Shapes as users bring them: paddle2onnx's anonymous `'?'` dims (each axis its own unknown, never
one shared symbol), a warning said once and naming the model where `--shape` pins give one named
symbol two values, trtexec's and onnxsim's `--shape` spellings answered with infercc's, and
`--preprocess` on a model whose height and width are symbolic."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.data.images import parse_preprocess, plan_images
from infercc.data.profiles import did_you_mean, parse_shape
from infercc.data.signature import free_symbols, resolve_shapes, shape_conflicts
from infercc.errors import InferccError
from infercc.ir import import_model
from tests.helpers import assert_same_outputs, make_model, run_cli, run_ort


def paddle_like(path: Path | None = None, anonymous: str = "?") -> onnx.ModelProto:
    """A Paddle-style CNN: x [-1, 3, '?', '?'] -> Conv -> Relu -> swap H and W, so an H tied to
    W (or a W baked from H) changes the output's shape."""
    rng = np.random.default_rng(0)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, anonymous, anonymous])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, anonymous, anonymous])
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c"], ["r"]),
        oh.make_node("Transpose", ["r"], ["y"], perm=[0, 1, 3, 2]),
    ]
    graph = oh.make_graph(nodes, "paddle", [x], [y], [w])
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, path)
    return model


def two_inputs(path: Path) -> Path:
    """Inputs a and b both [n, 4] (one named symbol), each read on its own."""
    a = oh.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4])
    b = oh.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])
    ya = oh.make_tensor_value_info("ya", TensorProto.FLOAT, ["n", 4])
    yb = oh.make_tensor_value_info("yb", TensorProto.FLOAT, ["n", 4])
    nodes = [oh.make_node("Relu", ["a"], ["ya"]), oh.make_node("Neg", ["b"], ["yb"])]
    graph = oh.make_graph(nodes, "two", [a, b], [ya, yb])
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    onnx.save(model, path)
    return path


# --------------------------------------------------------------------------- anonymous dims


@pytest.mark.parametrize("anonymous", ["?", ""])
def test_anonymous_dims_are_distinct_unknowns(anonymous: str) -> None:
    proto = paddle_like(anonymous=anonymous)
    ir = import_model(proto)
    assert ir.graph.inputs[0].shape == (None, 3, None, None)
    symbols = free_symbols(proto)
    assert set(symbols) == {("x", 0), ("x", 2), ("x", 3)}  # no symbol named '?' or ''
    shapes = resolve_shapes(proto, {"x": (1, 3, 48, 192)})
    assert shapes == {"x": (1, 3, 48, 192)}


def test_paddle_model_validates_at_a_second_profile_that_is_not_square(tmp_path: Path) -> None:
    src = tmp_path / "rec.onnx"
    paddle_like(src)
    out = tmp_path / "rec.opt.onnx"
    r = run_cli("optimize", str(src), "-o", str(out), "--shape", "x=1x3x48x192", "--json")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower() and "symbol" not in r.stderr
    profiles = json.loads(r.stdout)["validation"]["profiles"]
    first, second = (p["shapes"]["x"] for p in profiles)
    assert first == [1, 3, 48, 192]
    assert second[2] != second[3] and second[2:] != first[2:]  # H and W vary apart
    optimized = onnx.load(out)
    onnx.checker.check_model(optimized)
    for hw in ((48, 192), (32, 100)):  # two shapes, H != W: the swap is kept
        x = np.random.default_rng(1).standard_normal((1, 3, *hw)).astype(np.float32)
        (got,) = run_ort(optimized, {"x": x})
        assert got.shape == (1, 4, hw[1], hw[0])
        assert_same_outputs(original := onnx.load(src), optimized, {"x": x})
    assert original.graph.input[0].type == optimized.graph.input[0].type  # "?" kept as written


def test_pins_giving_a_symbol_two_values_warn_once_naming_the_model(tmp_path: Path) -> None:
    src = two_inputs(tmp_path / "two.onnx")
    pins = ("--shape", "a=2x4", "--shape", "b=3x4")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "two.opt.onnx"), *pins)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "symbol 'n'" in line]
    assert len(lines) == 1, r.stderr
    assert str(src) in lines[0] and "a[0]" in lines[0] and "b[0]" in lines[0]
    r = run_cli("bench", str(src), *pins, "--warmup", "0", "--iters", "1")
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if "symbol 'n'" in line] == lines


def test_shape_conflicts_names_each_symbol_once() -> None:
    dims = {"a": ["n", 4], "b": ["n", "n"], "c": [None, None]}
    assert shape_conflicts(dims, {"a": (2, 4), "c": (5, 6)}) == []
    (line,) = shape_conflicts(dims, {"a": (2, 4), "b": (3, 7)})
    assert "'n' to 2 on a[0] and to 3 on b[0]" in line


# --------------------------------------------------------------------------- spellings


@pytest.mark.parametrize(
    ("spec", "suggestion"),
    [
        ("x:1x3x48x192", "x=1x3x48x192"),  # trtexec
        ("x:1,3,48,192", "x=1x3x48x192"),  # onnxsim
        ("x=1,3,48,192", "x=1x3x48x192"),
        ("input:0:1,3,224,224", "input:0=1x3x224x224"),  # a TensorFlow name keeps its ':0'
        ("x:1x3,y:1x4", "--shape x=1x3 --shape y=1x4"),  # trtexec's list
    ],
)
def test_other_tools_spellings_are_answered_with_ours(spec: str, suggestion: str) -> None:
    assert did_you_mean(spec) == suggestion
    with pytest.raises(InferccError, match=re.escape(f"did you mean {suggestion}?")):
        parse_shape(spec)


@pytest.mark.parametrize(
    "spec", ["x=1x3", "ids=1x128:8x128:32x512", "x=", "a:b=1x2", "input:0=1x2", "x", "x=1xx3"]
)
def test_our_own_spellings_get_no_suggestion(spec: str) -> None:
    assert did_you_mean(spec) is None


@pytest.mark.parametrize("spec", ["x:1x3x48x192", "x=1,3,48,192"])
def test_cli_answers_a_foreign_spelling_on_one_line(tmp_path: Path, spec: str) -> None:
    src = tmp_path / "rec.onnx"
    paddle_like(src)
    out = tmp_path / "rec.opt.onnx"
    r = run_cli("optimize", str(src), "-o", str(out), "--shape", spec)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "did you mean x=1x3x48x192?" in r.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- images


def test_imagenet_on_symbolic_height_and_width_says_what_it_makes(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="infercc")
    plan = plan_images(parse_preprocess("imagenet"), paddle_like())
    assert plan.crop == (224, 224) and plan.resize == (256, 0)
    assert plan.describe() == "images -> x float32[1,3,224,224]"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "images -> x float32[1,3,224,224]" in warning and "crop=HxW" in warning


def test_raw_on_symbolic_height_and_width_says_images_keep_their_size(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="infercc")
    plan = plan_images(parse_preprocess("raw"), paddle_like())
    assert plan.crop is None and plan.describe() == "images -> x float32[1,3,?,?]"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "keeps its own size" in warning


def test_a_given_crop_or_a_fixed_model_size_warns_nothing(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="infercc")
    plan = plan_images(parse_preprocess("imagenet,crop=48x192"), paddle_like())
    assert plan.describe() == "images -> x float32[1,3,48,192]"
    static = paddle_like()
    for axis, size in ((2, 32), (3, 40)):
        static.graph.input[0].type.tensor_type.shape.dim[axis].dim_value = size
    plan = plan_images(parse_preprocess("imagenet"), static)
    assert plan.crop == (32, 40) and plan.describe() == "images -> x float32[1,3,32,40]"
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
