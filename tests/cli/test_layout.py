"""The CLI package: one module per command, registered in --help order, sharing one progress
display, one report tail and the tolerance options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from infercc.cli import app, main
from infercc.cli.common import Progress, finish
from tests.helpers import run_cli

ENCODER = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"


def test_app_and_main_are_importable_and_commands_in_order() -> None:
    assert callable(main)
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert names == ["optimize", "extract", "inspect", "passes", "targets", "bench"] + [
        "calibrate",
        "validate",
        "ci",
    ]
    assert [g.name for g in app.registered_groups] == ["cache"]


def test_quiet_progress_does_nothing(capsys) -> None:
    with Progress(quiet=True) as progress:
        progress.step("loading")
        progress.tick(1, 2)
        progress.event("model", "passed")
    assert progress.progress is None
    assert capsys.readouterr() == ("", "")


class _Report:
    def __init__(self, passed: bool):
        self.passed = passed

    def to_dict(self) -> dict:
        return {"passed": self.passed}


def test_finish_prints_json_or_renders_and_exits_1_on_failure(capsys) -> None:
    finish(_Report(True), True, lambda r, c: c.print("table"))
    assert json.loads(capsys.readouterr().out) == {"passed": True}
    with pytest.raises(typer.Exit) as exc:
        finish(_Report(False), False, lambda r, c: c.print("table"))
    assert exc.value.exit_code == 1 and "table" in capsys.readouterr().out


def test_optimize_takes_per_output_tolerances(tmp_path: Path) -> None:
    r = run_cli(
        "optimize", str(ENCODER), "-o", str(tmp_path / "o.onnx"),
        "--tol", "output=1e-3:1e-2", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["validation"]["tolerances"] == {"output": {"atol": 1e-3, "rtol": 1e-2}}
    assert report["build"]["tolerances"] == {"output": [1e-3, 1e-2]}


def test_a_step_after_ticks_is_a_spinner_again() -> None:
    """calibrate ticks 13 samples, then races: the race's line is not left at 0/13."""
    from rich.progress import Progress as RichProgress

    progress = Progress(quiet=True)
    progress.progress = RichProgress()
    progress.step("collecting")
    progress.tick(5, 13)
    assert [(t.description, t.completed, t.total) for t in progress.progress.tasks] == [
        ("collecting", 5, 13)
    ]
    progress.step("racing int8 against fp32")
    assert [(t.description, t.completed, t.total) for t in progress.progress.tasks] == [
        ("racing int8 against fp32", 0, None)
    ]
