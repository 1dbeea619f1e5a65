"""Memory plans of the light zoo models and BERT-base, as a Markdown table.

    python bench/memory_table.py [--no-large] [--no-bert]

Each model is optimized first (`infercc.api.optimize(..., run_validation=False)` into a
temporary directory, the default pipeline for the cpu target), then planned at its shipped
input shape (BERT-base: batch 1, sequence 128). Columns: planned tensors, naive
(one buffer each), arena, lower bound (MiB), arena/bound, the heuristic that won, and the peak
of live bytes before and after the schedule-memory pass and the arena planned on the new
order (MiB), and the planning time (seconds, shape inference included).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

import infercc.passes.schedule  # noqa: F401  (registers schedule-memory)
from infercc.api import optimize
from infercc.inputs import resolve_shapes
from infercc.ir import load_model
from infercc.memory import check_plan, plan_memory
from infercc.passes import PassContext
from infercc.passes.schedule import schedule_memory

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
    optimize(src, out, run_validation=False, shapes=shapes, fold_limit=FOLD_LIMIT)
    if shapes is None:
        shapes = resolve_shapes(onnx.load(out, load_external_data=False))
    model = load_model(out)
    t0 = time.perf_counter()
    plan = plan_memory(model, shapes)
    seconds = time.perf_counter() - t0
    check_plan(plan)
    result = schedule_memory(model.graph, PassContext(options={"shapes": shapes}))
    before, after = result.stats["peak_before"], result.stats["peak_after"]
    scheduled = plan_memory(model, shapes) if result.stats["reordered"] else plan
    unknown = f" ({len(plan.unknown)} unknown)" if plan.unknown else ""
    return (
        f"| {name} | {len(plan.tensors)}{unknown} | {plan.naive_bytes / MIB:.1f} | "
        f"{plan.arena_bytes / MIB:.2f} | {plan.lower_bound_bytes / MIB:.2f} | {plan.ratio:.3f} | "
        f"{plan.heuristic} | {before / MIB:.2f} / {after / MIB:.2f} | "
        f"{scheduled.arena_bytes / MIB:.2f} | {seconds:.2f} |"
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
        "| peak before/after schedule MiB | arena after schedule MiB | plan s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src, shapes in models:
            print(row(name, src, shapes, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
