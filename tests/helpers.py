"""Shared helpers for tests: parse ONNX text, run passes, compare under onnxruntime, run the
CLI in this process (`run_cli`) or, for what only a process shows, in a subprocess
(`run_cli_process`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from infercc.ir import export_model, import_model
from infercc.passes import PassContext, PipelineReport, run_passes
from infercc.runtime.ort_support import max_ir_version

# The IR version test models are written at: the newest that both the installed onnx writes and
# the installed onnxruntime reads (onnx 1.23 writes IR 14 by default; onnxruntime 1.23, the
# newest for Python 3.10, reads IR <= 11).
IR_VERSION = max_ir_version()


@dataclasses.dataclass(frozen=True)
class Built:
    """A model optimized once for the session (the `optimized` fixture of tests/conftest.py):
    its source, the optimized file (read it, never write it) and optimize's report."""

    source: Path
    output: Path
    report: Any


def run_cli_process(
    *args: str, cwd: Path | str | None = None, env: Mapping[str, str | None] | None = None
) -> subprocess.CompletedProcess:
    """`python -m infercc ARGS` in a subprocess, output captured as text, 200 columns wide
    (tables are not wrapped). For what only a process shows: the interpreter's exit status,
    signals, a closed stdout, a fresh process's imports; everything else uses `run_cli`."""
    merged = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "infercc", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={k: v for k, v in merged.items() if v is not None},
    )


def run_cli(
    *args: str, cwd: Path | str | None = None, env: Mapping[str, str | None] | None = None
) -> subprocess.CompletedProcess:
    """`infercc ARGS` in this process, through the console script's entry point
    (`infercc.cli.main`: its exit codes, its one-line errors), under `typer.testing.CliRunner`'s
    isolation: stdout and stderr captured apart (pipes, not terminals), 200 columns wide, `env`
    set for the run (a None value unsets the variable). What the libraries write to file
    descriptors 1 and 2 themselves (onnxruntime's C++ log) is captured too and follows the
    Python-level text, so a "one line on stderr" test sees what a process's stderr would hold.
    An exception that escapes `main` (as `--debug` lets one) ends the run as the interpreter
    would: its traceback on stderr, exit status 1. Returns what `subprocess.run` would:
    returncode, stdout, stderr. tests/cli/test_process.py proves the two agree."""
    from typer.testing import CliRunner

    import infercc.cli  # noqa: F401 - registers every command

    cli_app = sys.modules["infercc.cli.app"]
    runner = CliRunner()
    code = 0
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    with (
        _cli_state_restored(cli_app),
        _fds_captured() as fds,
        runner.isolation(env={"COLUMNS": "200", **(env or {})}) as (out, err, _),
    ):
        sys.argv = ["infercc", *args]
        try:
            if cwd is not None:
                os.chdir(cwd)
            cli_app.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # the interpreter's way with an error that escapes
            sys.stderr.write(traceback.format_exc())
            code = 1
        finally:
            sys.argv = saved_argv
            os.chdir(saved_cwd)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace")
    stdout += fds[1]
    stderr += fds[2]
    return subprocess.CompletedProcess(["infercc", *args], code, stdout, stderr)


@contextmanager
def _fds_captured() -> Iterator[dict[int, str]]:
    """File descriptors 1 and 2 pointed at files for the block and put back after; the dict
    yielded holds, once the block is left, the text written to each."""
    written: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="infercc-cli-fd-") as tmp:
        files = {fd: Path(tmp) / f"fd{fd}" for fd in (1, 2)}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved = {fd: os.dup(fd) for fd in files}
        try:
            for fd, path in files.items():
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            yield written
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            written.update({fd: path.read_text(errors="replace") for fd, path in files.items()})


@contextmanager
def _cli_state_restored(cli_app: Any) -> Iterator[None]:
    """The process-wide state a CLI run sets, as it was before: the global options
    (`settings`), the handlers, level and warning capture of infercc's logging, the warning
    filters. A run starts from the defaults a fresh process has."""
    logger = logging.getLogger("infercc")
    py_warnings = logging.getLogger("py.warnings")
    levels = (logger.level, py_warnings.level)
    for field in dataclasses.fields(cli_app.Settings):
        setattr(cli_app.settings, field.name, field.default)
    with warnings.catch_warnings():
        try:
            yield
        finally:
            for handler in cli_app._HANDLERS:
                logger.removeHandler(handler)
                handler.close()
            cli_app._HANDLERS.clear()
            logging.captureWarnings(False)
            logger.setLevel(levels[0])
            py_warnings.setLevel(levels[1])
            for field in dataclasses.fields(cli_app.Settings):
                setattr(cli_app.settings, field.name, field.default)


def make_model(graph: onnx.GraphProto, **kwargs) -> onnx.ModelProto:
    """onnx.helper.make_model at IR_VERSION unless `ir_version` is given: every model a test
    builds loads in the installed onnxruntime."""
    kwargs.setdefault("ir_version", IR_VERSION)
    return onnx.helper.make_model(graph, **kwargs)


def mlp_model(path: Path, seed: int = 0) -> Path:
    """y = relu(x @ w1) @ w2 saved at `path`: x [batch, 64], w1 [64, 64], w2 [64, 32] (big
    enough for int4 blocks), MatMuls named mm1 and mm2, opset 17; checked by onnx."""
    from onnx import TensorProto, numpy_helper
    from onnx import helper as oh

    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w2")
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            oh.make_node("Relu", ["h"], ["r"]),
            oh.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [w1, w2],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def optimize_proto(
    proto: onnx.ModelProto,
    passes: Iterable[str] | None = None,
    ctx: PassContext | None = None,
    check: bool = True,
) -> tuple[onnx.ModelProto, PipelineReport]:
    """Import, run passes with lint after each, export; checks the result with onnx.checker."""
    model = import_model(proto)
    ctx = ctx or PassContext()
    ctx.verify = True
    kwargs = {"pipeline": list(passes)} if passes is not None else {}
    report = run_passes(model, ctx, **kwargs)
    out = export_model(model)
    if check:
        onnx.checker.check_model(out, full_check=True)
    return out, report


def op_counts(proto: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in proto.graph.node)


def run_ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def random_feeds(proto: onnx.ModelProto, seed: int = 0, dims: int = 3) -> dict[str, np.ndarray]:
    """Standard-normal float inputs; symbolic dims get `dims`."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in proto.graph.initializer}
    feeds = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def assert_same_outputs(
    a: onnx.ModelProto,
    b: onnx.ModelProto,
    feeds: dict[str, np.ndarray] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    feeds = feeds if feeds is not None else random_feeds(a)
    ra, rb = run_ort(a, feeds), run_ort(b, feeds)
    assert len(ra) == len(rb)
    for x, y in zip(ra, rb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(x, y, atol=atol, rtol=rtol)
