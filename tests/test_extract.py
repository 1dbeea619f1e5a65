"""`infercc extract` / `infercc.extract`: the subgraph between named tensors, equal under
onnxruntime to that part of the original (at two batch sizes), checked, refused on bad names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import infercc
from infercc import subgraph as extract_module
from infercc.errors import InferccError

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x, float[N, 8] skip) => (float[N, 4] y, float[N, 8] z) {
  h = MatMul(x, w1)
  a = Add(h, skip)
  r = Relu(a)
  y = MatMul(r, w2)
  z = Sigmoid(h)
}
"""

SPLIT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 4] o1, float[N, 4] o2) {
  s1, s2 = Split <axis = 1> (x, sizes)
  o1 = Relu(s1)
  o2 = Neg(s2)
}
"""


def write(path: Path, text: str = MODEL) -> Path:
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    if "w1" in text:
        for name, shape in (("w1", (8, 8)), ("w2", (8, 4))):
            w = rng.standard_normal(shape).astype(np.float32)
            proto.graph.initializer.append(numpy_helper.from_array(w, name))
    else:
        sizes = np.array([4, 4], dtype=np.int64)
        proto.graph.initializer.append(numpy_helper.from_array(sizes, "sizes"))
    onnx.save(proto, path)
    return path


def run(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def with_outputs(path: Path, names: list[str]) -> onnx.ModelProto:
    proto = onnx.load(path)
    for name in names:
        proto.graph.output.append(onnx.ValueInfoProto(name=name))
    return proto


@pytest.mark.parametrize("batch", [1, 3])
def test_subgraph_equals_that_part_of_the_original(tmp_path: Path, batch: int) -> None:
    src = write(tmp_path / "m.onnx")
    out = tmp_path / "sub.onnx"
    shapes = {"x": (batch, 8), "skip": (batch, 8)}
    report = infercc.extract(src, out, ["h", "skip"], ["y"], shapes=shapes)
    assert report.passed and report.written and report.validation.passed
    assert report.nodes_before == 5 and report.nodes_after == 3
    assert report.ops == {"Add": 1, "MatMul": 1, "Relu": 1}
    sub = onnx.load(out)
    onnx.checker.check_model(sub, full_check=True)
    assert [i.name for i in sub.graph.input] == ["h", "skip"]
    assert [o.name for o in sub.graph.output] == ["y"]
    assert [t.name for t in sub.graph.initializer] == ["w2"]  # w1 is upstream of the cut
    # independently of the report: feed the sub-model what the original computed
    rng = np.random.default_rng(batch)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    original = run(with_outputs(src, ["h"]), feeds)
    got = run(out, {"h": original["h"], "skip": feeds["skip"]})
    np.testing.assert_allclose(got["y"], original["y"], rtol=1e-6, atol=1e-6)


def test_outputs_alone_take_the_inputs_they_need(tmp_path: Path) -> None:
    src = write(tmp_path / "m.onnx")
    report = infercc.extract(src, tmp_path / "z.onnx", outputs=["z"])
    assert report.passed
    sub = onnx.load(tmp_path / "z.onnx")
    assert [i.name for i in sub.graph.input] == ["x"]  # skip is not needed for z
    assert [n.op_type for n in sub.graph.node] == ["MatMul", "Sigmoid"]
    assert [t.name for t in sub.graph.initializer] == ["w1"]
    assert report.inputs == [{"name": "x", "dtype": "float", "shape": ["N", 8]}]


def test_a_kept_node_can_make_a_cut_tensor(tmp_path: Path) -> None:
    src = write(tmp_path / "s.onnx", SPLIT)
    out = tmp_path / "cut.onnx"
    report = infercc.extract(src, out, ["s1", "x"], ["o1", "o2"], shapes={"x": (2, 8)})
    assert report.passed, report.to_dict()
    sub = onnx.load(out)
    onnx.checker.check_model(sub, full_check=True)
    assert [i.name for i in sub.graph.input] == ["s1", "x"]
    assert sorted(n.op_type for n in sub.graph.node) == ["Neg", "Relu", "Split"]
    x = np.arange(16, dtype=np.float32).reshape(2, 8) - 8
    s1 = np.full((2, 4), -1.0, dtype=np.float32)  # not what Split gives: o1 must follow s1
    got = run(out, {"s1": s1, "x": x})
    np.testing.assert_array_equal(got["o1"], np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(got["o2"], -x[:, 4:])


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (["hh"], ["y"], "--inputs names 'hh', which is no tensor of the model"),
        (["h", "skip"], ["yy"], "did you mean y?"),
        (["w1"], ["y"], "a constant (initializer)"),
        (["h"], ["y"], "depend on graph input(s) 'skip'"),
        (["h", "skip"], ["h"], "named by both --inputs and --outputs"),
        (["h", "h"], ["y"], "names a tensor twice"),
        ([], [], "extract needs --inputs, --outputs or both"),
    ],
)
def test_bad_names_are_refused_and_nothing_written(tmp_path, inputs, outputs, message) -> None:
    src = write(tmp_path / "m.onnx")
    with pytest.raises(InferccError, match=message.replace("(", r"\(").replace(")", r"\)")):
        infercc.extract(src, tmp_path / "o.onnx", inputs, outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_output_must_be_an_onnx_file_other_than_the_input(tmp_path: Path) -> None:
    src = write(tmp_path / "m.onnx")
    with pytest.raises(InferccError, match="writes an .onnx file"):
        infercc.extract(src, tmp_path / "dir", outputs=["y"])
    with pytest.raises(InferccError, match="refusing to overwrite the input"):
        infercc.extract(src, src, outputs=["y"])


def test_a_subgraph_that_fails_its_check_is_not_written(tmp_path, monkeypatch) -> None:
    src = write(tmp_path / "m.onnx")
    monkeypatch.setattr(extract_module, "_checker", lambda path: "checker says no")
    report = infercc.extract(src, tmp_path / "o.onnx", outputs=["y"])
    assert not report.passed and not report.written and report.validation is None
    data = report.to_dict()
    assert data["output"] is None and data["check_error"] == "checker says no"
    assert not (tmp_path / "o.onnx").exists()


def test_cli_extract_json_and_exit_codes(tmp_path, capsys, monkeypatch) -> None:
    from infercc.cli import main

    src = write(tmp_path / "m.onnx")

    def cli(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["infercc", *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = cli(
        "extract", str(src), str(tmp_path / "sub.onnx"), "--inputs", "h", "--inputs", "skip",
        "--outputs", "y", "--shape", "x=3x8", "--json",
    )  # fmt: skip
    assert code == 0, err
    rep = json.loads(out)
    assert rep["written"] and rep["validation"]["passed"] and rep["run"]["command"] == "extract"
    assert [i["name"] for i in rep["inputs"]] == ["h", "skip"]
    code, out, err = cli("extract", str(src), str(tmp_path / "t.onnx"), "--outputs", "z")
    assert code == 0 and "[N, 8]" in out and "validation passed" in out
    code, out, err = cli("extract", str(src), str(tmp_path / "u.onnx"), "--inputs", "nope")
    assert code == 2 and err.count("\n") == 1 and "no tensor of the model" in err
    monkeypatch.setattr(extract_module, "_checker", lambda path: "checker says no")
    code, out, err = cli("extract", str(src), str(tmp_path / "v.onnx"), "--outputs", "y")
    assert code == 1 and "nothing was written" in out and not (tmp_path / "v.onnx").exists()
