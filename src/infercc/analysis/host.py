"""What the `cpu` target knows about the host, detected portably and kept once per host.

- CPU model, flags and clock: /proc/cpuinfo where the OS has it (Linux: instant), else
  py-cpuinfo (macOS, Windows; about a second, so its answer is kept with the bandwidth).
- Memory: psutil, on every OS. Cores: the process's affinity mask where the OS has one (a
  container's limit), else psutil's logical count.
- Memory bandwidth: a numpy copy, measured once per host and kept in
  `<cache root>/host-<key>.json` (`infercc.util.cache_root`), so roofline figures do not swing
  with whatever else the machine was doing on a given run. The key hashes the host name, OS,
  machine, CPU count and memory size: another machine (or the same name on new hardware)
  measures anew. Delete the file to measure again; `INFERCC_CPU_BANDWIDTH_GBS` overrides it.
  A cache that cannot be written costs a measurement per process, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercc.util import cache_root

log = logging.getLogger(__name__)

SCHEMA = "infercc.host/1"


@dataclass(frozen=True)
class HostRecord:
    """What was measured on this host, and where it is kept."""

    bandwidth: float  # bytes/s
    measured: float  # seconds since the epoch
    path: Path
    cpu: dict[str, Any] | None = None  # py-cpuinfo's answer, where /proc/cpuinfo is missing


def memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    import psutil

    return psutil.cpu_count(logical=True) or os.cpu_count() or 1


def fingerprint() -> dict[str, Any]:
    return {
        "node": platform.node(),
        "system": platform.system(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory": memory_bytes(),
    }


def record_path() -> Path:
    blob = json.dumps(fingerprint(), sort_keys=True).encode()
    return cache_root() / f"host-{hashlib.sha256(blob).hexdigest()[:12]}.json"


def load(path: Path | None = None) -> dict[str, Any] | None:
    """The kept record of this host, or None (missing, unreadable, another schema)."""
    path = path or record_path()
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    return doc


def store(fields: dict[str, Any], path: Path | None = None) -> Path | None:
    """Merge `fields` into this host's record (written to a temp file, then renamed); None
    when the cache directory cannot be written."""
    path = path or record_path()
    doc = {**(load(path) or {}), **fields, "schema": SCHEMA, "fingerprint": fingerprint()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("cannot keep host facts in %s: %s", path, exc.strerror or exc)
        return None
    return path


def bandwidth(measure: Any) -> HostRecord:
    """This host's kept bandwidth; measured with `measure()` (bytes/s) and kept when there is
    none yet."""
    path = record_path()
    doc = load(path)
    value = doc.get("bandwidth") if doc else None
    if isinstance(value, (int, float)) and value > 0:
        return HostRecord(float(value), float(doc.get("measured", 0.0)), path)  # type: ignore[union-attr]
    value = float(measure())
    now = time.time()
    store({"bandwidth": value, "measured": now}, path)
    return HostRecord(value, now, path)


def py_cpuinfo() -> dict[str, Any]:
    """Model, flags and clock (MHz) from py-cpuinfo, kept in the host record (it is slow)."""
    path = record_path()
    doc = load(path)
    if doc and isinstance(doc.get("cpu"), dict):
        return doc["cpu"]
    try:
        import cpuinfo

        raw = cpuinfo.get_cpu_info()
    except Exception as exc:  # py-cpuinfo probes the OS in a child process: anything goes
        log.debug("py-cpuinfo failed: %s", exc)
        raw = {}
    hz = raw.get("hz_advertised") or raw.get("hz_actual")
    cpu = {
        "model": raw.get("brand_raw") or platform.processor() or platform.machine() or "",
        "flags": [str(f).lower() for f in raw.get("flags", [])],
        "mhz": float(hz[0]) / 1e6 if hz and hz[0] else None,
    }
    store({"cpu": cpu}, path)
    return cpu
