"""int4 decoders against fp32 on this CPU: decode speed, size, and (trained model) accuracy.

Bench-only script (needs torch for the Llama export; onnx-ir for onnxruntime's quantizer).

Models:

- **tiny GPT**, trained: `bench/train_tiny_gpt.py` writes it (run it first). Its held-out
  text (`heldout.npz`, windows of 128 bytes of standard-library docstrings the model never
  saw) measures accuracy; `calib.npz` (training text) calibrates AWQ and GPTQ.
- **Llama-style, ~100 M parameters**, random weights (`decoder_models.TinyLlama`: 12 layers,
  hidden 768, 12 query and 4 KV heads (GQA), RoPE, RMSNorm, SwiGLU 2048, vocabulary 16000,
  untied LM head; RMSNorm gains 1 + 0.1 N(0, 1), weights N(0, 0.02)), exported with the
  TorchScript exporter. Random weights: its rows give speed and size only.

Quantizers, each at block 32: infercc `calibrate --int4` with `rtn`, `awq` and `gptq`
(`--accuracy-level auto`, its default; on the random Llama `rtn` only), `rtn` with
`--accuracy-level 4`, the same with `--assume nonempty-sequences` (the attention into
GroupQueryAttention; every infercc row has the other decoder fusions), and onnxruntime's
`matmul_nbits_quantizer.MatMulNBitsQuantizer` (its DEFAULT algorithm: RTN, asymmetric, the
class default; its RTN/GPTQ configs need Intel's neural_compressor, not installed) with
accuracy_level unset and 4.

Measures, each quantized model against the fp32 model:

- speed: `infercc.runtime.generate.compare_generation` at batch 1, prompt 64, 128 new
  tokens, the two interleaved per step (`--runs` timed generations after one warm-up):
  decode tokens/s ratio (int4 / fp32), TTFT ratio and TPOT ratio (int4 time / fp32 time per
  step pair, p10..p90);
- size: the int4 model's bytes / the fp32 model's bytes (files on disk);
- tiny GPT only: over the held-out windows, each a teacher-forced prefill, next-token top-1
  agreement with fp32 and the perplexity of the held-out bytes (and its ratio to fp32's).

Prints a Markdown table and writes `bench/.cache/int4_decoder.json`.

    python bench/train_tiny_gpt.py && python bench/int4_decoder.py
    python bench/int4_decoder.py --only gpt --runs 2
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

from infercc.analysis.decoder import decoder_signature, prefill_feeds  # noqa: E402
from infercc.calib.weight_only import calibrate_int4, perplexity  # noqa: E402
from infercc.check.compare import run_model  # noqa: E402
from infercc.runtime.artifact import read_skeleton  # noqa: E402
from infercc.runtime.generate import compare_generation  # noqa: E402

CACHE = HERE / ".cache"
GPT_DIR = CACHE / "tiny_gpt"
LLAMA_DIR = CACHE / "llama100m"
OUT = CACHE / "int4_decoder"
BLOCK = 32
NONEMPTY = "nonempty-sequences"  # lets a decoder's attention become GroupQueryAttention
METHODS = ("rtn", "awq", "gptq")


def make_llama(path: Path) -> Path:
    if path.is_file():
        return path
    import torch
    from decoder_models import Config, TinyLlama, export_decoder

    torch.manual_seed(0)
    c = Config(vocab=16000, hidden=768, layers=12, heads=12, kv_heads=4, ffn=2048, context=2048)
    model = TinyLlama(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.ndim == 1:  # RMSNorm gains
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.02)
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"exporting the Llama-style decoder ({sum(p.numel() for p in model.parameters()):,} "
          "parameters)", flush=True)
    return export_decoder(model, path)


def random_calibration(path: Path, vocab: int, count: int = 16) -> Path:
    if not path.is_file():
        ids = np.random.default_rng(0).integers(0, vocab, (count, 1, 128)).astype(np.int64)
        np.savez(path, input_ids=ids)
    return path


# --------------------------------------------------------------------------- quantizers


def infercc_int4(
    model: Path, method: str, data: Path | None, out: Path, level: str | int = "auto",
    assume: tuple[str, ...] = (),
) -> tuple[Path, dict]:
    dest = out / f"infercc_{method}_{level}{'_assumed' if assume else ''}"
    shutil.rmtree(dest, ignore_errors=True)
    t0 = time.perf_counter()
    report = calibrate_int4(
        model, dest, data=data, method=method, block_size=BLOCK, speed_check=False,
        accuracy_level=level, assume=assume,
    )
    seconds = time.perf_counter() - t0
    d = report.to_dict()
    info = {
        "seconds": seconds,
        "accuracy_level": d["accuracy_level"].get("chosen"),
        "level4_vs_level0": (d["accuracy_level"].get("level4_vs_level0") or {}).get(
            "ratio_median"
        ),
        "versus_rtn": (d["versus_rtn"] or {}).get("message"),
        "fusions": d["fusions"],
    }
    return dest / "model_int4.onnx", info


def ort_int4(model: Path, out: Path, accuracy_level: int | None) -> tuple[Path, dict]:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    dest = out / f"ort_level{accuracy_level or 0}.onnx"
    t0 = time.perf_counter()
    q = MatMulNBitsQuantizer(
        onnx.load(str(model)), block_size=BLOCK, accuracy_level=accuracy_level
    )
    q.process()
    q.model.save_model_to_file(str(dest), use_external_data_format=False)
    return dest, {"seconds": time.perf_counter() - t0, "accuracy_level": accuracy_level or 0}


# --------------------------------------------------------------------------- measures


def heldout_quality(fp32: Path, candidate: Path, heldout: np.ndarray, reference=None) -> dict:
    sig = decoder_signature(read_skeleton(fp32))
    feeds = [prefill_feeds(sig, ids) for ids in heldout]
    if reference is None:
        reference = [o[sig.logits] for o in run_model(fp32, feeds, optimize=True)]
    got = [o[sig.logits] for o in run_model(candidate, feeds, optimize=True)]
    pairs = zip(reference, got, strict=True)
    agree = np.mean([np.mean(r.argmax(-1) == g.argmax(-1)) for r, g in pairs])
    ids = [f[sig.input_ids] for f in feeds]
    ppl, ppl_ref = perplexity(got, ids), perplexity(reference, ids)
    return {"top1_agreement": float(agree), "perplexity": ppl, "perplexity_fp32": ppl_ref,
            "perplexity_ratio": ppl / ppl_ref}, reference


def race(fp32: Path, candidate: Path, runs: int, new_tokens: int, prompt_len: int) -> dict:
    r = compare_generation(
        fp32, candidate, new_tokens, prompt_len=prompt_len, batch=1, warmup=1, runs=runs,
        memory=False,
    )
    return {
        "tokens_per_s_ratio": r.tokens_per_s_ratio,
        "fp32_tokens_per_s": r.a.decode_tokens_per_s,
        "int4_tokens_per_s": r.b.decode_tokens_per_s,
        "tpot_ratio": r.tpot_ratio.to_dict(),
        "ttft_ratio": r.ttft_ratio.to_dict(),
        "fp32_tpot_ms": r.a.tpot_p50_ms,
        "int4_tpot_ms": r.b.tpot_p50_ms,
    }


def size_of(path: Path) -> int:
    data = list(path.parent.glob(path.name + "*.data"))
    return path.stat().st_size + sum(p.stat().st_size for p in data)


def bench_model(
    name: str, fp32: Path, calib: Path, heldout: np.ndarray | None, args, methods=METHODS
) -> list:
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    rows, reference = [], None
    candidates = [
        (f"infercc {m}", lambda m=m: infercc_int4(fp32, m, calib, out)) for m in methods
    ] + [
        ("infercc rtn, accuracy_level 4", lambda: infercc_int4(fp32, "rtn", calib, out, 4)),
        (
            "infercc rtn, accuracy_level 4, --assume nonempty-sequences",
            lambda: infercc_int4(fp32, "rtn", calib, out, 4, (NONEMPTY,)),
        ),
        ("onnxruntime MatMulNBitsQuantizer", lambda: ort_int4(fp32, out, None)),
        ("onnxruntime MatMulNBitsQuantizer, accuracy_level 4", lambda: ort_int4(fp32, out, 4)),
    ]
    for label, make in candidates:
        if args.skip and any(s in label for s in args.skip):
            continue
        print(f"[{name}] {label}: quantizing", flush=True)
        path, info = make()
        row = {"model": name, "quantizer": label, **info,
               "size_ratio": size_of(path) / size_of(fp32)}
        if heldout is not None:
            quality, reference = heldout_quality(fp32, path, heldout, reference)
            row.update(quality)
        print(f"[{name}] {label}: racing against fp32", flush=True)
        row.update(race(fp32, path, args.runs, args.new_tokens, args.prompt_len))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- table


def _fmt(x, spec=".3f"):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ppl(r: dict) -> str:
    change = 100 * (r["perplexity_ratio"] - 1)
    return f"{r['perplexity']:.3f} vs {r['perplexity_fp32']:.3f} ({change:+.2f}%) |"


def table(rows: list[dict]) -> str:
    head = ("| model | quantizer | decode tokens/s vs fp32 | TPOT ratio p10..p90 | TTFT ratio | "
            "size vs fp32 | top-1 agreement | perplexity vs fp32 |")
    lines = [head, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tp = r["tpot_ratio"]
        agree = r.get("top1_agreement")
        ppl = r.get("perplexity")
        lines.append(
            f"| {r['model']} | {r['quantizer']} | {_fmt(r['tokens_per_s_ratio'], '.2f')}x | "
            f"{_fmt(tp['p10'], '.2f')}..{_fmt(tp['p90'], '.2f')} | "
            f"{_fmt(r['ttft_ratio']['median'], '.2f')} | {_fmt(r['size_ratio'], '.3f')} | "
            + (f"{100 * agree:.2f}% | " if agree is not None else " | ")
            + (_ppl(r) if ppl is not None else " |")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["gpt", "llama"], default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--skip", nargs="*", default=[], help="skip quantizers naming these")
    args = parser.parse_args()
    from hostinfo import host_line

    print(host_line())  # the CPU, its row, GEMM rate and bandwidth: what the figures depend on
    rows = []
    if args.only in (None, "gpt"):
        gpt = GPT_DIR / "tiny_gpt.onnx"
        if not gpt.is_file():
            sys.exit("run bench/train_tiny_gpt.py first")
        heldout = np.load(GPT_DIR / "heldout.npz")["input_ids"]
        rows += bench_model("tiny GPT (trained)", gpt, GPT_DIR / "calib.npz", heldout, args)
    if args.only in (None, "llama"):
        llama = make_llama(LLAMA_DIR / "llama.onnx")
        calib = random_calibration(LLAMA_DIR / "calib.npz", 16000)
        # random weights: awq and gptq would change accuracy figures this model has none of
        rows += bench_model("Llama-style 100M (random)", llama, calib, None, args, ("rtn",))
    OUT.mkdir(parents=True, exist_ok=True)
    (CACHE / "int4_decoder.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
