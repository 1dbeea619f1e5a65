"""--static-shapes: the inputs' dims fixed in the model, everything after them folded, the
report saying the model is valid only for those shapes; refusals exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import infercc
from infercc.errors import InferccError
from tests.helpers import run_cli

HEAD_SPLIT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch,seq,64] x) => (float[batch,4,seq,seq] y)
  <int64[1] i0 = {0}, int64[1] i1 = {1}, int64[2] hd = {4, 16}> {
  sh = Shape(x)
  b = Gather<axis=0>(sh, i0)
  s = Gather<axis=0>(sh, i1)
  t = Concat<axis=0>(b, s, hd)
  q = Reshape(x, t)
  qt = Transpose<perm=[0, 2, 1, 3]>(q)
  kt = Transpose<perm=[0, 2, 3, 1]>(q)
  y = MatMul(qt, kt)
}
"""


def _write(tmp_path: Path, text: str = HEAD_SPLIT) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    return path


def _dims(path: Path) -> list:
    g = onnx.load(str(path)).graph
    return [
        [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*g.input, *g.output]
    ]


def test_static_shapes_fix_the_inputs_and_fold_everything_after(tmp_path):
    src = _write(tmp_path)
    out = tmp_path / "o.onnx"
    report = infercc.optimize(src, out, static_shapes={"x": (2, 5, 64)})
    assert report.validation.passed
    assert report.static_shapes == {"x": [2, 5, 64]}
    assert report.to_dict()["valid_only_for_static_shapes"] is True
    assert _dims(out) == [[2, 5, 64], [2, 4, 5, 5]]
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert "Shape" not in ops and "Concat" not in ops and "Gather" not in ops
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 5, 64)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="dimension"):
        sess.run(None, {"x": np.zeros((3, 5, 64), np.float32)})


def test_without_static_shapes_the_dims_stay_symbolic(tmp_path):
    src = _write(tmp_path)
    out = tmp_path / "o.onnx"
    report = infercc.optimize(src, out)
    assert report.static_shapes is None
    assert _dims(out) == _dims(src)


@pytest.mark.parametrize(
    "fixed, message",
    [
        ({"nope": (1, 2, 64)}, "not an input"),
        ({"x": (1, 2)}, "rank 2"),
        ({"x": (1, 2, 32)}, "dimension 2 is 64"),
    ],
)
def test_static_shapes_that_do_not_fit_the_model_are_refused(tmp_path, fixed, message):
    src = _write(tmp_path)
    with pytest.raises(InferccError, match=message):
        infercc.optimize(src, tmp_path / "o.onnx", static_shapes=fixed)
    assert not (tmp_path / "o.onnx").exists()


def test_static_shapes_of_an_already_static_input_have_no_effect_and_are_refused(tmp_path):
    text = HEAD_SPLIT.replace("float[batch,seq,64] x", "float[2,5,64] x")
    text = text.replace("float[batch,4,seq,seq] y", "float[2,4,5,5] y")
    src = _write(tmp_path, text)
    with pytest.raises(InferccError, match="no effect"):
        infercc.optimize(src, tmp_path / "o.onnx", static_shapes={"x": (2, 5, 64)})


def test_a_shape_that_contradicts_static_shapes_is_refused(tmp_path):
    src = _write(tmp_path)
    with pytest.raises(InferccError, match="differs"):
        infercc.optimize(
            src, tmp_path / "o.onnx", static_shapes={"x": (2, 5, 64)}, shapes={"x": (1, 5, 64)}
        )


def test_cli_static_shapes_json_and_refusals(tmp_path):
    src = _write(tmp_path)
    out = tmp_path / "o.onnx"
    done = run_cli("optimize", str(src), "-o", str(out), "--static-shapes", "x=1x3x64", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["static_shapes"] == {"x": [1, 3, 64]}
    assert data["valid_only_for_static_shapes"] is True
    shown = run_cli(
        "optimize", str(src), "-o", str(tmp_path / "p.onnx"), "--static-shapes", "x=1x3x64"
    )
    assert "valid only for the input shapes x=1x3x64" in shown.stdout
    bad = run_cli(
        "optimize", str(src), "-o", str(tmp_path / "q.onnx"), "--static-shapes", "x=1x3:2x3:4x3"
    )
    assert bad.returncode == 2 and "range" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "q.onnx").exists()


def test_the_artifact_manifest_records_the_static_shapes(tmp_path):
    src = _write(tmp_path)
    out = tmp_path / "artifact"
    infercc.optimize(src, out, static_shapes={"x": (1, 3, 64)}, tune=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["static_shapes"] == {"x": [1, 3, 64]}


def test_validation_of_a_static_shapes_build_runs_its_one_shape(tmp_path):
    """The candidate accepts only the fixed shape: optimize validates at it (no second
    profile), and `validate CANDIDATE ORIGINAL` reads the fixed shape off the candidate."""
    from infercc.check.candidates import validate_candidate

    src = _write(tmp_path)
    out = tmp_path / "o.onnx"
    report = infercc.optimize(src, out, static_shapes={"x": (2, 5, 64)})
    assert [p["shapes"] for p in report.validation.to_dict()["profiles"]] == [{"x": [2, 5, 64]}]
    checked = validate_candidate(out, src)
    assert checked.validation.passed
    assert [p["shapes"] for p in checked.validation.to_dict()["profiles"]] == [{"x": [2, 5, 64]}]
