"""`infercc ci` interrupted (Ctrl-C) without Ray: exit 130, and the JSON, JUnit and Markdown
reports written for what finished (the others failed as cancelled), as `ci --help` promises
and as the `--ray` path does."""

from __future__ import annotations

import json
import os
import signal
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

import infercc.ci.runner as runner
from infercc.ci.results import ModelResult
from infercc.ci.runner import CANCELLED, CANCELLED_BENCH
from tests.inproc import run_main

ROOT = Path(__file__).resolve().parents[2]
CNN = (ROOT / "examples" / "small_cnn.onnx").as_posix()


@pytest.fixture(autouse=True)
def private_tuning_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "tuning-cache"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(autouse=True)
def default_sigint() -> Iterator[object]:
    """Python's own SIGINT handler for the test's duration, as an interactive `infercc ci`
    has it; the handler found is restored after and named in a failure. A test run started
    in the background (`cmd &` without job control) inherits SIGINT ignored, and Python then
    leaves it ignored: the real-SIGINT tests below ran to exit 0 there."""
    found = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield found
    finally:
        signal.signal(signal.SIGINT, found)


def _manifest(tmp_path: Path, budget: bool = False) -> Path:
    extra = "latency_budget_ms = 10000.0\n" if budget else ""
    models = "".join(
        f'[[models]]\nname = "{n}"\npath = "{CNN}"\nshapes = {{ image = "1x3x32x32" }}\n{extra}'
        for n in ("a", "b", "c")
    )
    path = tmp_path / "infercc.toml"
    path.write_text(f'[ci]\nout_dir = "out"\nwarmup = 1\niters = 2\n{models}')
    return path


def _reports(tmp_path: Path) -> list[str]:
    return [
        "--junit", str(tmp_path / "junit.xml"),
        "--json-report", str(tmp_path / "report.json"),
        "--markdown", str(tmp_path / "summary.md"),
    ]  # fmt: skip


def _built(child, spec) -> ModelResult:
    """A passed build without a child process (what is tested is the parent's handling)."""
    result = ModelResult(spec.name, str(spec.path), True, precision=spec.precision)
    result.output, result.stage = str(spec.output), "done"
    return result


def _check_reports(tmp_path: Path, passed: set[str], reason: str) -> None:
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["interrupted"] is True
    models = {m["name"]: m for m in data["models"]}
    assert {n for n, m in models.items() if m["passed"]} == passed
    for name in {"a", "b", "c"} - passed:
        assert models[name]["reason"] == reason
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    assert sorted(cases) == ["a", "b", "c"]
    for name, case in cases.items():
        failed = case.find("error") is not None or case.find("failure") is not None
        assert failed == (name not in passed)
    summary = (tmp_path / "summary.md").read_text()
    assert "| a | passed |" in summary and "| b | passed |" not in summary


def test_sigint_with_one_job_writes_the_reports(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    default_sigint: object,
) -> None:
    """The build of b runs in the main thread: a real SIGINT lands there."""

    def build(child, spec):
        if spec.name == "b":
            os.kill(os.getpid(), signal.SIGINT)
        return _built(child, spec)

    monkeypatch.setattr(runner, "_build_isolated", build)
    result = run_main(monkeypatch, capsys, "ci", str(_manifest(tmp_path)), *_reports(tmp_path))
    assert result.code == 130, f"SIGINT handler before the test: {default_sigint!r}\n{result.text}"
    assert "interrupted" in result.text
    _check_reports(tmp_path, {"a"}, CANCELLED)


def test_interrupt_with_jobs_writes_the_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--jobs 2: b's worker is interrupted once a has finished; c, running (a real build in
    a child, which the interrupt kills) or queued, is cancelled, never reported as a crash."""
    real = runner._build_isolated
    a_done = threading.Event()

    def build(child, spec):
        if spec.name == "a":
            result = _built(child, spec)
            a_done.set()
            return result
        if spec.name == "b":
            assert a_done.wait(120)
            raise KeyboardInterrupt  # reaches the main thread through b's future
        return real(child, spec)

    monkeypatch.setattr(runner, "_build_isolated", build)
    args = ["ci", str(_manifest(tmp_path)), "--jobs", "2", *_reports(tmp_path)]
    result = run_main(monkeypatch, capsys, *args)
    assert result.code == 130, result.text
    _check_reports(tmp_path, {"a"}, CANCELLED)


def test_sigint_during_the_benchmarks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    default_sigint: object,
) -> None:
    """Interrupted while b is timed: a keeps its latency, b and c are cancelled before (or
    during) their benchmark."""

    def bench(child, spec, output):
        if spec.name == "b":
            os.kill(os.getpid(), signal.SIGINT)
        return {"reason": None, "p50_ms": 1.5, "budget_ms": spec.latency_budget_ms}

    monkeypatch.setattr(runner, "_build_isolated", _built)
    monkeypatch.setattr(runner, "_bench_isolated", bench)
    args = ["ci", str(_manifest(tmp_path, budget=True)), "--jobs", "2", *_reports(tmp_path)]
    result = run_main(monkeypatch, capsys, *args)
    assert result.code == 130, f"SIGINT handler before the test: {default_sigint!r}\n{result.text}"
    _check_reports(tmp_path, {"a"}, CANCELLED_BENCH)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["models"][0]["latency"]["p50_ms"] == 1.5
