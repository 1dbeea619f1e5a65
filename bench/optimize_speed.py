"""Wall time and peak RSS of ``infercc optimize`` against a load+save floor.

Every measurement runs in a fresh, tiny runner process (``python -I -S``) that starts the
measured command as its only child and reports ``getrusage(RUSAGE_CHILDREN).ru_maxrss``, so
the peak RSS is that one run's maximum (the kernel folds in descendants the command waited
for). The runner, not this script, is the command's parent because Linux charges a child's
pre-exec high-water RSS (the parent's memory, with vfork/posix_spawn) to the child's maxrss;
the runner is ~10 MB, so that bias is negligible. Cases:

* ``startup``  ``python -c "import onnx"``: interpreter + onnx import, for reference
* ``floor``    ``onnx.load`` + ``onnx.save`` of the same model: the least any optimizer that
  reads and writes the model can cost
* ``infercc``  ``python -m infercc optimize MODEL -o TMP/out.onnx --json [--extra-args]``
* ``onnxslim`` ``python -m onnxslim MODEL TMP/out.onnx`` (or the ``onnxslim`` CLI), when
  installed; otherwise the row is marked skipped

Usage::

    python bench/optimize_speed.py bench/.cache/bert_base_sdpa_ts.onnx --runs 3
    python bench/optimize_speed.py MODEL --extra-args "--no-validate" --json
    python bench/optimize_speed.py MODEL --cases floor onnxslim

The table shows the median wall time over ``--runs`` and the largest peak RSS over the runs;
ratios are to the floor row, and "RSS/model" is peak RSS over the model's size on disk.
Exit status is 1 when a case that was run failed (skipped cases do not count).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

CASES = ("startup", "floor", "infercc", "onnxslim")
MB = 1e6

# argv: RESULT_JSON CMD...; runs CMD as its single child, writes wall time, rc, maxrss.
RUNNER_CODE = """\
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": wall, "rc": rc, "maxrss": ru.ru_maxrss}, f)
"""

FLOOR_CODE = """\
import os, sys, onnx
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
big = m.ByteSize() > 2**31 - 2**26  # protobuf cannot serialize >= 2 GiB in one file
onnx.save(m, dst, save_as_external_data=big, location=os.path.basename(dst) + ".data")
"""


@dataclass
class Run:
    wall_s: float
    peak_rss_mb: float
    returncode: int
    out_mb: float | None = None


@dataclass
class CaseResult:
    name: str
    status: str  # ok | failed | skipped
    cmd: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    wall_s: float | None = None  # median over runs
    peak_rss_mb: float | None = None  # max over runs
    out_mb: float | None = None
    time_ratio: float | None = None
    rss_ratio: float | None = None
    rss_over_model: float | None = None
    error: str | None = None
    tool_json: object | None = None  # parsed stdout of a --json tool, when it parsed


def maxrss_mb(maxrss: int) -> float:
    # Linux reports kilobytes, macOS bytes.
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return maxrss * scale / MB


def path_size(p: Path) -> int:
    """Size of a model file plus external-data files it names next to it (best effort)."""
    if not p.exists():
        return 0
    total = p.stat().st_size
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors

        m = onnx.load(str(p), load_external_data=False)
        locs = set()
        for t in _get_all_tensors(m):
            for e in t.external_data:
                if e.key == "location":
                    locs.add(e.value)
        for loc in locs:
            q = p.parent / loc
            if q.exists():
                total += q.stat().st_size
    except Exception:
        pass
    return total


def dir_size(d: Path, exclude: tuple[str, ...]) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and p.name not in exclude)


def measure(cmd: list[str], workdir: Path, timeout: float) -> tuple[Run, str, str]:
    """Run ``cmd`` once under a fresh runner; return wall time, peak RSS, and its output."""
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    result_path = workdir / "runner.json"
    runner = [sys.executable, "-I", "-S", "-c", RUNNER_CODE, str(result_path), *cmd]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            runner,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # runner and command share a new session
            proc.wait()
            timed_out = True
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    if timed_out or not result_path.exists():
        why = f"timed out after {timeout:g}s" if timed_out else f"runner exit {proc.returncode}"
        return (
            Run(wall_s=float("nan"), peak_rss_mb=float("nan"), returncode=-998),
            stdout,
            (stderr + f"\n[{why}]"),
        )
    res = json.loads(result_path.read_text())
    result_path.unlink()
    return (
        Run(wall_s=res["wall_s"], peak_rss_mb=maxrss_mb(res["maxrss"]), returncode=res["rc"]),
        stdout,
        stderr,
    )


def onnxslim_cmd() -> list[str] | None:
    if importlib.util.find_spec("onnxslim") is not None:
        return [sys.executable, "-m", "onnxslim"]
    exe = shutil.which("onnxslim")
    return [exe] if exe else None


def infercc_available() -> bool:
    return importlib.util.find_spec("infercc") is not None


def build_cmd(case: str, model: Path, out: Path, args) -> list[str] | None:
    if case == "startup":
        return [sys.executable, "-c", "import onnx"]
    if case == "floor":
        return [sys.executable, "-c", FLOOR_CODE, str(model), str(out)]
    if case == "infercc":
        if not infercc_available():
            return None
        return [
            sys.executable,
            "-m",
            "infercc",
            "optimize",
            str(model),
            "-o",
            str(out),
            "--json",
            *shlex.split(args.extra_args),
        ]
    if case == "onnxslim":
        base = onnxslim_cmd()
        if base is None:
            return None
        return [*base, str(model), str(out), *shlex.split(args.slim_args)]
    raise ValueError(case)


def last_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[:500]


def run_case(case: str, model: Path, args) -> CaseResult:
    res = CaseResult(name=case, status="ok")
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix=f"speed_{case}_") as tmp:
            workdir = Path(tmp)
            out = workdir / "out.onnx"
            cmd = build_cmd(case, model, out, args)
            if cmd is None:
                res.status = "skipped"
                res.error = f"{case} is not installed"
                return res
            res.cmd = cmd
            run, stdout, stderr = measure(cmd, workdir, args.timeout)
            if case in ("floor", "infercc", "onnxslim") and run.returncode == 0:
                if out.exists():
                    run.out_mb = dir_size(workdir, ("stdout.txt", "stderr.txt")) / MB
                elif case != "infercc" or "--dry-run" not in args.extra_args:
                    run.returncode = -999
                    stderr += "\n[command exited 0 but wrote no output model]"
            res.runs.append(run)
            if run.returncode != 0:
                res.status = "failed"
                detail = last_lines(stderr) or last_lines(stdout) or "(no output)"
                res.error = f"exit {run.returncode} on run {i + 1}: {detail}"
                return res
            if case == "infercc" and res.tool_json is None:
                try:
                    res.tool_json = json.loads(stdout)
                except ValueError:
                    res.tool_json = {"unparsed_stdout_tail": stdout[-500:]}
    res.wall_s = statistics.median(r.wall_s for r in res.runs)
    res.peak_rss_mb = max(r.peak_rss_mb for r in res.runs)
    outs = [r.out_mb for r in res.runs if r.out_mb is not None]
    res.out_mb = outs[-1] if outs else None
    return res


def fmt(v: float | None, spec: str) -> str:
    width = spec.split(".")[0]
    return format("-", f">{width}") if v is None else format(v, spec)


def print_table(model: Path, model_mb: float, results: list[CaseResult], runs: int) -> None:
    print(f"model: {model}  ({model_mb:.1f} MB)   runs per case: {runs}")
    print("wall = median over runs; peak RSS = max over runs; ratios are to the floor row\n")
    hdr = (
        f"{'case':10s} {'status':8s} {'wall s':>8s} {'peak RSS MB':>12s} {'t/floor':>8s} "
        f"{'RSS/floor':>10s} {'model MB':>9s} {'RSS/model':>10s} {'out MB':>8s}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(
            f"{r.name:10s} {r.status:8s} {fmt(r.wall_s, '8.2f')} "
            f"{fmt(r.peak_rss_mb, '12.0f')} {fmt(r.time_ratio, '8.2f')} "
            f"{fmt(r.rss_ratio, '10.2f')} {model_mb:9.1f} {fmt(r.rss_over_model, '10.2f')} "
            f"{fmt(r.out_mb, '8.1f')}"
        )
    for r in results:
        if r.error:
            print(f"\n{r.name} {r.status.upper()}: {r.error}")
            if r.cmd:
                shown = r.cmd[:3] + ["..."] if r.name == "floor" else r.cmd
                print(f"  command: {shlex.join(shown)}")
    for r in results:
        if r.name == "infercc" and isinstance(r.tool_json, dict):
            keys = ", ".join(list(r.tool_json)[:12])
            print(f"\ninfercc --json keys: {keys}")


def glue_option_values(argv: list[str]) -> list[str]:
    """Let ``--extra-args "--no-validate"`` work: argparse would read the value as an option."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a in ("--extra-args", "--slim-args"):
            out.append(f"{a}={next(it, '')}")
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    ap.add_argument("--extra-args", default="", help="extra arguments for infercc optimize")
    ap.add_argument("--slim-args", default="", help="extra arguments for onnxslim")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(glue_option_values(sys.argv[1:] if argv is None else argv))

    model = args.model.resolve()
    if not model.exists():
        print(f"no such model: {model}", file=sys.stderr)
        return 2
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    model_mb = path_size(model) / MB
    with open(model, "rb") as f:  # warm the page cache so run 1 is not penalised
        while f.read(1 << 24):
            pass

    cases = [c for c in CASES if c in args.cases]
    results = []
    for case in cases:
        if not args.json:
            print(f"[{case}] running...", file=sys.stderr, flush=True)
        results.append(run_case(case, model, args))

    floor = next((r for r in results if r.name == "floor" and r.status == "ok"), None)
    for r in results:
        if r.status != "ok":
            continue
        r.rss_over_model = r.peak_rss_mb / model_mb if model_mb else None
        if floor is not None:
            r.time_ratio = r.wall_s / floor.wall_s
            r.rss_ratio = r.peak_rss_mb / floor.peak_rss_mb

    if args.json:
        payload = {
            "model": str(model),
            "model_mb": model_mb,
            "runs": args.runs,
            "python": sys.executable,
            "cases": [asdict(r) for r in results],
        }
        print(json.dumps(payload, indent=2))
    else:
        print_table(model, model_mb, results, args.runs)
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
