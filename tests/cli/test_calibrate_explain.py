"""`calibrate --int4 --explain` lists every refused rewrite of the passes it ran (the fp32
pipeline's decoder fusions and quantize-int4's nodes kept float) in optimize's table and JSON
form; `--bisect` judges the fp32 passes against the original and names the one that breaks it;
with int8 calibration --explain lists its passes' refusals the same way, and --bisect is an
error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.passes.manager import REGISTRY, PassResult
from infercc.passes.pipelines import DECODER_FUSIONS
from tests.decoders import tiny_decoder
from tests.helpers import make_model, run_cli

NOT_CONSTANT = "its weight is not a constant (a MatMul of two activations)"
FAST = ("--no-speed-check", "--accuracy-level", "0")


def _mixer(tmp_path: Path) -> Path:
    """x @ w1 -> Relu -> @ m (a graph input: no constant weight) -> @ w2 (the LM head)."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((64, 128)).astype(np.float32),
        "w2": rng.standard_normal((128, 10)).astype(np.float32),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        oh.make_node("Relu", ["h"], ["r"], name="relu"),
        oh.make_node("MatMul", ["r", "m"], ["mixed"], name="mix"),
        oh.make_node("MatMul", ["mixed", "w2"], ["y"], name="head"),
    ]
    graph = oh.make_graph(
        nodes,
        "mixer",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64]),
            oh.make_tensor_value_info("m", TensorProto.FLOAT, [128, 128]),
        ],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 21)])
    model.ir_version = 8
    path = tmp_path / "mixer.onnx"
    onnx.save(model, path)
    return path


def _int4(src: Path, out: Path, *flags: str):
    return run_cli("calibrate", str(src), "--int4", "-o", str(out), *FAST, *flags)


def test_explain_lists_the_weights_kept_float_where_they_failed(tmp_path: Path) -> None:
    src = _mixer(tmp_path)
    r = _int4(src, tmp_path / "o", "--explain", "--no-lm-head")
    assert r.returncode == 0, r.stderr
    assert "refused rewrites" in r.stdout and "failed at" in r.stdout
    rows = {
        line.split("│")[2].strip(): line
        for line in r.stdout.splitlines()
        if line.startswith("│ quantize-int4")
    }
    assert set(rows) == {"mix", "head"}, r.stdout
    assert NOT_CONSTANT in rows["mix"] and "tensor 'm'" in rows["mix"]
    assert "--no-lm-head" in rows["head"] and "'head' (MatMul)" in rows["head"]


def test_without_explain_there_is_no_table(tmp_path: Path) -> None:
    r = _int4(_mixer(tmp_path), tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert "refused rewrites" not in r.stdout
    assert f"kept float: mix: {NOT_CONSTANT}" in r.stdout


def test_json_refusals_are_optimize_s_form(tmp_path: Path) -> None:
    src = _mixer(tmp_path)
    r = _int4(src, tmp_path / "o", "--explain", "--json")
    assert r.returncode == 0, r.stderr
    refusals = json.loads(r.stdout)["refusals"]
    mine = [x for x in refusals if x["pass"] == "quantize-int4"]
    want = {"pass": "quantize-int4", "node": "mix", "op": "MatMul", "reason": NOT_CONSTANT}
    assert mine == [{**want, "at": "tensor 'm'"}]
    written = json.loads((tmp_path / "o" / "calibration_report.json").read_text())
    assert written["refusals"] == refusals
    assert all(set(x) == {"pass", "node", "op", "reason", "at"} for x in refusals)  # optimize's


def test_explain_lists_the_decoder_fusions_refusals(tmp_path: Path) -> None:
    """A decoder whose attention the fusions do not take: their refusals come first (the fp32
    pipeline ran first), then the int4 pass's (the attention MatMuls, the tables)."""
    src = tmp_path / "decoder.onnx"
    onnx.save(tiny_decoder(layers=1, hidden=64), src)
    r = _int4(src, tmp_path / "o", "--explain", "--json")
    assert r.returncode == 0, r.stderr
    refusals = json.loads(r.stdout)["refusals"]
    passes = [x["pass"] for x in refusals]
    fusions = [p for p in passes if p in DECODER_FUSIONS]
    assert fusions, refusals
    assert passes.index(fusions[0]) < passes.index("quantize-int4")
    tables = [x for x in refusals if x["pass"] == "quantize-int4" and x["op"] == "Gather"]
    assert tables and all("--embeddings makes it int4" in x["reason"] for x in tables)


def _broken(graph, ctx) -> PassResult:
    """Every Relu into a Sigmoid: a 'fusion' that changes the outputs, one rewrite a node."""
    changed = False
    for node in list(graph):
        if node.op_type == "Relu" and ctx.allow_rewrite(node):
            node.op_type = "Sigmoid"
            changed = True
    return PassResult(changed)


def test_bisect_names_the_fp32_pass_that_breaks_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(REGISTRY["fuse-gemm"], "fn", _broken)
    src, out = _mixer(tmp_path), tmp_path / "o"
    r = _int4(src, out, "--bisect")
    assert r.returncode == 1, r.stderr
    assert "pass 'fuse-gemm', rewrite 1 of 1 (node 'relu', Relu)" in " ".join(r.stdout.split())
    assert "nothing written" in r.stdout and not out.exists()
    data = _int4(src, out, "--bisect", "--json")
    assert data.returncode == 1 and not out.exists()
    d = json.loads(data.stdout)
    assert not d["passed"] and d["quantized"] == [] and d["cosine"] is None
    b = d["bisect"]
    assert b["reproduced"] and b["guilty_pass"] == "fuse-gemm" and b["granularity"] == "rewrite"
    assert (b["first_bad"], b["rewrite_node"]) == (1, "relu")


def test_bisect_says_when_the_fp32_passes_keep_the_outputs(tmp_path: Path) -> None:
    r = _int4(_mixer(tmp_path), tmp_path / "o", "--bisect", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["passed"] and d["bisect"]["reproduced"] is False
    assert "keep the original's outputs" in d["bisect"]["message"]
    assert "quantize-int4 is lossy by design" in d["bisect"]["message"]
    plain = _int4(_mixer(tmp_path), tmp_path / "p", "--json")
    assert json.loads(plain.stdout)["bisect"] is None


def _samples(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "samples.npz"
    x = rng.standard_normal((10, 4, 64)).astype(np.float32)
    np.savez(path, x=x, m=rng.standard_normal((10, 128, 128)).astype(np.float32))
    return path


def test_int8_explain_lists_quantize_qdq_refusals(tmp_path: Path) -> None:
    """int8 calibration runs registered passes too: --explain lists the final candidate's
    quantize-qdq refusals (a MatMul of two activations) in the same table and JSON form."""
    src, data = _mixer(tmp_path), str(_samples(tmp_path))
    cmd = ("calibrate", str(src), "--data", data, "--no-speed-check", "--explain")
    r = run_cli(*cmd, "-o", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ quantize-qdq")]
    assert len(rows) == 1 and "│ mix " in rows[0] and "both operands are activations" in rows[0]
    j = run_cli(*cmd, "-o", str(tmp_path / "j"), "--json")
    assert j.returncode == 0, j.stderr
    mine = [x for x in json.loads(j.stdout)["refusals"] if x["pass"] == "quantize-qdq"]
    assert [(x["node"], x["op"], x["at"]) for x in mine] == [("mix", "MatMul", "'mix' (MatMul)")]
    plain = run_cli("calibrate", str(src), "--data", data, "--no-speed-check", "-o",
                    str(tmp_path / "p"))  # fmt: skip
    assert plain.returncode == 0 and "refused rewrites" not in plain.stdout


def test_bisect_without_int4_is_an_error(tmp_path: Path) -> None:
    src, data = _mixer(tmp_path), str(_samples(tmp_path))
    r = run_cli("calibrate", str(src), "--data", data, "-o", str(tmp_path / "o"), "--bisect")
    assert r.returncode == 2
    assert "--bisect applies to --int4 only" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
