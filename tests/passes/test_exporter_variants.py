"""Every decoder fusion on the decoders users export: tiny transformers models (Llama, Qwen2,
Phi-3 at full and partial rotary, Gemma, GPT-2; Mistral is Llama's bytes) written by both torch
exporters (TorchScript and dynamo) with transformers' SDPA and eager attention
(tests/data/decoder_exports, made by bench/export_variants.py).

For each export: the fused op counts of `optimize --assume nonempty-sequences`, of
`calibrate --int4 --assume nonempty-sequences` and of the chain (calibrate --int4 on optimize's
output), exact numbers per layer; and under onnxruntime, optimize's output computes what the
export computes (prefill, decode step, a chunk at batch 3, right padding), and the chain what
calibrate --int4 of the export computes.

Every fusion fires on every export; where one stops firing, `infercc optimize X --assume
nonempty-sequences --explain` names the refusal.
GroupQueryAttention needs an onnxruntime whose kernel takes attention_bias and query_seqlens
(`fuse_gqa.runtime_support()`, 1.23 on Python 3.10 has none): on an older one the builds
expect no GroupQueryAttention, and GPT-2's int4 builds MultiHeadAttention (as on a newer one).

The default run builds one export per kind (`FAST`); `-m slow` runs every file.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc import api
from infercc.calib.weight_only import calibrate_int4
from infercc.passes.fuse_gqa import runtime_support
from tests.decoders import DECODER_SHAPES, cache_feeds
from tests.exports import Export, exports

SUPPORT = runtime_support() is None  # this onnxruntime's GroupQueryAttention fits the pass
NONEMPTY = ["nonempty-sequences"]


def assume(e: Export, build: str) -> list[str]:
    """The assumption where a pass rewrites under it: the NaN guard of transformers' SDPA
    (any onnxruntime) or GroupQueryAttention (a newer onnxruntime); an eager export has no
    guard, so on an older onnxruntime, and in GPT-2's int4 build (whose MultiHeadAttention,
    fused first, needs none), the assumption would be refused as having no effect."""
    if e.attention == "sdpa":
        return NONEMPTY
    return NONEMPTY if SUPPORT and not (e.kind == "gpt2" and build == "int4") else []


EXPORTS = {e.name: e for e in exports()}
BUILDS = ("optimize", "int4", "chain")
# one export per kind in the default run; the rest under -m slow
FAST = (
    "llama-torchscript-sdpa",
    "qwen2-torchscript-eager",
    "phi3-torchscript-sdpa",
    "phi3-partial-torchscript-sdpa",
    "gemma-dynamo-sdpa",
    "gpt2-torchscript-sdpa",
)
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention")


def ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def expected(e: Export, build: str) -> dict[str, int]:
    """What every fusion firing on every layer makes: per layer L, RotaryEmbedding on Q and K,
    an attention op; in int4 the four MatMulNBits of a layer (Q/K/V packed in one, O, gate and
    up packed in one, down) and the LM head's, RMSNorm with its residual Add fused at every
    norm but the first (which reads the embeddings alone)."""
    n, int4 = e.layers, build != "optimize"
    if e.kind == "gpt2":  # no rotary, no RMSNorm: LayerNormalization stays (onnxruntime fuses)
        attention = n if (SUPPORT or int4) else 0  # optimize: GQA; int4: MultiHeadAttention
        return {
            "attention": attention,
            "RotaryEmbedding": 0,
            "SkipSimplifiedLayerNormalization": 0,
            "LayerNormalization": 2 * n + 1,
            "MatMulNBits": 4 * n + 1 if int4 else 0,
            "Softmax": n - attention,
        }
    gqa = n if SUPPORT else 0
    return {
        "attention": gqa,
        "RotaryEmbedding": 2 * n,
        "SkipSimplifiedLayerNormalization": 2 * n if int4 else 0,
        "SimplifiedLayerNormalization": 1 if int4 else 0,
        "MatMulNBits": 4 * n + 1 if int4 else 0,
        "Softmax": n - gqa,
    }


def counted(path: Path, keys) -> dict[str, int]:
    got = ops(path)
    return {k: sum(got[a] for a in ATTENTION) if k == "attention" else got[k] for k in keys}


class Builds:
    """Each export's three builds, made once per module on first use."""

    def __init__(self, root: Path):
        self.root = root
        self.done: dict[str, dict[str, Path | Exception]] = {}

    def get(self, name: str, build: str) -> Path:
        if name not in self.done:
            self.done[name] = self._make(EXPORTS[name])
        got = self.done[name][build]
        if isinstance(got, Exception):
            raise got
        return got

    def _make(self, e: Export) -> dict[str, Path | Exception]:
        root = self.root / e.name
        out: dict[str, Path | Exception] = {"export": e.path}
        try:
            api.optimize(
                e.path, root / "opt.onnx", assume=assume(e, "optimize"), run_validation=False
            )
            out["optimize"] = root / "opt.onnx"
        except Exception as exc:  # a refusal fails this export's tests, not the module's
            out["optimize"] = exc
        sources = (("int4", e.path, assume(e, "int4")), ("chain", out["optimize"], []))
        for name, src, assumed in sources:
            if isinstance(src, Exception):
                out[name] = src
                continue
            try:
                calibrate_int4(
                    src, root / name, speed_check=False, accuracy_level=0, assume=assumed
                )
                out[name] = root / name / "model_int4.onnx"
            except Exception as exc:
                out[name] = exc
        return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Builds:
    return Builds(tmp_path_factory.mktemp("variants"))


def _param(name: str, build: str | None = None):
    """The case of `name`'s `build`, or (None) of `name`'s builds computing what they should."""
    marks = [] if name in FAST else [pytest.mark.slow]
    if build is None:
        return pytest.param(name, marks=marks, id=name)
    return pytest.param(name, build, marks=marks, id=f"{name}-{build}")


@pytest.mark.parametrize(("name", "build"), [_param(n, b) for n in EXPORTS for b in BUILDS])
def test_every_fusion_fires(builds, name, build) -> None:
    e = EXPORTS[name]
    want = expected(e, build)
    assert counted(builds.get(name, build), want) == want


def assert_same(a: Path, b: Path, tol: float) -> None:
    pa, pb = onnx.load(a), onnx.load(b)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sa, sb = (
        ort.InferenceSession(p.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for p in (pa, pb)
    )
    for shape in DECODER_SHAPES:
        feeds = cache_feeds(pa, *shape)
        want, got = sa.run(None, feeds), sb.run(None, feeds)
        for w, g, out in zip(want, got, sa.get_outputs(), strict=True):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{out.name} {shape}")


@pytest.mark.parametrize("name", [_param(n) for n in EXPORTS])
def test_optimize_computes_what_the_export_computes(builds, name) -> None:
    """At a prefill, a decode step, a chunk after a past at batch 3, a right-padded prefill
    and a decode step after a right-padded prompt (tests.decoders.DECODER_SHAPES)."""
    assert_same(EXPORTS[name].path, builds.get(name, "optimize"), 1e-4)


@pytest.mark.parametrize("name", [_param(n) for n in EXPORTS])
def test_the_chain_computes_what_int4_of_the_export_computes(builds, name) -> None:
    """The same weights rounded the same way, the same fused ops."""
    assert_same(builds.get(name, "int4"), builds.get(name, "chain"), 1e-4)


def test_mistral_is_llamas_export() -> None:
    """Mistral without a sliding window exports Llama's bytes: one file holds both."""
    from tests.exports import manifest

    same = manifest()["same_as"]
    assert {k for k in same if k.startswith("mistral-")} == {
        f"mistral-{x}-{a}.onnx" for x in ("torchscript", "dynamo") for a in ("sdpa", "eager")
    }
    assert all(v == k.replace("mistral-", "llama-") for k, v in same.items())
