"""calibrate(): real-data accuracy, int8 kernels in onnxruntime, the sensitivity loop, files."""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.backends.trt.calib_cache import read_calibration_cache
from infercc.calib import calibrate as calibrate_module
from infercc.calib import search
from infercc.calib.calibrate import (
    CACHE_FILE,
    FP32_FILE,
    INT8_FILE,
    RANGES_FILE,
    REPORT_FILE,
    calibrate,
    split_samples,
)
from infercc.calib.search import Search
from infercc.errors import InferccError
from tests.helpers import make_model


def _save_model(nodes, inputs, outputs, weights, path: Path, opset: int = 17) -> Path:
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in weights.items()]
    graph = oh.make_graph(nodes, "g", inputs, outputs, inits)
    model = make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def _save_samples(directory: Path, arrays: list[np.ndarray], name: str = "x") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, array in enumerate(arrays):
        np.savez(directory / f"sample_{i:03d}.npz", **{name: array})
    return directory


DISABLE_ALL = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _session(
    path: Path, optimized: Path | None = None, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL
) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    if optimized is not None:
        opts.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(path).graph.node)


# --------------------------------------------------------------------------- digits (acceptance)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """An sklearn MLP trained on 70% of load_digits, as MatMul+Add+Relu+MatMul+Add in ONNX."""
    sklearn = pytest.importorskip("sklearn", reason="scikit-learn is in the test extra")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # the training data's scaling
    x_train, x_rest, y_train, y_rest = train_test_split(
        x, y, train_size=0.7, random_state=0, stratify=y
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sklearn.exceptions.ConvergenceWarning)
        clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=300, random_state=0)
        clf.fit(x_train, y_train)
    tmp = tmp_path_factory.mktemp("digits")
    (w1, w2), (b1, b2) = clf.coefs_, clf.intercepts_
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"]),
        oh.make_node("Add", ["h", "b1"], ["hb"]),
        oh.make_node("Relu", ["hb"], ["r"]),
        oh.make_node("MatMul", ["r", "w2"], ["l"]),
        oh.make_node("Add", ["l", "b2"], ["logits"]),
    ]
    model = _save_model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        {"w1": w1, "b1": b1, "w2": w2, "b2": b2},
        tmp / "digits.onnx",
    )
    # 200 calibration images (10 files of 20), then the test images (17 files of 20)
    x_test, y_test = x_rest[200:540], y_rest[200:540]
    batches = [x_rest[i : i + 20] for i in range(0, 540, 20)]
    data = _save_samples(tmp / "samples", batches)
    report = calibrate(model, data, tmp / "out", method="entropy", holdout=17 / 27)
    return model, tmp / "out", report, x_test, y_test


def test_digits_int8_accuracy_within_one_point_of_fp32(digits):
    model, out, report, x_test, y_test = digits
    assert report.passed, report.message
    assert report.samples == {"calibration": 10, "holdout": 17, "evaluated_on": "holdout"}
    fp32 = _session(model).run(None, {"x": x_test})[0].argmax(axis=1)
    int8 = _session(out / INT8_FILE).run(None, {"x": x_test})[0].argmax(axis=1)
    acc_fp32 = 100.0 * float(np.mean(fp32 == y_test))
    acc_int8 = 100.0 * float(np.mean(int8 == y_test))
    assert acc_fp32 > 90.0  # the model learned something: the comparison means something
    assert abs(acc_int8 - acc_fp32) <= 1.0, (acc_fp32, acc_int8)
    # the report's proxy (agreement with fp32 on the holdout) matches what we measure
    agreement = float(np.mean(fp32 == int8))
    assert report.outputs["logits"].top1_agreement == pytest.approx(agreement)
    assert report.outputs["logits"].cosine > 0.999


def test_digits_runs_int8_matmuls_in_onnxruntime(digits, tmp_path):
    _, out, report, _, _ = digits
    assert report.quantized_nodes == 2 and report.kept_float == []
    _session(out / INT8_FILE, tmp_path / "ort.onnx")
    ops = _ops(tmp_path / "ort.onnx")
    # the two layers are Gemms after optimize (fuse-gemm): onnxruntime runs them as QGemm
    assert ops["QLinearMatMul"] + ops["MatMulIntegerToFloat"] + ops["QGemm"] == 2
    assert ops["MatMul"] == 0 and ops["Gemm"] == 0


# --------------------------------------------------------------------------- conv + batch norm


def _conv_bn_model(path: Path, opset: int = 17) -> Path:
    rng = np.random.default_rng(0)

    def normal(shape, std):
        return rng.standard_normal(shape) * std

    weights = {
        "w1": normal((8, 3, 3, 3), 0.3),
        "b1": normal((8,), 0.1),
        "w2": normal((16, 8, 3, 3), 0.15),
        "w3": normal((10, 16), 0.3),
        "b3": normal((10,), 0.1),
    }
    for i, c in ((1, 8), (2, 16)):
        weights.update(
            {
                f"g{i}": rng.uniform(0.5, 1.5, c),
                f"beta{i}": normal((c,), 0.1),
                f"mean{i}": normal((c,), 0.1),
                f"var{i}": rng.uniform(0.5, 2.0, c),
            }
        )
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c1", "g1", "beta1", "mean1", "var1"], ["n1"]),
        oh.make_node("Relu", ["n1"], ["r1"]),
        oh.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c2", "g2", "beta2", "mean2", "var2"], ["n2"]),
        oh.make_node("Relu", ["n2"], ["r2"]),
        oh.make_node("GlobalAveragePool", ["r2"], ["p"]),
        oh.make_node("Flatten", ["p"], ["f"]),
        oh.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    return _save_model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [oh.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10])],
        weights,
        path,
        opset,
    )


@pytest.fixture(scope="module")
def conv_bn(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conv_bn")
    model = _conv_bn_model(tmp / "conv_bn.onnx")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((2, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    data = _save_samples(tmp / "samples", arrays)
    report = calibrate(model, data, tmp / "out", method="minmax", holdout=0.25)
    return model, data, tmp / "out", report


def test_conv_bn_folds_then_runs_qlinearconv(conv_bn, tmp_path):
    _, data, out, report = conv_bn
    assert report.passed, report.message
    assert report.quantized == ["conv1", "conv2", "fc"]
    assert report.samples == {"calibration": 6, "holdout": 2, "evaluated_on": "holdout"}
    assert _ops(out / FP32_FILE)["BatchNormalization"] == 0  # folded before quantizing
    int8_ops = _ops(out / INT8_FILE)
    assert int8_ops["BatchNormalization"] == 0 and int8_ops["QuantizeLinear"] > 0
    assert not any(n.domain for n in onnx.load(out / INT8_FILE).graph.node)  # standard ONNX
    _session(out / INT8_FILE, tmp_path / "ort.onnx")
    ops = _ops(tmp_path / "ort.onnx")
    assert ops["QLinearConv"] == 2 and ops["Conv"] == 0 and ops["FusedConv"] == 0
    assert report.outputs["logits"].cosine > 0.99
    # the report's figures are those of onnxruntime's int8 kernels on the 2 held-out samples
    ref, got = [], []
    for file in sorted(data.iterdir())[-2:]:
        x = np.load(file)["x"]
        ref.append(_session(out / FP32_FILE, level=DISABLE_ALL).run(None, {"x": x})[0])
        got.append(_session(out / INT8_FILE).run(None, {"x": x})[0])
    cosines = [_cosine(r, g) for r, g in zip(ref, got, strict=True)]
    assert report.outputs["logits"].cosine == pytest.approx(min(cosines), abs=1e-12)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_files_ranges_and_cache_agree(conv_bn):
    _, _, out, report = conv_bn
    expected = {INT8_FILE, FP32_FILE, RANGES_FILE, CACHE_FILE, REPORT_FILE, "manifest.json"}
    assert {p.name for p in out.iterdir()} == expected
    assert sorted(Path(f).name for f in report.files) == sorted(expected)
    ranges = json.loads((out / RANGES_FILE).read_text())
    fp32 = onnx.load(out / FP32_FILE).graph
    tensor_names = {o for n in fp32.node for o in n.output} | {i.name for i in fp32.input}
    assert ranges and set(ranges) <= tensor_names
    assert "x" in ranges  # the first Conv's input is a graph input
    for r in ranges.values():
        assert set(r) == {"min", "max", "scale", "method"} and r["method"] == "minmax"
        assert r["scale"] == pytest.approx(max(abs(r["min"]), abs(r["max"])) / 127)
    cache = read_calibration_cache(out / CACHE_FILE)
    assert cache.method == "minmax" and cache.version == 100300
    assert cache.scales == {k: float(np.float32(r["scale"])) for k, r in ranges.items()}
    saved = json.loads((out / REPORT_FILE).read_text())
    assert saved["passed"] is True and saved["quantized_nodes"] == 3
    assert saved["files"] == report.files
    json.dumps(report.to_dict(), allow_nan=False)
    manifest = json.loads((out / "manifest.json").read_text())  # an artifact bench/validate run
    assert manifest["model"] == INT8_FILE and manifest["backend"]["name"] == "none"
    assert manifest["precision"] == "int8" and manifest["calibration"] == REPORT_FILE


def test_foreign_out_dir_is_refused_untouched(conv_bn, tmp_path):
    model, data, _, _ = conv_bn
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(InferccError, match="not a calibration output"):
        calibrate(model, data, foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_previous_output_is_replaced(conv_bn, tmp_path):
    model, data, _, _ = conv_bn
    out = tmp_path / "out"
    calibrate(model, data, out, num_samples=3)
    (out / "stale.txt").write_text("old")
    report = calibrate(model, data, out, method="percentile", num_samples=4, holdout=0)
    assert not (out / "stale.txt").exists()
    assert report.samples == {"calibration": 4, "holdout": 0, "evaluated_on": "calibration"}
    assert read_calibration_cache(out / CACHE_FILE).method == "entropy"  # percentile -> Entropy2
    assert {r["method"] for r in json.loads((out / RANGES_FILE).read_text()).values()} == {
        "percentile"
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


# --------------------------------------------------------------------------- sensitivity


@pytest.fixture(scope="module")
def mlp3(tmp_path_factory):
    """Three quantizable MatMuls (mm1, mm2, mm3) on random data."""
    tmp = tmp_path_factory.mktemp("mlp3")
    rng = np.random.default_rng(5)
    weights = {
        "w1": rng.standard_normal((16, 32)) * 0.3,
        "b1": rng.standard_normal(32) * 0.1,
        "w2": rng.standard_normal((32, 32)) * 0.2,
        "b2": rng.standard_normal(32) * 0.1,
        "w3": rng.standard_normal((32, 10)) * 0.2,
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        oh.make_node("Add", ["h1", "b1"], ["a1"]),
        oh.make_node("Relu", ["a1"], ["r1"]),
        oh.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        oh.make_node("Add", ["h2", "b2"], ["a2"]),
        oh.make_node("Relu", ["a2"], ["r2"]),
        oh.make_node("MatMul", ["r2", "w3"], ["logits"], name="mm3"),
    ]
    model = _save_model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 10])],
        weights,
        tmp / "mlp3.onnx",
    )
    arrays = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(8)]
    return model, _save_samples(tmp / "samples", arrays)


def test_impossible_target_moves_every_node_to_float_and_fails(mlp3, tmp_path):
    model, data = mlp3
    steps: list[str] = []
    out = tmp_path / "out"
    report = calibrate(model, data, out, min_cosine=0.999999, on_step=steps.append)
    assert report.passed is False
    assert "could not be met" in report.message
    assert report.quantized == []
    moved = [k for k in report.kept_float if k.cause == "sensitivity"]
    assert sorted(k.node for k in moved) == ["mm1", "mm2", "mm3"]
    assert [k.round for k in moved] == [1, 2, 3]  # one node per round
    for k in moved:
        assert k.reason.startswith("sensitivity: cosine ") and k.reason.endswith("in float")
    # each round starts where the previous one ended
    assert [k.cosine_before for k in moved[1:]] == [k.cosine_after for k in moved[:-1]]
    assert report.trials == 3 + 2 + 1  # every remaining node measured each round (< 8)
    assert sum(s.startswith("sensitivity round") for s in steps) == 3
    assert not out.exists()  # a failed run writes nothing
    assert not list(tmp_path.iterdir())
    assert report.to_dict()["kept_float"][0]["cause"] == "sensitivity"


def test_reachable_target_stops_as_soon_as_it_holds(mlp3, tmp_path):
    model, data = mlp3
    probe = calibrate(model, data, tmp_path / "probe", min_cosine=0.999999)
    first = next(k for k in probe.kept_float if k.round == 1)
    assert first.cosine_after > first.cosine_before
    # round 1 moved the node whose float version helps most: check it against each node alone
    alone = {
        node: calibrate(model, data, tmp_path / node, exclude=[node]).outputs["logits"].cosine
        for node in ("mm1", "mm2", "mm3")
    }
    assert first.node == max(alone, key=alone.__getitem__)
    assert first.cosine_after == pytest.approx(alone[first.node], abs=1e-9)
    target = (first.cosine_before + first.cosine_after) / 2
    report = calibrate(model, data, tmp_path / "out", min_cosine=target)
    assert report.passed, report.message
    assert [(k.node, k.cause) for k in report.kept_float] == [(first.node, "sensitivity")]
    assert sorted(report.quantized) == sorted({"mm1", "mm2", "mm3"} - {first.node})
    assert report.trials == 3
    assert report.outputs["logits"].cosine >= target
    saved = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert saved["kept_float"][0]["node"] == first.node
    assert saved["targets"] == {"min_cosine": target, "max_top1_drop": None}


def test_user_exclude_is_recorded_and_unknown_names_refused(mlp3, tmp_path):
    model, data = mlp3
    report = calibrate(model, data, tmp_path / "out", exclude=["mm2"])
    assert report.quantized == ["mm1", "mm3"]
    assert [(k.node, k.reason) for k in report.kept_float] == [("mm2", "excluded by the user")]
    with pytest.raises(InferccError, match="'relu'") as info:
        calibrate(model, data, tmp_path / "other", exclude=["relu"])
    assert "mm1" in info.value.hint


def test_top1_target_needs_a_classifier_output(mlp3, tmp_path):
    model, data = mlp3
    report = calibrate(model, data, tmp_path / "out", max_top1_drop=100.0)
    assert report.passed and report.outputs["logits"].top1_agreement is not None
    assert report.to_dict()["top1_drop"] == report.outputs["logits"].top1_drop
    # a [batch, tokens, 1] output is no classifier: a top-1 target cannot be judged
    rng = np.random.default_rng(2)
    regressor = _save_model(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 1])],
        {"w": rng.standard_normal((8, 1))},
        tmp_path / "regressor.onnx",
    )
    samples = [rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(3)]
    data = _save_samples(tmp_path / "samples", samples)
    with pytest.raises(InferccError, match="classifier-like output"):
        calibrate(regressor, data, tmp_path / "r", max_top1_drop=1.0)
    report = calibrate(regressor, data, tmp_path / "r", min_cosine=0.9)
    assert report.passed and report.outputs["y"].top1_agreement is None


# --------------------------------------------------------------------------- bad samples


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: None, "has no .npz or .npy files"),
        (lambda d: np.savez(d / "a.npz", y=np.zeros((4, 16), np.float32)), "lacks input 'x'"),
        (lambda d: np.savez(d / "a.npz", x=np.zeros((4, 16), np.float64)), "is float64"),
        (lambda d: np.savez(d / "a.npz", x=np.array([{"a": 1}], dtype=object)), "object arrays"),
        (lambda d: np.savez(d / "a.npz", x=np.zeros((4, 15), np.float32)), "has shape [4, 15]"),
    ],
    ids=["empty-directory", "missing-input", "wrong-dtype", "pickled-object", "wrong-shape"],
)
def test_bad_samples_are_refused(mlp3, tmp_path, make, message):
    model, _ = mlp3
    data = tmp_path / "data"
    data.mkdir()
    make(data)
    with pytest.raises(InferccError) as info:
        calibrate(model, data, tmp_path / "out")
    assert message.lower() in str(info.value).lower()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"holdout": 1.0}, "leaves no calibration samples"),
        ({"method": "kl"}, "unknown calibration method"),
        ({"num_samples": 0}, "num_samples"),
        ({"min_cosine": 1.5}, "min_cosine"),
    ],
)
def test_bad_options_are_refused(mlp3, tmp_path, kwargs, message):
    model, data = mlp3
    with pytest.raises(InferccError, match=message):
        calibrate(model, data, tmp_path / "out", **kwargs)


def test_split_keeps_at_least_one_on_each_side():
    samples = [{"x": np.zeros(1)} for _ in range(5)]
    assert [len(s) for s in split_samples(samples, 0.2)[:2]] == [4, 1]
    assert [len(s) for s in split_samples(samples, 0.01)[:2]] == [4, 1]
    assert [len(s) for s in split_samples(samples, 0.99)[:2]] == [1, 4]
    seven = samples + samples[:2]
    assert [len(s) for s in split_samples(seven, 0.5)[:2]] == [3, 4]  # 3.5 held out rounds up
    calib, evaluation, held = split_samples(samples[:1], 0.5)
    assert len(calib) == 1 and evaluation is calib and held is False
    assert split_samples(samples, 0.0)[2] is False


# --------------------------------------------------------------------------- trials, ranking, speed


def test_max_trials_caps_the_sensitivity_search(mlp3, tmp_path):
    model, data = mlp3
    report = calibrate(model, data, tmp_path / "out", min_cosine=0.999999, max_trials=2)
    assert report.trials == 2
    assert report.passed is False
    assert "after 2 sensitivity trial(s), the max_trials cap" in report.message
    assert not (tmp_path / "out").exists()
    none = calibrate(model, data, tmp_path / "none", min_cosine=0.999999, max_trials=0)
    assert none.trials == 0 and none.passed is False
    with pytest.raises(InferccError, match="max_trials"):
        calibrate(model, data, tmp_path / "bad", max_trials=-1)


def test_activation_noise_ranks_an_outlier_input_first(tmp_path):
    """mm_out reads a tensor with one huge channel: its weight is benign, its input is not."""
    rng = np.random.default_rng(11)
    scale_in = np.ones(32, np.float32)
    scale_in[0] = 400.0  # one outlier channel sets the per-tensor range
    weights = {
        "s": scale_in,
        "w1": rng.standard_normal((16, 32)) * 0.3,
        "w2": rng.standard_normal((32, 8)) * 0.3,
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm_in"),
        oh.make_node("Mul", ["h", "s"], ["hs"]),
        oh.make_node("MatMul", ["hs", "w2"], ["y"], name="mm_out"),
    ]
    model = _save_model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        weights,
        tmp_path / "outlier.onnx",
    )
    arrays = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(6)]
    data = _save_samples(tmp_path / "samples", arrays)
    job_sqnr: dict[str, float] = {}
    original = Search.rank_nodes

    def spy(self):
        original(self)
        job_sqnr.update(self.sqnr)

    Search.rank_nodes = spy
    try:
        report = calibrate(model, data, tmp_path / "out", min_cosine=0.999999, max_trials=1)
    finally:
        Search.rank_nodes = original
    assert job_sqnr["mm_out"] < job_sqnr["mm_in"]
    # the one trial allowed measured the worst-ranked node first
    assert report.trials == 1


def test_speed_check_is_reported(mlp3, tmp_path):
    model, data = mlp3
    report = calibrate(model, data, tmp_path / "out")
    speed = report.speed
    assert speed is not None and speed.iters == calibrate_module.SPEED_ITERS
    assert speed.fp32_ms > 0 and speed.int8_ms > 0
    assert speed.ratio_p10 <= speed.ratio_median <= speed.ratio_p90
    saved = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert saved["speed"]["slower"] == speed.slower
    assert saved["activations"] == "uint8"
    off = calibrate(model, data, tmp_path / "off", speed_check=False)
    assert off.speed is None and off.to_dict()["speed"] is None


def test_speed_check_says_plainly_when_int8_is_slower():
    slow = calibrate_module.SpeedCheck(1.0, 1.6, 1.6, 1.4, 1.8, 60, "cpu", vnni=False)
    assert slow.slower
    assert slow.message.startswith("int8 is SLOWER than fp32 on this host (this CPU has no VNNI")
    assert "1.60x the fp32 time" in slow.message
    fast = calibrate_module.SpeedCheck(2.0, 1.0, 0.5, 0.45, 0.55, 60, "cpu", vnni=True)
    assert not fast.slower and "SLOWER" not in fast.message
    noisy = calibrate_module.SpeedCheck(1.0, 1.05, 1.05, 0.98, 1.1, 60, "cpu", vnni=True)
    assert not noisy.slower  # within noise: p10 below 1


def test_activations_follow_the_target(mlp3, tmp_path):
    assert calibrate_module.resolve_activations("auto", "cpu") == "uint8"
    assert calibrate_module.resolve_activations("auto", "a100") == "int8"
    assert calibrate_module.resolve_activations("int8", "cpu") == "int8"
    with pytest.raises(InferccError, match="unknown activation type"):
        calibrate_module.resolve_activations("int4", "cpu")
    model, data = mlp3
    report = calibrate(model, data, tmp_path / "out", target="a100", speed_check=False)
    assert report.activations == "int8"
    int8 = onnx.load(tmp_path / "out" / "model_int8.onnx")
    zero_types = {
        numpy_helper.to_array(next(i for i in int8.graph.initializer if i.name == n.input[2])).dtype
        for n in int8.graph.node
        if n.op_type == "QuantizeLinear"
    }
    assert zero_types == {np.dtype(np.int8)}


def test_fake_quantize_and_noise_combination():
    x = np.array([-1.0, 0.0, 0.26, 5.0])
    np.testing.assert_allclose(search.fake_quantize(x, 0.5, 0, "int8"), [-1.0, 0.0, 0.5, 5.0])
    np.testing.assert_allclose(search.fake_quantize(x, 0.5, 2, "uint8"), [-1.0, 0.0, 0.5, 5.0])
    assert search.fake_quantize(np.array([-3.0]), 0.5, 2, "uint8")[0] == -1.0  # clipped
    assert search.combine_db([10.0, 10.0]) == pytest.approx(10 - 10 * np.log10(2))
    assert search.combine_db([math.inf, 20.0]) == pytest.approx(20.0)
    assert search.combine_db([-math.inf, 20.0]) == -math.inf


def test_an_embedding_output_gets_no_top1(tmp_path):
    """[batch, dims] made by an L2 normalization is an embedding, not class scores."""
    rng = np.random.default_rng(2)
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        oh.make_node("ReduceL2", ["h"], ["n"], keepdims=1, axes=[1]),
        oh.make_node("Div", ["h", "n"], ["emb"]),
    ]
    model = _save_model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("emb", TensorProto.FLOAT, [4, 8])],
        {"w": rng.standard_normal((16, 8)) * 0.3},
        tmp_path / "emb.onnx",
    )
    arrays = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(4)]
    data = _save_samples(tmp_path / "samples", arrays)
    report = calibrate(model, data, tmp_path / "out", speed_check=False)
    assert report.outputs["emb"].top1_agreement is None and report.outputs["emb"].cosine > 0.99
    with pytest.raises(InferccError, match="classifier-like output"):
        calibrate(model, data, tmp_path / "top1", max_top1_drop=1.0)


# --------------------------------------------------------------------------- chosen settings


def _attention_model(path: Path, head: str = "attention") -> Path:
    """One self-attention block (scores = q k^T / 4, Softmax, x v, output projection) and a
    LayerNormalization; with head="classifier" the same projections end in a Softmax over a
    MatMul with a weight (a classifier head, not attention)."""
    rng = np.random.default_rng(3)
    d = 16
    weights = {f"w{n}": rng.standard_normal((d, d)) * 0.3 for n in "qkvo"}
    weights.update(scale=np.array(4.0), gamma=np.ones(d), beta=np.zeros(d))
    nodes = [
        oh.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        oh.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        oh.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
    ]
    if head == "attention":
        nodes += [
            oh.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            oh.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
            oh.make_node("Div", ["s", "scale"], ["sd"]),
            oh.make_node("Softmax", ["sd"], ["p"], axis=-1),
            oh.make_node("MatMul", ["p", "v"], ["a"], name="context"),
        ]
    else:
        nodes += [
            oh.make_node("Add", ["q", "k"], ["qk"]),
            oh.make_node("Add", ["qk", "v"], ["a0"]),
            oh.make_node("MatMul", ["a0", "wq"], ["l"], name="head"),
            oh.make_node("Softmax", ["l"], ["a"], axis=-1),
        ]
    nodes += [
        oh.make_node("MatMul", ["a", "wo"], ["o"], name="o_proj"),
        oh.make_node("Add", ["o", "x"], ["r"]),
        oh.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1),
    ]
    return _save_model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, d])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, d])],
        weights,
        path,
    )


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attention")
    model = _attention_model(tmp / "attention.onnx")
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((2, 8, 16)).astype(np.float32) for _ in range(6)]
    return model, _save_samples(tmp / "samples", arrays)


TRANSFORMER_WHY = "the model is a transformer (1 Softmax over a MatMul of two activations)"


def test_plain_call_on_a_transformer_chooses_percentile_and_the_target(attention, tmp_path):
    model, data = attention
    report = calibrate(model, data, tmp_path / "out", speed_check=False)
    assert report.passed, report.message
    assert report.method == "percentile" and report.percentile == 99.999
    assert report.targets == {"min_cosine": 0.99, "max_top1_drop": None}
    settings = report.to_dict()["settings"]
    assert settings == {
        "method": {"value": "percentile", "why": TRANSFORMER_WHY, "given": False},
        "percentile": {"value": 99.999, "why": TRANSFORMER_WHY, "given": False},
        "min_cosine": {"value": 0.99, "why": TRANSFORMER_WHY + "; 0 turns it off", "given": False},
    }
    ranges = json.loads((tmp_path / "out" / RANGES_FILE).read_text())
    assert {r["method"] for r in ranges.values()} == {"percentile"}
    saved = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert saved["settings"] == settings
    assert report.outputs["y"].cosine >= 0.99


def test_given_settings_win_and_are_reported_as_given(attention, tmp_path):
    model, data = attention
    report = calibrate(
        model, data, tmp_path / "a", method="minmax", min_cosine=0, speed_check=False
    )
    assert report.method == "minmax" and report.percentile is None
    assert report.targets == {"min_cosine": None, "max_top1_drop": None}
    assert report.to_dict()["settings"] == {
        "method": {"value": "minmax", "why": "given", "given": True},
        "min_cosine": {"value": None, "why": "given", "given": True},
    }
    ranges = json.loads((tmp_path / "a" / RANGES_FILE).read_text())
    assert {r["method"] for r in ranges.values()} == {"minmax"}
    # a percentile alone selects the percentile method; a top-1 target replaces the cosine one
    both = calibrate(model, data, tmp_path / "b", percentile=99.9, speed_check=False)
    settings = both.to_dict()["settings"]
    assert settings["method"] == {"value": "percentile", "why": "a percentile was given",
                                  "given": False}  # fmt: skip
    assert settings["percentile"] == {"value": 99.9, "why": "given", "given": True}
    assert both.percentile == 99.9 and settings["min_cosine"]["value"] == 0.99
    with pytest.raises(InferccError, match="percentile method only, not minmax"):
        calibrate(model, data, tmp_path / "c", method="minmax", percentile=99.9)
    with pytest.raises(InferccError, match=r"min_cosine must be in \[0, 1\]"):
        calibrate(model, data, tmp_path / "c", min_cosine=-0.5)
    assert not (tmp_path / "c").exists()


def test_a_cnn_keeps_minmax_and_no_target(conv_bn, tmp_path):
    model, data, _, before = conv_bn  # before: method="minmax" given, no target
    report = calibrate(model, data, tmp_path / "out", holdout=0.25, speed_check=False)
    assert report.method == "minmax" and report.targets["min_cosine"] is None
    settings = report.to_dict()["settings"]
    assert settings["method"]["value"] == "minmax" and not settings["method"]["given"]
    assert settings["method"]["why"].startswith("the model is not a transformer")
    assert "percentile" not in settings and settings["min_cosine"]["value"] is None
    # the same result as with the method given
    assert report.quantized == before.quantized and report.trials == 0
    assert report.outputs["logits"].cosine == pytest.approx(before.outputs["logits"].cosine)


def test_a_softmax_classifier_head_is_no_transformer(tmp_path):
    from infercc.calib.choices import attention_evidence
    from infercc.ir import load_model

    head = load_model(_attention_model(tmp_path / "head.onnx", head="classifier"))
    assert attention_evidence(head) is None
    attn = load_model(_attention_model(tmp_path / "attn.onnx"))
    assert attention_evidence(attn) == "1 Softmax over a MatMul of two activations"


def test_a_missed_default_target_is_said_but_a_given_one_fails(attention, tmp_path, monkeypatch):
    from infercc.calib import choices

    model, data = attention
    monkeypatch.setattr(choices, "DEFAULT_MIN_COSINE", 1.0)  # unreachable
    report = calibrate(model, data, tmp_path / "out", max_trials=1, speed_check=False)
    assert report.passed and report.trials == 1
    assert "the default target was not met after 1 sensitivity trial(s)" in report.message
    assert (tmp_path / "out" / INT8_FILE).is_file()
    given = calibrate(model, data, tmp_path / "given", min_cosine=1.0, max_trials=1)
    assert not given.passed and "the max_trials cap" in given.message
    assert not (tmp_path / "given").exists()


# --------------------------------------------------------------------------- verdicts and floors


def test_a_run_without_a_target_is_not_said_to_pass(conv_bn, tmp_path):
    _, _, _, report = conv_bn  # a CNN: no target chosen
    d = report.to_dict()
    assert report.passed and d["verdict"] == "no accuracy target" and not d["target_checked"]
    assert d["min_cosine_floor"] == 0.9
    cosine = report.outputs["logits"].cosine
    assert f"no accuracy target: cosine {cosine:.6f}, at or above the floor 0.9" in d["message"]


def test_below_the_floor_the_run_fails_and_writes_nothing(conv_bn, tmp_path):
    model, data, _, before = conv_bn
    assert before.outputs["logits"].cosine < 1.0
    report = calibrate(model, data, tmp_path / "out", holdout=0.25, min_cosine_floor=1.0)
    assert not report.passed and report.verdict == "failed"
    assert "below 1.0: this model is not usable" in report.message
    assert "lower min_cosine_floor" in report.message
    assert not (tmp_path / "out").exists()
    off = calibrate(model, data, tmp_path / "off", holdout=0.25, min_cosine_floor=0)
    assert off.passed and off.verdict == "no accuracy target" and ", no floor" in off.message
    assert off.to_dict()["min_cosine_floor"] is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_cosine_floor": 1.5}, "min_cosine_floor must be in [0, 1]"),
        ({"min_cosine_floor": 0.5, "min_cosine": 0.9}, "no effect with min_cosine"),
        ({"min_cosine_floor": 0.5, "max_top1_drop": 1.0}, "no effect with max_top1_drop"),
    ],
)
def test_a_floor_that_would_do_nothing_is_refused(conv_bn, tmp_path, kwargs, message):
    model, data, _, _ = conv_bn
    with pytest.raises(InferccError, match=message.replace("[", r"\[").replace("]", r"\]")):
        calibrate(model, data, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_met_target_passes_and_a_missed_default_one_is_said(attention, tmp_path, monkeypatch):
    from infercc.calib import choices

    model, data = attention
    met = calibrate(model, data, tmp_path / "met", speed_check=False)
    assert met.passed and met.verdict == "passed" and met.to_dict()["target_checked"]
    assert met.min_cosine_floor == 0.9  # held to it only if the chosen target is missed
    monkeypatch.setattr(choices, "DEFAULT_MIN_COSINE", 1.0)
    missed = calibrate(model, data, tmp_path / "missed", max_trials=1, speed_check=False)
    assert missed.passed and missed.verdict == "default target missed"


def test_the_default_output_is_stem_int8_beside_the_model(conv_bn, tmp_path):
    model, data, _, _ = conv_bn
    copy = tmp_path / "net.onnx"
    copy.write_bytes(Path(model).read_bytes())
    report = calibrate(copy, data, holdout=0.25, speed_check=False)
    assert report.passed and Path(report.out_dir) == tmp_path / "net.int8"
    assert (tmp_path / "net.int8" / INT8_FILE).is_file()


def test_an_old_opset_is_converted_and_judged_against_the_original(tmp_path):
    _conv_bn_model(tmp_path / "old.onnx", opset=11)  # PP-OCR's opset
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((2, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    data = _save_samples(tmp_path / "samples", arrays)
    out = tmp_path / "out"
    report = calibrate(tmp_path / "old.onnx", data, out, holdout=0.25, speed_check=False)
    assert report.passed, report.message
    assert report.opset_conversion == {
        "from": 11,
        "to": 13,
        "reason": "int8 quantization (per-axis DequantizeLinear)",
        "reference": "the original model",
    }
    assert json.loads((out / "manifest.json").read_text())["opset_conversion"]["from"] == 11
    int8 = onnx.load(out / INT8_FILE)
    assert max(o.version for o in int8.opset_import if o.domain in ("", "ai.onnx")) >= 13
    # the int8 model, run here, is close to the opset-11 original run by onnxruntime
    x = arrays[-1]
    ref = _session(tmp_path / "old.onnx").run(None, {"x": x})[0]
    got = _session(out / INT8_FILE).run(None, {"x": x})[0]
    assert _cosine(ref, got) > 0.98


def test_a_torchscript_decoder_export_with_computed_positions_calibrates(tmp_path):
    """transformers' TorchScript export computes its position ids (int64 Adds of two
    activations, as BERT's does): calibration observes float tensors only, and the int8 model
    passes. Before, the int64 sums were asked for and the observer refused them (exit 2)."""
    from tests.decoders import cache_feeds
    from tests.exports import exports

    export = next(e for e in exports() if e.name == "llama-torchscript-sdpa")
    proto = onnx.load(export.path, load_external_data=False)
    data = tmp_path / "samples"
    data.mkdir()
    for i in range(6):  # batch 1, a past of 4, 8 new tokens
        np.savez(data / f"{i}.npz", **cache_feeds(proto, 1, 4, 8, seed=i))
    report = calibrate(export.path, data, tmp_path / "out", speed_check=False)
    assert report.passed and len(report.quantized) > 0
