"""The tiny transformers exports checked in under tests/data/decoder_exports.

bench/export_variants.py wrote them (torch and transformers are never imported by the tests);
its manifest.json lists each file with its kind, exporter, attention implementation, opset
and config, and the exports that are another's bytes (`same_as`) or that an exporter refused
(`failed`). See tests/data/decoder_exports/README.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "decoder_exports"


@dataclass(frozen=True)
class Export:
    """One checked-in export and what made it."""

    name: str  # the file's stem: "{kind}-{exporter}-{attention}"
    path: Path
    kind: str  # llama, qwen2, phi3, phi3-partial, gemma, gpt2 (mistral: llama's bytes)
    exporter: str  # torchscript (dynamo=False, opset 17) or dynamo (torch.export, opset 18)
    attention: str  # transformers' attn_implementation: sdpa or eager
    config: dict  # layers, heads, kv_heads, head_size, hidden, vocab, ...

    @property
    def layers(self) -> int:
        return int(self.config["layers"])


@cache
def manifest() -> dict:
    return json.loads((DATA / "manifest.json").read_text())


def exports() -> list[Export]:
    """Every checked-in file, in the manifest's order."""
    return [
        Export(
            f["file"].removesuffix(".onnx"),
            DATA / f["file"],
            f["kind"],
            f["exporter"],
            f["attention"],
            f["config"],
        )
        for f in manifest()["files"]
    ]
