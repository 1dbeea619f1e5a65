"""The OpenVINO backend with the real `openvino` package (CPU plugin): artifacts, the precision
read back from the compiled model, validation of the artifact against the original, loading,
and every refusal. Tests whose verdict depends on the ISA assert the precision OpenVINO says
it ran, and are skipped (with the reason) on a CPU without that ISA."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from infercc.analysis.targets import host_cpu_info
from infercc.errors import InferccError
from tests.helpers import make_model, run_cli

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")

from infercc.backends.openvino import backend as ovb  # noqa: E402
from infercc.backends.openvino import engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"

_INFO, _CORES = host_cpu_info()
_ROW = _INFO.detected_row.name if _INFO.detected_row else "an unknown CPU row"
HOST_BF16 = any(f in _INFO.features for f in ("avx512_bf16", "amx_bf16"))
needs_bf16 = pytest.mark.skipif(
    not HOST_BF16,
    reason=f"this CPU ({_ROW}) has neither avx512_bf16 nor amx_bf16: "
    "a bf16 hint would silently run fp32",
)


def _int8_capable() -> bool:
    return "INT8" in engine.capabilities()


needs_int8 = pytest.mark.skipif(
    not _int8_capable(), reason="OpenVINO lists no INT8 capability on this CPU"
)


def ort_outputs(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def fp32_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ov") / "cnn"
    done = run_cli("optimize", str(SMALL_CNN), "-o", str(out), "--backend", "openvino")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def bf16_artifact(tmp_path_factory) -> Path:
    if not HOST_BF16:
        pytest.skip("no bf16 on this CPU")
    out = tmp_path_factory.mktemp("ov") / "cnn_bf16"
    done = run_cli("optimize", str(SMALL_CNN), "-o", str(out), "--bf16", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_an_fp32_artifact_holds_the_blob_and_says_what_ran(fp32_artifact: Path):
    names = {p.name for p in fp32_artifact.iterdir()}
    assert {"model.onnx", "manifest.json", "openvino.blob", "openvino_config.json"} <= names
    config = json.loads((fp32_artifact / "openvino_config.json").read_text())
    assert config["schema"] == "infercc.openvino_config/1"
    assert config["openvino"] == engine.full_version() and config["device"] == "CPU"
    detected = _INFO.detected_row
    assert config["cpu_class"] == (detected.name if detected else None)
    # the hint is stated (bf16 is OpenVINO's default on a bf16 CPU) and what ran is read back
    assert config["hint"] == "f32" and config["properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert config["precision_used"] == "fp32"
    assert config["layers"] == {"fp32": 4}  # 3 Convs and the Gemm of the CNN
    manifest = json.loads((fp32_artifact / "manifest.json").read_text())
    assert manifest["backend"]["name"] == "openvino"
    assert manifest["backend"]["precision_used"] == "fp32"
    assert manifest["artifact_validation"]["passed"] is True
    assert len(manifest["artifact_validation"]["validation"]["profiles"]) == 2


def test_the_openvino_model_has_no_onnxruntime_contrib_op(fp32_artifact: Path, tmp_path):
    ours = Counter(n.op_type for n in onnx.load(fp32_artifact / "model.onnx").graph.node)
    done = run_cli("optimize", str(SMALL_CNN), "-o", str(tmp_path / "ort"))
    assert done.returncode == 0, done.stderr
    theirs = Counter(n.op_type for n in onnx.load(tmp_path / "ort" / "model.onnx").graph.node)
    assert theirs["FusedConv"] == 2 and ours["FusedConv"] == 0
    assert ours["Conv"] == 3 and ours["BatchNormalization"] == 0
    onnx.checker.check_model(onnx.load(fp32_artifact / "model.onnx"), full_check=True)


@pytest.mark.parametrize("batch", [1, 5])
def test_the_runner_computes_what_onnxruntime_does_at_two_batches(fp32_artifact, batch):
    from infercc.runtime.registry import load_runner

    runner = load_runner(fp32_artifact)
    assert runner.source == "blob" and runner.precision_used == "fp32"
    feeds = {"image": np.random.default_rng(batch).random((batch, 3, 32, 32), np.float32)}
    (got,) = runner.run(feeds)
    (want,) = ort_outputs(SMALL_CNN, feeds)
    assert got.shape == (batch, 10)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_a_blob_of_another_host_is_not_loaded(fp32_artifact: Path, tmp_path):
    copy = tmp_path / "moved"
    shutil.copytree(fp32_artifact, copy)
    config = json.loads((copy / "openvino_config.json").read_text())
    config["fingerprint"] = "0123456789abcdef"
    (copy / "openvino_config.json").write_text(json.dumps(config))
    runner = ovb.OpenVinoRunner.from_artifact(copy, copy / "model.onnx")
    assert runner.source == "model" and runner.precision_used == "fp32"
    feeds = {"image": np.ones((2, 3, 32, 32), np.float32)}
    np.testing.assert_allclose(runner.run(feeds)[0], ort_outputs(SMALL_CNN, feeds)[0], atol=1e-4)


def test_validate_and_bench_run_the_artifact_through_its_runner(fp32_artifact: Path):
    done = run_cli("validate", str(fp32_artifact), "--reference", str(SMALL_CNN), "--json")
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["passed"] is True
    done = run_cli("bench", str(fp32_artifact), "--batch", "1,2", "--iters", "3", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "openvino" in done.stdout


@needs_bf16
def test_a_bf16_artifact_ran_bf16_and_was_validated_by_the_bf16_criterion(bf16_artifact):
    config = json.loads((bf16_artifact / "openvino_config.json").read_text())
    assert config["precision"] == "bf16" and config["hint_used"] == "bf16"
    assert config["precision_used"] == "bf16" and config["layers"].get("bf16", 0) == 4
    manifest = json.loads((bf16_artifact / "manifest.json").read_text())
    checked = manifest["artifact_validation"]
    assert checked["precision"] == "bf16" and checked["passed"] is True
    assert checked["validation"]["min_cosine"] == 0.999
    # the artifact differs from fp32 by bf16 rounding: not bit-equal, but close
    from infercc.runtime.registry import load_runner

    feeds = {"image": np.random.default_rng(0).random((3, 3, 32, 32), np.float32)}
    got = load_runner(bf16_artifact).run(feeds)[0]
    want = ort_outputs(SMALL_CNN, feeds)[0]
    assert not np.array_equal(got, want) and cosine(got, want) > 0.999


@needs_bf16
def test_bf16_is_the_default_backend_s_precision_on_a_cpu_target(bf16_artifact):
    manifest = json.loads((bf16_artifact / "manifest.json").read_text())
    assert manifest["build"]["backend"] == "openvino" and manifest["precision"] == "bf16"


def cancelling_model(path: Path) -> Path:
    """y = x @ W - x @ (W + 1e-3 R): exact in fp32, lost to bf16's 8-bit mantissa."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    w2 = (w + 1e-3 * rng.standard_normal((64, 64))).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"]),
            helper.make_node("MatMul", ["x", "w2"], ["b"]),
            helper.make_node("Sub", ["a", "b"], ["y"]),
        ],
        "cancel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    onnx.save(make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_bf16
def test_a_bf16_build_that_misses_the_criterion_is_refused_naming_the_output(tmp_path):
    model = cancelling_model(tmp_path / "cancel.onnx")
    out = tmp_path / "out"
    done = run_cli("optimize", str(model), "-o", str(out), "--bf16")
    assert done.returncode == 1, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "openvino bf16 artifact failed validation" in line and "'y'" in line
    assert "drop --bf16" in line
    assert not out.exists()
    # the same model builds fp32 on OpenVINO
    assert run_cli("optimize", str(model), "-o", str(out), "--backend", "openvino").returncode == 0


# --------------------------------------------------------------------------- int8


@pytest.fixture(scope="module")
def qdq_model(tmp_path_factory) -> Path:
    from infercc.calib.calibrate import calibrate

    work = tmp_path_factory.mktemp("qdq")
    samples = work / "data"
    samples.mkdir()
    rng = np.random.default_rng(0)
    np.save(samples / "image.npy", rng.random((8, 3, 32, 32), np.float32))
    calibrate(SMALL_CNN, samples, work / "int8", speed_check=False)
    return work / "int8" / "model_int8.onnx"


@needs_int8
def test_the_qdq_model_runs_int8_kernels_on_openvino(qdq_model: Path, tmp_path):
    out = tmp_path / "ov8"
    done = run_cli(
        "optimize", str(qdq_model), "-o", str(out), "--int8", "--backend", "openvino",
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    config = json.loads((out / "openvino_config.json").read_text())
    assert config["precision_used"] == "int8" and config["layers"].get("int8", 0) >= 3
    hints = [c["hint"] for c in config["candidates"]]
    assert hints == (["f32", "bf16"] if HOST_BF16 else ["f32"])
    assert all(c["skipped"] is None for c in config["candidates"])
    assert json.loads((out / "manifest.json").read_text())["artifact_validation"]["passed"]


@needs_bf16
@needs_int8
def test_a_warm_int8_build_reuses_the_race_s_choice(qdq_model: Path, tmp_path):
    cache = tmp_path / "cache"
    args = [
        "optimize",
        str(qdq_model),
        "--int8",
        "--backend",
        "openvino",
        "--cache-dir",
        str(cache),
    ]
    assert run_cli(*args, "-o", str(tmp_path / "a")).returncode == 0
    assert run_cli(*args, "-o", str(tmp_path / "b")).returncode == 0
    cold = json.loads((tmp_path / "a" / "openvino_config.json").read_text())
    warm = json.loads((tmp_path / "b" / "openvino_config.json").read_text())
    assert cold["cache"] == "miss" and len(cold["candidates"]) == 2
    assert warm["cache"] == "hit" and [c["hint"] for c in warm["candidates"]] == [cold["hint"]]


# --------------------------------------------------------------------------- refusals


def refused(done, *words: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    text = " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in text, text
    return text


def test_bf16_on_a_cpu_row_without_it_names_the_isa_and_the_rows_that_have_it(tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        "optimize", str(SMALL_CNN), "-o", str(out), "--bf16", "--target", "x86-avx512-vnni"
    )
    refused(done, "--bf16 has no effect on the x86-avx512-vnni target", "x86-amx, x86-avx512-bf16")
    assert not out.exists()


def test_bf16_with_the_ort_backend_is_refused(tmp_path):
    out = tmp_path / "out"
    done = run_cli("optimize", str(SMALL_CNN), "-o", str(out), "--bf16", "--backend", "ort")
    refused(done, "--bf16 needs --backend openvino", "no bfloat16 kernels")
    assert not out.exists()


def test_bf16_on_a_host_without_it_is_refused(monkeypatch, tmp_path):
    from dataclasses import replace

    from infercc.analysis import targets

    info, cores = targets.host_cpu_info()
    plain = replace(info, features=tuple(f for f in info.features if "bf16" not in f))
    monkeypatch.setattr(targets, "host_cpu_info", lambda: (plain, cores))
    done = run_cli(
        "optimize", str(SMALL_CNN), "-o", str(tmp_path / "o"), "--bf16", "--target", "x86-amx"
    )
    refused(done, "needs this CPU to have bfloat16", "x86-amx, x86-avx512-bf16")


def test_openvino_missing_gives_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "ov", None)
    out = tmp_path / "out"
    assert ovb.OpenVinoBackend().available() == (
        False,
        'the openvino package is not installed (pip install "infercc[openvino]")',
    )
    done = run_cli("optimize", str(SMALL_CNN), "-o", str(out), "--backend", "openvino")
    refused(done, "backend 'openvino' cannot run here", 'pip install "infercc[openvino]"')
    assert not out.exists()


def custom_op_model(path: Path) -> Path:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Foo", ["r"], ["y"], domain="my.ops"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)]
    onnx.save(make_model(graph, opset_imports=ops), path)
    return path


def test_an_op_openvino_cannot_read_is_named(tmp_path):
    model = custom_op_model(tmp_path / "custom.onnx")
    out = tmp_path / "out"
    done = run_cli("optimize", str(model), "-o", str(out), "--backend", "openvino")
    refused(done, "OpenVINO", "cannot read", "no conversion for op my.ops.Foo", "--backend ort")
    assert not out.exists()


def test_unreadable_ops_are_parsed_from_both_forms_of_openvino_s_message():
    message = (
        "Model wasn't fully converted. Failed operations detailed log:\n"
        "-- com.microsoft.MatMulIntegerToFloat with a message:\nWhile validating...\n"
        "Summary:\n-- No conversion rule found for operations: my.ops.Foo, ai.onnx.ml.Bar\n"
    )
    assert engine.unreadable_ops(message) == [
        "my.ops.Foo",
        "ai.onnx.ml.Bar",
        "com.microsoft.MatMulIntegerToFloat",
    ]
    error = engine.read_refusal("m.onnx", RuntimeError(message))
    assert isinstance(error, InferccError) and "fuse-int8-matmul" in str(error.hint)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--backend", "openvino", "--fp16"], ["--fp16 has no effect on --backend openvino"]),
        (["--backend", "openvino", "--target", "a100"], ["needs a CPU --target"]),
        (["--backend", "openvino", "--no-tune"], ["--no-tune has no effect on an openvino fp32"]),
        (
            ["--backend", "openvino", "--portable"],
            ["--portable has no effect with backend openvino"],
        ),
    ],
)
def test_openvino_flags_without_effect_are_refused(tmp_path, args, words):
    out = tmp_path / "out"
    refused(run_cli("optimize", str(SMALL_CNN), "-o", str(out), *args), *words)
    assert not out.exists()


def test_the_rows_name_their_fastest_build():
    from infercc.analysis.cpu_classes import BY_NAME

    assert BY_NAME["x86-avx512-bf16"].fastest[0] == ("openvino", "int8")
    assert BY_NAME["x86-amx"].has_bf16 and not BY_NAME["x86-avx512-vnni"].has_bf16
    assert BY_NAME["x86-avx2"].default_backend == "ort"
    assert all(b == "ort" for b, _ in BY_NAME["arm64-neon"].fastest)


# --------------------------------------------------------------------------- --backend auto


def test_auto_races_the_row_s_backends_and_a_warm_build_races_nothing(tmp_path, monkeypatch):
    from infercc.runtime import race

    cache, out = tmp_path / "cache", tmp_path / "auto"
    args = ["optimize", str(SMALL_CNN), "-o", str(out), "--backend", "auto"]
    done = run_cli(*args, "--cache-dir", str(cache), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    cold = json.loads((out / "manifest.json").read_text())["race"]
    assert cold["cache"] == "miss" and cold["precision"] == "fp32"
    timed = {c["backend"]: c["median_ms"] for c in cold["candidates"]}
    assert set(timed) == {"ort", "openvino"} and all(ms > 0 for ms in timed.values())
    assert cold["chosen"] == min(timed, key=timed.get)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"]["name"] == cold["chosen"]
    assert not [p for p in tmp_path.iterdir() if ".race-" in p.name]  # nothing left behind
    assert json.loads(done.stdout)["artifact"]["race"]["chosen"] == cold["chosen"]

    def no_race(*a, **k):
        raise AssertionError("a warm build timed the artifacts")

    monkeypatch.setattr(race, "time_artifacts", no_race)
    done = run_cli(*args, "--cache-dir", str(cache))
    assert done.returncode == 0, done.stdout + done.stderr
    warm = json.loads((out / "manifest.json").read_text())["race"]
    assert warm["cache"] == "hit" and warm["chosen"] == cold["chosen"]
    assert f"auto: {cold['chosen']} (hit" in done.stdout


def test_auto_builds_another_row_s_default_without_racing(tmp_path):
    out = tmp_path / "auto"
    done = run_cli(
        "optimize", str(SMALL_CNN), "-o", str(out), "--backend", "auto",
        "--target", "x86-avx512-vnni",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((out / "manifest.json").read_text())["race"]
    assert record["cache"] == "not raced" and record["chosen"] == "ort"
    assert record["why"] == "x86-avx512-vnni is not this host"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--target", "a100"], ["--backend auto needs a CPU --target"]),
        (["--fp16"], ["--backend auto has no backend for a fp16 build"]),
    ],
)
def test_auto_refusals(tmp_path, args, words):
    out = tmp_path / "out"
    refused(run_cli("optimize", str(SMALL_CNN), "-o", str(out), "--backend", "auto", *args), *words)
    assert not out.exists()
