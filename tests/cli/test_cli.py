"""The command line: exit codes, one-line errors, nothing written on bad input, JSON output.

Every command runs in this process through the console script's entry point
(`tests.helpers.run_cli`); what only a process shows is in tests/cli/test_process.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.helpers import make_model, run_cli

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) {
  a = Identity(x)
  b = Relu(a)
  y = Add(b, w)
}
"""


def write_model(path: Path, text: str = MODEL) -> Path:
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(numpy_helper.from_array(np.arange(4, dtype=np.float32), "w"))
    onnx.save(proto, path)
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`infercc ARGS` in this process, through the entry point (`tests.helpers.run_cli`)."""
    return run_cli(*args, cwd=cwd)


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_optimize_json_report(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    r = run("optimize", str(src), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    for key in (
        "nodes_before",
        "nodes_after",
        "ops_before",
        "ops_after",
        "passes",
        "output",
        "validation",
        "seconds",
    ):
        assert key in rep
    assert rep["nodes_before"] == 3 and rep["nodes_after"] == 2
    assert rep["ops_after"] == {"Add": 1, "Relu": 1}
    assert rep["validation"]["passed"] is True
    assert set(rep["validation"]["outputs"]["y"]) >= {"max_abs", "max_rel", "cosine"}
    assert all("time_s" in st for st in rep["passes"].values())
    out = tmp_path / "m.opt.onnx"
    assert rep["output"] == str(out) and out.exists()
    mem = rep["memory"]
    # b (Relu) and y (Add): 1x4 floats = 16 B each, aligned to 64, both live at the last step
    assert mem["weights_bytes"] == 16 and mem["naive_bytes"] == 128
    assert mem["arena_bytes"] == mem["lower_bound_bytes"] == 128
    assert mem["shape_profile"] == {"x": [1, 4]}
    plan = json.loads((tmp_path / "m.opt.memory_plan.json").read_text())
    assert plan["schema"] == "infercc.memory_plan/1" and set(plan["tensors"]) == {"b", "y"}
    assert rep["files"] == [str(out), str(tmp_path / "m.opt.memory_plan.json")]
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_optimize_human_summary(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    r = run("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--explain")
    assert r.returncode == 0, r.stderr
    assert "nodes 3 -> 2" in r.stdout and "validation passed" in r.stdout
    assert "eliminate-no-ops" in r.stdout


def test_optimize_is_deterministic_and_idempotent(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    assert run("optimize", str(src), "-o", str(tmp_path / "a.onnx")).returncode == 0
    assert run("optimize", str(src), "-o", str(tmp_path / "b.onnx")).returncode == 0
    a = (tmp_path / "a.onnx").read_bytes()
    assert a == (tmp_path / "b.onnx").read_bytes()
    r = run("optimize", str(tmp_path / "a.onnx"), "-o", str(tmp_path / "c.onnx"), "--json")
    assert json.loads(r.stdout)["nodes_before"] == json.loads(r.stdout)["nodes_after"]
    assert (tmp_path / "c.onnx").read_bytes() == a


def test_refuses_to_overwrite_input(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    before = src.read_bytes()
    r = run("optimize", str(src), "-o", str(src))
    assert r.returncode == 2
    assert "refusing to overwrite the input" in r.stderr
    assert src.read_bytes() == before


def _hostile(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    cases = {}
    p = tmp_path / "text.onnx"
    p.write_text("this is not a model\n")
    cases["not protobuf"] = (p, "not a valid ONNX model")
    good = write_model(tmp_path / "good.onnx").read_bytes()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(good[: len(good) // 2])
    cases["truncated"] = (p, "ONNX")
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    cases["empty"] = (p, "no ONNX graph")
    cyc = make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
            "g",
            [],
            [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [1])],
        )
    )
    p = tmp_path / "cycle.onnx"
    onnx.save(cyc, p)
    cases["cycle"] = (p, "cycle")
    dangling = make_model(
        helper.make_graph(
            [helper.make_node("Add", ["x", "missing_w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
    )
    p = tmp_path / "dangling.onnx"
    onnx.save(dangling, p)
    cases["missing initializer"] = (p, "'missing_w', which no node, graph input or initializer")
    dup = make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
    )
    p = tmp_path / "dup.onnx"
    onnx.save(dup, p)
    cases["duplicate names"] = (p, "duplicate value name 'y'")
    future = onnx.parser.parse_model(MODEL.replace('"" : 17', '"" : 999'))
    p = tmp_path / "future.onnx"
    onnx.save(future, p)
    cases["future opset"] = (p, "opset 999")
    cases["missing file"] = (tmp_path / "nope.onnx", "not found")
    return cases


@pytest.mark.parametrize(
    "case",
    [
        "not protobuf",
        "truncated",
        "empty",
        "cycle",
        "missing initializer",
        "duplicate names",
        "future opset",
        "missing file",
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, case):
    work = tmp_path / "w"
    work.mkdir()
    path, message = _hostile(work)[case]
    before = listing(work)
    r = run("optimize", str(path))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in r.stderr
    assert listing(work) == before


def test_debug_shows_traceback(tmp_path):
    p = tmp_path / "text.onnx"
    p.write_text("garbage")
    r = run("--debug", "optimize", str(p))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_unknown_pass_and_bad_shape(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    r = run("optimize", str(src), "--disable-pass", "nope")
    assert r.returncode == 2 and "unknown pass 'nope'" in r.stderr
    r = run("optimize", str(src), "--shape", "x=1xbanana")
    assert r.returncode == 2 and "--shape" in r.stderr
    r = run("optimize", str(src), "--shape", "nope=1x4")
    assert r.returncode == 2 and "not an input of the model" in r.stderr
    assert listing(tmp_path) == ["m.onnx"]


def test_disable_pass(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    r = run("optimize", str(src), "--disable-pass", "eliminate-no-ops", "--json")
    rep = json.loads(r.stdout)
    assert "eliminate-no-ops" not in rep["passes"] and rep["nodes_after"] == 3


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        ("convert-fp16", [], "--disable-pass convert-fp16 has no effect without --fp16"),
        ("convert-fp16", ["--fp16"], "--fp16 has no effect with --disable-pass convert-fp16"),
        ("quantize-qdq", [], "--disable-pass quantize-qdq has no effect: optimize does not run"),
        ("quantize-qdq", ["--fp16"], "--disable-pass quantize-qdq has no effect: optimize does"),
    ],
)
def test_disable_pass_of_a_pass_optimize_does_not_run(tmp_path, name, extra, message):
    src = write_model(tmp_path / "m.onnx")
    r = run("optimize", str(src), "--disable-pass", name, *extra)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and listing(tmp_path) == ["m.onnx"]


def test_passes_lists_every_pipeline_and_pass():
    r = run("passes")
    assert r.returncode == 0
    for word in ("optimize", "fp16", "calibrate-fp32", "int8", "fold-constants", "convert-fp16"):
        assert word in r.stdout
    for word in ("split-outlier-channels", "quantize-qdq", "Turn Constant nodes"):
        assert word in r.stdout
    data = json.loads(run("passes", "--json").stdout)
    names = [p["name"] for p in data["pipelines"]]
    assert names == ["optimize", "fp16", "calibrate-fp32", "calibrate-int4", "int8", "int4"]
    assert by_name_of(data, "fuse-decoder-attention")["pipelines"] == ["calibrate-int4"]
    by_name = {p["name"]: p for p in data["passes"]}
    assert by_name["convert-fp16"]["pipelines"] == ["fp16"]
    assert by_name["quantize-qdq"]["pipelines"] == ["int8"] and by_name["quantize-qdq"]["doc"]
    assert data["pipelines"][0]["stages"][0][0] == "fold-constants"


def by_name_of(data: dict, name: str) -> dict:
    return next(p for p in data["passes"] if p["name"] == name)


def test_validation_failure_exit_1_nothing_written(tmp_path, monkeypatch):
    from infercc import api
    from infercc.passes import manager

    src = write_model(tmp_path / "m.onnx")

    def corrupt(graph, ctx):  # a deliberately wrong rewrite: Relu -> Neg
        changed = False
        for n in graph:
            if n.op_type == "Relu":
                n.op_type = "Neg"
                changed = True
        return manager.PassResult(changed)

    monkeypatch.setitem(manager.REGISTRY, "corrupt", manager.PassInfo("corrupt", corrupt, ""))
    monkeypatch.setattr(api, "optimize_stages", lambda precision: [("corrupt",)])
    report = api.optimize(src, tmp_path / "o.onnx")
    assert not report.passed and report.validation.outputs["y"].cosine < 0.9999
    assert listing(tmp_path) == ["m.onnx"]


def test_inspect_json(tmp_path):
    r = run("inspect", str(DATA / "light" / "light_resnet50.onnx"), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ops"]["Conv"] == 53 and rep["ops"]["BatchNormalization"] == 53
    # ResNet-50 at 224x224: 4.1 G multiply-adds in its convolutions
    assert 8.0e9 < rep["flops_by_op"]["Conv"] < 8.4e9
    assert rep["inputs"][0]["shape"] == [1, 3, 224, 224]


def test_inspect_pins_symbolic_shapes(tmp_path):
    text = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 64] x) => (float[B, 32] y) { y = MatMul(x, w) }
"""
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((64, 32), np.float32), "w"))
    p = tmp_path / "mm.onnx"
    onnx.save(proto, p)
    rep = json.loads(run("inspect", str(p), "--shape", "x=8x64", "--json").stdout)
    assert rep["flops"] == 2 * 8 * 64 * 32 and rep["parameters"] == 64 * 32
    assert rep["shape_profile"] == {"x": [8, 64]}
    rep = json.loads(run("inspect", str(p), "--json").stdout)  # the default profile: B = 1
    assert rep["shape_profile"] == {"x": [1, 64]} and rep["flops"] == 2 * 64 * 32
    assert rep["flops_unknown_nodes"] == [] and rep["roofline"] is None


def test_inspect_with_target(tmp_path):
    text = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 1024] x) => (float[B, 1024] y) { h = MatMul(x, w)
  y = Relu(h) }
"""
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((1024, 1024), np.float32), "w"))
    p = tmp_path / "mm.onnx"
    onnx.save(proto, p)
    png = tmp_path / "roof.png"
    r = run(
        "inspect", str(p), "--target", "a100", "--shape", "x=4x1024", "--json", "--plot", str(png)
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    roof, mem = rep["roofline"], rep["memory"]
    mm = next(n for n in roof["nodes"] if n["op_type"] == "MatMul")
    assert mm["flops"] == 2 * 4 * 1024 * 1024
    assert mm["bytes_read"] == 4 * 1024 * 4 + 1024 * 1024 * 4
    assert mm["bound"] == "memory"  # 8.4 MFLOP over 4.2 MB: far under A100's fp32 ridge
    assert abs(roof["total_time_s"] - sum(n["time_s"] for n in roof["nodes"])) < 1e-12
    assert mem["weights_bytes"] == 1024 * 1024 * 4 and mem["fits"] is True
    assert mem["arena_bytes"] == 2 * 4 * 1024 * 4  # h and y, both live at the last step
    assert mem["batch_inputs"] == ["x"] and mem["largest_batch"] > 1000
    assert png.stat().st_size > 1000
    r = run("inspect", str(p), "--plot", str(tmp_path / "x.png"))
    assert r.returncode == 2 and "--plot needs a target" in r.stderr


def test_help_teaches():
    r = run("optimize", "--help")
    assert r.returncode == 0
    for word in ("--shape", "--disable-pass", "--portable", "--no-validate", "--explain"):
        assert word in r.stdout


def test_targets_command():
    r = run("targets", "--json")
    assert r.returncode == 0, r.stderr
    rows = {t["name"]: t for t in json.loads(r.stdout)}
    assert list(rows)[0] == "cpu" and {"t4", "a100", "h100", "h200"} <= set(rows)
    assert rows["a100"]["peak_flops"]["fp16"] == 312e12
    assert "a100" in run("targets").stdout
    r = run("optimize", "model.onnx", "--target", "tpu")
    assert r.returncode == 2 and "unknown target 'tpu'" in r.stderr and "h100" in r.stderr


def test_tensorrt_backend_unavailable_exit_2_nothing_written(tmp_path):
    src = write_model(tmp_path / "m.onnx")
    r = run("optimize", str(src), "-o", str(tmp_path / "art"), "--backend", "tensorrt")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "backend 'tensorrt' cannot run here" in lines[0]
    assert 'pip install "infercc[tensorrt]"' in lines[0] or "NVIDIA" in lines[0]
    assert listing(tmp_path) == ["m.onnx"]
    # a GPU target defaults to the TensorRT backend for artifacts
    r = run("optimize", str(src), "-o", str(tmp_path / "art"), "--target", "a100")
    assert r.returncode == 2 and "tensorrt" in r.stderr
    r = run("optimize", str(src), "-o", str(tmp_path / "x.onnx"), "--backend", "ort")
    assert r.returncode == 2 and "builds an artifact directory" in r.stderr


def test_rich_markup_in_messages_is_printed_verbatim(tmp_path):
    r = run("optimize", str(tmp_path / "[bold]missing.onnx"))
    assert r.returncode == 2 and "[bold]missing.onnx" in r.stderr


EXAMPLE_CNN = Path(__file__).resolve().parents[2] / "examples" / "small_cnn.onnx"


def test_bench_json_fields():
    r = run("bench", str(EXAMPLE_CNN), "--batch", "1,4", "--warmup", "1", "--iters", "5", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["backend"] == "onnxruntime" and [x["batch"] for x in rep["results"]] == [1, 4]
    for x in rep["results"]:
        for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput", "iters", "shapes"):
            assert key in x
        assert x["p50_ms"] <= x["p90_ms"] <= x["p99_ms"] <= x["max_ms"]
        assert x["iters"] == 5 and x["shapes"]["image"][0] == x["batch"]
    r = run(
        "bench",
        str(EXAMPLE_CNN),
        "--compare",
        str(EXAMPLE_CNN),
        "--iters",
        "4",
        "--warmup",
        "1",
        "--json",
    )
    rep = json.loads(r.stdout)
    assert rep["max_abs_diff"] == 0.0 and rep["results"][0]["ratio_median"] > 0
    r = run("bench", str(EXAMPLE_CNN), "--batch", "0")
    assert r.returncode == 2 and "bad --batch" in r.stderr


def test_usage_errors_exit_2():
    r = run("optimize", "--no-such-option")
    assert r.returncode == 2 and "No such option" in r.stderr and "Traceback" not in r.stderr
    r = run("inspect")
    assert r.returncode == 2 and "Missing argument" in r.stderr


def test_optimize_fp16(tmp_path):
    enc = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"
    out = tmp_path / "enc16.onnx"
    # the standard attention ops are what is converted here: onnxruntime's Attention op, which
    # emit-attention makes of them on the cpu target, runs float32 only
    no_attention = ("--disable-pass", "emit-attention")
    r = run("optimize", str(enc), "-o", str(out), "--fp16", *no_attention, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["precision"] == "fp16" and rep["validation"]["passed"] is True
    assert rep["validation"]["min_cosine"] == 0.999
    assert rep["validation"]["outputs"]["output"]["cosine"] >= 0.999
    kept = {k["op"] for k in rep["kept_fp32"]}
    assert kept == {"Softmax", "LayerNormalization"}
    assert rep["passes"]["convert-fp16"]["weights_converted"] >= 4
    model = onnx.load(out)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    weights = {t.data_type for t in model.graph.initializer if len(t.dims) == 2}
    assert weights == {onnx.TensorProto.FLOAT16}
    r = run(
        "optimize",
        str(enc),
        "-o",
        str(tmp_path / "io16.onnx"),
        "--fp16",
        "--fp16-io",
        "--keep-fp32",
        "MatMul",
        *no_attention,
        "--json",
    )
    rep = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert "MatMul" in {k["op"] for k in rep["kept_fp32"]}
    io16 = onnx.load(tmp_path / "io16.onnx")
    assert io16.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_calibrate_command(tmp_path):
    enc = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"
    samples = tmp_path / "samples"
    samples.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        x = rng.standard_normal((1, 8, 64)).astype(np.float32)
        np.savez(samples / f"s{i}.npz", hidden_states=x)
    r = run("calibrate", str(enc), "--data", str(samples), "-o", str(tmp_path / "int8"), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["passed"] is True and rep["quantized_nodes"] >= 2 and rep["cosine"] >= 0.99
    # the attention MatMuls (two activations) stay float by default, with the reason
    kept = [k for k in rep["kept_float"] if "both operands are activations" in k["reason"]]
    assert len(kept) == 2
    assert rep["activations"] == "uint8"  # --target cpu (the default)
    # an encoder: the percentile method and the 0.99 target were chosen, and the report says why
    why = "the model is a transformer (1 Softmax over a MatMul of two activations)"
    assert rep["settings"]["method"] == {"value": "percentile", "why": why, "given": False}
    assert rep["settings"]["percentile"]["value"] == 99.999
    assert rep["settings"]["min_cosine"]["value"] == 0.99 and rep["method"] == "percentile"
    speed = rep["speed"]
    assert speed["fp32_ms"] > 0 and speed["int8_ms"] > 0 and speed["iters"] == 60
    assert speed["slower"] == (speed["ratio_p10"] > 1.0)
    names = sorted(p.name for p in (tmp_path / "int8").iterdir())
    assert names == [
        "calibration.cache",
        "calibration_report.json",
        "manifest.json",
        "model_fp32.onnx",
        "model_int8.onnx",
        "ranges.json",
    ]
    ops = {n.op_type for n in onnx.load(tmp_path / "int8" / "model_int8.onnx").graph.node}
    # cpu target: each projection with its bias is onnxruntime's MatMulIntegerToFloat
    assert {"QuantizeLinear", "MatMulIntegerToFloat"} <= ops and "MatMul" in ops
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "hidden_states.npy", np.array([object()], dtype=object), allow_pickle=True)
    r = run("calibrate", str(enc), "--data", str(bad), "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "pickle" in r.stderr.lower() and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_cache_ls_on_a_missing_directory_creates_nothing(tmp_path):
    where = tmp_path / "nonexistent" / "x"
    r = run("cache", "ls", "--cache-dir", str(where))
    assert r.returncode == 0, r.stderr
    assert "no tuning cache at" in r.stdout
    r = run("cache", "ls", "--cache-dir", str(where), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["exists"] is False
    assert run("cache", "clear", "--cache-dir", str(where)).returncode == 0
    assert not (tmp_path / "nonexistent").exists()


def _embedding_model(tmp_path: Path, ids: list[list[int]]) -> tuple[Path, Path]:
    """A Gather from a 10-row table, then a MatMul; four samples of `ids` (the last id + i)."""
    table = numpy_helper.from_array(np.ones((10, 16), np.float32), "table")
    weight = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"]),
            helper.make_node("MatMul", ["e", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 16])],
        [table, weight],
    )
    model = tmp_path / "m.onnx"
    onnx.save(make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    samples = tmp_path / "samples"
    samples.mkdir()
    for i in range(4):
        row = np.array(ids, np.int64)
        row[..., -1] += i
        np.savez(samples / f"s{i}.npz", ids=row)
    return model, samples


def test_a_sample_onnxruntime_rejects_is_one_line_and_writes_nothing(tmp_path):
    """A token id past the embedding table: onnxruntime fails on the sample while ranges are
    collected. One line, infercc's (onnxruntime's own error log stays quiet), exit 2, no
    output directory."""
    model, samples = _embedding_model(tmp_path, [[1, 2, 50]])
    out = tmp_path / "int8"
    r = run("calibrate", str(model), "--data", str(samples), "-o", str(out))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("error: onnxruntime failed on a calibration sample")
    assert not out.exists()


def test_a_tensor_infercc_asks_for_and_cannot_observe_is_its_failure(tmp_path, monkeypatch):
    """The tensors calibration observes are infercc's choice: one the observer refuses (here
    the int64 token ids, as the residual-Add rule once asked for position ids) is infercc's
    failure, exit 1, one line, nothing written; not a bad input."""
    from infercc.calib import job

    chosen = job.calibration_tensors
    monkeypatch.setattr(job, "calibration_tensors", lambda ir: [*chosen(ir), "ids"])
    model, samples = _embedding_model(tmp_path, [[1, 2, 3]])
    out = tmp_path / "int8"
    r = run("calibrate", str(model), "--data", str(samples), "-o", str(out))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()]
    assert "calibration asked for a tensor it cannot observe: tensor 'ids' is int64" in r.stderr
    assert "bug in infercc" in r.stderr
    assert not out.exists()


def test_an_unexpected_exception_is_an_internal_error_exit_1(tmp_path, monkeypatch):
    """A bug (an exception infercc did not word) is infercc's failure: one line naming it,
    exit 1, not exit 2 (bad input); --debug shows the traceback."""
    import infercc.analysis.model_info as model_info

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(model_info, "inspect_model", broken)
    r = run("inspect", str(EXAMPLE_CNN))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [r.stderr.strip()]
    assert "internal error" in r.stderr and "ZeroDivisionError: boom" in r.stderr
    r = run("--debug", "inspect", str(EXAMPLE_CNN))
    assert r.returncode == 1 and "Traceback" in r.stderr


@pytest.mark.parametrize("damage", ["truncated", "escaping-data", "unknown-op", "dangling-input"])
def test_validate_a_candidate_that_cannot_be_read_is_bad_input(tmp_path: Path, damage: str) -> None:
    """A candidate the user hands in that cannot be read, reads data from outside its folder,
    or that onnxruntime refuses to load: exit 2, one line, before any verdict."""
    ref = write_model(tmp_path / "ref.onnx")
    proto = onnx.load(ref)
    bad = tmp_path / "cand.onnx"
    if damage == "truncated":
        bad.write_bytes(ref.read_bytes()[:40])
    else:
        if damage == "escaping-data":
            w = proto.graph.initializer[0]
            w.ClearField("raw_data")
            w.ClearField("float_data")
            w.data_location = onnx.TensorProto.EXTERNAL
            w.external_data.add(key="location", value="../../etc/hostname")
        elif damage == "unknown-op":
            proto.graph.node[1].op_type = "NoSuchOp"
        else:
            proto.graph.node[1].input[0] = "nowhere"
        onnx.save(proto, bad)
    done = run("validate", str(bad), "--reference", str(ref))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    expected = {
        "truncated": "cannot read ONNX model",
        "escaping-data": "outside the model's folder",
        "unknown-op": "NoSuchOp",
        "dangling-input": "nowhere",
    }[damage]
    assert expected in done.stderr


def test_validate_a_candidate_that_loads_and_fails_exits_1(tmp_path: Path) -> None:
    ref = write_model(tmp_path / "ref.onnx")
    proto = onnx.load(ref)
    proto.graph.node[1].op_type = "Sigmoid"  # loads, computes something else
    onnx.save(proto, tmp_path / "cand.onnx")
    done = run("validate", str(tmp_path / "cand.onnx"), "--reference", str(ref))
    assert done.returncode == 1
    assert "FAILED" in done.stdout + done.stderr
