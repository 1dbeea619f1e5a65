"""`infercc ci` and the processes and files it depends on: a model that crashes onnxruntime fails
alone at any `--jobs`, and the reports are still written; report paths that cannot be written
are refused before any model is built.

The default run crashes one model beside one healthy one, with `infercc ci` in the test process
(its children are real processes, with the crash hook); the four-model fleet through
`python -m infercc` is marked slow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import onnxruntime as ort
import pytest

from infercc.ci import runner
from infercc.ci.runner import run_ci
from infercc.errors import InferccError
from tests import helpers

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


def fleet(tmp_path: Path, names: tuple[str, ...] = ("a", "b", "boom", "c")) -> Path:
    """Healthy models and one that crashes onnxruntime (by default three, the third of four)."""
    for name in names:
        shutil.copy(ENCODER, tmp_path / f"{name}.onnx")
    entries = "".join(
        f'\n[[models]]\nname = "{n}"\npath = "{n}.onnx"\nbackend = "none"\n' for n in names
    )
    path = tmp_path / "infercc.toml"
    path.write_text(entries)
    return path


def write_hook(where: Path) -> Path:
    where.mkdir(exist_ok=True)
    (where / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return where


def run_cli(*args: str, crash_hook: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env["COLUMNS"] = "200"
    if crash_hook is not None:
        write_hook(crash_hook)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(crash_hook), env.get("PYTHONPATH")) if p
        )
    return subprocess.run(
        [sys.executable, "-m", "infercc", *args], capture_output=True, text=True, env=env
    )


def assert_only_boom_failed(junit: Path, report: Path, healthy: list[str]) -> None:
    data = json.loads(report.read_text())
    status = {m["name"]: (m["passed"], m["reason"]) for m in data["models"]}
    assert [n for n, (ok, _) in status.items() if ok] == healthy, status
    assert "killed by SIGSEGV (signal 11" in status["boom"][1]
    failed = [
        c.get("name")
        for c in ET.parse(junit).getroot().iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    assert failed == ["boom"]  # a crash: JUnit's <error> (it could not be checked)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_one_crashing_model_fails_alone_and_the_reports_are_written(
    tmp_path: Path, monkeypatch, jobs: str
) -> None:
    """`infercc ci` in this process; its build children load the crash hook and the first model
    kills its child. At --jobs 1 the next model gets a fresh child; at --jobs 2 the other child
    builds alongside. This process must never load the model itself: here that is an error
    (in a process with the hook, as in the slow test below, it would be the crash)."""
    loaded_here: list[str] = []

    class RefusedHere(ort.InferenceSession):
        def __init__(self, path_or_bytes, *args, **kwargs):
            path = path_or_bytes if isinstance(path_or_bytes, (str, os.PathLike)) else ""
            if os.path.basename(os.fspath(path)).startswith("boom"):
                loaded_here.append(os.fspath(path))
                raise AssertionError("the ci driver loaded a model in its own process")
            super().__init__(path_or_bytes, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", RefusedHere)
    manifest = fleet(tmp_path, ("boom", "a"))
    hook = write_hook(tmp_path / "hook")
    junit, report = tmp_path / "reports" / "junit.xml", tmp_path / "reports" / "r.json"
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    r = helpers.run_cli(
        "ci", str(manifest), "--jobs", jobs, "--out-dir", str(tmp_path / "out"),
        "--junit", str(junit), "--json-report", str(report),
        env={"PYTHONPATH": pythonpath, "GITHUB_STEP_SUMMARY": None},
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert loaded_here == []
    assert_only_boom_failed(junit, report, ["a"])
    assert (tmp_path / "out" / "a.opt.onnx").is_file()
    assert not (tmp_path / "out" / "boom.opt.onnx").exists()


@pytest.mark.slow
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
    assert_only_boom_failed(junit, report, ["a", "b", "c"])


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
    r = helpers.run_cli(
        "ci", str(manifest), flag, str(tmp_path / "a-file" / "r.json"),
        env={"GITHUB_STEP_SUMMARY": None},
    )  # fmt: skip
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
