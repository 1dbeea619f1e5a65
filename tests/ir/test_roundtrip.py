"""Import then export keeps what a ModelProto holds: models onnx ships, and edge cases."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from infercc.errors import InferccError
from infercc.ir import export_model, import_model, load_model, save_model
from infercc.ir.exporter import EXTERNAL_THRESHOLD
from tests.helpers import run_ort

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SHIPPED = sorted(
    glob.glob(os.path.join(DATA, "light", "*.onnx"))
    + glob.glob(os.path.join(DATA, "simple", "*", "model.onnx"))
    + glob.glob(os.path.join(DATA, "pytorch-converted", "*", "model.onnx"))
    + glob.glob(os.path.join(DATA, "pytorch-operator", "*", "model.onnx"))
)


def _checks(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
        return True
    except Exception:
        return False


def _feeds(model: onnx.ModelProto, path: str) -> dict[str, np.ndarray] | None:
    """The test case's own inputs when shipped (input_0.pb ...), else None."""
    case_dir = os.path.join(os.path.dirname(path), "test_data_set_0")
    if not os.path.isdir(case_dir):
        return None
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    feeds = {}
    for i, name in enumerate(names):
        f = os.path.join(case_dir, f"input_{i}.pb")
        if not os.path.exists(f):
            return None
        t = onnx.TensorProto()
        with open(f, "rb") as fh:
            t.ParseFromString(fh.read())
        feeds[name] = numpy_helper.to_array(t)
    return feeds


def test_shipped_models_found():
    assert len(SHIPPED) > 100


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: os.path.relpath(p, DATA))
def test_roundtrip_shipped_model(path, tmp_path):
    original = onnx.load(path)
    model = load_model(path)
    model.graph.lint()
    out = tmp_path / "out.onnx"
    save_model(model, out)
    result = onnx.load(out)
    if _checks(original):
        onnx.checker.check_model(result, full_check=True)
    assert [o.name for o in result.graph.output] == [o.name for o in original.graph.output]
    feeds = _feeds(original, path)
    if feeds is None:
        return
    try:
        expected = run_ort(original, feeds)
    except Exception:
        pytest.skip("onnxruntime cannot run the original")
    for a, b in zip(expected, run_ort(result, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


FULL = """
<ir_version: 8, opset_import: ["" : 17, "custom.domain" : 1, "local" : 1],
 producer_name: "tester", producer_version: "9", doc_string: "model doc",
 metadata_props: ["key" : "value"]>
g (float[batch, 4] x, bool cond) => (float[batch, 4] y, float[batch, 4] z)
  <float[4] w = {1.0, 2.0, 3.0, 4.0}> {
  a = Mul(x, w)
  c = custom.domain.Opaque <alpha: float = 0.5, names: strings = ["p", "q"]> (a)
  y = If(cond) <
    then_branch = t () => (float[batch, 4] t_out) { t_out = Add(a, w) },
    else_branch = e () => (float[batch, 4] e_out) { e_out = Sub(a, w) }
  >
  z = local.Twice(a)
}
<domain: "local", opset_import: ["" : 17]>
Twice (v) => (r) { r = Add(v, v) }
"""


def test_roundtrip_keeps_everything():
    proto = onnx.parser.parse_model(FULL)
    proto.graph.value_info.append(
        helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["batch", 4])
    )
    out = export_model(import_model(proto))
    assert out.producer_name == "tester" and out.producer_version == "9"
    assert out.doc_string == "model doc"
    assert [(p.key, p.value) for p in out.metadata_props] == [("key", "value")]
    assert {o.domain: o.version for o in out.opset_import} == {
        "": 17,
        "custom.domain": 1,
        "local": 1,
    }
    assert [f.name for f in out.functions] == ["Twice"]
    opaque = next(n for n in out.graph.node if n.op_type == "Opaque")
    assert opaque.domain == "custom.domain"
    attrs = {a.name: helper.get_attribute_value(a) for a in opaque.attribute}
    assert attrs == {"alpha": 0.5, "names": [b"p", b"q"]}
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    branches = {a.name: a.g for a in if_node.attribute}
    assert branches["then_branch"].node[0].input[:] == ["a", "w"]
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [vi.name for vi in out.graph.value_info] == ["a"]
    # byte-identical on a second round trip
    assert export_model(import_model(out)).SerializeToString() == out.SerializeToString()


def test_initializers_are_not_decoded_or_copied(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    proto = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2, 4] y) { y = MatMul(x, w) }
""")
    proto.graph.initializer.append(numpy_helper.from_array(w, "w"))
    model = import_model(proto)
    tensor = model.value("w").const
    assert tensor._array is None  # lazily decoded
    assert tensor.to_proto("w") is tensor.proto  # exported as the same proto
    save_model(model, tmp_path / "m.onnx")
    assert tensor._array is None
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(run_ort(onnx.load(tmp_path / "m.onnx"), {"x": x})[0], x @ w)


def _big_model(n: int = 4096) -> onnx.ModelProto:
    proto = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4096] x) => (float[1, 4096] y) { h = Add(x, w1)
  y = Mul(h, w2) }
""")
    rng = np.random.default_rng(0)
    for name in ("w1", "w2"):
        proto.graph.initializer.append(
            numpy_helper.from_array(rng.standard_normal((1, n)).astype(np.float32), name)
        )
    return proto


def test_external_data_written_and_read_lazily(tmp_path):
    proto = _big_model()
    model = import_model(proto)
    files = save_model(model, tmp_path / "m.onnx", external_data=True)
    assert [f.name for f in files] == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx.data").stat().st_size >= 2 * 4096 * 4
    reloaded = load_model(tmp_path / "m.onnx")
    assert reloaded.value("w1").const.is_external
    assert isinstance(reloaded.value("w1").numpy(), np.memmap)
    x = np.ones((1, 4096), np.float32)
    expected = run_ort(proto, {"x": x})[0]
    inline = tmp_path / "inline.onnx"
    save_model(reloaded, inline)
    np.testing.assert_array_equal(run_ort(onnx.load(inline), {"x": x})[0], expected)
    # and external -> external again keeps working from a different folder
    (tmp_path / "sub").mkdir()
    save_model(load_model(tmp_path / "m.onnx"), tmp_path / "sub" / "m2.onnx", external_data=True)
    import onnxruntime as ort

    path = str(tmp_path / "sub" / "m2.onnx")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], expected)


def test_large_weights_switch_to_external_data(tmp_path, monkeypatch):
    import infercc.ir.exporter as exporter

    monkeypatch.setattr(exporter, "EXTERNAL_THRESHOLD", 1000)
    files = save_model(import_model(_big_model()), tmp_path / "m.onnx")
    assert len(files) == 2 and EXTERNAL_THRESHOLD > 2**30


def test_external_data_escaping_folder_is_refused(tmp_path):
    proto = _big_model()
    model = import_model(proto)
    save_model(model, tmp_path / "m.onnx", external_data=True)
    bad = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    for t in bad.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
    onnx.save(bad, tmp_path / "bad.onnx")
    m = load_model(tmp_path / "bad.onnx")
    with pytest.raises(InferccError, match="outside the model's folder"):
        m.value("w1").numpy()


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    import infercc.ir.exporter as exporter

    target = tmp_path / "m.onnx"
    target.write_bytes(b"previous")

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(exporter, "_write_model", boom)
    with pytest.raises(RuntimeError):
        save_model(import_model(_big_model()), target)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
