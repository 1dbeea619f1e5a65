"""Optimize the BERT-base exports with infercc and print what fuse-qkv did, per variant.

Acceptance figure for the optimize issue: QKV fused in all 12 layers of a BERT-base encoder
exported by torch.onnx (TorchScript and dynamo exporters, SDPA and eager attention), and the
optimized model validates against the original under onnxruntime.

    python bench/export_bert.py          # once: writes bench/.cache/bert_base_*.onnx
    python bench/bert_qkv.py [--layers 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from export_bert import DEFAULT_OUT_DIR, VARIANTS, file_name

import infercc


def run(path: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = infercc.optimize(path, Path(tmp) / "opt.onnx", shapes=None)
    qkv = report.passes.get("fuse-qkv", {})
    worst = min((m.cosine for m in report.validation.outputs.values()), default=float("nan"))
    return {
        "model": path.name,
        "nodes_before": report.nodes_before,
        "nodes_after": report.nodes_after,
        "matmul_before": report.ops_before.get("MatMul", 0),
        "matmul_after": report.ops_after.get("MatMul", 0),
        "qkv_groups": qkv.get("groups", 0),
        "validated": report.validation.passed,
        "min_cosine": worst,
        "max_abs": max(m.max_abs for m in report.validation.outputs.values()),
        "seconds": round(report.seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dir", type=Path, default=DEFAULT_OUT_DIR)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for variant in VARIANTS:
        path = args.dir / file_name(args.layers, variant)
        if not path.exists():
            print(f"missing {path}: run bench/export_bert.py first", file=sys.stderr)
            continue
        rows.append(run(path))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            f"{'model':32s} {'nodes':>11s} {'MatMul':>9s} {'QKV groups':>10s} "
            f"{'valid':>6s} {'min cos':>9s} {'max abs':>9s} {'time s':>7s}"
        )
        for r in rows:
            print(
                f"{r['model']:32s} {r['nodes_before']:5d}->{r['nodes_after']:<5d} "
                f"{r['matmul_before']:3d}->{r['matmul_after']:<4d} {r['qkv_groups']:10d} "
                f"{str(r['validated']):>6s} {r['min_cosine']:9.6f} {r['max_abs']:9.2e} "
                f"{r['seconds']:7.2f}"
            )
    ok = rows and all(r["validated"] and r["qkv_groups"] == args.layers for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
