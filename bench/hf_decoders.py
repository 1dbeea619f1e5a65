"""transformers decoders as users export them: random weights, a KV-cache export, a trained one.

Bench-only (needs torch and transformers; never imported by the package or its tests).

- `make_hf(kind, folder, size)`: a `save_pretrained` folder of one of KINDS (Llama, Qwen2 with
  GQA and q/k/v biases, Mistral, Phi-3 with fused qkv_proj/gate_up_proj at full and partial
  rotary, Gemma with MQA, head 256 (16 at "tiny") and GeGLU, GPT-2 with learned positions,
  LayerNorm and Conv1D projections) with random weights N(0, 0.02), non-zero biases and norm
  gains 1 + 0.1 N(0, 1) (a unit gain or a zero bias would hide a pattern that forgets them).
- `export(folder, path, dynamo, attention)`: `torch.onnx.export` of the model with its KV
  cache, as a user writes it: inputs `input_ids [batch, seq]`, `attention_mask [batch, total]`,
  `past_key_values.{i}.key/value [batch, kv_heads, past, head]`; outputs `logits` and
  `present.{i}.key/value`; SDPA attention (transformers' default) or `attention="eager"`
  (transformers' own matmuls and softmax); positions from the cache (transformers' default
  when no position_ids are given: past .. past + seq). `dynamo=False` is the TorchScript
  exporter (opset 17), `dynamo=True` torch.export (opset 18). These are the names
  onnxruntime-genai's builder gives its model, so one runtime loop drives both.
- `train_hf(kind, folder, minutes)`: a tiny model of `kind` trained on standard-library
  docstrings (bench/train_tiny_gpt.py's corpus, its held-out windows kept for agreement), so
  greedy agreement means something.

    python bench/hf_decoders.py qwen2 /tmp/qwen2 --export /tmp/qwen2.onnx
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

KINDS = ("llama", "qwen2", "mistral", "phi3", "phi3-partial", "gemma", "gpt2")

# (hidden, layers, heads, kv heads, intermediate, vocab): "issue" is about 110-130 M
# parameters (the sizes the decoder issue measured), "small" a few M (a quick check), "tiny"
# about 30 k (100-160 KB a file: the exports tests/data/decoder_exports checks in; its sizes
# differ from one another so that no two dimensions coincide by chance).
SIZES = {
    "tiny": (32, 2, 4, 2, 96, 80),
    "small": (256, 2, 8, 2, 512, 4096),
    "issue": (768, 12, 12, 2, 2048, 32000),
}


def _config(kind: str, size: str):
    import transformers as tf

    hidden, layers, heads, kv, inter, vocab = SIZES[size]
    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
    )
    if kind == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=False), tf.LlamaForCausalLM
    if kind == "mistral":
        return tf.MistralConfig(**common, sliding_window=None), tf.MistralForCausalLM
    if kind == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=True), tf.Qwen2ForCausalLM
    if kind in ("phi3", "phi3-partial"):
        common["num_key_value_heads"] = heads  # Phi-3 mini: MHA, fused qkv_proj
        rotary = 1.0 if kind == "phi3" else 0.5
        return (
            tf.Phi3Config(**common, partial_rotary_factor=rotary, tie_word_embeddings=False,
                          original_max_position_embeddings=2048,
                          pad_token_id=0),
            tf.Phi3ForCausalLM,
        )
    if kind == "gemma":  # MQA, heads wider than hidden / heads (Gemma 7B: 16 x 256 > 3072)
        head_dim, q_heads = (16, heads) if size == "tiny" else (256, max(1, heads // 3))
        common.update(num_key_value_heads=1, head_dim=head_dim, num_attention_heads=q_heads)
        return (
            tf.GemmaConfig(**common, hidden_activation="gelu_pytorch_tanh"),
            tf.GemmaForCausalLM,
        )
    if kind == "gpt2":  # MHA, learned positions, LayerNorm, GELU MLP, Conv1D projections
        gpt = tf.GPT2Config(
            vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_inner=inter,
            n_positions=128 if size == "tiny" else 1024, tie_word_embeddings=True,
        )
        return gpt, tf.GPT2LMHeadModel
    raise SystemExit(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


def _perturb(model) -> None:
    """Biases non-zero, norm gains away from 1 (random weights otherwise N(0, 0.02))."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif ("norm" in name or ".ln_" in name) and p.dim() == 1 and "bias" not in name:
                base = 0.0 if "gemma" in type(model).__name__.lower() else 1.0  # Gemma: 1 + w
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))


def save_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer over the ids' decimal spellings: onnxruntime-genai's builder
    loads a tokenizer from the folder (no model hub is reached)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({str(i): i for i in range(vocab)}, unk_token="0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="0", pad_token="0", bos_token="1", eos_token="2"
    ).save_pretrained(folder)


def make_hf(kind: str, folder: Path, size: str = "small", seed: int = 0) -> Path:
    import torch

    torch.manual_seed(seed)
    config, cls = _config(kind, size)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
    model = cls(config).eval()
    _perturb(model)
    model.save_pretrained(folder)
    save_tokenizer(folder, config.vocab_size)
    return folder


def export(folder: Path, path: Path, dynamo: bool = False, attention: str = "sdpa") -> Path:
    """The KV-cache export of `folder` (module docstring); `attention` is transformers'
    attn_implementation: "sdpa" (its default) or "eager" (the matmuls and softmax written out)."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attention).eval()
    cfg = model.config
    layers = cfg.num_hidden_layers
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    class WithCache(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, *past):
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)]
            cache = DynamicCache(ddp_cache_data=pairs, config=cfg)
            # positions from the cache (transformers' default, cache_position): past..past+seq
            out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    batch, seq, past_len = 2, 5, 3
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq + past_len, dtype=torch.long)
    past = [torch.randn(batch, kv, past_len, head) for _ in range(2 * layers)]
    names_in = ["input_ids", "attention_mask"] + [
        f"past_key_values.{i}.{t}" for i in range(layers) for t in ("key", "value")
    ]
    names_out = ["logits"] + [f"present.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in names_in[2:]})
    axes.update({n: {0: "batch", 2: "total"} for n in names_out[1:]})
    path.parent.mkdir(parents=True, exist_ok=True)
    if dynamo:
        dyn = torch.export.Dim.DYNAMIC
        shapes = [{0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple([{0: dyn, 2: dyn}] * len(past))]
        extra = {"dynamic_shapes": tuple(shapes), "external_data": False, "opset_version": 18}
    else:
        extra = {"dynamic_axes": axes, "opset_version": 17}
    with torch.no_grad():
        torch.onnx.export(
            WithCache(model), (ids, mask, *past), str(path), input_names=names_in,
            output_names=names_out, dynamo=dynamo, **extra,
        )
    return path


def train_hf(kind: str, folder: Path, minutes: float = 5.0, steps: int = 600, seed: int = 0):
    """A tiny `kind` model trained on stdlib docstrings (bytes as tokens, vocabulary 256)."""
    import torch
    import train_tiny_gpt as tg

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    config, cls = _config(kind, "small")
    config.vocab_size = 256
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 128, 384, 2
    config.num_attention_heads = 4 if kind != "gemma" else 1
    config.num_key_value_heads = config.num_attention_heads if kind.startswith("phi3") else 1
    if kind == "gemma":
        config.head_dim = 128
    model = cls(config)
    train_bytes, held_bytes = tg.corpus()
    data = np.frombuffer(train_bytes, np.uint8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    t0, step, loss = time.time(), 0, float("nan")
    while step < steps and time.time() - t0 < 60 * minutes:
        starts = rng.integers(0, data.size - 129, 8)
        batch = torch.from_numpy(np.stack([data[s : s + 129] for s in starts]).astype(np.int64))
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        loss, step = float(out.loss), step + 1
    model.eval().save_pretrained(folder)
    save_tokenizer(folder, config.vocab_size)
    held = tg.windows(held_bytes, 64, seed=1)
    np.save(folder / "heldout.npy", held)
    info = {"kind": kind, "steps": step, "train_loss": loss, "seconds": time.time() - t0}
    (folder / "training.json").write_text(json.dumps(info, indent=1))
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("folder", type=Path)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--export", type=Path, help="also write the KV-cache export here")
    p.add_argument("--dynamo", action="store_true", help="torch.export-based exporter")
    p.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument("--train-minutes", type=float, help="train instead of random weights")
    a = p.parse_args()
    if a.train_minutes:
        print(train_hf(a.kind, a.folder, a.train_minutes))
    else:
        make_hf(a.kind, a.folder, a.size)
    if a.export:
        print(export(a.folder, a.export, a.dynamo, a.attention))


if __name__ == "__main__":
    main()
