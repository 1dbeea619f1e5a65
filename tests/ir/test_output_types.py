"""Every written model passes onnx's full checker: a declared output type that the graph
contradicts (a trained OCR model declares [1, seqlen] while its Reshape [0, 1, -1] computes
rank 3) is replaced by the computed type once folding lets strict inference see it, and the
report says so."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from rich.console import Console

import infercc
from infercc.cli.render import render_optimize
from tests.helpers import make_model
from tests.inproc import run_main


def _ocr(declared: list[int | str]) -> onnx.ModelProto:
    """y = Reshape(Relu(x), target): target [0, 1, -1] is computed from x's static width (8),
    so onnx's strict inference cannot see it in the original."""

    def c(name: str, v) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(v, np.int64), name)

    nodes = [
        oh.make_node("Relu", ["x"], ["r"]),
        oh.make_node("Shape", ["x"], ["w"], start=2),
        oh.make_node("Sub", ["w", "five"], ["lim"]),
        oh.make_node("Squeeze", ["lim"], ["three"]),
        oh.make_node("Range", ["zero", "three", "one"], ["ids"]),
        oh.make_node("Equal", ["ids", "two"], ["last"]),
        oh.make_node("Where", ["last", "minus1", "ids"], ["target"]),
        oh.make_node("Reshape", ["r", "target"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "ocr",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seqlen", 8])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, declared)],
        [c("zero", 0), c("five", [5]), c("one", 1), c("two", 2), c("minus1", -1)],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)  # the original passes
    return model


def _run(path: Path, seqlen: int) -> np.ndarray:
    x = np.random.default_rng(seqlen).standard_normal((1, seqlen, 8)).astype(np.float32)
    return ort.InferenceSession(str(path)).run(None, {"x": x})[0]


def test_a_contradicted_declaration_is_replaced_and_said(tmp_path: Path) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_ocr([1, "seqlen"]), src)
    report = infercc.optimize(src, out)
    assert report.passed and report.written
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    dims = [d.dim_param or d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, "8*seqlen"]
    assert report.output_types == [
        {"output": "y", "declared": [1, "seqlen"], "computed": [1, 1, "8*seqlen"]}
    ]
    assert json.loads(json.dumps(report.to_dict()))["output_types"][0]["output"] == "y"
    console = Console(file=io.StringIO(), width=200)
    render_optimize(report, console)
    assert "declared [1, seqlen], the graph computes [1, 1, 8*seqlen]" in console.file.getvalue()
    for seqlen in (3, 40):
        np.testing.assert_array_equal(_run(out, seqlen), _run(src, seqlen))


@pytest.mark.parametrize("declared", [[1, 1, "n"], [1, 1, None]], ids=["named", "unknown"])
def test_a_consistent_declaration_is_kept(tmp_path: Path, declared) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_ocr(declared), src)
    report = infercc.optimize(src, out, run_validation=False)
    assert report.output_types == []
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
            for d in written.graph.output[0].type.tensor_type.shape.dim]  # fmt: skip
    assert dims == declared


def test_the_cli_says_it(tmp_path: Path, monkeypatch, capsys) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_ocr([1, "seqlen"]), src)
    result = run_main(monkeypatch, capsys, "optimize", str(src), "-o", str(tmp_path / "o.onnx"))
    assert result.code == 0, result.text
    assert "the declaration was replaced by the computed type" in result.text


def test_a_model_onnx_already_mistypes_keeps_its_declarations(tmp_path: Path) -> None:
    """Where onnx's strict inference rejects the original (opset 9 Unsqueeze with a negative
    axis, which onnxruntime runs), onnx is no witness against the declaration: it stays, and
    onnxruntime runs the result (a declared [?, 5] for a [1, 1, 1] output broke it)."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])
    outs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 1]) for n in ("s0", "s1")]
    nodes = [
        oh.make_node("Unsqueeze", ["x"], ["u"], axes=[-2]),
        oh.make_node("Slice", ["u"], ["sl"], axes=[2], starts=[4], ends=[2**62]),
        oh.make_node("Split", ["sl"], ["s0", "s1"], axis=0, split=[1, 1]),
    ]
    model = make_model(oh.make_graph(nodes, "g", [x], outs), opset_imports=[oh.make_opsetid("", 9)])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    report = infercc.optimize(src, out, run_validation=False)
    assert report.output_types == []
    written = onnx.load(out)
    for o in written.graph.output:
        assert [d.dim_value for d in o.type.tensor_type.shape.dim] == [1, 1, 1]
    feeds = {"x": np.ones((2, 5), np.float32)}
    got = ort.InferenceSession(str(out)).run(None, feeds)
    want = ort.InferenceSession(str(src)).run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
