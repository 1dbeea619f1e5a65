"""Sample files: stacked .npz/.npy (N samples on a new axis 0), lazy reading, mixed kinds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc.calib.calibrate import read_samples
from infercc.data.samples import iter_samples, load_samples
from infercc.errors import InferccError

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(HEADER + text)
    onnx.checker.check_model(model)
    return model


def two_inputs() -> onnx.ModelProto:
    """x: [batch, 3] float, ids: [batch] int64."""
    return parse(
        "g (float[batch, 3] x, int64[batch] ids) => (float[batch, 3] y) { y = Identity(x) }"
    )


def stacked(n: int, batch: int = 2) -> dict[str, np.ndarray]:
    x = np.arange(n * batch * 3, dtype=np.float32).reshape(n, batch, 3)
    ids = np.arange(n * batch, dtype=np.int64).reshape(n, batch)
    return {"x": x, "ids": ids}


def test_stacked_npz_is_n_samples(tmp_path: Path) -> None:
    arrays = stacked(4)
    np.savez(tmp_path / "all.npz", **arrays)
    samples = load_samples(tmp_path / "all.npz", two_inputs())
    assert len(samples) == 4
    for i, sample in enumerate(samples):
        assert set(sample) == {"x", "ids"}
        np.testing.assert_array_equal(sample["x"], arrays["x"][i])
        np.testing.assert_array_equal(sample["ids"], arrays["ids"][i])
        assert sample["x"].shape == (2, 3) and sample["x"].dtype == np.float32


def test_unstacked_npz_stays_one_sample(tmp_path: Path) -> None:
    one = {k: v[0] for k, v in stacked(3).items()}
    np.savez(tmp_path / "one.npz", **one)
    (sample,) = load_samples(tmp_path / "one.npz", two_inputs())
    np.testing.assert_array_equal(sample["x"], one["x"])


def test_stacked_files_in_a_directory_concatenate_in_name_order(tmp_path: Path) -> None:
    first, second = stacked(2), stacked(3)
    second["x"] += 100
    np.savez(tmp_path / "b.npz", **second)
    np.savez(tmp_path / "a.npz", **first)
    samples = load_samples(tmp_path, two_inputs())
    assert len(samples) == 5
    assert [s["x"][0, 0] for s in samples] == [0.0, 6.0, 100.0, 106.0, 112.0]


def test_stacked_npy_directory(tmp_path: Path) -> None:
    for name, array in stacked(3).items():
        np.save(tmp_path / f"{name}.npy", array)
    samples = load_samples(tmp_path, two_inputs())
    assert len(samples) == 3 and samples[2]["ids"].tolist() == [4, 5]


def test_stacked_counts_must_agree(tmp_path: Path) -> None:
    arrays = stacked(4)
    arrays["ids"] = arrays["ids"][:3]
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(InferccError, match=r"s.npz' stacks 4 sample\(s\) of 'x' but 3 of 'ids'"):
        load_samples(tmp_path / "s.npz", two_inputs())


def test_stacked_and_single_arrays_do_not_mix(tmp_path: Path) -> None:
    arrays = stacked(4)
    arrays["ids"] = arrays["ids"][0]  # one sample's rank
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(InferccError, match=r"'x' has shape \[4, 2, 3\].*'ids' is one sample") as e:
        load_samples(tmp_path / "s.npz", two_inputs())
    assert "stack N samples" in e.value.hint


def test_wrong_rank_is_named(tmp_path: Path) -> None:
    arrays = stacked(2)
    arrays["x"] = arrays["x"][None]  # rank 4 for a rank-2 input
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(InferccError, match=r"'x' has shape \[1, 2, 2, 3\].*\[batch, 3\]") as e:
        load_samples(tmp_path / "s.npz", two_inputs())
    assert "rank 2" in e.value.hint and "rank 3" in e.value.hint


def test_stacked_samples_are_checked_one_by_one(tmp_path: Path) -> None:
    arrays = stacked(3)
    arrays["x"] = np.zeros((3, 2, 4), np.float32)  # fixed dim 3 is 4
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(InferccError, match=r"s.npz\[0\]': input 'x' has shape \[2, 4\]"):
        load_samples(tmp_path / "s.npz", two_inputs())


def test_empty_stack_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", **stacked(0))
    with pytest.raises(InferccError, match="stacks 0 samples"):
        load_samples(tmp_path / "s.npz", two_inputs())


def test_scalar_input_stacks_as_a_vector(tmp_path: Path) -> None:
    model = parse("g (float s) => (float y) { y = Identity(s) }")
    np.savez(tmp_path / "s.npz", s=np.array([1.0, 2.0, 3.0], np.float32))
    samples = load_samples(tmp_path / "s.npz", model)
    assert [float(x["s"]) for x in samples] == [1.0, 2.0, 3.0]
    assert samples[0]["s"].shape == ()


def test_read_samples_stops_after_num_samples(tmp_path: Path) -> None:
    """A corrupt file after the first N is never opened."""
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", **stacked(2))
    (tmp_path / "z_corrupt.npz").write_bytes(b"PK\x03\x04 broken")
    assert len(read_samples(tmp_path, two_inputs(), 5)) == 5
    with pytest.raises(InferccError, match="z_corrupt.npz"):
        read_samples(tmp_path, two_inputs(), None)


def test_iter_samples_is_lazy(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", **stacked(1))
    (tmp_path / "b.npz").write_bytes(b"not a zip")
    it = iter_samples(tmp_path, two_inputs())
    assert next(it)["x"].shape == (2, 3)
    with pytest.raises(InferccError, match="b.npz"):
        next(it)


def test_preprocess_with_numpy_files_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "s.npz", **stacked(1))
    with pytest.raises(InferccError, match="--preprocess applies to images"):
        load_samples(tmp_path, two_inputs(), preprocess="imagenet")


def test_pickles_are_still_refused_in_stacked_files(tmp_path: Path) -> None:
    arrays = stacked(2)
    arrays["x"] = np.array([{"a": 1}, None], dtype=object)
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(InferccError, match="cannot load .*input 'x'") as e:
        load_samples(tmp_path / "s.npz", two_inputs())
    assert "pickle" in e.value.hint
