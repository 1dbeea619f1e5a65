"""Memory plans of the light zoo models and BERT-base, as a Markdown table.

    python bench/memory_table.py [--no-large] [--no-bert]

Each model is optimized first (`infercc.api.optimize(..., run_validation=False)` into a
temporary directory, the default pipeline for the cpu target), then planned at its shipped
input shape (BERT-base: batch 1, sequence 128). Columns: planned tensors, naive
(one buffer each), arena, lower bound (MiB), arena/bound, the heuristic that won, and the peak
of live bytes before and after the schedule-memory pass (MiB; the plan is made on the
scheduled order), and the planning time (seconds, shape inference included).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import infercc.passes.schedule  # noqa: F401  (registers schedule-memory)
from infercc.analysis.memory import check_plan, plan_memory
from infercc.api import optimize
from infercc.ir import load_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.zoo import LARGE, SMALL, light_path  # noqa: E402

BERT = ROOT / "bench" / ".cache" / "bert_base_sdpa_ts.onnx"
BERT_SHAPES = {name: (1, 128) for name in ("input_ids", "attention_mask", "token_type_ids")}
MIB = 2**20
# Fold the large models' ConstantOfShape weights (up to 400 MB each) into initializers, so the
# plan sees activations, not weights computed at run time.
FOLD_LIMIT = 2**30


def row(name: str, src: Path, shapes: dict | None, tmp: Path) -> str:
    out = tmp / f"{name}.onnx"
    report = optimize(src, out, run_validation=False, shapes=shapes, fold_limit=FOLD_LIMIT)
    mem = report.memory
    profile = {k: tuple(v) for k, v in mem["shape_profile"].items()}
    model = load_model(out)
    t0 = time.perf_counter()
    plan = plan_memory(model, profile)  # the optimized (and scheduled) order, timed alone
    seconds = time.perf_counter() - t0
    check_plan(plan)
    assert plan.arena_bytes == mem["arena_bytes"]
    unknown = f" ({len(plan.unknown)} unknown)" if plan.unknown else ""
    before, after = mem["peak_before_schedule"] or 0, mem["peak_after_schedule"] or 0
    return (
        f"| {name} | {len(plan.tensors)}{unknown} | {plan.naive_bytes / MIB:.1f} | "
        f"{plan.arena_bytes / MIB:.2f} | {plan.lower_bound_bytes / MIB:.2f} | {plan.ratio:.3f} | "
        f"{plan.heuristic} | {before / MIB:.2f} / {after / MIB:.2f} | {seconds:.2f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-large", action="store_true", help="skip alexnet, vgg19, zfnet512")
    ap.add_argument("--no-bert", action="store_true")
    args = ap.parse_args()
    models = [(n, light_path(n), None) for n in SMALL + ([] if args.no_large else LARGE)]
    if not args.no_bert and BERT.exists():
        models.append(("bert_base (1x128)", BERT, BERT_SHAPES))
    print(
        "| model | tensors | naive MiB | arena MiB | bound MiB | arena/bound | heuristic "
        "| peak before/after schedule MiB | plan s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src, shapes in models:
            print(row(name, src, shapes, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
