"""What running onnx's shape inference in a forked, memory-capped child costs.

    python bench/isolation_overhead.py [--rounds 5] [--nodes 20000]

For the shipped examples and a synthetic graph of `--nodes` nodes (bench/large_graph.py's
chain), times `infercc.optimize(..., run_validation=False)` with the child
(`infercc.isolation.ENABLED = True`) and in-process (`False`), interleaved A B A B in one
process, and prints the median of each and their ratio (child / in-process), with the number
of inference calls one optimize sends to the child (the fork server is forked once per
process, not per call).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

import infercc
from infercc import isolation

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def optimize_seconds(src: Path, out: Path, enabled: bool) -> float:
    isolation.ENABLED = enabled
    t0 = time.perf_counter()
    infercc.optimize(src, out, run_validation=False)
    return time.perf_counter() - t0


def count_calls(src: Path, out: Path) -> int:
    calls = 0
    real = isolation.call_isolated

    def counting(*args):
        nonlocal calls
        calls += 1
        return real(*args)

    import infercc.ir.shapes as shapes

    shapes.call_isolated = counting
    try:
        isolation.ENABLED = True
        infercc.optimize(src, out, run_validation=False)
    finally:
        shapes.call_isolated = real
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=20000)
    args = parser.parse_args()
    from large_graph import build

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / f"chain_{args.nodes}.onnx"
        onnx.save(build(args.nodes), big)
        models = [ROOT / "examples" / "small_cnn.onnx", ROOT / "examples" / "tiny_encoder.onnx"]
        print(f"{'model':<22} {'calls':>5} {'child s':>9} {'in-proc s':>9} {'ratio':>6}")
        for src in [*models, big]:
            out = Path(tmp) / "out.onnx"
            optimize_seconds(src, out, True)  # warm imports and caches
            child, inproc = [], []
            for _ in range(args.rounds):
                child.append(optimize_seconds(src, out, True))
                inproc.append(optimize_seconds(src, out, False))
            a, b = statistics.median(child), statistics.median(inproc)
            calls = count_calls(src, out)
            print(f"{src.name:<22} {calls:>5} {a:>9.3f} {b:>9.3f} {a / b:>6.2f}")
    isolation.ENABLED = True


if __name__ == "__main__":
    main()
