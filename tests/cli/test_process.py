"""What only a process shows: the exit status of the `infercc` console script and of
`python -m infercc`, and that the in-process runner every other CLI test uses
(`tests.helpers.run_cli`) gives what a real process gives — the same exit status, the same
stdout, the same stderr — so a test through it proves what a user's shell would see.

The closed-stdout case (`| head -0`) is tests/cli/test_first_contact.py's
`test_a_closed_pipe_is_not_a_failure`; a killed run's staging is test_api_files.py's
`test_staging_of_a_killed_run_is_removed_by_the_next`; a crashing build under `infercc ci` is
tests/ci/test_ci_safety.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import write_model
from tests.helpers import run_cli, run_cli_process

CASES = {
    # a listing: exit 0 and the whole JSON document on stdout, nothing on stderr
    "listing": (["passes", "--json"], 0),
    # a model that is not one: exit 2, one line on stderr, nothing written
    "bad input": (["optimize", "{tmp}/text.onnx"], 2),
    # click's usage error: exit 2 and its usage text
    "usage error": (["optimize", "--no-such-option"], 2),
    # a build that runs: exit 0, its JSON report (times aside) and the files it writes
    "build": (["optimize", "{tmp}/m.onnx", "-o", "{tmp}/o.onnx", "--json"], 0),
}


def without_times(report: object) -> object:
    """A JSON report with its measured times ("seconds", "time_s") taken out."""
    if isinstance(report, dict):
        return {k: without_times(v) for k, v in report.items() if k not in ("seconds", "time_s")}
    if isinstance(report, list):
        return [without_times(v) for v in report]
    return report


@pytest.mark.parametrize("case", list(CASES))
def test_the_in_process_runner_gives_what_a_process_gives(tmp_path: Path, case: str) -> None:
    write_model(tmp_path / "m.onnx")
    (tmp_path / "text.onnx").write_text("this is not a model\n")
    template, status = CASES[case]
    args = [a.format(tmp=tmp_path) for a in template]
    process = run_cli_process(*args)
    assert process.returncode == status, process.stderr
    written = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    if case == "build":  # the in-process run writes the same files again
        for name in ("o.onnx", "o.memory_plan.json"):
            (tmp_path / name).unlink()
    inside = run_cli(*args)
    assert inside.returncode == process.returncode
    if case == "build":
        assert without_times(json.loads(inside.stdout)) == without_times(json.loads(process.stdout))
    else:
        assert inside.stdout == process.stdout
    assert inside.stderr == process.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == written
    if case == "bad input":
        lines = [ln for ln in process.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in lines[0]


def test_an_escaped_error_is_exit_1_with_its_traceback_in_both(tmp_path: Path) -> None:
    """--debug lets the error out of `main`: the interpreter prints its traceback, exit 1; the
    in-process runner ends the same way, with the same last line."""
    bad = tmp_path / "text.onnx"
    bad.write_text("garbage")
    process = run_cli_process("--debug", "optimize", str(bad))
    inside = run_cli("--debug", "optimize", str(bad))
    assert process.returncode == inside.returncode == 1
    assert "Traceback (most recent call last)" in process.stderr
    assert "Traceback (most recent call last)" in inside.stderr
    assert process.stderr.splitlines()[-1] == inside.stderr.splitlines()[-1]
    assert "not a valid ONNX model" in process.stderr.splitlines()[-1]


def test_the_console_script_exit_statuses(tmp_path: Path) -> None:
    """The installed `infercc` script (the `[project.scripts]` entry point): 0 on success,
    2 on bad input with one line on stderr."""
    script = shutil.which("infercc")
    if script is None:
        pytest.skip("the infercc console script is not on PATH (the package is not installed)")
    env = {**os.environ, "COLUMNS": "200"}
    ok = subprocess.run([script, "--version"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and ok.stdout.startswith("infercc "), ok.stderr
    missing = tmp_path / "nope.onnx"
    bad = subprocess.run(
        [script, "optimize", str(missing)], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"error: model file not found: {missing} — check the path"
    ]
    assert not list(tmp_path.iterdir())
