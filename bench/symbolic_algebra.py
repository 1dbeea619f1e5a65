"""The dimension algebra of infercc.ir.symbolic against sympy, on what shape folding asks.

    python bench/symbolic_algebra.py [--n 20000]

The workload is the one fold-shapes runs on exported transformers: products of a few named
dimensions with constants (batch*seq*64), sums (past + seq), exact division by one term
((batch*seq*64) / (seq*64)), and equality tests, repeated over fresh operands. Both sides do
the same operations in the same order, interleaved in blocks (A B A B); the figure is the ratio
of their times, and sympy's import time is printed apart. sympy is a bench-only dependency
(it comes with torch).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def ours(n: int) -> float:
    from infercc.ir import symbolic as S

    names = [S.sym(x) for x in ("batch", "seq", "past", "heads")]
    t0 = time.perf_counter()
    for i in range(n):
        b, s, p, h = names
        k = i % 7 + 1
        bs = S.mul(S.mul(b, s), 64 * k)
        total = S.add(p, s)
        q = S.exact_div(bs, S.mul(s, 64 * k))
        assert S.equal(q, b) is True
        assert S.equal(total, s) is not True
        S.mul(total, h)
    return time.perf_counter() - t0


def with_sympy(n: int) -> float:
    import sympy

    b, s, p, h = sympy.symbols("batch seq past heads", integer=True, nonnegative=True)
    t0 = time.perf_counter()
    for i in range(n):
        k = i % 7 + 1
        bs = b * s * (64 * k)
        total = p + s
        q = sympy.cancel(bs / (s * 64 * k))
        assert sympy.simplify(q - b) == 0
        assert sympy.simplify(total - s) != 0
        sympy.expand(total * h)
    return time.perf_counter() - t0


def import_time(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="operations per block")
    ap.add_argument("--blocks", type=int, default=5)
    args = ap.parse_args()
    ratios, a_times, b_times = [], [], []
    for _ in range(args.blocks):
        a = ours(args.n)
        b = with_sympy(args.n)
        a_times.append(a)
        b_times.append(b)
        ratios.append(b / a)
    per_a = statistics.median(a_times) / args.n * 1e6
    per_b = statistics.median(b_times) / args.n * 1e6
    print(f"infercc.ir.symbolic: {per_a:8.1f} us per step")
    print(f"sympy:               {per_b:8.1f} us per step")
    print(
        f"sympy / infercc:     {statistics.median(ratios):8.1f}x (median of {args.blocks} blocks)"
    )
    print(
        f"import: infercc.ir.symbolic {import_time('infercc.ir.symbolic'):.3f} s, "
        f"sympy {import_time('sympy'):.3f} s"
    )


if __name__ == "__main__":
    main()
