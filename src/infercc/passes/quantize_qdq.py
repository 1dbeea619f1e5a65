"""quantize-qdq: rewrite the IR into a static INT8 QDQ model from calibrated ranges.

The pass (reading its option `quantize`, a `QuantizeSettings`; `quantize_qdq(model, ranges)` runs it
on one model) puts ONNX QuantizeLinear/DequantizeLinear (Q/DQ) pairs where onnxruntime's CPU
provider and TensorRT turn them into int8 kernels, and nowhere else:

- **Targets** are Conv, MatMul and Gemm of the main graph (standard domain). Their data inputs
  (Conv X and W, MatMul A and B, Gemm A and B) are quantized; biases (Conv B, Gemm C) stay
  float32: onnxruntime's QLinearConv / QGemm fusions take a float bias and quantize it to int32
  themselves (scale = x_scale * w_scale), and TensorRT does the same.
- A float32 **activation** input gets Q -> DQ, per tensor. `activations="int8"`: symmetric,
  zero point 0, scale = `ranges[name].scale` (TensorRT takes only this form).
  `activations="uint8"`: asymmetric over [min(lo, 0), max(hi, 0)] in 255 steps, the u8 x s8
  form onnxruntime's CPU kernels (and the VNNI instruction) use; a one-sided tensor (GELU,
  ReLU output) gets twice the resolution. On all-MiniLM-L6-v2 the FFN output projection alone
  in int8 gave cosine 0.820 symmetric, 0.996 asymmetric. A value read by several targets gets
  one shared pair, placed before its first target reader; other (non-target) readers keep
  reading the float value.
- A float32 constant **weight** input (an initializer, or a Constant node's `value`) is quantized
  offline (`quantize_weight`): int8, symmetric (`weight_bits` 8: q in [-127, 127]; 7: q in
  [-64, 64], for CPUs without VNNI whose u8 x s8 kernels sum pairs of products in int16 with
  saturation, `infercc.analysis.cpu_classes`), per output channel when `per_channel` (Conv W
  [M, C/g, k...]: axis 0; MatMul B [K, N]: axis 1; Gemm B: axis 0 if transB else 1), stored as
  an int8 initializer read by a DequantizeLinear with per-axis scales and int8 zero points.
  Every target node gets its own quantized copy, so the original initializer is never
  rewritten; it is dropped only when nothing reads it any more. A constant A input (rare) and
  batched (rank != 2) MatMul weights are quantized per tensor: the int8 kernels take a single
  scale for them.
- With `output_qdq` (default), the **outputs** of Conv and Gemm also get a Q -> DQ pair (scale
  from `ranges[output name]`). onnxruntime 1.32's CPU provider fuses DQ -> Conv -> Q into
  QLinearConv and DQ -> Gemm -> Q into com.microsoft QGemm only with that output Q; without it,
  it dequantizes and runs the float Conv/Gemm. A MatMul needs no output pair: DQ -> MatMul
  becomes com.microsoft MatMulIntegerToFloat (int8 compute, float result), so nothing is put
  between a final MatMul and a Softmax. The exception is a 2-D MatMul whose only reader is an
  Add of a constant (a bias): onnxruntime first fuses the two into a Gemm (MatMulAddFusion),
  which then runs in float for want of an output Q; that MatMul gets an output pair, making it
  a QLinearMatMul followed by a float Add. onnxruntime fuses a MatMul of higher rank with its
  bias only when A's shape is static; with a symbolic dimension (a transformer's [batch,
  sequence, hidden] projections) it stays a MatMulIntegerToFloat plus a float Add, and gets no
  output pair, which would only add rounding (on all-MiniLM-L6-v2 it took the embedding cosine
  from 0.949 to 0.634). TensorRT needs only the input pairs
  (`output_qdq=False`). A missing output range leaves the node input-quantized and is noted in
  the report. With uint8 activations a Conv or Gemm whose only reader is a Relu gets its
  output pair after the Relu instead: that range starts at 0, so the zero point is 0 and
  Q(Relu(y)) = Q(y) exactly; onnxruntime drops such a Relu (ReluQuantFusion) and fuses
  DQ -> Conv -> Q, where a pair before the Relu left a float Relu between two pairs.
- **Residual Adds** (uint8 activations, a second rule): an Add whose float inputs all have a pair
  before it reads their DQs, the int8 values their quantized readers see. The values' producers are
  then read by their Q alone and fuse, and where the Add's result is quantized (a Q reads it, or a
  Relu's output that alone reads it) onnxruntime fuses DQ, DQ -> Add -> Q into QLinearAdd. Where no
  Q reads it (a ResNet's last sum, read by the pooling), it gets an output pair as a Conv's would
  (after its sole Relu): onnxruntime then fuses the Add and the pooling after it
  (QLinearAveragePool), and the NHWC int8 layout runs to the classifier with no Transpose back to
  float NCHW. An Add with an input that has no pair (a transformer's residual stream, whose
  projections' outputs are float) is left as it is. On open_nsfw (a ResNet-50 of half width, real
  weights) the two together took the int8 model from 0.89x to 0.50x the fp32 time on an AMX host
  (all 53 Convs QLinearConv, all 16 Adds QLinearAdd, the pooling QLinearAveragePool), beside
  0.49x for onnxruntime's quantize_static at 1.6x the probability error (`bench/cnn_int8.py`).

The rewrite is exact in the sense of QDQ semantics: DequantizeLinear(QuantizeLinear(x)) is what
the int8 kernel sees, so onnxruntime's un-fused graph computes what its fused kernels compute
(up to int32 accumulation order). Nothing is put around LayerNormalization, Softmax, GELU/Erf or
any other op.

A MatMul of two activations (attention: Q x K^T, probabilities x V) stays float unless
`activation_matmuls`: they are a small share of a transformer's work at usual sequence lengths,
and int8 there costs accuracy (Softmax output in [0, 1] with most values near 0).

A target node stays float, with its reason in `QuantizeReport.kept_float`, when: it is named in
`exclude`; an activation input has no calibrated range, or a degenerate one (scale <= 0 or not
finite); an input is not float32 (or its type is unknown); a weight holds NaN or infinity. The
node is then left entirely untouched (no partial quantization). Subgraphs (If/Loop bodies) are
not quantized. Per-axis DequantizeLinear needs opset 13, so the pass refuses older models
(`calibrate --int8` converts them first).

One rule (`infercc.passes.rules`) on Conv, MatMul and Gemm: its check makes the plan of every
quantized input or gives the reason the node stays float (shown by --explain, listed in
`QuantizeReport.kept_float`); for bisection one rewrite is one node quantized. The pass runs
once per pipeline (`once`): on its own output every target reads a DequantizeLinear already.
The report is the result's details.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto

from infercc.analysis.cpu_classes import INT7_MAX
from infercc.errors import InferccError
from infercc.ir import Graph, Model, Node, Value
from infercc.passes.manager import (
    PassContext,
    PassOption,
    PassResult,
    register_option,
    register_pass,
    run_passes,
)
from infercc.passes.match import bias_add, const_value
from infercc.passes.rules import NoMatch, Rule, apply_rules

logger = logging.getLogger(__name__)

# A calibrated range: an object with `min`, `max` and `scale` (`infercc.calib.TensorRange`).
Range = Any

MIN_OPSET = 13
INT8_MAX = 127
WEIGHT_BITS = (8, 7)  # 7: |q| <= INT7_MAX, so a u8 x s7 pair never saturates an int16 sum
UINT8_MAX = 255
MIN_SCALE = float(np.finfo(np.float32).tiny)  # 2**-126: the scale of an all-zero tensor
# Target op -> the input indices quantized (the rest, biases, stay float).
TARGET_INPUTS: dict[str, tuple[int, ...]] = {"Conv": (0, 1), "MatMul": (0, 1), "Gemm": (0, 1)}
# Ops whose output gets a Q/DQ pair with output_qdq (onnxruntime fuses them only then).
OUTPUT_QDQ_OPS = frozenset({"Conv", "Gemm"})
ACTIVATION_MATMUL_REASON = (
    "both operands are activations (attention scores x values): int8 there costs accuracy "
    "for little speed"
)
_FLOAT32_TINY = np.finfo(np.float32).tiny
# int8: symmetric, zero point 0 (TensorRT's only form); uint8: asymmetric, which onnxruntime's
# CPU kernels (u8 x s8, the VNNI instruction's own form) run fastest.
ACTIVATION_TYPES = ("int8", "uint8")


@dataclass(frozen=True)
class QuantizeSettings:
    """What quantize-qdq reads (its option `quantize`): a calibrated range per activation (an
    object with `min`, `max` and `scale`, as `infercc.calib.TensorRange`), the node names kept
    float, and the form of the quantization."""

    ranges: Mapping[str, Any]
    exclude: tuple[str, ...] = ()
    per_channel: bool = True
    output_qdq: bool = True
    activations: str = "int8"
    activation_matmuls: bool = True
    weight_bits: int = 8  # 7: weights within +-64, for CPUs whose int8 kernels sum pairs in int16


QUANTIZE: PassOption[QuantizeSettings | None] = register_option(
    "quantize", QuantizeSettings | None, "the ranges and form of int8 quantization"
)


@dataclass
class QuantizeReport:
    """What `quantize_qdq` did: node labels quantized, kept float (with reasons), counts."""

    quantized: list[str] = field(default_factory=list)
    kept_float: dict[str, str] = field(default_factory=dict)
    qdq_pairs: int = 0
    weights_quantized: int = 0
    notes: dict[str, str] = field(default_factory=dict)
    adds: list[str] = field(default_factory=list)  # Adds that read their inputs' DQ pairs

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantized": list(self.quantized),
            "kept_float": dict(self.kept_float),
            "qdq_pairs": self.qdq_pairs,
            "weights_quantized": self.weights_quantized,
            "notes": dict(self.notes),
            "adds": list(self.adds),
        }


@dataclass(frozen=True)
class _Operand:
    """The plan for one input of a target node."""

    index: int
    value: Value
    kind: str  # "activation" | "weight" | "quantized" (already read through a DQ)
    scale: float = 0.0
    zero_point: int = 0
    array: np.ndarray | None = None
    axis: int | None = None
    source: Value | None = None  # what the activation's Q reads, when not `value` (a mask's X)


# --------------------------------------------------------------------------- weights


def quantize_weight(
    weight: np.ndarray, axis: int | None, qmax: int = INT8_MAX
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization: (q, scales) with w ~= q * scale.

    `axis` None gives one scale (a 0-d array); otherwise one scale per index along `axis`.
    scale = max|w| / qmax (per channel); an all-zero channel gets float32's smallest normal
    number, so every scale is positive with a finite reciprocal. q is in [-qmax, qmax]
    (`weight_max(bits)`: 127 for 8-bit weights, 64 for 7-bit).
    """
    w = np.asarray(weight)
    if w.dtype.kind != "f":
        raise InferccError(f"cannot quantize a {w.dtype} weight", "weights must be float")
    if not np.isfinite(w).all():
        raise InferccError("the weight holds NaN or infinity", "keep that node in float")
    reduce_axes = _reduce_axes(w.ndim, axis)
    amax = np.abs(w).max(axis=reduce_axes) if w.size else np.zeros(())
    scales = np.maximum(np.asarray(amax, np.float64) / qmax, MIN_SCALE).astype(np.float32)
    scales = np.maximum(scales, _FLOAT32_TINY)  # amax / qmax may round below tiny in float32
    q = np.rint(w.astype(np.float64) / _broadcast(scales, w.ndim, axis))
    return np.clip(q, -qmax, qmax).astype(np.int8), scales


def weight_max(bits: int) -> int:
    """The largest |q| of a weight of `bits` bits (8: 127; 7: 64, `INT7_MAX`)."""
    if bits not in WEIGHT_BITS:
        raise InferccError(
            f"int8 weights are 8 or 7 bits, not {bits}", "use 8 (VNNI, AMX, arm64) or 7 (AVX2)"
        )
    return INT8_MAX if bits == 8 else INT7_MAX


def dequantize_weight(q: np.ndarray, scales: np.ndarray, axis: int | None) -> np.ndarray:
    """q * scale in float32, as DequantizeLinear computes it."""
    return q.astype(np.float32) * _broadcast(scales, q.ndim, axis).astype(np.float32)


def weight_sqnr(weight: np.ndarray, axis: int | None, qmax: int = INT8_MAX) -> float:
    """Signal-to-quantization-noise ratio (dB) of `quantize_weight`; inf when exact."""
    w = np.asarray(weight)
    q, scales = quantize_weight(w, axis, qmax)
    noise = float(np.sum((w.astype(np.float64) - dequantize_weight(q, scales, axis)) ** 2))
    signal = float(np.sum(w.astype(np.float64) ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _reduce_axes(ndim: int, axis: int | None) -> tuple[int, ...] | None:
    if axis is None:
        return None
    if not -ndim <= axis < ndim:
        raise InferccError(f"axis {axis} is out of range for a rank-{ndim} weight", "fix axis")
    axis %= ndim
    return tuple(i for i in range(ndim) if i != axis)


def _broadcast(scales: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    if axis is None:
        return scales
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return scales.reshape(shape)


# --------------------------------------------------------------------------- activations


def activation_params(tensor_range: Range, activations: str) -> tuple[float, int]:
    """(scale, zero point) of an activation: int8 symmetric, or uint8 over [min, max].

    uint8 covers [min(lo, 0), max(hi, 0)] in 255 steps (so 0.0 is exact): a one-sided tensor
    (after GELU, Softmax, ReLU) gets twice the resolution of the symmetric int8 scale.
    """
    if activations == "int8":
        return float(tensor_range.scale), 0
    low, high = min(float(tensor_range.min), 0.0), max(float(tensor_range.max), 0.0)
    scale = max((high - low) / UINT8_MAX, MIN_SCALE)
    zero_point = int(np.clip(round(-low / scale), 0, UINT8_MAX))
    return scale, zero_point


def _check_activations(activations: str) -> None:
    if activations not in ACTIVATION_TYPES:
        raise InferccError(
            f"unknown activation type {activations!r}",
            f"use one of: {', '.join(ACTIVATION_TYPES)}",
        )


# --------------------------------------------------------------------------- the rewrite


@register_pass("quantize-qdq", once=True, reads=("quantize",), requires=("opset>=13",))
def quantize_qdq_pass(graph: Graph, ctx: PassContext) -> PassResult:
    """Put QuantizeLinear/DequantizeLinear pairs on Conv, MatMul and Gemm from calibrated ranges."""
    settings = QUANTIZE.read(ctx)
    model = graph.model
    if settings is None or model is None or graph is not model.graph:
        raise InferccError(
            "quantize-qdq needs calibrated ranges (its option `quantize`) and a model's main graph",
            "run it through `infercc calibrate`, or `quantize_qdq(model, ranges)`",
        )
    check_opset(model)
    _check_activations(settings.activations)
    _check_exclude(graph, settings.exclude)
    rewriter = _Rewriter(graph, settings)
    rule = Rule("quantized", tuple(TARGET_INPUTS), rewriter.check, rewriter.rewrite)
    for node, reason in apply_rules(graph, ctx, [rule], subgraphs=False).refused:
        rewriter.report.kept_float[rewriter.labels[node]] = reason
    rewriter.order = {node: i for i, node in enumerate(graph.nodes)}
    adds = Rule("adds", ("Add",), rewriter.check_add, rewriter.rewrite_add)
    apply_rules(graph, ctx, [adds], subgraphs=False)
    report = rewriter.report
    logger.info(
        "quantized %d node(s), kept %d float; %d Q/DQ pair(s), %d weight(s)",
        len(report.quantized),
        len(report.kept_float),
        report.qdq_pairs,
        report.weights_quantized,
    )
    stats = {
        "quantized": len(report.quantized),
        "kept_float": len(report.kept_float),
        "qdq_pairs": report.qdq_pairs,
        "weights_quantized": report.weights_quantized,
        "adds": len(report.adds),
    }
    return PassResult(changed=bool(report.quantized), stats=stats, details=report)


def quantize_qdq(
    model: Model,
    ranges: Mapping[str, Range],
    *,
    exclude: Iterable[str] = (),
    per_channel: bool = True,
    output_qdq: bool = True,
    activations: str = "int8",
    activation_matmuls: bool = True,
    weight_bits: int = 8,
) -> QuantizeReport:
    """Rewrite `model` in place into a QDQ int8 model (see the module docstring): the
    quantize-qdq pass alone, through the pass manager."""
    settings = QuantizeSettings(
        ranges=ranges,
        exclude=tuple(exclude),
        per_channel=per_channel,
        output_qdq=output_qdq,
        activations=activations,
        activation_matmuls=activation_matmuls,
        weight_bits=weight_bits,
    )
    report = run_passes(model, PassContext(options={"quantize": settings}), ["quantize-qdq"])
    return report.details("quantize-qdq")


def calibration_tensors(model: Model, *, output_qdq: bool = True) -> list[str]:
    """Names of the activations `quantize_qdq` wants ranges for, in node order.

    Pass them as `collect_ranges(..., tensors=...)`: its default observes node outputs only,
    not graph inputs, which the first Conv or MatMul usually reads.
    """
    names: list[str] = []
    for node in model.graph:
        residual = _residual_add(node)
        if _is_target(node):
            for i in TARGET_INPUTS[node.op_type]:
                v = node.input(i)
                if v is not None and const_value(v) is None and not _is_dq_output(v):
                    names.append(v.name)
        elif not residual:
            continue
        if output_qdq and (residual or _wants_output_qdq(node)):
            names.append(node.output.name)
            relu = _sole_relu(node.output)
            if relu is not None:  # where a uint8 output pair goes (_Rewriter.output_site)
                names.append(relu.output.name)
    return list(dict.fromkeys(names))


def _residual_add(node: Node) -> bool:
    """A float Add of two activations: the residual Adds rule may give it an output pair.
    (An integer Add of two activations, a transformer's position ids, has no range to
    observe.)"""
    return (
        node.op_type == "Add"
        and node.is_standard
        and all(
            v is not None and const_value(v) is None and v.dtype in (None, TensorProto.FLOAT)
            for v in node.inputs
        )
        and node.output.dtype in (None, TensorProto.FLOAT)
    )


def check_opset(model: Model) -> None:
    version = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if version is None or version < MIN_OPSET:
        raise InferccError(
            f"INT8 QDQ quantization needs opset >= {MIN_OPSET} (per-axis DequantizeLinear); "
            f"the model has opset {version}",
            "re-export the model with opset 13 or later (torch.onnx.export(..., "
            "opset_version=17)) or convert it with onnx.version_converter.convert_version",
        )


def _check_exclude(graph: Graph, exclude: Iterable[str]) -> set[str]:
    excluded = set(exclude)
    unknown = sorted(excluded - {node.name for node in graph})
    if unknown:
        raise InferccError(
            f"exclude names node(s) not in the main graph: {', '.join(map(repr, unknown))}",
            "give node names (NodeProto.name), not tensor names",
        )
    return excluded


def _is_target(node: Node) -> bool:
    return node.is_standard and node.op_type in TARGET_INPUTS


def _wants_output_qdq(node: Node) -> bool:
    """Conv and Gemm; a MatMul whose only reader is an Add of a constant (a bias) and which
    onnxruntime would fuse with it into a Gemm (A of rank 2, or of static shape)."""
    if node.op_type in OUTPUT_QDQ_OPS:
        return True
    if node.op_type != "MatMul" or bias_add(node.output) is None:
        return False
    a = node.input(0)
    if a is not None and a.shape is not None and len(a.shape) > 2:
        return all(isinstance(d, int) for d in a.shape)  # else no Gemm: MatMulIntegerToFloat
    return True


def _sole_relu(value: Value) -> Node | None:
    """The standard Relu that alone reads `value` (not a graph output), if one does."""
    uses = value.uses()
    if len(uses) != 1 or value.is_graph_output:
        return None
    node = uses[0][0]
    return node if node.op_type == "Relu" and node.is_standard else None


def _label(node: Node, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def _unmasked(node: Node, value: Value) -> Value | None:
    """X, where a MatMul's input `value` is Mul(X, m) by a 0/1 mask along the last axis that
    this MatMul alone reads, and the MatMul's constant weight is zero on every row where m is 0
    (split-outlier-channels writes both): quantizing X itself computes the same product, the
    channels the mask zeroes meeting zero weights however they round or saturate, and the Mul
    goes (one pass over the activation less)."""
    mul = value.producer
    if node.op_type != "MatMul" or mul is None or mul.op_type != "Mul" or not mul.is_standard:
        return None
    if len(value.uses()) != 1 or value.is_graph_output:
        return None
    x, mask = mul.input(0), const_value(mul.input(1))
    weight = const_value(node.input(1))
    if x is None or x.dtype != TensorProto.FLOAT or mask is None or weight is None:
        return None
    if mask.ndim != 1 or weight.ndim != 2 or weight.shape[0] != mask.size:
        return None
    if not np.isin(mask, (0.0, 1.0)).all() or np.any(weight[mask == 0.0]):
        return None
    return x


def _is_dq_output(value: Value) -> bool:
    producer = value.producer
    return producer is not None and producer.op_type == "DequantizeLinear"


def weight_axis(node: Node, index: int, ndim: int) -> int | None:
    """The output-channel axis of a weight input, or None for per-tensor."""
    if index != 1:
        return None  # a constant A: the int8 kernels take one scale for A
    if node.op_type == "Conv":
        return 0 if ndim >= 3 else None
    if node.op_type == "MatMul":
        return 1 if ndim == 2 else None
    if node.op_type == "Gemm":
        return 0 if node.attr("transB", 0) else 1
    return None


def _scale_problem(name: str, tensor_range: Range | None, what: str) -> str | None:
    if tensor_range is None:
        return f"no calibrated range for {what} {name!r}"
    scale = float(tensor_range.scale)
    if not (math.isfinite(scale) and scale > 0.0 and math.isfinite(np.float32(scale))):
        return f"degenerate range for {what} {name!r} (scale {scale})"
    return None


def _dtype_problem(value: Value) -> str | None:
    if value.dtype == TensorProto.FLOAT:
        return None
    if value.dtype is None:
        return f"type of input {value.name!r} is unknown"
    kind = TensorProto.DataType.Name(value.dtype).lower()
    return f"input {value.name!r} is {kind}, not float32"


class _Rewriter:
    """The rule's state for one run: plans and applies the rewrite node by node, sharing
    activation Q/DQ pairs."""

    def __init__(self, graph: Graph, settings: QuantizeSettings):
        self.graph = graph
        self.ranges = settings.ranges
        self.per_channel = settings.per_channel
        self.output_qdq = settings.output_qdq
        self.activations = settings.activations
        self.activation_matmuls = settings.activation_matmuls
        self.weight_max = weight_max(settings.weight_bits)
        self.excluded = set(settings.exclude)
        self.labels = {node: _label(node, i) for i, node in enumerate(graph.nodes)}
        self.report = QuantizeReport()
        self.shared: dict[Value, Value] = {}  # activation -> its DQ output
        self.order: dict[Node, int] = {}  # node -> position, for the Adds (after the targets)

    def check(self, node: Node, ctx: PassContext) -> list[_Operand]:
        label = self.labels[node]
        plan = "excluded by name" if node.name in self.excluded else self._plan(node)
        if isinstance(plan, str):
            logger.info("%s stays float: %s", label, plan)
            raise NoMatch(plan)
        if all(op.kind == "quantized" for op in plan):
            raise NoMatch("already quantized (its inputs come from DQ nodes)")
        return plan

    def rewrite(self, node: Node, plan: list[_Operand], ctx: PassContext) -> None:
        for operand in plan:
            self._apply(node, operand)
        if self.output_qdq and _wants_output_qdq(node):
            self._quantize_output(node, self.labels[node])
        self.report.quantized.append(self.labels[node])

    def _plan(self, node: Node) -> list[_Operand] | str:
        plan = []
        for i in TARGET_INPUTS[node.op_type]:
            operand = self._operand(node, i)
            if isinstance(operand, str):
                return operand
            plan.append(operand)
        if not self.activation_matmuls and all(op.kind == "activation" for op in plan):
            return ACTIVATION_MATMUL_REASON
        return plan

    def _operand(self, node: Node, i: int) -> _Operand | str:
        v = node.input(i)
        if v is None:
            return f"input {i} is missing"
        if _is_dq_output(v):
            return _Operand(i, v, "quantized")
        array = const_value(v)
        if array is not None:
            return self._weight_operand(node, i, v, array)
        problem = _dtype_problem(v) or _scale_problem(v.name, self.ranges.get(v.name), "input")
        if problem:
            return problem
        scale, zero_point = activation_params(self.ranges[v.name], self.activations)
        source = _unmasked(node, v)
        return _Operand(i, v, "activation", scale=scale, zero_point=zero_point, source=source)

    def _weight_operand(self, node: Node, i: int, v: Value, array: np.ndarray) -> _Operand | str:
        if array.dtype != np.float32:
            return f"weight {v.name!r} is {array.dtype}, not float32"
        if not np.isfinite(array).all():
            return f"weight {v.name!r} holds NaN or infinity"
        axis = weight_axis(node, i, array.ndim) if self.per_channel else None
        return _Operand(i, v, "weight", array=array, axis=axis)

    def _apply(self, node: Node, operand: _Operand) -> None:
        if operand.kind == "activation":
            node.set_input(operand.index, self._shared_qdq(operand, node))
        elif operand.kind == "weight":
            node.set_input(operand.index, self._weight_dq(operand, node))
            self._drop_if_unread(operand.value)

    def _shared_qdq(self, operand: _Operand, before: Node) -> Value:
        value = operand.value
        if value not in self.shared:
            q, dq = self._qdq_nodes(value, operand.scale, operand.zero_point)
            if operand.source is not None:  # the mask's X: the Mul is left to DCE
                q.set_input(0, operand.source)
            self.graph.insert_before(before, [q, dq])
            self.shared[value] = dq.output
        return self.shared[value]

    def _qdq_nodes(self, value: Value, scale: float, zero_point: int = 0) -> tuple[Node, Node]:
        """A Q -> DQ pair reading `value` (not yet inserted into the graph)."""
        g = self.graph
        unsigned = self.activations == "uint8"
        scale_c = g.make_constant(np.array(scale, np.float32), f"{value.name}_scale")
        zero = g.make_constant(
            np.array(zero_point, np.uint8 if unsigned else np.int8), f"{value.name}_zero_point"
        )
        q_type = TensorProto.UINT8 if unsigned else TensorProto.INT8
        q_out = Value(g.fresh_name(f"{value.name}_quantized"), q_type, value.shape)
        dq_out = Value(g.fresh_name(f"{value.name}_dequantized"), TensorProto.FLOAT, value.shape)
        q = Node("QuantizeLinear", [value, scale_c, zero], [q_out], name=self._name("Q", value))
        dq = Node(
            "DequantizeLinear", [q_out, scale_c, zero], [dq_out], name=self._name("DQ", value)
        )
        self.report.qdq_pairs += 1
        return q, dq

    def _name(self, prefix: str, value: Value) -> str:
        return self.graph.fresh_node_name(f"{prefix}_{value.name}")

    def _weight_dq(self, operand: _Operand, before: Node) -> Value:
        g, w, axis = self.graph, operand.value, operand.axis
        assert operand.array is not None
        q, scales = quantize_weight(operand.array, axis, self.weight_max)
        q_c = g.make_constant(q, f"{w.name}_quantized")
        scale_c = g.make_constant(scales, f"{w.name}_scale")
        zero = g.make_constant(np.zeros(scales.shape, np.int8), f"{w.name}_zero_point")
        attributes = {"axis": axis} if axis is not None else None
        dq = g.make_node(
            "DequantizeLinear",
            [q_c, scale_c, zero],
            before=before,
            name=f"DQ_{w.name}",
            attributes=attributes,
        )
        dq.output.dtype, dq.output.shape = TensorProto.FLOAT, tuple(operand.array.shape)
        self.report.weights_quantized += 1
        return dq.output

    def _drop_if_unread(self, value: Value) -> None:
        """Remove a float initializer nothing reads any more (Constant nodes are left to DCE)."""
        if value.const is not None and not value.uses() and not value.is_graph_output:
            self.graph.remove_initializer(value)

    def output_site(self, node: Node) -> Value:
        """Where `node`'s output pair goes: its output, or with uint8 activations the output
        of a Relu that alone reads it. That range starts at 0, so the zero point is 0 and
        Q(Relu(y)) = Q(y) exactly: onnxruntime drops the Relu (ReluQuantFusion) and fuses
        DQ -> Conv -> Q into QLinearConv, where a pair before the Relu would dequantize, run
        the Relu in float and quantize again for the next reader."""
        relu = _sole_relu(node.output) if self.activations == "uint8" else None
        if relu is None or _scale_problem(relu.output.name, self.ranges.get(relu.output.name), ""):
            return node.output
        return relu.output

    def check_add(self, node: Node, _ctx: PassContext) -> list[tuple[int, Value]]:
        """An Add of activations that all have a Q/DQ pair before it reads their DQs: the
        values their int8 readers see. Its inputs' producers are then read by their Q alone
        and fuse (a residual block's Relu output, the Conv before it), and where the Add's
        result is quantized (a Q reads it, or the output of a Relu that alone reads it)
        onnxruntime fuses DQ, DQ -> Add -> Q into QLinearAdd (a ResNet's residual Add). An Add
        with an input that has no pair (a transformer's residual stream) is left alone, with a
        reason where that input is a target kept float. uint8 activations only (onnxruntime's
        form)."""
        if self.activations != "uint8":
            raise NoMatch()
        moves, unpaired = [], []
        for i, v in enumerate(node.inputs):
            if v is None or const_value(v) is not None or v.dtype != TensorProto.FLOAT:
                raise NoMatch()
            dq = None if _is_dq_output(v) else self.shared.get(v)
            if dq is not None and dq.producer is not None:
                if self.order[dq.producer] < self.order[node]:
                    moves.append((i, dq))
                    continue
            if not _is_dq_output(v):
                unpaired.append(v)
        kept = [v for v in unpaired if v.producer is not None and _is_target(v.producer)]
        if kept and len(unpaired) < len(node.inputs):  # a kept-float Conv's: say so
            raise NoMatch(f"input {kept[0].name!r} has no Q/DQ pair before the Add", at=kept[0])
        if unpaired or not moves:
            raise NoMatch()  # nothing int8 about it, or nothing to move
        return moves

    def rewrite_add(self, node: Node, moves: list[tuple[int, Value]], _ctx: PassContext) -> None:
        """Read the DQs; where nothing quantizes the Add's result (the last block of a ResNet,
        read by a pooling op), give it an output pair as a Conv's (after its sole Relu), so
        that onnxruntime fuses QLinearAdd and its readers stay in the NHWC int8 form."""
        for i, dq in moves:
            node.set_input(i, dq)
        label = node.name or f"Add({node.output.name})"
        self.report.adds.append(label)
        site = self.output_site(node)
        if self.output_qdq and not any(u.op_type == "QuantizeLinear" for u in site.users()):
            self._quantize_output(node, label)

    def _quantize_output(self, node: Node, label: str) -> None:
        out = self.output_site(node)
        problem = _scale_problem(out.name, self.ranges.get(out.name), "output")
        if out.dtype != TensorProto.FLOAT:
            problem = f"output {out.name!r} is not float32"
        if problem:
            self.report.notes[label] = f"{problem}: onnxruntime's CPU provider runs it in float"
            return
        q, dq = self._qdq_nodes(out, *activation_params(self.ranges[out.name], self.activations))
        self.graph.insert_after(out.producer or node, [q, dq])
        # Readers and a graph output move to the DQ output; the Q keeps reading the node.
        self.graph.replace_all_uses_with(out, dq.output)
        q.set_input(0, out)
