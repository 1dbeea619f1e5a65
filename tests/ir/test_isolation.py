"""Shape inference runs in a forked, memory-capped child (`infercc.isolation`): a node that
crashes onnx's C++ or grows it without end is a one-line error naming that node, and the
process that asked survives; valid models are inferred as before."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc import api, isolation
from infercc.errors import InferccError
from infercc.ir import load_model
from infercc.ir.shapes import infer_shapes
from infercc.isolation import ChildCrashed, call_forked, call_isolated
from tests.helpers import make_model, run_cli

pytestmark = pytest.mark.skipif(not isolation.ENABLED, reason="needs os.fork")


@pytest.fixture(autouse=True)
def fresh_fork_server():
    """Each test's server is forked from the process as that test patched it."""
    isolation.reset()
    yield
    isolation.reset()


def slice_model(path: Path, step: int) -> Path:
    """x -> Relu -> Shape -> Slice(step) -> y: data propagation evaluates the Slice."""
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in (("s", [0]), ("e", [2**63 - 1]), ("ax", [0]), ("st", [step]))
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["sh"], name="shape"),
        helper.make_node("Slice", ["sh", "s", "e", "ax", "st"], ["y"], name="big_step"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        inits,
    )
    onnx.save(make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_runaway_inference_is_an_error_naming_the_node(tmp_path: Path, monkeypatch) -> None:
    """Through the CLI in this process (the inference runs in the fork server's child): exit 2,
    one line naming the node, nothing written. The slow sibling below does it with the default
    allowance, in a process of its own."""
    monkeypatch.setattr(isolation, "MEMORY_ALLOWANCE", 256 * 2**20)
    src = slice_model(tmp_path / "m.onnx", 2**62)
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0]
    assert re.search(r"^error: .*ran out of memory.* on node 'big_step' \(Slice\)", lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_segfault_in_inference_names_the_node(tmp_path: Path, monkeypatch) -> None:
    real = onnx.shape_inference.infer_shapes

    def crash_on_boom(model, *args, **kwargs):  # what a bug in onnx's C++ does
        if any(n.name == "boom" for n in model.graph.node):
            os.kill(os.getpid(), signal.SIGSEGV)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", crash_on_boom)
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) {
      a = Relu(x)
      b = Neg(a)
      y = Abs(b)
    }
    """
    proto = onnx.parser.parse_model(text)
    proto.graph.node[1].name = "boom"
    onnx.save(proto, tmp_path / "m.onnx")
    model = load_model(tmp_path / "m.onnx")
    with pytest.raises(InferccError, match=r"killed by SIGSEGV on node 'boom' \(Neg\)"):
        infer_shapes(model)
    proto.graph.node[1].name = "fine"
    onnx.save(proto, tmp_path / "ok.onnx")
    model = load_model(tmp_path / "ok.onnx")
    infer_shapes(model)
    assert model.value("b").shape == ("N", 4)


def test_a_valid_model_is_inferred_through_the_child(tmp_path: Path) -> None:
    src = slice_model(tmp_path / "m.onnx", 1)
    model = load_model(src)
    infer_shapes(model)
    assert model.value("sh").shape == (2,) and model.value("y").shape == (2,)
    report = api.optimize(src, tmp_path / "o.onnx")
    assert report.passed


def _boom() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _fails() -> None:
    raise ValueError("a Python error travels back")


def test_call_forked_returns_raises_and_reports_deaths() -> None:
    pid = os.getpid()
    assert call_forked(os.getpid) != pid  # it did run in another process
    assert call_forked(sorted, [3, 1, 2]) == [1, 2, 3]
    with pytest.raises(ValueError, match="travels back"):
        call_forked(_fails)
    with pytest.raises(ChildCrashed, match="killed by SIGSEGV") as died:
        call_forked(_boom)
    assert died.value.returncode == -signal.SIGSEGV


def test_the_fork_server_is_reused_and_replaced_after_a_crash(tmp_path: Path) -> None:
    from infercc.outputs import Staging, remove_stale_staging

    first = call_isolated(os.getpid)
    assert first != os.getpid() and call_isolated(os.getpid) == first  # one fork, reused
    with pytest.raises(ChildCrashed, match="killed by SIGSEGV"):
        call_isolated(_boom)
    second = call_isolated(os.getpid)
    assert second not in (first, os.getpid())
    with pytest.raises(ValueError, match="travels back"):
        call_isolated(_fails)
    assert call_isolated(os.getpid) == second  # a Python error does not end it
    staging = Staging(tmp_path / "o.onnx")
    isolation.reset()
    call_isolated(int)  # forked while this process holds the staging lock
    staging.unlock()  # the process is gone, as far as the lock can tell
    os.utime(staging.path, (0, 0))
    assert remove_stale_staging(tmp_path) == [staging.path]


@pytest.mark.slow
def test_the_cli_says_it_on_one_line(tmp_path: Path) -> None:
    """With the default allowance (up to 4 GiB, some 15 s of growth)."""
    src = slice_model(tmp_path / "m.onnx", 2**62)
    r = subprocess.run(
        [sys.executable, "-m", "infercc", "optimize", str(src)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 2, r.stderr
    assert "on node 'big_step' (Slice)" in r.stderr and "internal error" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_fork_server_outlives_the_thread_that_forked_it() -> None:
    import threading

    seen = []
    worker = threading.Thread(target=lambda: seen.append(call_isolated(os.getpid)))
    worker.start()
    worker.join()
    assert call_isolated(os.getpid) == seen[0]
