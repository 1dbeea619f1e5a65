"""convert-fp16: run float32 compute in float16, with Cast nodes where the precisions meet.

The rewrite. Each node of the main graph (in topological order) either runs in float16 or keeps
float32. Which of a node's tensors change type is read from its ONNX schema: the inputs and
outputs bound to one type variable (T of Add, MatMul, Concat, Where's X/Y, Clip's bounds, Pad's
constant value...) must share one type, so a type variable whose tensors are all float32 and
whose constraint allows tensor(float16) converts as a whole; tensors with a concrete type
(Resize/Upsample `scales` is tensor(float)) or of another variable keep theirs. For a float16
node: float32 initializer inputs are replaced by new float16 constants (one per initializer,
shared by every float16 reader; the original stays for float32 readers, never modified), other
float32 inputs get a Cast(to=FLOAT16) placed right after their producer (one per value, shared),
and the converted outputs become float16. Last, every reader of a converted value that does not
take float16 at that input (a float32 node, a control-flow subgraph reading an outer value, a
graph output) reads a Cast(to=FLOAT) of it instead (one per value, shared). A converted graph
output is renamed and the Cast back takes its name, so outputs keep their names and types.

With `io` True in its option `fp16` (an `Fp16Settings`), float32 graph inputs and outputs
become float16 too (their declared type_proto is updated, keeping dimension names): the
model's interface changes, on request only.

What it computes is not exact, by design: every converted tensor is rounded to float16 (11
significant bits, finite range +-65504). These are the choices that keep the error at that
rounding, or keep float32 where float16 is unsafe:

- Reductions and norms that accumulate (ReduceSum/Mean/Prod/L1/L2/LogSum/LogSumExp/SumSquare,
  Layer/Batch/Instance/Group/Lp/RMS/MeanVariance normalization, CumSum) keep float32: a float16
  running sum loses the small terms and overflows. Softmax, LogSoftmax, Exp, Pow and Log keep
  float32: exp(x) overflows float16 for x > 11.1 and small probabilities underflow. Range keeps
  float32 (its outputs are indices/positions; its schema has no float16 anyway).
- Erf converts: it is bounded in [-1, 1] and saturates for |x| > 4, so float16 cannot overflow
  and the error is the rounding of its input and output. Max/Min reductions and pooling do not
  accumulate and convert; GlobalAveragePool/AveragePool average a window (onnxruntime
  accumulates them in float32 internally) and convert.
- Nodes of non-standard domains keep float32: onnxruntime's com.microsoft kernels (FusedConv...)
  are float32-only, and their type rules are not in the ONNX schemas.
- Control-flow nodes (If/Loop/Scan) and their subgraphs keep float32; an outer value a subgraph
  reads that became float16 is cast back before the node.
- Ops whose output type an attribute sets (`to`, `dtype`, `output_dtype`), Constant nodes (left
  over after fold-constants: a Cast converts their value for float16 readers) and quantization
  ops (QuantizeLinear, DequantizeLinear...: scales stay float32) keep float32.
- Inputs that are coordinates, not data, keep float32: Resize roi/scales, Upsample scales,
  GridSample grid (a float16 grid loses half a pixel on a 1000-pixel axis).
- A node on integer data only is untouched. A node without float outputs (ArgMax, Less,
  Equal...) converts only when one of its float32 inputs already became float16 (saves a Cast
  back; comparing the float16 value is comparing the rounded value either way).
- Shape, Size and Cast read float16 as they are: their result is the same as reading the value
  cast back to float32 (float16 -> float32 is exact), so no Cast back is placed before them. A
  Cast is never converted itself: a model's own Cast(to=FLOAT) is a float32 boundary.
- A weight (initializer or Constant) whose finite values exceed 65504 in magnitude would become
  inf: its reader keeps float32 ("weight 'w' overflows fp16 (max ...)"). Clip's bounds are the
  exception: a bound beyond the float16 range saturates to +-inf, which clips a float16 value
  exactly as the float32 bound did.
- With `fp16.ranges` (tensor name -> (min, max), from calibration), a node that produces
  or reads a tensor whose range exceeds 65504 in magnitude keeps float32.
- `fp16.keep_fp32` lists op types or node names that keep float32.
- Weights below float16's smallest subnormal (6e-8) flush to zero; no check is made for that.

Every node kept in float32 is recorded with its reason through ctx.refuse, and in the
result's details, an `Fp16Plan` (kept_fp32: [{node, op, reason}], converted: n).

Idempotent: after a run no float32 tensor is left in a convertible position (kept nodes are kept
again for the same reasons, Casts are never converted), so a second run changes nothing and
reports changed=False (with zero stats).

The per-node decision is a rule (`infercc.passes.rules`) on every op: its check makes the
node's plan or says why it keeps float32. For bisection one rewrite is one node converted to
float16 (with the casts and float16 weights it reads), asked once the node's plan is made; a
node cut off keeps float32 and is not recorded as kept. The Casts back to float32 follow from
the conversions, and the fp16_io interface change is made whatever the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.ops import QUANTIZATION_OPS, RANDOM_OPS
from infercc.passes.manager import (
    PassContext,
    PassOption,
    PassResult,
    register_option,
    register_pass,
)
from infercc.passes.match import const_value, default_opset
from infercc.passes.rules import NoMatch, Rule, apply_rules

log = logging.getLogger(__name__)

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = 65504.0
STAT_KEYS = ("nodes_fp16", "nodes_fp32_kept", "casts", "weights_converted")


@dataclass(frozen=True)
class Fp16Settings:
    """What convert-fp16 reads (its option `fp16`): float16 graph inputs and outputs too
    (`io`), the op types or node names kept in float32, and calibrated ranges (tensor name ->
    (min, max)) that keep a node whose output would overflow float16 in float32."""

    io: bool = False
    keep_fp32: Sequence[str] = ()
    ranges: Mapping[str, tuple[float, float]] | None = None


FP16: PassOption[Fp16Settings] = register_option(
    "fp16",
    Fp16Settings,
    "the float16 rewrite's options: float16 inputs and outputs, ops kept in float32, "
    "calibrated ranges",
    factory=Fp16Settings,
)

_ACCUMULATING = {
    "ReduceSum",
    "ReduceMean",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "LpNormalization",
    "RMSNormalization",
    "MeanVarianceNormalization",
    "CumSum",
}
_RISKY = {"Softmax", "LogSoftmax", "Exp", "Pow", "Log"}
_TYPE_ATTRS = ("to", "dtype", "output_dtype", "output_datatype")
# Readers that accept float16 as it is, with the same result (never converted themselves).
_AGNOSTIC = {"Shape", "Size", "Cast"}
# Inputs that are coordinates: they keep float32 (their type variable does not convert).
_COORD_INPUTS = {"Resize": (1, 2), "Upsample": (1,), "GridSample": (1,)}
# Inputs whose out-of-range constants saturate exactly (Clip bounds).
_SATURATING = {"Clip": (1, 2)}
_FP16_TYPE = "tensor(float16)"


@dataclass
class Fp16Plan:
    """What convert-fp16 did beyond counts: the nodes kept in float32, with their reasons (each
    entry once, in the order first met), and how many nodes were converted."""

    kept_fp32: list[dict[str, str]] = field(default_factory=list)
    converted: int = 0

    def merged(self, later: Fp16Plan) -> Fp16Plan:
        kept = list(self.kept_fp32)
        for entry in later.kept_fp32:
            if entry not in kept:
                kept.append(entry)
        return Fp16Plan(kept, self.converted + later.converted)


@dataclass(frozen=True)
class _Plan:
    """Which inputs and outputs of a float16 node become float16: index -> the value there."""

    inputs: dict[int, Value]
    outputs: dict[int, Value]


@dataclass
class _State:
    graph: Graph
    ctx: PassContext
    opset: int
    settings: Fp16Settings
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAT_KEYS, 0))
    plans: dict[Node, _Plan] = field(default_factory=dict)
    converted: dict[Value, int] = field(default_factory=dict)  # value -> original dtype
    consts: dict[Value, Value] = field(default_factory=dict)
    casts: dict[tuple[Value, int], Value] = field(default_factory=dict)
    kept: list[dict[str, str]] = field(default_factory=list)
    io_changed: bool = False

    def orig_dtype(self, v: Value) -> int | None:
        return self.converted.get(v, v.dtype)

    def check(self, node: Node, ctx: PassContext) -> _Plan:
        """The node's plan, or why it keeps float32 (a refusal, listed in kept_fp32)."""
        return _decide(self, node)

    def convert(self, node: Node, plan: _Plan, ctx: PassContext) -> None:
        _convert_node(self, node, plan)


@register_pass("convert-fp16", reads=("fp16",))
def convert_fp16(graph: Graph, ctx: PassContext) -> PassResult:
    """Convert float32 weights and compute to float16, keeping risky ops in float32."""
    st = _State(graph, ctx, default_opset(graph), FP16.read(ctx))
    fp16_io = bool(st.settings.io)
    if fp16_io:
        _convert_inputs(st)
    rule = Rule("nodes_fp16", None, st.check, st.convert, standard_only=False)
    for node, reason in apply_rules(graph, ctx, [rule], subgraphs=False).refused:
        st.kept.append({"node": node.name, "op": node.op_type, "reason": reason})
        st.stats["nodes_fp32_kept"] += 1
    _cast_back_readers(st, fp16_io)
    if fp16_io:
        _convert_outputs(st)
    changed = st.io_changed or any(st.stats[k] for k in ("nodes_fp16", "casts"))
    plan = Fp16Plan().merged(Fp16Plan(st.kept, st.stats["nodes_fp16"] if changed else 0))
    log.debug("convert-fp16: changed=%s %s", changed, st.stats)
    if not changed:
        return PassResult(changed=False, stats=dict.fromkeys(STAT_KEYS, 0), details=plan)
    return PassResult(changed=True, stats=st.stats, details=plan)


# -- per-node decision ---------------------------------------------------------------------


def _decide(st: _State, node: Node) -> _Plan:
    """The plan to convert; NoMatch(reason) to keep float32; NoMatch() to skip quietly."""
    if node.is_standard and node.op_type in _AGNOSTIC:
        raise NoMatch()
    tensors = [v for v in (*node.inputs, *node.outputs) if v is not None]
    dtypes = [st.orig_dtype(v) for v in tensors]
    if FLOAT not in dtypes:
        raise NoMatch()  # integer or already-converted data: nothing to convert
    reason = _exclusion(st, node)
    if reason is not None:
        raise NoMatch(reason)
    return _schema_plan(st, node)


def _exclusion(st: _State, node: Node) -> str | None:
    """Why a node touching float32 data keeps float32 whatever its types (None if it may not)."""
    op = node.op_type
    keep = st.settings.keep_fp32 or ()
    if not node.is_standard:
        return f"non-standard domain '{node.domain}' (its kernels run float32 only)"
    if node.subgraphs():
        return f"control flow ({op}) stays fp32 with its subgraphs"
    if op in keep or (node.name and node.name in keep):
        return "in the keep list"
    if op in _ACCUMULATING:
        return f"{op} stays fp32 (accumulates: a float16 sum loses precision and overflows)"
    if op in _RISKY:
        return f"{op} stays fp32 (numerically risky: overflows or underflows float16)"
    if op == "Range":
        return "Range stays fp32 (positions and indices)"
    if op == "Constant":
        return "Constant stays fp32 (fold-constants folds these; a Cast converts its value)"
    if op in QUANTIZATION_OPS:
        return f"quantization op ({op}) stays fp32"
    if op in RANDOM_OPS:
        return f"random op ({op}) stays fp32 (its output type is an attribute)"
    typed = [a for a in _TYPE_ATTRS if a in node.attributes]
    if typed:
        return f"output type set by its '{typed[0]}' attribute"
    return None


def _schema_plan(st: _State, node: Node) -> _Plan:
    schema = _schema(node.op_type, st.opset)
    groups = _type_groups(node, schema) if schema is not None else None
    if schema is None or groups is None:
        raise NoMatch("no ONNX schema for its inputs and outputs")
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    plan = _plan_from_groups(st, node, groups, allowed)
    reason = _overflow_reason(st, node, plan) or _attr_overflow_reason(node)
    if reason is None and not plan.outputs:
        reason = _no_float_output_reason(st, node, plan)
    if reason is not None:
        raise NoMatch(reason)
    return plan


def _plan_from_groups(
    st: _State, node: Node, groups: dict[str, list[tuple[bool, int]]], allowed: dict[str, set]
) -> _Plan:
    plan = _Plan({}, {})
    coords = _COORD_INPUTS.get(node.op_type, ())
    unknown = already = False
    for type_str, members in groups.items():
        vals = [_member(node, m) for m in members]
        dtypes = {st.orig_dtype(v) for v in vals}
        unknown |= None in dtypes
        already |= FLOAT16 in dtypes
        if dtypes != {FLOAT} or _FP16_TYPE not in allowed.get(type_str, ()):
            continue
        if any(is_in and i in coords for is_in, i in members):
            continue
        for (is_in, i), v in zip(members, vals, strict=True):
            (plan.inputs if is_in else plan.outputs)[i] = v
    if plan.inputs or plan.outputs:
        return plan
    if already:
        raise NoMatch()  # converted before: float32 is left only where it must be
    if unknown:
        raise NoMatch("dtype unknown (shape inference did not type it)")
    raise NoMatch("no float16 type for its float32 tensors in the ONNX schema")


def _member(node: Node, m: tuple[bool, int]) -> Value:
    is_in, i = m
    v = node.inputs[i] if is_in else node.outputs[i]
    assert v is not None
    return v


@cache
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def _type_groups(
    node: Node, schema: onnx.defs.OpSchema
) -> dict[str, list[tuple[bool, int]]] | None:
    """Schema type string -> the (is_input, index) of the tensors bound to it; None if unknown."""
    groups: dict[str, list[tuple[bool, int]]] = {}
    for is_in, values, params in (
        (True, node.inputs, schema.inputs),
        (False, node.outputs, schema.outputs),
    ):
        for i, v in enumerate(values):
            if v is None:
                continue
            p = _formal(params, i)
            if p is None or not p.is_homogeneous:
                return None
            groups.setdefault(p.type_str, []).append((is_in, i))
    return groups


def _formal(params: Sequence[onnx.defs.OpSchema.FormalParameter], i: int) -> Any:
    if i < len(params):
        return params[i]
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return params[-1] if params and params[-1].option == variadic else None


def _overflow_reason(st: _State, node: Node, plan: _Plan) -> str | None:
    saturating = _SATURATING.get(node.op_type, ())
    for i, v in sorted(plan.inputs.items()):
        peak = None if i in saturating else _const_peak(v)
        if peak is not None and peak > FP16_MAX:
            return f"weight '{v.name}' overflows fp16 (max {peak:.6g})"
    values = [v for _, v in sorted(plan.inputs.items())]
    values += [v for _, v in sorted(plan.outputs.items())]
    return _range_reason(st, values)


def _attr_overflow_reason(node: Node) -> str | None:
    if node.op_type != "ConstantOfShape" or node.attr("value") is None:
        return None
    peak = _peak(np.asarray(node.attr("value")))
    if peak is not None and peak > FP16_MAX:
        return f"ConstantOfShape value overflows fp16 (max {peak:.6g})"
    return None


def _range_reason(st: _State, values: list[Value]) -> str | None:
    ranges = st.settings.ranges or {}
    for v in values:
        r = ranges.get(v.name)
        if r is not None and max(abs(float(r[0])), abs(float(r[1]))) > FP16_MAX:
            return f"tensor '{v.name}' overflows fp16 (calibrated range [{r[0]:.6g}, {r[1]:.6g}])"
    return None


def _const_peak(v: Value) -> float | None:
    """Largest finite magnitude of a constant (initializer or Constant node) input."""
    a = const_value(v)
    return None if a is None else _peak(a)


def _peak(a: np.ndarray) -> float | None:
    if a.size == 0:
        return None
    return float(np.max(np.abs(a), initial=0.0, where=np.isfinite(a)))


def _no_float_output_reason(st: _State, node: Node, plan: _Plan) -> str | None:
    if any(st.converted.get(v) == FLOAT for v in plan.inputs.values()):
        return None
    return "produces no float tensor and reads only float32 values"


def _is_float(dtype: int | None) -> bool:
    if dtype is None:
        return False
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    return np.issubdtype(np_dtype, np.floating) or dtype == TensorProto.BFLOAT16


# -- rewriting ------------------------------------------------------------------------------


def _convert_node(st: _State, node: Node, plan: _Plan) -> None:
    for i, v in sorted(plan.inputs.items()):
        if v.dtype == FLOAT16:
            continue  # produced by a float16 node (or a float16 graph input)
        if v.const is not None:
            node.set_input(i, _fp16_const(st, v))
        else:
            node.set_input(i, _cast(st, v, FLOAT16))
    for _, out in sorted(plan.outputs.items()):
        _mark_converted(st, out)
    if node.op_type == "ConstantOfShape":
        value = node.attr("value")
        value = np.zeros(1, np.float32) if value is None else value
        node.set_attr("value", np.asarray(value).astype(np.float16))
    st.plans[node] = plan
    st.stats["nodes_fp16"] += 1


def _mark_converted(st: _State, v: Value) -> None:
    st.converted[v] = FLOAT
    v.dtype = FLOAT16


def _fp16_const(st: _State, v: Value) -> Value:
    new = st.consts.get(v)
    if new is None:
        with np.errstate(over="ignore"):
            arr = np.ascontiguousarray(v.numpy().astype(np.float16))
        new = st.graph.make_constant(arr, f"{v.name}_fp16")
        st.consts[v] = new
        st.stats["weights_converted"] += 1
    return new


def _cast(st: _State, v: Value, to: int) -> Value:
    """The shared Cast of `v` to `to`, placed right after v's producer (or first)."""
    key = (v, to)
    out = st.casts.get(key)
    if out is not None:
        return out
    suffix = "fp16" if to == FLOAT16 else "fp32"
    out = Value(st.graph.fresh_name(f"{v.name}_{suffix}"), to, v.shape)
    node = Node(
        "Cast",
        [v],
        [out],
        name=st.graph.fresh_node_name(f"cast_{suffix}"),
        attributes={"to": to},
    )
    _insert_after_definition(st.graph, v, node)
    st.casts[key] = out
    st.stats["casts"] += 1
    return out


def _insert_after_definition(graph: Graph, v: Value, node: Node) -> None:
    p = v.producer
    if p is not None and p.graph is graph:
        graph.insert_after(p, node)
        return
    first = next(iter(graph), None)
    if first is None:
        graph.append(node)
    else:
        graph.insert_before(first, node)


def _takes_fp16(st: _State, user: Node, i: int) -> bool:
    if user.graph is st.graph and user.is_standard and user.op_type in _AGNOSTIC:
        return True
    plan = st.plans.get(user)
    return plan is not None and i in plan.inputs


def _cast_back_readers(st: _State, fp16_io: bool) -> None:
    """Readers of converted values that need float32 read a shared Cast(to=FLOAT)."""
    for v in list(st.converted):
        for user, i in v.uses():
            if not _takes_fp16(st, user, i):
                user.set_input(i, _cast(st, v, FLOAT))
        if v.is_graph_output and not fp16_io:
            _recast_output(st, v, FLOAT)


def _recast_output(st: _State, v: Value, to: int) -> None:
    """Graph output `v` keeps its name through a Cast to `to`; v itself is renamed."""
    graph, model = st.graph, st.graph.model
    assert model is not None
    name = v.name
    model.rename_value(v, model.fresh_name(f"{name}_{'fp16' if to == FLOAT else 'fp32'}"))
    out = _cast(st, v, to)
    model.rename_value(out, name)
    out.type_proto = _retyped(v.type_proto, to)
    out.doc_string, v.type_proto = v.doc_string, None
    graph.outputs = [out if o is v else o for o in graph.outputs]


def _retyped(tp: onnx.TypeProto | None, dtype: int) -> onnx.TypeProto | None:
    """A copy of a declared tensor type with another element type (dims kept)."""
    if tp is None or not tp.HasField("tensor_type"):
        return None
    new = onnx.TypeProto()
    new.CopyFrom(tp)
    new.tensor_type.elem_type = dtype
    return new


# -- fp16_io ------------------------------------------------------------------------------


def _convert_inputs(st: _State) -> None:
    for v in st.graph.inputs:
        if v.dtype == FLOAT:
            _mark_converted(st, v)
            v.type_proto = _retyped(v.type_proto, FLOAT16)
            st.io_changed = True


def _convert_outputs(st: _State) -> None:
    for v in list(st.graph.outputs):
        if v.dtype == FLOAT16 and v in st.converted:
            v.type_proto = _retyped(v.type_proto, FLOAT16)
        elif v.dtype == FLOAT and not v.is_graph_input:
            _recast_output(st, v, FLOAT16)
            st.io_changed = True
