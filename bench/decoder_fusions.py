"""Does a decoder fusion pay in generation on this CPU? Fused against unfused, interleaved.

Bench-only script. For each model (the trained tiny GPT of `train_tiny_gpt.py`, fp32 and the
int4 RTN model `infercc calibrate --int4` makes of it), the graph after infercc's default
pipeline is raced against the same graph with a decoder fusion pass added
(`fuse-decoder-attention`: attention with its KV cache into com.microsoft.MultiHeadAttention)
with `infercc.runtime.generate.compare_generation` at batch 1, prompt 64, 128 new tokens: the
TPOT ratio fused / unfused (p10..p90) and the tokens/s ratio, and whether the tokens agree.

    python bench/decoder_fusions.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from infercc.calib.weight_only import calibrate_int4  # noqa: E402
from infercc.ir import load_model, save_model  # noqa: E402
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes  # noqa: E402
from infercc.passes.pipelines import DECODER_FUSIONS  # noqa: E402
from infercc.runtime.generate import compare_generation  # noqa: E402

GPT = HERE / ".cache" / "tiny_gpt" / "tiny_gpt.onnx"
OUT = HERE / ".cache" / "decoder_fusions"
FUSIONS = tuple(p for p in DECODER_FUSIONS.passes if p.startswith("fuse-"))


def build(src: Path, dest: Path, extra: tuple[str, ...]) -> dict:
    model = load_model(src)
    report = run_passes(model, PassContext(), (*DEFAULT_PIPELINE, *extra))
    save_model(model, dest)
    return {p: report.passes[p].counts for p in extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", type=Path, default=GPT, help="a decoder (speed only)")
    args = parser.parse_args()
    if not args.model.is_file():
        sys.exit("run bench/train_tiny_gpt.py first")
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(OUT / "int4", ignore_errors=True)
    calibrate_int4(args.model, OUT / "int4", method="rtn", speed_check=False, accuracy_level=0)
    rows = []
    for label, src in (("fp32", args.model), ("int4 rtn", OUT / "int4" / "model_int4.onnx")):
        base = OUT / f"{label.replace(' ', '_')}_base.onnx"
        build(src, base, ())
        for fusion in FUSIONS:
            fused = OUT / f"{label.replace(' ', '_')}_{fusion}.onnx"
            counts = build(src, fused, (fusion,))
            r = compare_generation(base, fused, 128, prompt_len=64, batch=1, runs=args.runs,
                                   memory=False)
            row = {"model": label, "fusion": fusion, "counts": counts[fusion],
                   "tpot_ratio": r.tpot_ratio.to_dict(), "tokens_per_s_ratio": r.tokens_per_s_ratio,
                   "ttft_ratio": r.ttft_ratio.to_dict(), "token_agreement": r.token_agreement}
            print(json.dumps(row), flush=True)
            rows.append(row)
    (HERE / ".cache" / "decoder_fusions.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| model | fusion | fused | TPOT fused / unfused (p50, p10..p90) | tokens/s ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        t = r["tpot_ratio"]
        print(f"| {r['model']} | {r['fusion']} | {r['counts'].get('fused', 0)} | "
              f"{t['median']:.3f} ({t['p10']:.3f}..{t['p90']:.3f}) | "
              f"{r['tokens_per_s_ratio']:.3f} |")


if __name__ == "__main__":
    main()
