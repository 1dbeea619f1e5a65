"""Artifact directories end to end: build, manifest, cache hits, loading, plug-in backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from infercc import api
from infercc.config import OrtOptions
from infercc.data.profiles import parse_profiles
from infercc.errors import InferccError
from infercc.runtime.artifact import open_artifact
from infercc.runtime.registry import load_runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENCODER = EXAMPLES / "tiny_encoder.onnx"
PROFILE = ["hidden_states=1x8x64:2x16x64:4x32x64"]


def build(out: Path, cache: Path, **kw) -> api.OptimizeReport:
    return api.optimize(ENCODER, out, profiles=parse_profiles(PROFILE), cache_dir=cache, **kw)


def test_artifact_layout_and_manifest(tmp_path):
    report = build(tmp_path / "art", tmp_path / "cache")
    assert report.passed
    names = sorted(p.name for p in (tmp_path / "art").iterdir())
    assert names == [
        "manifest.json",
        "memory_plan.json",
        "model.onnx",
        "ort_config.json",
    ]
    m = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert m["schema"] == "infercc.manifest/1" and m["backend"]["name"] == "ort"
    assert m["backend"]["version"] == ort.__version__
    assert len(m["source"]["sha256"]) == 64 and m["target"]["name"] == "cpu"
    assert m["shape_profiles"] == [
        {"name": "hidden_states", "min": [1, 8, 64], "opt": [2, 16, 64], "max": [4, 32, 64]}
    ]
    assert [p["name"] for p in m["tuning"]] == ["min", "opt", "max"]
    assert m["validation"]["passed"] is True and "fuse-qkv" in m["passes"]
    assert m["memory"]["shape_profile"] == {"hidden_states": [2, 16, 64]}  # the opt shape
    assert m["host"]["onnxruntime"] == ort.__version__ and m["host"]["cores"] >= 1
    # nothing left beside the artifact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "cache"]


def test_second_build_hits_the_cache(tmp_path):
    first = build(tmp_path / "a", tmp_path / "cache")
    second = build(tmp_path / "b", tmp_path / "cache")
    assert [p["cache"] for p in first.artifact["backend"]["points"]] == ["miss"] * 3
    assert [p["cache"] for p in second.artifact["backend"]["points"]] == ["hit"] * 3
    other = api.optimize(
        ENCODER,
        tmp_path / "c",
        cache_dir=tmp_path / "cache",
        profiles=parse_profiles(["hidden_states=3x5x64"]),
    )
    assert [p["cache"] for p in other.artifact["backend"]["points"]] == ["miss"]


def test_loaded_artifact_matches_onnxruntime(tmp_path):
    build(tmp_path / "art", tmp_path / "cache", tune=False, ort=OrtOptions(optimized_model=True))
    assert (tmp_path / "art" / "ort_optimized.onnx").is_file()
    runner = load_runner(tmp_path / "art")
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    expected = ort.InferenceSession(str(ENCODER)).run(None, {"hidden_states": x})
    got = runner.run({"hidden_states": x})
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5, rtol=1e-4)


def test_rebuild_replaces_an_artifact_but_not_other_directories(tmp_path):
    build(tmp_path / "art", tmp_path / "cache", tune=False)
    build(tmp_path / "art", tmp_path / "cache", tune=False)  # replacing an artifact is fine
    assert open_artifact(tmp_path / "art").backend == "ort"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InferccError, match="not an infercc artifact"):
        build(tmp_path / "mine", tmp_path / "cache")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_none_backend_and_bad_manifest(tmp_path):
    report = api.optimize(ENCODER, tmp_path / "plain", backend="none")
    assert report.artifact["backend"]["name"] == "none"
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == [
        "manifest.json",
        "memory_plan.json",
        "model.onnx",
    ]
    (tmp_path / "plain" / "manifest.json").write_text("{}")
    with pytest.raises(InferccError, match="is not of schema"):
        open_artifact(tmp_path / "plain")


PLUGIN = """
from infercc.backends.none import NoneBackend

class EchoBackend(NoneBackend):
    name = "echo"

    def compile(self, model, target, shapes, options, cache, out_dir):
        (out_dir / "echo.txt").write_text("built by echo")
        return {"name": self.name, "version": "9.9", "files": ["echo.txt"], "points": []}
"""


def test_entry_point_backend_from_a_package(tmp_path):
    """A package that declares an `infercc.backends` entry point is found and used."""
    site = tmp_path / "site"
    (site / "echo_backend").mkdir(parents=True)
    (site / "echo_backend" / "__init__.py").write_text(PLUGIN)
    dist = site / "echo_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[infercc.backends]\necho = echo_backend:EchoBackend\n")
    script = textwrap.dedent(f"""
        import json
        from infercc import api
        from infercc.backends import backend_names
        report = api.optimize({str(ENCODER)!r}, {str(tmp_path / "art")!r}, backend="echo")
        print(json.dumps({{"names": backend_names(), "backend": report.artifact["backend"]}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "echo" in out["names"] and out["backend"]["version"] == "9.9"
    assert (tmp_path / "art" / "echo.txt").read_text() == "built by echo"


def test_compare_turns_spinning_off_for_artifact_runners(tmp_path):
    from infercc.backends.ort import session_options
    from infercc.runtime.bench import open_runner

    build(tmp_path / "art", tmp_path / "cache", tune=False)
    assert open_runner(tmp_path / "art")[0].spinning is True
    runner, _ = open_runner(tmp_path / "art", spinning=False)
    assert runner.spinning is False
    x = np.zeros((2, 16, 64), np.float32)
    runner.run({"hidden_states": x})  # the session is created with the entries below
    opts, _ = session_options({"session_config": {"session.intra_op.allow_spinning": "0"}})
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
