"""Regenerate tests/data/decoder_exports: tiny transformers decoders as torch exports them.

Bench-only (torch and transformers; the tests read the checked-in files and never import
either). For each kind of bench/hf_decoders.py's KINDS (Llama, Qwen2, Mistral, Phi-3 at full
and partial rotary, Gemma, GPT-2), each torch exporter (TorchScript, `dynamo=False`, opset 17;
torch.export, `dynamo=True`, opset 18) and each attention implementation of transformers
(`sdpa`, its default, and `eager`): `make_hf(kind, size="tiny", seed=0)` (random weights,
deterministic) exported with its KV cache by `hf_decoders.export`, written as
`{kind}-{exporter}-{attention}.onnx`; an export byte for byte an earlier one (Mistral
without a sliding window is Llama's graph and weights) is not written again, manifest.json's
"same_as" names the file that holds it. A combination an exporter fails on is recorded with the
exporter's error (manifest.json's "failed", printed here) and not written.

Each file is the exporter's output less the dynamo exporter's per-node metadata_props (FX
node, module path, class hierarchy: three quarters of a tiny file's bytes, read by no
runtime). manifest.json lists each file with its kind, exporter, attention, opset and config
(layers, heads, kv heads, head size, hidden, vocab), and the torch / transformers / onnx
versions that wrote them; README.md says the same for a reader.

    PYTHONPATH=src:. /tmp/benchenv/bin/python bench/export_variants.py [--only llama,gpt2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hf_decoders  # noqa: E402

OUT = HERE.parent / "tests" / "data" / "decoder_exports"
EXPORTERS = {"torchscript": False, "dynamo": True}
ATTENTIONS = ("sdpa", "eager")


def config_of(folder: Path) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(folder)
    heads = cfg.num_attention_heads
    return {
        "layers": cfg.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_size": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
        "partial_rotary_factor": getattr(cfg, "partial_rotary_factor", None),
        "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
    }


def clean(path: Path) -> None:
    """Drop the dynamo exporter's per-node metadata_props (each node's FX node, module path
    and class hierarchy: three quarters of a tiny file, and nothing a runtime reads) and the
    nodes' doc strings. The graph, its names and its value_info stay as exported."""
    import onnx

    model = onnx.load(path)
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(model, path)


def last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def main() -> None:
    import onnx
    import torch
    import transformers

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", help="comma-separated kinds (default: all)")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    kinds = a.only.split(",") if a.only else list(hf_decoders.KINDS)
    a.out.mkdir(parents=True, exist_ok=True)
    manifest_path = a.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    files = {f["file"]: f for f in manifest.get("files", []) if f["kind"] not in kinds}
    failed = {
        (f["kind"], f["exporter"], f["attention"]): f
        for f in manifest.get("failed", [])
        if f["kind"] not in kinds
    }
    same_as = {k: v for k, v in manifest.get("same_as", {}).items()
                if k.rsplit("-", 2)[0] not in kinds and v in files}
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            folder = hf_decoders.make_hf(kind, Path(tmp) / kind, size="tiny", seed=0)
            config = config_of(folder)
            for exporter, dynamo in EXPORTERS.items():
                for attention in ATTENTIONS:
                    name = f"{kind}-{exporter}-{attention}.onnx"
                    path = a.out / name
                    torch.manual_seed(0)
                    try:
                        hf_decoders.export(folder, path, dynamo=dynamo, attention=attention)
                    except Exception as exc:  # an exporter's refusal is a result here
                        path.unlink(missing_ok=True)
                        error = last_line(exc)
                        traceback.print_exc(limit=2)
                        print(f"FAILED {name}: {error}")
                        failed[kind, exporter, attention] = {
                            "kind": kind, "exporter": exporter, "attention": attention,
                            "error": error,
                        }
                        continue
                    clean(path)
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    twin = next((f["file"] for f in files.values()
                                 if f.get("sha256") == digest and f["file"] != name), None)
                    if twin is not None:  # byte for byte an earlier export: one copy kept
                        path.unlink()
                        same_as[name] = twin
                        print(f"{name} is {twin} byte for byte: not written")
                        continue
                    opset = next(o.version for o in onnx.load(path).opset_import
                                 if o.domain in ("", "ai.onnx"))
                    files[name] = {
                        "file": name, "kind": kind, "exporter": exporter,
                        "attention": attention, "opset": opset, "config": config,
                        "bytes": path.stat().st_size, "sha256": digest,
                    }
                    failed.pop((kind, exporter, attention), None)
                    print(f"wrote {name}: {path.stat().st_size} bytes")
    manifest = {
        "made_by": "bench/export_variants.py",
        "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "onnxscript": _version("onnxscript"),
        },
        "files": [files[k] for k in sorted(files)],
        "failed": [failed[k] for k in sorted(failed)],
        "same_as": dict(sorted(same_as.items())),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f["bytes"] for f in manifest["files"])
    print(f"{len(manifest['files'])} files, {total} bytes; {len(manifest['failed'])} failed")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    main()
