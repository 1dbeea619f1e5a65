"""The TensorRT build flow end to end against the recording stand-in for `tensorrt`
(tests/backends/test_tensorrt_fake.py): flags, profiles, timing and engine caches, the
artifact files, loading with fingerprint checks, running, the API, bench and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infercc.analysis.targets import get_target
from infercc.backends.trt import backend as trt_backend
from infercc.backends.trt import build
from infercc.backends.trt.calib_cache import write_calibration_cache
from infercc.backends.trt.fingerprint import Fingerprint
from infercc.check.compare import run_model
from infercc.config import TrtOptions
from infercc.data.feeds import make_inputs
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.ir.wire import read_model
from infercc.runtime.artifact import Artifact
from infercc.runtime.backend import CompileOptions
from infercc.runtime.tuning import TuningCache
from tests.backends.test_tensorrt_fake import A100, FakeTrt, HostDevice

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"
RANGE = ShapeProfile("image", (1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))


@pytest.fixture
def art(tmp_path: Path) -> Path:
    out = tmp_path / "stage"
    out.mkdir()
    shutil.copy(SMALL_CNN, out / "model.onnx")
    return out


def hooks(trt: FakeTrt, fingerprint: Fingerprint = A100) -> build.Hooks:
    return build.Hooks(
        fingerprint=lambda _trt: fingerprint,
        loader=lambda path: trt.calls.append(("load_library", path)),
        device=HostDevice(trt.memory),
    )


def compile_(trt, out, cache=None, shapes=(RANGE,), target="a100", graph="fp32", **extra):
    precision = extra.pop("precision", graph)
    cache_dir = extra.pop("cache_dir", None)
    options = CompileOptions(precision=precision, cache_dir=cache_dir, tensorrt=TrtOptions(**extra))
    return build.compile_artifact(
        trt, out / "model.onnx", get_target(target), list(shapes), options, cache, out, hooks(trt)
    )


def test_build_records_flags_profiles_and_timing_cache(art, tmp_path):
    trt = FakeTrt("10.3.0")
    section = compile_(
        trt,
        art,
        cache_dir=str(tmp_path / "cache"),
        graph="fp16",
        opt_level=4,
        workspace="1GiB",
        hw_compat="ampere+",
        version_compatible=True,
    )
    assert trt.names("set_flag") == ["BuilderFlag.VERSION_COMPATIBLE", "BuilderFlag.FP16"]
    assert trt.names("set_memory_pool_limit") == [("MemoryPoolType.WORKSPACE", 2**30)]
    assert trt.names("builder_optimization_level") == [4]
    assert [repr(v) for v in trt.names("hardware_compatibility_level")] == [
        "HardwareCompatibilityLevel.AMPERE_PLUS"
    ]
    assert [repr(v) for v in trt.names("profiling_verbosity")] == ["ProfilingVerbosity.DETAILED"]
    assert trt.names("set_shape") == [("image", (1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))]
    assert trt.names("create_network") == [0]
    assert trt.names("parse_from_file") == [str(art / "model.onnx")]
    assert trt.names("create_timing_cache") == [b""]
    assert section["timing_cache"]["status"] == "miss"
    assert section["precision"]["layers"] == {"fp16": 3}
    assert section["engine_cache"] == "off"
    assert section["validation"]["passed"] and section["validation"]["samples"] == 1
    config = json.loads((art / build.CONFIG_FILE).read_text())
    assert config["fingerprint"] == A100.to_dict()
    assert config["profiles"] == [
        {"image": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}}
    ]
    assert (art / build.PLAN_FILE).read_bytes().startswith(b"FAKEPLAN")
    # The timing cache was saved, and a rebuild (no engine cache) starts from it.
    saved = Path(section["timing_cache"]["path"])
    assert saved.read_bytes() == b"TIMING1"
    again = FakeTrt("10.3.0")
    second = compile_(again, art, cache_dir=str(tmp_path / "cache"), graph="fp16")
    assert again.names("create_timing_cache") == [b"TIMING1"]
    assert second["timing_cache"]["status"] == "hit"
    assert saved.read_bytes() == b"TIMING2"


def test_timing_cache_strict_fails_before_building(art, tmp_path):
    trt = FakeTrt()
    with pytest.raises(InferccError, match="--timing-cache-strict: no timing cache"):
        compile_(trt, art, cache_dir=str(tmp_path / "c"), timing_cache_strict=True)
    assert trt.names("build_serialized_network") == []


def test_second_identical_build_is_an_engine_cache_hit(art, tmp_path):
    with TuningCache(tmp_path / "cache") as cache:
        first = compile_(FakeTrt(), art, cache)
        trt = FakeTrt()
        second = compile_(trt, art, cache)
        other = compile_(FakeTrt(), art, cache, opt_level=1)
    assert (first["engine_cache"], second["engine_cache"], other["engine_cache"]) == (
        "miss",
        "hit",
        "miss",
    )
    assert trt.names("Builder") == [] and trt.names("build_serialized_network") == []
    assert second["precision"]["layers"] == first["precision"]["layers"]
    assert second["validation"]["passed"]  # the cached engine is still validated
    assert len(list((tmp_path / "cache" / "trt" / "engines").glob("*.plan"))) == 2


def test_tensorrt_11_sets_no_precision_flags_and_refuses_an_fp32_graph_for_fp16(art, tmp_path):
    trt = FakeTrt("11.0.0")
    with pytest.raises(InferccError, match="takes precision from the graph only"):
        compile_(trt, art, cache_dir=str(tmp_path), graph="fp16")
    assert trt.names("build_serialized_network") == []
    section = compile_(trt, art, cache_dir=str(tmp_path))
    assert trt.names("set_flag") == [] and section["precision"]["builder_flags"] == []
    # TensorRT 11's inspector JSON (split "Format"/"DataType") is read too.
    assert section["precision"]["layers"] == {"fp32": 3}


def test_fp16_engine_without_fp16_layers_is_an_error(art, tmp_path):
    trt = FakeTrt("10.3.0")
    trt.force_layer_type = "Row major linear FP32"
    with pytest.raises(InferccError, match="no layer of the built engine runs in fp16"):
        compile_(trt, art, cache_dir=str(tmp_path), graph="fp16")


def test_int8_on_tensorrt_10_reads_the_calibration_cache(art, tmp_path):
    cache_file = tmp_path / "calib.cache"
    write_calibration_cache(cache_file, {"image": 0.02}, "entropy", "10.3.0")
    trt = FakeTrt("10.3.0")
    trt.force_layer_type = "Int8"
    section = compile_(
        trt,
        art,
        cache_dir=str(tmp_path),
        precision="int8",
        calib_cache=str(cache_file),
    )
    calibrator = trt.names("int8_calibrator")[0]
    assert calibrator.read_calibration_cache() == cache_file.read_bytes()
    assert trt.names("set_flag") == ["BuilderFlag.INT8"]
    assert trt.names("set_calibration_profile") == [0]
    assert section["builder_options"]["calib_cache"]["path"] == str(cache_file)
    assert section["precision"]["requested"] == "int8"


def test_parse_failure_names_nodes_and_suggests_ort(art, tmp_path):
    trt = FakeTrt(unsupported=("GlobalAveragePool",))
    with pytest.raises(InferccError) as err:
        compile_(trt, art, cache_dir=str(tmp_path))
    assert "at op(s) GlobalAveragePool" in err.value.message
    assert "No importer registered for op: GlobalAveragePool" in err.value.message
    assert "--backend ort" in err.value.hint


def test_plugins_are_loaded_before_parsing_and_recorded(art, tmp_path):
    lib = tmp_path / "libmyplugin.so"
    lib.write_bytes(b"\x7fELF")
    trt = FakeTrt()
    section = compile_(trt, art, cache_dir=str(tmp_path), plugins=[str(lib)])
    kinds = [k for k, _ in trt.calls]
    assert kinds.index("load_library") < kinds.index("init_libnvinfer_plugins")
    assert kinds.index("init_libnvinfer_plugins") < kinds.index("parse_from_file")
    assert section["builder_options"]["plugins"][0]["path"] == str(lib)


def test_other_gpu_than_target_warns_records_and_strict_refuses(art, tmp_path, caplog):
    h100 = Fingerprint("10.3.0", "12.4", "550.54.15", "NVIDIA H100 80GB HBM3", "9.0")
    trt = FakeTrt()
    options = CompileOptions(cache_dir=str(tmp_path))
    section = build.compile_artifact(
        trt, art / "model.onnx", get_target("a100"), [RANGE], options, None, art, hooks(trt, h100)
    )
    assert "engines are not portable" in caplog.text
    record = section["portability"]
    assert record["target"] == {"name": "a100", "compute_capability": "8.0"}
    assert record["built_on"]["gpu"] == "NVIDIA H100 80GB HBM3" and not record["matches_target"]
    options.tensorrt = TrtOptions(strict_target=True)
    with pytest.raises(InferccError, match="--strict-target: the GPU here is NVIDIA H100"):
        build.compile_artifact(
            trt,
            art / "model.onnx",
            get_target("a100"),
            [RANGE],
            options,
            None,
            art,
            hooks(trt, h100),
        )


def test_load_checks_fingerprint_and_runs_with_profile_selection(art, tmp_path):
    trt = FakeTrt()
    compile_(trt, art, cache_dir=str(tmp_path), profiles=["image=16x3x32x32"])
    config = json.loads((art / build.CONFIG_FILE).read_text())
    assert len(config["profiles"]) == 2
    trt.calls.clear()
    runner = build.open_engine(trt, art, hooks(trt))
    proto = read_model(art / "model.onnx")[0]
    for batch, profile in ((16, 1), (2, 0)):
        feeds = make_inputs(proto, {"image": (batch, 3, 32, 32)}, seed=batch)
        got = runner.run(feeds)
        want = run_model(art / "model.onnx", [feeds])[0]
        np.testing.assert_allclose(got[0], want[runner.output_names[0]], rtol=1e-5)
        assert runner.select(feeds) == profile
    assert trt.names("set_optimization_profile_async") == [1, 0]
    with pytest.raises(InferccError, match="outside every optimization profile"):
        runner.run(make_inputs(proto, {"image": (12, 3, 32, 32)}))
    newer = Fingerprint("10.4.0", "12.4", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
    with pytest.raises(InferccError, match="TensorRT 10.3.0 at build, 10.4.0 here"):
        build.open_engine(trt, art, hooks(trt, newer))


def test_version_compatible_engine_loads_on_a_newer_tensorrt(art, tmp_path):
    trt = FakeTrt()
    compile_(trt, art, cache_dir=str(tmp_path), version_compatible=True)
    newer = Fingerprint("10.4.0", "12.4", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
    assert build.open_engine(trt, art, hooks(trt, newer)).input_names == ["image"]
    trt11 = Fingerprint("11.0.0", "12.4", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
    assert build.open_engine(trt, art, hooks(trt, trt11)).input_names == ["image"]
    # A version-compatible plan carries a lean runtime: TensorRT deserializes it only with
    # engine_host_code_allowed, which the builder's inspection and the runner both set.
    runtime = trt.Runtime(None)
    assert runtime.deserialize_cuda_engine((art / build.PLAN_FILE).read_bytes()) is None
    runtime.engine_host_code_allowed = True
    assert runtime.deserialize_cuda_engine((art / build.PLAN_FILE).read_bytes()) is not None


def test_api_optimize_and_bench_on_a_tensorrt_artifact(tmp_path, monkeypatch):
    """The whole path through infercc.optimize and infercc bench, with the stand-in at the
    GPU boundary: the tensorrt import, available(), and the device probe/allocator."""
    from infercc.api import optimize
    from infercc.runtime import bench

    trt = FakeTrt()
    monkeypatch.setattr(trt_backend, "_tensorrt", lambda: trt)
    monkeypatch.setattr(trt_backend.TensorRTBackend, "available", lambda self: (True, ""))
    boundary = hooks(trt)
    monkeypatch.setattr(build, "Hooks", lambda: boundary)
    out = tmp_path / "art"
    report = optimize(
        SMALL_CNN,
        out,
        target="a100",
        profiles=[RANGE],
        cache_dir=tmp_path / "cache",
        tensorrt=TrtOptions(opt_level=2),
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"]["name"] == "tensorrt"
    assert manifest["backend"]["fingerprint"]["gpu"] == "NVIDIA A100-SXM4-80GB"
    assert manifest["backend"]["builder_options"]["opt_level"] == 2
    assert sorted(p.name for p in out.iterdir()) == [
        "engine.plan",
        "manifest.json",
        "memory_plan.json",
        "model.onnx",
        "tensorrt.json",
    ]
    assert report.artifact["backend"]["engine_cache"] == "miss"
    runner = trt_backend.TensorRTBackend().load(Artifact(out, manifest))
    assert runner.output_names == ["logits"]
    result = bench.bench(out, batches=[1, 8], iters=2, warmup=1)
    assert [r.batch for r in result.results] == [1, 8]
    assert trt.names("execute_async_v3")  # bench ran the engine, not onnxruntime


def test_cli_optimize_tensorrt_exits_2_with_the_reason_here(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "infercc",
        "optimize",
        str(SMALL_CNN),
        "-o",
        str(tmp_path / "a"),
        "--backend",
        "tensorrt",
        "--workspace",
        "4GiB",
        "--opt-level",
        "3",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "backend 'tensorrt' cannot run here" in lines[0]
    assert not (tmp_path / "a").exists()


def test_cli_refuses_tensorrt_precisions_on_ort(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "infercc",
        "optimize",
        str(SMALL_CNN),
        "-o",
        str(tmp_path / "a"),
        "--backend",
        "ort",
        "--bf16",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--bf16 needs --backend openvino on a CPU target" in r.stderr
