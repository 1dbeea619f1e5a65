"""ONNX Runtime artifacts: cold vs warm tuning, and tuned artifact vs onnxruntime defaults.

For each model (the light_* models onnx ships, at their shipped input shape, with random
weights and calibrated BatchNorm statistics from tests/zoo.py — their shipped weights are all
0.02, whose activations shrink into subnormal floats and time the CPU's subnormal arithmetic,
not the model — and BERT-base from bench/.cache at batch 1, sequence 128 when present):

1. build an artifact with `infercc.optimize(..., backend="ort")` into a fresh tuning cache
   (cold: every shape is tuned), then again with the same cache (warm: every shape is a hit),
   and print both backend compile times and their ratio (target: warm <= 20% of cold);
2. run the tuned artifact and the ORIGINAL model with onnxruntime's default options,
   interleaved on the same inputs (`infercc bench --compare`), and print the per-pair time
   ratio original / artifact (above 1: the artifact is faster).

    python bench/ort_artifacts.py [--models resnet50,squeezenet] [--iters 50] [--no-bert]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnx  # noqa: E402

import infercc  # noqa: E402
from infercc.data.profiles import ShapeProfile  # noqa: E402
from infercc.runtime.bench import compare  # noqa: E402
from tests.zoo import LARGE, SMALL, light_path, randomize  # noqa: E402

BERT = Path(__file__).resolve().parent / ".cache" / "bert_base_sdpa_ts.onnx"
BERT_SHAPES = {n: (1, 128) for n in ("input_ids", "attention_mask", "token_type_ids")}


def profiles(shapes: dict[str, tuple[int, ...]] | None) -> list[ShapeProfile]:
    return [ShapeProfile(k, v, v, v) for k, v in (shapes or {}).items()]


def row(name: str, src: Path, shapes: dict | None, iters: int, tmp: Path) -> str:
    cache = tmp / f"{name}-cache"
    cold = infercc.optimize(
        src, tmp / f"{name}-cold", profiles=profiles(shapes), cache_dir=cache, run_validation=False
    )
    warm = infercc.optimize(
        src, tmp / f"{name}-warm", profiles=profiles(shapes), cache_dir=cache, run_validation=False
    )
    c, w = cold.artifact["compile_seconds"], warm.artifact["compile_seconds"]
    hits = [p["cache"] for p in warm.artifact["backend"]["points"]]
    cmp = compare(tmp / f"{name}-warm", src, shapes=shapes, batches=None, warmup=5, iters=iters)
    r = cmp.results[0]
    return (
        f"| {name} | {c:.2f} | {w:.2f} | {w / c:.0%} | {','.join(hits)} | "
        f"{r.a.p50_ms:.3f} | {r.b.p50_ms:.3f} | {r.ratio_median:.3f} | "
        f"{r.ratio_p10:.3f}..{r.ratio_p90:.3f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SMALL + LARGE))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-bert", action="store_true")
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    print(
        "| model | cold tuning s | warm s | warm/cold | warm cache | artifact p50 ms | "
        "original p50 ms | original/artifact | p10..p90 |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            src = Path(tmp) / f"{name}.onnx"
            onnx.save(randomize(onnx.load(light_path(name))), src)
            print(row(name, src, None, args.iters, Path(tmp)), flush=True)
            src.unlink()
        if not args.no_bert and BERT.exists():
            print(row("bert_base (1x128)", BERT, BERT_SHAPES, args.iters, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
