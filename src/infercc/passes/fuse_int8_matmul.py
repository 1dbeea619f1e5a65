"""fuse-int8-matmul: a quantized MatMul and its bias Add -> onnxruntime's MatMulIntegerToFloat.

quantize-qdq writes a transformer projection as standard QDQ:

    y = MatMul(DequantizeLinear(a_q, sa, za), DequantizeLinear(W_q, sw, zw)) + bias

onnxruntime's CPU session turns the MatMul and its two DequantizeLinears into one
`com.microsoft.MatMulIntegerToFloat` (integer products, then the scales), but leaves the bias
Add as a node of its own, which reads and writes the whole [batch, sequence, N] output once
more. The op takes the bias itself (its seventh input), so on the cpu target this pass writes
the fused op with the bias, as onnxruntime would, less the Add:

    y = MatMulIntegerToFloat(a_q, W_q, sa, sw, za, zw, bias)
      = (a_q - za) @ (W_q - zw) * (sa * sw) + bias

Exact: it is the op onnxruntime computes for the QDQ MatMul, and the bias is added to the same
float products (`(a_q - za) @ (W_q - zw)` is an integer sum in both forms). On all-MiniLM-L6-v2
int8 it fuses all 24 projections with their biases: the int8 model ran in 0.93x the time of
its QDQ form (0.95x with the outlier split), in one loop (docs/benchmarks.md).

Matched, one rule anchored on the Add: a constant float32 bias [N] added to a standard MatMul
read by nothing else, whose A is DequantizeLinear of a per-tensor (u)int8 activation and whose
B is DequantizeLinear of a constant (u)int8 matrix [K, N], per tensor or per column (axis 1),
with the type pairs onnxruntime's CPU kernel takes (uint8 x int8, uint8 x uint8, int8 x int8).
Only with onnxruntime's contrib ops allowed and the cpu target (a TensorRT or `--portable`
build keeps the QDQ form, which those runtimes read). The DequantizeLinears left unread go with
dead-code elimination.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from infercc.ir import Graph, Node, Value
from infercc.ir.ops import MS_DOMAIN
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_value, producer, sole_reader
from infercc.passes.rules import NoMatch, Rule, apply_rules

# (activation type, weight type) pairs onnxruntime's CPU MatMulIntegerToFloat runs
KERNEL_TYPES = {
    (TensorProto.UINT8, TensorProto.INT8),
    (TensorProto.UINT8, TensorProto.UINT8),
    (TensorProto.INT8, TensorProto.INT8),
}
_INT8 = {np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8}


@dataclass(frozen=True)
class _Match:
    matmul: Node
    a: Value  # the quantized activation
    b: Value  # the quantized weight
    a_scale: Value
    b_scale: Value
    a_zero: Value | None
    b_zero: Value | None
    bias: Value


def _dq_parts(node: Node | None) -> tuple[Value, Value, Value | None]:
    if node is None or not node.is_standard or node.op_type != "DequantizeLinear":
        raise NoMatch()
    x, scale = node.input(0), node.input(1)
    if x is None or scale is None:
        raise NoMatch()
    return x, scale, node.input(2)


def _check(node: Node, ctx: PassContext) -> _Match:
    if len(node.inputs) != 2:
        raise NoMatch()
    bias = next((v for v in node.inputs if v is not None and const_value(v) is not None), None)
    other = next((v for v in node.inputs if v is not bias), None)
    matmul = producer(other, "MatMul")
    if bias is None or other is None or matmul is None or not matmul.is_standard:
        raise NoMatch()
    a_dq, b_dq = producer(matmul.input(0)), producer(matmul.input(1))
    if (a_dq is None or a_dq.op_type != "DequantizeLinear") or (
        b_dq is None or b_dq.op_type != "DequantizeLinear"
    ):
        raise NoMatch()  # a float MatMul: none of this pass's business
    if sole_reader(matmul.output) is not node:  # None for a graph output too
        raise NoMatch("the MatMul's output is read by more than its bias Add", at=matmul)
    a, a_scale, a_zero = _dq_parts(a_dq)
    b, b_scale, b_zero = _dq_parts(b_dq)
    weight, bias_value = const_value(b), const_value(bias)
    assert bias_value is not None
    if weight is None or weight.ndim != 2 or weight.dtype not in _INT8:
        raise NoMatch("the MatMul's weight is not a constant (u)int8 matrix", at=b_dq)
    pair = (a.dtype, _INT8[weight.dtype])
    if const_value(a) is not None or pair not in KERNEL_TYPES:
        raise NoMatch("its activation and weight types are not a pair the kernel runs", at=a_dq)
    n = int(weight.shape[1])
    if bias_value.dtype != np.float32 or bias_value.shape != (n,):
        raise NoMatch(f"the bias is not a float32 vector of the {n} output columns")
    _check_scales(a_dq, a_scale, a_zero, 1, "activation")
    _check_scales(b_dq, b_scale, b_zero, n, "weight")
    return _Match(matmul, a, b, a_scale, b_scale, a_zero, b_zero, bias)


def _check_scales(dq: Node, scale: Value, zero: Value | None, n: int, what: str) -> None:
    """Per tensor (one value), or for the weight per column (n values on axis 1)."""
    s = const_value(scale)
    if s is None or s.dtype != np.float32 or dq.attr("block_size", 0):
        raise NoMatch(f"the {what} scale is not a constant float32", at=dq)
    if s.size != 1:
        axis = dq.attr("axis", 1)
        if n == 1 or s.shape != (n,) or axis not in (1, -1):
            raise NoMatch(f"the {what} is not quantized per tensor or per column", at=dq)
    if zero is not None:
        z = const_value(zero)
        if z is None or z.shape != s.shape:
            raise NoMatch(f"the {what} zero point is not a constant of its scale's shape", at=dq)


def _rewrite(node: Node, m: _Match, ctx: PassContext) -> None:
    graph = node.owning_graph()
    inputs = [m.a, m.b, m.a_scale, m.b_scale, m.a_zero, m.b_zero, m.bias]
    fused = graph.make_node(
        "MatMulIntegerToFloat",
        inputs,
        1,
        before=m.matmul,
        domain=MS_DOMAIN,
        name=f"{m.matmul.name}_int8",
    )
    graph.ensure_opset(MS_DOMAIN)
    out = fused.out(0)
    out.dtype, out.shape = TensorProto.FLOAT, node.output.shape
    graph.replace_all_uses_with(node.output, out)
    graph.remove(node)
    graph.remove(m.matmul)
    fused.name = m.matmul.name  # the projection keeps its name (reports and --exclude use it)


FUSE = Rule("fused", ("Add",), _check, _rewrite)


@register_pass("fuse-int8-matmul")
def fuse_int8_matmul(graph: Graph, ctx: PassContext) -> PassResult:
    """A QDQ MatMul and its bias Add -> onnxruntime's MatMulIntegerToFloat (cpu target)."""
    stats = {"fused": 0}
    if ctx.fused_ops_allowed and ctx.target == "cpu":
        stats.update(apply_rules(graph, ctx, [FUSE]).counts)
    return PassResult(changed=any(stats.values()), stats=stats)
