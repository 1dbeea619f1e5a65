"""What `optimize` writes and where: never over an input or one of the files it reads, parents
created, a model and its external data published together, one-line errors for paths that
cannot be written, staging directories of killed runs reclaimed, files with the user's umask."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from infercc import api
from infercc import outputs as outputs_mod
from infercc.errors import InferccError
from infercc.outputs import Staging, publish_files, remove_stale_staging
from tests.helpers import run_cli

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 64] x) => (float[N, 64] y) {
  a = Identity(x)
  b = Add(a, w)
  y = Mul(b, v)
}
"""


def write_model(path: Path, data: str | None = None, seed: int = 0) -> Path:
    """A model whose two 64-float weights are inline, or in the external file `data`."""
    proto = onnx.parser.parse_model(MODEL)
    rng = np.random.default_rng(seed)
    for name in ("w", "v"):
        proto.graph.initializer.append(
            numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), name)
        )
    if data is None:
        onnx.save(proto, path, format="protobuf")
    else:
        onnx.save(
            proto, path, save_as_external_data=True, location=data, size_threshold=0,
            all_tensors_to_one_file=True,
        )  # fmt: skip
    return path


def digest(*paths: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def answer(path: Path) -> np.ndarray:
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    return ort.InferenceSession(str(path)).run(None, {"x": x})[0]


# --------------------------------------------------------------------------- inputs untouched


def test_output_naming_the_inputs_external_data_is_refused(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx", data="w.onnx")
    before = digest(src, tmp_path / "w.onnx")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "w.onnx"))
    assert r.returncode == 2, r.stderr
    assert "a file the input model reads" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert digest(src, tmp_path / "w.onnx") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "w.onnx"]


def test_an_outputs_data_file_that_is_the_inputs_weights_is_refused(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx", data="o.onnx.data")
    before = digest(tmp_path / "o.onnx.data")
    with pytest.raises(InferccError, match=r"would overwrite .*o\.onnx\.data"):
        api.optimize(src, tmp_path / "o.onnx", run_validation=False, external_data=True)
    assert digest(tmp_path / "o.onnx.data") == before


def test_an_input_named_like_the_outputs_memory_plan_is_refused(tmp_path: Path) -> None:
    src = write_model(tmp_path / "o.memory_plan.json")
    before = digest(src)
    with pytest.raises(InferccError, match="the input model"):
        api.optimize(src, tmp_path / "o.onnx", run_validation=False)
    assert digest(src) == before and not (tmp_path / "o.onnx").exists()


def test_a_hard_link_to_the_input_is_the_input(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    os.link(src, tmp_path / "alias.onnx")
    with pytest.raises(InferccError, match="overwrite the input"):
        api.optimize(src, tmp_path / "alias.onnx", run_validation=False)


def test_an_artifact_directory_holding_the_input_is_refused(tmp_path: Path) -> None:
    art = tmp_path / "art"
    api.optimize(write_model(tmp_path / "m.onnx"), art, backend="none", run_validation=False)
    before = digest(art / "model.onnx")
    with pytest.raises(InferccError, match="which the input model reads"):
        api.optimize(art / "model.onnx", art, backend="none", run_validation=False)
    assert digest(art / "model.onnx") == before


def test_a_different_output_beside_external_data_works(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx", data="m.onnx.data")
    out = tmp_path / "o.onnx"
    report = api.optimize(src, out, external_data=True)
    assert report.passed and (tmp_path / "o.onnx.data").is_file()
    np.testing.assert_array_equal(answer(out), answer(src))


# --------------------------------------------------------------------------- parents


def test_missing_parent_directories_are_created(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "build" / "deep" / "m.onnx"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "build" / "deep" / "m.onnx").is_file()
    assert (tmp_path / "build" / "deep" / "m.memory_plan.json").is_file()
    api.optimize(src, tmp_path / "build2" / "art", backend="none", run_validation=False)
    assert (tmp_path / "build2" / "art" / "manifest.json").is_file()


def test_a_refused_run_creates_no_parent(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    with pytest.raises(InferccError):
        api.optimize(src, tmp_path / "new" / "o.onnx", target="no-such-target")
    assert not (tmp_path / "new").exists()


def test_a_parent_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    (tmp_path / "build").write_text("a file")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "build" / "m.onnx"))
    assert r.returncode == 2 and "is not a directory" in r.stderr, r.stderr
    assert "internal error" not in r.stderr


# --------------------------------------------------------------------------- one-line errors


def test_an_existing_data_directory_is_a_one_line_error(tmp_path: Path) -> None:
    src = write_model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    api.optimize(src, out, run_validation=False)
    before = digest(out)
    (tmp_path / "o.onnx.data").mkdir()
    r = run_cli("optimize", str(src), "-o", str(out), "--external-data")
    assert r.returncode == 2, r.stderr
    assert "o.onnx.data is a directory" in r.stderr and "internal error" not in r.stderr
    assert digest(out) == before


def test_an_unwritable_output_folder_is_a_one_line_error(tmp_path: Path, monkeypatch) -> None:
    src = write_model(tmp_path / "m.onnx")
    real = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == locked else real(p, m))
    with pytest.raises(InferccError, match="cannot write in .*locked: permission denied"):
        api.optimize(src, locked / "o.onnx")
    with pytest.raises(InferccError, match="permission denied"):
        api.optimize(src, locked / "art", backend="none")


def test_a_staging_failure_is_a_one_line_error(tmp_path: Path, monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(outputs_mod.tempfile, "mkdtemp", refuse)
    with pytest.raises(InferccError, match="cannot write in .*Permission denied"):
        api.optimize(write_model(tmp_path / "m.onnx"), tmp_path / "o.onnx")


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_external_data_that_is_not_a_file_is_named(tmp_path: Path, kind: str) -> None:
    src = write_model(tmp_path / "m.onnx", data="m.onnx.data")
    (tmp_path / "m.onnx.data").unlink()
    if kind == "directory":
        (tmp_path / "m.onnx.data").mkdir()
    else:
        os.mkfifo(tmp_path / "m.onnx.data")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"))
    assert r.returncode == 2, r.stderr
    word = "a directory" if kind == "directory" else "a FIFO (named pipe)"
    assert f"is {word}, not a regular file" in r.stderr, r.stderr
    assert "not found" not in r.stderr and "internal error" not in r.stderr


# --------------------------------------------------------------------------- publishing


def _two_files(tmp_path: Path, tag: str) -> tuple[Path, Path]:
    model, data = tmp_path / f"{tag}.model", tmp_path / f"{tag}.data"
    model.write_text(f"model {tag}")
    data.write_text(f"data {tag}")
    return model, data


def test_a_reader_never_sees_a_model_with_foreign_weights(tmp_path: Path, monkeypatch) -> None:
    out, out_data = tmp_path / "o.onnx", tmp_path / "o.onnx.data"
    out.write_text("model old")
    out_data.write_text("data old")
    new_model, new_data = _two_files(tmp_path, "new")
    seen = []
    real = os.replace

    def spy(a, b):
        seen.append((out.exists() and out.read_text(), out_data.exists() and out_data.read_text()))
        real(a, b)
        seen.append((out.exists() and out.read_text(), out_data.exists() and out_data.read_text()))

    monkeypatch.setattr(os, "replace", spy)
    publish_files([(new_model, out), (new_data, out_data)])
    assert seen[-1] == ("model new", "data new")
    for model, data in seen:  # every state a reader could meet: no model, or a matched pair
        assert model is False or (model, data) in {
            ("model old", "data old"),
            ("model new", "data new"),
        }, seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.onnx", "o.onnx.data"]


def test_a_failed_publish_leaves_the_old_files(tmp_path: Path, monkeypatch) -> None:
    out, out_data = tmp_path / "o.onnx", tmp_path / "o.onnx.data"
    out.write_text("model old")
    out_data.write_text("data old")
    new_model, new_data = _two_files(tmp_path, "new")
    real = os.replace

    def fail_on_data(a, b):
        if Path(a) == new_data:
            raise OSError(28, "No space left on device")
        real(a, b)

    monkeypatch.setattr(os, "replace", fail_on_data)
    with pytest.raises(InferccError, match="No space left.*old files are left"):
        publish_files([(new_model, out), (new_data, out_data)])
    assert out.read_text() == "model old" and out_data.read_text() == "data old"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_optimize_with_external_data_replaces_both_or_neither(tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    api.optimize(write_model(tmp_path / "a.onnx", seed=1), out, external_data=True)
    first = answer(out)
    api.optimize(write_model(tmp_path / "b.onnx", seed=2), out, external_data=True)
    np.testing.assert_array_equal(answer(out), answer(tmp_path / "b.onnx"))
    assert not np.array_equal(first, answer(out))


# --------------------------------------------------------------------------- staging, umask


def test_staging_of_a_killed_run_is_removed_by_the_next(tmp_path: Path) -> None:
    script = (
        "import os, sys, time; from infercc.outputs import Staging; "
        f"s = Staging({str(tmp_path / 'o.onnx')!r}); "
        "open(s.path / 'big', 'wb').write(b'x' * 4096); print(s.path, flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    left = Path(child.stdout.readline().strip())
    held = Staging(tmp_path / "other.onnx")  # a live run's staging: never touched
    old = time.time() - 3600
    for d in (left, held.path):
        os.utime(d, (old, old))
    assert remove_stale_staging(tmp_path) == []  # its process still holds it
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert left.is_dir()
    api.optimize(write_model(tmp_path / "m.onnx"), tmp_path / "o.onnx", run_validation=False)
    assert not left.exists() and held.path.is_dir()
    held.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "o.memory_plan.json", "o.onnx"]


def test_a_fresh_unlocked_staging_directory_is_left_alone(tmp_path: Path) -> None:
    young = tmp_path / ".infercc-lk-abc123"
    young.mkdir()
    assert remove_stale_staging(tmp_path) == []
    os.utime(young, (time.time() - 3600,) * 2)
    assert remove_stale_staging(tmp_path) == [young]
    legacy = tmp_path / ".o.onnx.infercc-abc123"  # an older infercc's: never locked
    legacy.mkdir()
    os.utime(legacy, (time.time() - 3600,) * 2)
    assert remove_stale_staging(tmp_path) == []
    os.utime(legacy, (time.time() - 2 * 86400,) * 2)
    assert remove_stale_staging(tmp_path) == [legacy]
    (tmp_path / ".infercc-notes").write_text("a file, never a staging directory")
    (tmp_path / "infercc-abc").mkdir()
    os.utime(tmp_path / "infercc-abc", (time.time() - 3600,) * 2)
    assert remove_stale_staging(tmp_path) == []


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_outputs_follow_the_umask(tmp_path: Path, mask: int) -> None:
    src = write_model(tmp_path / "m.onnx")
    previous = os.umask(mask)
    try:
        api.optimize(src, tmp_path / "o.onnx", run_validation=False, external_data=True)
        api.optimize(src, tmp_path / "build" / "art", backend="ort", tune=False)
    finally:
        os.umask(previous)
    art = tmp_path / "build" / "art"
    files = [tmp_path / n for n in ("o.onnx", "o.onnx.data", "o.memory_plan.json")]
    files += [p for p in art.iterdir() if p.is_file()]
    for p in files:
        assert p.stat().st_mode & 0o777 == 0o666 & ~mask, p
    for d in (art, tmp_path / "build"):
        assert d.stat().st_mode & 0o777 == 0o777 & ~mask, d
    assert json.loads((art / "manifest.json").read_text())["model"] == "model.onnx"


def test_atomically_written_caches_follow_the_umask(tmp_path: Path) -> None:
    from infercc.backends.trt.caches import write_atomic
    from infercc.backends.trt.calib_cache import write_calibration_cache

    previous = os.umask(0o002)
    try:
        write_calibration_cache(tmp_path / "calib.cache", {"x": 0.5})
        write_atomic(tmp_path / "timing.cache", b"bytes")
    finally:
        os.umask(previous)
    for name in ("calib.cache", "timing.cache"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o664, name


# --------------------------------------------------------------------------- what the CLI says


def test_library_warnings_stay_out_of_the_cli_output(tmp_path: Path) -> None:
    script = (
        "import logging, sys, warnings; from infercc.cli.app import library_warnings_to_log; "
        "logging.basicConfig(level=logging.DEBUG if sys.argv[1] == 'debug' else logging.WARNING);"
        "library_warnings_to_log(sys.argv[1] == 'debug'); "
        "warnings.warn('divide by zero encountered in log', RuntimeWarning)"
    )
    quiet = subprocess.run([sys.executable, "-c", script, "plain"], capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    debug = subprocess.run([sys.executable, "-c", script, "debug"], capture_output=True, text=True)
    assert "py.warnings" in debug.stderr and "RuntimeWarning: divide by zero" in debug.stderr
    src = tmp_path / "log.onnx"
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
      c = Constant <value = float[2] {-1, 0}> ()
      l = Log(c)
      y = Add(x, l)
    }
    """
    onnx.save(onnx.parser.parse_model(text), src)
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json")
    assert r.returncode in (0, 1) and r.stderr == "", r.stderr
    assert json.loads(r.stdout)["passes"]["fold-constants"]


def test_a_graph_outputs_doc_string_survives_its_identity(tmp_path: Path) -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
      r = Relu(x)
      y = Identity(r)
    }
    """
    proto = onnx.parser.parse_model(text)
    proto.graph.output[0].doc_string = "probabilities, summing to 1"
    proto.graph.output[0].metadata_props.add(key="unit", value="probability")
    proto.graph.input[0].metadata_props.add(key="layout", value="N")
    onnx.save(proto, tmp_path / "m.onnx")
    report = api.optimize(tmp_path / "m.onnx", tmp_path / "o.onnx")
    assert report.ops_after == {"Relu": 1}
    out = onnx.load(tmp_path / "o.onnx")
    onnx.checker.check_model(out)
    assert out.graph.output[0].name == "y"
    assert out.graph.output[0].doc_string == "probabilities, summing to 1"
    assert [(p.key, p.value) for p in out.graph.output[0].metadata_props] == [
        ("unit", "probability")
    ]
    assert [(p.key, p.value) for p in out.graph.input[0].metadata_props] == [("layout", "N")]


def test_a_declared_dim_of_1e12_is_a_one_line_error(tmp_path: Path) -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1000000000000, 8] x) => (float[1000000000000, 8] y) {
      y = Relu(x)
    }
    """
    onnx.save(onnx.parser.parse_model(text), tmp_path / "m.onnx")
    r = run_cli("optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "internal error" not in r.stderr
    assert "validation inputs need 87.3 TiB" in r.stderr and "[1000000000000, 8]" in r.stderr
    assert "--no-validate" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    assert run_cli("optimize", str(tmp_path / "m.onnx"), "--no-validate").returncode == 0


def test_feed_memory_is_checked_against_the_machine() -> None:
    from infercc.data.feeds import check_feed_memory

    small = {"x": ((4, 8), np.dtype(np.float32)), "ids": ((4, 8), np.dtype(np.int64))}
    check_feed_memory(small, memory=4 * 32 * 12 + 4 * 8 * 8)  # exactly what they need
    with pytest.raises(InferccError, match=r"input 'x' has shape \[4, 8\]"):
        check_feed_memory(small, memory=600)


def test_the_roofline_plot_creates_its_folder(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from infercc.analysis.roofline import analyze, plot_roofline
    from infercc.analysis.targets import get_target
    from infercc.ir import load_model

    target = get_target("cpu")
    src = write_model(tmp_path / "m.onnx")
    report = analyze(load_model(src), target, {"x": (2, 64)})
    out = plot_roofline(report, target, tmp_path / "plots" / "roof.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "plots" / "dir.png").mkdir()
    with pytest.raises(InferccError, match="is a directory"):
        plot_roofline(report, target, tmp_path / "plots" / "dir.png")
