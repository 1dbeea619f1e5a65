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


# -- BatchNormalization parameters --------------------------------------------------------------


def _bn_reason(bn: Node) -> str | None:
    """Why BN is not a foldable inference-mode BatchNormalization (None when it is)."""
    if bn.attr("training_mode", 0):
        return "BatchNormalization is in training mode"
    if bn.attr("spatial", 1) == 0:
        return "BatchNormalization with spatial=0 is not per-channel"
    if any(o is not None and (o.uses() or o.is_graph_output) for o in bn.outputs[1:]):
        return "BatchNormalization has more than one output in use"
    params = [const_value(bn.input(i)) for i in range(1, 5)]
    if any(p is None for p in params):
        return "BatchNormalization parameters are not constant"
    if any(p.ndim != 1 or p.shape != params[0].shape or not _is_float(p) for p in params):
        return "BatchNormalization parameters are not float vectors of one length"
    return None


def _bn_affine(bn: Node) -> tuple[np.ndarray, np.ndarray]:
    """(s, t) in float64 with BN(y) = y·s + t per channel."""
    gamma, beta, mean, var = (const_value(bn.input(i)).astype(np.float64) for i in range(1, 5))
    s = gamma / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return s, beta - mean * s


# -- BN / Mul / Add folding ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Fold:
    """An affine map (`scale`, `shift` per output channel; None: identity) that `layer`
    absorbs, replacing `node` (a BatchNormalization, Mul or Add) after it. For a MatMul,
    `layer` is the MatMul or the Add of a constant bias after it."""

    key: str
    layer: Node
    scale: np.ndarray | None
    shift: np.ndarray | None


def _check_bn(bn: Node, ctx: PassContext) -> _Fold:
    x = bn.input(0)
    p = x.producer if x is not None else None
    target = _bn_target(p) if p is not None and p.graph is bn.graph else None
    if target is None:
        raise NoMatch()
    assert p is not None
    reason = _bn_reason(bn) or _reader_reason(p, bn)
    if reason is not None:
        raise NoMatch(reason)
    scale, shift = _bn_affine(bn)
    check = {"conv": _bn_conv_reason, "gemm": _bn_gemm_reason, "matmul": _bn_matmul_reason}
    reason = check[target](p, bn, scale)
    if reason is not None:
        raise NoMatch(reason)
    key = {"Conv": "bn_into_conv", "ConvTranspose": "bn_into_convtranspose", "Gemm": "bn_into_gemm"}
    return _Fold(key.get(p.op_type, "bn_into_matmul"), p, scale, shift)


def _fold_bn(bn: Node, fold: _Fold, ctx: PassContext) -> None:
    graph = bn.graph
    assert graph is not None and fold.scale is not None and fold.shift is not None
    layer = fold.layer
    if layer.op_type == "Conv" and _fold_as_onnxruntime(graph, layer, bn):
        _replace_node(graph, bn, layer.output)
    elif layer.op_type in _CONVS:
        _rewrite_conv(graph, layer, fold.scale, fold.shift)
        _replace_node(graph, bn, layer.output)
    elif layer.op_type == "Gemm":
        _bn_into_gemm(graph, layer, bn, fold.scale, fold.shift)
    else:
        _bn_into_matmul(graph, layer, bn, fold.scale, fold.shift)


def _fold_as_onnxruntime(graph: Graph, conv: Node, bn: Node) -> bool:
    """Fold `bn` into `conv` in onnxruntime's precision and order (module docstring); False,
    nothing changed, where the dtypes differ (onnxruntime does not fuse those)."""
    w_val, b_val = conv.input(1), conv.input(2)
    w, b = const_value(w_val), const_value(b_val)
    gamma, beta, mean, var = (const_value(bn.input(i)) for i in range(1, 5))
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
    conv.set_input(1, _new_const(graph, w_new, w_val, "W"))
    _set_input(conv, 2, _new_const(graph, b_new, b_val, f"{w_val.name}_bias"))
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


def _conv_reason(conv: Node, m: int | None = None) -> str | None:
    """Why conv's weight/bias cannot absorb a per-output-channel scale (None when they can)."""
    w = const_value(conv.input(1))
    if w is None:
        return "conv weight is not constant"
    if not _is_float(w) or w.ndim < 3:
        return "conv weight is not a float tensor of rank >= 3"
    if conv.input(2) is not None and const_value(conv.input(2)) is None:
        return "conv bias is not constant"
    group = int(conv.attr("group", 1))
    if conv.op_type == "ConvTranspose" and w.shape[0] % group:
        return "ConvTranspose weight does not split into its groups"
    if m is not None and m != _out_channels(conv):
        return "channel count does not match the conv's output channels"
    return None


def _out_channels(conv: Node) -> int:
    w = const_value(conv.input(1))
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
    graph: Graph, conv: Node, scale: np.ndarray | None, shift: np.ndarray | None
) -> None:
    """conv' = conv·scale + shift per output channel (new weight/bias constants); a Conv
    without bias gets one only from a shift."""
    w_val = conv.input(1)
    dtype = const_value(w_val).dtype
    b = const_value(conv.input(2))
    if scale is not None:
        _scale_weight(graph, conv, scale)
    if b is None and shift is None:
        return
    bias = np.zeros(_out_channels(conv)) if b is None else b.astype(np.float64)
    if scale is not None:
        bias = bias * scale
    if shift is not None:
        bias = bias + shift
    new_b = _new_const(graph, bias.astype(dtype), conv.input(2), f"{w_val.name}_bias")
    _set_input(conv, 2, new_b)


def _scale_weight(graph: Graph, conv: Node, scale: np.ndarray) -> None:
    """conv's weight with output channel o multiplied by scale[o] (a new constant)."""
    w_val = conv.input(1)
    w = const_value(w_val)
    group = int(conv.attr("group", 1))
    w_new = _scale_out_channels(w.astype(np.float64), scale, conv.op_type, group)
    conv.set_input(1, _new_const(graph, w_new.astype(w.dtype), w_val, "W"))


def _bn_conv_reason(conv: Node, bn: Node, scale: np.ndarray) -> str | None:
    return _conv_reason(conv, len(scale))


def _bn_gemm_reason(gemm: Node, bn: Node, scale: np.ndarray) -> str | None:
    b, c_val = const_value(gemm.input(1)), gemm.input(2)
    c = const_value(c_val)
    trans_b = int(gemm.attr("transB", 0))
    if b is None or not _is_float(b) or b.ndim != 2:
        return "Gemm weight is not a constant float matrix"
    if c_val is not None and (c is None or c.ndim > 2):
        return "Gemm bias is not constant"
    if b.shape[0 if trans_b else 1] != len(scale):
        return "channel count does not match the Gemm's output columns"
    return None


def _bn_into_gemm(graph: Graph, gemm: Node, bn: Node, scale: np.ndarray, shift: np.ndarray) -> None:
    b, c_val = const_value(gemm.input(1)), gemm.input(2)
    c = const_value(c_val)
    trans_b = int(gemm.attr("transB", 0))
    cols = scale[:, None] if trans_b else scale[None, :]
    gemm.set_input(
        1, _new_const(graph, (b.astype(np.float64) * cols).astype(b.dtype), gemm.input(1), "B")
    )
    beta = float(gemm.attr("beta", 1.0))
    c64 = np.zeros(()) if c is None else beta * c.astype(np.float64)
    _set_input(gemm, 2, _new_const(graph, (c64 * scale + shift).astype(b.dtype), c_val, "C"))
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


def _matmul_and_add(node: Node) -> tuple[Node, Node | None, int]:
    """(MatMul, the Add of its bias or None, the bias input's index) for the layer `node`."""
    if node.op_type != "Add":
        return node, None, -1
    mm, bias_i = _matmul_add(node)  # type: ignore[misc]
    return mm, node, bias_i


def _bn_matmul_reason(node: Node, bn: Node, scale: np.ndarray) -> str | None:
    """node is the MatMul, or the Add of a constant bias after it."""
    mm, add, _ = _matmul_and_add(node)
    return _matmul_reason(mm, add, bn, len(scale))


def _bn_into_matmul(
    graph: Graph, node: Node, bn: Node, scale: np.ndarray, shift: np.ndarray
) -> None:
    mm, add, bias_i = _matmul_and_add(node)
    w_val = mm.input(1)
    w = const_value(w_val)
    mm.set_input(1, _new_const(graph, (w.astype(np.float64) * scale).astype(w.dtype), w_val, "W"))
    if add is not None:
        bias = const_value(add.input(bias_i)).astype(np.float64) * scale + shift
        add.set_input(bias_i, _new_const(graph, bias.astype(w.dtype), add.input(bias_i), "b"))
        _replace_node(graph, bn, add.output)
        return
    b = _new_const(graph, shift.astype(w.dtype), None, f"{w_val.name}_bias")
    new_add = graph.make_node("Add", [mm.output, b], before=bn)
    new_add.output.dtype, new_add.output.shape = bn.output.dtype, bn.output.shape
    _replace_node(graph, bn, new_add.output)


def _matmul_reason(mm: Node, add: Node | None, bn: Node, m: int) -> str | None:
    w = const_value(mm.input(1))
    if w is None or not _is_float(w) or w.ndim != 2:
        return "MatMul weight is not a constant float matrix"
    if w.shape[1] != m:
        return "channel count does not match the MatMul's output columns"
    if bn.input(0).rank != 2:
        return "BatchNormalization input is not 2-D, so its channels are not the MatMul columns"
    if add is None:
        return None
    if not _reads_only(mm.output, add):
        return "output has other readers"
    bias = const_value(add.input(_matmul_add(add)[1]))
    if bias.ndim > 2 or bias.size not in (1, m) or (bias.ndim and bias.shape[-1] not in (1, m)):
        return "MatMul bias is not per column"
    return None


def _data_and_const(node: Node) -> tuple[Value, int, np.ndarray] | None:
    """(data input, index of the constant input, constant) of a binary op with one constant."""
    a, b = node.input(0), node.input(1)
    ca, cb = const_value(a), const_value(b)
    if a is None or b is None or (ca is None) == (cb is None):
        return None
    return (b, 0, ca) if ca is not None else (a, 1, cb)


def _check_mul_add(node: Node, ctx: PassContext) -> _Fold:
    found = _data_and_const(node)
    if found is None or found[0].producer is None or found[0].producer.graph is not node.graph:
        raise NoMatch()  # no producer here (a graph input, or an outer-scope value)
    x, _, c = found
    p = x.producer
    assert p is not None
    if not p.is_standard or p.op_type not in (*_CONVS, "BatchNormalization"):
        raise NoMatch()
    if p.op_type in _CONVS:
        return _mul_add_conv(p, node, c)
    return _mul_add_bn(p, node, c)


def _mul_add_conv(conv: Node, node: Node, c: np.ndarray) -> _Fold:
    reason = _reader_reason(conv, node) or _conv_reason(conv)
    if reason is not None:
        raise NoMatch(reason)
    w = const_value(conv.input(1))
    if c.dtype != w.dtype:
        raise NoMatch("constant dtype differs from the conv weight")
    vec = _per_channel(c, w.ndim, _out_channels(conv))
    if vec is None:
        raise NoMatch(f"{node.op_type} constant does not broadcast per output channel")
    if node.op_type == "Mul":
        return _Fold("mul_into_conv", conv, vec, None)
    return _Fold("add_into_conv", conv, None, vec)


def _mul_add_bn(bn: Node, node: Node, c: np.ndarray) -> _Fold:
    reason = _bn_reason(bn)
    if reason is None and not _reads_only(bn.output, node):
        reason = "BatchNormalization output has other readers"
    if reason is not None:
        raise NoMatch(reason)
    gamma = const_value(bn.input(1))
    rank = bn.output.rank if bn.output.rank is not None else bn.input(0).rank
    vec = _per_channel(c, rank, len(gamma))
    if vec is None or c.dtype not in _FLOATS:
        raise NoMatch(f"{node.op_type} constant does not broadcast per channel")
    if node.op_type == "Mul":
        return _Fold("affine_into_bn", bn, vec, None)
    return _Fold("affine_into_bn", bn, None, vec)


def _fold_mul_add(node: Node, fold: _Fold, ctx: PassContext) -> None:
    graph = node.graph
    assert graph is not None
    layer = fold.layer
    if layer.op_type in _CONVS:
        _rewrite_conv(graph, layer, fold.scale, fold.shift)
        _replace_node(graph, node, layer.output)
        return
    gamma_v, beta_v = layer.input(1), layer.input(2)
    gamma, beta = const_value(gamma_v), const_value(beta_v)
    g64, b64 = gamma.astype(np.float64), beta.astype(np.float64)
    if fold.scale is not None:
        g64, b64 = g64 * fold.scale, b64 * fold.scale
        layer.set_input(1, _new_const(graph, g64.astype(gamma.dtype), gamma_v, "scale"))
    else:
        b64 = b64 + fold.shift
    layer.set_input(2, _new_const(graph, b64.astype(beta.dtype), beta_v, "bias"))
    _replace_node(graph, node, layer.output)


AFFINE_RULES = [
    Rule("bn_into_conv", ("BatchNormalization",), _check_bn, _fold_bn),
    Rule("mul_into_conv", ("Mul", "Add"), _check_mul_add, _fold_mul_add),
]


# -- activation fusion (onnxruntime FusedConv) --------------------------------------------------


def _check_activation(act: Node, ctx: PassContext) -> tuple[Node, list[float]]:
    x = act.input(0)
    conv = x.producer if x is not None else None
    if conv is None or conv.op_type != "Conv" or not conv.is_standard:
        raise NoMatch()
    if conv.graph is not act.graph:
        raise NoMatch()
    reason = _fused_conv_reason(conv, act)
    params = _activation_params(act) if reason is None else None
    if isinstance(params, str):
        reason = params
    if reason is not None:
        raise NoMatch(reason)
    assert params is not None
    return conv, params


def _fuse_activation(act: Node, found: tuple[Node, list[float]], ctx: PassContext) -> None:
    conv, params = found
    assert act.graph is not None
    _make_fused_conv(act.graph, conv, act, params)


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


def _activation_params(act: Node) -> list[float] | str:
    """FusedConv's activation_params for `act`, or why it cannot be expressed."""
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
            return "Clip bounds are not constant scalars"
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
    graph.model.opset_imports.setdefault(MS_DOMAIN, 1)
