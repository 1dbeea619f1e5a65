"""A child process that runs one call at a time for its parent, so that a crash in native code
(a segfault in onnxruntime, the kernel's out-of-memory killer) ends the child, not the parent.

`infercc ci` builds, validates and times every model in an `Isolated` child (one per
worker): a model that crashes fails alone, and the next model gets a fresh child.
`infercc ci --ray` runs each model's build inside a Ray task; the task hands the build to an
`Isolated` child. When the child dies, the task survives and returns the model's failure with
the signal that killed the child (`ChildDied.describe()`), and the driver decides whether to
retry (once, on another node). Ray's own retries (`max_retries`) are then left for what they
are for: a task whose worker or node was lost.

The child is `python -m infercc.ci.isolate FD`: it reads `(function, args)` pickles from the
socket FD and answers `("ok", value)` or `("error", exception)`. Functions travel by reference
(module and name), so they must be importable in the child, as `spawn` needs them to be. On
Linux the child asks the kernel to kill it when its parent dies (`PR_SET_PDEATHSIG`), so a
Ray worker killed by `ray.cancel(force=True)` or a lost node leaves no orphan build running.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class ChildDied(Exception):
    """The child process ended while it ran a call; `returncode` as `subprocess` gives it."""

    def __init__(self, returncode: int | None):
        super().__init__(describe_exit(returncode))
        self.returncode = returncode

    def describe(self) -> str:
        return describe_exit(self.returncode)


def describe_exit(returncode: int | None) -> str:
    """ "killed by SIGSEGV (signal 11)", "killed by SIGKILL (signal 9: out of memory?)", ..."""
    if returncode is None:
        return "ended without an exit status"
    if returncode >= 0:
        return f"exited with status {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    why = ": out of memory, or killed from outside?" if number == signal.SIGKILL else ""
    return f"killed by {name} (signal {number}{why})"


class Isolated:
    """A long-lived child process; `call(fn, *args)` runs `fn(*args)` in it.

    The child starts on the first call and is reused, so the imports a build needs
    (onnxruntime, onnx) are paid once per parent. If it died, the next call starts another.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._env_key: str | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in the child; raises `ChildDied` if the child ends before it answers,
        and re-raises what `fn` raised. An interrupt (e.g. `ray.cancel`) kills the child."""
        self._ensure_started()
        try:
            self._conn.send((fn, args))
            status, value = self._conn.recv()
        except (EOFError, OSError):
            raise ChildDied(self._reap()) from None
        except BaseException:
            self.close(kill=True)
            raise
        if status == "error":
            raise value
        return value

    def _ensure_started(self) -> None:
        env_key = os.environ.get("CUDA_VISIBLE_DEVICES")
        alive = self._proc is not None and self._proc.poll() is None
        if alive and env_key == self._env_key:
            return
        self.close(kill=True)
        parent, child = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "infercc.ci.isolate", str(child.fileno()), str(os.getpid())],
                pass_fds=(child.fileno(),),
            )
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._env_key = env_key

    def _reap(self) -> int | None:
        proc, self._proc = self._proc, None
        self._close_conn()
        if proc is None:
            return None
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def kill(self) -> None:
        """Kill the child now, from any thread; a call waiting on it raises `ChildDied`."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()

    def close(self, kill: bool = False) -> None:
        """End the child: politely (EOF, it exits) or, with `kill`, at once."""
        proc, self._proc = self._proc, None
        self._close_conn()
        if proc is None:
            return
        if kill:
            proc.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- the child


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(1)


def _answer(request: bytes) -> tuple[str, Any]:
    try:
        fn, args = pickle.loads(request)
        return "ok", fn(*args)
    except Exception as exc:  # handed to the parent, which raises it there
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return "error", exc


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group; the parent decides what an interrupt means
    # (it kills this child and reports the model as cancelled), so the child ignores it
    # rather than die mid-call and look like a crash.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.captureWarnings(True)  # numpy's RuntimeWarnings and the like: log records, not
    logging.getLogger("py.warnings").setLevel(logging.ERROR)  # lines in the ci output
    conn = Connection(fd)
    while True:
        try:
            request = conn.recv_bytes()
        except EOFError:
            return 0
        conn.send(_answer(request))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
