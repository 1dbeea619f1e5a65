from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.data.feeds import index_bounds, make_inputs
from infercc.data.samples import load_samples
from infercc.data.signature import real_inputs, resolve_shape, resolve_shapes
from infercc.errors import InferccError
from tests.helpers import make_model


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def embedding_model() -> onnx.ModelProto:
    """input_ids index a 50-row table; token types go through Cast into a 2-row table."""
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["word_emb", "input_ids"], ["words"]),
            helper.make_node("Cast", ["token_type_ids"], ["tt"], to=TensorProto.INT64),
            helper.make_node("Gather", ["type_emb", "tt"], ["types"]),
            helper.make_node("Add", ["words", "types"], ["sum"]),
            helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "axes"], ["mu"]),
            helper.make_node("Mul", ["sum", "mu"], ["y"]),
        ],
        "bert",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT32, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [
            numpy_helper.from_array(np.ones((50, 4), np.float32), "word_emb"),
            numpy_helper.from_array(np.ones((2, 4), np.float32), "type_emb"),
            numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        ],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def ir3_model() -> onnx.ModelProto:
    """IR version 3: the initializer W is listed as a graph input too."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "ir3",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "W")],
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)


def value_info(name: str, dims: list, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, dims)


# --------------------------------------------------------------------------- real_inputs


def test_real_inputs_excludes_ir3_initializer_inputs() -> None:
    model = ir3_model()
    assert [vi.name for vi in model.graph.input] == ["x", "W"]
    assert [vi.name for vi in real_inputs(model)] == ["x"]
    assert set(make_inputs(model)) == {"x"}


# --------------------------------------------------------------------------- resolve_shape


def test_resolve_shape_defaults() -> None:
    vi = value_info("x", ["batch", 3, "height", None])
    assert resolve_shape(vi, None, {}) == (1, 3, 8, 8)


def test_resolve_shape_unnamed_batch_axis_defaults_to_one() -> None:
    assert resolve_shape(value_info("x", [None, "n"]), None, {}) == (1, 8)


def test_resolve_shape_scalar() -> None:
    assert resolve_shape(value_info("x", []), None, {}) == ()


def test_symbols_are_consistent_across_inputs() -> None:
    symbols: dict[str, int] = {}
    assert resolve_shape(value_info("a", ["n", 4]), None, symbols) == (1, 4)
    # "n" sits on axis 1 here, where the default would be 8: it must follow input a.
    assert resolve_shape(value_info("b", [3, "n"]), None, symbols) == (3, 1)
    assert symbols == {"n": 1}


def test_shared_batch_symbol_gets_same_value() -> None:
    shapes = resolve_shapes(embedding_model(), {"attention_mask": (4, 16)})
    # attention_mask is the second input, but its pinned symbols reach the first one too.
    assert shapes == {"input_ids": (4, 16), "attention_mask": (4, 16), "token_type_ids": (4, 16)}


def test_pin_wins_and_keeps_fixed_dims() -> None:
    vi = value_info("x", ["batch", 3, "h", "w"])
    symbols: dict[str, int] = {}
    assert resolve_shape(vi, {"x": (2, 3, 32, 48)}, symbols) == (2, 3, 32, 48)
    assert symbols == {"batch": 2, "h": 32, "w": 48}


def test_pin_with_wrong_rank_fails() -> None:
    vi = value_info("x", ["batch", 3])
    with pytest.raises(InferccError, match="'x' has rank 3, the model declares rank 2"):
        resolve_shape(vi, {"x": (1, 3, 4)}, {})


def test_pin_contradicting_fixed_dim_fails() -> None:
    vi = value_info("x", ["batch", 3, 224, 224])
    with pytest.raises(InferccError, match="sets axis 1 to 4, the model fixes it to 3"):
        resolve_shape(vi, {"x": (1, 4, 224, 224)}, {})


def test_unknown_rank_needs_a_pin() -> None:
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    with pytest.raises(InferccError, match="unknown rank") as info:
        resolve_shape(vi, None, {})
    assert "--shape x=" in str(info.value)
    assert resolve_shape(vi, {"x": (5, 2)}, {}) == (5, 2)


def test_pin_for_unknown_input_fails() -> None:
    with pytest.raises(InferccError, match="unknown input.*'nope'") as info:
        make_inputs(embedding_model(), {"nope": (1,)})
    assert "input_ids" in str(info.value)


# --------------------------------------------------------------------------- make_inputs


def test_embedding_indices_stay_in_vocabulary() -> None:
    model = embedding_model()
    assert index_bounds(model) == {"input_ids": 50, "token_type_ids": 2}
    feeds = make_inputs(model, {"input_ids": (8, 64)}, seed=3)
    ids = feeds["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (8, 64)
    assert ids.min() >= 0 and ids.max() < 50
    assert len(np.unique(ids)) > 25  # spread over the table, not all ones
    types = feeds["token_type_ids"]
    assert types.dtype == np.int32 and set(np.unique(types)) == {0, 1}
    assert np.array_equal(feeds["attention_mask"], np.ones((8, 64), np.int64))


def test_embedding_feeds_run_in_onnxruntime() -> None:
    model = embedding_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, make_inputs(model, {"input_ids": (2, 5)}))
    assert y.shape == (2, 5, 4)


def test_gather_on_axis_one_uses_that_axis() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["idx", "shape"], ["flat"]),
            helper.make_node("Gather", ["table", "flat"], ["y"], axis=1),
        ],
        "g",
        [value_info("idx", ["n"], TensorProto.INT64)],
        [value_info("y", [3, "n"])],
        [
            numpy_helper.from_array(np.zeros((3, 30), np.float32), "table"),
            numpy_helper.from_array(np.array([-1], np.int64), "shape"),
        ],
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert index_bounds(model) == {"idx": 30}
    idx = make_inputs(model, {"idx": (500,)})["idx"]
    assert idx.min() >= 0 and idx.max() < 30 and idx.max() > 3


def test_make_inputs_is_deterministic() -> None:
    model = embedding_model()
    first = make_inputs(model, seed=7)
    again = make_inputs(model, seed=7)
    other = make_inputs(model, {"input_ids": (1, 8)}, seed=8)
    for name in first:
        assert np.array_equal(first[name], again[name])
    assert not np.array_equal(first["input_ids"], other["input_ids"])


def test_float_and_bool_inputs() -> None:
    model = parse(
        HEADER
        + """
        g (float16[2, 500] h, double[3] d, bool[4, 100] b) => (float16[2, 500] y) {
            y = Identity(h)
        }
        """
    )
    feeds = make_inputs(model)
    assert feeds["h"].dtype == np.float16 and feeds["h"].shape == (2, 500)
    assert 0.8 < float(feeds["h"].astype(np.float64).std()) < 1.2  # standard normal
    assert feeds["d"].dtype == np.float64
    assert feeds["b"].dtype == np.bool_ and 0 < feeds["b"].sum() < 400


def test_string_input_asks_for_data() -> None:
    model = parse(HEADER + "g (string[2] s) => (string[2] y) { y = Identity(s) }")
    with pytest.raises(InferccError, match="'s' is a string tensor") as info:
        make_inputs(model)
    assert "--data" in str(info.value)


def test_bfloat16_input_is_rejected() -> None:
    model = parse(HEADER + "g (bfloat16[2] s) => (bfloat16[2] y) { y = Identity(s) }")
    with pytest.raises(InferccError, match="'s' has element type bfloat16"):
        make_inputs(model)


# --------------------------------------------------------------------------- load_samples


def small_model() -> onnx.ModelProto:
    return parse(
        HEADER
        + """
        g (float[batch, 3] x, int64[batch] ids) => (float[batch, 3] y) { y = Identity(x) }
        """
    )


def sample(batch: int = 2, value: float = 0.0) -> dict[str, np.ndarray]:
    return {
        "x": np.full((batch, 3), value, np.float32),
        "ids": np.zeros(batch, np.int64),
    }


def test_load_samples_directory_of_npz_sorted(tmp_path: Path) -> None:
    np.savez(tmp_path / "b.npz", **sample(value=2.0))
    np.savez(tmp_path / "a.npz", **sample(batch=5, value=1.0))
    (tmp_path / "notes.txt").write_text("ignored")
    samples = load_samples(tmp_path, small_model())
    assert [s["x"][0, 0] for s in samples] == [1.0, 2.0]
    assert samples[0]["x"].shape == (5, 3)  # symbolic batch may vary


def test_load_samples_single_npz(tmp_path: Path) -> None:
    np.savez(tmp_path / "one.npz", **sample(value=3.0))
    (loaded,) = load_samples(tmp_path / "one.npz", small_model())
    assert set(loaded) == {"x", "ids"} and loaded["x"][1, 2] == 3.0


def test_load_samples_npy_directory_is_one_sample(tmp_path: Path) -> None:
    for name, array in sample(value=4.0).items():
        np.save(tmp_path / f"{name}.npy", array)
    (loaded,) = load_samples(str(tmp_path), small_model())
    assert loaded["x"].dtype == np.float32 and loaded["x"][0, 0] == 4.0
    assert loaded["ids"].dtype == np.int64


def test_load_samples_ignores_ir3_initializer_inputs(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", x=np.zeros((2, 3), np.float32))
    (loaded,) = load_samples(tmp_path, ir3_model())
    assert set(loaded) == {"x"}


def test_load_samples_wrong_dtype(tmp_path: Path) -> None:
    bad = sample()
    bad["x"] = bad["x"].astype(np.float64)
    np.savez(tmp_path / "s1.npz", **bad)
    with pytest.raises(InferccError, match="s1.npz.*input 'x' is float64.*expects float"):
        load_samples(tmp_path, small_model())


def test_load_samples_unknown_name(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", **sample(), extra=np.zeros(1))
    with pytest.raises(InferccError, match="s.npz.*'extra', which is not a model input"):
        load_samples(tmp_path, small_model())


def test_load_samples_missing_input(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", x=np.zeros((2, 3), np.float32))
    with pytest.raises(InferccError, match="s.npz.*lacks input 'ids'"):
        load_samples(tmp_path, small_model())


def test_load_samples_fixed_dim_mismatch(tmp_path: Path) -> None:
    bad = sample()
    bad["x"] = np.zeros((2, 4), np.float32)
    np.savez(tmp_path / "s.npz", **bad)
    with pytest.raises(
        InferccError, match=r"'x' has shape \[2, 4\], the model declares \[batch, 3\]"
    ):
        load_samples(tmp_path, small_model())


def test_load_samples_rank_mismatch(tmp_path: Path) -> None:
    bad = sample()
    bad["ids"] = np.zeros((2, 1), np.int64)
    np.savez(tmp_path / "s.npz", **bad)
    with pytest.raises(
        InferccError, match=r"'ids' has shape \[2, 1\], the model declares \[batch\]"
    ):
        load_samples(tmp_path, small_model())


def test_load_samples_refuses_pickled_objects(tmp_path: Path) -> None:
    bad = sample()
    bad["x"] = np.array([{"evil": 1}, None], dtype=object)
    np.savez(tmp_path / "s.npz", **bad)
    with pytest.raises(InferccError, match="cannot load .*s.npz', input 'x'") as info:
        load_samples(tmp_path, small_model())
    assert "pickle" in str(info.value)


def test_load_samples_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InferccError, match="does not exist"):
        load_samples(tmp_path / "missing", small_model())
    with pytest.raises(InferccError, match="has no .npz or .npy files"):
        load_samples(tmp_path, small_model())
    np.savez(tmp_path / "a.npz", **sample())
    np.save(tmp_path / "x.npy", sample()["x"])
    with pytest.raises(InferccError, match="mixes .npz and .npy"):
        load_samples(tmp_path, small_model())
    with pytest.raises(InferccError, match="is not a .npz file"):
        load_samples(tmp_path / "x.npy", small_model())


def test_load_samples_corrupt_file(tmp_path: Path) -> None:
    (tmp_path / "s.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InferccError, match="s.npz"):
        load_samples(tmp_path, small_model())


def test_load_samples_string_input(tmp_path: Path) -> None:
    model = parse(HEADER + "g (string[2] s) => (string[2] y) { y = Identity(s) }")
    np.savez(tmp_path / "s.npz", s=np.array(["hello", "world"]))
    (loaded,) = load_samples(tmp_path, model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert list(session.run(None, loaded)[0]) == ["hello", "world"]


def test_load_samples_refuses_pickled_npy(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.array([[1, 2, 3]], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ids.npy", np.zeros(1, np.int64))
    with pytest.raises(InferccError, match="x.npy', input 'x'"):
        load_samples(tmp_path, small_model())


def test_numbered_npy_files_name_the_layouts_that_work(tmp_path: Path) -> None:
    """000.npy, 001.npy for a two-input model: the error says what the files were read as
    and both layouts that would work, with the model's own input names."""
    for i in range(2):
        np.save(tmp_path / f"{i:03d}.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(InferccError) as err:
        load_samples(tmp_path, small_model())
    text = str(err.value)
    assert "lacks input 'x' (it holds '000', '001': no model input has that name)" in text
    assert "x.npy, ids.npy" in text and "np.savez(path, x=..., ids=...)" in text


def test_numbered_npy_files_are_the_samples_of_a_one_input_model(tmp_path: Path) -> None:
    """A one-input model: each .npy file is that input, one sample or N stacked on axis 0."""
    model = parse(HEADER + "g (float[batch, 3] x) => (float[batch, 3] y) { y = Identity(x) }")
    np.save(tmp_path / "000.npy", np.zeros((2, 3), np.float32))  # one sample
    np.save(tmp_path / "001.npy", np.ones((4, 2, 3), np.float32))  # 4 stacked
    samples = load_samples(tmp_path, model)
    assert len(samples) == 5 and [set(s) for s in samples] == [{"x"}] * 5
    assert samples[0]["x"].shape == (2, 3) and float(samples[-1]["x"].sum()) == 6.0


def test_many_numbered_files_are_named_by_their_first_and_last(tmp_path: Path) -> None:
    for i in range(32):
        np.save(tmp_path / f"{i:03d}.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(InferccError, match=r"it holds 32 arrays, '000'..'031'"):
        load_samples(tmp_path, small_model())
