"""Staging left behind by a killed run is removed by the next run at once: a staging directory
names its process, so a free lock and a gone process suffice, whatever its age (it used to
wait until the directory was 60 s old)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from infercc.outputs import STAGING_MARK, Staging, remove_stale_staging


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
