"""fuse-gemm: a MatMul by a constant matrix plus a constant bias becomes one Gemm.

Two forms, each one node fewer:

- **rank 2**: `Add(MatMul(A, B), c)` with A of rank 2 becomes `Gemm(A, B, c)`;
- **through Reshapes**: the exporters' linear layer on windows or tokens,
  `Reshape(Add(MatMul(Reshape(X, t1), B), c), t2)` with the inner Reshape's result of rank >= 2,
  becomes `Reshape(Gemm(Reshape(X, [-1, K]), B, c), t2)`: 4 nodes become 3.

B is a constant [K, N]; c a constant broadcast along the last axis only (shape [N], [1], or
ones before the last dimension, never of a higher rank than the MatMul's result); the dtype is
float32, float16 or double; the MatMul's and the Add's results have no other reader and are no
graph output; opset 11 or newer (Gemm's broadcasting C).

Why it is exact. Gemm computes A @ B + c row by row, which is what MatMul then Add compute for
a rank-2 A. For a higher rank, MatMul treats A [..., M, K] as a stack of matrices, which is the
rows of A read as [prod(...) * M, K] in row-major order: Reshape(X, [-1, K]) is those rows
(Reshape keeps the row-major order of the elements, so it does not matter how t1 grouped them),
and the outer Reshape reads the same elements in the same order whether they come as
[..., M, N] or as [prod(...) * M, N], provided its target copies no dimension (a 0 with
allowzero 0 would copy the 2-D shape's): the target must be a constant without 0. The
arithmetic is the same: onnxruntime's CPU session rewrites MatMul + Add into its Gemm kernel
itself (its MatMulAddFusion), so the kernel that runs is the one it ran before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
from onnx import TensorProto

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.tensor import Tensor
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import const_ints, const_tensor, default_opset, producer, sole_reader
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
_KINDS = ("rank2", "through_reshapes")


@register_pass("fuse-gemm")
def fuse_gemm(graph: Graph, ctx: PassContext) -> PassResult:
    """MatMul by a constant [K, N] plus a constant bias into one Gemm (module docstring)."""
    run = apply_rules(graph, ctx, [Rule("gemm", ("Add",), _check, _rewrite)])
    stats = {**dict.fromkeys(_KINDS, 0), **run.counts, "refused": len(run.refused)}
    return PassResult(changed=any(stats[k] for k in _KINDS), stats=stats)


@dataclass(frozen=True)
class _Match:
    matmul: Node
    a: Value  # the MatMul's activation
    weight: Value  # its constant [K, N] weight
    k: int
    n: int
    bias: Tensor
    out: Value  # the Add's output
    inner: Node | None  # the Reshape producing A (through_reshapes), else None
    outer: Node | None  # the Reshape reading the Add's result (through_reshapes)
    key: str


def _check(add: Node, ctx: PassContext) -> _Match:
    found = _matmul_and_bias(add)
    if found is None:
        raise NoMatch()
    mm, bias = found
    weight_v = mm.input(1)
    weight = const_tensor(weight_v)
    if weight_v is None or weight is None or len(weight.shape) != 2 or weight.dtype not in _FLOATS:
        raise NoMatch()
    a = mm.input(0)
    if a is None or (a.dtype is not None and a.dtype != weight.dtype):
        raise NoMatch()
    k, n = (int(d) for d in weight.shape)
    if bias.dtype != weight.dtype or not _bias_broadcasts(bias, n):
        raise NoMatch()
    out = add.outputs[0]
    if sole_reader(mm.outputs[0]) is not add or out is None:
        raise NoMatch()
    if default_opset(add) < 11:
        raise NoMatch("opset below 11 (Gemm's C does not broadcast the same way)")
    found_match = _Match(mm, a, weight_v, k, n, bias, out, None, None, "rank2")
    if a.rank == 2 and len(bias.shape) <= 2:
        return found_match
    return _through_reshapes(add, found_match)


def _matmul_and_bias(add: Node) -> tuple[Node, Tensor] | None:
    for i in (0, 1):
        mm = producer(add.input(i), "MatMul")
        bias = const_tensor(add.input(1 - i))
        if mm is not None and bias is not None:
            return mm, bias
    return None


def _bias_broadcasts(bias: Tensor, n: int) -> bool:
    """c is broadcast along the last axis only: ones before a last dimension of N or 1."""
    shape = tuple(int(d) for d in bias.shape)
    if not shape:
        return True
    return all(d == 1 for d in shape[:-1]) and shape[-1] in (1, n)


def _through_reshapes(add: Node, m: _Match) -> _Match:
    mm, bias = m.matmul, m.bias
    inner = producer(mm.input(0), "Reshape")
    outer = sole_reader(add.outputs[0])
    if inner is None or outer is None or outer.op_type != "Reshape" or not outer.is_standard:
        raise NoMatch()
    if outer.input(0) is not add.outputs[0]:
        raise NoMatch()
    t1, t2 = const_ints(inner.input(1)), const_ints(outer.input(1))
    if t1 is None or len(t1) < 2:
        raise NoMatch("the Reshape before the MatMul has no constant target of rank >= 2")
    if len(bias.shape) > len(t1):
        raise NoMatch()
    if t2 is None:
        raise NoMatch("the Reshape after the bias has no constant target")
    if 0 in t2 and outer.attr("allowzero", 0) != 1:
        raise NoMatch("the Reshape after the bias copies a dimension (a 0 in its target)")
    if sole_reader(mm.input(0)) is not mm:
        raise NoMatch("the reshaped input has other readers")
    return replace(m, inner=inner, outer=outer, key="through_reshapes")


def _rewrite(add: Node, m: _Match, ctx: PassContext) -> None:
    graph = add.owning_graph()
    c = graph.make_constant(_flat_bias(m.bias, m.n), "gemm_bias")
    a = m.a
    if m.inner is not None:
        a = _rows(graph, m.inner, m.k, before=m.matmul)
    gemm = graph.make_node("Gemm", [a, m.weight, c], before=add, name="gemm")
    out = gemm.output
    out.dtype = m.out.dtype
    out.shape = m.out.shape if m.inner is None else None
    if m.outer is not None:
        m.outer.set_input(0, out)
    else:
        graph.replace_all_uses_with(m.out, out)
    graph.remove(add)
    graph.remove(m.matmul)
    if m.matmul.name:  # the layer keeps its name: --exclude and the reports still name it
        gemm.name = m.matmul.name
    if m.inner is not None and not any(v is not None and v.uses() for v in m.inner.outputs):
        graph.remove(m.inner)


def _flat_bias(bias: Tensor, n: int) -> Tensor:
    """The bias as [N] (or [1]): the shape Gemm broadcasts over [M, N]."""
    arr = np.asarray(bias.numpy())
    width = n if arr.size == n else 1
    return Tensor(arr.reshape(width), dtype=bias.dtype)


def _rows(graph: Graph, inner: Node, k: int, before: Node) -> Value:
    """Reshape(X, [-1, K]) of the inner Reshape's input: the MatMul's rows as a matrix."""
    target = graph.make_constant(np.asarray([-1, k], dtype=np.int64), "gemm_rows")
    node = graph.make_node("Reshape", [inner.input(0), target], before=before, name="gemm_rows")
    out = node.outputs[0]
    assert out is not None
    src = inner.outputs[0]
    out.dtype = src.dtype if src is not None else None
    return out
