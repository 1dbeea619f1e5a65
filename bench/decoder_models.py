"""Small torch decoders with a KV cache, and their ONNX export (bench only: needs torch).

- `TinyGPT`: GPT-2 style (learned positions, pre-LayerNorm, GELU MLP, tied embedding and LM
  head), attention written out as MatMul / Softmax (GPT-2's eager attention).
- `TinyLlama`: Llama style (RMSNorm, rotary position embedding, grouped-query attention,
  SwiGLU MLP, untied LM head), attention through `scaled_dot_product_attention`.

Both take `input_ids`, `attention_mask` [batch, past + new], `position_ids` and
`past_key_values.N.key/value` [batch, kv_heads, past, head_size] and return `logits` and
`present.N.key/value` [batch, kv_heads, past + new, head_size]: the layout
`infercc bench --generate` drives. `export_decoder` writes one with the TorchScript exporter
(`torch.onnx.export(..., dynamo=False)`), all of batch, sequence and past length dynamic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab: int = 256
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 1024
    context: int = 256
    rope_theta: float = 10000.0

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


def _causal_bias(mask: torch.Tensor, new: int, total: int) -> torch.Tensor:
    """[batch, 1, new, total] additive bias: -inf where a key is masked out or in the future."""
    past = total - new
    q = torch.arange(new, device=mask.device).unsqueeze(1) + past
    k = torch.arange(total, device=mask.device).unsqueeze(0)
    allowed = (k <= q).unsqueeze(0).unsqueeze(0) & mask[:, None, None, :].bool()
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(allowed, zero, torch.finfo(torch.float32).min)


class GPTBlock(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.ln1 = nn.LayerNorm(c.hidden)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.proj = nn.Linear(c.hidden, c.hidden)
        self.ln2 = nn.LayerNorm(c.hidden)
        self.fc = nn.Linear(c.hidden, c.ffn)
        self.out = nn.Linear(c.ffn, c.hidden)

    def forward(self, x, bias, past_k, past_v):
        c = self.c
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c.hidden, dim=-1)
        q, k, v = (t.view(b, s, c.heads, c.head_size).transpose(1, 2) for t in (q, k, v))
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_size) + bias
        y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, s, c.hidden)
        x = x + self.proj(y)
        x = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x, k, v


class TinyGPT(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = nn.Embedding(c.context, c.hidden)
        self.blocks = nn.ModuleList(GPTBlock(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.hidden)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.wte(input_ids) + self.wpe(position_ids)
        bias = _causal_bias(attention_mask, input_ids.shape[1], attention_mask.shape[1])
        presents = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, bias, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        logits = self.ln_f(x) @ self.wte.weight.t()
        return (logits, *presents)

    def train_logits(self, ids):
        b, s = ids.shape
        c = self.c
        empty = [torch.zeros(b, c.heads, 0, c.head_size)] * (2 * c.layers)
        pos = torch.arange(s).unsqueeze(0).expand(b, s)
        return self.forward(ids, torch.ones(b, s, dtype=torch.long), pos, *empty)[0]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        d = c.head_size
        self.norm1 = RMSNorm(c.hidden)
        self.q = nn.Linear(c.hidden, c.heads * d, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * d, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * d, bias=False)
        self.o = nn.Linear(c.heads * d, c.hidden, bias=False)
        self.norm2 = RMSNorm(c.hidden)
        self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x, bias, cos, sin, past_k, past_v):
        c = self.c
        b, s, _ = x.shape
        d = c.head_size
        h = self.norm1(x)
        q = self.q(h).view(b, s, c.heads, d).transpose(1, 2)
        k = self.k(h).view(b, s, c.kv_heads, d).transpose(1, 2)
        v = self.v(h).view(b, s, c.kv_heads, d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        groups = c.heads // c.kv_heads
        kk = k.repeat_interleave(groups, dim=1)
        vv = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, kk, vv, attn_mask=bias)
        x = x + self.o(y.transpose(1, 2).reshape(b, s, c.heads * d))
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, k, v


class TinyLlama(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(LlamaBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_size, 2).float() / c.head_size))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.embed(input_ids)
        freqs = position_ids[..., None].float() * self.inv_freq  # [b, s, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [b, 1, s, d]
        cos, sin = emb.cos(), emb.sin()
        bias = _causal_bias(attention_mask, input_ids.shape[1], attention_mask.shape[1])
        presents = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, bias, cos, sin, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (self.lm_head(self.norm(x)), *presents)


def export_decoder(model: nn.Module, path: Path, opset: int = 17) -> Path:
    """TorchScript export with batch, sequence and past length dynamic."""
    c = model.c
    kv = getattr(c, "kv_heads", c.heads)
    b, s, p = 1, 3, 4
    ids = torch.randint(0, c.vocab, (b, s))
    mask = torch.ones(b, p + s, dtype=torch.long)
    pos = torch.arange(p, p + s).unsqueeze(0)
    past = [torch.randn(b, kv, p, c.head_size) * 0.1 for _ in range(2 * c.layers)]
    names = [f"past_key_values.{i}.{t}" for i in range(c.layers) for t in ("key", "value")]
    outs = ["logits"] + [f"present.{i}.{t}" for i in range(c.layers) for t in ("key", "value")]
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in names})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in outs[1:]})
    model.eval()
    with torch.no_grad():
        torch.onnx.export(
            model,
            (ids, mask, pos, *past),
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids", *names],
            output_names=outs,
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    return path
