"""Every pipeline infercc runs, named in one place.

A pipeline is one or more stages; each stage is one `run_passes` call (its passes repeated to a
fixpoint, `final` passes once after it, `once` passes in the first round only). Stages are
separate where something happens between them: calibration measures ranges on the graph one
stage made before the next stage can use them.

- `optimize`: what `infercc optimize` runs (and `validate --bisect` rebuilds): folding (of
  constants, and of shape arithmetic with symbolic dimensions), no-op and duplicate
  elimination, dead code, the Conv/BatchNormalization, Conv/activation and QKV fusions,
  onnxruntime's Attention op on the cpu target and the attention Softmax NaN guard where no
  row can be empty (or `--assume nonempty-sequences`), MatMul + bias into Gemm, RoPE into
  RotaryEmbedding and, under `--assume nonempty-sequences`, a decoder's attention with its KV
  cache into GroupQueryAttention (cpu target: faster in generation, bench/decoder_fusions.py),
  and last the memory schedule.
- `fp16`: after `optimize`, with `--fp16`: float32 compute to float16, then the Conv/activation
  fusion and dead code. The fusion waits for the precision decision: its FusedConv runs float32
  only, so fused first every Conv of a CNN would have kept float32; optimize runs without it
  in an fp16 build.
- `calibrate-fp32`: the fp32 reference `infercc calibrate` quantizes and compares against: the
  optimize passes with `portable` set (no onnxruntime contrib op, so the int8 model stays
  standard ONNX that TensorRT reads too).
- `decoder-fusions`: decoder fusions (GPT-2's attention with its KV cache into onnxruntime's
  MultiHeadAttention; RMSNorm, with its residual Add, into (Skip)SimplifiedLayerNormalization,
  or the standard RMSNormalization at opset 23 under `--portable`; RoPE into RotaryEmbedding;
  Llama's attention into GroupQueryAttention), run by `calibrate --int4` on the cpu form and
  raced by `bench/decoder_fusions.py`; `optimize` runs the RoPE and GroupQueryAttention ones,
  the only ones that benchmark shows faster on fp32.
- `int8`: `infercc calibrate`'s rewrites, in two stages: the outlier split runs on the fp32
  reference (its ranges are measured on the split graph), then each quantization trial runs
  QDQ quantization and dead code on a fresh copy of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from infercc.errors import InferccError


@dataclass(frozen=True)
class Pipeline:
    """A named pipeline: its stages (each a tuple of pass names) and what it is for."""

    name: str
    stages: tuple[tuple[str, ...], ...]
    doc: str

    @property
    def passes(self) -> tuple[str, ...]:
        """Every pass of the pipeline, in order, once each."""
        return tuple(dict.fromkeys(name for stage in self.stages for name in stage))


OPTIMIZE = Pipeline(
    "optimize",
    (
        (
            "fold-constants",
            "fold-shapes",
            "eliminate-no-ops",
            "eliminate-common-subexpressions",
            "eliminate-dead-code",
            "fuse-conv-bn-relu",
            "fuse-conv-activation",
            "fuse-qkv",
            "emit-attention",
            "remove-nan-guard",
            "fuse-gemm",
            "fuse-rotary-embedding",
            "fuse-group-query-attention",
            "schedule-memory",
        ),
    ),
    "infercc optimize: to a fixpoint (at most 8 rounds), then schedule-memory once",
)
FP16 = Pipeline(
    "fp16",
    (("convert-fp16", "fuse-conv-activation", "eliminate-dead-code"),),
    "infercc optimize --fp16, after optimize (less its fuse-conv-activation, which waits for "
    "the precision decision): float32 compute to float16",
)
_AFTER_PRECISION = ("fuse-conv-activation",)  # what an fp16 build's optimize stage leaves out
CALIBRATE_FP32 = Pipeline(
    "calibrate-fp32",
    OPTIMIZE.stages,
    "infercc calibrate's fp32 reference: the optimize passes, portable (standard ONNX only)",
)
INT8 = Pipeline(
    "int8",
    (("split-outlier-channels",), ("quantize-qdq", "eliminate-dead-code")),
    "infercc calibrate: the outlier split on the fp32 reference, then per trial QDQ + DCE",
)

DECODER_FUSIONS = Pipeline(
    "decoder-fusions",
    (
        (
            "fuse-decoder-attention",
            "fuse-rms-norm",
            "fuse-rotary-embedding",
            "fuse-group-query-attention",
            "eliminate-dead-code",
        ),
    ),
    "after optimize, for decoders on the cpu target: not run by optimize until the generation "
    "benchmark (bench/decoder_fusions.py) shows it faster",
)

PIPELINES: dict[str, Pipeline] = {
    p.name: p for p in (OPTIMIZE, FP16, CALIBRATE_FP32, INT8, DECODER_FUSIONS)
}


def optimize_stages(precision: str) -> list[tuple[str, ...]]:
    """The stages `infercc optimize` runs at `precision` (int8 models come from calibrate)."""
    if precision != "fp16":
        return list(OPTIMIZE.stages)
    first = [tuple(n for n in stage if n not in _AFTER_PRECISION) for stage in OPTIMIZE.stages]
    return [*first, *FP16.stages]


def pipelines_of(name: str) -> list[str]:
    """The names of the pipelines pass `name` belongs to."""
    return [p.name for p in PIPELINES.values() if name in p.passes]


def check_disabled(disabled: Iterable[str], pipelines: Sequence[Pipeline], command: str) -> None:
    """Refuse a `--disable-pass` of a (known) pass that none of `pipelines` runs: it would
    have no effect."""
    runs = [name for p in pipelines for name in p.passes]
    for name in disabled:
        if name not in runs:
            raise InferccError(
                f"--disable-pass {name} has no effect: {command} does not run it",
                f"{command} runs: {', '.join(dict.fromkeys(runs))}",
            )
