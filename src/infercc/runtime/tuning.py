"""The per-shape autotuning cache: what a backend learned by tuning, kept on disk across runs.

Tuning (trying kernels, tactics, session settings for one model at one set of input shapes) is
slow, and its answer only holds for the exact thing that was tuned. So an entry is keyed by
everything that can change the answer (`CacheKey`): the model's content hash, the concrete
input shapes (canonical JSON, so dict order does not matter), the backend and its version, the
execution provider, and a fingerprint of the host (`host_fingerprint`: CPU model and features,
cores, OS, machine, onnxruntime and numpy versions). The key's `digest()` (sha256 of those
fields) is the primary key; the value is a JSON object the backend chooses.

Storage is one SQLite database, `tuning.sqlite`, in the cache directory (`default_cache_dir`):

- WAL mode and a 30 s busy timeout, so several processes tuning at once read without blocking
  and queue their writes instead of failing; each write is its own short `BEGIN IMMEDIATE`
  transaction, so nothing is lost and nothing is half-written. A connection belongs to the
  process that opened it: after a fork the child opens its own.
- The schema version lives in `PRAGMA user_version`. A database this code cannot trust (not a
  database, truncated, an unknown version, another program's tables, a directory in its place,
  unreadable) is moved aside to `tuning.sqlite.corrupt-<UTC timestamp>` with its -wal/-shm
  files, a warning names the moved file, and a fresh database takes its place. Recovery runs
  under a lock file and re-checks first, so two processes never both move a database aside.
- `TuningCache(directory, read_only=True)` (what `infercc cache ls/show/export` open) never
  creates, converts, moves aside or writes anything: a missing database reads as an empty
  cache (`exists` False), the file is opened with SQLite's `mode=ro`, lookups do not count
  hits, and a database it cannot trust is an error naming the file.
- If the directory cannot be written, the cache warns and lives in memory: tuning still works,
  only its results are not kept. The cache is an optimization and is never fatal to a compile;
  `get`/`put` turn database trouble into a warning and a miss. The maintenance calls (`entries`,
  `clear`, `export`, `import_`) raise `InferccError` instead, since a user asked for them.

Export files are JSON objects with `"schema": "infercc.tuning_cache/1"` and an `entries` list;
import merges them, keeping the entry with the newer `created` time on conflicts; `merge` does
the same for entries held in memory (`infercc ci --ray` brings each worker's new entries home
that way). Times are seconds since the epoch (UTC).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import math
import os
import platform
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from infercc.errors import InferccError
from infercc.util import cache_root

log = logging.getLogger(__name__)

DB_NAME = "tuning.sqlite"
SCHEMA_VERSION = 1
EXPORT_SCHEMA = "infercc.tuning_cache/1"
BUSY_TIMEOUT_S = 30.0
HASH_CHUNK = 8 * 2**20

KEY_FIELDS = ("model_hash", "shapes", "backend", "backend_version", "provider", "fingerprint")
STAT_FIELDS = ("created", "last_used", "hits", "tuning_seconds")
ENTRY_COLUMNS = ("digest", *KEY_FIELDS, *STAT_FIELDS)

_CREATE_TABLE = """
CREATE TABLE entries (
    digest TEXT PRIMARY KEY,
    model_hash TEXT NOT NULL,
    shapes TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    provider TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL,
    hits INTEGER NOT NULL DEFAULT 0,
    tuning_seconds REAL NOT NULL DEFAULT 0
)
"""
_TABLE_COLUMNS = frozenset((*ENTRY_COLUMNS, "value"))
_MERGE = f"""
INSERT INTO entries ({", ".join((*ENTRY_COLUMNS, "value"))})
VALUES ({", ".join("?" * (len(ENTRY_COLUMNS) + 1))})
ON CONFLICT(digest) DO UPDATE SET
    value = excluded.value, created = excluded.created, last_used = excluded.last_used,
    hits = excluded.hits, tuning_seconds = excluded.tuning_seconds
WHERE excluded.created > entries.created
"""

R = TypeVar("R")


# --- Locations and hashes -----------------------------------------------------------------------


def default_cache_dir() -> Path:
    """`$INFERCC_CACHE_DIR`, else `$XDG_CACHE_HOME/infercc`, else the platform's user cache
    directory (`infercc.util.cache_root`: ~/.cache/infercc on Linux)."""
    return cache_root()


def file_sha256(path: Path | str, chunk: int = HASH_CHUNK) -> str:
    """sha256 hex digest of a file, read `chunk` bytes at a time into one reused buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def fingerprint_hash(d: Mapping[str, Any]) -> str:
    """Short (16 hex) sha256 of the canonical JSON of `d`, for `CacheKey.fingerprint`."""
    return hashlib.sha256(_canonical_json(d).encode()).hexdigest()[:16]


def host_fingerprint() -> dict[str, Any]:
    """What about this host can change a tuning answer, as JSON-able data.

    CPU model, features and cores come from `infercc.analysis.targets`' cached host detection (not
    `detect_cpu()`, which would also measure memory bandwidth). The clock is left out (it
    drifts between reads of /proc/cpuinfo), and so is the kernel release (it changes with every
    update and not the kernels' behaviour).
    """
    from infercc.analysis import targets

    info, cores = targets.host_cpu_info()
    return {
        "cpu_model": info.model,
        "cpu_features": list(info.features),
        "cpu_class": None if info.row is None else info.row.name,
        "cores": cores,
        "os": platform.system(),
        "machine": platform.machine(),
        "onnxruntime": _module_version("onnxruntime"),
        "numpy": _module_version("numpy"),
    }


def _module_version(name: str) -> str | None:
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    return str(getattr(module, "__version__", "unknown"))


# --- Keys ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheKey:
    """Everything a tuning answer depends on; `digest()` is the database key."""

    model_hash: str
    shapes: str
    backend: str
    backend_version: str
    provider: str
    fingerprint: str

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), str):
                raise TypeError(f"CacheKey.{f.name} must be a str, got {getattr(self, f.name)!r}")

    @staticmethod
    def canonical_shapes(shapes: Mapping[str, Sequence[int]]) -> str:
        """`{input: [dims]}` as JSON with sorted keys and no spaces; dims must be integers."""
        out: dict[str, list[int]] = {}
        for name, dims in shapes.items():
            try:
                out[str(name)] = [_as_dim(d) for d in dims]
            except (TypeError, ValueError):
                raise ValueError(f"input {name!r}: shape {dims!r} is not a list of ints") from None
        return _canonical_json(out)

    def digest(self) -> str:
        """sha256 hex of the canonical JSON of the key fields."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode()).hexdigest()

    def to_dict(self) -> dict[str, str]:
        return dict(zip(KEY_FIELDS, astuple(self), strict=True))


def _as_dim(d: Any) -> int:
    if isinstance(d, bool) or int(d) != d:
        raise ValueError(d)
    return int(d)


# --- Opening, checking, recovering ----------------------------------------------------------------


_WRITES = ("store", "clear", "import")  # what `_run` refuses on a read-only cache


class _Unusable(Exception):
    """The database file exists but is not a tuning cache this code can trust."""


def _connect(target: str, uri: bool = False) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write says BEGIN IMMEDIATE itself.
    return sqlite3.connect(
        target, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False, uri=uri
    )


def _open_read_only(path: Path) -> sqlite3.Connection:
    """The database at `path`, opened read-only, its schema checked without writing (an
    empty file reads as an empty cache). Raises `_Unusable` or sqlite3 errors."""
    if not path.is_file():
        raise _Unusable("not a regular file")
    uri = path.resolve().as_uri()
    try:
        conn = _connect(f"{uri}?mode=ro", uri=True)
        conn.execute("PRAGMA user_version").fetchone()
    except sqlite3.OperationalError:  # a WAL database in a directory we cannot write
        conn = _connect(f"{uri}?mode=ro&immutable=1", uri=True)
    try:
        version = _user_version(conn)
        if version == 0 and not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            conn.close()
            return _open_memory()
        if version != SCHEMA_VERSION:
            raise _Unusable(f"schema version {version}, this infercc knows {SCHEMA_VERSION}")
        columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
        if columns != _TABLE_COLUMNS:
            raise _Unusable(f"entries table has columns {sorted(columns)}")
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """A short write transaction: takes the write lock up front (waits up to the timeout)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _user_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the table in an empty database; raise `_Unusable` for anything unknown."""
    if _user_version(conn) == 0:
        with _transaction(conn):  # re-read under the lock: another process may have created it
            if _user_version(conn) == 0:
                if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise _Unusable("user_version 0 and tables of another program")
                conn.execute(_CREATE_TABLE)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    version = _user_version(conn)
    if version != SCHEMA_VERSION:
        raise _Unusable(f"schema version {version}, this infercc knows {SCHEMA_VERSION}")
    columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
    if columns != _TABLE_COLUMNS:
        raise _Unusable(f"entries table has columns {sorted(columns)}")


def _open_file(path: Path, check: bool = False) -> sqlite3.Connection:
    """Open the database at `path` in WAL mode with the schema in place; `check` runs
    `PRAGMA quick_check` too. Raises `_Unusable` or sqlite3 errors."""
    if path.exists() and not path.is_file():
        raise _Unusable("not a regular file")
    conn = _connect(str(path))
    try:
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across crashes
        _ensure_schema(conn)
        if check and conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise _Unusable("quick_check failed")
    except BaseException:
        conn.close()
        raise
    return conn


def _open_memory() -> sqlite3.Connection:
    conn = _connect(":memory:")
    _ensure_schema(conn)
    return conn


def _error_name(exc: BaseException) -> str:
    return str(getattr(exc, "sqlite_errorname", "")) or str(exc)


def _is_bad_file(exc: BaseException, path: Path) -> bool:
    """True when `exc` means the file at `path` is unusable (not when the disk or a lock is)."""
    if isinstance(exc, _Unusable):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        cantopen = "CANTOPEN" in _error_name(exc) or "unable to open" in str(exc)
        return cantopen and path.exists()  # unreadable file; a missing one is a directory issue
    return isinstance(exc, sqlite3.DatabaseError)  # NOTADB, CORRUPT


def _move_aside(path: Path) -> Path:
    """Rename `path` (and its -wal/-shm files) to `<name>.corrupt-<UTC timestamp>`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        if side.exists():
            side.rename(Path(f"{target}{suffix}"))
    return target


@contextlib.contextmanager
def _recovery_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock file, so one process at a time decides whether to move the DB aside."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock; the re-check still narrows the race
        yield
        return
    with open(directory / f"{DB_NAME}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- The cache ----------------------------------------------------------------------------------


class TuningCache:
    """Tuning answers by `CacheKey`, in `<directory>/tuning.sqlite` (see the module doc).

    `path` is the database file; `persistent` is False when the cache fell back to memory.
    """

    def __init__(self, directory: Path | str | None = None, read_only: bool = False):
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.path = self.directory / DB_NAME
        self.persistent = True
        self.read_only = read_only
        self.exists = self.path.exists()  # before this process created it
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._conn: sqlite3.Connection | None = self._open()

    # -- connection management --

    def _open(self) -> sqlite3.Connection:
        if self.read_only:
            return self._open_read_only()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return self._memory(f"cannot create {self.directory}: {exc.strerror or exc}")
        if not os.access(self.directory, os.W_OK | os.X_OK):
            return self._memory(f"{self.directory} is not writable")
        try:
            return _open_file(self.path)
        except (sqlite3.Error, _Unusable, OSError) as exc:
            if not _is_bad_file(exc, self.path):
                return self._memory(f"cannot open {self.path}: {exc}")
            return self._recover(exc)

    def _open_read_only(self) -> sqlite3.Connection:
        if not self.exists:
            log.debug("no tuning cache at %s: reading it as empty", self.path)
            return _open_memory()
        try:
            return _open_read_only(self.path)
        except (sqlite3.Error, _Unusable, OSError) as exc:
            raise InferccError(
                f"tuning cache {self.path} cannot be read: {exc}",
                "a build that tunes (infercc optimize) moves an unusable cache aside; or remove it",
            ) from None

    def _recover(self, exc: BaseException) -> sqlite3.Connection:
        """Under the lock: re-check (another process may have recovered), else move aside."""
        try:
            with _recovery_lock(self.directory):
                try:
                    return _open_file(self.path, check=True)
                except (sqlite3.Error, _Unusable, OSError) as again:
                    if not _is_bad_file(again, self.path):
                        raise
                    exc = again
                moved = _move_aside(self.path)
                log.warning(
                    "tuning cache %s was unusable (%s); moved it to %s and started a fresh one",
                    self.path,
                    exc,
                    moved,
                )
                return _open_file(self.path)
        except (sqlite3.Error, _Unusable, OSError) as failed:
            return self._memory(f"cannot recover {self.path} ({exc}): {failed}")

    def _memory(self, why: str) -> sqlite3.Connection:
        log.warning(
            "tuning cache: %s; using an in-memory cache instead, so tuning still works but its "
            "results are not kept after this process",
            why,
        )
        self.persistent = False
        return _open_memory()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self.persistent and self._pid != os.getpid():
            self._conn = None  # inherited across fork: never use it, never close it here
        if self._conn is None:
            self.persistent = True
            self._pid = os.getpid()
            self._conn = self._open()
        return self._conn

    def _run(
        self,
        what: str,
        op: Callable[[sqlite3.Connection], R],
        on_error: Callable[[str, sqlite3.Error], R],
    ) -> R:
        """Run `op`; on corruption recover once and retry; other errors go to `on_error`."""
        if self.read_only and what in _WRITES:
            raise InferccError(
                f"tuning cache {self.path} was opened read-only and cannot {what}",
                "open it with TuningCache(directory) to change it",
            )
        with self._lock:
            try:
                return op(self._connection())
            except sqlite3.Error as exc:
                if not self.persistent or not _is_bad_file(exc, self.path):
                    return on_error(what, exc)
                self._close_connection()
                self._conn = self._recover(exc)
            try:
                return op(self._conn)
            except sqlite3.Error as exc:
                return on_error(what, exc)

    def _close_connection(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close_connection()

    def __enter__(self) -> TuningCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- lookups and stores (never fatal) --

    def get(self, key: CacheKey) -> dict[str, Any] | None:
        """The stored value for `key`, or None. A hit bumps `hits` and `last_used`."""
        digest = key.digest()

        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT value FROM entries WHERE digest = ?", (digest,)).fetchone()
            if row is not None and not self.read_only:
                with _transaction(conn):
                    conn.execute(
                        "UPDATE entries SET hits = hits + 1, last_used = ? WHERE digest = ?",
                        (time.time(), digest),
                    )
            return None if row is None else row[0]

        text = self._run("lookup", op, _warn_and_skip)
        return None if text is None else _decode_value(text, digest)

    def put(self, key: CacheKey, value: Mapping[str, Any], tuning_seconds: float = 0.0) -> None:
        """Store `value` (a JSON object) for `key`, replacing any earlier entry."""
        if not isinstance(value, Mapping):
            raise TypeError(f"a tuning cache value must be a dict, got {type(value).__name__}")
        row = (
            key.digest(),
            *astuple(key),
            _canonical_json(value),
            time.time(),
            float(tuning_seconds),
        )

        def op(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO entries (digest, model_hash, shapes, backend, "
                    "backend_version, provider, fingerprint, value, created, last_used, hits, "
                    "tuning_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 0, ?)",
                    row,
                )

        self._run("store", op, _warn_and_skip)

    # -- maintenance (raise InferccError) --

    def entries(self) -> list[dict[str, Any]]:
        """Every entry's digest, key fields and statistics (no value), oldest first."""
        return self._select(ENTRY_COLUMNS, "", ())

    def show(self, prefix: str) -> list[dict[str, Any]]:
        """Entries whose digest starts with `prefix`, with their values."""
        prefix = prefix.strip().lower()
        rows = self._select(
            (*ENTRY_COLUMNS, "value"), "WHERE substr(digest, 1, ?) = ?", (len(prefix), prefix)
        )
        for row in rows:
            row["value"] = _decode_value(row["value"], row["digest"])
        return rows

    def entries_since(self, created: float) -> list[dict[str, Any]]:
        """Entries (with values) created at or after `created` (seconds since the epoch)."""
        rows = self._select((*ENTRY_COLUMNS, "value"), "WHERE created >= ?", (float(created),))
        for row in rows:
            row["value"] = _decode_value(row["value"], row["digest"])
        return rows

    def _select(self, columns: Sequence[str], where: str, args: tuple) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(columns)} FROM entries {where} ORDER BY created, digest"

        def op(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return [
                _clean_row(dict(zip(columns, row, strict=True))) for row in conn.execute(sql, args)
            ]

        return self._run("read", op, self._raise)

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""

        def op(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                return conn.execute("DELETE FROM entries").rowcount

        return self._run("clear", op, self._raise)

    def export(self, path: Path | str) -> int:
        """Write every entry, with values, to the JSON file `path`; returns the count."""
        path = Path(path)
        rows = self.show("")
        document = {"schema": EXPORT_SCHEMA, "exported": time.time(), "entries": rows}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise InferccError(
                f"cannot write tuning cache export {path}: {exc.strerror or exc}",
                "choose a writable path",
            ) from None
        return len(rows)

    def import_(self, path: Path | str) -> int:
        """Merge the entries of an `export` file; on conflicts the newer `created` wins.

        Returns how many entries were added or replaced. The file is checked whole before
        anything is written, so a bad file changes nothing.
        """
        path = Path(path)
        return self.merge(_read_export(path), path)

    def merge(self, entries: Sequence[Any], source: Path | str = "entries") -> int:
        """`import_` for entries already in memory (as `show` and `entries_since` give them):
        each checked first, then merged in one transaction, the newer `created` winning.
        `source` names them in errors. Returns how many were added or replaced."""
        source = Path(source)
        rows = [_import_row(entry, source, i) for i, entry in enumerate(entries)]

        def op(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                before = conn.total_changes
                conn.executemany(_MERGE, rows)
                return conn.total_changes - before

        return self._run("import", op, self._raise)

    def _raise(self, what: str, exc: sqlite3.Error) -> Any:
        raise InferccError(
            f"tuning cache {what} failed on {self.path}: {exc}",
            "another process may hold it for long; retry, or point INFERCC_CACHE_DIR elsewhere",
        ) from exc


# --- Values and export files ----------------------------------------------------------------------


def _warn_and_skip(what: str, exc: sqlite3.Error) -> None:
    log.warning("tuning cache %s failed (%s); carrying on without it", what, exc)
    return None


def _clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row as its columns promise: SQLite keeps whatever a writer stored (another version,
    a hand edit), so a statistic that is not a finite number reads as None and a key field that
    is not text as its text, with a warning; listing, showing and exporting never fail on it."""
    for name in STAT_FIELDS:
        if row.get(name) is not None and not _is_number(row[name]):
            log.warning(
                "tuning cache entry %s: %s %r is not a number", row.get("digest"), name, row[name]
            )
            row[name] = None
    for name in ("digest", *KEY_FIELDS):
        if name in row and not isinstance(row[name], str):
            value = row[name]
            row[name] = value.hex() if isinstance(value, bytes) else str(value)
    return row


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _decode_value(text: str, digest: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        log.warning("tuning cache entry %s holds no JSON object; treating it as a miss", digest)
        return None
    return value


def _bad_export(path: Path, problem: str) -> InferccError:
    return InferccError(
        f"{path} is not a tuning cache export: {problem}",
        f'give a file written by TuningCache.export ("schema": "{EXPORT_SCHEMA}")',
    )


def _read_export(path: Path) -> list[Any]:
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise InferccError(
            f"cannot read tuning cache export {path}: {exc.strerror or exc}",
            "check the path",
        ) from None
    except ValueError as exc:
        raise _bad_export(path, f"invalid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise _bad_export(path, "the top level is not a JSON object")
    if document.get("schema") != EXPORT_SCHEMA:
        raise _bad_export(path, f"schema is {document.get('schema')!r}")
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise _bad_export(path, '"entries" is not a list')
    return entries


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _import_row(entry: Any, path: Path, index: int) -> tuple[Any, ...]:
    """One export entry as a row for `_MERGE`; the digest is recomputed from the key fields."""
    if not isinstance(entry, dict):
        raise _bad_export(path, f"entry {index} is not an object")
    missing = [f for f in KEY_FIELDS if not isinstance(entry.get(f), str)]
    if missing:
        raise _bad_export(path, f"entry {index} lacks string fields {', '.join(missing)}")
    if not isinstance(entry.get("value"), dict):
        raise _bad_export(path, f"entry {index} has no object 'value'")
    if not _is_number(entry.get("created")):
        raise _bad_export(path, f"entry {index} has no numeric 'created'")
    last_used = entry.get("last_used")
    hits = entry.get("hits", 0)
    seconds = entry.get("tuning_seconds", 0.0)
    if not (last_used is None or _is_number(last_used)) or not _is_number(seconds):
        raise _bad_export(path, f"entry {index} has non-numeric times")
    if not isinstance(hits, int) or isinstance(hits, bool) or hits < 0:
        raise _bad_export(path, f"entry {index} has a bad 'hits' count")
    key = CacheKey(**{f: entry[f] for f in KEY_FIELDS})
    stats = (float(entry["created"]), last_used, hits, float(seconds))
    return (key.digest(), *astuple(key), *stats, _canonical_json(entry["value"]))
