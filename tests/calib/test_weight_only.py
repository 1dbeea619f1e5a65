"""`calibrate --int4`: the flow on a tiny KV-cache decoder and an MLP, the report, bad input."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.calib.weight_only import calibrate_int4, perplexity
from infercc.errors import InferccError
from infercc.passes.fuse_gqa import runtime_support
from tests.decoders import greedy_reference, tiny_decoder
from tests.helpers import make_model, run_cli


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4")
    path = root / "decoder.onnx"
    onnx.save(tiny_decoder(hidden=64), path)
    ids = np.random.default_rng(0).integers(0, 50, (20, 1, 24)).astype(np.int64)
    np.savez(root / "samples.npz", input_ids=ids)
    return path, root / "samples.npz"


def mlp(tmp_path, opset: int = 21):
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((64, 128)).astype(np.float32),
        "b1": rng.standard_normal(128).astype(np.float32),
        "w2": rng.standard_normal((10, 128)).astype(np.float32),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        oh.make_node("Add", ["h", "b1"], ["hb"]),
        oh.make_node("Relu", ["hb"], ["r"]),
        oh.make_node("Gemm", ["r", "w2"], ["y"], name="fc2", transB=1),
    ]
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    return path


def test_rtn_decoder_without_data(decoder, tmp_path):
    path, _ = decoder
    out = tmp_path / "rtn"
    report = calibrate_int4(path, out, speed_check=False, accuracy_level=0)
    d = report.to_dict()
    assert d["passed"] and d["precision"] == "int4" and d["form"] == "MatMulNBits"
    assert d["samples"]["evaluated_on"] == "random inputs (no --data)"
    # 2 layers x (fused q/k/v, output projection, MLP up, MLP down) + the LM head
    assert d["quantized_nodes"] == 9 and d["embeddings"] == []  # tables float by default
    assert {k["reason"] for k in d["kept_float"] if k["cause"] == "quantizer"} == {
        "its weight is not a constant (a MatMul of two activations)"
    }
    assert d["size"]["ratio"] < 0.35
    assert 0.0 < d["top1_agreement"] <= 1.0 and d["perplexity"] > 0
    assert sorted(p.name for p in out.iterdir()) == [
        "calibration_report.json",
        "manifest.json",
        "model_int4.onnx",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "model_int4.onnx" and manifest["precision"] == "int4"
    assert manifest["backend"]["name"] == "none"
    saved = json.loads((out / "calibration_report.json").read_text())
    assert saved["quantized"] == d["quantized"]
    model = onnx.load(out / "model_int4.onnx")
    onnx.checker.check_model(model)
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["MatMulNBits"] == 9 and ops["GatherBlockQuantized"] == 0
    # the int4 decoder still runs the KV-cache loop
    prompt = np.array([[1, 2, 3, 4]], np.int64)
    assert greedy_reference(out / "model_int4.onnx", prompt, 5).shape == (1, 5)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_awq_and_gptq_compare_with_rtn(decoder, tmp_path, method):
    path, samples = decoder
    report = calibrate_int4(
        path,
        tmp_path / method,
        data=samples,
        method=method,
        speed_check=False,
        accuracy_level=0,
    )
    d = report.to_dict()
    assert d["samples"] == {"calibration": 16, "evaluation": 4, "evaluated_on": "holdout"}
    versus = d["versus_rtn"]
    assert versus["measure"] == "perplexity"
    assert isinstance(versus["beats_rtn"], bool)
    assert ("beat rtn" in versus["message"]) and (
        versus["beats_rtn"] == (d["perplexity"] < versus["rtn"]["perplexity"])
    )
    model = onnx.load(tmp_path / method / "model_int4.onnx")
    muls = [n for n in model.graph.node if "awq_scale" in n.name]
    assert len(muls) == d["input_scales"]
    if method == "gptq":
        assert not muls


def test_awq_beats_rtn_on_its_calibration_rows():
    from infercc.calib.activations import InputStats
    from infercc.calib.awq import awq_quantize
    from infercc.calib.gptq import gptq_quantize
    from infercc.passes.quantize_int4 import quantize_rtn

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 128)) * np.exp(rng.standard_normal(128))
    w = (0.05 * rng.standard_normal((128, 32))).astype(np.float32)
    stats = InputStats(np.abs(x).sum(0), 512, x.T @ x, [x.astype(np.float32)])

    def error(w_hat):
        return float(np.sum((x @ w - x @ w_hat) ** 2))

    rtn = error(quantize_rtn(w, 32, False).dequantize())
    awq = awq_quantize(w, stats, 32, False)
    assert error(awq.blocks.dequantize() / awq.scale[:, None]) < rtn
    assert error(gptq_quantize(w, stats, 32, False).dequantize()) < rtn


def test_portable_form_is_standard_onnx(decoder, tmp_path):
    path, _ = decoder
    report = calibrate_int4(path, tmp_path / "p", portable=True, speed_check=False)
    assert report.form == "DequantizeLinear"
    assert report.to_dict()["accuracy_level"]["chosen"] is None
    model = onnx.load(tmp_path / "p" / "model_int4.onnx")
    onnx.checker.check_model(model, full_check=True)
    assert {n.domain for n in model.graph.node} == {""}
    assert Counter(n.op_type for n in model.graph.node)["DequantizeLinear"] == 9
    assert any("no block-quantized Gather" in r for r in report.quantize.kept_float.values())


def test_gpu_target_defaults_to_symmetric(decoder, tmp_path):
    path, _ = decoder
    report = calibrate_int4(path, tmp_path / "g", target="a100", speed_check=False)
    assert report.symmetric and report.form == "DequantizeLinear"
    model = onnx.load(tmp_path / "g" / "model_int4.onnx")
    types = {t.data_type for t in model.graph.initializer}
    assert TensorProto.INT4 in types and TensorProto.UINT4 not in types


def test_mlp_portable_from_opset_17_is_converted(tmp_path):
    path = mlp(tmp_path, opset=17)
    report = calibrate_int4(path, tmp_path / "m", portable=True, speed_check=False)
    assert sorted(report.quantize.quantized) == ["fc1", "fc2"]
    model = onnx.load(tmp_path / "m" / "model_int4.onnx")
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {21}
    assert report.quality.cosine > 0.9


def test_accuracy_level_auto_measures_both(tmp_path):
    path = mlp(tmp_path)
    report = calibrate_int4(path, tmp_path / "a")
    level = report.to_dict()["accuracy_level"]
    assert level["auto"] and level["chosen"] in (0, 4)
    assert {"level4_vs_level0", "level0", "level4"} <= set(level)
    assert report.speed is not None and report.speed.iters == 60
    model = onnx.load(tmp_path / "a" / "model_int4.onnx")
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs.get("accuracy_level", 0) == level["chosen"]


def test_perplexity_of_a_perfect_model_is_one():
    ids = np.array([[1, 2, 3]])
    logits = np.full((1, 3, 5), -1e9)
    logits[0, 0, 2] = logits[0, 1, 3] = 0.0
    assert perplexity([logits], [ids]) == pytest.approx(1.0)


# --------------------------------------------------------------------------- bad input


def no_weights(tmp_path):
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["a", "b"], ["y"])],
        "g",
        [
            oh.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
            oh.make_tensor_value_info("b", TensorProto.FLOAT, [3, 2]),
        ],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    path = tmp_path / "noweights.onnx"
    onnx.save(make_model(graph, opset_imports=[oh.make_opsetid("", 21)]), path)
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--block-size", "48"], "block size 48 is not a power of two"),
        (["--block-size", "8"], "not a power of two"),
        (["--method", "awq"], "--method awq needs calibration samples"),
        (["--method", "minmax"], "unknown int4 method"),
        (["--min-cosine", "0.9"], "--min-cosine applies to int8 calibration"),
        (["--asymmetric", "--target", "a100"], "TensorRT"),
        (["--portable", "--accuracy-level", "4"], "--accuracy-level applies to MatMulNBits"),
        (["--accuracy-level", "7"], "bad accuracy level"),
        (["--int8"], "exclude each other"),
        (["--exclude", "nope"], "not in the optimized model"),
        (["--portable", "--assume", "nonempty-sequences"], "--assume has no effect"),
        (["--assume", "short-prompts"], "is not an assumption infercc knows"),
        (["--disable-pass", "quantize-int4"], "would leave nothing to calibrate"),
    ],
)
def test_bad_flags_exit_2_nothing_written(decoder, tmp_path, extra, message):
    path, _ = decoder
    out = tmp_path / "out"
    done = run_cli("calibrate", str(path), "--int4", "-o", str(out), *extra)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_int4_flag_on_int8_run_is_refused(decoder, tmp_path):
    path, samples = decoder
    done = run_cli(
        "calibrate",
        str(path),
        "--data",
        str(samples),
        "-o",
        str(tmp_path / "x"),
        "--block-size",
        "64",
    )
    assert done.returncode == 2 and "--block-size applies to --int4 only" in done.stderr


def test_no_matmul_weights(tmp_path):
    done = run_cli("calibrate", str(no_weights(tmp_path)), "--int4", "-o", str(tmp_path / "o"))
    assert done.returncode == 2
    assert "no MatMul or Gemm with a constant float32 or float16 weight" in done.stderr
    assert not (tmp_path / "o").exists()


def test_api_raises(tmp_path):
    with pytest.raises(InferccError, match="power of two"):
        calibrate_int4(no_weights(tmp_path), tmp_path / "o", block_size=100)


def test_cli_json_and_table(decoder, tmp_path):
    path, samples = decoder
    done = run_cli(
        "calibrate",
        str(path),
        "--int4",
        "--data",
        str(samples),
        "-o",
        str(tmp_path / "c"),
        "--no-speed-check",
        "--accuracy-level",
        "0",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["method"] == "rtn" and data["block_size"] == 32 and data["symmetric"]
    # the split of the wall time: each step of the build, together under the whole command's
    split = data["timings"]
    assert list(split) == ["load", "passes", "plan", "quantize_write", "validate"]
    assert all(s >= 0 for s in split.values()) and sum(split.values()) <= data["seconds"]
    nbits = [
        n
        for n in onnx.load(tmp_path / "c" / "model_int4.onnx").graph.node
        if n.op_type == "MatMulNBits"
    ]
    assert nbits and all(len(n.input) < 4 or not n.input[3] for n in nbits)  # zero point 8
    done = run_cli(
        "calibrate",
        str(path),
        "--int4",
        "--block-size",
        "64",
        "--asymmetric",
        "-o",
        str(tmp_path / "t"),
        "--no-speed-check",
        "--accuracy-level",
        "0",
    )
    assert done.returncode == 0, done.stderr
    assert "int4 rtn (MatMulNBits, block 64, asymmetric)" in done.stdout
    assert "perplexity" in done.stdout and "size" in done.stdout


@pytest.mark.skipif(runtime_support() is not None, reason=str(runtime_support()))
def test_decoder_fusions_run_on_the_cpu_form_and_gqa_under_the_assumption(tmp_path):
    """A Llama-style decoder (RMSNorm, RoPE, grouped-query attention): int4 keeps its
    fusions, GroupQueryAttention only with --assume nonempty-sequences; the int4 model still
    generates what a greedy loop over it gives."""
    path = tmp_path / "llama.onnx"
    onnx.save(tiny_decoder(hidden=64, kv_heads=2, rotary=True, attention="sdpa", norm="rms"), path)
    plain = calibrate_int4(path, tmp_path / "plain", speed_check=False, accuracy_level=0)
    assert "fuse-group-query-attention" not in plain.fusions
    assert sum(plain.fusions["fuse-rms-norm"].values()) >= 3
    assumed = calibrate_int4(
        path,
        tmp_path / "gqa",
        speed_check=False,
        accuracy_level=0,
        assume=["nonempty-sequences"],
    )
    d = assumed.to_dict()
    assert d["fusions"]["fuse-group-query-attention"] == {"fused": 2}
    assert d["assumptions"][0]["rewrites"] == {"fuse-group-query-attention": 2}
    model = onnx.load(tmp_path / "gqa" / "model_int4.onnx")
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["GroupQueryAttention"] == 2 and ops["MatMulNBits"] > 0 and ops["Softmax"] == 0
    # as close to fp32 as the unfused int4 model (the fusions add rounding only)
    assert d["top1_agreement"] == pytest.approx(plain.quality.top1_agreement, abs=0.02)
    prompt = np.random.default_rng(1).integers(0, 50, (2, 5))
    fused = greedy_reference(tmp_path / "gqa" / "model_int4.onnx", prompt, 8)
    unfused = greedy_reference(tmp_path / "plain" / "model_int4.onnx", prompt, 8)
    np.testing.assert_array_equal(fused, unfused)


def test_verify_checks_the_int4_rewrite_after_it_runs(tmp_path, monkeypatch):
    """`calibrate --int4 --verify`: each int4 build runs quantize-int4 through the pass
    manager, whose declared conditions are checked after it (and before, what it requires)."""
    from infercc.passes import manager

    checked: list[tuple[str, str]] = []
    real = manager._check_conditions

    def spy(name, model, conditions, verb):
        checked.append((name, verb))
        return real(name, model, conditions, verb)

    monkeypatch.setattr(manager, "_check_conditions", spy)
    done = run_cli(
        "calibrate",
        str(mlp(tmp_path)),
        "--int4",
        "-o",
        str(tmp_path / "v"),
        "--verify",
        "--no-speed-check",
    )
    assert done.returncode == 0, done.stderr
    assert ("quantize-int4", "requires") in checked
    assert ("quantize-int4", "did not ensure") in checked
    checked.clear()
    done = run_cli(
        "calibrate", str(mlp(tmp_path)), "--int4", "-o", str(tmp_path / "nv"), "--no-speed-check"
    )
    assert done.returncode == 0, done.stderr
    assert checked == []  # without --verify, no checks


def test_a_large_model_without_data_is_evaluated_on_fewer_random_prompts():
    """Past LARGE_WEIGHT_BYTES of weights the evaluation (three whole-model runs a sample)
    takes RANDOM_SAMPLES_LARGE random prompts, and what it was evaluated on says so."""
    from infercc.analysis.decoder import decoder_signature
    from infercc.calib import weight_only as wo

    proto = tiny_decoder()
    sig = decoder_signature(proto)
    small, why_small = wo._samples(None, proto, sig, None, None)
    large, why_large = wo._samples(None, proto, sig, None, None, None, wo.LARGE_WEIGHT_BYTES + 1)
    assert len(small) == wo.RANDOM_SAMPLES and why_small == "random inputs (no --data)"
    assert len(large) == wo.RANDOM_SAMPLES_LARGE < wo.RANDOM_SAMPLES
    assert f"{wo.RANDOM_SAMPLES_LARGE} of {wo.RANDOM_SAMPLES}: 1.07 GB of weights" in why_large
