"""Weight-only int4 calibration end to end: `infercc calibrate MODEL --int4 -o DIR`.

`calibrate_int4(model, out_dir, ...)`:

1. **Form.** The cpu target (onnxruntime) gets `com.microsoft.MatMulNBits` (and, with
   `embeddings=True`, GatherBlockQuantized embeddings: float by default,
   `infercc.passes.quantize_int4` says why); `portable=True` or a GPU target (TensorRT) gets
   standard blocked int4 `DequantizeLinear` (opset 21: a model of an older opset is converted with
   `onnx.version_converter` first). Symmetric by default (zero point 8: TensorRT's int4 takes
   no zero point, and it is onnxruntime-genai's form); `symmetric=False` gives the cpu target
   a 4-bit zero point per block (`infercc.passes.quantize_int4`; docs/int4.md has both
   measured).
2. **Samples** (`data`, the same formats as int8). For a decoder (KV-cache I/O,
   `infercc.analysis.decoder`) a sample holds `input_ids` [1, tokens] only: it is run as one
   prefill (empty cache, full mask, positions 0..n-1), so the logits of every position are
   teacher-forced next-token predictions. The last `holdout` fraction is held out. Without
   `data` (RTN only: AWQ and GPTQ need calibration inputs), eight random inputs (decoders: 64
   random token ids each) are the evaluation set, and the report says so.
3. **fp32 first**: on the cpu form the `calibrate-int4` pipeline (`infercc.passes.pipelines`:
   constants folded, Q/K/V projections merged, and every decoder fusion, to one fixpoint:
   under `assume=["nonempty-sequences"]` the SDPA export's NaN guard out, RMSNorm into
   (Skip)SimplifiedLayerNormalization, RoPE into RotaryEmbedding, GPT-2's attention into
   MultiHeadAttention and Llama's into GroupQueryAttention): with int4 weights the rest of a
   decode step is the larger part of its time. The portable form takes int8's portable
   pipeline. Every MatMul/Gemm gets a name. The report lists what each decoder fusion
   fired; `disable_passes` skips any pass of the pipeline. With `bisect` (--bisect) the fp32
   passes are rebuilt from the original and judged against it at fp32's tolerance (the int4
   model is judged against their result, so nothing else would see a fusion that broke it),
   and bisected by `infercc.check.bisection` when they change its outputs: the build then
   fails, nothing written. The report's `refusals` holds every rewrite the fp32 passes and
   the shipped build's quantize-int4 refused (what --explain lists).
4. **Method**: `rtn` rounds to nearest; `awq` (`infercc.calib.awq`) and `gptq`
   (`infercc.calib.gptq`) read the calibration samples' inputs of each weight (one fp32 pass).
   Embedding tables are RTN in every method (a Gather has no input activations to weigh).
5. **Evaluate** on the held-out samples against fp32: per output cosine and max abs error
   (int8's measures); for a decoder also next-token top-1 agreement with fp32 over every
   position and the perplexity of the samples' own next tokens under both models. `awq` and
   `gptq` are also compared with `rtn` at the same block size and symmetry: the report says
   whether the method beat RTN (decoders: lower perplexity; otherwise higher worst cosine),
   and by how much, or that it did not.
6. **Accuracy level** (MatMulNBits only): `auto` starts from the target's CPU row
   (`infercc.calib.forms.accuracy_level_decision`): a row without an int8 kernel for
   MatMulNBits (x86-sse, arm64-neon) takes 0 (fp32 compute) unmeasured. Elsewhere the model
   is built with levels 0 and 4 (int8 compute on the activations) and both are evaluated.
   With `data`, level 4 must lose at most 0.5 points of top-1 agreement (decoders) or 0.001
   of cosine on the held-out samples; on random inputs (no `data`) the change is reported but
   vetoes nothing (random logits flip their top-1 with noise). When the target is this host
   the two are raced interleaved (a decode step at batch 1 after 64 cached tokens for a
   decoder, one evaluation sample otherwise): 0 is kept when level 4's time ratio to 0 has
   p10 above 1, and otherwise (faster, or a race whose p10..p90 crosses 1) the row's level 4
   stands. For a target that is not this host the row's level is taken without a race. Both
   measurements and the row go in the report. An explicit level is taken as is. The block
   size left out is the row's (32).
7. **Speed**: the int4 model raced against the original fp32 one, the same way; not for a
   float16 original whose float32 copies in onnxruntime's CPU session (2x its float16
   weights) would pass `SPEED_COPY_LIMIT_BYTES` (the report's `speed_skipped` says so, with
   the bytes).

Memory: every onnxruntime session of a float16-weight model (the reference, the original) is
alive alone, weights are read memory-mapped one at a time, and freed memory is handed back
between steps (`infercc.util.release_memory`), so that the peak of a large float16 decoder
was 1.51x its weights on the 2 GB bench build (docs/benchmarks.md, "int4 at scale").
8. **Write** (staged, renamed into place): `model_int4.onnx` and `calibration_report.json`
   with the size before (the original's files) and after.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.analysis.decoder import DecoderSignature, pinned_signature, random_call
from infercc.assumptions import check_assumptions, check_used, describe, hints
from infercc.build import Job, Stage, run_steps, stage_context
from infercc.calib.activations import collect_inputs
from infercc.calib.decoder_samples import prompt_calls, prompt_skeleton, random_prompts
from infercc.calib.forms import Int4Row, accuracy_level_decision, int4_row
from infercc.calib.job import load_at_opset, name_targets, read_samples, split_samples
from infercc.calib.report import (
    REPORT_FILE,
    OutputQuality,
    argmax_last,
    calibration_manifest,
    check_calibration_destination,
    default_calibration_dir,
    evaluate,
)
from infercc.check.compare import run_model
from infercc.check.tolerances import calibrated_criterion
from infercc.config import BuildConfig
from infercc.data.feeds import make_inputs
from infercc.data.signature import Shapes, check_shape_names, resolve_shapes
from infercc.errors import InferccError
from infercc.ir import Model, export_model, load_model, save_model
from infercc.outputs import Staging
from infercc.passes.manager import (
    REGISTRY,
    Refusal,
    check_pass_names,
    run_passes,
)
from infercc.passes.pipelines import (
    CALIBRATE_FP32,
    CALIBRATE_INT4,
    DECODER_FUSIONS,
    INT4,
    Pipeline,
    check_disabled,
)
from infercc.passes.quantize_int4 import (
    ACCURACY_LEVELS,
    DEFAULT_BLOCK_SIZE,
    DQ_BLOCK_OPSET,
    EMBEDDINGS_DEFAULT_REASON,
    Blocks,
    Int4Options,
    Int4Report,
    Int4Settings,
    check_block_size,
    check_symmetry,
    embedding_gathers,
    is_target,
    target_weight,
)
from infercc.runtime.artifact import MANIFEST, publish, staging_dir, write_manifest
from infercc.util import json_float, release_memory

logger = logging.getLogger(__name__)

INT4_FILE = "model_int4.onnx"
INT4_PASS = "quantize-int4"
_FP32_FILE = ".fp32.onnx"
_TRIAL_FILE = ".trial.onnx"
_LEVEL_FILE = ".level.onnx"
METHODS = ("rtn", "awq", "gptq")
RANDOM_SAMPLES = 8
# past this many bytes of weights, random evaluation samples are RANDOM_SAMPLES_LARGE, so
# that validation costs about what the build does (a 2 GB decoder: 8 prompts took 62 s of
# evaluation against 21 s of passes, quantize and write)
LARGE_WEIGHT_BYTES = 1 << 30
RANDOM_SAMPLES_LARGE = 2
SPEED_WARMUP, SPEED_ITERS = 10, 60
SPEED_PAST = 64
# The speed race holds a session of the original beside the int4 one. onnxruntime's CPU
# provider computes a float16 MatMul in float32 and, at its default optimization level,
# converts each float16 weight to a float32 copy once (2x the float16 bytes): past this many
# bytes of such copies the race is left out (and the report says so, with the bytes), so
# that the calibration of a large float16 model stays within ~1.5x its weights.
SPEED_COPY_LIMIT_BYTES = 2**30
LEVEL4_MAX_TOP1_LOSS = 0.005  # fraction: 0.5 points
LEVEL4_MAX_COSINE_LOSS = 0.001
BISECT_SAMPLES = 4  # evaluation samples --bisect judges the fp32 rebuilds on

Samples = list[dict[str, np.ndarray]]
Step = Callable[[str], None]
ProgressFn = Callable[[int, int | None], None]


# --------------------------------------------------------------------------- report


@dataclass
class Quality:
    """One int4 candidate against fp32 on the evaluation samples."""

    outputs: dict[str, OutputQuality]
    top1_agreement: float | None = None  # decoders: next-token argmax equal, every position
    perplexity: float | None = None  # decoders: of the samples' own next tokens
    perplexity_fp32: float | None = None

    @property
    def cosine(self) -> float:
        values = [0.0 if o.cosine is None else o.cosine for o in self.outputs.values()]
        return min(values, default=1.0)

    @property
    def perplexity_ratio(self) -> float | None:
        if self.perplexity is None or not self.perplexity_fp32:
            return None
        return self.perplexity / self.perplexity_fp32

    def better_than(self, other: Quality) -> bool:
        if self.perplexity is not None and other.perplexity is not None:
            return self.perplexity < other.perplexity
        return self.cosine > other.cosine

    def to_dict(self) -> dict[str, Any]:
        return {
            "cosine": json_float(self.cosine) if self.outputs else None,
            "top1_agreement": json_float(self.top1_agreement),
            "perplexity": json_float(self.perplexity),
            "perplexity_fp32": json_float(self.perplexity_fp32),
            "perplexity_ratio": json_float(self.perplexity_ratio),
        }


@dataclass
class Race:
    """B against A, interleaved on this host: B's time / A's time."""

    a_ms: float
    b_ms: float
    ratio_median: float
    ratio_p10: float
    ratio_p90: float
    iters: int
    feed: str

    def to_dict(self) -> dict[str, Any]:
        return {k: json_float(v) if isinstance(v, float) else v for k, v in vars(self).items()}


@dataclass
class Int4CalibrationReport:
    model: str
    out_dir: str
    method: str
    form: str
    block_size: int
    symmetric: bool
    samples: dict[str, Any]
    quality: Quality
    quantize: Int4Report
    passed: bool
    message: str
    accuracy_level: dict[str, Any] = field(default_factory=dict)
    size: dict[str, Any] = field(default_factory=dict)
    versus_rtn: dict[str, Any] | None = None
    speed: Race | None = None
    speed_skipped: dict[str, Any] | None = None  # why the race was left out, with the bytes
    decoder: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    fusions: dict[str, dict[str, int]] = field(default_factory=dict)
    assumptions: list[dict[str, Any]] = field(default_factory=list)
    # Assumptions not stated that would have allowed more rewrites (`assumptions.hints`).
    assumption_hints: list[dict[str, Any]] = field(default_factory=list)
    # Every rewrite refused by the passes calibrate --int4 ran (the fp32 pipeline's, then the
    # shipped build's quantize-int4), as optimize's report lists them: what --explain shows.
    refusals: list[dict[str, str]] = field(default_factory=list)
    # --bisect: the verdict of the fp32 passes bisected against the original
    # (`infercc.check.bisection.BisectReport.to_dict()`).
    bisect: dict[str, Any] | None = None
    # wall seconds of the build's steps: load, the fp32 passes, the plan (the fp32 reference
    # saved and run, the method's search), quantize and write, validate (evaluation, the
    # accuracy level, the race); `seconds` is the whole command's
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        q = self.quantize
        return {
            "model": self.model,
            "out_dir": self.out_dir,
            "precision": "int4",
            "method": self.method,
            "form": self.form,
            "block_size": self.block_size,
            "symmetric": self.symmetric,
            "samples": dict(self.samples),
            "outputs": {n: o.to_dict() for n, o in self.quality.outputs.items()},
            **self.quality.to_dict(),
            "quantized_nodes": len(q.quantized),
            "quantized": list(q.quantized),
            "embeddings": list(q.embeddings),
            "kept_float": [
                {"node": node, "reason": reason, "cause": _cause(reason)}
                for node, reason in q.kept_float.items()
            ],
            "input_scales": q.input_scales,
            "accuracy_level": self.accuracy_level,
            "size": self.size,
            "versus_rtn": self.versus_rtn,
            "speed": None if self.speed is None else self.speed.to_dict(),
            "speed_skipped": self.speed_skipped,
            "decoder": self.decoder,
            "fusions": {name: dict(c) for name, c in self.fusions.items()},
            "assumptions": list(self.assumptions),
            "assumption_hints": list(self.assumption_hints),
            "refusals": list(self.refusals),
            "bisect": self.bisect,
            "passed": self.passed,
            "message": self.message,
            "files": list(self.files),
            "seconds": round(self.seconds, 3),
            "timings": {name: _seconds(s) for name, s in (self.timings or {}).items()},
        }


def _seconds(value: float | None) -> float | None:
    seconds = json_float(value)
    return None if seconds is None else round(seconds, 3)


def _cause(reason: str) -> str:
    if reason == "excluded by the user" or "--no-lm-head" in reason:
        return "user"
    if reason.startswith(EMBEDDINGS_DEFAULT_REASON):
        return "default"
    return "quantizer"


# --------------------------------------------------------------------------- options


@dataclass
class Int4Request:
    """What one int4 calibration was asked for, checked (the passes' options, `assume` and
    `disable_passes`, are its `BuildConfig`'s)."""

    method: str = "rtn"
    block_size: int = DEFAULT_BLOCK_SIZE
    symmetric: bool = False
    form: str = "nbits"
    accuracy_level: str | int = "auto"
    lm_head: bool = True
    embeddings: bool = False
    exclude: tuple[str, ...] = ()
    speed_check: bool = True
    on_data: bool = False  # evaluated on the user's samples (accuracy can veto level 4)
    row: Int4Row = field(default_factory=lambda: Int4Row(None, 4, DEFAULT_BLOCK_SIZE, True))
    target: str = "cpu"
    data: str | PathLike[str] | None = None
    num_samples: int | None = None
    holdout: float = 0.2
    preprocess: str | None = None
    shapes: Shapes | None = None
    bisect: bool = False  # check the fp32 passes against the original, bisect them if broken

    def options(self, level: int = 0) -> Int4Options:
        return Int4Options(
            block_size=self.block_size,
            symmetric=self.symmetric,
            form=self.form,
            accuracy_level=level,
            lm_head=self.lm_head,
            embeddings=self.embeddings,
            exclude=self.exclude,
        )


def check_int4_options(
    method: str,
    block_size: int,
    symmetric: bool | None,
    portable: bool,
    target: str,
    accuracy_level: str | int,
    has_data: bool,
) -> tuple[str, bool, str | int]:
    """(form, symmetric, accuracy level) for the options, or one clear InferccError."""
    from infercc.analysis.targets import get_target

    if method not in METHODS:
        raise InferccError(f"unknown int4 method {method!r}", "use rtn, awq or gptq")
    if method != "rtn" and not has_data:
        raise InferccError(
            f"--method {method} needs calibration samples",
            "pass --data DIR (the same formats as int8), or use --method rtn",
        )
    check_block_size(block_size)
    kind = get_target(target).kind
    form = "dq" if portable or kind == "gpu" else "nbits"
    sym = True if symmetric is None else bool(symmetric)
    check_symmetry(sym, kind)
    level = _check_level(accuracy_level, form)
    return form, sym, level


def _check_level(accuracy_level: str | int, form: str) -> str | int:
    if str(accuracy_level) == "auto":
        return "auto"
    try:
        level = int(accuracy_level)
    except ValueError:
        level = -1
    if level not in ACCURACY_LEVELS:
        raise InferccError(
            f"bad accuracy level {accuracy_level!r}",
            "use auto, 0 (unset), 1 (fp32), 2 (fp16), 3 (bf16) or 4 (int8 compute)",
        )
    if form != "nbits":
        raise InferccError(
            "--accuracy-level applies to MatMulNBits (the cpu target), not to the portable "
            "DequantizeLinear form",
            "drop --accuracy-level, or drop --portable for onnxruntime",
        )
    return level


# --------------------------------------------------------------------------- entry point


def calibrate_int4(
    model: str | PathLike[str],
    out_dir: str | PathLike[str] | None = None,
    *,
    data: str | PathLike[str] | None = None,
    method: str = "rtn",
    block_size: int | None = None,
    symmetric: bool | None = None,
    portable: bool = False,
    target: str = "cpu",
    accuracy_level: str | int = "auto",
    exclude: Sequence[str] = (),
    lm_head: bool = True,
    embeddings: bool = False,
    num_samples: int | None = None,
    holdout: float = 0.2,
    preprocess: str | None = None,
    speed_check: bool = True,
    assume: Sequence[str] = (),
    disable_passes: Sequence[str] = (),
    shapes: Shapes | None = None,
    verify: bool = False,
    bisect: bool = False,
    on_step: Step | None = None,
    on_progress: ProgressFn | None = None,
) -> Int4CalibrationReport:
    """Weight-only int4 of `model` into `out_dir` (None: `<stem>.int4/` beside `model`, as
    the command line writes by default) (module docstring). `block_size` None is
    the target's CPU row's (`infercc.calib.forms.int4_row`; 32 on every row). `shapes` pins
    input shapes of the random inputs (--shape; a decoder's calls, `infercc.calib.
    decoder_samples`), refused with `data`. `bisect`: before quantizing, the fp32 passes are
    rebuilt and judged against the original on the evaluation samples at fp32's tolerance, and
    bisected when they change its outputs (`Int4Flow.bisect_fp32`); the run then fails with
    nothing written."""
    t0 = time.perf_counter()
    row = int4_row(target, DEFAULT_BLOCK_SIZE)
    block_size = row.block_size if block_size is None else block_size
    form, sym, level = check_int4_options(
        method, block_size, symmetric, portable, target, accuracy_level, data is not None
    )
    assumptions = check_assumptions(assume)
    disabled = tuple(disable_passes)
    check_pass_names(disabled)
    pipeline = int4_pipeline(form)
    if INT4_PASS in disabled:
        raise InferccError(
            f"--disable-pass {INT4_PASS} would leave nothing to calibrate: it is the int4 "
            "rewrite itself",
            "drop it; --exclude NODE keeps one weight in float",
        )
    check_disabled(disabled, [pipeline], "calibrate --int4" + (" --portable" if portable else ""))
    if assumptions and form != "nbits":
        raise InferccError(
            "--assume has no effect on the standard DequantizeLinear form: only the cpu "
            "target's decoder fusions use it",
            "drop --assume, or quantize for the cpu target without --portable",
        )
    if embeddings and form != "nbits":
        raise InferccError(
            "--embeddings has no effect on the standard DequantizeLinear form: standard ONNX "
            "has no block-quantized Gather, so embedding tables stay float there",
            "drop --embeddings, or quantize for the cpu target without --portable",
        )
    if not 0.0 <= holdout < 1.0:
        raise InferccError(f"holdout must be in [0, 1), got {holdout}", "e.g. 0.2")
    request = Int4Request(
        method, int(block_size), sym, form, level, lm_head, embeddings, tuple(exclude)
    )
    request.speed_check = speed_check
    request.row = row
    request.on_data = data is not None
    request.target = target
    request.data, request.num_samples, request.shapes = data, num_samples, shapes
    request.holdout, request.preprocess = holdout, preprocess
    request.bisect = bisect
    src = Path(model)
    dest = default_calibration_dir(src, "int4") if out_dir is None else Path(out_dir)
    check_calibration_destination(dest, src)
    config = BuildConfig(
        target=target,
        portable=form == "dq",
        assume=assumptions,
        disable_passes=disabled,
        verify=verify,
    )
    flow = Int4Flow(src, dest, request, on_progress, t0)
    run_steps(Job(flow, config, on_step or (lambda _text: None)))
    report = flow.report
    assert report is not None  # the build ran to its end
    report.seconds = time.perf_counter() - t0
    return report


def int4_pipeline(form: str) -> Pipeline:
    """The pipeline `calibrate --int4` runs, in the build's context: on the cpu form
    (MatMulNBits) calibrate-int4, the fp32 passes with every decoder fusion (with int4 weights
    the rest of a decode step is the larger part of its time, and these take most of it away:
    bench/int4_decoder.py) under the user's assumptions; on the DequantizeLinear form int8's
    portable calibrate-fp32."""
    return CALIBRATE_INT4 if form == "nbits" else CALIBRATE_FP32


def _load(src: Path, form: str) -> Model:
    """The model's IR; for the DequantizeLinear form at opset >= 21 (converted if older, by
    int8's `load_at_opset`)."""
    if form != "dq":
        return load_model(src)
    ir, _converted_from = load_at_opset(src, DQ_BLOCK_OPSET, "blocked int4 DequantizeLinear")
    return ir


# --------------------------------------------------------------------------- samples


def _signature(
    skeleton: onnx.ModelProto, shapes: Shapes | None, data: str | PathLike[str] | None
) -> DecoderSignature | None:
    """The decoder signature with the --shape pins (refused as optimize refuses them, and
    with --data, whose samples give the shapes); None for a model without a KV cache."""
    if shapes and data is not None:
        raise InferccError(
            "--shape has no effect with --data: the samples give the shapes",
            "drop --shape, or drop --data to quantize on random inputs at those shapes",
        )
    sig = pinned_signature(skeleton, shapes)  # static dims, then the pins of a call
    if sig is None and shapes:
        resolve_shapes(skeleton, shapes)  # as optimize's random inputs resolve them
    return sig


def _samples(
    data: str | PathLike[str] | None,
    skeleton: onnx.ModelProto,
    sig: DecoderSignature | None,
    num_samples: int | None,
    preprocess: str | None,
    shapes: Shapes | None = None,
    weight_bytes: int = 0,
) -> tuple[Samples, str]:
    """The samples, a decoder's as prompts (`infercc.calib.decoder_samples`). With no data, a
    model of more than LARGE_WEIGHT_BYTES of weights gets RANDOM_SAMPLES_LARGE random samples
    (each evaluation runs the whole model per sample, three times: the reference, level 0 and
    level 4), and the report says so."""
    if data is None:
        count, why = RANDOM_SAMPLES, "random inputs (no --data)"
        if weight_bytes > LARGE_WEIGHT_BYTES:
            count = RANDOM_SAMPLES_LARGE
            why = (
                f"random inputs (no --data; {count} of {RANDOM_SAMPLES}: "
                f"{weight_bytes / 1e9:.2f} GB of weights)"
            )
        if sig is None:
            return [make_inputs(skeleton, shapes, seed) for seed in range(count)], why
        return random_prompts(sig, count), why
    if sig is None:
        return read_samples(data, skeleton, num_samples, preprocess), "holdout"
    return read_samples(data, prompt_skeleton(skeleton, sig), num_samples, preprocess), "holdout"


def _split(samples: Samples, holdout: float, evaluated_on: str) -> tuple[Samples, Samples]:
    if evaluated_on != "holdout":
        return [], samples
    calib, evaluation, on_holdout = split_samples(samples, holdout)
    return calib, evaluation


# --------------------------------------------------------------------------- the flow


class Int4Flow:
    """`calibrate --int4` as a `Flow` of the build sequence (`infercc.build`):

    - load: the model (converted to opset 21 for the DequantizeLinear form), its decoder
      signature, the samples (or random inputs) split into calibration and evaluation (a
      decoder's prompts made the calls it takes);
    - pipelines: `int4_pipeline` in the build's context (calibrate-int4 with the decoder
      fusions under the user's assumptions, each of which must have had an effect; the
      portable form: calibrate-fp32);
    - plan: the quantizable nodes named and checked, the fp32 reference saved and run, and
      the method's blocks (AWQ's or GPTQ's search over the calibration inputs; RTN: none);
    - write: the int4 model staged, at accuracy level 0 (or the level given);
    - validate: it is evaluated against fp32 (and compared with RTN), its accuracy level
      chosen (`choose_level`: level 4 measured against 0), and raced against the original;
    - publish: its report and manifest written, the directory moved into place.
    """

    def __init__(
        self,
        src: Path,
        dest: Path,
        request: Int4Request,
        on_progress: ProgressFn | None = None,
        t0: float | None = None,
    ):
        self.src, self.dest, self.job = src, dest, request
        self.on_progress = on_progress
        self.t0 = time.perf_counter() if t0 is None else t0
        self.step: Step = lambda _text: None
        self.stage = Path()  # the staging directory, once the plan opens it
        self.config = BuildConfig()  # the build's, once the plan has it
        self.sig: DecoderSignature | None = None
        self.calib: Samples = []
        self.evaluation: Samples = []
        self.evaluated_on = "holdout"
        self.fp32_path = Path(_FP32_FILE)
        self.float16_bytes = 0  # the original's float16 initializers (`_race_skipped`)
        self.reference: list[dict[str, np.ndarray]] = []
        self.blocks: Callable[[str, np.ndarray], Blocks] | None = None
        self.scales: dict[str, np.ndarray] = {}
        self.fusions: dict[str, dict[str, int]] = {}
        self.assumed: list[dict[str, Any]] = []
        self.hints: list[dict[str, Any]] = []
        self.quantized: Int4Report | None = None
        self.report: Int4CalibrationReport | None = None
        self.refusals: list[dict[str, str]] = []  # the fp32 pipeline's, then quantize-int4's
        self.bisected: dict[str, Any] | None = None  # --bisect's verdict

    # -- the steps ----------------------------------------------------------------

    def load(self, job: Job) -> Model:
        request, src = self.job, self.src
        self.step = job.step
        ir = _load(src, request.form)
        self.float16_bytes = _float16_bytes(ir)
        check_shape_names(ir, request.shapes)  # optimize's refusals, in its words
        skeleton = export_model(ir, with_weights=False)
        sig = self.sig = _signature(skeleton, request.shapes, request.data)
        samples, self.evaluated_on = _samples(
            request.data,
            skeleton,
            sig,
            request.num_samples,
            request.preprocess,
            request.shapes,
            _weight_bytes(ir),
        )
        calib, evaluation = _split(samples, request.holdout, self.evaluated_on)
        if sig is not None:  # prompts become the calls the decoder takes (split first)
            calib, evaluation = prompt_calls(src, sig, calib), prompt_calls(src, sig, evaluation)
        self.calib, self.evaluation = calib, evaluation
        return ir

    def stages(self, job: Job) -> Iterator[Stage]:
        """`int4_pipeline`, then the decoder fusions it made and the assumptions they used
        (each must have had an effect)."""
        pipeline, ctx = int4_pipeline(self.job.form), stage_context(job.config)
        yield Stage(pipeline.name, pipeline.passes, ctx, announce="optimizing fp32")
        self.refusals = [r.to_dict() for r in ctx.refusals]
        if self.job.form != "nbits":
            return
        ran = job.reports[pipeline.name].passes
        check_used(job.config.assume, ctx.assumed, _readers)  # else: no effect
        self.fusions = {
            name: dict(ran[name].counts)
            for name in DECODER_FUSIONS
            if name in ran and any(ran[name].counts.values())
        }
        self.assumed = describe(job.config.assume, ctx.assumed)
        self.hints = hints(ctx.wanted)

    def plan(self, job: Job) -> bool:
        """The optimized model checked and saved as the reference, run on the evaluation
        samples; the method's blocks searched. Under --bisect the fp32 passes are bisected
        first: when they change the original's outputs the build fails here."""
        self.check_optimized(job.ir)
        if self.job.bisect and not self.bisect_fp32(job):
            return False
        self.config = job.config  # each int4 build runs in the build's context
        self.stage = job.stage_dir
        self.fp32_path = self.stage / _FP32_FILE
        save_model(job.ir, self.fp32_path)
        del job.ir  # each build reads the reference back from its file
        release_memory()  # the IR's freed pages back before the reference session
        self.step("running fp32 on the evaluation samples")
        self.reference = run_model(self.fp32_path, self.evaluation)
        release_memory()
        self.blocks, self.scales = self.method(self.calib, self.on_progress)
        return True

    def staging(self) -> Staging:
        return staging_dir(self.dest)

    def write(self, job: Job) -> None:
        request = self.job
        level = 0 if request.accuracy_level == "auto" else int(request.accuracy_level)
        self.step(f"quantizing ({request.method})")
        options = request.options(level)
        self.quantized, refused = self.build(
            options, self.blocks, self.scales, self.stage / INT4_FILE
        )
        self.refusals += [r.to_dict() for r in refused]

    def validate(self, job: Job) -> bool:
        """Evaluate the staged model, compare it with RTN, choose its accuracy level, race it."""
        request = self.job
        assert self.quantized is not None
        quality = self.evaluate(self.stage / INT4_FILE)
        result = self._report({}, quality, self.quantized, True, "")
        self.report = result
        if request.method != "rtn":
            result.versus_rtn = self.versus_rtn(quality)
        result.accuracy_level = self.choose_level(quality, result)
        if request.speed_check:
            result.speed_skipped = _race_skipped(self.float16_bytes)
        if request.speed_check and result.speed_skipped is None:
            self.step("racing int4 against fp32")
            result.speed = self.race(self.src, self.stage / INT4_FILE)
        result.message = _message(result)
        return result.passed

    def publish(self, job: Job) -> None:
        """The report and the manifest (with the criterion the model was accepted at, which
        `infercc validate` applies: one verdict), then the directory moved into place."""
        report, stage, dest = self.report, self.stage, self.dest
        assert report is not None
        report.samples = {
            "calibration": len(self.calib) if self.job.method != "rtn" else 0,
            "evaluation": len(self.evaluation),
            "evaluated_on": self.evaluated_on,
        }
        report.size = _sizes(self.src, stage / INT4_FILE)
        report.files = [str(dest / name) for name in (INT4_FILE, REPORT_FILE, MANIFEST)]
        report.seconds = time.perf_counter() - self.t0
        names = {"pipelines": "passes", "write": "quantize_write"}
        report.timings = {names.get(k, k): v for k, v in job.seconds.items()}
        (stage / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        manifest = calibration_manifest(self.src, self.job.target, report.files, INT4_FILE, "int4")
        manifest["criterion"] = calibrated_criterion(
            report.quality.cosine, "calibrate --int4", self.evaluated_on
        )
        write_manifest(stage, manifest)
        for tmp in stage.glob(".*"):
            tmp.unlink()
        publish(stage, dest)

    def check_optimized(self, ir: Model) -> None:
        """Name the quantizable nodes; refuse exclusions the optimized model lacks, a model with
        no weight to quantize, and --embeddings on a model without an embedding table."""
        name_targets(ir)
        names = {n.name for n in ir.graph}
        unknown = [name for name in self.job.exclude if name not in names]
        if unknown:
            raise InferccError(
                f"exclude names node(s) not in the optimized model: {', '.join(unknown)}",
                "give MatMul/Gemm/Gather node names of the optimized model",
            )
        weights = [n for n in ir.graph if is_target(n) and not isinstance(target_weight(n), str)]
        if not weights:
            raise InferccError(
                "the model has no MatMul or Gemm with a constant float32 or float16 weight to "
                "quantize",
                "int4 weight-only quantization takes MatMul/Gemm weights (and embeddings)",
            )
        if self.job.embeddings and not embedding_gathers(ir):
            raise InferccError(
                "--embeddings has no effect: the model has no embedding table (a Gather on "
                "axis 0 of a constant float32 or float16 [V, D] table)",
                "drop --embeddings",
            )

    def bisect_fp32(self, job: Job) -> bool:
        """--bisect: the fp32 passes rebuilt from the original and judged against it on the
        evaluation samples at fp32's tolerance, bisected as optimize's validation failures are
        (`infercc.check.bisection`: the pass, the rewrite, the node where outputs diverge).
        False (the build fails, a report saying why) when they change the outputs.
        quantize-int4 is not bisected: int4 is lossy by design and calibrate --int4 sets no
        accuracy target for a rewrite to break."""
        from infercc.check.bisection import PipelineConfig, bisect

        pipeline = int4_pipeline(self.job.form)
        config = PipelineConfig(job.config, stages=list(pipeline.stages), source="build")
        feeds = self.evaluation[:BISECT_SAMPLES]
        job.step(f"bisecting the {pipeline.name} passes against the original")
        result = bisect(self.src, feeds, config)
        if not result.reproduced:
            result.message = (
                f"the {pipeline.name} passes keep the original's outputs on {len(feeds)} "
                "sample(s) at fp32's tolerance: no rewrite to bisect (quantize-int4 is lossy "
                "by design and has no accuracy target here; --explain lists the nodes kept "
                "float, --exclude NODE keeps one float)"
            )
        self.bisected = result.to_dict()
        if not result.reproduced:
            return True
        self.report = self._report(
            {"evaluation": len(feeds), "evaluated_on": self.evaluated_on},
            Quality({}),
            Int4Report(),
            False,
            f"the {pipeline.name} passes change the original's outputs before any weight is "
            f"quantized ({result.message}); nothing written",
        )
        return False

    def _report(
        self,
        samples: dict[str, Any],
        quality: Quality,
        quantized: Int4Report,
        passed: bool,
        message: str,
    ) -> Int4CalibrationReport:
        """This build's report: the request's settings, the decoder's signature, the fusions,
        assumptions, refusals and bisection so far, with these figures and verdict."""
        request = self.job
        report = Int4CalibrationReport(
            str(self.src),
            str(self.dest),
            request.method,
            "MatMulNBits" if request.form == "nbits" else "DequantizeLinear",
            request.block_size,
            request.symmetric,
            samples,
            quality,
            quantized,
            passed,
            message,
            decoder=None if self.sig is None else self.sig.to_dict(),
        )
        report.fusions, report.assumptions = self.fusions, self.assumed
        report.assumption_hints = self.hints
        report.refusals, report.bisect = self.refusals, self.bisected
        return report

    # -- methods ----------------------------------------------------------------

    def method(
        self, calib: Samples, on_progress: ProgressFn | None
    ) -> tuple[Callable[[str, np.ndarray], Blocks] | None, dict[str, np.ndarray]]:
        job = self.job
        if job.method == "rtn":
            return None, {}
        ir = load_model(self.fp32_path)
        weights = {}
        for node in ir.graph:
            found = target_weight(node) if is_target(node) else None
            if found is not None and not isinstance(found, str) and node.name not in job.exclude:
                weights[node.name] = (node.input(0).name, found[0])
        self.step(f"collecting calibration inputs ({len(calib)} samples)")
        stats = collect_inputs(
            self.fp32_path,
            calib,
            sorted({x for x, _ in weights.values()}),
            hessian=job.method == "gptq",
            on_progress=on_progress,
        )
        self.step(f"{job.method}: searching {len(weights)} weight(s)")
        if job.method == "gptq":
            from infercc.calib.gptq import gptq_quantize

            blocks = {
                name: gptq_quantize(w, stats[x], job.block_size, job.symmetric)
                for name, (x, w) in weights.items()
            }
            return _fixed(blocks), {}
        from infercc.calib.awq import awq_quantize

        results = {
            name: awq_quantize(w, stats[x], job.block_size, job.symmetric)
            for name, (x, w) in weights.items()
        }
        scales = {n: r.scale for n, r in results.items() if r.alpha > 0.0}
        return _fixed({n: r.blocks for n, r in results.items()}), scales

    def build(
        self,
        options: Int4Options,
        method: Callable[[str, np.ndarray], Blocks] | None,
        scales: dict[str, np.ndarray],
        path: Path,
    ) -> tuple[Int4Report, list[Refusal]]:
        """The int4 pipeline on a fresh copy of the fp32 model, saved at `path`: its report
        and the rewrites it refused."""
        ir = load_model(self.fp32_path)
        ctx = stage_context(self.config, int4=Int4Settings(options, method, scales))
        ran = run_passes(ir, ctx, INT4.passes)
        report = ran.details(INT4_PASS)
        save_model(ir, path)
        refusals = list(ran.refusals)
        del ir, ran
        release_memory()
        return report, refusals

    # -- evaluation -------------------------------------------------------------

    def evaluate(self, path: Path) -> Quality:
        actual = run_model(path, self.evaluation, optimize=True)
        release_memory()
        compared = evaluate(self.reference, actual)
        quality = Quality(compared.outputs)
        if self.sig is not None:
            _decoder_quality(quality, self.sig, self.evaluation, self.reference, actual)
        return quality

    def versus_rtn(self, quality: Quality) -> dict[str, Any]:
        self.step("quantizing rtn for comparison")
        path = self.stage / _TRIAL_FILE
        self.build(
            self.job.options(
                0 if self.job.accuracy_level == "auto" else int(self.job.accuracy_level)
            ),
            None,
            {},
            path,
        )
        rtn = self.evaluate(path)
        path.unlink()
        beats = quality.better_than(rtn)
        measure = "perplexity" if quality.perplexity is not None else "worst-output cosine"
        ours = quality.perplexity if quality.perplexity is not None else quality.cosine
        theirs = rtn.perplexity if rtn.perplexity is not None else rtn.cosine
        verdict = "beat" if beats else "did NOT beat"
        message = f"{self.job.method} {verdict} rtn on {measure}: {ours:.6g} vs {theirs:.6g}"
        logger.info("%s", message)  # the report says it to the user
        return {"rtn": rtn.to_dict(), "beats_rtn": beats, "measure": measure, "message": message}

    # -- accuracy level and speed ---------------------------------------------------

    def choose_level(self, quality: Quality, result: Int4CalibrationReport) -> dict[str, Any]:
        job = self.job
        if job.form != "nbits":
            return {"chosen": None, "auto": False, "reason": "DequantizeLinear form"}
        if job.accuracy_level != "auto":
            return {"chosen": int(job.accuracy_level), "auto": False, "reason": "given"}
        facts = job.row
        if facts.accuracy_level == 0:
            chosen, why = accuracy_level_decision(facts, None, None, True)
            return {"chosen": chosen, "auto": True, "reason": why, "row": facts.to_dict()}
        level4 = self.stage / _LEVEL_FILE
        _with_accuracy_level(self.stage / INT4_FILE, level4, 4)
        race = None
        if facts.on_host:
            self.step("measuring accuracy level 4 (int8 compute) against 0")
            race = self.race(self.stage / INT4_FILE, level4)
        q4 = self.evaluate(level4)
        keeps = _accuracy_kept(quality, q4)
        p10, p90 = (None, None) if race is None else (race.ratio_p10, race.ratio_p90)
        chosen, why = accuracy_level_decision(facts, p10, p90, keeps, job.on_data)
        if chosen == 4:
            level4.replace(self.stage / INT4_FILE)
            result.quality = q4
        else:
            level4.unlink()
        return {
            "chosen": chosen,
            "auto": True,
            "reason": why,
            "row": facts.to_dict(),
            "level4_vs_level0": None if race is None else race.to_dict(),
            "level0": quality.to_dict(),
            "level4": q4.to_dict(),
            "accuracy_measured_on": "held-out samples (--data)" if job.on_data else "random inputs",
            "accuracy_vetoes": job.on_data,
            "level4_keeps_accuracy": keeps,
        }

    def race(self, a: Path, b: Path) -> Race:
        from infercc.runtime.bench import race

        feeds, what = self.speed_feed()
        stats = race(a, b, feeds, warmup=SPEED_WARMUP, iters=SPEED_ITERS)
        release_memory()
        return Race(
            stats.a.p50_ms,
            stats.b.p50_ms,
            stats.ratio_median,
            stats.ratio_p10,
            stats.ratio_p90,
            stats.a.iters,
            what,
        )

    def speed_feed(self) -> tuple[dict[str, np.ndarray], str]:
        if self.sig is None:
            return self.evaluation[0], "one evaluation sample"
        feeds = random_call(self.sig, np.random.default_rng(0), 1, SPEED_PAST, 1, scale=0.1)
        batch, past, new = self.sig.fixed.fit(1, SPEED_PAST, 1)
        step = "one decode step" if new == 1 else f"one call of {new} tokens"
        return feeds, f"{step} at batch {batch} after {past} cached tokens"


def _weight_bytes(ir: Model) -> int:
    """Bytes of the model's constants (read from the headers: no weight is read)."""
    return sum(v.tensor.nbytes for v in ir.graph.initializers.values())


def _float16_bytes(ir: Model) -> int:
    """Bytes of the model's float16 constants (read from the headers: no weight is read)."""
    f16 = onnx.TensorProto.FLOAT16
    return sum(v.tensor.nbytes for v in ir.graph.initializers.values() if v.tensor.dtype == f16)


def _race_skipped(float16_bytes: int) -> dict[str, Any] | None:
    """Why the speed race against the original is left out (None: it is run): onnxruntime's
    CPU session of the original would hold float32 copies of its float16 weights, 2 bytes
    more for each 2, past `SPEED_COPY_LIMIT_BYTES`."""
    copies = 2 * float16_bytes
    if copies <= SPEED_COPY_LIMIT_BYTES:
        return None
    return {
        "reason": (
            f"not raced: onnxruntime's CPU session of the original would hold float32 copies "
            f"of its float16 weights, {copies / 1e9:.2f} GB, past the "
            f"{SPEED_COPY_LIMIT_BYTES / 1e9:.2f} GB a calibration holds for the race"
        ),
        "float16_bytes": float16_bytes,
        "float32_copy_bytes": copies,
        "limit_bytes": SPEED_COPY_LIMIT_BYTES,
    }


def _readers(name: str) -> list[str]:
    """The calibrate-int4 passes that may use assumption `name`."""
    return [p for p in CALIBRATE_INT4.passes if name in REGISTRY[p].assumptions]


def _fixed(blocks: dict[str, Blocks]) -> Callable[[str, np.ndarray], Blocks]:
    """A method handing back precomputed Blocks by node name."""
    return lambda name, _w: blocks[name]


def _accuracy_kept(level0: Quality, level4: Quality) -> bool:
    if level0.top1_agreement is not None and level4.top1_agreement is not None:
        return level4.top1_agreement >= level0.top1_agreement - LEVEL4_MAX_TOP1_LOSS
    return level4.cosine >= level0.cosine - LEVEL4_MAX_COSINE_LOSS


def _with_accuracy_level(src: Path, dest: Path, level: int) -> None:
    ir = load_model(src)
    for node in ir.graph:
        if node.op_type == "MatMulNBits":
            node.set_attr("accuracy_level", level)
    save_model(ir, dest)


# --------------------------------------------------------------------------- decoder measures


def _decoder_quality(
    quality: Quality,
    sig: DecoderSignature,
    samples: Samples,
    reference: list[dict[str, np.ndarray]],
    actual: list[dict[str, np.ndarray]],
) -> None:
    same = total = 0
    nll_ref = nll_act = 0.0
    tokens = 0
    for feeds, ref, got in zip(samples, reference, actual, strict=True):
        r, a = ref[sig.logits], got[sig.logits]
        same += int(np.count_nonzero(argmax_last(r) == argmax_last(a)))
        total += r.shape[0] * r.shape[1]
        ids = np.asarray(feeds[sig.input_ids])
        if ids.shape[1] > 1:
            nll_ref += _nll(r, ids)
            nll_act += _nll(a, ids)
            tokens += ids.shape[0] * (ids.shape[1] - 1)
    quality.top1_agreement = same / total if total else None
    if tokens:
        quality.perplexity_fp32 = math.exp(nll_ref / tokens)
        quality.perplexity = math.exp(nll_act / tokens)
    name = sig.logits
    if name in quality.outputs:
        quality.outputs[name].top1_agreement = quality.top1_agreement


def _nll(logits: np.ndarray, ids: np.ndarray) -> float:
    """Summed negative log-likelihood of ids[:, 1:] under logits[:, :-1]."""
    x = logits[:, :-1].astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, ids[:, 1:, None].astype(np.int64), axis=-1)
    return float(-picked.sum())


def perplexity(logits: Sequence[np.ndarray], ids: Sequence[np.ndarray]) -> float:
    """exp(mean NLL) of each sequence's next tokens (teacher-forced), over all sequences."""
    nll = sum(_nll(lg, np.asarray(i)) for lg, i in zip(logits, ids, strict=True))
    count = sum(np.asarray(i).shape[0] * (np.asarray(i).shape[1] - 1) for i in ids)
    return math.exp(nll / count)


# --------------------------------------------------------------------------- sizes, message


def _sizes(src: Path, int4: Path) -> dict[str, Any]:
    from infercc.analysis.model_info import model_files_size

    before = model_files_size(src, load_model(src))
    after = int4.stat().st_size + sum(
        p.stat().st_size for p in int4.parent.glob(int4.name + "*.data")
    )
    return {"before_bytes": before, "after_bytes": after, "ratio": after / before}


def _message(r: Int4CalibrationReport) -> str:
    q = r.quality
    parts = [f"{len(r.quantize.quantized)} weight(s) in int4 ({r.form}, block {r.block_size})"]
    if q.top1_agreement is not None:
        parts.append(f"top-1 agreement {100 * q.top1_agreement:.2f}%")
    if q.perplexity_ratio is not None:
        parts.append(f"perplexity {q.perplexity:.4g} vs fp32 {q.perplexity_fp32:.4g}")
    parts.append(f"cosine {q.cosine:.6f}")
    if r.versus_rtn is not None:
        parts.append(r.versus_rtn["message"])
    return "; ".join(parts)
