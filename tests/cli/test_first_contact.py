"""What a newcomer meets first, at 80 columns and with output piped (as CI logs are): help that
prints plainly, global options anywhere, tables never cut, messages said once, a closed pipe
that is no failure, outputs named like files, option ranges, a second positional, and the run
record every JSON report carries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from infercc.cli import app, main
from infercc.cli.app import PIPE_WIDTH, hoist_globals
from tests.cli.test_cli import write_model

ROOT = Path(__file__).resolve().parents[2]
CNN = ROOT / "examples" / "small_cnn.onnx"
ENCODER = ROOT / "examples" / "tiny_encoder.onnx"


@pytest.fixture(autouse=True)
def eighty_columns(tmp_path: Path, monkeypatch) -> None:
    """Every test: 80 columns, a private tuning cache, no GitHub step summary."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


class Result:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err


def cli(capsys, monkeypatch, *args: str) -> Result:
    """`infercc ARGS` in this process, through the entry point (exit codes, one-line errors);
    stdout and stderr are captured, so not terminals: as piped."""
    monkeypatch.setattr(sys, "argv", ["infercc", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def options_of(command: str) -> list[str]:
    """Every option name of a command (`cache ls` for a subgroup's command) that --help lists
    (old spellings kept as hidden aliases are not)."""
    import typer

    group = typer.main.get_command(app)
    cmd = group
    for part in command.split():
        cmd = cmd.commands[part]
    names = []
    for p in cmd.params:
        if p.param_type_name == "option" and not p.hidden:
            names += [*p.opts, *p.secondary_opts]
    return names


COMMANDS = [
    "optimize",
    "extract",
    "inspect",
    "passes",
    "targets",
    "bench",
    "calibrate",
    "validate",
    "ci",
    "cache ls",
    "cache show",
    "cache export",
]


# --------------------------------------------------------------------------- item 4: help


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_at_80_columns(capsys, monkeypatch, command: str) -> None:
    r = cli(capsys, monkeypatch, *command.split(), "--help")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "…" not in r.out and "╭" not in r.out  # no Rich boxes, nothing cut
    # readable metavars: no <bool>, <path>, <list[str]>, <int range>, {model}
    assert not re.search(r"<(bool|path|str|int|float|list\[[a-z]+\]|int range)>", r.out)
    assert not re.search(r"\{[a-z_]+\}", r.out)
    for name in options_of(command):
        assert re.search(rf"(^|[\s,/]){re.escape(name)}([\s,=/]|$)", r.out, re.M), name


def test_help_shows_real_defaults_and_brackets(capsys, monkeypatch) -> None:
    r = cli(capsys, monkeypatch, "optimize", "--help")
    text = " ".join(r.out.split())  # joined across wrapped lines
    assert "[default: <stem>.opt.onnx beside the input]" in text
    assert "[default: cpu]" in text and "[default: 64; x>=1]" in text
    assert (
        "[default: 16MiB]" in text
        and "[default: ort for cpu (openvino with --bf16), tensorrt for GPU targets]" in text
    )
    assert "Usage: infercc optimize [OPTIONS] [MODEL] [OUTPUT]" in r.out
    assert "-o, --output PATH" in r.out and "--shape NAME=SHAPE" in r.out
    assert "--ort-optimized-model" in r.out and "--timing-cache-strict" in r.out
    r = cli(capsys, monkeypatch, "inspect", "--help")
    assert "pip install 'infercc[plot]'" in " ".join(r.out.split())
    r = cli(capsys, monkeypatch, "calibrate", "--help")
    assert 'pip install "infercc[images]"' in " ".join(r.out.split())
    assert "Usage: infercc calibrate [OPTIONS] [MODEL]" in r.out


def test_short_help_h_and_top_level_listing(capsys, monkeypatch) -> None:
    r = cli(capsys, monkeypatch, "-h")
    assert r.code == 0 and "Commands:" in r.out and "extract" in r.out
    assert "..." not in r.out.split("Commands:")[1]  # every summary whole
    r = cli(capsys, monkeypatch, "bench", "-h")
    assert r.code == 0 and "--duration TIME" in r.out and "--ort-profile" in r.out


# --------------------------------------------------------------------------- item 5: globals


def test_global_options_move_to_the_front() -> None:
    import typer

    group = typer.main.get_command(app)
    args = ["optimize", "m.onnx", "--shape", "x=1x4", "-v", "--log-file", "f.log", "--debug"]
    assert hoist_globals(group, None, [*args, "--", "-q"]) == [
        "-v",
        "--log-file",
        "f.log",
        "--debug",
        "optimize",
        "m.onnx",
        "--shape",
        "x=1x4",
        "--",
        "-q",
    ]
    # the value of a command's own option stays with it, even when it looks like a global
    assert hoist_globals(group, None, ["calibrate", "m", "--exclude", "-q", "-vv"]) == [
        "-vv",
        "calibrate",
        "m",
        "--exclude",
        "-q",
    ]
    assert hoist_globals(group, None, ["cache", "ls", "--log-file=x"]) == [
        "--log-file=x",
        "cache",
        "ls",
    ]


def test_debug_after_the_command_shows_the_traceback(tmp_path, capsys, monkeypatch) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_text("garbage")
    r = cli(capsys, monkeypatch, "optimize", str(bad))
    assert r.code == 2 and r.err.startswith("error:") and "rerun" not in r.err
    with pytest.raises(Exception, match="not a valid ONNX model"):
        cli(capsys, monkeypatch, "optimize", str(bad), "--debug")


def test_quiet_verbose_and_log_file_after_the_command(tmp_path, capsys, monkeypatch) -> None:
    src = write_model(tmp_path / "m.onnx")
    log = tmp_path / "run.log"
    r = cli(capsys, monkeypatch, "optimize", str(src), "-o", str(tmp_path / "a.onnx"), "-v")
    assert r.code == 0 and "info: " in r.err  # -v: info lines on stderr
    r = cli(
        capsys, monkeypatch, "optimize", str(src), "-o", str(tmp_path / "b.onnx"),
        "-q", "--log-file", str(log),
    )  # fmt: skip
    assert r.code == 0 and r.err == ""
    assert "DEBUG infercc" in log.read_text() and "nodes 3 -> 2" in r.out
    r = cli(capsys, monkeypatch, "optimize", str(src), "--log-file", str(tmp_path / "no/x.log"))
    assert r.code == 2 and "--log-file" in r.err


# --------------------------------------------------------------------------- item 6: tables


def test_tables_are_whole_when_piped_also_on_github_actions(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    r = cli(capsys, monkeypatch, "targets")
    assert r.code == 0 and "…" not in r.out
    rows = {line.split()[1]: line for line in r.out.splitlines() if line.startswith("│")}
    assert " 7.5 " in rows["t4"] and " 1978.9 " in rows["h100"] and " 4800 " in rows["h200"]
    manifest = tmp_path / "infercc.toml"
    manifest.write_text(
        f'[[models]]\nname = "a_model_with_a_rather_long_name_for_a_table"\n'
        f'path = "{CNN.as_posix()}"\nbackend = "none"\nlatency_budget_ms = 10000.0\n'
        "warmup = 1\niters = 3\n"
    )
    r = cli(capsys, monkeypatch, "ci", str(manifest), "--out-dir", str(tmp_path / "out"))
    assert r.code == 0, r.out + r.err
    assert "…" not in r.out
    header = next(line for line in r.out.splitlines() if "model" in line and "status" in line)
    for col in ("precision", "nodes", "max abs", "cosine", "p50 ms"):
        assert col in header
    row = next(line for line in r.out.splitlines() if "a_model_with" in line)
    assert "a_model_with_a_rather_long_name_for_a_table" in row and "fp32" in row
    assert re.search(r"\d+\.\d{3} │$", row)  # the p50 whole, in the last column
    assert len(row) > 80  # wider than the terminal would be: nothing folded


def test_roofline_table_keeps_whole_names_when_piped(tmp_path, capsys, monkeypatch) -> None:
    text = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 256] x) => (float[B, 256] y) {
  a_very_long_hierarchical_name_of_a_layer_in_a_model = MatMul(x, w)
  y = Relu(a_very_long_hierarchical_name_of_a_layer_in_a_model)
}
"""
    proto = onnx.parser.parse_model(text)
    proto.graph.node[0].name = "encoder.layer.11.attention.output.dense.MatMul"
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((256, 256), np.float32), "w"))
    onnx.save(proto, tmp_path / "mm.onnx")
    r = cli(capsys, monkeypatch, "inspect", str(tmp_path / "mm.onnx"), "--target", "a100")
    assert r.code == 0, r.err
    assert "encoder.layer.11.attention.output.dense.MatMul" in r.out
    assert "…" not in r.out


def test_console_is_wide_on_a_pipe_only() -> None:
    import io

    from infercc.cli.app import _Console

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert _Console(file=io.StringIO()).width == PIPE_WIDTH
    assert _Console(file=Tty(), width=80).width == 80


# --------------------------------------------------------------------------- item 13: once


def test_shapes_print_as_lists(capsys, monkeypatch) -> None:
    r = cli(capsys, monkeypatch, "inspect", str(ENCODER))
    assert "[batch, sequence, 64]" in r.out and "batchxsequence" not in r.out
    assert "hidden_states [1, 8, 64]" in r.out  # the shape profile


def test_bench_note_is_said_once(capsys, monkeypatch, caplog) -> None:
    r = cli(
        capsys, monkeypatch, "bench", str(CNN), "--batch", "2", "--shape", "image=1x3x32x32",
        "--warmup", "0", "--iters", "2",
    )  # fmt: skip
    assert r.code == 0, r.err
    both = r.out + r.err
    assert both.count("batch 2 wins for this run") == 1 and "warning" not in r.err.lower()
    assert not [rec for rec in caplog.records if rec.levelname == "WARNING"]
    assert "image [2, 3, 32, 32]" in r.out


def test_calibrate_speed_warning_is_said_once(tmp_path, capsys, monkeypatch, caplog) -> None:
    from infercc.calib import job
    from infercc.calib.report import SpeedCheck

    slow = SpeedCheck(1.0, 2.0, 2.0, 1.9, 2.1, 10, "cpu", False)
    monkeypatch.setattr(job.Int8Flow, "speed_check", lambda self, build, original: slow)
    samples = _samples(tmp_path)
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--data", str(samples),
            "-o", str(tmp_path / "q"))  # fmt: skip
    assert r.code == 0, r.err
    assert slow.slower and slow.message
    assert (r.out + r.err).count(slow.message) == 1
    assert not [rec for rec in caplog.records if slow.message in rec.getMessage()
                and rec.levelname == "WARNING"]  # fmt: skip


def test_cosine_is_printed_below_its_bound() -> None:
    from infercc.check.compare import compare_outputs

    ref = np.ones(1000, dtype=np.float64)
    cand = ref.copy()
    cand[0] = 1.0 + 1e-3  # cosine 0.99999999950...
    # atol 0: an output within atol everywhere passes whatever its cosine; rtol 1 lets the
    # elementwise check pass, so the cosine decides
    report = compare_outputs([{"y": ref}], [{"y": cand}], 0.0, 1.0, 0.9999999999)
    reason = report.outputs["y"].reason
    assert not report.passed and "1.000000" not in reason
    shown = float(reason.split()[1])
    assert shown < 0.9999999999 and "below 0.9999999999" in reason


# --------------------------------------------------------------------------- item 14: pipes


def test_a_closed_pipe_is_not_a_failure(tmp_path) -> None:
    src = write_model(tmp_path / "m.onnx")
    for args in (["passes"], ["optimize", str(src), "--json"]):
        p = subprocess.Popen(
            [sys.executable, "-m", "infercc", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        p.stdout.close()  # the reader is gone before anything is written (`| head -0`)
        err = p.stderr.read().decode()
        assert p.wait() == 0, err
        assert "Traceback" not in err and "error" not in err


# --------------------------------------------------------------------------- item 15


def _samples(tmp_path: Path) -> Path:
    samples = tmp_path / "samples"
    samples.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        x = rng.standard_normal((1, 8, 64)).astype(np.float32)
        np.savez(samples / f"s{i}.npz", hidden_states=x)
    return samples


def test_calibrate_output_is_taken_by_bench_and_validate(tmp_path, capsys, monkeypatch) -> None:
    samples = _samples(tmp_path)
    out = tmp_path / "int8"
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--int8", "--data", str(samples),
            "-o", str(out), "--no-speed-check")  # fmt: skip
    assert r.code == 0, r.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "model_int8.onnx" and manifest["precision"] == "int8"
    r = cli(capsys, monkeypatch, "bench", str(out), "--iters", "2", "--warmup", "0", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["results"][0]["shapes"]["hidden_states"] == [1, 8, 64]
    r = cli(capsys, monkeypatch, "validate", str(out), "--reference", str(ENCODER), "--json",
            "--shape", "hidden_states=1x8x64")  # fmt: skip
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["precision"] == "int8" and rep["validation"]["min_cosine"] == 0.99
    # calibrate without --int8 builds the same int8 model: the flag names the default
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--data", str(samples),
            "-o", str(tmp_path / "again"), "--no-speed-check", "--json")  # fmt: skip
    assert r.code == 0 and json.loads(r.out)["quantized_nodes"] >= 2


def test_the_user_cards_calibrate_command_runs_as_written(tmp_path, capsys, monkeypatch) -> None:
    """`infercc calibrate model.onnx --int8 --data samples/`: no -o needed; a CNN has no
    accuracy target, so the verdict says that, not "passed", and a floor holds it."""
    model = tmp_path / "cnn.onnx"
    model.write_bytes(CNN.read_bytes())
    images = ROOT / "examples" / "images"
    args = ["calibrate", str(model), "--int8", "--data", str(images), "--preprocess", "imagenet",
            "--no-speed-check"]  # fmt: skip
    r = cli(capsys, monkeypatch, *args)
    assert r.code == 0, r.err
    assert (tmp_path / "cnn.int8" / "model_int8.onnx").is_file()
    summary = r.out.splitlines()[0]
    assert summary.endswith("no accuracy target") and "passed" not in summary
    assert "at or above the floor 0.9" in r.out
    r = cli(capsys, monkeypatch, *args, "-o", str(tmp_path / "high"), "--min-cosine-floor", "1")
    assert r.code == 1 and "below 1.0: this model is not usable" in r.out
    assert not (tmp_path / "high").exists()
    r = cli(capsys, monkeypatch, *args, "-o", str(tmp_path / "both"), "--min-cosine-floor", "0.5",
            "--min-cosine", "0.9")  # fmt: skip
    assert r.code == 2 and "--min-cosine-floor has no effect with --min-cosine" in r.err
    assert len(r.err.strip().splitlines()) == 1 and not (tmp_path / "both").exists()
    r = cli(capsys, monkeypatch, "calibrate", "--int8", "--data", str(images))
    assert r.code == 2 and r.err.startswith("error: no MODEL given")
    r = cli(capsys, monkeypatch, "calibrate", str(model), "--int4", "--accuracy-level", "0",
            "--no-speed-check")  # fmt: skip
    assert r.code == 0, r.err
    assert (tmp_path / "cnn.int4" / "calibration_report.json").is_file()


def test_int4_output_is_taken_by_bench_and_validate(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "int4"
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--int4", "--accuracy-level", "0",
            "-o", str(out), "--no-speed-check")  # fmt: skip
    assert r.code == 0, r.err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "model_int4.onnx" and manifest["precision"] == "int4"
    r = cli(capsys, monkeypatch, "bench", str(out), "--iters", "2", "--warmup", "0", "--json")
    assert r.code == 0, r.err
    r = cli(capsys, monkeypatch, "validate", str(out), "--reference", str(ENCODER), "--json")
    rep = json.loads(r.out)
    assert rep["precision"] == "int4" and rep["validation"]["min_cosine"] == 0.99
    assert r.code == 0, r.err


def test_output_suffix_is_case_insensitive_and_a_directory_is_said(tmp_path, capsys, monkeypatch):
    src = write_model(tmp_path / "m.onnx")
    r = cli(capsys, monkeypatch, "optimize", str(src), "-o", str(tmp_path / "x.ONNX"))
    assert r.code == 0 and (tmp_path / "x.ONNX").is_file()
    onnx.checker.check_model(onnx.load(tmp_path / "x.ONNX"))
    r = cli(capsys, monkeypatch, "optimize", str(src), "-o", str(tmp_path / "m2.onxx"), "--no-tune")
    assert r.code == 0, r.err
    assert (tmp_path / "m2.onxx" / "manifest.json").is_file()
    assert "does not end in .onnx" in r.err and "did you mean m2.onnx?" in r.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["optimize", "{src}", "--fold-limit", "-5"], "--fold-limit '-5' must be positive"),
        (["optimize", "{src}", "--min-cosine", "2"], "--min-cosine"),
        (["optimize", "{src}", "--atol", "-1"], "--atol"),
        (["validate", "{src}", "--reference", "{src}", "--min-cosine", "2"], "--min-cosine"),
        (
            ["calibrate", "{src}", "--data", "{src}", "-o", "{tmp}/q", "--holdout", "1.5"],
            "--holdout",
        ),
        (
            ["calibrate", "{src}", "--data", "{src}", "-o", "{tmp}/q", "--percentile", "120"],
            "--percentile",
        ),
        (["bench", "{src}", "--duration", "0"], "--duration '0' must be positive"),
        (["bench", "{src}", "--duration", "soon"], "is not a duration"),
        (["bench", "{src}", "--ort-profile", "--compare", "{src}"], "--ort-profile has no effect"),
    ],
)
def test_option_ranges_are_refused(tmp_path, capsys, monkeypatch, args, message) -> None:
    src = write_model(tmp_path / "m.onnx")
    args = [a.format(src=src, tmp=tmp_path) for a in args]
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli(capsys, monkeypatch, *args)
    assert r.code == 2, r.out + r.err
    assert message in r.err and "Traceback" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_config_refuses_a_min_cosine_out_of_range() -> None:
    from infercc.config import BuildConfig
    from infercc.errors import InferccError

    with pytest.raises(InferccError, match="a cosine is at most 1"):
        BuildConfig(min_cosine=2.0)
    with pytest.raises(InferccError, match="--min-cosine -0.5 is negative"):
        BuildConfig(min_cosine=-0.5)
    assert BuildConfig(min_cosine=1.0).min_cosine == 1.0


def test_failed_json_optimize_reports_no_output(tmp_path, capsys, monkeypatch) -> None:
    from infercc import api
    from infercc.passes import manager

    def corrupt(graph, ctx):  # Relu -> Neg: a wrong rewrite, so validation fails
        for n in graph:
            if n.op_type == "Relu":
                n.op_type = "Neg"
        return manager.PassResult(True)

    monkeypatch.setitem(manager.REGISTRY, "corrupt", manager.PassInfo("corrupt", corrupt, ""))
    monkeypatch.setattr(api, "optimize_stages", lambda precision: [("corrupt",)])
    src = write_model(tmp_path / "m.onnx")
    r = cli(capsys, monkeypatch, "optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json")
    assert r.code == 1
    rep = json.loads(r.out)
    assert rep["output"] is None and rep["written"] is False and rep["files"] == []
    assert rep["destination"] == str(tmp_path / "o.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "m.onnx"] or sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["m.onnx"]


# --------------------------------------------------------------------------- item 18


def test_second_positional_is_the_output(tmp_path, capsys, monkeypatch) -> None:
    src = write_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    r = cli(capsys, monkeypatch, "optimize", str(src), str(out), "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["output"] == str(out) and out.is_file()
    assert not (tmp_path / "m.opt.onnx").exists()
    r = cli(capsys, monkeypatch, "optimize", str(src), str(out), "-o", str(tmp_path / "b.onnx"))
    assert r.code == 2 and "the output is given twice" in r.err
    assert not (tmp_path / "b.onnx").exists()


# --------------------------------------------------------------------------- item 21


def test_bench_duration_and_profile(capsys, monkeypatch) -> None:
    r = cli(capsys, monkeypatch, "bench", str(CNN), "--duration", "20ms", "--iters", "3",
            "--warmup", "1", "--ort-profile", "--json")  # fmt: skip
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["duration_s"] == 0.02
    result = rep["results"][0]
    assert result["iters"] >= 3
    profile = result["profile"]
    assert profile["runs"] == min(result["iters"], 100)
    ops = {o["op_type"] for o in profile["ops"]}
    assert "Conv" in ops and "Gemm" in ops
    assert abs(sum(o["share"] for o in profile["ops"]) - 1.0) < 1e-3
    times = [o["ms"] for o in profile["ops"]]
    assert times == sorted(times, reverse=True)
    # every Conv of the optimized graph runs once per run
    conv = next(o for o in profile["ops"] if o["op_type"] == "Conv")
    assert conv["calls"] == 3.0
    # --profile: the old spelling, hidden in --help, still works
    r = cli(capsys, monkeypatch, "bench", str(CNN), "--iters", "2", "--warmup", "0", "--profile")
    assert r.code == 0 and "profile, batch 1" in r.out and "slowest nodes" in r.out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--duration", "1s"], "--duration has no effect with --generate"),
        (["--ort-profile"], "--ort-profile has no effect with --generate"),
        (["--profile"], "--ort-profile has no effect with --generate"),  # the old spelling
        (["--ort-profile", "--compare", str(CNN)], "--ort-profile has no effect with --compare"),
        (["--duration", "soon"], "--duration 'soon' is not a duration"),
        (["--duration", "0s"], "--duration '0s' must be positive"),
    ],
)
def test_bench_duration_and_profile_are_refused_where_they_do_nothing(
    capsys, monkeypatch, args, message
) -> None:
    generate = ["--generate", "4"] if "generate" in message else []
    r = cli(capsys, monkeypatch, "bench", str(CNN), *generate, *args)
    assert r.code == 2 and message in r.err, r.err
    assert "Traceback" not in r.err


def test_bench_profile_needs_onnxruntime(tmp_path, monkeypatch) -> None:
    from infercc.errors import InferccError
    from infercc.runtime import bench

    class Engine:  # a runner of another backend: no onnxruntime profiler
        input_names, output_names = ["image"], ["logits"]

    monkeypatch.setattr(bench, "open_runner", lambda path, spinning=True: (Engine(), None))
    monkeypatch.setattr(bench, "backend_name", lambda path: "tensorrt")
    with pytest.raises(InferccError, match="runs on tensorrt"):
        bench._profiler(CNN)


# --------------------------------------------------------------------------- item 22


def test_every_json_report_records_its_run(tmp_path, capsys, monkeypatch) -> None:
    src = write_model(tmp_path / "m.onnx")
    runs = {
        "optimize": ["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json"],
        "inspect": ["inspect", str(src), "--json"],
        "bench": ["bench", str(src), "--iters", "2", "--warmup", "0", "--json"],
        "validate": ["validate", str(tmp_path / "o.onnx"), "--reference", str(src), "--json"],
        "passes": ["passes", "--json"],
        "cache ls": ["cache", "ls", "--json"],
    }
    for name, args in runs.items():
        r = cli(capsys, monkeypatch, *args)
        assert r.code == 0, (name, r.err)
        run = json.loads(r.out)["run"]
        assert run["command"] == name and run["infercc"]
        assert "json" in run["options"] or "as_json" in run["options"]
    r = cli(capsys, monkeypatch, *runs["bench"])
    options = json.loads(r.out)["run"]["options"]
    assert options["model"] == str(src) and options["iters"] == 2 and options["warmup"] == 0
    assert options["seed"] == 0 and options["duration"] is None  # defaults filled in


def test_optimize_config_replays_a_saved_record(tmp_path, capsys, monkeypatch) -> None:
    src = write_model(tmp_path / "m.onnx")
    record = tmp_path / "rec" / "build.toml"
    record.parent.mkdir()
    first = tmp_path / "first.onnx"
    r = cli(
        capsys, monkeypatch, "optimize", str(src), str(first), "--shape", "x=2x4",
        "--disable-pass", "eliminate-no-ops", "--atol", "0.001", "--save-config", str(record),
    )  # fmt: skip
    assert r.code == 0, r.err
    text = record.read_text()
    assert 'model = "../m.onnx"' in text and "[build]" in text and 'x = "2x4"' in text
    first.rename(tmp_path / "kept.onnx")
    r = cli(capsys, monkeypatch, "optimize", "--config", str(record), "--json")
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["output"] == str(first)
    assert first.read_bytes() == (tmp_path / "kept.onnx").read_bytes()  # the same build
    assert rep["build"]["disable_passes"] == ["eliminate-no-ops"] and rep["build"]["atol"] == 0.001
    assert rep["memory"]["shape_profile"] == {"x": [2, 4]}
    # a flag given with --config wins over the file; the rest is the file's
    r = cli(capsys, monkeypatch, "optimize", "--config", str(record),
            "-o", str(tmp_path / "c.onnx"), "--atol", "0.01", "--json")  # fmt: skip
    rep = json.loads(r.out)
    assert r.code == 0 and rep["build"]["atol"] == 0.01
    assert rep["build"]["disable_passes"] == ["eliminate-no-ops"]
    # a --json report replays too
    report = tmp_path / "report.json"
    report.write_text(r.out)
    r = cli(capsys, monkeypatch, "optimize", "--config", str(report), "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["build"]["atol"] == 0.01
    assert json.loads(r.out)["output"] == str(tmp_path / "c.onnx")


def test_config_errors_are_one_line(tmp_path, capsys, monkeypatch) -> None:
    bad = tmp_path / "b.toml"
    bad.write_text("target = 3\n")
    r = cli(capsys, monkeypatch, "optimize", "--config", str(bad))
    assert r.code == 2 and "target must be a str" in r.err
    r = cli(capsys, monkeypatch, "optimize", "--config", str(tmp_path / "none.toml"))
    assert r.code == 2 and "does not exist" in r.err
    ok = tmp_path / "ok.toml"
    ok.write_text('target = "cpu"\n')
    r = cli(capsys, monkeypatch, "optimize", "--config", str(ok))
    assert r.code == 2 and "no MODEL given" in r.err


def test_every_build_option_of_optimize_can_override_a_replayed_record() -> None:
    """A new optimize option that sets the build must be in FLAG_KEYS, or a flag given beside
    --config would be silently ignored."""
    import typer

    from infercc.cli.optimize import FLAG_KEYS
    from infercc.config import BuildConfig

    cmd = typer.main.get_command(app).commands["optimize"]
    not_build = {"output", "cache_dir", "as_json", "explain", "config", "save_config"}
    options = {p.name for p in cmd.params if p.param_type_name == "option"} - not_build
    assert options == set(FLAG_KEYS)
    build = BuildConfig().to_dict()
    for key in FLAG_KEYS.values():
        table, _, sub = key.rpartition(".")
        assert (sub in build[table]) if table else (key in build), key


def test_calibrate_says_which_settings_it_chose(tmp_path, capsys, monkeypatch) -> None:
    samples = _samples(tmp_path)
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--data", str(samples),
            "-o", str(tmp_path / "q"), "--no-speed-check")  # fmt: skip
    assert r.code == 0, r.err
    why = "chosen: the model is a transformer (1 Softmax over a MatMul of two activations)"
    assert f"settings: method percentile ({why}); percentile 99.999 ({why});" in r.out
    assert "min cosine 0.99 (chosen: the model is a transformer" in r.out
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--data", str(samples),
            "-o", str(tmp_path / "g"), "--no-speed-check", "--method", "minmax",
            "--min-cosine", "0", "--json")  # fmt: skip
    assert r.code == 0, r.err
    settings = json.loads(r.out)["settings"]
    assert settings == {
        "method": {"value": "minmax", "why": "given", "given": True},
        "min_cosine": {"value": None, "why": "given", "given": True},
    }
    r = cli(capsys, monkeypatch, "calibrate", str(ENCODER), "--data", str(samples),
            "-o", str(tmp_path / "x"), "--method", "entropy", "--percentile", "99.9")  # fmt: skip
    assert r.code == 2 and "percentile method only, not entropy" in r.err
    assert "Traceback" not in r.err and not (tmp_path / "x").exists()
