"""The cpu target's host facts: bandwidth measured once per host and kept, portably detected."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infercc.analysis import host, targets


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(targets.BANDWIDTH_ENV, raising=False)
    targets._host_bandwidth.cache_clear()
    yield tmp_path / "cache"
    targets._host_bandwidth.cache_clear()


def test_bandwidth_is_measured_once_per_host_and_kept(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(targets, "measure_copy_bandwidth", lambda: calls.append(1) or 24.9e9)
    assert targets.cpu_bandwidth() == 24.9e9
    (record,) = fresh.glob("host-*.json")
    doc = json.loads(record.read_text())
    assert doc["schema"] == host.SCHEMA and doc["bandwidth"] == 24.9e9
    assert doc["fingerprint"] == host.fingerprint()
    # a later process (the in-process memo cleared) reads it instead of measuring 14.6 GB/s
    targets._host_bandwidth.cache_clear()
    monkeypatch.setattr(targets, "measure_copy_bandwidth", lambda: calls.append(1) or 14.6e9)
    assert targets.get_target("cpu").memory_bandwidth == 24.9e9
    assert calls == [1]
    assert str(record) in targets.get_target("cpu").source


def test_the_same_figure_in_separate_processes(fresh):
    code = (
        "from infercc.analysis.targets import get_target; "
        "print(repr(get_target('cpu').memory_bandwidth))"
    )
    env_run = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        for _ in range(3)
    ]
    assert all(r.returncode == 0 for r in env_run), env_run[0].stderr
    assert len({r.stdout for r in env_run}) == 1


def test_another_host_measures_anew(fresh, monkeypatch):
    monkeypatch.setattr(targets, "measure_copy_bandwidth", lambda: 10e9)
    assert targets.cpu_bandwidth() == 10e9
    targets._host_bandwidth.cache_clear()
    monkeypatch.setattr(host.platform, "node", lambda: "another-host")
    monkeypatch.setattr(targets, "measure_copy_bandwidth", lambda: 20e9)
    assert targets.cpu_bandwidth() == 20e9
    assert len(list(fresh.glob("host-*.json"))) == 2


def test_a_damaged_record_is_measured_again(fresh, monkeypatch):
    monkeypatch.setattr(targets, "measure_copy_bandwidth", lambda: 10e9)
    path = host.record_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert targets.cpu_bandwidth() == 10e9
    assert json.loads(path.read_text())["bandwidth"] == 10e9


def test_an_unwritable_cache_still_gives_a_figure(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv(targets.BANDWIDTH_ENV, raising=False)
    targets._host_bandwidth.cache_clear()
    monkeypatch.setattr(targets, "measure_copy_bandwidth", lambda: 12e9)
    try:
        assert targets.cpu_bandwidth() == 12e9
    finally:
        targets._host_bandwidth.cache_clear()


def test_py_cpuinfo_answer_is_kept(fresh, monkeypatch):
    import cpuinfo

    calls = []

    def fake():
        calls.append(1)
        return {"brand_raw": "Apple M2", "flags": ["NEON"], "hz_advertised": [3_490_000_000, 0]}

    monkeypatch.setattr(cpuinfo, "get_cpu_info", fake)
    first = host.py_cpuinfo()
    assert first == {"model": "Apple M2", "flags": ["neon"], "mhz": 3490.0}
    assert host.py_cpuinfo() == first and calls == [1]


def test_cache_location_follows_the_platform(monkeypatch):
    import platformdirs

    from infercc.util import cache_root

    monkeypatch.delenv("INFERCC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == platformdirs.user_cache_path("infercc", appauthor=False)
