"""infercc's int4 of a user's torch export against onnxruntime-genai's hand-built int4 model.

Bench-only (needs torch, transformers, onnxruntime-genai, onnx-ir, sentencepiece: see
`bench/hf_decoders.py`). For each transformers config (random weights, `save_pretrained`):

1. the user's export: `bench/hf_decoders.export` (torch.onnx.export with a KV cache, SDPA; the
   TorchScript exporter, or torch.export with `--dynamo`);
2. infercc: `infercc calibrate EXPORT --int4 [--assume nonempty-sequences]` (block 32, its
   defaults otherwise);
3. onnxruntime-genai: `python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu
   --extra_options hf_token=false` (offline, from the same folder).

Measured, at batch 1 on this CPU (host line first):

- **same loop**: `infercc.runtime.generate.compare_generation(genai, infercc)`: one plain
  onnxruntime loop feeding `present` back as `past`, the two models interleaved per step:
  decode tokens/s ratio infercc / genai, TPOT p50/p90 of each, TTFT ratio; and TTFT at a
  512-token prompt (`--ttft-prompt`). genai declares its cache's head size as a symbol
  (`kv_cache_dim`); the loop needs it fixed, so its model is raced as a copy whose input
  declarations carry `head_size` from its genai_config.json (the graph is untouched).
- **genai's own generator** (`onnxruntime_genai.Generator`, greedy) against infercc's model in
  the plain loop, alternated run by run: tokens/s ratio infercc / genai-generator.
- each against fp32 in the same loop: tokens/s ratio;
- size on disk (model and its data files), and the peak RSS of one generation (prompt, new
  tokens) of each model in a fresh process (`generate(..., memory=True)`), fp32 included;
- onnxruntime's own `MatMulNBitsQuantizer` (block 32, symmetric) of the export as another row
  (`--skip-ort-quantizer` leaves it out): raced like infercc's builds;
- the fused ops of each model (GroupQueryAttention, RotaryEmbedding, MatMulNBits,
  SkipSimplifiedLayerNormalization, GatherBlockQuantized).
- `--trained`: a tiny model of the same kind trained on standard-library docstrings
  (`hf_decoders.train_hf`), teacher-forced top-1 agreement with fp32 over 64 held-out windows
  and greedy agreement over 8 held-out prompts, for infercc and genai.

Prints a Markdown table and writes `bench/.cache/genai_race.json`.

    python bench/genai_race.py --kinds qwen2 phi3 gemma llama --size issue
    python bench/genai_race.py --kinds qwen2 --size small --runs 1 --new-tokens 16   # a check
    python bench/genai_race.py --kinds qwen2 --trained
    python bench/genai_race.py --kinds qwen2 --build "sym=--assume nonempty-sequences --symmetric"

`--build NAME=ARGS` (repeatable) races another infercc build beside the two above, with those
`calibrate` flags.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import hf_decoders  # noqa: E402
import onnx  # noqa: E402
from hostinfo import host_line  # noqa: E402

from infercc.runtime.generate import compare_generation, generate  # noqa: E402

CACHE = HERE / ".cache" / "genai_race"
ORT_QUANTIZER = "ort quantizer int4"
NONEMPTY = "nonempty-sequences"
FUSED = ("GroupQueryAttention", "RotaryEmbedding", "MatMulNBits",
         "SkipSimplifiedLayerNormalization", "GatherBlockQuantized")


def _run(cmd: list[str], log: Path) -> None:
    with log.open("w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise SystemExit(f"{' '.join(cmd[:4])}... failed ({rc}): {' / '.join(tail)}")


def size_of(model: Path) -> int:
    return sum(p.stat().st_size for p in model.parent.iterdir()
               if p.name == model.name or p.name.startswith(model.name + ".")
               or p.suffix == ".data")


def fused_ops(model: Path) -> dict[str, int]:
    m = onnx.load(str(model), load_external_data=False)
    c = collections.Counter(n.op_type for n in m.graph.node)
    return {op: c.get(op, 0) for op in FUSED} | {"nodes": len(m.graph.node)}


def build_genai(hf: Path, out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
          "-p", "int4", "-e", "cpu", "--extra_options", "hf_token=false"], out.with_suffix(".log"))
    (out / "seconds.txt").write_text(f"{time.perf_counter() - t0:.1f}")
    return out


def pinned_genai(folder: Path) -> Path:
    """genai's model.onnx with its cache's `kv_cache_dim` declared as the head size."""
    head = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for v in [*m.graph.input, *m.graph.output]:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param == "kv_cache_dim":
                d.Clear()
                d.dim_value = head
    path = folder / "model_pinned.onnx"
    onnx.save(m, str(path))
    return path


def builds(extra: list[str]) -> dict[str, list[str]]:
    """infercc's builds raced: its defaults, with the assumption, and each `--build NAME=ARGS`."""
    out = {"infercc": [], "infercc --assume": ["--assume", NONEMPTY]}
    for text in extra:
        name, sep, flags = text.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--build {text!r}: write NAME=ARGS, e.g. 'sym=--symmetric'")
        out[f"infercc {name.strip()}"] = flags.split()
    return out


ORT_INT4 = """
import sys, onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
q = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), block_size=32, is_symmetric=True)
q.process()
q.model.save_model_to_file(sys.argv[2], use_external_data_format=False)
"""


def build_ort_int4(export: Path, out: Path) -> tuple[Path, float]:
    """onnxruntime's MatMulNBitsQuantizer on the user's export (block 32, symmetric RTN, as
    its documentation shows it): no fusion, the export's own attention."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    _run([sys.executable, "-c", ORT_INT4, str(export), str(out / "model.onnx")],
         out.with_suffix(".log"))
    return out / "model.onnx", time.perf_counter() - t0


def peak_rss(model: Path, args) -> int:
    """Peak resident bytes of one generation of `model` in a fresh process (the loop's)."""
    report = generate(model, new_tokens=args.new_tokens, prompt_len=args.prompt_len, batch=1,
                      warmup=0, runs=1, memory=True)
    assert report.stats.memory is not None
    return report.stats.memory.peak_rss_bytes


def build_infercc(export: Path, out: Path, flags: list[str]) -> tuple[Path, float]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [shutil.which("infercc") or "infercc", "calibrate", str(export), "--int4", "-o", str(out),
           *flags]
    t0 = time.perf_counter()
    _run(cmd, out.with_suffix(".log"))
    return out / "model_int4.onnx", time.perf_counter() - t0


def same_loop(genai: Path, ours: Path, args) -> dict:
    r = compare_generation(genai, ours, args.new_tokens, prompt_len=args.prompt_len, batch=1,
                           warmup=1, runs=args.runs, memory=False)
    ttft = compare_generation(genai, ours, 2, prompt_len=args.ttft_prompt, batch=1, warmup=1,
                              runs=args.runs, memory=False)
    return {
        "tokens_per_s_ratio_vs_genai": r.tokens_per_s_ratio,
        "genai_tokens_per_s": r.a.decode_tokens_per_s,
        "infercc_tokens_per_s": r.b.decode_tokens_per_s,
        "genai_tpot_ms": [r.a.tpot_p50_ms, r.a.tpot_p90_ms],
        "infercc_tpot_ms": [r.b.tpot_p50_ms, r.b.tpot_p90_ms],
        "tpot_ratio": r.tpot_ratio.to_dict(),
        "ttft_ratio": r.ttft_ratio.to_dict(),
        f"ttft_ratio_prompt_{args.ttft_prompt}": ttft.ttft_ratio.to_dict(),
        f"genai_ttft_ms_prompt_{args.ttft_prompt}": ttft.a.ttft_ms,
        f"infercc_ttft_ms_prompt_{args.ttft_prompt}": ttft.b.ttft_ms,
    }


def versus_fp32(fp32: Path, model: Path, args) -> float:
    r = compare_generation(fp32, model, args.new_tokens, prompt_len=args.prompt_len, batch=1,
                           warmup=1, runs=args.runs, memory=False)
    return r.tokens_per_s_ratio


def genai_generator_tokens_per_s(folder: Path, prompt: np.ndarray, new_tokens: int) -> float:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    length = prompt.size + new_tokens
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt.reshape(1, -1).astype(np.int32))
    steps = []
    for _ in range(new_tokens - 1):
        if gen.is_done():
            break
        t0 = time.perf_counter()
        gen.generate_next_token()
        steps.append(time.perf_counter() - t0)
    return len(steps) / sum(steps)


def versus_generator(genai_folder: Path, ours: Path, vocab: int, args) -> dict:
    prompt = np.random.default_rng(0).integers(0, vocab, args.prompt_len)
    ratios, gen_rates, our_rates = [], [], []
    genai_generator_tokens_per_s(genai_folder, prompt, 4)  # warm-up
    for _ in range(args.runs):
        g = genai_generator_tokens_per_s(genai_folder, prompt, args.new_tokens)
        o = generate(ours, new_tokens=args.new_tokens, prompt=prompt.reshape(1, -1), warmup=1,
                     runs=1, memory=False).stats.decode_tokens_per_s
        gen_rates.append(g)
        our_rates.append(o)
        ratios.append(o / g)
    return {"tokens_per_s_ratio_vs_genai_generator": statistics.median(ratios),
            "genai_generator_tokens_per_s": statistics.median(gen_rates)}


def agreement(fp32: Path, candidates: dict[str, Path], held: np.ndarray) -> dict:
    from int4_decoder import heldout_quality

    out, reference = {}, None
    for name, path in candidates.items():
        q, reference = heldout_quality(fp32, path, held, reference)
        greedy = [compare_generation(fp32, path, 32, prompt=h[:, :64], warmup=0, runs=1,
                                     memory=False).token_agreement for h in held[:8]]
        out[name] = {"top1_agreement": q["top1_agreement"],
                     "perplexity_ratio": q["perplexity_ratio"],
                     "greedy_agreement": float(np.mean(greedy))}
    return out


def bench_one(kind: str, args) -> dict:
    tag = f"{kind}_{'trained' if args.trained else args.size}_{'dynamo' if args.dynamo else 'ts'}"
    work = CACHE / tag
    work.mkdir(parents=True, exist_ok=True)
    hf = work / "hf"
    if not (hf / "config.json").exists():
        if args.trained:
            print(f"[{tag}] training", hf_decoders.train_hf(kind, hf, args.train_minutes))
        else:
            hf_decoders.make_hf(kind, hf, args.size)
    export = work / "export.onnx"
    if not export.exists():
        hf_decoders.export(hf, export, args.dynamo)
    print(f"[{tag}] building", flush=True)
    genai = build_genai(hf, work / "genai")
    genai_model = pinned_genai(genai)
    row: dict = {"model": tag, "genai_build_s": float((genai / "seconds.txt").read_text()),
                 "builds": builds(args.build)}
    ours: dict[str, Path] = {}
    for name, flags in builds(args.build).items():
        folder = "infercc_" + "".join(c if c.isalnum() else "_" for c in name[8:]).strip("_")
        path, seconds = build_infercc(export, work / folder.rstrip("_"), flags)
        ours[name] = path
        row[f"{name} build_s"] = seconds
    if not args.skip_ort_quantizer:
        path, seconds = build_ort_int4(export, work / "ort_int4")
        ours[ORT_QUANTIZER] = path
        row["builds"][ORT_QUANTIZER] = []
        row[f"{ORT_QUANTIZER} build_s"] = seconds
    row["ops"] = {"export": fused_ops(export), "genai": fused_ops(genai_model),
                  **{k: fused_ops(v) for k, v in ours.items()}}
    row["size_bytes"] = {"fp32": size_of(export), "genai": size_of(genai / "model.onnx"),
                         **{k: size_of(v) for k, v in ours.items()}}
    vocab = onnx.load(str(genai_model), load_external_data=False).graph.output[0]
    vocab = vocab.type.tensor_type.shape.dim[-1].dim_value
    for name, path in ours.items():
        print(f"[{tag}] racing {name} against genai", flush=True)
        row[name] = same_loop(genai_model, path, args)
        row[name].update(versus_generator(genai, path, vocab, args))
        row[name]["tokens_per_s_ratio_vs_fp32"] = versus_fp32(export, path, args)
    row["genai tokens_per_s_ratio_vs_fp32"] = versus_fp32(export, genai_model, args)
    row["peak_rss_bytes"] = {"fp32": peak_rss(export, args), "genai": peak_rss(genai_model, args),
                             **{k: peak_rss(v, args) for k, v in ours.items()}}
    if args.trained:
        held = np.load(hf / "heldout.npy")
        row["agreement"] = agreement(export, {"genai": genai_model, **ours}, held)
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | build | tokens/s vs genai (same loop) | vs genai generator | vs fp32 | "
        "TPOT p50/p90 ms | TTFT ratio (512) | size MiB | peak RSS MiB | "
        "GQA/Rotary/SkipRMS/NBits |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        mib = {k: v / 2**20 for k, v in r["size_bytes"].items()}
        rss = {k: f"{v / 2**20:.0f}" for k, v in r.get("peak_rss_bytes", {}).items()}
        g_ops = r["ops"]["genai"]
        first = next(k for k in r if k.startswith("infercc") and isinstance(r[k], dict))
        tp = r[first]["genai_tpot_ms"]
        lines.append(
            f"| {r['model']} | genai | 1.00x | | {r['genai tokens_per_s_ratio_vs_fp32']:.2f}x | "
            f"{tp[0]:.2f}/{tp[1]:.2f} | 1.00 | {mib['genai']:.1f} | {rss.get('genai', '')} | "
            f"{g_ops['GroupQueryAttention']}/{g_ops['RotaryEmbedding']}/"
            f"{g_ops['SkipSimplifiedLayerNormalization']}/{g_ops['MatMulNBits']} |"
        )
        fp32 = 1.0 / r["genai tokens_per_s_ratio_vs_fp32"]
        lines.append(f"| | fp32 (the export) | {fp32:.2f}x | | 1.00x | | | {mib['fp32']:.1f} | "
                     f"{rss.get('fp32', '')} | |")
        for name in r["builds"]:
            s, o = r[name], r["ops"][name]
            ttft = next(v for k, v in s.items() if k.startswith("ttft_ratio_prompt"))
            lines.append(
                f"| | {name} | {s['tokens_per_s_ratio_vs_genai']:.2f}x | "
                f"{s['tokens_per_s_ratio_vs_genai_generator']:.2f}x | "
                f"{s['tokens_per_s_ratio_vs_fp32']:.2f}x | "
                f"{s['infercc_tpot_ms'][0]:.2f}/{s['infercc_tpot_ms'][1]:.2f} | "
                f"{ttft['median']:.2f} | {mib[name]:.1f} | {rss.get(name, '')} | "
                f"{o['GroupQueryAttention']}/"
                f"{o['RotaryEmbedding']}/{o['SkipSimplifiedLayerNormalization']}/"
                f"{o['MatMulNBits']} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", nargs="+", default=["qwen2", "phi3", "gemma", "llama"],
                   choices=hf_decoders.KINDS)
    p.add_argument("--size", choices=sorted(hf_decoders.SIZES), default="issue")
    p.add_argument("--dynamo", action="store_true", help="torch.export-based exporter")
    p.add_argument("--trained", action="store_true", help="a tiny trained model: agreement")
    p.add_argument("--train-minutes", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--ttft-prompt", type=int, default=512)
    p.add_argument("--skip-ort-quantizer", action="store_true",
                   help="leave out onnxruntime's MatMulNBitsQuantizer row")
    p.add_argument("--build", action="append", default=[], metavar="NAME=ARGS",
                   help="another infercc build to race, with these calibrate flags "
                        "(e.g. 'sym=--assume nonempty-sequences --symmetric'); repeatable")
    args = p.parse_args()
    print(host_line(), flush=True)
    rows = [bench_one(k, args) for k in args.kinds]
    out = HERE / ".cache" / "genai_race.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": host_line(), "rows": rows}, indent=1))
    print(table(rows))
    print(host_line())


if __name__ == "__main__":
    main()
