"""A model with a custom op: the op and its domain named where onnxruntime lacks a kernel for it,
and `--ort-custom-op-lib LIB` (onnxruntime's `SessionOptions.register_custom_ops_library`)
taken by every command that makes a session, and registered in each session it makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from infercc.runtime import ort_support
from tests.helpers import mlp_model, parse, run_cli

# A valid model (onnx.checker passes) whose second node no onnxruntime kernel implements.
CUSTOM = """
<ir_version: 8, opset_import: ["" : 17, "com.acme" : 1]>
g (float[N, 64] x) => (float[N, 64] y) {
    m = MatMul(x, w)
    y = com.acme.MyGelu(m)
}
"""


@pytest.fixture
def custom(tmp_path: Path) -> Path:
    model = onnx.parser.parse_model(CUSTOM)
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    onnx.checker.check_model(model)
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    return path


def _samples(tmp_path: Path) -> Path:
    data = tmp_path / "samples"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(data / f"{i}.npz", x=rng.standard_normal((2, 64)).astype(np.float32))
    return data


def commands(model: Path, out: Path) -> dict[str, list[str]]:
    """Every command that makes an onnxruntime session on the user's model."""
    return {
        "optimize": ["optimize", str(model), "-o", str(out / "m.opt.onnx")],
        "optimize-ort": ["optimize", str(model), "-o", str(out / "art"), "--backend", "ort"],
        "validate": ["validate", str(model), "--reference", str(model)],
        "bench": ["bench", str(model), "--warmup", "0", "--iters", "1"],
        "calibrate": [
            "calibrate", str(model), "--int8", "--data", str(_samples(out.parent)),
            "-o", str(out / "q"), "--no-speed-check",
        ],
    }  # fmt: skip


COMMANDS = ["optimize", "optimize-ort", "validate", "bench", "calibrate"]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unregistered_custom_op_is_named_with_the_flag(custom, tmp_path, command) -> None:
    out = tmp_path / "out"
    r = run_cli(*commands(custom, out)[command])
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "op MyGelu of domain com.acme, a custom op" in line
    assert "--ort-custom-op-lib LIB" in line and "onnx.checker" not in line
    assert not out.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_library_is_one_line_from_every_command(tmp_path, command) -> None:
    model = mlp_model(tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    lib = tmp_path / "nowhere" / "libacme_ops.so"
    r = run_cli(*commands(model, out)[command], "--ort-custom-op-lib", str(lib))
    assert r.returncode == 2
    assert f"--ort-custom-op-lib {lib}: no such file" in one_line(r.stderr)
    assert not out.exists()


def test_a_library_onnxruntime_cannot_load_is_named(tmp_path) -> None:
    model = mlp_model(tmp_path / "mlp.onnx")
    lib = tmp_path / "libnot_a_library.so"
    lib.write_bytes(b"not an ELF file")
    r = run_cli("validate", str(model), "--reference", str(model), "--ort-custom-op-lib", str(lib))
    assert r.returncode == 2
    assert f"--ort-custom-op-lib {lib}: onnxruntime {ort.__version__} cannot load it" in one_line(
        r.stderr
    )


def test_no_session_no_library() -> None:
    r = run_cli(
        "optimize", "m.onnx", "--no-validate", "--ort-custom-op-lib", "/opt/ops.so"
    )  # fmt: skip
    assert r.returncode == 2
    assert "--ort-custom-op-lib has no effect with --no-validate" in one_line(r.stderr)


@pytest.fixture
def recorded(monkeypatch) -> dict[str, int]:
    """A library that loads (the check accepts it) and is registered as a count: per session
    made from a path, whether its options had the library registered."""
    counts = {"registered": 0, "path_sessions": 0, "unregistered_path_sessions": 0}
    registered: set[int] = set()
    real_session = ort.InferenceSession

    def register(options):
        for _lib in ort_support._custom_op_libs:
            counts["registered"] += 1
            registered.add(id(options))
        return options

    def session(source, options=None, *args, **kwargs):
        if isinstance(source, str):  # a model file: the user's model, a candidate, an artifact
            counts["path_sessions"] += 1
            counts["unregistered_path_sessions"] += id(options) not in registered
        return real_session(source, options, *args, **kwargs)

    monkeypatch.setattr(ort_support, "check_custom_op_library", lambda lib: str(lib))
    monkeypatch.setattr(ort_support, "register_custom_ops", register)
    monkeypatch.setattr(ort, "InferenceSession", session)
    return counts


@pytest.mark.parametrize("command", COMMANDS)
def test_the_library_reaches_every_session(tmp_path, recorded, command) -> None:
    model = mlp_model(tmp_path / "mlp.onnx")
    args = commands(model, tmp_path / "out")[command]
    if command == "optimize-ort":
        args += ["--no-tune"]  # the tuner's sessions are the runner's: one is enough here
    r = run_cli(*args, "--ort-custom-op-lib", str(tmp_path / "libops.so"))
    assert r.returncode == 0, r.stderr
    assert recorded["registered"] >= 1 and recorded["path_sessions"] >= 1
    assert recorded["unregistered_path_sessions"] == 0
    assert ort_support._custom_op_libs == ()  # registered for the command's run only


def test_a_real_custom_op_library_runs_the_model(tmp_path) -> None:
    extensions = pytest.importorskip("onnxruntime_extensions")
    model = parse(
        '<ir_version: 8, opset_import: ["" : 17, "ai.onnx.contrib" : 1]>\n'
        "g (float[3, 3] x) => (float[3, 3] y) { a = Identity(x)\n"
        "b = ai.onnx.contrib.Inverse(a)\n y = Relu(b) }"
    )
    src = tmp_path / "inv.onnx"
    onnx.save(model, src)
    lib = extensions.get_library_path()
    out = tmp_path / "inv.opt.onnx"
    r = run_cli("optimize", str(src), "-o", str(out), "--ort-custom-op-lib", lib)
    assert r.returncode == 0, r.stderr
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Inverse", "Relu"]
    r = run_cli("validate", str(out), "--reference", str(src), "--ort-custom-op-lib", lib)
    assert r.returncode == 0, r.stderr
