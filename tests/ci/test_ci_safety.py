"""`infercc ci` and the processes and files it depends on: a model that crashes onnxruntime fails
alone at any `--jobs`, and the reports are still written; report paths that cannot be written
are refused before any model is built."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from infercc.ci import runner
from infercc.ci.runner import run_ci
from infercc.errors import InferccError

ROOT = Path(__file__).resolve().parents[2]
ENCODER = ROOT / "examples" / "tiny_encoder.onnx"

# Loaded by every Python process started with this folder on PYTHONPATH: onnxruntime dies of
# a segfault when asked to load a model whose file name starts with "boom", as it does on a
# model that hits a bug in its native code.
SITECUSTOMIZE = """
import os, signal
import onnxruntime

_Session = onnxruntime.InferenceSession


class _Crashing(_Session):
    def __init__(self, path_or_bytes, *args, **kwargs):
        path = path_or_bytes if isinstance(path_or_bytes, (str, os.PathLike)) else ""
        if os.path.basename(os.fspath(path)).startswith("boom"):
            os.kill(os.getpid(), signal.SIGSEGV)
        super().__init__(path_or_bytes, *args, **kwargs)


onnxruntime.InferenceSession = _Crashing
"""


@pytest.fixture(autouse=True)
def private_tuning_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "tuning-cache"))


def fleet(tmp_path: Path) -> Path:
    """Three healthy models and one that crashes onnxruntime (third of four)."""
    for name in ("a", "b", "boom", "c"):
        shutil.copy(ENCODER, tmp_path / f"{name}.onnx")
    entries = "".join(
        f'\n[[models]]\nname = "{n}"\npath = "{n}.onnx"\nbackend = "none"\n'
        for n in ("a", "b", "boom", "c")
    )
    path = tmp_path / "infercc.toml"
    path.write_text(entries)
    return path


def run_cli(*args: str, crash_hook: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env["COLUMNS"] = "200"
    if crash_hook is not None:
        crash_hook.mkdir(exist_ok=True)
        (crash_hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(crash_hook), env.get("PYTHONPATH")) if p
        )
    return subprocess.run(
        [sys.executable, "-m", "infercc", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_crashing_model_fails_alone_and_the_reports_are_written(
    tmp_path: Path, jobs: str
) -> None:
    manifest = fleet(tmp_path)
    junit, report = tmp_path / "reports" / "junit.xml", tmp_path / "reports" / "r.json"
    r = run_cli(
        "ci",
        str(manifest),
        "--jobs",
        jobs,
        "--out-dir",
        str(tmp_path / "out"),
        "--junit",
        str(junit),
        "--json-report",
        str(report),
        crash_hook=tmp_path / "hook",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(report.read_text())
    status = {m["name"]: (m["passed"], m["reason"]) for m in data["models"]}
    assert [n for n, (ok, _) in status.items() if ok] == ["a", "b", "c"], status
    assert "killed by SIGSEGV (signal 11" in status["boom"][1]
    failed = [
        c.get("name")
        for c in ET.parse(junit).getroot().iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    assert failed == ["boom"]  # a crash: JUnit's <error> (it could not be checked)


def test_the_hook_crashes_an_unisolated_process(tmp_path: Path) -> None:
    """The test above is not vacuous: the same model kills a plain optimize."""
    shutil.copy(ENCODER, tmp_path / "boom.onnx")
    r = run_cli(
        "optimize", str(tmp_path / "boom.onnx"), "-o", str(tmp_path / "o.onnx"),
        crash_hook=tmp_path / "hook",
    )  # fmt: skip
    assert r.returncode == -11, r.stderr


# --------------------------------------------------------------------------- report paths


@pytest.mark.parametrize("flag", ["--json-report", "--junit", "--markdown"])
def test_an_unwritable_report_path_is_refused_before_any_build(tmp_path: Path, flag: str) -> None:
    manifest = fleet(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    r = run_cli("ci", str(manifest), flag, str(tmp_path / "a-file" / "r.json"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is not a directory" in r.stderr and flag in r.stderr
    assert "internal error" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ci-out").exists() and not any(tmp_path.glob("**/model.onnx"))


def test_a_directory_as_report_path_is_refused_before_any_build(
    tmp_path: Path, monkeypatch
) -> None:
    def never(*_a, **_k):
        raise AssertionError("a model was built before the report paths were checked")

    monkeypatch.setattr(runner, "_run_all", never)
    manifest = fleet(tmp_path)
    (tmp_path / "r.json").mkdir()
    with pytest.raises(InferccError, match="is a directory"):
        run_ci(manifest, out_dir=tmp_path / "out", json_report=tmp_path / "r.json")
    with pytest.raises(InferccError, match="--junit"):
        run_ci(manifest, out_dir=tmp_path / "out", junit=tmp_path / "r.json")


def test_report_parents_are_created(tmp_path: Path) -> None:
    manifest = tmp_path / "infercc.toml"
    manifest.write_text(f'[[models]]\npath = "{ENCODER.as_posix()}"\nbackend = "none"\n')
    report = run_ci(
        manifest,
        out_dir=tmp_path / "out",
        json_report=tmp_path / "reports" / "deep" / "r.json",
        markdown=tmp_path / "reports" / "ci.md",
        step_summary=False,
    )
    assert report.passed
    assert json.loads((tmp_path / "reports" / "deep" / "r.json").read_text())["passed"]
    assert "tiny_encoder" in (tmp_path / "reports" / "ci.md").read_text()
