"""The tuning cache: keys, hits, recovery from bad databases, concurrency, export/import."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infercc.errors import InferccError
from infercc.runtime import tuning
from infercc.runtime.tuning import (
    CacheKey,
    TuningCache,
    default_cache_dir,
    file_sha256,
    fingerprint_hash,
    host_fingerprint,
)

MOVED = re.compile(r"^tuning\.sqlite\.corrupt-\d{8}T\d{6}Z$")


def key(model: str = "m0", shapes=None, provider: str = "CPUExecutionProvider", fp: str = "f0"):
    shapes = {"x": [1, 3, 224, 224]} if shapes is None else shapes
    return CacheKey(model, CacheKey.canonical_shapes(shapes), "ort", "1.32.0", provider, fp)


@pytest.fixture
def cache(tmp_path):
    with TuningCache(tmp_path) as c:
        yield c


def moved_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if MOVED.match(p.name))


def test_miss_then_hit_counts_hits(cache, tmp_path):
    k = key()
    assert cache.get(k) is None
    value = {"threads": 4, "layout": "NCHWc", "latency_ms": [1.5, 1.25], "nested": {"a": None}}
    cache.put(k, value, tuning_seconds=2.5)
    assert cache.get(k) == value
    assert cache.get(k) == value
    (entry,) = cache.entries()
    assert entry["hits"] == 2 and entry["last_used"] >= entry["created"]
    assert entry["tuning_seconds"] == 2.5 and entry["digest"] == k.digest()
    assert "value" not in entry
    assert cache.path == tmp_path / "tuning.sqlite" and cache.path.is_file() and cache.persistent


def test_put_replaces_and_resets_hits(cache):
    k = key()
    cache.put(k, {"v": 1})
    cache.get(k)
    cache.put(k, {"v": 2})
    assert cache.get(k) == {"v": 2}
    assert [e["hits"] for e in cache.entries()] == [1]


def test_each_key_field_makes_a_different_entry(cache):
    keys = [
        key(),
        key(shapes={"x": [2, 3, 224, 224]}),
        key(provider="CUDAExecutionProvider"),
        key(fp="f1"),
        key(model="m1"),
    ]
    assert len({k.digest() for k in keys}) == len(keys)
    for i, k in enumerate(keys):
        cache.put(k, {"i": i})
    assert [cache.get(k) for k in keys] == [{"i": i} for i in range(len(keys))]
    assert len(cache.entries()) == len(keys)


def test_canonical_shapes_ignores_dict_order():
    a = CacheKey.canonical_shapes({"ids": [1, 128], "mask": (1, 128)})
    b = CacheKey.canonical_shapes({"mask": [1, 128], "ids": [1, 128]})
    assert a == b == '{"ids":[1,128],"mask":[1,128]}'
    assert key(shapes={"a": [1], "b": [2]}).digest() == key(shapes={"b": [2], "a": [1]}).digest()
    with pytest.raises(ValueError, match="'x'"):
        CacheKey.canonical_shapes({"x": ["batch", 3]})


def test_key_to_dict_and_digest():
    k = key()
    d = k.to_dict()
    assert list(d) == list(tuning.KEY_FIELDS) and CacheKey(**d) == k
    payload = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    assert k.digest() == hashlib.sha256(payload).hexdigest()


def test_show_by_prefix(cache):
    a, b = key(model="a"), key(model="b")
    cache.put(a, {"who": "a"})
    cache.put(b, {"who": "b"})
    (shown,) = cache.show(a.digest()[:12].upper())
    assert shown["value"] == {"who": "a"} and shown["digest"] == a.digest()
    assert len(cache.show("")) == 2


@pytest.mark.parametrize("garbage", [b"this is not sqlite at all " * 200, b"\x00\xff" * 3000])
def test_garbage_database_is_moved_aside(tmp_path, caplog, garbage):
    (tmp_path / "tuning.sqlite").write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="infercc.runtime.tuning"):
        c = TuningCache(tmp_path)
    (moved,) = moved_files(tmp_path)
    assert (tmp_path / moved).read_bytes() == garbage
    assert any(moved in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert c.persistent
    c.put(key(), {"ok": True})
    assert c.get(key()) == {"ok": True}
    c.close()


def test_truncated_database_is_moved_aside(tmp_path, caplog):
    with TuningCache(tmp_path) as c:
        for i in range(50):
            c.put(key(model=f"m{i}"), {"pad": "x" * 500})
    db = tmp_path / "tuning.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.write_bytes(db.read_bytes()[:5000])
    with caplog.at_level(logging.WARNING), TuningCache(tmp_path) as c:
        assert c.get(key(model="m0")) is None
        c.put(key(), {"fresh": 1})
        assert c.get(key()) == {"fresh": 1}
    assert len(moved_files(tmp_path)) == 1
    assert "moved it to" in caplog.text


def test_directory_in_place_of_database(tmp_path, caplog):
    (tmp_path / "tuning.sqlite").mkdir()
    with caplog.at_level(logging.WARNING), TuningCache(tmp_path) as c:
        c.put(key(), {"v": 1})
        assert c.get(key()) == {"v": 1} and c.persistent
    (moved,) = moved_files(tmp_path)
    assert (tmp_path / moved).is_dir() and moved in caplog.text


def test_foreign_database_is_moved_aside(tmp_path, caplog):
    with sqlite3.connect(tmp_path / "tuning.sqlite") as conn:
        conn.execute("CREATE TABLE other (x)")
    with caplog.at_level(logging.WARNING), TuningCache(tmp_path) as c:
        assert c.entries() == []
    assert len(moved_files(tmp_path)) == 1 and "another program" in caplog.text


def test_unknown_user_version_is_moved_aside_with_wal_files(tmp_path, caplog):
    with TuningCache(tmp_path) as c:
        c.put(key(), {"old": 1})
    held = sqlite3.connect(tmp_path / "tuning.sqlite")  # keeps -wal/-shm on disk
    held.execute("PRAGMA user_version = 99")
    assert (tmp_path / "tuning.sqlite-wal").exists()
    with caplog.at_level(logging.WARNING), TuningCache(tmp_path) as c:
        assert c.get(key()) is None
        assert c.entries() == []
    held.close()
    (moved,) = moved_files(tmp_path)
    assert "schema version 99" in caplog.text and moved in caplog.text
    with sqlite3.connect(tmp_path / moved) as conn:  # moved with its WAL: the data is intact
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 99
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 1


def test_read_only_directory_falls_back_to_memory(tmp_path, caplog):
    directory = tmp_path / "ro"
    with TuningCache(directory) as c:
        c.put(key(), {"kept": 1})
    directory.chmod(0o500)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("running as root: chmod does not stop writes")
        with caplog.at_level(logging.WARNING), TuningCache(directory) as c:
            assert not c.persistent
            c.put(key(model="new"), {"v": 2})
            assert c.get(key(model="new")) == {"v": 2}
        assert "in-memory" in caplog.text
        assert moved_files(directory) == []
    finally:
        directory.chmod(0o700)


def test_unwritable_directory_seen_by_access_falls_back(tmp_path, caplog, monkeypatch):
    """The same path as the chmod test, runnable as root: os.access says the dir is read-only."""
    with TuningCache(tmp_path) as c:
        c.put(key(), {"kept": 1})
    real_access = os.access
    monkeypatch.setattr(
        tuning.os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode)
    )
    with caplog.at_level(logging.WARNING), TuningCache(tmp_path) as c:
        assert not c.persistent and c.get(key()) is None
        c.put(key(), {"v": 2})
        assert c.get(key()) == {"v": 2}
    assert "not writable" in caplog.text and "in-memory" in caplog.text
    monkeypatch.undo()
    with TuningCache(tmp_path) as c:  # the file on disk was left alone
        assert c.get(key()) == {"kept": 1} and moved_files(tmp_path) == []


def test_uncreatable_directory_falls_back_to_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    with caplog.at_level(logging.WARNING), TuningCache(blocker / "cache") as c:
        assert not c.persistent
        c.put(key(), {"v": 1})
        assert c.get(key()) == {"v": 1}
        assert len(c.entries()) == 1
    assert "in-memory" in caplog.text and str(blocker / "cache") in caplog.text


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from infercc.runtime.tuning import CacheKey, TuningCache

    directory, tag = Path(sys.argv[1]), sys.argv[2]
    shapes = CacheKey.canonical_shapes({"x": [1, 8]})
    def key(model):
        return CacheKey(model, shapes, "ort", "1", "cpu", "fp")
    with TuningCache(directory) as cache:
        assert cache.persistent
        (directory / f"ready-{tag}").touch()
        deadline = time.time() + 60
        while len(list(directory.glob("ready-*"))) < 2 and time.time() < deadline:
            time.sleep(0.005)
        for i in range(200):
            cache.put(key(f"{tag}-{i}"), {"tag": tag, "i": i}, tuning_seconds=0.1)
            cache.put(key("shared"), {"tag": tag, "i": i})
    """
)


def test_two_processes_writing_at_once(tmp_path):
    TuningCache(tmp_path).close()  # create it first, as a compile would
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), tag],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert "WARNING" not in err.upper(), err
    with TuningCache(tmp_path) as c:
        models = {e["model_hash"] for e in c.entries()}
        expected = {f"{t}-{i}" for t in "ab" for i in range(200)}
        assert expected <= models and models - expected == {"shared"}
        shared = CacheKey(
            "shared", CacheKey.canonical_shapes({"x": [1, 8]}), "ort", "1", "cpu", "fp"
        )
        assert c.get(shared)["i"] == 199  # the last write of either process
        assert moved_files(tmp_path) == []
    with sqlite3.connect(tmp_path / "tuning.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_export_import_round_trip(tmp_path):
    keys = [key(model=f"m{i}") for i in range(5)]
    with TuningCache(tmp_path / "a") as a:
        for i, k in enumerate(keys):
            a.put(k, {"i": i, "choice": [i, "x"]}, tuning_seconds=i)
        a.get(keys[0])
        out = tmp_path / "export.json"
        assert a.export(out) == 5
        original = {e["digest"]: e for e in a.show("")}
    document = json.loads(out.read_text())
    assert document["schema"] == "infercc.tuning_cache/1" and len(document["entries"]) == 5
    with TuningCache(tmp_path / "b") as b:
        assert b.import_(out) == 5
        assert {e["digest"]: e for e in b.show("")} == original
        assert b.import_(out) == 0  # same created times: nothing newer, nothing changed
        assert len(b.entries()) == 5


def test_import_keeps_the_newer_entry(tmp_path):
    k = key()
    with TuningCache(tmp_path / "old") as old:
        old.put(k, {"v": "old"})
        old.export(tmp_path / "old.json")
    with TuningCache(tmp_path / "new") as new:
        new.put(k, {"v": "new"})
        new.put(key(model="other"), {"v": "other"})
        new.export(tmp_path / "new.json")
        assert new.import_(tmp_path / "old.json") == 0
        assert new.get(k) == {"v": "new"}
    with TuningCache(tmp_path / "old") as old:
        assert old.import_(tmp_path / "new.json") == 2
        assert old.get(k) == {"v": "new"} and old.get(key(model="other")) == {"v": "other"}


@pytest.mark.parametrize(
    "content",
    [
        "not json {",
        "[1, 2]",
        json.dumps({"schema": "something/else", "entries": []}),
        json.dumps({"schema": "infercc.tuning_cache/1", "entries": [{"model_hash": "m"}]}),
    ],
)
def test_import_of_a_bad_file_names_it(tmp_path, content):
    bad = tmp_path / "bad-export.json"
    bad.write_text(content)
    with TuningCache(tmp_path / "c") as c:
        c.put(key(), {"v": 1})
        with pytest.raises(InferccError, match="bad-export.json") as info:
            c.import_(bad)
        assert info.value.hint
        assert len(c.entries()) == 1


def test_import_of_a_missing_file(cache, tmp_path):
    with pytest.raises(InferccError, match="missing.json"):
        cache.import_(tmp_path / "missing.json")


def test_clear_returns_the_count(cache):
    for i in range(7):
        cache.put(key(model=str(i)), {"i": i})
    assert cache.clear() == 7
    assert cache.entries() == [] and cache.clear() == 0


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"
    with TuningCache() as c:
        assert c.path == tmp_path / "explicit" / "tuning.sqlite" and c.path.is_file()
    monkeypatch.delenv("INFERCC_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "infercc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "infercc"


@pytest.mark.parametrize("size", [0, 1, 1000, 3 * 1024 + 7])
def test_file_sha256_matches_hashlib(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_sha256(path, chunk=1024) == hashlib.sha256(data).hexdigest()
    assert file_sha256(str(path)) == hashlib.sha256(data).hexdigest()


def test_host_fingerprint_is_json_and_stable():
    first, second = host_fingerprint(), host_fingerprint()
    assert first == second
    assert json.loads(json.dumps(first)) == first
    assert {"cpu_model", "cpu_features", "cores", "os", "machine", "onnxruntime", "numpy"} <= set(
        first
    )
    assert fingerprint_hash(first) == fingerprint_hash(dict(reversed(list(second.items()))))
    assert fingerprint_hash(first) != fingerprint_hash({**first, "cores": -1})
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint_hash(first))


# -- read-only opening (infercc cache ls/show/export) ------------------------------------------


def test_read_only_creates_nothing_where_no_cache_is(tmp_path):
    where = tmp_path / "no" / "such"
    with TuningCache(where, read_only=True) as c:
        assert not c.exists and c.entries() == [] and c.show("") == []
        with pytest.raises(InferccError, match="opened read-only"):
            c.put(key(), {"a": 1})
    assert not (tmp_path / "no").exists()


def test_read_only_reads_entries_and_counts_no_hit(tmp_path):
    with TuningCache(tmp_path) as c:
        c.put(key(), {"threads": 4})
    before = sorted(p.name for p in tmp_path.iterdir())
    mtime = (tmp_path / "tuning.sqlite").stat().st_mtime_ns
    with TuningCache(tmp_path, read_only=True) as c:
        assert c.exists and c.get(key()) == {"threads": 4}
        assert [e["hits"] for e in c.entries()] == [0]
        with pytest.raises(InferccError, match="cannot clear"):
            c.clear()
    assert (tmp_path / "tuning.sqlite").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        n for n in before if not n.endswith(("-wal", "-shm"))
    ]


def test_read_only_names_an_unusable_database_and_moves_nothing(tmp_path):
    (tmp_path / "tuning.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(InferccError, match="cannot be read"):
        TuningCache(tmp_path, read_only=True)
    assert moved_files(tmp_path) == []
    assert (tmp_path / "tuning.sqlite").read_bytes().startswith(b"not a database")
