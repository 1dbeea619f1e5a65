"""A fleet of 24 models through `infercc ci`: `--jobs 2` against `--ray` on this machine, and
a simulated two-node cluster's scheduling table.

The fleet: the two example models (fp32 artifacts and an fp16 file), the nine light_* models
onnx ships (random weights and calibrated BatchNorm statistics from tests/zoo.py; the six small
ones as tuned onnxruntime artifacts and as fp16 files, the three large ones as optimized files)
and a 2-layer BERT exported two ways by bench/export_bert.py (torch.onnx TorchScript with SDPA
and with eager attention; each as a tuned artifact, an fp32 file and an fp16 file, at 1x64).
Bench-only: BERT needs torch and transformers; without them (`--no-transformers`) the fleet
has 18 models.

1. Each mode runs as the CLI a user runs (`python -m infercc ci fleet.toml --jobs 2` and
   `... --ray`, which starts a local Ray cluster: its start-up is in the time), in a fresh
   process with a fresh tuning cache (every artifact is tuned, in both modes), with Ray's
   workers at the same priority as the processes of --jobs (RAY_worker_niceness=0), interleaved
   A B B A ... over `--rounds` rounds. Printed: wall time of each run, the ratio ray / jobs per
   round (target: at most 1.3), the verdicts (which must be identical), and Ray's overhead per
   model: (ray - jobs) / models, with and without Ray's start-up, and inside each task
   (task running time less the build's own time: inputs unpacked, cache merged, child process,
   artifact packed), median and max.
2. A simulated cluster (`ray.cluster_utils.Cluster`): a head with no CPUs for work and two
   nodes of one CPU and one GPU each, declaring accelerator types A100 and L4; the fleet's
   models with targets a100, l4 and cpu in turn (as optimized files: no TensorRT here). Printed:
   where each model ran, its queue and run times, and the wall time.

    python bench/fleet.py [--rounds 2] [--no-transformers] [--no-cluster] [--only-cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402

from tests.zoo import LARGE, SMALL, light_path, randomize  # noqa: E402

CACHE = ROOT / "bench" / ".cache" / "fleet"
EXAMPLES = ROOT / "examples"
BERT_VARIANTS = ("sdpa_ts", "eager_ts")  # TorchScript exports (dynamo needs onnxscript)
# Ray starts its workers at niceness 15; on a dedicated node that changes nothing, but on a
# machine shared with other work it would time the other tenants, not Ray: both modes run at
# the priority of the process that starts them.
EQUAL_PRIORITY = {"RAY_worker_niceness": "0"}
BERT_SHAPES = "{ input_ids = '1x64', attention_mask = '1x64', token_type_ids = '1x64' }"


# --------------------------------------------------------------------------- the fleet


def light_models() -> dict[str, Path]:
    """The light_* models with random weights, written once into bench/.cache/fleet."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in (*SMALL, *LARGE):
        path = CACHE / f"{name}.onnx"
        if not path.exists():
            print(f"randomizing light_{name} ...", flush=True)
            onnx.save(randomize(onnx.load(light_path(name))), path)
        out[name] = path
    return out


def bert_models() -> dict[str, Path]:
    """BERT with 2 layers in two exports (bench/export_bert.py), written once."""
    paths = {v: CACHE / f"bert_L2_{v}.onnx" for v in BERT_VARIANTS}
    if not all(p.exists() for p in paths.values()):
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "export_bert.py"), "--layers", "2"]
            + ["--out-dir", str(CACHE), "--no-check", "--variants", *BERT_VARIANTS],
            check=True,
        )
    return paths


def model_table(name: str, path: Path, **keys: str) -> str:
    lines = ["[[models]]", f'name = "{name}"', f'path = "{path.as_posix()}"']
    lines += [f"{k} = {v}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def fleet_tables(transformers: bool) -> list[str]:
    """One [[models]] table per model of the fleet (24 with transformers, 18 without)."""
    q = '"{}"'.format
    tables = [
        model_table("small_cnn", EXAMPLES / "small_cnn.onnx", shapes="{ image = '1x3x32x32' }"),
        model_table(
            "tiny_encoder", EXAMPLES / "tiny_encoder.onnx", shapes="{ hidden_states = '1x16x64' }"
        ),
        model_table(
            "tiny_encoder_fp16",
            EXAMPLES / "tiny_encoder.onnx",
            backend=q("none"),
            precision=q("fp16"),
        ),
    ]
    light = light_models()
    for name in SMALL:
        tables.append(model_table(name, light[name]))
    for name in LARGE:
        tables.append(model_table(name, light[name], backend=q("none")))
    for name in SMALL:
        tables.append(
            model_table(f"{name}_fp16", light[name], backend=q("none"), precision=q("fp16"))
        )
    if transformers:
        bert = bert_models()
        for variant in BERT_VARIANTS:
            path, shapes = bert[variant], BERT_SHAPES
            tables.append(model_table(f"bert_{variant}", path, shapes=shapes))
            tables.append(
                model_table(f"bert_{variant}_file", path, backend=q("none"), shapes=shapes)
            )
            tables.append(
                model_table(
                    f"bert_{variant}_fp16",
                    path,
                    backend=q("none"),
                    precision=q("fp16"),
                    shapes=shapes,
                )
            )
    return tables


def write_manifest(path: Path, tables: list[str], head: str = "") -> Path:
    path.write_text(head + "\n" + "\n".join(tables))
    return path


# --------------------------------------------------------------------------- jobs vs ray


def run_cli(manifest: Path, mode: str, work: Path) -> tuple[float, dict]:
    """One `infercc ci` run in a fresh process and tuning cache; (wall seconds, JSON report)."""
    report = work / f"{mode}.json"
    flags = ["--jobs", "2"] if mode == "jobs" else ["--ray"]
    env = {**os.environ, "INFERCC_CACHE_DIR": str(work / f"cache-{mode}"), "COLUMNS": "160"}
    env.update(EQUAL_PRIORITY)
    env.pop("GITHUB_STEP_SUMMARY", None)
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "infercc", "ci", str(manifest), *flags]
        + ["--out-dir", str(work / f"out-{mode}"), "--json-report", str(report)],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{mode} run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return wall, json.loads(report.read_text())


def verdicts(report: dict) -> dict[str, tuple]:
    return {m["name"]: (m["passed"], m["stage"]) for m in report["models"]}


def compare(manifest: Path, rounds: int) -> None:
    runs: dict[str, list[tuple[float, dict]]] = {"jobs": [], "ray": []}
    for r in range(rounds):
        order = ("jobs", "ray") if r % 2 == 0 else ("ray", "jobs")
        for mode in order:
            with tempfile.TemporaryDirectory(prefix=f"fleet-{mode}-") as tmp:
                wall, report = run_cli(manifest, mode, Path(tmp))
            runs[mode].append((wall, report))
            print(f"round {r + 1} {mode:>4}: {wall:7.1f} s", flush=True)
    n = len(runs["jobs"][0][1]["models"])
    print(f"\n{n} models, {rounds} round(s), interleaved\n")
    print("| round | --jobs 2 s | --ray s | Ray start-up s | ray / jobs |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    ratios = []
    for r in range(rounds):
        (jw, _), (rw, rep) = runs["jobs"][r], runs["ray"][r]
        ratios.append(rw / jw)
        print(f"| {r + 1} | {jw:.1f} | {rw:.1f} | {rep['ray']['connect_s']:.1f} | {rw / jw:.3f} |")
    print(f"\nmedian ray / jobs: {statistics.median(ratios):.3f} (goal: <= 1.3)")
    all_verdicts = [verdicts(rep) for mode in runs for _, rep in runs[mode]]
    same = all(v == all_verdicts[0] for v in all_verdicts)
    failed = [k for k, (ok, _) in all_verdicts[0].items() if not ok]
    print(f"verdicts identical in every run: {same}; failed: {failed or 'none'}")
    overheads(runs, n)


def overheads(runs: dict, n: int) -> None:
    walls = {mode: statistics.median(w for w, _ in runs[mode]) for mode in runs}
    startup = statistics.median(rep["ray"]["connect_s"] for _, rep in runs["ray"])
    per_model = (walls["ray"] - walls["jobs"]) / n
    print(
        f"Ray's overhead per model (median walls): {per_model:.2f} s with start-up, "
        f"{(walls['ray'] - startup - walls['jobs']) / n:.2f} s without"
    )
    inside = [
        m["placement"]["running_s"] - m["seconds"]
        for _, rep in runs["ray"]
        for m in rep["models"]
        if m.get("placement") and m["placement"].get("running_s") is not None
    ]
    print(
        f"inside a task, beyond the build itself: median {statistics.median(inside):.2f} s, "
        f"max {max(inside):.2f} s"
    )


# --------------------------------------------------------------------------- two nodes


def simulated_cluster(tables: list[str], work: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from infercc.ci.runner import run_ci

    targets = ("a100", "l4", "cpu")
    retargeted = []
    for i, table in enumerate(tables):
        body = "\n".join(line for line in table.splitlines() if not line.startswith("backend"))
        retargeted.append(f'{body}\ntarget = "{targets[i % 3]}"\nbackend = "none"\n')
    manifest = write_manifest(work / "cluster.toml", retargeted)
    os.environ["INFERCC_CACHE_DIR"] = str(work / "cache-cluster")
    os.environ.update(EQUAL_PRIORITY)
    t0 = time.perf_counter()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    names = {}
    for kind in ("A100", "L4"):
        node = cluster.add_node(num_cpus=1, num_gpus=1, resources={f"accelerator_type:{kind}": 1})
        names[node.node_id] = kind
    ray.init(address=cluster.address, log_to_driver=False)
    started = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        report = run_ci(manifest, ray=True, out_dir=work / "out-cluster", step_summary=False)
        wall = time.perf_counter() - t1
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("\nsimulated cluster: head (0 CPUs for work) + A100 node + L4 node, 1 CPU and 1 GPU each")
    print(f"cluster start {started:.1f} s; fleet {wall:.1f} s; {len(report.failures())} failed\n")
    print("| model | target | node | queued s | ran s | verdict |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for m in report.models:
        p = m.placement or {}
        node = names.get(p.get("node_id"), "head")
        verdict = "passed" if m.passed else f"FAILED: {m.reason}"
        queued, ran = p.get("queued_s", 0.0), p.get("running_s", 0.0)
        print(f"| {m.name} | {m.target} | {node} | {queued:.1f} | {ran:.1f} | {verdict} |")
    misplaced = [
        m.name
        for m in report.models
        if m.target in ("a100", "l4") and names.get(m.placement["node_id"]) != m.target.upper()
    ]
    print(f"\nGPU-target models on a node of another type: {misplaced or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-transformers", action="store_true", help="leave the BERT exports out")
    ap.add_argument("--no-cluster", action="store_true", help="skip the simulated cluster")
    ap.add_argument("--only-cluster", action="store_true", help="only the simulated cluster")
    args = ap.parse_args()
    tables = fleet_tables(not args.no_transformers)
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        work = Path(tmp)
        manifest = write_manifest(work / "fleet.toml", tables)
        if not args.only_cluster:
            compare(manifest, args.rounds)
        if not args.no_cluster:
            simulated_cluster(tables, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
