"""Every pipeline infercc runs, named in one place.

A pipeline is one or more stages; each stage is one `run_passes` call (its passes repeated to a
fixpoint, `final` passes once after it, `once` passes in the first round only). Stages are
separate where something happens between them: calibration measures ranges on the graph one
stage made before the next stage can use them.

The decoder fusions are one list, `DECODER_FUSIONS`, in the order they must run: the SDPA
export's Softmax NaN guard out first (`Where(IsNaN(P), 0, P)` sits between the Softmax and the
MatMul by V that either attention fusion matches), GPT-2's attention with its KV cache into
MultiHeadAttention, RMSNorm (with its residual Add) into (Skip)SimplifiedLayerNormalization,
RoPE into RotaryEmbedding before a decoder's attention into GroupQueryAttention (which takes
the rotation along). Every build that fuses a decoder runs that list inside its fp32 stage,
interleaved with folding, no-op and dead-code elimination to one fixpoint (what one fusion
leaves, the next folds away), so a pass added to the list runs in `optimize`, in
`calibrate --int4` and in `calibrate`'s fp32 reference alike. `optimize` leaves out the two
of `FP32_LEAVES_OUT`, each with its reason.

- `optimize`: what `infercc optimize` runs (and `validate --bisect` rebuilds): folding (of
  constants, and of shape arithmetic with symbolic dimensions), no-op and duplicate
  elimination, dead code, the Conv/BatchNormalization, Conv/activation and QKV fusions,
  onnxruntime's Attention op on the cpu target, MatMul + bias into Gemm, the decoder fusions
  (less `FP32_LEAVES_OUT`: the NaN guard where no row can be empty or under `--assume
  nonempty-sequences`, RoPE into RotaryEmbedding and a decoder's attention with its KV cache
  into GroupQueryAttention, its rows that keep no key fixed up unless assumed away, faster
  in generation on the cpu target, bench/decoder_fusions.py), and last the memory schedule.
- `fp16`: after `optimize`, with `--fp16`: float32 compute to float16, then the Conv/activation
  fusion and dead code. The fusion waits for the precision decision: its FusedConv runs float32
  only, so fused first every Conv of a CNN would have kept float32; optimize runs without it
  in an fp16 build.
- `calibrate-fp32`: the fp32 reference `infercc calibrate` quantizes and compares against: the
  optimize passes with `portable` set (no onnxruntime contrib op, so the int8 model stays
  standard ONNX that TensorRT reads too; the decoder fusions make the standard opset-23 ops
  where the model's opset has them). `calibrate --int4 --portable` (and GPU targets) start
  from it too.
- `calibrate-int4`: the fp32 model `calibrate --int4` quantizes into MatMulNBits (the cpu
  target): the optimize passes with every decoder fusion (with int4 weights the rest of a
  decode step is the larger part of its time, so RMSNorm's fusion pays here), less
  `emit-attention` (its Attention op reads the packed Q/K/V weight, which int4 quantizes as
  a MatMul).
- `int8`: `infercc calibrate`'s rewrites, in two stages: the outlier split runs on the fp32
  reference (its ranges are measured on the split graph), then each quantization trial runs
  QDQ quantization and dead code on a fresh copy of it.
- `int4`: `calibrate --int4`'s rewrite: each build (the one shipped, RTN for comparison, the
  other accuracy level) quantizes the weights of a fresh copy of the fp32 model, then dead
  code, in the build's context (so `--verify` lints after it).
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


DECODER_FUSIONS: tuple[str, ...] = (
    "remove-nan-guard",
    "fuse-decoder-attention",
    "fuse-rms-norm",
    "fuse-rotary-embedding",
    "fuse-group-query-attention",
)
# The decoder fusions optimize (fp32) leaves out, and why.
FP32_LEAVES_OUT: dict[str, str] = {
    "fuse-decoder-attention": "not shown faster in generation on fp32 (bench/decoder_fusions.py)",
    "fuse-rms-norm": "not shown faster in generation on fp32 (bench/decoder_fusions.py: "
    "onnxruntime fuses the fp32 RMSNorm itself when it loads the model), and "
    "SimplifiedLayerNormalization is an op onnx.checker does not know",
}


def _fp32_stage(leave_out: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The passes of an fp32 stage, in order, less `leave_out`."""
    passes = (
        "fold-constants",
        "fold-shapes",
        "eliminate-no-ops",
        "eliminate-common-subexpressions",
        "eliminate-dead-code",
        "fuse-conv-bn-relu",
        "fuse-conv-activation",
        "fuse-qkv",
        "emit-attention",
        "fuse-gemm",
        *DECODER_FUSIONS,
        "schedule-memory",
    )
    return tuple(name for name in passes if name not in leave_out)


OPTIMIZE = Pipeline(
    "optimize",
    (_fp32_stage(tuple(FP32_LEAVES_OUT)),),
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
    "infercc calibrate's fp32 reference (and calibrate --int4 --portable's): the optimize "
    "passes, portable (standard ONNX only)",
)
CALIBRATE_INT4 = Pipeline(
    "calibrate-int4",
    (_fp32_stage(("emit-attention",)),),
    "calibrate --int4's fp32 model for MatMulNBits (cpu): the optimize passes with every "
    "decoder fusion, less emit-attention (whose Attention reads the packed Q/K/V weight)",
)
INT8 = Pipeline(
    "int8",
    (("split-outlier-channels",), ("quantize-qdq", "fuse-int8-matmul", "eliminate-dead-code")),
    "infercc calibrate: the outlier split on the fp32 reference, then per trial QDQ (on the cpu "
    "target each projection's bias taken into onnxruntime's MatMulIntegerToFloat) + DCE",
)

INT4 = Pipeline(
    "int4",
    (("quantize-int4", "eliminate-dead-code"),),
    "calibrate --int4: per build, the weights of a fresh copy of the fp32 model to int4, + DCE",
)

PIPELINES: dict[str, Pipeline] = {
    p.name: p for p in (OPTIMIZE, FP16, CALIBRATE_FP32, CALIBRATE_INT4, INT8, INT4)
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
