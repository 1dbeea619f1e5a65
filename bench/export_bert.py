"""Export a randomly initialised BERT encoder to ONNX in several exporter variants.

Bench-only script: needs torch and transformers, which are NOT infercc dependencies.
No weights are downloaded: the model is built from ``BertConfig`` with a fixed seed.

Variants (file names for the default 12 layers; ``--layers N`` gives ``bert_LN_*``):

* ``bert_base_sdpa_ts.onnx``     attn_implementation="sdpa",  TorchScript exporter, opset 17
* ``bert_base_eager_ts.onnx``    attn_implementation="eager", TorchScript exporter, opset 17
* ``bert_base_sdpa_dynamo.onnx`` attn_implementation="sdpa",  dynamo exporter, default opset,
  single file with weights inline

Each exported (or already present) file is then run under onnxruntime with two input shapes,
compared with the torch model, and its node count and op histogram are printed.

Usage::

    python bench/export_bert.py                  # 12 layers into bench/.cache/
    python bench/export_bert.py --layers 2       # quick model
    python bench/export_bert.py --force --variants sdpa_ts eager_ts
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / ".cache"
VARIANTS = ("sdpa_ts", "eager_ts", "sdpa_dynamo")
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT_NAMES = ["last_hidden_state", "pooler_output"]
TS_OPSET = 17
SEED = 0
TWO_GB = 2 * 1024**3


def model_stem(layers: int) -> str:
    return "bert_base" if layers == 12 else f"bert_L{layers}"


def file_name(layers: int, variant: str) -> str:
    return f"{model_stem(layers)}_{variant}.onnx"


def build_model(layers: int, attn: str):
    """BertModel (random weights, fixed seed) wrapped to take three positional inputs."""
    import torch
    from transformers import BertConfig, BertModel

    class BertWrapper(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                return_dict=False,
            )
            return out[0], out[1]

    torch.manual_seed(SEED)
    config = BertConfig(num_hidden_layers=layers, attn_implementation=attn)
    bert = BertModel(config).eval()
    randomize_constant_params(bert)
    return BertWrapper(bert).eval(), config


def randomize_constant_params(model) -> None:
    """Give biases and LayerNorm gains random values, as in a trained checkpoint.

    ``_init_weights`` sets every bias to 0 and every LayerNorm gain to 1. Both exporters then
    de-duplicate those identical tensors (TorchScript: one initializer + ``Identity`` nodes;
    dynamo: one shared initializer, and a zero Gemm bias dropped), which a real model never
    shows and which would mislead pattern studies. Deterministic (own generator, fixed seed).
    """
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif "LayerNorm" in name and name.endswith(".weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.02)


def make_inputs(batch: int, seq: int, vocab: int, seed: int = 1):
    """int64 input_ids / attention_mask / token_type_ids; the mask pads the tail of row 0."""
    import torch

    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)
    attention_mask = torch.ones(batch, seq, dtype=torch.int64)
    if seq > 2:
        attention_mask[0, seq - seq // 4 :] = 0
    token_type_ids = torch.zeros(batch, seq, dtype=torch.int64)
    token_type_ids[:, seq // 2 :] = 1
    return input_ids, attention_mask, token_type_ids


def export_ts(model, inputs, path: Path) -> None:
    import torch

    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        inputs,
        str(path),
        input_names=INPUT_NAMES,
        output_names=OUTPUT_NAMES,
        dynamic_axes={
            "input_ids": axes,
            "attention_mask": axes,
            "token_type_ids": axes,
            "last_hidden_state": axes,
            "pooler_output": {0: "batch"},
        },
        opset_version=TS_OPSET,
        do_constant_folding=True,
        dynamo=False,
    )


def export_dynamo(model, inputs, path: Path) -> None:
    import torch
    from torch.export import Dim

    batch = Dim("batch", min=1, max=1024)
    seq = Dim("sequence", min=2, max=512)
    shapes = {0: batch, 1: seq}
    program = torch.onnx.export(
        model,
        inputs,
        input_names=INPUT_NAMES,
        output_names=OUTPUT_NAMES,
        dynamic_shapes=(shapes, shapes, shapes),
        dynamo=True,
    )
    # Weights inline (single file) when the proto fits the 2 GB protobuf limit.
    n_bytes = sum(int(p.numel()) * p.element_size() for p in model.parameters())
    program.save(str(path), external_data=n_bytes >= TWO_GB - 64 * 1024**2)


def check_model(path: Path, model) -> dict:
    """Run under onnxruntime (two shapes), compare with torch, return stats."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    proto = onnx.load(str(path), load_external_data=False)
    hist = collections.Counter(n.op_type for n in proto.graph.node)
    func_nodes = sum(len(f.node) for f in proto.functions)
    opsets = {(o.domain or "ai.onnx"): o.version for o in proto.opset_import}
    n_init = len(proto.graph.initializer)
    n_const = hist.get("Constant", 0)
    del proto

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    max_diff = 0.0
    shapes = []
    for batch, seq in ((2, 16), (3, 37)):
        inputs = make_inputs(batch, seq, model.bert.config.vocab_size, seed=batch * 100 + seq)
        feed = {name: t.numpy() for name, t in zip(INPUT_NAMES, inputs, strict=True)}
        got = sess.run(OUTPUT_NAMES, feed)
        with torch.no_grad():
            ref = [t.numpy() for t in model(*inputs)]
        for g, r in zip(got, ref, strict=True):
            # Padded query rows of last_hidden_state are still well-defined in BERT.
            max_diff = max(max_diff, float(np.max(np.abs(g - r))))
        shapes.append(tuple(got[0].shape))
    return {
        "nodes": sum(hist.values()),
        "function_nodes": func_nodes,
        "initializers": n_init,
        "constant_nodes": n_const,
        "opsets": opsets,
        "hist": hist,
        "max_abs_diff": max_diff,
        "out_shapes": shapes,
    }


def fmt_mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    ap.add_argument("--layers", type=int, default=12, help="encoder layers (default 12)")
    ap.add_argument("--force", action="store_true", help="re-export files that already exist")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--batch", type=int, default=2, help="dummy-input batch for tracing")
    ap.add_argument("--seq", type=int, default=16, help="dummy-input sequence for tracing")
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    args = ap.parse_args(argv)

    import torch

    torch.set_grad_enabled(False)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}; layers={args.layers}; out-dir={args.out_dir}")

    written: list[str] = []
    skipped: list[str] = []
    failed: dict[str, str] = {}
    checked: dict[str, dict] = {}
    for variant in args.variants:
        attn, exporter = variant.split("_")
        path = args.out_dir / file_name(args.layers, variant)
        model, config = build_model(args.layers, attn)
        if path.exists() and not args.force:
            print(f"[skip] {path.name} exists ({fmt_mb(path.stat().st_size)}); --force to redo")
            skipped.append(variant)
        else:
            inputs = make_inputs(args.batch, args.seq, config.vocab_size)
            t0 = time.perf_counter()
            try:
                if exporter == "ts":
                    export_ts(model, inputs, path)
                else:
                    export_dynamo(model, inputs, path)
            except Exception as exc:  # report and carry on with the other variants
                msg = " ".join(f"{type(exc).__name__}: {exc}".split())
                print(f"[FAIL] {path.name}: {msg[:400]}")
                failed[variant] = msg
                if path.exists():
                    path.unlink()
                continue
            dt = time.perf_counter() - t0
            print(f"[ok]   {path.name}: {fmt_mb(path.stat().st_size)} in {dt:.1f}s")
            written.append(variant)
        if args.no_check:
            continue
        try:
            checked[variant] = check_model(path, model)
        except Exception as exc:
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())
            print(f"[FAIL] onnxruntime check of {path.name}: {msg[:400]}")
            traceback.print_exc(limit=2, file=sys.stderr)
            failed[variant + " (ort check)"] = msg

    print("\n=== files ===")
    for variant in args.variants:
        path = args.out_dir / file_name(args.layers, variant)
        if path.exists():
            extra = [p for p in args.out_dir.glob(path.name + "*") if p != path]
            note = f" (+{len(extra)} external data files)" if extra else ""
            state = "written" if variant in written else "existing"
            print(f"  {path.name:34s} {fmt_mb(path.stat().st_size):>10s}  {state}{note}")
        else:
            print(f"  {path.name:34s} {'-':>10s}  missing")

    for variant, st in checked.items():
        name = file_name(args.layers, variant)
        print(f"\n=== {name} ===")
        print(
            f"  nodes={st['nodes']} (function nodes {st['function_nodes']}), "
            f"initializers={st['initializers']}, Constant nodes={st['constant_nodes']}, "
            f"opsets={st['opsets']}"
        )
        print(
            f"  onnxruntime OK, output shapes {st['out_shapes']}, "
            f"max |ort - torch| = {st['max_abs_diff']:.2e}"
        )
        hist = ", ".join(f"{op}:{n}" for op, n in sorted(st["hist"].items(), key=lambda x: -x[1]))
        print(f"  ops: {hist}")

    if failed:
        print("\nFAILED: " + ", ".join(failed))
        for k, v in failed.items():
            print(f"  {k}: {v[:300]}")
        return 1
    print("\nall variants OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
