"""Does a decoder fusion pay in generation on this CPU? Fused against unfused, interleaved.

Bench-only script (torch for the Llama export). For each model, the graph after infercc's
default pipeline is raced against the same graph with decoder fusion passes added (each entry
of `--fusions`: `fuse-decoder-attention`, GPT-2's attention with its KV cache into
com.microsoft.MultiHeadAttention; `fuse-rms-norm`, RMSNorm with its residual Add into
(Skip)SimplifiedLayerNormalization; `fuse-rotary-embedding`, RoPE into RotaryEmbedding;
`fuse-group-query-attention`, Llama's attention into GroupQueryAttention, built with
`--assume nonempty-sequences` and after the RoPE fusion; `a+b` adds several) with
`infercc.runtime.generate.compare_generation` at batch 1, prompt 64, 128 new tokens, the two
decoders stepped in lockstep (A B A B): the TPOT ratio fused / unfused (p10..p90), the
tokens/s and TTFT ratios, and whether the tokens agree.

Models: `--model llama` (default; the Llama-style ~100 M random-weight decoder of
`int4_decoder.py`, exported on first use into bench/.cache/llama100m), `--model gpt` (the
trained tiny GPT of `train_tiny_gpt.py`), or a path. `--int4` adds the same races between
int4 builds (`calibrate --int4`, RTN, accuracy level 4), the unfused one built with every
decoder fusion disabled.

    python bench/decoder_fusions.py [--model llama|gpt|PATH] [--runs 3] [--int4]
        [--fusions fuse-rms-norm,fuse-rms-norm+fuse-rotary-embedding]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from infercc.calib.weight_only import calibrate_int4  # noqa: E402
from infercc.ir import load_model, save_model  # noqa: E402
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes  # noqa: E402
from infercc.passes.pipelines import DECODER_FUSIONS  # noqa: E402
from infercc.runtime.generate import compare_generation  # noqa: E402

GPT = HERE / ".cache" / "tiny_gpt" / "tiny_gpt.onnx"
LLAMA = HERE / ".cache" / "llama100m" / "llama.onnx"
OUT = HERE / ".cache" / "decoder_fusions"
ALL = tuple(p for p in DECODER_FUSIONS if p.startswith("fuse-"))
GQA = "fuse-group-query-attention"  # needs RoPE fused first where the model rotates
FUSIONS = (
    "fuse-decoder-attention",
    "fuse-rms-norm",
    "fuse-rotary-embedding",
    f"fuse-rotary-embedding+{GQA}",
    f"fuse-rms-norm+fuse-rotary-embedding+{GQA}",
)
ASSUME = frozenset({"nonempty-sequences"})  # what GroupQueryAttention needs


def build(src: Path, dest: Path, extra: tuple[str, ...]) -> dict:
    """fp32: infercc's default pipeline, then the `extra` decoder fusions."""
    model = load_model(src)
    report = run_passes(model, PassContext(assumptions=ASSUME), (*DEFAULT_PIPELINE, *extra))
    save_model(model, dest)
    return {p: report.passes[p].counts for p in extra}


def build_int4(src: Path, dest: Path, extra: tuple[str, ...]) -> dict:
    """int4 RTN (accuracy level 4) with only the `extra` decoder fusions."""
    shutil.rmtree(dest, ignore_errors=True)
    report = calibrate_int4(
        src, dest, method="rtn", speed_check=False, accuracy_level=4, assume=tuple(ASSUME),
        disable_passes=[p for p in ALL if p not in extra],
    )
    return {p: report.fusions.get(p, {}) for p in extra}


def make(model: Path, kind: str, stem: Path, passes: tuple[str, ...], name: str):
    """The build of `model` (fp32 or int4) with `passes`: (its path, the passes' counts)."""
    if kind == "fp32":
        dest = Path(f"{stem}_{name}.onnx")
        return dest, build(model, dest, passes)
    dest = Path(f"{stem}_{name}")
    return dest / "model_int4.onnx", build_int4(model, dest, passes)


def source(name: str) -> Path:
    if name == "llama":
        from int4_decoder import make_llama

        return make_llama(LLAMA)
    path = GPT if name == "gpt" else Path(name)
    if not path.is_file():
        sys.exit("run bench/train_tiny_gpt.py first" if name == "gpt" else f"no file {path}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="llama", help="llama, gpt or a decoder's path")
    parser.add_argument("--int4", action="store_true",
                        help="also int4 RTN (accuracy level 4) builds, each with its fusions")
    parser.add_argument("--fusions", default=",".join(FUSIONS),
                        help="comma-separated passes, each raced alone; a+b races a and b together")
    args = parser.parse_args()
    from hostinfo import host_line

    print(host_line())  # the CPU, its row, GEMM rate and bandwidth: what the figures depend on
    model = source(args.model)
    tag = args.model if args.model in ("llama", "gpt") else model.stem
    OUT.mkdir(parents=True, exist_ok=True)
    kinds = ["fp32", "int4"] if args.int4 else ["fp32"]
    rows = []
    for kind in kinds:
        label = f"{tag} {kind}"
        stem = OUT / label.replace(" ", "_")

        base, _ = make(model, kind, stem, (), "base")
        for fusion in args.fusions.split(","):
            passes = tuple(fusion.split("+"))  # a+b: the passes together
            fused, counts = make(model, kind, stem, passes, fusion.replace("+", "_"))
            counts = {f"{p}: {k}" if len(passes) > 1 else k: v
                      for p in passes for k, v in counts[p].items()}
            r = compare_generation(base, fused, 128, prompt_len=64, batch=1, runs=args.runs,
                                   memory=False)
            row = {"model": label, "fusion": fusion, "counts": counts,
                   "tpot_ratio": r.tpot_ratio.to_dict(), "tokens_per_s_ratio": r.tokens_per_s_ratio,
                   "ttft_ratio": r.ttft_ratio.to_dict(), "token_agreement": r.token_agreement}
            print(json.dumps(row), flush=True)
            rows.append(row)
    (HERE / ".cache" / f"decoder_fusions_{tag}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| model | fusion | rewrites | TPOT fused / unfused (p50, p10..p90) | tokens/s ratio "
          "| TTFT ratio | tokens agree |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        t = r["tpot_ratio"]
        counts = ", ".join(f"{k} {v}" for k, v in r["counts"].items()) or "none"
        print(f"| {r['model']} | {r['fusion']} | {counts} | "
              f"{t['median']:.3f} ({t['p10']:.3f}..{t['p90']:.3f}) | "
              f"{r['tokens_per_s_ratio']:.3f} | {r['ttft_ratio']['median']:.3f} | "
              f"{r['token_agreement']:.0%} |")


if __name__ == "__main__":
    main()
