"""Train a small GPT on the docstrings of Python's standard library; export it with a KV cache.

Bench-only script (needs torch: `pip install torch==2.13.0`). Random weights tell nothing
about quantization error; these weights are trained, on text every Python ships with.

- **Text**: the docstrings of every importable public module of the standard library
  (`sys.stdlib_module_names`, sorted; private, test and GUI modules skipped) and of their
  public classes, functions and methods, cleaned (`inspect.cleandoc`), each once, in a fixed
  order, as UTF-8 bytes (the tokens: byte values, vocabulary 256; no tokenizer).
- **Split**: whole modules, every 10th one in sorted order, are held out; the rest trains.
- **Model**: `decoder_models.TinyGPT` (GPT-2 style), by default 4 layers, hidden 256, 4 heads,
  MLP 1024, context 256: about 3.3 M parameters. AdamW, cosine learning rate from 3e-3, batch
  8 x 128 bytes, fixed seed, `--steps` optimizer steps (default 1000: 1 M training bytes,
  about 6.5 minutes on 2 quiet cores, held-out loss 2.66 nats/byte; far longer on a shared
  machine), stopped early after `--minutes`.
- **Export**: `tiny_gpt.onnx` (TorchScript exporter, opset 17, past/present KV cache); the
  exported model's logits are checked against torch's on a held-out window.

Writes into `--out-dir` (default `bench/.cache/tiny_gpt`): `tiny_gpt.onnx`, `train.bin` and
`heldout.bin` (the raw bytes), `calib.npz` (`input_ids` [N, 1, 128]: windows of the training
text, for `calibrate --data`), `heldout.npz` (the same from the held-out text) and
`training.json` (the configuration, loss curve and held-out loss).

    python bench/train_tiny_gpt.py               # 1000 steps
    python bench/train_tiny_gpt.py --steps 100   # a quick, worse model
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DEFAULT_OUT = HERE / ".cache" / "tiny_gpt"
SKIP_PREFIXES = ("_", "test", "idlelib", "tkinter", "turtle", "lib2to3", "ensurepip", "pydoc_data")
SKIP = {"antigravity", "this", "turtledemo", "msilib", "winreg", "winsound", "_msi", "tty"}
WINDOW = 128
CALIB_SAMPLES = 64
HELDOUT_SAMPLES = 64


def stdlib_docstrings() -> list[tuple[str, list[str]]]:
    """(module, its docstrings), modules in sorted order."""
    seen: set[str] = set()
    found = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith(SKIP_PREFIXES) or name in SKIP:
            continue
        module = _quiet_import(name)
        if module is None:
            continue
        docs = [d for d in _docs_of(module) if d not in seen]
        seen.update(docs)
        if docs:
            found.append((name, docs))
    return found


def _quiet_import(name: str):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 - platform modules, missing C extensions
            return None


def _docs_of(module) -> list[str]:
    docs = [_clean(module.__doc__)]
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        obj = getattr(module, attr, None)
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            docs.append(_clean(obj.__doc__))
            for meth in sorted(vars(obj)):
                if not meth.startswith("_"):
                    docs.append(_clean(getattr(vars(obj)[meth], "__doc__", None)))
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            docs.append(_clean(obj.__doc__))
    return [d for d in docs if d and len(d) > 40]


def _clean(doc) -> str:
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def corpus() -> tuple[bytes, bytes]:
    """(training bytes, held-out bytes): every 10th module held out."""
    train, held = [], []
    for i, (_name, docs) in enumerate(stdlib_docstrings()):
        (held if i % 10 == 9 else train).extend(docs)
    join = "\n\n".join
    return join(train).encode("utf-8"), join(held).encode("utf-8")


def windows(data: bytes, count: int, seed: int) -> np.ndarray:
    """`count` windows of WINDOW bytes at random offsets (fixed seed): [count, 1, WINDOW]."""
    arr = np.frombuffer(data, np.uint8)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, arr.size - WINDOW, count)
    return np.stack([arr[s : s + WINDOW] for s in starts]).astype(np.int64)[:, None, :]


def train(args, train_bytes: bytes, held_bytes: bytes):
    import torch
    from decoder_models import Config, TinyGPT

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    c = Config(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.heads,
               ffn=4 * args.hidden, context=256)
    model = TinyGPT(c)
    params = sum(p.numel() for p in model.parameters())
    data = torch.from_numpy(np.frombuffer(train_bytes, np.uint8).astype(np.int64))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    start, losses, step = time.time(), [], 0
    budget = args.minutes * 60
    total = args.steps
    while step < total and time.time() - start < budget:
        frac = step / total
        for group in opt.param_groups:
            group["lr"] = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        idx = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[i : i + args.seq + 1] for i in idx])
        logits = model.train_logits(batch[:, :-1])
        targets = batch[:, 1:].reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab), targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % 50 == 0:
            print(f"step {step}  loss {np.mean(losses[-50:]):.3f}  {time.time() - start:.0f} s",
                  flush=True)
    held = held_loss(model, held_bytes, args.seq)
    info = {"parameters": params, "steps": step, "seconds": time.time() - start,
            "final_train_loss": float(np.mean(losses[-50:])), "heldout_loss": held,
            "heldout_bits_per_byte": held / math.log(2), "config": vars(c),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "loss_curve": losses[::10]}
    return model, info


def held_loss(model, held: bytes, seq: int) -> float:
    import torch

    arr = torch.from_numpy(np.frombuffer(held, np.uint8).astype(np.int64))
    n = min(64, (arr.numel() - 1) // seq)
    batch = torch.stack([arr[i * seq : i * seq + seq + 1] for i in range(n)])
    with torch.no_grad():
        logits = model.train_logits(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
    return float(loss)


def check_export(model, path: Path, held: np.ndarray) -> float:
    import onnxruntime as ort
    import torch

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = held[0]
    c = model.c
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1])[None]}
    for i in range(c.layers):
        for t in ("key", "value"):
            feeds[f"past_key_values.{i}.{t}"] = np.zeros((1, c.heads, 0, c.head_size), np.float32)
    got = sess.run(["logits"], feeds)[0]
    with torch.no_grad():
        want = model.train_logits(torch.from_numpy(ids)).numpy()
    return float(np.abs(got - want).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (fixed seed)")
    parser.add_argument("--minutes", type=float, default=60.0, help="stop early after this")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    train_bytes, held_bytes = corpus()
    print(f"text: {len(train_bytes):,} training bytes, {len(held_bytes):,} held out", flush=True)
    (out / "train.bin").write_bytes(train_bytes)
    (out / "heldout.bin").write_bytes(held_bytes)
    np.savez(out / "calib.npz", input_ids=windows(train_bytes, CALIB_SAMPLES, 1))
    held = windows(held_bytes, HELDOUT_SAMPLES, 2)
    np.savez(out / "heldout.npz", input_ids=held)
    model, info = train(args, train_bytes, held_bytes)
    from decoder_models import export_decoder

    export_decoder(model, out / "tiny_gpt.onnx")
    info["export_max_abs_diff"] = check_export(model, out / "tiny_gpt.onnx", held)
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"{info['parameters']:,} parameters, {info['steps']} steps in {info['seconds']:.0f} s; "
          f"held-out loss {info['heldout_loss']:.3f} nats/byte "
          f"({info['heldout_bits_per_byte']:.2f} bits); export max abs diff "
          f"{info['export_max_abs_diff']:.2e}; wrote {out}")


if __name__ == "__main__":
    main()
