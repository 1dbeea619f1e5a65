"""Outlier channels: detection, the exact split, and what calibrate does with it."""

from __future__ import annotations

import json
import math
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.calib import outliers
from infercc.calib.calibrate import INT8_FILE, calibrate
from infercc.ir import export_model, import_model, infer_shapes
from infercc.passes import split_outliers
from tests.helpers import make_model, run_cli

K, N = 96, 32
OUTLIER = 7  # the channel that is 40x the others


def projection(tmp: Path) -> tuple[Path, onnx.ModelProto]:
    """x [batch, seq, K] -> scale channels (one huge) -> MatMul W [K, N] -> + b."""
    rng = np.random.default_rng(4)
    gain = np.ones(K, np.float32)
    gain[OUTLIER] = 40.0
    weights = {
        "gain": gain,
        "w": (rng.standard_normal((K, N)) * 0.2).astype(np.float32),
        "b": (rng.standard_normal(N) * 0.1).astype(np.float32),
    }
    nodes = [
        oh.make_node("Mul", ["x", "gain"], ["h"]),
        oh.make_node("MatMul", ["h", "w"], ["p"], name="proj"),
        oh.make_node("Add", ["p", "b"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", N])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp / "proj.onnx"
    onnx.save(model, path)
    return path, model


def _samples(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 16, K)).astype(np.float32)} for _ in range(n)]


def _run(model: onnx.ModelProto | Path, feeds: dict) -> np.ndarray:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_outlier_detection():
    amax = np.ones(K)
    assert outliers.outlier_channels(amax) == []
    amax[[3, 50]] = 10.0
    assert outliers.outlier_channels(amax) == [3, 50]
    many = np.ones(K)
    many[:12] = 10.0  # 12 large channels: not a few outliers
    assert outliers.outlier_channels(many) == []
    assert outliers.outlier_channels(np.ones(8) * [1, 1, 1, 1, 1, 1, 1, 50]) == []  # K < 64


def test_split_is_exact_and_only_for_projections(tmp_path):
    path, proto = projection(tmp_path)
    model = import_model(proto)
    infer_shapes(model)
    found = split_outliers.candidates(model)
    assert found == {"proj": "h"}
    amax = outliers.channel_absmax(path, _samples(3), ["h"])
    assert outliers.outlier_channels(amax["h"]) == [OUTLIER]
    made = split_outliers.split(model, {"proj": [OUTLIER]})
    assert list(made.values()) == ["proj"]
    model.graph.lint()
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops == {"Mul": 2, "Gather": 1, "MatMul": 2, "Add": 2}
    # the outliers' sum comes after the bias Add, which stays next to its MatMul
    producers = {o: n for n in out.graph.node for o in n.output}
    (bias,) = [n for n in out.graph.node if "b" in n.input]
    assert producers[bias.input[0]].name == "proj"
    assert producers[out.graph.output[0].name].input[0] == bias.output[0]
    feeds = _samples(1, seed=9)[0]
    np.testing.assert_allclose(_run(out, feeds), _run(proto, feeds), rtol=1e-5, atol=1e-5)


def test_calibrate_splits_and_keeps_the_outliers_float(tmp_path):
    path, proto = projection(tmp_path)
    data = tmp_path / "samples"
    data.mkdir()
    for i, sample in enumerate(_samples(8, seed=1)):
        np.savez(data / f"{i}.npz", **sample)
    split = calibrate(path, data, tmp_path / "split", speed_check=False)
    plain = calibrate(path, data, tmp_path / "plain", speed_check=False, outlier_channels=False)
    assert split.outlier_channels == {"proj": [OUTLIER]} and plain.outlier_channels == {}
    assert split.quantized == ["proj"] and plain.quantized == ["proj"]
    kept = [k for k in split.kept_float if k.cause == "outliers"]
    assert len(kept) == 1 and "outlier channels of proj" in kept[0].reason
    assert split.to_dict()["outlier_channels"] == {"proj": [OUTLIER]}
    # the split keeps int8's error on the other channels small
    assert split.outputs["y"].cosine > plain.outputs["y"].cosine
    assert split.outputs["y"].max_abs < plain.outputs["y"].max_abs
    int8 = onnx.load(tmp_path / "split" / INT8_FILE)
    ops = Counter(n.op_type for n in int8.graph.node)
    assert ops["Gather"] == 1 and ops["QuantizeLinear"] == 1
    # the int8 projection with its bias is one op (fuse-int8-matmul); the outliers' MatMul
    # and their sum stay float
    assert ops["MatMulIntegerToFloat"] == 1 and ops["MatMul"] == 1 and ops["Add"] == 1
    assert ops["Mul"] == 1  # the model's own gain: the split's mask is gone, its Q reads h
    (q,) = [n for n in int8.graph.node if n.op_type == "QuantizeLinear"]
    assert q.input[0] == "h"
    inits = {t.name: numpy_helper.to_array(t) for t in int8.graph.initializer}
    weight = next(a for a in inits.values() if a.dtype == np.int8 and a.shape == (K, N))
    assert not weight[OUTLIER].any() and weight.any()  # the outlier row zero, in int8 too


def test_a_2d_matmul_is_not_a_candidate():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "w")
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])],
        [w],
    )
    model = import_model(make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    infer_shapes(model)
    assert split_outliers.candidates(model) == {}


def _sample_dir(tmp_path: Path) -> Path:
    data = tmp_path / "samples"
    data.mkdir()
    for i, sample in enumerate(_samples(6, seed=1)):
        np.savez(data / f"{i}.npz", **sample)
    return data


def test_calibrate_disable_pass_of_an_int8_pass(tmp_path):
    """`disable_passes` reaches the int8 pipeline: without split-outlier-channels nothing is
    split, and eliminate-dead-code can be skipped in both pipelines."""
    path, _ = projection(tmp_path)
    data = _sample_dir(tmp_path)
    off = calibrate(
        path, data, tmp_path / "off", speed_check=False, disable_passes=["split-outlier-channels"]
    )
    assert off.passed and off.outlier_channels == {} and off.quantized == ["proj"]
    ops = Counter(n.op_type for n in onnx.load(tmp_path / "off" / INT8_FILE).graph.node)
    assert ops["Gather"] == 0 and ops["QuantizeLinear"] == 1
    no_dce = calibrate(
        path, data, tmp_path / "nodce", speed_check=False, disable_passes=["eliminate-dead-code"]
    )
    assert no_dce.passed and no_dce.outlier_channels == {"proj": [OUTLIER]}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("calibrate", *args)


def test_cli_calibrate_disable_pass(tmp_path):
    path, _ = projection(tmp_path)
    data = _sample_dir(tmp_path)
    common = [str(path), "--data", str(data), "--no-speed-check", "--json"]
    r = _cli(*common, "-o", str(tmp_path / "a"), "--disable-pass", "split-outlier-channels")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outlier_channels"] == {}
    for name, message in [
        ("quantize-qdq", "--disable-pass quantize-qdq leaves calibrate nothing to do"),
        ("convert-fp16", "--disable-pass convert-fp16 has no effect: calibrate does not run it"),
        ("fold-constant", "unknown pass 'fold-constant'"),
    ]:
        out = tmp_path / name
        r = _cli(*common, "-o", str(out), "--disable-pass", name)
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr
        assert not out.exists()


def test_calibrate_verify_names_an_int8_pass_that_breaks_the_graph(tmp_path, monkeypatch):
    """Under verify the graph is linted after every pass, the int8 ones too: a quantize-qdq
    that leaves a node reading a value nothing defines is named."""
    from infercc.errors import PassError
    from infercc.ir import Value
    from infercc.passes import quantize_qdq

    rewrite = quantize_qdq._Rewriter.rewrite

    def broken(self, node, plan, ctx):
        rewrite(self, node, plan, ctx)
        node.set_input(1, Value("nowhere"))

    monkeypatch.setattr(quantize_qdq._Rewriter, "rewrite", broken)
    path, _ = projection(tmp_path)
    data = _sample_dir(tmp_path)
    with pytest.raises(PassError, match="pass 'quantize-qdq' broke the graph"):
        calibrate(path, data, tmp_path / "v", speed_check=False, verify=True)
    assert not (tmp_path / "v").exists()


def test_the_split_is_made_only_when_the_all_int8_model_misses_the_target(tmp_path):
    """With an accuracy target the split is the first remedy, not a default: the all-int8
    candidate is evaluated without it, and split only when it misses. Without a target the
    split is made where outliers are found."""
    path, _ = projection(tmp_path)
    data = _sample_dir(tmp_path)
    always = calibrate(path, data, tmp_path / "always", speed_check=False)  # no target
    plain = calibrate(path, data, tmp_path / "plain", speed_check=False, outlier_channels=False)
    split_cos, plain_cos = always.outputs["y"].cosine, plain.outputs["y"].cosine
    assert plain_cos + 1e-3 < split_cos and always.outlier_split["split"] is True
    assert always.outlier_split["why"] == "no accuracy target: split where found"

    met = calibrate(
        path,
        data,
        tmp_path / "met",
        speed_check=False,
        min_cosine=math.floor(plain_cos * 1e4) / 1e4,
    )
    assert met.passed and met.outlier_channels == {} and met.quantized == ["proj"]
    assert met.outlier_split["split"] is False and "not needed" in met.outlier_split["why"]
    assert met.outlier_split["found"] == {"proj": [OUTLIER]}
    assert met.outlier_split["unsplit"]["cosine"] == met.outputs["y"].cosine == plain_cos
    ops = Counter(n.op_type for n in onnx.load(tmp_path / "met" / INT8_FILE).graph.node)
    assert ops["Gather"] == 0 and ops["MatMulIntegerToFloat"] == 1

    target = (plain_cos + split_cos) / 2
    missed = calibrate(path, data, tmp_path / "missed", speed_check=False, min_cosine=target)
    assert missed.passed and missed.outlier_channels == {"proj": [OUTLIER]}
    assert missed.outlier_split["split"] is True and "missed" in missed.outlier_split["why"]
    assert missed.outlier_split["unsplit"]["cosine"] == plain_cos
    assert missed.outputs["y"].cosine == split_cos  # the split reference, calibrated again
    assert not [k for k in missed.kept_float if k.cause == "sensitivity"]
    int8 = onnx.load(tmp_path / "missed" / INT8_FILE)
    ops = Counter(n.op_type for n in int8.graph.node)
    assert ops["Gather"] == 1 and ops["MatMulIntegerToFloat"] == 1
    assert sorted(p.name for p in (tmp_path / "missed").iterdir()) == sorted(
        p.name for p in (tmp_path / "always").iterdir()
    )  # nothing of the unsplit reference is left behind

    r = _cli(
        str(path),
        "--data",
        str(data),
        "--no-speed-check",
        "-o",
        str(tmp_path / "cli"),
        "--min-cosine",
        str(math.floor(plain_cos * 1e4) / 1e4),
    )
    assert r.returncode == 0, r.stderr
    assert "outlier channels: found in 1 projection(s), not split: not needed" in r.stdout


def projections(tmp: Path, outliers: list[tuple[int, float]]) -> Path:
    """x -> one gain per projection (its channel c times g, the rest 1) -> MatMuls p1, p2, ...
    (the weight row of c divided by g): one output each."""
    rng = np.random.default_rng(5)
    nodes, weights, out = [], {}, []
    for i, (channel, g) in enumerate(outliers, 1):
        gain = np.ones(K, np.float32)
        gain[channel] = g
        weights[f"g{i}"] = gain
        w = rng.standard_normal((K, N)) * 0.2
        w[channel] /= g  # the outlier's own term stays the others' size: the error grows with g
        weights[f"w{i}"] = w.astype(np.float32)
        nodes += [
            oh.make_node("Mul", ["x", f"g{i}"], [f"h{i}"]),
            oh.make_node("MatMul", [f"h{i}", f"w{i}"], [f"y{i}"], name=f"p{i}"),
        ]
        out.append(oh.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["batch", "seq", N]))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
        out,
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp / f"projections{len(outliers)}.onnx"
    onnx.save(model, path)
    return path


def two_projections(tmp: Path) -> Path:
    """x -> two gains (channel 7 x40, channel 11 x6) -> MatMuls p1, p2: two outputs."""
    return projections(tmp, [(OUTLIER, 40.0), (11, 6.0)])


def test_the_split_takes_the_most_severe_projections_the_target_needs(tmp_path, monkeypatch):
    """Splitting p1 (the x40 channel) alone meets a target the unsplit model misses: p2 stays
    whole. A target only both splits meet gets both, after trying p1 alone."""
    from infercc.calib.job import Int8Flow

    path = two_projections(tmp_path)
    data = _sample_dir(tmp_path)
    both = calibrate(path, data, tmp_path / "both", speed_check=False)  # no target: split all
    assert both.outlier_channels == {"p1": [OUTLIER], "p2": [11]}
    find = Int8Flow.find_outliers

    def p1_only(self, job):
        return {k: v for k, v in find(self, job).items() if k == "p1"}

    with monkeypatch.context() as m:
        m.setattr(Int8Flow, "find_outliers", p1_only)
        one = calibrate(path, data, tmp_path / "one", speed_check=False)
    plain = calibrate(path, data, tmp_path / "plain", speed_check=False, outlier_channels=False)
    c_plain, c_one, c_both = (min(o.cosine for o in r.outputs.values()) for r in (plain, one, both))
    assert c_plain < c_one < c_both

    first = calibrate(
        path, data, tmp_path / "first", speed_check=False, min_cosine=(c_plain + c_one) / 2
    )
    assert first.outlier_channels == {"p1": [OUTLIER]} and first.quantized == ["p1", "p2"]
    split = first.outlier_split
    assert split["projections"] == 1 and [t["projections"] for t in split["tried"]] == [1]
    assert split["tried"][0]["cosine"] == min(o.cosine for o in first.outputs.values())
    ops = Counter(n.op_type for n in onnx.load(tmp_path / "first" / INT8_FILE).graph.node)
    assert ops["Gather"] == 1 and ops["QuantizeLinear"] == 2  # p2 reads x whole
    assert not [k for k in first.kept_float if k.cause == "sensitivity"]
    r = _cli(str(path), "--data", str(data), "--no-speed-check", "-o", str(tmp_path / "cli"),
             "--min-cosine", str((c_plain + c_one) / 2))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "outlier channels: 1 of 2 projection(s) split, 1 channel(s) kept float" in r.stdout

    full = calibrate(
        path, data, tmp_path / "full", speed_check=False, min_cosine=(c_one + c_both) / 2
    )
    assert full.outlier_channels == {"p1": [OUTLIER], "p2": [11]}
    assert full.outlier_split["projections"] == 2
    assert [t["projections"] for t in full.outlier_split["tried"]] == [1]
    assert min(o.cosine for o in full.outputs.values()) == c_both
    assert not [k for k in full.kept_float if k.cause == "sensitivity"]


def test_the_split_count_between_two_tried_is_bisected(tmp_path, monkeypatch):
    """Five projections (outliers x40, x24, x14, x8, x5): 1, 2, 4 are tried, then 3, between
    the last count that missed and the first that met. A target the 3 most severe meet keeps 3;
    one that only 4 meet keeps 4 (split again after 3 missed). The rest stay whole."""
    from infercc.calib.job import Int8Flow

    gains = [(OUTLIER, 40.0), (11, 24.0), (23, 14.0), (31, 8.0), (43, 5.0)]
    path = projections(tmp_path, gains)
    data = _sample_dir(tmp_path)
    find = Int8Flow.find_outliers
    cosine = {}
    for k in (2, 3, 4):

        def most_severe(self, job, k=k):
            kept = [f"p{i}" for i in range(1, k + 1)]
            return {n: c for n, c in find(self, job).items() if n in kept}

        with monkeypatch.context() as m:
            m.setattr(Int8Flow, "find_outliers", most_severe)
            r = calibrate(path, data, tmp_path / f"top{k}", speed_check=False)  # no target
        cosine[k] = min(o.cosine for o in r.outputs.values())
    assert cosine[2] < cosine[3] < cosine[4]

    for kept in (3, 4):
        out = tmp_path / f"bisect{kept}"
        target = (cosine[kept - 1] + cosine[kept]) / 2
        r = calibrate(path, data, out, speed_check=False, min_cosine=target)
        split = r.outlier_split
        assert [t["projections"] for t in split["tried"]] == [1, 2, 4, 3]
        assert split["projections"] == kept
        assert sorted(r.outlier_channels) == [f"p{i}" for i in range(1, kept + 1)]
        final = min(o.cosine for o in r.outputs.values())
        assert final == next(t["cosine"] for t in split["tried"] if t["projections"] == kept)
        assert final == pytest.approx(cosine[kept], abs=1e-6)  # with the other calibration's
        ops = Counter(n.op_type for n in onnx.load(out / INT8_FILE).graph.node)
        assert ops["Gather"] == kept and ops["QuantizeLinear"] == 5  # the rest read x whole
        assert not [k for k in r.kept_float if k.cause == "sensitivity"]
