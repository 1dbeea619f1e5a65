"""The TensorRT backend on a real GPU (marked `gpu`: run with `pytest -m gpu` on a machine with
an NVIDIA GPU, the tensorrt package, and PyTorch with CUDA or cuda-python)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infercc.backends.trt.backend import TensorRTBackend

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"
RANGE = "image=1x3x32x32:4x3x32x32:8x3x32x32"

_ok, _why = TensorRTBackend().available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ok, reason=f"TensorRT unusable: {_why}")]


def _optimize(out: Path, cache: Path, **kwargs):
    from infercc.api import optimize
    from infercc.config import TrtOptions
    from infercc.data.profiles import parse_profiles

    kwargs.setdefault("target", "a100")
    options = {"workspace": "1GiB", **kwargs.pop("options", {})}
    return optimize(
        SMALL_CNN,
        out,
        backend="tensorrt",
        profiles=parse_profiles([RANGE]),
        cache_dir=cache,
        tensorrt=TrtOptions(**options),
        **kwargs,
    )


def test_fp32_engine_builds_validates_and_hits_the_engine_cache(tmp_path):
    first = _optimize(tmp_path / "a", tmp_path / "cache")
    section = first.artifact["backend"]
    assert first.passed and section["validation"]["passed"]
    assert section["engine_cache"] == "miss" and section["precision"]["layers"]
    second = _optimize(tmp_path / "b", tmp_path / "cache")
    assert second.artifact["backend"]["engine_cache"] == "hit"


def test_timing_cache_is_reused_on_rebuild(tmp_path):
    first = _optimize(tmp_path / "a", tmp_path / "cache", tune=False)
    assert first.artifact["backend"]["timing_cache"]["status"] == "miss"
    second = _optimize(tmp_path / "b", tmp_path / "cache", tune=False)
    assert second.artifact["backend"]["timing_cache"]["status"] == "hit"
    strict = _optimize(
        tmp_path / "c", tmp_path / "cache", tune=False, options={"timing_cache_strict": True}
    )
    assert strict.passed


def test_fp16_engine_runs_fp16_layers(tmp_path):
    report = _optimize(tmp_path / "a", tmp_path / "cache", fp16=True)
    layers = report.artifact["backend"]["precision"]["layers"]
    assert layers.get("fp16", 0) > 0 and report.artifact["backend"]["validation"]["passed"]


def test_bench_runs_the_engine(tmp_path):
    from infercc.runtime import bench

    _optimize(tmp_path / "a", tmp_path / "cache")
    report = bench.bench(tmp_path / "a", batches=[1, 8], iters=5, warmup=2)
    assert [r.batch for r in report.results] == [1, 8]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["backend"]["fingerprint"]["gpu"] != "unknown"
