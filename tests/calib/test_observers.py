"""Range observers, the Calibrator, collect_ranges, and agreement with onnxruntime's calibrators."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from infercc.calib.observers import (
    MIN_SCALE,
    Calibrator,
    HistogramObserver,
    MinMaxObserver,
    TensorRange,
    collect_ranges,
    entropy_threshold_bins,
    int8_scale,
)
from infercc.errors import InferccError

# Element-wise float32 ops only, so numpy computes bit-identical intermediates.
TINY = """
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[2, 8] x, float[2, 8] y) => (float[2, 8] out, int64[2] shape)
<float[8] w = {1.5, -2.0, 0.5, 3.0, -0.25, 1.0, 2.5, -1.5}>
{
  a = Mul(x, w)
  b = Add(a, y)
  c = Relu(b)
  d = Sub(c, x)
  out = Neg(d)
  shape = Shape(out)
}
"""
W = np.array([1.5, -2.0, 0.5, 3.0, -0.25, 1.0, 2.5, -1.5], dtype=np.float32)


def _numpy_intermediates(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    a = x * W
    b = a + y
    c = np.maximum(b, np.float32(0))
    d = c - x
    return {"a": a, "b": b, "c": c, "d": d, "out": -d}


def _samples(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((2, 8)).astype(np.float32),
            "y": (3 * rng.standard_normal((2, 8))).astype(np.float32),
        }
        for _ in range(n)
    ]


@pytest.fixture
def tiny_path(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(onnx.parser.parse_model(TINY), path)
    return path


# --------------------------------------------------------------------------- observers


def test_minmax_is_exact_and_skips_nonfinite() -> None:
    rng = np.random.default_rng(1)
    chunks = [rng.standard_normal((4, 5)).astype(np.float32) * s for s in (1, 7, 0.1)]
    chunks.append(np.array([np.nan, np.inf, -np.inf, 2.0], dtype=np.float32))
    obs = MinMaxObserver()
    assert obs.range() == (0.0, 0.0)
    for chunk in chunks:
        obs.update(chunk)
    finite = np.concatenate([c[np.isfinite(c)].ravel() for c in chunks])
    assert obs.range() == (float(finite.min()), float(finite.max()))
    assert obs.nonfinite == 3 and obs.count == finite.size


def test_observers_refuse_integer_tensors() -> None:
    with pytest.raises(InferccError, match="int64"):
        MinMaxObserver().update(np.arange(3))


def test_histogram_rebinning_keeps_counts_and_range() -> None:
    rng = np.random.default_rng(2)
    first = np.append(rng.uniform(-1, 1, 10_000), 1.0).astype(np.float32)
    second = np.append(np.clip(rng.normal(0, 3, 10_000), -9, 9), -10.0).astype(np.float32)
    third = np.append(np.clip(rng.normal(0, 3, 1_000), -9, 9), 25.0).astype(np.float32)
    obs = HistogramObserver(bins=2048)
    obs.update(first)
    assert obs.upper == pytest.approx(1.0)
    obs.update(second)
    assert obs.upper == pytest.approx(10.0)  # grown by exactly x10
    obs.update(third)
    assert 25.0 <= obs.upper < 50.0  # x3: the smallest integer factor covering 25
    everything = np.abs(np.concatenate([first, second, third]))
    counts, edges = obs.histogram()
    assert counts.sum() == everything.size == obs.count
    expected, _ = np.histogram(everything, bins=2048, range=(0.0, edges[-1]))
    assert np.abs(counts - expected).sum() <= 4  # only float rounding at bin edges differs
    assert obs.range() == (-10.0, 25.0)


def test_histogram_zeros_before_first_range() -> None:
    obs = HistogramObserver(bins=16)
    obs.update(np.zeros(100, dtype=np.float32))
    assert obs.upper == 0.0 and obs.percentile_range() == (0.0, 0.0)
    assert obs.entropy_range() == (0.0, 0.0)
    obs.update(np.array([1.0, -2.0], dtype=np.float32))
    counts, _ = obs.histogram()
    assert counts.sum() == 102 and counts[0] == 100
    assert obs.range() == (-2.0, 1.0)


def test_percentile_uniform_is_near_the_max() -> None:
    x = np.random.default_rng(3).uniform(-1, 1, 100_000).astype(np.float32)
    obs = HistogramObserver()
    obs.update(x)
    low, high = obs.percentile_range(99.99)
    assert low == -high and 0.998 < high <= float(np.abs(x).max())
    assert obs.percentile_range(100.0)[1] == float(np.abs(x).max())
    with pytest.raises(InferccError, match="percentile"):
        obs.percentile_range(0.0)


def test_percentile_normal_is_about_3_9_sigma() -> None:
    x = np.random.default_rng(4).standard_normal(1_000_000).astype(np.float32)
    obs = HistogramObserver()
    obs.update(x)
    # P(|x| <= a) = 0.9999 for a standard normal at a = 3.8906
    assert obs.percentile_range(99.99)[1] == pytest.approx(3.8906, abs=0.1)


def test_entropy_clips_outliers() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(200_000).astype(np.float32)
    outliers = np.array([60.0, -55.0, 58.0], dtype=np.float32)
    obs = HistogramObserver()
    obs.update(x[:100_000])
    obs.update(np.concatenate([x[100_000:], outliers]))
    low, high = obs.entropy_range()
    assert low == -high
    assert 2.0 < high < 15.0  # above 2 sigma, far below the outliers (60)


def test_entropy_search_on_a_histogram() -> None:
    decaying = np.round(1e6 * np.exp(-np.arange(2048) / 40)).astype(np.int64)
    decaying[-1] += 1  # one far outlier
    best = entropy_threshold_bins(decaying)
    assert 128 <= best < int(np.count_nonzero(decaying[:-1]))  # clips the thin tail too
    spiked = decaying.copy()
    spiked[0] *= 50  # a ReLU's zeros do not move the threshold
    assert entropy_threshold_bins(spiked) == best
    assert entropy_threshold_bins(np.ones(64)) == 64  # fewer bins than levels: keep all


# --------------------------------------------------------------------------- calibrator


def test_calibrator_scales_are_amax_over_127() -> None:
    rng = np.random.default_rng(6)
    cal = Calibrator("minmax")
    a = rng.standard_normal(100).astype(np.float32)
    b = np.abs(rng.standard_normal(100)).astype(np.float32) * 5
    cal.observe({"a": a, "b": b, "zero": np.zeros(10, np.float32)})
    ranges = cal.ranges()
    assert list(ranges) == ["a", "b", "zero"]
    assert ranges["a"].scale == max(abs(float(a.min())), float(a.max())) / 127
    assert ranges["b"].scale == float(b.max()) / 127
    assert ranges["b"].min == float(b.min()) > 0  # minmax keeps the real, asymmetric range
    assert ranges["zero"].scale == MIN_SCALE > 0
    assert ranges["a"].to_dict() == {
        "name": "a",
        "min": ranges["a"].min,
        "max": ranges["a"].max,
        "scale": ranges["a"].scale,
        "method": "minmax",
    }


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_calibrator_histogram_methods_are_symmetric(method: str) -> None:
    x = np.random.default_rng(7).standard_normal(50_000).astype(np.float32)
    cal = Calibrator(method, percentile=99.9)
    cal.observe({"x": x})
    r = cal.ranges()["x"]
    assert r.min == -r.max and 0 < r.max <= float(np.abs(x).max())
    assert r.scale == r.max / 127 and r.method == method


def test_calibrator_rejects_bad_settings() -> None:
    with pytest.raises(InferccError, match="unknown calibration method"):
        Calibrator("kl")  # type: ignore[arg-type]
    with pytest.raises(InferccError, match="percentile"):
        Calibrator("percentile", percentile=101)
    assert int8_scale(0.0) == MIN_SCALE and int8_scale(127.0) == 1.0


# --------------------------------------------------------------------------- collect_ranges


def _true_ranges(samples: list[dict[str, np.ndarray]]) -> dict[str, tuple[float, float]]:
    per_sample = [_numpy_intermediates(s["x"], s["y"]) for s in samples]
    return {
        name: (
            float(min(v[name].min() for v in per_sample)),
            float(max(v[name].max() for v in per_sample)),
        )
        for name in per_sample[0]
    }


def test_collect_ranges_gives_true_min_max(tiny_path) -> None:
    samples = _samples(2)
    progress: list[tuple[int, int | None]] = []
    ranges = collect_ranges(tiny_path, samples, on_progress=lambda d, t: progress.append((d, t)))
    assert list(ranges) == ["a", "b", "c", "d", "out"]  # float node outputs; not Shape's int64
    expected = _true_ranges(samples)
    assert {n: (r.min, r.max) for n, r in ranges.items()} == expected
    assert all(isinstance(r, TensorRange) and r.method == "minmax" for r in ranges.values())
    assert progress == [(1, 2), (2, 2)]


def test_collect_ranges_chosen_tensors_and_iterator(tiny_path) -> None:
    samples = _samples(3, seed=1)
    progress: list[tuple[int, int | None]] = []
    ranges = collect_ranges(
        tiny_path,
        iter(samples),
        tensors=["x", "c"],
        on_progress=lambda d, t: progress.append((d, t)),
    )
    assert list(ranges) == ["x", "c"]
    xs = np.stack([s["x"] for s in samples])
    assert (ranges["x"].min, ranges["x"].max) == (float(xs.min()), float(xs.max()))
    assert (ranges["c"].min, ranges["c"].max) == _true_ranges(samples)["c"]
    assert progress == [(1, None), (2, None), (3, None)]


def test_collect_ranges_external_data(tmp_path) -> None:
    model = onnx.parser.parse_model(TINY)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(W, "w"))
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(
        model, folder / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    assert (folder / "w.bin").stat().st_size == W.nbytes
    samples = _samples(2, seed=2)
    ranges = collect_ranges(folder / "m.onnx", samples, method="percentile", percentile=100.0)
    expected = _true_ranges(samples)
    for name, (low, high) in expected.items():
        # percentile 100 is max |x|, clipped on each side to what was seen
        assert ranges[name].scale == pytest.approx(max(abs(low), abs(high)) / 127)
        assert (ranges[name].min, ranges[name].max) == (low, high)


def test_collect_ranges_errors(tiny_path, tmp_path) -> None:
    samples = _samples(1)
    with pytest.raises(InferccError, match="'nope' is not a node output"):
        collect_ranges(tiny_path, samples, tensors=["nope"])
    with pytest.raises(InferccError, match="'shape' is int64"):
        collect_ranges(tiny_path, samples, tensors=["shape"])
    with pytest.raises(InferccError, match="lacks input.*'y'"):
        collect_ranges(tiny_path, [{"x": samples[0]["x"]}])
    with pytest.raises(InferccError, match="no calibration samples"):
        collect_ranges(tiny_path, [])
    with pytest.raises(InferccError, match="does not exist"):
        collect_ranges(tmp_path / "missing.onnx", samples)


# --------------------------------------------------------------------------- vs onnxruntime

MLP = """
<ir_version: 8, opset_import: ["" : 17]>
mlp (float[64, 32] x) => (float[64, 16] out)
{
  h = MatMul(x, w1)
  hb = Add(h, b1)
  r = Relu(hb)
  out = MatMul(r, w2)
}
"""


@pytest.fixture
def mlp_case(tmp_path):
    rng = np.random.default_rng(8)
    model = onnx.parser.parse_model(MLP)
    weights = {
        "w1": rng.standard_normal((32, 32)).astype(np.float32) * 0.3,
        "b1": rng.standard_normal(32).astype(np.float32),
        "w2": rng.standard_normal((32, 16)).astype(np.float32) * 0.3,
    }
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    onnx.checker.check_model(model)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    samples = [{"x": rng.standard_normal((64, 32)).astype(np.float32)} for _ in range(6)]
    return path, samples


def _ort_ranges(path, samples, method_name: str, extra: dict) -> dict[str, tuple[float, float]]:
    calibrate = pytest.importorskip(
        "onnxruntime.quantization.calibrate", reason="onnxruntime.quantization is not installed"
    )

    class Reader(calibrate.CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(samples)

        def get_next(self):
            return next(self.items, None)

    calibrator = calibrate.create_calibrator(
        path,
        augmented_model_path=str(path.parent / f"augmented_{method_name}.onnx"),
        calibrate_method=getattr(calibrate.CalibrationMethod, method_name),
        extra_options=extra,
    )
    calibrator.collect_data(Reader())
    data = calibrator.compute_data()
    return {
        name: tuple(float(np.asarray(v).reshape(-1)[0]) for v in data[name].range_value)
        for name in data
    }


def test_minmax_equals_onnxruntime(mlp_case) -> None:
    path, samples = mlp_case
    theirs = _ort_ranges(path, samples, "MinMax", {})
    ours = collect_ranges(path, samples, method="minmax")
    common = set(ours) & set(theirs)
    assert {"h", "hb", "r", "out"} <= common
    for name in common:
        assert (ours[name].min, ours[name].max) == theirs[name], name


@pytest.mark.parametrize(
    ("ours_method", "ort_method", "extra", "factor"),
    [
        # onnxruntime's entropy search runs on a signed histogram; with its default 128 bins
        # there is a single candidate (the max), so give it 2048 like ours. Measured here:
        # ours / onnxruntime's between 1.1x and 1.6x (it lacks our zero-bin fix).
        ("entropy", "Entropy", {"num_bins": 2048}, 2.0),
        # Both percentile searches use 2048 bins of |x|: measured within 0.1 %.
        ("percentile", "Percentile", {"percentile": 99.99, "num_bins": 2048}, 1.02),
    ],
)
def test_histogram_methods_close_to_onnxruntime(
    mlp_case, ours_method, ort_method, extra, factor
) -> None:
    path, samples = mlp_case
    theirs = _ort_ranges(path, samples, ort_method, extra)
    ours = collect_ranges(path, samples, method=ours_method, percentile=99.99)
    common = set(ours) & set(theirs)
    assert {"h", "hb", "r", "out"} <= common
    for name in common:
        their_amax = max(abs(v) for v in theirs[name])
        assert their_amax / factor <= ours[name].amax <= their_amax * factor, (name, theirs)
