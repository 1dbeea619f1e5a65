"""`infercc cache ls/show/export` on entries whose fields are not what the columns promise
(SQLite keeps whatever a writer stored): no internal error, the figure shown as missing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from infercc.runtime.tuning import DB_NAME, CacheKey, TuningCache
from tests.inproc import run_main


@pytest.fixture
def spoiled(tmp_path: Path) -> Path:
    where = tmp_path / "cache"
    shapes = CacheKey.canonical_shapes({"x": [1, 3]})
    with TuningCache(where) as cache:
        cache.put(
            CacheKey("m0", shapes, "ort", "1.32.0", "CPUExecutionProvider", "f0"), {"a": 1}, 1.5
        )
        cache.put(
            CacheKey("m1", shapes, "ort", "1.32.0", "CPUExecutionProvider", "f0"), {"a": 2}, 0.5
        )
    with sqlite3.connect(where / DB_NAME) as conn:
        conn.execute(
            "UPDATE entries SET tuning_seconds = 'slow', hits = 'many', created = 'then' "
            "WHERE model_hash = 'm0'"
        )
        conn.execute(
            "UPDATE entries SET tuning_seconds = x'00ff', last_used = 'x' WHERE model_hash = 'm1'"
        )
    return where


def test_cache_ls_shows_a_non_numeric_field_as_missing(spoiled, monkeypatch, capsys) -> None:
    result = run_main(monkeypatch, capsys, "cache", "ls", "--cache-dir", str(spoiled))
    assert result.code == 0, result.text
    assert "internal error" not in result.text and "2 entries" in result.text
    assert "tuning_seconds 'slow' is not a number" in result.text  # said, as a warning


def test_cache_ls_json_has_numbers_or_null(spoiled, monkeypatch, capsys) -> None:
    result = run_main(monkeypatch, capsys, "cache", "ls", "--cache-dir", str(spoiled), "--json")
    assert result.code == 0, result.text
    entries = {e["model_hash"]: e for e in json.loads(result.out)["entries"]}
    assert entries["m0"]["tuning_seconds"] is None and entries["m0"]["hits"] is None
    assert entries["m0"]["created"] is None
    assert entries["m1"]["tuning_seconds"] is None and entries["m1"]["last_used"] is None
    assert entries["m1"]["hits"] == 0 and isinstance(entries["m1"]["created"], float)


def test_cache_show_and_export_take_it_too(spoiled, tmp_path, monkeypatch, capsys) -> None:
    result = run_main(monkeypatch, capsys, "cache", "show", "", "--cache-dir", str(spoiled))
    assert result.code == 0, result.text
    assert sorted(e["value"]["a"] for e in json.loads(result.out)) == [1, 2]
    out = tmp_path / "export.json"
    result = run_main(monkeypatch, capsys, "cache", "export", str(out), "--cache-dir", str(spoiled))
    assert result.code == 0, result.text
    assert len(json.loads(out.read_text())["entries"]) == 2
