"""Nodes left and optimize time on today's exports: infercc against onnxslim and onnxsim.

    python bench/shape_zoo.py [--models a,b] [--static] [--export-only] [--json out.json]

Exports the models of `bench/zoo_models.py` (random weights, nothing downloaded; cached in
bench/.cache/zoo/), then for each model and tool (infercc, onnxslim, onnxsim), in a fresh
process: optimize it, time the call (load, optimize and save; the interpreter's start and
imports excluded; the whole process's wall time is printed too), count the nodes left.
Every optimized model is run with onnxruntime against
the original at two values of each symbolic dimension, and its inputs' and outputs' declared
dimensions are compared with the original's. `--static` adds the fixed-shape mode of each
tool (infercc --static-shapes, onnxslim --input-shapes, onnxsim --overwrite-input-shape) at
the model's static profile. PyTorch, transformers, timm, onnxslim and onnxsim are bench-only
dependencies: pip install torch==2.13.0 transformers timm onnxscript onnxslim onnxsim.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo_models import ZOO, ZooModel, feeds, static_spec  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache" / "zoo"
TOOLS = ("infercc", "onnxslim", "onnxsim")


def exported(model: ZooModel) -> Path:
    path = CACHE / f"{model.name}.onnx"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        t0 = time.perf_counter()
        model.export(tmp)
        os.replace(tmp, path)
        print(f"  exported {model.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


# -- one optimization, in a fresh process ------------------------------------------------------


def _run_tool(tool: str, src: str, dst: str, static: str) -> float:
    """Optimize `src` with `tool`; the seconds of the call (load, optimize, save), imports
    done before it."""
    shapes = json.loads(static) if static else None
    import onnx

    if tool == "infercc":
        import infercc
        import infercc.api  # noqa: F401  (imported lazily by infercc.optimize)
    elif tool == "onnxslim":
        import onnxslim
    else:
        import onnxsim
    t0 = time.perf_counter()
    if tool == "infercc":
        infercc.optimize(
            src,
            dst,
            run_validation=False,
            static_shapes={k: tuple(v) for k, v in shapes.items()} if shapes else None,
        )
    elif tool == "onnxslim":
        kwargs = {}
        if shapes:
            kwargs["input_shapes"] = [f"{k}:{','.join(map(str, v))}" for k, v in shapes.items()]
        onnx.save(onnxslim.slim(src, **kwargs), dst)
    else:
        kwargs = {"overwrite_input_shapes": shapes} if shapes else {}
        model, ok = onnxsim.simplify(onnx.load(src), **kwargs)
        if not ok:
            raise RuntimeError("onnxsim's check failed")
        onnx.save(model, dst)
    return time.perf_counter() - t0


def optimize_fresh(tool: str, src: Path, dst: Path, static: dict | None) -> dict:
    cmd = [sys.executable, __file__, "--one", tool, str(src), str(dst), json.dumps(static or {})]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": tail[0][:200]}
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    got["process_seconds"] = wall
    return got


# -- checks ------------------------------------------------------------------------------------


def node_count(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def count(graph) -> int:
        n = 0
        for node in graph.node:
            n += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += count(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    n += sum(count(g) for g in a.graphs)
        return n

    return count(model.graph)


def io_dims(path: Path) -> list:
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    return [
        (vi.name, [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim])
        for vi in [*g.input, *g.output]
    ]


def outputs_equal(ref: Path, cand: Path, profiles, vocab: int) -> tuple[bool, float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = ort.InferenceSession(str(ref), so, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(cand), so, providers=["CPUExecutionProvider"])
    worst = 0.0
    ok = True
    for i, dims in enumerate(profiles):
        feed = feeds(ref, dims, vocab, seed=i)
        names = {x.name for x in b.get_inputs()}
        ya = a.run(None, feed)
        yb = b.run(None, {k: v for k, v in feed.items() if k in names})
        for x, y in zip(ya, yb, strict=True):
            if x.shape != y.shape:
                return False, float("inf")
            if x.size:
                diff = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
                worst = max(worst, diff)
                ok &= bool(np.allclose(x, y, atol=1e-4, rtol=1e-3, equal_nan=True))
    return ok, worst


def measure(model: ZooModel, static_mode: bool) -> dict:
    src = exported(model)
    row: dict = {"model": model.name, "original": node_count(src)}
    out_dir = CACHE / "out"
    out_dir.mkdir(exist_ok=True)
    modes = [("dynamic", None)]
    if static_mode:
        modes.append(("static", static_spec(src, model.static)))
    for mode, static in modes:
        for tool in TOOLS:
            dst = out_dir / f"{model.name}.{mode}.{tool}.onnx"
            got = optimize_fresh(tool, src, dst, static)
            key = f"{mode}.{tool}"
            if "error" in got:
                row[key] = {"error": got["error"]}
                continue
            profiles = model.profiles if static is None else (model.static, model.static)
            equal, worst = outputs_equal(src, dst, profiles, model.vocab)
            row[key] = {
                "nodes": node_count(dst),
                "seconds": round(got["seconds"], 3),
                "process_seconds": round(got["process_seconds"], 3),
                "equal": equal,
                "max_abs": worst,
                "dims_kept": io_dims(dst) == io_dims(src) if static is None else None,
            }
    return row


def race(models: list[ZooModel], rounds: int) -> None:
    """infercc and onnxslim in fresh processes, interleaved (A B A B), `rounds` pairs per
    model: the median of the per-pair ratios of their optimize-call times."""
    import statistics

    out_dir = CACHE / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    print("| model | infercc s (median) | onnxslim s (median) | infercc / onnxslim (median pair) |")
    print("|---|---|---|---|")
    for m in models:
        src = exported(m)
        a, b = [], []
        for _ in range(rounds):
            a.append(optimize_fresh("infercc", src, out_dir / "race.infercc.onnx", None)["seconds"])
            b.append(
                optimize_fresh("onnxslim", src, out_dir / "race.onnxslim.onnx", None)["seconds"]
            )
        ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(
            f"| {m.name} | {statistics.median(a):.2f} | {statistics.median(b):.2f} | {ratio:.2f} |",
            flush=True,
        )


def _cell(row: dict, key: str, what: str) -> str:
    got = row.get(key)
    if got is None:
        return "-"
    if "error" in got:
        return "error"
    return str(got[what])


def print_table(rows: list[dict], static_mode: bool) -> None:
    head = (
        "| model | original | infercc | onnxslim | onnxsim "
        "| optimize s infercc / onnxslim / onnxsim | process s | equal at 2 shapes | dims kept |"
    )
    print(head)
    print("|" + "---|" * 9)
    for r in rows:
        nodes = [_cell(r, f"dynamic.{t}", "nodes") for t in TOOLS]
        secs = " / ".join(_cell(r, f"dynamic.{t}", "seconds") for t in TOOLS)
        wall = " / ".join(_cell(r, f"dynamic.{t}", "process_seconds") for t in TOOLS)
        eq = " ".join(_cell(r, f"dynamic.{t}", "equal")[0] for t in TOOLS)
        kept = _cell(r, "dynamic.infercc", "dims_kept")
        print(
            f"| {r['model']} | {r['original']} | {' | '.join(nodes)} | {secs} | {wall} | {eq} "
            f"| {kept} |"
        )
    if static_mode:
        print()
        print("| model (static shapes) | infercc | onnxslim | onnxsim | equal |")
        print("|---|---|---|---|---|")
        for r in rows:
            nodes = [_cell(r, f"static.{t}", "nodes") for t in TOOLS]
            eq = " ".join(_cell(r, f"static.{t}", "equal")[0] for t in TOOLS)
            print(f"| {r['model']} | {' | '.join(nodes)} | {eq} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        seconds = _run_tool(*sys.argv[2:6])
        print(json.dumps({"seconds": seconds}))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--static", action="store_true", help="also the fixed-shape modes")
    ap.add_argument("--export-only", action="store_true")
    ap.add_argument(
        "--race",
        type=int,
        default=0,
        metavar="N",
        help="only time infercc against onnxslim, N interleaved pairs per model",
    )
    ap.add_argument("--json", default="", help="write the rows to this file")
    args = ap.parse_args()
    wanted = set(filter(None, args.models.split(",")))
    models = [m for m in ZOO if not wanted or m.name in wanted]
    if args.race:
        race(models, args.race)
        return
    rows = []
    for m in models:
        if args.export_only:
            try:
                exported(m)
            except Exception as e:  # report and go on: one exporter failing is a finding
                print(f"  {m.name}: export failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        row = measure(m, args.static)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if rows:
        print_table(rows, args.static)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
