"""Native code that hostile input can crash, run where a crash is a one-line error.

onnx's shape inference is C++: a Slice with step 2**31-1 can make it segfault, one with step
2**62 grows the process by some 300 MB a second until the kernel kills it. `call_forked(fn,
*args)` runs `fn(*args)` in a forked child (it sees the parent's memory as it is, so nothing is
serialized on the way in) whose address space may grow by at most `memory_allowance()` bytes
beyond the parent's; the result comes back pickled through a pipe. When the child dies,
`ChildCrashed` says how (the signal, or an exit status), and the caller turns that into an
error naming what it was doing.

`call_isolated` does the same in a fork server: one child forked on first use and reused, so
that a build pays one fork, not one per inference (a fork of a busy process can take 10 ms).
Where `os.fork` does not exist (Windows), `fn` runs in-process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import pickle
import signal
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

# How far a child's address space may grow beyond its parent's (bytes); None: half of this
# machine's memory, at most 4 GiB. Shape inference of a weightless skeleton needs far less.
MEMORY_ALLOWANCE: int | None = None
_MAX_ALLOWANCE = 4 * 2**30
ENABLED = hasattr(os, "fork")


class ChildCrashed(Exception):
    """The forked child ended without an answer; `returncode` as `subprocess` gives it."""

    def __init__(self, returncode: int):
        super().__init__(describe(returncode))
        self.returncode = returncode

    def describe(self) -> str:
        return describe(self.returncode)


def describe(returncode: int) -> str:
    """ "killed by SIGSEGV", "ran out of memory (exit status 127)", ..."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = ", out of memory?" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{why}"
    if returncode == _OUT_OF_MEMORY:
        return f"ran out of memory (allowed {memory_allowance() / 2**30:.1f} GiB)"
    if returncode in (127, 134):  # glibc's exit when it cannot allocate, abort()'s
        return f"aborted (exit status {returncode}: out of memory?)"
    return f"exited with status {returncode}"


_OUT_OF_MEMORY = 75  # what the child exits with on MemoryError (EX_TEMPFAIL)


def memory_allowance() -> int:
    if MEMORY_ALLOWANCE is not None:
        return MEMORY_ALLOWANCE
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return _MAX_ALLOWANCE
    return min(_MAX_ALLOWANCE, physical // 2)


@contextlib.contextmanager
def allowance(nbytes: int) -> Iterator[None]:
    """`MEMORY_ALLOWANCE` set to `nbytes` for a block (children forked in it get that)."""
    global MEMORY_ALLOWANCE
    previous, MEMORY_ALLOWANCE = MEMORY_ALLOWANCE, nbytes
    try:
        yield
    finally:
        MEMORY_ALLOWANCE = previous


def _address_space() -> int | None:
    """This process's virtual size in bytes (Linux), None where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _cap_memory(allowance: int) -> None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    current = _address_space()
    if current is None:
        return
    limit = current + allowance
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft == resource.RLIM_INFINITY or limit < soft:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def call_forked(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a forked, memory-capped child; its result, or what it raised (re-raised
    here); `ChildCrashed` when the child dies without answering."""
    if not ENABLED:
        return fn(*args)
    allowance = memory_allowance()
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns on fork() with threads: the child
        warnings.simplefilter("ignore", DeprecationWarning)  # runs no other thread's code
        pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running the parent's cleanup
        os.close(read_end)
        _child(write_end, allowance, fn, args)
    os.close(write_end)
    try:
        data = _read_all(read_end)
    finally:
        os.close(read_end)
        returncode = _wait(pid)
    if not data:
        raise ChildCrashed(returncode)
    status, value = pickle.loads(data)
    if status == "error":
        raise value
    return value


class ForkServer:
    """A forked child that runs calls one at a time, started on the first call and reused
    (one fork per process, not per call); if it dies, the call raises `ChildCrashed` and the
    next call forks a fresh one. The child's address space may grow by `memory_allowance()`
    beyond the parent's size when it was forked. Thread-safe (calls are serialized)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._conn: Connection | None = None
        self._allowance: int | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not ENABLED:
            return fn(*args)
        with self._lock:
            self._ensure_started()
            conn = self._conn
            assert conn is not None
            try:
                conn.send_bytes(pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL))
                data = conn.recv_bytes()
            except (EOFError, OSError):
                raise ChildCrashed(self._reap()) from None
            except BaseException:
                self.close()
                raise
        status, value = pickle.loads(data)
        if status == "error":
            raise value
        return value

    def _ensure_started(self) -> None:
        allowance = memory_allowance()
        if self._pid is not None and self._allowance == allowance and self._alive():
            return
        self.close()
        parent, child = socket.socketpair()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            parent.close()
            _serve(child.detach(), allowance)
        child.close()
        self._pid, self._allowance = pid, allowance
        self._conn = Connection(parent.detach())

    def _alive(self) -> bool:
        assert self._pid is not None
        try:
            done, _ = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if done:
            self._pid = None
        return not done

    def _reap(self) -> int:
        pid, self._pid = self._pid, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if pid is None:
            return 0
        return _wait(pid)

    def close(self) -> None:
        """End the child (if any): killed, then reaped."""
        if self._pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self._pid, signal.SIGKILL)
        self._reap()


_SERVER = ForkServer()


def call_isolated(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in this process's fork server (see `ForkServer`)."""
    return _SERVER.call(fn, *args)


def reset() -> None:
    """End the fork server; the next `call_isolated` forks a fresh one (seeing the process's
    state as it is then: monkeypatched functions, a changed MEMORY_ALLOWANCE)."""
    _SERVER.close()


def _serve(fd: int, allowance: int) -> None:
    """The fork server's loop: answer requests until the parent closes the socket."""
    code = 0
    try:
        # No PR_SET_PDEATHSIG: it fires when the forking *thread* ends. When the parent dies,
        # its end of the socket closes and the loop below ends.
        os.closerange(3, fd)  # inherited files (a staging directory's lock) stay the parent's
        os.closerange(fd + 1, _max_fd())
        if faulthandler.is_enabled():
            faulthandler.disable()
        _cap_memory(allowance)
        conn = Connection(fd)
        while True:
            try:
                request = conn.recv_bytes()
            except EOFError:
                break
            try:
                fn, args = pickle.loads(request)
                answer: tuple[str, Any] = ("ok", fn(*args))
            except MemoryError:
                code = _OUT_OF_MEMORY
                break
            except Exception as exc:
                answer = ("error", _picklable(exc))
            conn.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (AttributeError, ValueError, OSError):
        return 1024


def _child(fd: int, allowance: int, fn: Callable[..., Any], args: tuple) -> None:
    code = 0
    try:
        if faulthandler.is_enabled():  # a crash here is reported by the parent, in one line
            faulthandler.disable()
        _cap_memory(allowance)
        try:
            answer: tuple[str, Any] = ("ok", fn(*args))
        except MemoryError:
            code = _OUT_OF_MEMORY
            os._exit(code)
        except Exception as exc:
            answer = ("error", _picklable(exc))
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
