"""TensorRT engines for the light_* models and BERT-base: build, validate, rebuild, bench.

For a machine with an NVIDIA GPU, the `tensorrt` package and PyTorch with CUDA (or
cuda-python). Elsewhere it prints why it cannot run (the backend's `available()` reason) and
exits 2.

For each model (the light_* models onnx ships, with random weights and calibrated BatchNorm
statistics from tests/zoo.py, at their shipped input shape; BERT-base from bench/.cache at
batch 1, sequence 128 when present) and each precision (fp32, fp16):

1. build a TensorRT artifact with `infercc.optimize(..., backend="tensorrt")` into a fresh
   cache directory: the engine is validated against onnxruntime on the CPU (the report's
   validation) and the engine inspector's layer precisions are read back;
2. build it again into a second directory with the engine cache off (`tune=False`) and the
   same timing cache: the timing cache must be a hit, and the rebuild time is printed;
3. bench the engine (`infercc.runtime.bench`) and onnxruntime's CPU provider on the original model,
   and print both p50 latencies.

`--json FILE` also writes the rows as JSON (rewritten after each row, so a run cut short keeps
what it measured), with the versions and the GPU; `--deadline S` starts no row after S seconds
from the start and lists the rows it left out. bench/gpu_check.sh uses both.

    python bench/tensorrt_models.py [--models resnet50,squeezenet] [--target h100] [--no-bert]
                                    [--json FILE] [--deadline S] [--iters N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx  # noqa: E402

import infercc  # noqa: E402
from infercc.backends.trt.backend import TensorRTBackend  # noqa: E402
from infercc.data.profiles import ShapeProfile  # noqa: E402
from infercc.errors import InferccError  # noqa: E402
from infercc.runtime.bench import bench  # noqa: E402
from tests.zoo import SMALL, light_path, randomize  # noqa: E402

BERT = Path(__file__).resolve().parent / ".cache" / "bert_base_sdpa_ts.onnx"
BERT_SHAPES = {n: (1, 128) for n in ("input_ids", "attention_mask", "token_type_ids")}


def profiles(shapes: dict[str, tuple[int, ...]] | None) -> list[ShapeProfile]:
    return [ShapeProfile(k, v, v, v) for k, v in (shapes or {}).items()]


def build(src: Path, out: Path, cache: Path, target: str, fp16: bool, shapes, tune: bool):
    t0 = time.perf_counter()
    report = infercc.optimize(
        src,
        out,
        target=target,
        backend="tensorrt",
        profiles=profiles(shapes),
        cache_dir=cache,
        tune=tune,
        fp16=fp16,
    )
    return report, time.perf_counter() - t0


def row(
    name: str, src: Path, shapes, target: str, fp16: bool, tmp: Path, iters: int
) -> dict[str, Any]:
    tag = f"{name}-{'fp16' if fp16 else 'fp32'}"
    cache = tmp / f"{tag}-cache"
    first, t_first = build(src, tmp / f"{tag}-a", cache, target, fp16, shapes, tune=True)
    again, t_again = build(src, tmp / f"{tag}-b", cache, target, fp16, shapes, tune=False)
    section, rebuilt = first.artifact["backend"], again.artifact["backend"]
    trt = bench(tmp / f"{tag}-a", shapes=shapes, batches=None, warmup=10, iters=iters)
    cpu = bench(src, shapes=shapes, batches=None, warmup=5, iters=max(5, iters // 3))
    trt_ms, cpu_ms = trt.results[0].p50_ms, cpu.results[0].p50_ms
    return {
        "model": name,
        "precision": "fp16" if fp16 else "fp32",
        "validated": bool(first.passed),
        "validation": section.get("validation"),
        "layers": dict(sorted(section["precision"].get("layers", {}).items())),
        "build_s": round(t_first, 2),
        "rebuild_s": round(t_again, 2),
        "rebuild_timing_cache": rebuilt["timing_cache"]["status"],
        "tensorrt_p50_ms": trt_ms,
        "onnxruntime_cpu_p50_ms": cpu_ms,
        "speedup_vs_onnxruntime_cpu": round(cpu_ms / trt_ms, 2) if trt_ms else None,
        "fingerprint": section.get("fingerprint"),
    }


def measure(name: str, src: Path, shapes, target: str, fp16: bool, tmp: Path, iters: int):
    """`row`, or the error that stopped it (a failed build is a row that did not validate)."""
    try:
        return row(name, src, shapes, target, fp16, tmp, iters)
    except InferccError as exc:
        precision = "fp16" if fp16 else "fp32"
        return {"model": name, "precision": precision, "validated": False, "error": str(exc)}


def markdown(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {r['model']}-{r['precision']} | NO: {r['error']} |"
    layers = ", ".join(f"{k} {v}" for k, v in r["layers"].items())
    return (
        f"| {r['model']}-{r['precision']} | {'yes' if r['validated'] else 'NO'} | {layers} | "
        f"{r['build_s']:.1f} | {r['rebuild_s']:.1f} ({r['rebuild_timing_cache']}) | "
        f"{r['tensorrt_p50_ms']:.3f} | {r['onnxruntime_cpu_p50_ms']:.3f} |"
    )


def versions() -> dict[str, str]:
    import onnxruntime
    import tensorrt

    return {
        "tensorrt": str(tensorrt.__version__),
        "onnxruntime": onnxruntime.__version__,
        "infercc": infercc.__version__,
        "python": sys.version.split()[0],
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(SMALL))
    ap.add_argument("--target", default="a100", help="recorded; a different GPU only warns")
    ap.add_argument("--no-bert", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows here as JSON")
    ap.add_argument("--deadline", type=float, help="start no row after this many seconds")
    ap.add_argument("--iters", type=int, default=100, help="timed engine runs per row")
    args = ap.parse_args(argv)
    ok, why = TensorRTBackend().available()
    if not ok:
        print(f"cannot run here: {why}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    summary: dict[str, Any] = {"versions": versions(), "rows": [], "left_out": []}
    print(
        "| model | validated | layer precisions | build s | rebuild s (timing cache) "
        "| TensorRT p50 ms | onnxruntime CPU p50 ms |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="infercc-trt-") as tmp_name:
        tmp = Path(tmp_name)
        cases: list[tuple[str, Path, dict | None]] = []
        for name in [m for m in args.models.split(",") if m]:
            path = tmp / f"{name}.onnx"
            onnx.save(randomize(onnx.load(light_path(name))), path)
            cases.append((name, path, None))
        if not args.no_bert and BERT.exists():
            cases.append(("bert-base", BERT, BERT_SHAPES))
        for name, path, shapes in cases:
            for fp16 in (False, True):
                tag = f"{name}-{'fp16' if fp16 else 'fp32'}"
                if args.deadline is not None and time.perf_counter() - started > args.deadline:
                    summary["left_out"].append(tag)
                    print(f"| {tag} | left out: past --deadline {args.deadline:g} s |")
                else:
                    measured = measure(name, path, shapes, args.target, fp16, tmp, args.iters)
                    summary["rows"].append(measured)
                    print(markdown(measured), flush=True)
                if args.json:
                    write_json(args.json, summary)
    return 0 if all(r["validated"] for r in summary["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
