"""Staging left behind by a killed run is removed by the next run at once: a staging directory
names its process, so a free lock and a gone process suffice, whatever its age (it used to
wait until the directory was 60 s old)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from infercc.outputs import (
    STAGING_MARK,
    Staging,
    reclaim_registered,
    registry_dir,
    remove_stale_staging,
)


def _child(tmp_path: Path, hold: bool) -> tuple[subprocess.Popen, Path]:
    """A process that made a staging directory (locked, or only named after it) and waits."""
    make = (
        f"s = Staging({str(tmp_path / 'o.onnx')!r}); p = s.path"
        if hold
        else f"p = Path({str(tmp_path)!r}) / f'.{STAGING_MARK}{{os.getpid()}}-abc'; p.mkdir()"
    )
    script = (
        "import os, sys; from pathlib import Path; from infercc.outputs import Staging\n"
        f"{make}\nprint(p, flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return child, Path(child.stdout.readline().strip())


def _end(child: subprocess.Popen, kill: bool) -> None:
    if kill:
        child.send_signal(signal.SIGKILL)
    else:
        child.stdin.close()
    child.wait()
    child.stdout.close()
    if child.stdin and not child.stdin.closed:
        child.stdin.close()


def test_a_killed_runs_fresh_staging_is_removed_by_the_next_run(tmp_path: Path) -> None:
    child, left = _child(tmp_path, hold=True)
    assert left.name.startswith(f".{STAGING_MARK}{child.pid}-")
    assert remove_stale_staging(tmp_path) == []  # held by a live process
    _end(child, kill=True)
    assert left.is_dir()
    with Staging(tmp_path / "next.onnx") as mine:  # seconds old, not 60
        assert not left.exists() and mine.path.is_dir()
    assert list(tmp_path.iterdir()) == []


def test_a_live_process_directory_is_kept_even_unlocked(tmp_path: Path) -> None:
    """Between its creation and its lock, a staging directory is only named: its process lives,
    so it stays; once that process is gone it goes."""
    child, named = _child(tmp_path, hold=False)
    try:
        assert remove_stale_staging(tmp_path) == []
        assert named.is_dir()
    finally:
        _end(child, kill=False)
    assert remove_stale_staging(tmp_path) == [named]


def test_this_process_directories_go_once_unlocked(tmp_path: Path) -> None:
    held = Staging(tmp_path / "a.onnx")
    assert held.path.name.startswith(f".{STAGING_MARK}{os.getpid()}-")
    assert remove_stale_staging(tmp_path) == []
    held.unlock()
    assert remove_stale_staging(tmp_path) == [held.path]


def test_a_killed_runs_staging_is_reclaimed_by_a_run_in_another_folder(tmp_path: Path) -> None:
    """The registry in the cache root: a run of any kind, anywhere, takes a killed run's
    staging (and its registry entry); a live one's stays registered and in place."""
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    out_a.mkdir()
    out_b.mkdir()
    child, left = _child(out_a, hold=True)
    entries = list(registry_dir().glob(f"{child.pid}-*.path"))
    assert [Path(e.read_text().strip()) for e in entries] == [left.resolve()]
    assert reclaim_registered() == []  # its process lives
    _end(child, kill=True)
    assert left.is_dir()
    with Staging(out_b / "x.onnx") as mine:
        assert not left.exists()
        assert list(registry_dir().glob(f"{child.pid}-*.path")) == []
        own = [
            e
            for e in registry_dir().glob(f"{os.getpid()}-*.path")
            if Path(e.read_text().strip()) == mine.path.resolve()
        ]
        assert len(own) == 1 and mine.path.is_dir()  # its own entry, until closed
    assert not own[0].exists()
    assert list(out_a.iterdir()) == [] and list(out_b.iterdir()) == []


def test_the_cli_reclaims_registered_staging_on_every_command(tmp_path: Path) -> None:
    child, left = _child(tmp_path, hold=True)
    _end(child, kill=True)
    done = subprocess.run(
        [sys.executable, "-m", "infercc", "targets"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert not left.exists()
