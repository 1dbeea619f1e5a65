"""The two Python steps of bench/gpu_check.sh: can this machine run it, and the JSON summary.

    python bench/gpu_check.py probe
        exit 0 when TensorRT imports and the driver lists a GPU; else print the reason and
        exit 2 (the tensorrt backend's own `available()` reason, or the import error).
    python bench/gpu_check.py summarize OUT WORK TESTS_RC MODELS_RC SECONDS
        read WORK/tests.xml (pytest's JUnit report) and WORK/models.json
        (bench/tensorrt_models.py --json), write OUT, print a few lines, exit 0 when every GPU
        test and every model passed, else 1.

The summary (schema `infercc.gpu_check/1`):

```
{"schema", "seconds", "versions": {tensorrt, onnxruntime, infercc, python, cuda, driver},
 "gpu": {"name", "compute_capability"},
 "tests": {"exit_code", "timed_out", "total", "failed", "errors", "skipped", "failures": [...]},
 "models": {"exit_code", "timed_out", "rows": [...], "left_out": [...]}}
```

where each model row is bench/tensorrt_models.py's: model, precision, validated, validation,
layers (layer counts per precision), build_s (cold: empty timing cache), rebuild_s and
rebuild_timing_cache (a second build with the first build's timing cache), tensorrt_p50_ms,
onnxruntime_cpu_p50_ms, speedup_vs_onnxruntime_cpu, fingerprint. A step stopped by its time
limit has exit code 124 and `timed_out` true.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SCHEMA = "infercc.gpu_check/1"
TIMEOUT_RC = 124


def probe() -> str | None:
    """Why this machine cannot run the GPU check, or None when it can."""
    try:
        from infercc.backends.trt.backend import TensorRTBackend
    except ImportError as exc:
        return f"infercc does not import: {exc}"
    ok, why = TensorRTBackend().available()
    if not ok:
        return why
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError
        return f"the tensorrt package does not import: {exc}"
    return None


def junit_counts(path: Path) -> dict[str, Any]:
    """Totals and failed test ids of a pytest JUnit XML report (zeros when there is none)."""
    counts: dict[str, Any] = {"total": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    if not path.is_file():
        return counts
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        counts["total"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
    return counts


def summarize(
    work: Path, tests_rc: int, models_rc: int, seconds: float
) -> tuple[dict[str, Any], bool]:
    """(the summary, whether everything passed) from the step outputs in `work`."""
    tests = {"exit_code": tests_rc, "timed_out": tests_rc == TIMEOUT_RC}
    tests.update(junit_counts(work / "tests.xml"))
    models_file = work / "models.json"
    models = json.loads(models_file.read_text()) if models_file.is_file() else {}
    rows = models.get("rows", [])
    fingerprint = next((r["fingerprint"] for r in rows if r.get("fingerprint")), {})
    versions = dict(models.get("versions", {}))
    versions.update({k: fingerprint[k] for k in ("cuda", "driver") if k in fingerprint})
    summary = {
        "schema": SCHEMA,
        "seconds": round(seconds, 1),
        "versions": versions,
        "gpu": {k: fingerprint.get(k) for k in ("gpu", "compute_capability")},
        "tests": tests,
        "models": {
            "exit_code": models_rc,
            "timed_out": models_rc == TIMEOUT_RC,
            "rows": rows,
            "left_out": models.get("left_out", []),
        },
    }
    passed = (
        tests_rc == 0
        and tests["total"] > 0
        and models_rc == 0
        and bool(rows)
        and all(r.get("validated") for r in rows)
    )
    return summary, passed


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        why = probe()
        if why:
            print(f"gpu_check: cannot run here: {why}", file=sys.stderr)
            return 2
        return 0
    if argv[:1] == ["summarize"] and len(argv) == 6:
        out, work = Path(argv[1]), Path(argv[2])
        summary, passed = summarize(work, int(argv[3]), int(argv[4]), float(argv[5]))
        _write(out, summary)
        t, m = summary["tests"], summary["models"]
        failed = t["failed"] + t["errors"]
        print(f"gpu tests: {t['total']} run, {failed} failed (exit {t['exit_code']})")
        rows, left = len(m["rows"]), len(m["left_out"])
        print(f"models: {rows} rows, {left} left out (exit {m['exit_code']})")
        print(f"summary: {out} ({'passed' if passed else 'FAILED'})")
        return 0 if passed else 1
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
