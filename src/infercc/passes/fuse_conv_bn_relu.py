"""fuse-conv-bn-relu: fold BatchNormalization and per-channel affine ops into the layer before.

Inference BatchNormalization is a per-channel affine map on axis 1:

    BN(y) = y·s + t,   s = γ/σ,   t = β - μ·s,   σ = sqrt(var + eps)

so when y = W * x + b is linear in its weight per output channel (Conv, ConvTranspose, Gemm,
MatMul[+Add]), BN(y) = (W·s) * x + (b-μ)·γ/σ + β exactly: W' = W·γ/σ per output channel and
b' = (b-μ)·γ/σ + β. The output channel o of a Conv weight [M, C/g, k...] is axis 0; of a
ConvTranspose weight [C, M/g, k...] it is axis 1 *within each group*, o = g·(M/g) + j; of a Gemm
or a MatMul it is a column of the weight (a row when transB=1). The same holds for a following
Mul by a constant m (W' = W·m, b' = b·m) or Add of a constant a (b' = b + a) when the constant
broadcasts exactly per output channel (shape [M,1,..], [1,M,1,..] or a scalar that does not
raise the rank), and for a BatchNormalization followed by such a Mul/Add (scale' = scale·m,
bias' = bias·m + a), since an affine map of an affine map is affine.

Conditions that keep it exact: the producer's output is read only by the folded node (and is no
graph output); weights, biases and BN parameters are constants; BN is in inference mode (no
training_mode, only its first output read); the channel count matches. New constants are
always created (the old ones may be read elsewhere; eliminate-dead-code drops them when not).

How it rounds. Every user of the original gets onnxruntime's own Conv+BN, Conv+Mul and Conv+Add
fusions at session creation, so where the fold is the one onnxruntime makes, it is computed as
onnxruntime computes it, and the folded weights are bit-identical to what onnxruntime makes of
the original: a Conv followed by BN with the weight, BN parameters (and bias) all of one float
dtype, is folded in that dtype with one rounding per step, in onnxruntime's order (its
ConvBNFusion): σ = sqrt(var + ε), s = γ/σ, W' = W·s, and b' = (b - μ)·s + β, or without a bias
b' = β - μ·s (float16 steps computed in float32 and rounded, as onnxruntime does). Mul and Add
folds are one multiplication or addition per element, which float64 then one cast rounds
exactly as the tensor's own dtype does; a Conv without bias gets none from a Mul. Every other
fold (ConvTranspose, Gemm, MatMul, mixed dtypes, BN into BN) runs in float64 and is cast back to
the weight's dtype once.

fuse-conv-activation, a pass of its own: when the model targets onnxruntime on the CPU
(ctx.fused_ops_allowed and target "cpu"), a float32 2-D Conv whose output is read only by Relu,
Clip (constant bounds), LeakyRelu, Sigmoid, HardSigmoid or Tanh becomes onnxruntime's
com.microsoft FusedConv, which applies the same activation to the convolution result
(activation / activation_params attributes). FusedConv is never matched again, so the pass is
idempotent. FusedConv has float32 kernels only, so a `--fp16` build runs this pass after
convert-fp16 (`passes.pipelines`): a Conv that became float16 stays a Conv, and only what kept
float32 fuses (fused first, every Conv would have stayed float32).

The rules (`infercc.passes.rules`): BatchNormalization and Mul/Add here, the activations in
fuse-conv-activation. For bisection one rewrite is one BatchNormalization, Mul or Add folded
into the node before it (named by the folded node), or one activation fused into a FusedConv
(named by the activation).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_value, sole_reader
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

STAT_KEYS = (
    "bn_into_conv",
    "bn_into_convtranspose",
    "bn_into_gemm",
    "bn_into_matmul",
    "mul_into_conv",
    "add_into_conv",
    "affine_into_bn",
)
_CONVS = ("Conv", "ConvTranspose")
_FLOATS = (np.float16, np.float32, np.float64)
_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh")
_F32_MAX = float(np.finfo(np.float32).max)


@register_pass("fuse-conv-bn-relu")
def fuse_conv_bn_relu(graph: Graph, ctx: PassContext) -> PassResult:
    """Fold BatchNormalization / per-channel Mul, Add into Conv, Gemm, MatMul."""
    stats = dict.fromkeys(STAT_KEYS, 0)
    stats.update(apply_rules(graph, ctx, AFFINE_RULES).counts)
    return PassResult(changed=any(stats.values()), stats=stats)


@register_pass("fuse-conv-activation")
def fuse_conv_activation(graph: Graph, ctx: PassContext) -> PassResult:
    """Fuse a float32 Conv and its activation into onnxruntime's FusedConv (cpu target)."""
    stats = {"activation_fused": 0}
    if ctx.fused_ops_allowed and ctx.target == "cpu":
        stats.update(apply_rules(graph, ctx, ACTIVATION_RULES).counts)
    return PassResult(changed=any(stats.values()), stats=stats)


# -- small helpers ------------------------------------------------------------------------------


def _reads_only(v: Value, node: Node) -> bool:
    return sole_reader(v) is node


def _is_float(a: np.ndarray) -> bool:
    return a.dtype in _FLOATS


def _new_const(graph: Graph, array: np.ndarray, like: Value | None, base: str) -> Value:
    name = f"{like.name}_fused" if like is not None else base
    return graph.make_constant(np.ascontiguousarray(array), name)


def _set_input(node: Node, i: int, value: Value) -> None:
    while len(node.inputs) <= i:
        node.append_input(None)
    node.set_input(i, value)


def _replace_node(graph: Graph, node: Node, by: Value) -> None:
    """Readers of node's first output read `by`; the node goes."""
    graph.replace_all_uses_with(node.output, by)
    graph.remove(node)


def _per_channel(c: np.ndarray, rank: int | None, m: int) -> np.ndarray | None:
    """c as a float64 vector of length m, when broadcasting c against a rank-`rank` tensor with
    m channels on axis 1 applies one value per channel and leaves the shape alone."""
    if c.ndim == 0:
        return np.full(m, float(c), dtype=np.float64)
    if rank is None or rank < 2 or c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, m):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (m,)).copy()


# -- what the checks prove: the constants a fold reads ---------------------------------------


@dataclass(frozen=True)
class _BnParams:
    """A foldable inference-mode BatchNormalization's constants: float vectors of one length."""

    gamma_v: Value
    beta_v: Value
    gamma: np.ndarray
    beta: np.ndarray
    mean: np.ndarray
    var: np.ndarray


@dataclass(frozen=True)
class _ConvWeights:
    """A Conv's (or ConvTranspose's) constant float weight, of rank >= 3, and its bias."""

    w_val: Value
    w: np.ndarray
    b_val: Value | None
    b: np.ndarray | None


@dataclass(frozen=True)
class _GemmWeights:
    """A Gemm's constant float weight matrix B and its constant bias C (if any)."""

    b_val: Value
    b: np.ndarray
    c_val: Value | None
    c: np.ndarray | None


@dataclass(frozen=True)
class _MatMulWeights:
    """A MatMul's constant float weight matrix, and the Add of its per-column bias after it."""

    mm: Node
    w_val: Value
    w: np.ndarray
    add: Node | None = None
    bias_i: int = -1  # the bias input of `add`
    bias_val: Value | None = None
    bias: np.ndarray | None = None


def _bn_params(bn: Node) -> _BnParams:
    """BN's constants, or NoMatch: why it is not a foldable inference-mode BatchNormalization."""
    if bn.attr("training_mode", 0):
        raise NoMatch("BatchNormalization is in training mode")
    if bn.attr("spatial", 1) == 0:
        raise NoMatch("BatchNormalization with spatial=0 is not per-channel")
    if any(o is not None and (o.uses() or o.is_graph_output) for o in bn.outputs[1:]):
        raise NoMatch("BatchNormalization has more than one output in use")
    gamma_v, beta_v = bn.input(1), bn.input(2)
    found = [const_value(bn.input(i)) for i in range(1, 5)]
    params = [p for p in found if p is not None]
    if gamma_v is None or beta_v is None or len(params) != len(found):
        raise NoMatch("BatchNormalization parameters are not constant")
    if any(p.ndim != 1 or p.shape != params[0].shape or not _is_float(p) for p in params):
        raise NoMatch("BatchNormalization parameters are not float vectors of one length")
    gamma, beta, mean, var = params
    return _BnParams(gamma_v, beta_v, gamma, beta, mean, var)


def _bn_affine(bn: Node, p: _BnParams) -> tuple[np.ndarray, np.ndarray]:
    """(s, t) in float64 with BN(y) = y·s + t per channel."""
    gamma, beta, mean, var = (a.astype(np.float64) for a in (p.gamma, p.beta, p.mean, p.var))
    s = gamma / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return s, beta - mean * s


# -- BN / Mul / Add folding ---------------------------------------------------------------------


@dataclass(frozen=True)
class _BnFold:
    """BatchNormalization as the affine map `scale`, `shift` per output channel, which `layer`
    (a Conv, ConvTranspose, Gemm, MatMul, or the Add of a constant bias after a MatMul) absorbs
    through the constants `into`."""

    key: str
    layer: Node
    scale: np.ndarray
    shift: np.ndarray
    bn: _BnParams
    into: _ConvWeights | _GemmWeights | _MatMulWeights


@dataclass(frozen=True)
class _AffineFold:
    """A Mul or Add as the affine map `scale`, `shift` per output channel (None: identity),
    which `layer` (a Conv, ConvTranspose or BatchNormalization) absorbs through `into`."""

    key: str
    layer: Node
    scale: np.ndarray | None
    shift: np.ndarray | None
    into: _ConvWeights | _BnParams


def _check_bn(bn: Node, ctx: PassContext) -> _BnFold:
    x = bn.input(0)
    p = x.producer if x is not None else None
    target = _bn_target(p) if p is not None and p.graph is bn.graph else None
    if p is None or target is None:
        raise NoMatch()
    params = _bn_params(bn)
    reason = _reader_reason(p, bn)
    if reason is not None:
        raise NoMatch(reason)
    scale, shift = _bn_affine(bn, params)
    into: _ConvWeights | _GemmWeights | _MatMulWeights
    if target == "conv":
        into = _conv_weights(p, len(scale))
    elif target == "gemm":
        into = _gemm_weights(p, len(scale))
    else:
        into = _matmul_weights(p, bn, len(scale))
    key = {"Conv": "bn_into_conv", "ConvTranspose": "bn_into_convtranspose", "Gemm": "bn_into_gemm"}
    return _BnFold(key.get(p.op_type, "bn_into_matmul"), p, scale, shift, params, into)


def _fold_bn(bn: Node, fold: _BnFold, ctx: PassContext) -> None:
    graph = bn.owning_graph()
    layer, into = fold.layer, fold.into
    if isinstance(into, _ConvWeights):
        if layer.op_type != "Conv" or not _fold_as_onnxruntime(graph, layer, into, fold.bn, bn):
            _rewrite_conv(graph, layer, into, fold.scale, fold.shift)
        _replace_node(graph, bn, layer.output)
    elif isinstance(into, _GemmWeights):
        _bn_into_gemm(graph, layer, bn, into, fold.scale, fold.shift)
    else:
        _bn_into_matmul(graph, bn, into, fold.scale, fold.shift)


def _fold_as_onnxruntime(
    graph: Graph, conv: Node, weights: _ConvWeights, params: _BnParams, bn: Node
) -> bool:
    """Fold `bn` into `conv` in onnxruntime's precision and order (module docstring); False,
    nothing changed, where the dtypes differ (onnxruntime does not fuse those)."""
    w, b = weights.w, weights.b
    gamma, beta, mean, var = params.gamma, params.beta, params.mean, params.var
    dtype = w.dtype
    if any(p.dtype != dtype for p in (gamma, beta, mean, var)):
        return False
    if b is not None and (b.dtype != dtype or b.shape != gamma.shape):
        return False
    eps = np.float32(bn.attr("epsilon", 1e-5))
    s = (gamma / np.sqrt((var + eps).astype(dtype))).astype(dtype)
    w_new = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(dtype)
    if b is None:
        b_new = (beta - (mean * s).astype(dtype)).astype(dtype)
    else:
        b_new = ((((b - mean).astype(dtype)) * s).astype(dtype) + beta).astype(dtype)
    conv.set_input(1, _new_const(graph, w_new, weights.w_val, "W"))
    name = f"{weights.w_val.name}_bias"
    _set_input(conv, 2, _new_const(graph, b_new, weights.b_val, name))
    return True


def _bn_target(p: Node | None) -> str | None:
    """Which kind of layer the BN after `p` could fold into."""
    if p is None or not p.is_standard:
        return None
    if p.op_type in _CONVS:
        return "conv"
    if p.op_type == "Gemm":
        return "gemm"
    if p.op_type == "MatMul" or (p.op_type == "Add" and _matmul_add(p) is not None):
        return "matmul"
    return None


def _reader_reason(p: Node, node: Node) -> str | None:
    if _reads_only(p.output, node):
        return None
    return "conv output has other readers" if p.op_type in _CONVS else "output has other readers"


def _conv_weights(conv: Node, m: int | None = None) -> _ConvWeights:
    """The constants of a conv whose weight/bias can absorb a per-output-channel scale (of `m`
    channels, when given); NoMatch says why they cannot."""
    w_val, b_val = conv.input(1), conv.input(2)
    w, b = const_value(w_val), const_value(b_val)
    if w_val is None or w is None:
        raise NoMatch("conv weight is not constant")
    if not _is_float(w) or w.ndim < 3:
        raise NoMatch("conv weight is not a float tensor of rank >= 3")
    if b_val is not None and b is None:
        raise NoMatch("conv bias is not constant")
    group = int(conv.attr("group", 1))
    if conv.op_type == "ConvTranspose" and w.shape[0] % group:
        raise NoMatch("ConvTranspose weight does not split into its groups")
    if m is not None and m != _out_channels(conv, w):
        raise NoMatch("channel count does not match the conv's output channels")
    return _ConvWeights(w_val, w, b_val, b)


def _out_channels(conv: Node, w: np.ndarray) -> int:
    if conv.op_type == "Conv":
        return int(w.shape[0])
    return int(w.shape[1]) * int(conv.attr("group", 1))


def _scale_out_channels(w: np.ndarray, s: np.ndarray, op: str, group: int) -> np.ndarray:
    """w (float64) with output channel o multiplied by s[o]."""
    if op == "Conv":
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))
    c, mg = w.shape[:2]
    grouped = w.reshape((group, c // group, mg) + w.shape[2:])
    scaled = grouped * s.reshape((group, 1, mg) + (1,) * (w.ndim - 2))
    return scaled.reshape(w.shape)


def _rewrite_conv(
    graph: Graph,
    conv: Node,
    weights: _ConvWeights,
    scale: np.ndarray | None,
    shift: np.ndarray | None,
) -> None:
    """conv' = conv·scale + shift per output channel (new weight/bias constants); a Conv
    without bias gets one only from a shift."""
    dtype, b = weights.w.dtype, weights.b
    if scale is not None:
        _scale_weight(graph, conv, weights, scale)
    if b is None and shift is None:
        return
    bias = np.zeros(_out_channels(conv, weights.w)) if b is None else b.astype(np.float64)
    if scale is not None:
        bias = bias * scale
    if shift is not None:
        bias = bias + shift
    name = f"{weights.w_val.name}_bias"
    _set_input(conv, 2, _new_const(graph, bias.astype(dtype), weights.b_val, name))


def _scale_weight(graph: Graph, conv: Node, weights: _ConvWeights, scale: np.ndarray) -> None:
    """conv's weight with output channel o multiplied by scale[o] (a new constant)."""
    w = weights.w
    group = int(conv.attr("group", 1))
    w_new = _scale_out_channels(w.astype(np.float64), scale, conv.op_type, group)
    conv.set_input(1, _new_const(graph, w_new.astype(w.dtype), weights.w_val, "W"))


def _gemm_weights(gemm: Node, m: int) -> _GemmWeights:
    """The constants of a Gemm that can absorb a scale of its `m` output columns."""
    b_val, c_val = gemm.input(1), gemm.input(2)
    b, c = const_value(b_val), const_value(c_val)
    trans_b = int(gemm.attr("transB", 0))
    if b_val is None or b is None or not _is_float(b) or b.ndim != 2:
        raise NoMatch("Gemm weight is not a constant float matrix")
    if c_val is not None and (c is None or c.ndim > 2):
        raise NoMatch("Gemm bias is not constant")
    if b.shape[0 if trans_b else 1] != m:
        raise NoMatch("channel count does not match the Gemm's output columns")
    return _GemmWeights(b_val, b, c_val, c)


def _bn_into_gemm(
    graph: Graph,
    gemm: Node,
    bn: Node,
    weights: _GemmWeights,
    scale: np.ndarray,
    shift: np.ndarray,
) -> None:
    b, c = weights.b, weights.c
    trans_b = int(gemm.attr("transB", 0))
    cols = scale[:, None] if trans_b else scale[None, :]
    scaled = (b.astype(np.float64) * cols).astype(b.dtype)
    gemm.set_input(1, _new_const(graph, scaled, weights.b_val, "B"))
    beta = float(gemm.attr("beta", 1.0))
    c64 = np.zeros(()) if c is None else beta * c.astype(np.float64)
    c_new = (c64 * scale + shift).astype(b.dtype)
    _set_input(gemm, 2, _new_const(graph, c_new, weights.c_val, "C"))
    gemm.set_attr("beta", 1.0)
    _replace_node(graph, bn, gemm.output)


def _matmul_add(add: Node) -> tuple[Node, int] | None:
    """(MatMul, index of the constant bias input) when `add` is MatMul(...) + constant."""
    for i in (0, 1):
        x, c = add.input(i), add.input(1 - i)
        p = x.producer if x is not None else None
        if p is None or p.graph is not add.graph or not p.is_standard:
            continue
        if p.op_type == "MatMul" and const_value(c) is not None:
            return p, 1 - i
    return None


def _matmul_weights(node: Node, bn: Node, m: int) -> _MatMulWeights:
    """The constants of the layer `node` (a MatMul, or the Add of a constant bias after it)
    that can absorb a scale of its `m` output columns."""
    found = _matmul_add(node) if node.op_type == "Add" else (node, -1)
    if found is None:
        raise NoMatch()  # `_bn_target` saw the MatMul under the Add
    mm, bias_i = found
    w_val = mm.input(1)
    w = const_value(w_val)
    if w_val is None or w is None or not _is_float(w) or w.ndim != 2:
        raise NoMatch("MatMul weight is not a constant float matrix")
    if w.shape[1] != m:
        raise NoMatch("channel count does not match the MatMul's output columns")
    x = bn.input(0)
    if x is None or x.rank != 2:
        raise NoMatch(
            "BatchNormalization input is not 2-D, so its channels are not the MatMul columns"
        )
    if node.op_type != "Add":
        return _MatMulWeights(mm, w_val, w)
    if not _reads_only(mm.output, node):
        raise NoMatch("output has other readers")
    bias_val = node.input(bias_i)
    bias = const_value(bias_val)
    if (
        bias_val is None
        or bias is None
        or bias.ndim > 2
        or bias.size not in (1, m)
        or (bias.ndim and bias.shape[-1] not in (1, m))
    ):
        raise NoMatch("MatMul bias is not per column")
    return _MatMulWeights(mm, w_val, w, node, bias_i, bias_val, bias)


def _bn_into_matmul(
    graph: Graph, bn: Node, weights: _MatMulWeights, scale: np.ndarray, shift: np.ndarray
) -> None:
    mm, add, w = weights.mm, weights.add, weights.w
    w_val = weights.w_val
    mm.set_input(1, _new_const(graph, (w.astype(np.float64) * scale).astype(w.dtype), w_val, "W"))
    if add is not None and weights.bias is not None:
        bias = weights.bias.astype(np.float64) * scale + shift
        add.set_input(
            weights.bias_i, _new_const(graph, bias.astype(w.dtype), weights.bias_val, "b")
        )
        _replace_node(graph, bn, add.output)
        return
    b = _new_const(graph, shift.astype(w.dtype), None, f"{w_val.name}_bias")
    new_add = graph.make_node("Add", [mm.output, b], before=bn)
    new_add.output.dtype, new_add.output.shape = bn.output.dtype, bn.output.shape
    _replace_node(graph, bn, new_add.output)


def _data_and_const(node: Node) -> tuple[Value, int, np.ndarray] | None:
    """(data input, index of the constant input, constant) of a binary op with one constant."""
    a, b = node.input(0), node.input(1)
    ca, cb = const_value(a), const_value(b)
    if a is None or b is None:
        return None
    if ca is not None and cb is None:
        return b, 0, ca
    if cb is not None and ca is None:
        return a, 1, cb
    return None


def _check_mul_add(node: Node, ctx: PassContext) -> _AffineFold:
    found = _data_and_const(node)
    p = found[0].producer if found is not None else None
    if found is None or p is None or p.graph is not node.graph:
        raise NoMatch()  # no producer here (a graph input, or an outer-scope value)
    c = found[2]
    if not p.is_standard or p.op_type not in (*_CONVS, "BatchNormalization"):
        raise NoMatch()
    if p.op_type in _CONVS:
        return _mul_add_conv(p, node, c)
    return _mul_add_bn(p, node, c)


def _mul_add_conv(conv: Node, node: Node, c: np.ndarray) -> _AffineFold:
    reason = _reader_reason(conv, node)
    if reason is not None:
        raise NoMatch(reason)
    weights = _conv_weights(conv)
    w = weights.w
    if c.dtype != w.dtype:
        raise NoMatch("constant dtype differs from the conv weight")
    vec = _per_channel(c, w.ndim, _out_channels(conv, w))
    if vec is None:
        raise NoMatch(f"{node.op_type} constant does not broadcast per output channel")
    if node.op_type == "Mul":
        return _AffineFold("mul_into_conv", conv, vec, None, weights)
    return _AffineFold("add_into_conv", conv, None, vec, weights)


def _mul_add_bn(bn: Node, node: Node, c: np.ndarray) -> _AffineFold:
    params = _bn_params(bn)
    if not _reads_only(bn.output, node):
        raise NoMatch("BatchNormalization output has other readers")
    x = bn.input(0)
    rank = bn.output.rank if bn.output.rank is not None else x.rank if x is not None else None
    vec = _per_channel(c, rank, len(params.gamma))
    if vec is None or c.dtype not in _FLOATS:
        raise NoMatch(f"{node.op_type} constant does not broadcast per channel")
    if node.op_type == "Mul":
        return _AffineFold("affine_into_bn", bn, vec, None, params)
    return _AffineFold("affine_into_bn", bn, None, vec, params)


def _fold_mul_add(node: Node, fold: _AffineFold, ctx: PassContext) -> None:
    graph = node.owning_graph()
    layer, into = fold.layer, fold.into
    if isinstance(into, _ConvWeights):
        _rewrite_conv(graph, layer, into, fold.scale, fold.shift)
        _replace_node(graph, node, layer.output)
        return
    gamma, beta = into.gamma, into.beta
    g64, b64 = gamma.astype(np.float64), beta.astype(np.float64)
    if fold.scale is not None:
        g64, b64 = g64 * fold.scale, b64 * fold.scale
        layer.set_input(1, _new_const(graph, g64.astype(gamma.dtype), into.gamma_v, "scale"))
    elif fold.shift is not None:
        b64 = b64 + fold.shift
    layer.set_input(2, _new_const(graph, b64.astype(beta.dtype), into.beta_v, "bias"))
    _replace_node(graph, node, layer.output)


AFFINE_RULES: list[Rule[Any]] = [
    Rule("bn_into_conv", ("BatchNormalization",), _check_bn, _fold_bn),
    Rule("mul_into_conv", ("Mul", "Add"), _check_mul_add, _fold_mul_add),
]


# -- activation fusion (onnxruntime FusedConv) --------------------------------------------------


@dataclass(frozen=True)
class _Activation:
    """The 2-D float32 Conv read only by the activation, and FusedConv's activation_params."""

    conv: Node
    params: list[float]


def _check_activation(act: Node, ctx: PassContext) -> _Activation:
    x = act.input(0)
    conv = x.producer if x is not None else None
    if conv is None or conv.op_type != "Conv" or not conv.is_standard:
        raise NoMatch()
    if conv.graph is not act.graph:
        raise NoMatch()
    reason = _fused_conv_reason(conv, act)
    if reason is not None:
        raise NoMatch(reason)
    return _Activation(conv, _activation_params(act))


def _fuse_activation(act: Node, found: _Activation, ctx: PassContext) -> None:
    _make_fused_conv(act.owning_graph(), found.conv, act, found.params)


ACTIVATION_RULES = [Rule("activation_fused", _ACTIVATIONS, _check_activation, _fuse_activation)]


def _fused_conv_reason(conv: Node, act: Node) -> str | None:
    if not _reads_only(conv.output, act):
        return "conv output has other readers"
    w = conv.input(1)
    if w is None or w.rank != 4:
        return "FusedConv is used for 2-D Conv only"
    # Conv's type constraint binds X, W and Y to one type, and the activations keep it: the
    # weight's dtype is known even where inference stopped (after a custom-domain op).
    if w.dtype != TensorProto.FLOAT:
        return "FusedConv runs float32 only"
    return None


def _activation_params(act: Node) -> list[float]:
    """FusedConv's activation_params for `act`; NoMatch says why they cannot be expressed."""
    op = act.op_type
    if op == "LeakyRelu":
        return [float(act.attr("alpha", 0.01))]
    if op == "HardSigmoid":
        return [float(act.attr("alpha", 0.2)), float(act.attr("beta", 0.5))]
    if op != "Clip":
        return []
    if len([v for v in act.inputs if v is not None]) == 1:
        return [float(act.attr("min", -_F32_MAX)), float(act.attr("max", _F32_MAX))]
    bounds = []
    for i, default in ((1, -_F32_MAX), (2, _F32_MAX)):
        v = act.input(i)
        c = const_value(v) if v is not None else np.float32(default)
        if c is None or c.size != 1:
            raise NoMatch("Clip bounds are not constant scalars")
        bounds.append(float(np.asarray(c).reshape(())))
    return bounds


def _make_fused_conv(graph: Graph, conv: Node, act: Node, params: list[float]) -> None:
    attrs = dict(conv.attributes)
    attrs["activation"] = act.op_type
    if params:
        attrs["activation_params"] = params
    inputs = list(conv.inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    fused = graph.make_node(
        "FusedConv",
        inputs,
        before=conv,
        domain=MS_DOMAIN,
        name=conv.name or "FusedConv",
        attributes=attrs,
    )
    fused.output.dtype, fused.output.shape = act.output.dtype, act.output.shape
    _replace_node(graph, act, fused.output)
    graph.remove(conv)
    graph.ensure_opset(MS_DOMAIN)
