"""Where infercc writes: output paths checked before any work, staging directories, publishing.

- `check_output_file` / `check_output_dir` refuse, before anything is read or built, an output
  that cannot be written: a directory where a file goes, a file where a directory goes, a
  parent that is a file, a folder without write permission. Missing parent directories are
  not an error: `make_parents` creates them when the first file is written (as trtexec and
  Olive do), so a refused run writes nothing (and a staging directory removes those it made
  when nothing was published in them).
- `Staging` is a temporary directory beside the destination (same file system, so publishing
  is a rename), created with the user's umask (not mkdtemp's 0700), named with its process id
  (`.infercc-lk-<pid>-*`) and locked (`flock`) while its process lives. A process killed with
  SIGKILL cannot remove its staging directory: the next run that stages in the same folder
  removes every staging directory whose lock is free and whose process is gone, however
  young (a live process's directory, even between its creation and its lock, is never
  taken: the pid says the process lives). Each staging directory is also registered in the
  cache root (`staging/<pid>-*.path`, one line: the directory), and every CLI run and every
  new staging directory reclaims those of dead processes wherever they are
  (`reclaim_registered`): a killed run's hundreds of MB go with the next run of any kind, not
  only the next one in that folder.
- `publish_files` moves a model, its external data and its side files into place so that a
  reader never sees a model with weights that are not its own: the old model is moved aside
  first (a reader then finds no model, never a mismatched pair), the new data goes in, then
  the new model. Any failure, Ctrl-C included, puts the old files back.
- `record_written` / `written_files`: what this process has put in place, so that a run
  interrupted (Ctrl-C) says truly whether it wrote anything.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from infercc.errors import InferccError
from infercc.util import first_line

try:  # POSIX; elsewhere staging directories are not locked and never reclaimed
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

STAGING_MARK = "infercc-lk-"
# Staging directories of infercc versions that locked them but did not name their process: one
# younger than this is left alone even when its lock is free (its process may be between
# creating it and locking it).
STALE_AFTER_S = 60.0
# Staging directories of infercc versions that did not lock them: reclaimed only when older
# than a day (such a version may still be running).
UNLOCKED_STALE_AFTER_S = 86400.0
_STAGING_NAME = re.compile(r"^\.(?:.+\.)?infercc-(lk-)?(?:(\d+)-)?[A-Za-z0-9_]+$")
# This process's staging directories are created (mkdtemp, then flock) under this lock, and
# reclaimed under it, so none is taken between its creation and its lock.
_CREATING = threading.Lock()


# --------------------------------------------------------------------------- what was written

_WRITTEN: list[Path] = []


def record_written(*paths: str | os.PathLike[str]) -> None:
    """Note outputs this process has put in place (published files, artifact directories);
    a file put in a staging directory is not one (the directory goes when the run ends)."""
    for path in map(Path, paths):
        if not any(is_staging_name(part) for part in path.parent.parts):
            _WRITTEN.append(path)


def written_files() -> list[Path]:
    """What this process has put in place since `forget_written()`, in order."""
    return list(_WRITTEN)


def forget_written() -> None:
    """Start a new record (a CLI run starts with nothing written)."""
    _WRITTEN.clear()


# --------------------------------------------------------------------------- permissions


def umask() -> int:
    """The process's umask, read without changing it where the kernel says it (Linux)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    current = os.umask(0o022)  # elsewhere: set and restore (briefly racy, as everyone does)
    os.umask(current)
    return current


def umask_mode(mode: int = 0o666) -> int:
    """`mode` as the user's umask lets a new file (0o666) or directory (0o777) be."""
    return mode & ~umask()


# --------------------------------------------------------------------------- checks


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_parent(path: Path, flag: str) -> None:
    """The folder `path` goes into exists and is writable, or can be created."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise InferccError(
            f"{base} is not a directory, so {path} cannot be written", flag_hint(flag)
        )
    if not os.access(base, os.W_OK | os.X_OK):
        raise InferccError(
            f"cannot write in {base}: permission denied",
            f"{flag_hint(flag)} in a folder you can write",
        )


def flag_hint(flag: str) -> str:
    return f"pick another {flag} path" if flag else "pick another path"


def check_output_file(path: str | os.PathLike[str], flag: str = "") -> Path:
    """An output file that can be written (its missing parents will be created)."""
    path = Path(path)
    if path.is_dir():
        raise InferccError(f"{path} is a directory, where a file is to be written", flag_hint(flag))
    _check_parent(path, flag)
    return path


def check_output_dir(path: str | os.PathLike[str], flag: str = "") -> Path:
    """An output directory that can be created or replaced (its missing parents too)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InferccError(f"{path} exists and is not a directory", flag_hint(flag))
    _check_parent(path, flag)
    return path


def make_parents(path: str | os.PathLike[str]) -> list[Path]:
    """Create the missing parent directories of `path` (with the user's umask); returns
    those created, deepest first."""
    parent = Path(path).parent
    missing = []
    for folder in (parent, *parent.parents):
        if folder.exists():
            break
        missing.append(folder)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InferccError(
            f"cannot create directory {parent}: {first_line(exc)}", "pick another output path"
        ) from exc
    return missing


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write a text file under a temporary name and rename it (parents created)."""
    path = Path(path)
    make_parents(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        record_written(path)
    except OSError as exc:
        raise InferccError(f"cannot write {path}: {first_line(exc)}", "pick another path") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


# --------------------------------------------------------------------------- staging


class Staging:
    """A locked temporary directory beside `destination`; `close()` unlocks (and removes it
    unless `keep`). Usable as a context manager."""

    def __init__(self, destination: str | os.PathLike[str], name: str | None = None):
        dest = Path(destination)
        parent = dest.parent
        self._created = make_parents(dest)  # removed again if nothing is published in them
        remove_stale_staging(parent)
        mark = f"{STAGING_MARK}{os.getpid()}-"
        prefix = f".{name}.{mark}" if name else f".{mark}"
        with _CREATING:
            try:
                self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
                os.chmod(self.path, umask_mode(0o777))
            except OSError as exc:
                raise InferccError(
                    f"cannot write in {parent}: {first_line(exc)}",
                    "pick an output path in a folder you can write",
                ) from exc
            self._fd: int | None = _lock(self.path)
            self._entry = _register(self.path)
        reclaim_registered()

    def unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Remove the directory (whatever is left in it) and release the lock, and the
        folders made for it that are still empty (a run that published nothing, failed or
        interrupted, leaves nothing behind)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.unlock()
        if self._entry is not None:
            with contextlib.suppress(OSError):
                self._entry.unlink()
            self._entry = None
        for folder in self._created:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock(directory: Path) -> int | None:
    """An exclusive flock on the directory itself (no file inside it), held until closed."""
    if fcntl is None:
        return None
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def is_staging_name(name: str) -> bool:
    return bool(_STAGING_NAME.match(name))


def _stale_after(name: str) -> float:
    """How old a staging directory of a free lock must be before it is taken: at once when
    its process is named and gone (or is this one: `_CREATING` covers its window), never
    while another live process is named, else by the age rules of older versions."""
    match = _STAGING_NAME.match(name)
    if match is None or not match.group(1):
        return UNLOCKED_STALE_AFTER_S
    if match.group(2) is None:
        return STALE_AFTER_S
    pid = int(match.group(2))
    if pid == os.getpid() or not _alive(pid):
        return 0.0
    return math.inf


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stale_staging(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the staging directories in `folder` that no live process holds (a run killed
    with SIGKILL leaves its own behind); returns those removed."""
    folder = Path(folder)
    if fcntl is None or not folder.is_dir():
        return []
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    now = time.time()
    with _CREATING:
        for entry in entries:
            if not is_staging_name(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < _stale_after(entry.name):
                    continue
            except OSError:
                continue
            if _reclaim(Path(entry.path)):
                removed.append(Path(entry.path))
    return removed


def _reclaim(directory: Path) -> bool:
    """Remove `directory` if its lock is free (its process is gone); False if held."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live process holds it
        shutil.rmtree(directory, ignore_errors=True)
        log.info("removed %s, left behind by a process that was killed", directory)
        return not directory.exists()
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the registry

REGISTRY = "staging"
_ENTRY_NAME = re.compile(r"^(\d+)-[A-Za-z0-9_]+\.path$")


def registry_dir() -> Path:
    """Where staging directories are registered: `<cache root>/staging`."""
    from infercc.util import cache_root

    return cache_root() / REGISTRY


def _register(directory: Path) -> Path | None:
    """Note `directory` in the registry (best effort: a cache root that cannot be written
    leaves only the same-folder reclaim)."""
    try:
        reg = registry_dir()
        reg.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{os.getpid()}-", suffix=".path", dir=reg)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(str(directory.resolve()) + "\n")
        return Path(name)
    except OSError:
        return None


def reclaim_registered() -> list[Path]:
    """Remove the registered staging directories whose process is gone (and their entries);
    returns the directories removed. Never raises: housekeeping must not fail a run."""
    removed: list[Path] = []
    if fcntl is None:
        return removed
    try:
        entries = list(os.scandir(registry_dir()))
    except OSError:
        return removed
    for entry in entries:
        match = _ENTRY_NAME.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        try:
            directory = Path(Path(entry.path).read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            directory = None
        with _CREATING:
            if (
                directory is not None
                and is_staging_name(directory.name)
                and directory.is_dir()
                and not directory.is_symlink()
                and _reclaim(directory)
            ):
                removed.append(directory)
        if directory is None or not directory.exists():
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return removed


# --------------------------------------------------------------------------- publishing


def check_replaceable(dest: Path) -> None:
    """A file infercc is about to put in place may replace a file, never a directory."""
    if dest.is_dir() and not dest.is_symlink():
        raise InferccError(
            f"{dest} is a directory, where infercc writes a file",
            "remove it, or pick another -o path",
        )


def publish_files(moves: Sequence[tuple[Path, Path]]) -> list[Path]:
    """Move staged files to their destinations; `moves[0]` is the model (the entry point that
    names the others). A reader sees the old model with its own data, no model, or the new
    model with its own data, never a mix; on failure the old files are back in place."""
    for _src, dest in moves:
        check_replaceable(dest)
    pid = os.getpid()
    backups: list[tuple[Path, Path]] = []  # (dest, backup)
    placed: list[Path] = []
    try:
        for _src, dest in moves:  # the model first: from here on, no old model is visible
            if dest.exists() or dest.is_symlink():
                backup = dest.with_name(f".{dest.name}.old-{pid}")
                os.replace(dest, backup)
                backups.append((dest, backup))
        for src, dest in [*moves[1:], moves[0]]:  # the model last
            os.replace(src, dest)
            placed.append(dest)
    except OSError as exc:
        _undo(placed, backups)
        raise InferccError(
            f"cannot write {moves[0][1]}: {first_line(exc)}; the old files are left as they were",
            "check the output folder (space, permissions), or pick another -o path",
        ) from exc
    except BaseException:  # Ctrl-C between two moves: no half-published model
        _undo(placed, backups)
        raise
    for _dest, backup in backups:
        with contextlib.suppress(OSError):
            backup.unlink()
    record_written(*(dest for _src, dest in moves))
    return [dest for _src, dest in moves]


def _undo(placed: list[Path], backups: list[tuple[Path, Path]]) -> None:
    restored = {dest for dest, _b in backups}
    for dest in placed:
        if dest not in restored:
            with contextlib.suppress(OSError):
                dest.unlink()
    for dest, backup in reversed(backups):  # the model last, as it was taken first
        with contextlib.suppress(OSError):
            os.replace(backup, dest)
