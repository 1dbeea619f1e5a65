"""A model over 2 GB: optimize it in a subprocess, measure peak memory, check the weights.

    python bench/large_model.py WORKDIR [--gb 2.2] [--dim 4096] [--no-validate] [--keep]

Writes into WORKDIR (needs about 2.2x the size free; see `df -h`) a chain of layers
`h = Relu(MatMul(Identity(h), W_i) + b_i)` whose float32 weights W_i [dim, dim] add up to
`--gb` GB, stored as external data (written tensor by tensor, never all in memory). Then runs
`python -m infercc optimize` on it in a subprocess (validation on by default: onnxruntime runs
the original and the optimized model one after the other), and measures the child's wall time
and peak RSS (getrusage of the children). Then checks the output: `onnx.load` reads it with
its external data, every weight's SHA-256 equals the original's, and onnxruntime's output of
the optimized model on a random input equals a numpy forward pass over the original weights
(memory-mapped). Prints the figures; `--json` prints them as one object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

DATA = "weights.data"
ALIGN = 4096


def _external(name: str, array: np.ndarray, fd) -> TensorProto:
    """Append `array` to the open data file; the TensorProto that points at it."""
    fd.write(b"\0" * ((-fd.tell()) % ALIGN))
    offset = fd.tell()
    fd.write(np.ascontiguousarray(array).tobytes())
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(array.shape))
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", DATA), ("offset", str(offset)), ("length", str(array.nbytes))):
        t.external_data.add(key=k, value=v)
    return t


def build(workdir: Path, gb: float, dim: int, seed: int = 0) -> tuple[Path, dict[str, str]]:
    """Write the model and its data file; returns the model path and weight -> sha256."""
    layers = max(1, int(np.ceil(gb * 1e9 / (dim * dim * 4))))
    rng = np.random.default_rng(seed)
    nodes, inits, digests = [], [], {}
    h = "x"
    with open(workdir / DATA, "wb") as fd:
        for i in range(layers):
            w = (rng.standard_normal((dim, dim), dtype=np.float32) / np.sqrt(dim)).astype(
                np.float32
            )
            b = rng.standard_normal(dim, dtype=np.float32) * 0.1
            digests[f"W{i}"] = hashlib.sha256(w.tobytes()).hexdigest()
            digests[f"b{i}"] = hashlib.sha256(b.tobytes()).hexdigest()
            inits += [_external(f"W{i}", w, fd), _external(f"b{i}", b, fd)]
            nodes += [
                helper.make_node("Identity", [h], [f"id{i}"]),
                helper.make_node("MatMul", [f"id{i}", f"W{i}"], [f"mm{i}"]),
                helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"]),
                helper.make_node("Relu", [f"add{i}"], [f"h{i}"]),
            ]
            h = f"h{i}"
            del w
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    graph = helper.make_graph(
        nodes,
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = workdir / "large.onnx"
    path.write_bytes(model.SerializeToString())
    return path, digests


def optimize(src: Path, out: Path, validate: bool) -> dict:
    """`infercc optimize` in a child process: its report, wall time and peak RSS."""
    args = [sys.executable, "-m", "infercc", "optimize", str(src), "-o", str(out), "--json"]
    if not validate:
        args.append("--no-validate")
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    if r.returncode != 0:
        raise SystemExit(f"infercc optimize failed ({r.returncode}): {r.stderr.strip()}")
    return {"report": json.loads(r.stdout), "wall_s": wall, "peak_rss": peak}


def check_weights(out: Path, digests: dict[str, str]) -> dict:
    """onnx.load with external data; every original weight is there, bit for bit."""
    t0 = time.perf_counter()
    model = onnx.load(out, load_external_data=True)
    found = {}
    for t in model.graph.initializer:
        if t.name in digests:
            found[t.name] = hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()
    same = sum(found.get(k) == v for k, v in digests.items())
    external = sum(
        1 for t in onnx.load(out, load_external_data=False).graph.initializer if t.external_data
    )
    return {
        "weights_identical": same,
        "weights_total": len(digests),
        "external_tensors": external,
        "onnx_load_s": time.perf_counter() - t0,
    }


def check_outputs(src: Path, out: Path, dim: int) -> float:
    """Max |onnxruntime(optimized) - numpy forward over the original's memory-mapped weights|."""
    x = np.random.default_rng(1).standard_normal((1, dim), dtype=np.float32)
    original = onnx.load(src, load_external_data=False)
    weights = {}
    for t in original.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        weights[t.name] = np.memmap(
            src.parent / info["location"],
            dtype=np.float32,
            mode="r",
            offset=int(info["offset"]),
            shape=tuple(t.dims),
        )
    h = x.astype(np.float64)
    for i in range(sum(1 for n in weights if n.startswith("W"))):
        h = np.maximum(h @ weights[f"W{i}"] + weights[f"b{i}"], 0.0)
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    sess = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"x": x})
    return float(np.abs(got - h).max() / max(1.0, np.abs(h).max()))


def files_size(d: Path, names) -> int:
    return sum((d / n).stat().st_size for n in names if (d / n).exists())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--gb", type=float, default=2.2, help="weights in GB (1e9 bytes)")
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = args.workdir / "infercc-large-model"
    shutil.rmtree(work, ignore_errors=True)
    (work / "out").mkdir(parents=True)
    try:
        t0 = time.perf_counter()
        src, digests = build(work, args.gb, args.dim)
        build_s = time.perf_counter() - t0
        size_in = files_size(work, [src.name, DATA])
        out = work / "out" / "large.opt.onnx"
        run = optimize(src, out, validate=not args.no_validate)
        size_out = files_size(out.parent, [out.name, out.name + ".data"])
        figures = {
            "layers": len(digests) // 2,
            "input_bytes": size_in,
            "output_bytes": size_out,
            "output_files": sorted(p.name for p in out.parent.iterdir()),
            "build_s": round(build_s, 1),
            "optimize_wall_s": round(run["wall_s"], 1),
            "optimize_peak_rss": run["peak_rss"],
            "peak_rss_over_model_size": round(run["peak_rss"] / size_in, 3),
            "nodes_before": run["report"]["nodes_before"],
            "nodes_after": run["report"]["nodes_after"],
            "validation": (run["report"]["validation"] or {}).get("passed"),
            **check_weights(out, digests),
            "max_rel_error_vs_numpy": check_outputs(src, out, args.dim),
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        for k, v in figures.items():
            if isinstance(v, int) and k.endswith(("bytes", "rss")):
                v = f"{v / 2**30:.2f} GiB"
            print(f"{k:26s} {v}")
    ok = figures["weights_identical"] == figures["weights_total"]
    return 0 if ok and figures["max_rel_error_vs_numpy"] < 1e-4 else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
