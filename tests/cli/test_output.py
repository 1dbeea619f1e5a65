"""Reading the output: how much `-q`, the default and `-v` say, an 80-column terminal, piped
output (no trailing spaces, prose wrapped), JSON on stdout for every `--json` run, Ctrl-C,
the files written beside a model, the tolerance wording, the runtime a bench names, and the
progress line.

A terminal is simulated with rich's own switch, `TTY_COMPATIBLE=1` (honoured by
`infercc.cli.app.is_tty`), and `COLUMNS=80`; without it `run_cli`'s stdout is a pipe."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from infercc import api
from infercc.errors import ValidationError
from infercc.passes import manager
from infercc.precisions import TOLERANCES
from tests.cli.test_cli import write_model
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
ENCODER = ROOT / "examples" / "tiny_encoder.onnx"
TERMINAL_80 = {"COLUMNS": "80", "TTY_COMPATIBLE": "1"}
BORDER = re.compile(r"^[┏┡└]")


def table_rows(text: str, title: str) -> list[str]:
    """The body rows of the table whose title line starts with `title`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 4 :]:  # title, top border, header, header rule
        if line.startswith("└"):
            return rows
        rows.append(line)
    raise AssertionError(f"table {title!r} has no end")


@pytest.fixture(scope="module")
def levels(tmp_path_factory) -> dict[str, object]:
    """The tiny encoder optimized at -q, by default and at -v (piped), and its JSON report."""
    tmp = tmp_path_factory.mktemp("levels")
    runs = {}
    for name, flags in (("quiet", ["-q"]), ("default", []), ("verbose", ["-v"])):
        runs[name] = run_cli("optimize", str(ENCODER), "-o", str(tmp / f"{name}.onnx"), *flags)
        assert runs[name].returncode == 0, runs[name].stderr
    r = run_cli("optimize", str(ENCODER), "-o", str(tmp / "j.onnx"), "--json")
    runs["report"] = json.loads(r.stdout)
    return runs


# --------------------------------------------------------------------------- -q, default, -v


def test_quiet_is_the_two_summary_lines_and_the_verdict(levels) -> None:
    lines = levels["quiet"].stdout.splitlines()
    assert len(lines) == 3, lines
    assert " -> " in lines[0] and "quiet.memory_plan.json" in lines[0]
    assert lines[1].startswith("nodes 27 -> 5")
    assert lines[2].startswith("validation passed on ")
    assert levels["quiet"].stderr == ""


def test_default_lists_the_passes_that_changed_the_model(levels) -> None:
    report = levels["report"]
    changed = [n for n, st in report["passes"].items() if st["changed"]]
    assert 0 < len(changed) < len(report["passes"])
    out = levels["default"].stdout
    rows = table_rows(out, "passes")
    assert [row.split()[1] for row in rows] == changed
    assert not [row for row in rows if row.split()[3] == "-"]  # no row of a pass that did nothing
    assert f"{len(changed)} of {len(report['passes'])} changed the model (-v lists all)" in out
    assert "refused" not in out  # refusals are not a problem: -v counts them, --explain lists
    assert len(report["refusals"]) > 0


def test_verbose_lists_every_pass_and_counts_the_refusals(levels) -> None:
    report = levels["report"]
    out = levels["verbose"].stdout
    rows = table_rows(out, "passes")
    assert [row.split()[1] for row in rows] == list(report["passes"])
    assert f"{len(report['refusals'])} rewrite(s) refused; --explain lists them" in out
    hidden = len(report["passes"]) - sum(1 for st in report["passes"].values() if st["changed"])
    default = levels["default"].stdout.splitlines()
    # the rows of the passes that did nothing, and the refusals' line: nothing else differs
    assert len(out.splitlines()) == len(default) + hidden + 1


def test_quiet_and_verbose_exclude_each_other(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    r = run_cli("optimize", str(src), "-q", "-v")
    assert r.returncode == 2 and "-q and -v exclude each other" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


# --------------------------------------------------------------------------- a failure


def _corrupt(graph, ctx):  # a deliberately wrong rewrite: Relu -> Neg
    changed = False
    for n in graph:
        if n.op_type == "Relu":
            n.op_type = "Neg"
            changed = True
    return manager.PassResult(changed)


@pytest.fixture
def failing(monkeypatch, tmp_path: Path) -> Path:
    """A model whose build fails validation (a pass that turns Relu into Neg)."""
    monkeypatch.setitem(manager.REGISTRY, "corrupt", manager.PassInfo("corrupt", _corrupt, ""))
    monkeypatch.setattr(api, "optimize_stages", lambda precision: [("corrupt",)])
    return write_model(tmp_path / "m.onnx")


def test_80_columns_a_failure_says_no_in_the_table_and_why_in_full_under_it(failing) -> None:
    r = run_cli("optimize", str(failing), "-o", str(failing.parent / "o.onnx"), env=TERMINAL_80)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    row = next(line for line in lines if line.startswith("│ y "))
    assert row.rstrip("│ ").endswith("│ no")  # yes/no only: the reason is not in the table
    end = next(i for i, line in enumerate(lines) if line.startswith("└") and i > lines.index(row))
    reason = " ".join(line.strip() for line in lines[end + 1 : end + 3])
    assert reason.startswith("y: 16 of 16 elements out of tolerance (atol 0.0001, rtol 0.001)")
    assert "does not move this output" in reason  # the whole reason, words unbroken
    assert "validation failed: the optimized model was not written" in r.stdout


def test_piped_no_trailing_spaces_and_prose_wrapped(failing) -> None:
    r = run_cli("optimize", str(failing), "-o", str(failing.parent / "o.onnx"), "-v")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert [line for line in lines if line != line.rstrip()] == []
    assert "passes" in lines  # a table's title, not padded to the table's width
    prose = [
        line
        for line in lines
        if not line.startswith(("│", "┃")) and not BORDER.match(line)
        and str(failing.parent) not in line  # the summary line's paths: never wrapped
    ]  # fmt: skip
    assert len(prose) > 5 and max(len(line) for line in prose) <= 100  # PROSE_WIDTH, piped
    tables = [line for line in lines if line.startswith(("│", "┃")) or BORDER.match(line)]
    assert max(len(line) for line in tables) < 80  # no table padded to a long reason's width
    reason = " ".join(line.strip() for line in lines if line.startswith(("  y: ", "    ")))
    assert "onnxruntime's own optimizer does not move this output" in reason


def test_prose_wraps_a_long_note_and_keeps_paths_whole() -> None:
    from infercc.cli.units import PROSE_WIDTH, prose

    path = "/a/very/long/path/" * 8 + "model.onnx"
    note = ("the original fails on the generated inputs at that size, " * 9) + path
    assert len(note) > 535
    buf = io.StringIO()
    prose(Console(file=buf, width=4096), f"note: {note}", indent="  ")
    lines = buf.getvalue().splitlines()
    assert len(lines) > 5 and all(line.startswith("    ") for line in lines[1:])
    assert all(len(line) <= PROSE_WIDTH for line in lines if path not in line)
    assert any(line.strip() == path for line in lines)  # too long for a line: whole, alone
    assert " ".join(line.strip() for line in lines) == f"note: {note}"


# --------------------------------------------------------------------------- --json


def test_json_on_bad_input_prints_the_error_object(tmp_path: Path) -> None:
    r = run_cli("optimize", str(tmp_path / "missing.onnx"), "--json")
    assert r.returncode == 2
    data = json.loads(r.stdout)
    assert set(data) == {"error", "hint", "exit"} and data["exit"] == 2
    assert "missing.onnx" in data["error"] and data["hint"]
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error:")
    assert list(tmp_path.iterdir()) == []


def test_json_on_a_usage_error_prints_the_error_object() -> None:
    r = run_cli("optimize", "m.onnx", "--json", "--no-such-flag")
    assert r.returncode == 2
    data = json.loads(r.stdout)
    assert "--no-such-flag" in data["error"] and data["exit"] == 2
    assert data["hint"] == "infercc optimize --help lists the options"


def test_json_of_an_exit_1_error_without_a_report(tmp_path: Path, monkeypatch) -> None:
    def fails(*args, **kwargs):
        raise ValidationError("the engine's outputs differ from onnxruntime's", "rebuild it")

    monkeypatch.setattr(api, "optimize", fails)
    src = write_model(tmp_path / "m.onnx")
    r = run_cli("optimize", str(src), "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout) == {
        "error": "the engine's outputs differ from onnxruntime's",
        "hint": "rebuild it",
        "exit": 1,
    }


def test_json_of_a_failed_validation_is_the_report_alone(failing) -> None:
    r = run_cli("optimize", str(failing), "--json")
    assert r.returncode == 1
    data = json.loads(r.stdout)  # one object: the report, no error object after it
    assert data["validation"]["passed"] is False and "error" not in data


def test_json_without_an_error_prints_only_the_report(tmp_path: Path) -> None:
    r = run_cli("passes", "--json")
    assert r.returncode == 0 and "error" not in json.loads(r.stdout)


# --------------------------------------------------------------------------- Ctrl-C


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_says_nothing_written_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    src = write_model(tmp_path / "m.onnx")
    monkeypatch.setattr(api.OptimizeFlow, "_validate", _interrupt)  # in the middle of the build
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "out" / "o.onnx"))
    assert r.returncode == 130
    assert r.stderr.strip() == "interrupted; nothing written"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # not even the folder made
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json")
    assert r.returncode == 130
    assert json.loads(r.stdout) == {
        "error": "interrupted; nothing written",
        "hint": None,
        "exit": 130,
    }


def test_ctrl_c_after_the_files_were_written_says_so(tmp_path: Path, monkeypatch) -> None:
    import infercc.cli.render as render

    src = write_model(tmp_path / "m.onnx")
    monkeypatch.setattr(render, "render_optimize", _interrupt)
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"))
    assert r.returncode == 130
    assert r.stderr.strip().startswith(f"interrupted after writing {tmp_path / 'o.onnx'}")


def test_ctrl_c_while_publishing_puts_the_old_files_back(tmp_path: Path, monkeypatch) -> None:
    import os

    from infercc import outputs

    model, plan = tmp_path / "o.onnx", tmp_path / "o.memory_plan.json"
    model.write_text("old model")
    plan.write_text("old plan")
    staged = tmp_path / "stage"
    staged.mkdir()
    (staged / "o.onnx").write_text("new model")
    (staged / "o.memory_plan.json").write_text("new plan")
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # the new plan is in, the new model not yet
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(outputs.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        outputs.publish_files([(staged / "o.onnx", model), (staged / "o.memory_plan.json", plan)])
    assert (model.read_text(), plan.read_text()) == ("old model", "old plan")


# --------------------------------------------------------------------------- what is said


def test_fp16_tolerance_is_said_as_the_cosine_it_checks(tmp_path: Path) -> None:
    r = run_cli("optimize", str(ENCODER), "-o", str(tmp_path / "h.onnx"), "--fp16", "-q")
    assert r.returncode == 0, r.stderr
    verdict = r.stdout.splitlines()[2]
    cosine = TOLERANCES["fp16"].min_cosine
    assert verdict.endswith(f": cosine >= {cosine:g} (fp16)"), verdict
    assert "inf" not in verdict and "atol" not in verdict


def test_bench_names_the_runtime_of_a_backend_none_artifact(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    build = tmp_path / "build"
    r = run_cli("optimize", str(src), "-o", str(build), "--backend", "none", "-q")
    assert r.returncode == 0, r.stderr
    r = run_cli("bench", str(build), "--warmup", "0", "--iters", "2", "--shape", "x=1x4")
    assert r.returncode == 0, r.stderr
    title = r.stdout.splitlines()[0]
    assert title == (
        f"{build} on onnxruntime, default session options (an artifact of --backend none)"
    )
    assert "(none)" not in r.stdout


def test_the_memory_plan_written_beside_a_model_is_named(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q")
    assert r.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "o.memory_plan.json", "o.onnx"]
    assert r.stdout.splitlines()[0] == (
        f"{src} -> {tmp_path / 'o.onnx'} (+ o.memory_plan.json)  (target cpu)"
    )


# --------------------------------------------------------------------------- progress


@pytest.fixture
def terminal(monkeypatch) -> io.StringIO:
    """stderr as an 80-column terminal (what the progress display draws on)."""
    import infercc.cli.common as common

    app_module = sys.modules["infercc.cli.app"]
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80, color_system=None)
    monkeypatch.setattr(app_module, "err", console)
    monkeypatch.setattr(common, "err", console)
    return screen


def test_a_spinner_names_the_stage_from_the_start(terminal: io.StringIO) -> None:
    from infercc.cli.common import Progress

    app_module = sys.modules["infercc.cli.app"]
    app_module.start_status(["optimize", "m.onnx"])
    display, task = app_module._status.display, app_module._status.task
    try:
        display.refresh()
        assert "starting" in terminal.getvalue()
        with Progress(False) as progress:  # the command's display goes on with the same line
            assert (progress.progress, progress.main) == (display, task)
            progress.step("loading")
            display.refresh()
            shown = terminal.getvalue()
            assert "loading" in shown and "0/?" not in shown and "0:00:0" in shown
            progress.tick(3, 10)
            display.refresh()
            assert "3/10" in terminal.getvalue()
    finally:
        app_module.stop_status()
    assert app_module._status.display is None and not display.live.is_started


@pytest.mark.parametrize("args", [["optimize", "m.onnx", "--json"], ["optimize", "-h"]])
def test_no_status_line_for_json_or_help(terminal: io.StringIO, args: list[str]) -> None:
    app_module = sys.modules["infercc.cli.app"]
    app_module.start_status(args)
    assert app_module._status.display is None and terminal.getvalue() == ""


def test_a_large_relative_error_that_passed_is_explained_under_the_table():
    """max rel 14.4 beside 'ok yes' (an fp16 output near zero): one line says what max rel
    is and which criterion passed it; none when every max rel is within rtol."""
    from rich.console import Console

    from infercc.check.compare import OutputMetrics, ValidationReport
    from infercc.cli.render import render_validation

    def text(max_rel: float) -> str:
        out = OutputMetrics("logits", (1, 4), "float16", 1e-3, max_rel, 0.9999, 0.1)
        out.decided_by = "cosine"
        report = ValidationReport(True, {"logits": out}, 2, 1e-2, 1e-2, 0.999)
        console = Console(record=True, width=100)
        render_validation(report, console, precision="fp16")
        return console.export_text()

    assert "max rel is the largest" in text(14.4) and "(logits: cosine)" in text(14.4)
    assert "max rel is the largest" not in text(0.005)
