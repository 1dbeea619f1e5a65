"""The roofline model: a lower bound on each node's run time on a target, and a memory budget.

A node that performs `F` floating-point operations and moves `B` bytes between memory and the
chip cannot finish faster than the slower of its two limits:

    time = max(F / peak(precision), B / bandwidth)

Its *arithmetic intensity* `F / B` (FLOP per byte) decides which limit binds: at or above the
target's ridge point `peak / bandwidth` the node is compute-bound, below it memory-bound. The
sum over nodes is a lower bound on one inference's latency: it ignores kernel launch overheads,
caches (a tensor read by the next node straight from L2 still counts as DRAM traffic here),
fusion (two fused nodes move fewer bytes than the two nodes apart) and achieved versus peak
efficiency. Shapes come from `infercc.ir.shapes.concrete_types` at pinned input shapes.

Counting rules (`node_cost`):

- FLOPs. Conv/ConvTranspose/MatMul/Gemm and their fused and quantized forms: 2 x multiply-adds,
  plus 1 per output element for a bias (Conv B, Gemm C) or a fused activation (FusedConv).
  Elementwise ops: 1 per output element (`_PER_OUTPUT`; a few transcendental blends cost more:
  Softmax 5, LayerNormalization 8, BatchNormalization 2, Gelu 8). Reductions: 1 per input
  element. Pooling: kernel size per output element. Data movement (Reshape, Transpose, Concat,
  Gather, Cast, ...): 0. Any other op counts 0 FLOPs and is listed in `uncounted_ops`.
- Bytes. Read: every distinct input tensor once (weights included). Written: every output.
- A node with a tensor of unknown shape or dtype, or a control-flow node (If/Loop/Scan, whose
  cost depends on data), has no cost and is listed in `unknown`.
- Precision: the dtype of the first floating or 8-bit input (float32 -> fp32, float16 -> fp16,
  bfloat16 -> bf16, int8/uint8 -> int8, float8 -> fp8); integer-arithmetic ops (MatMulInteger,
  ConvInteger, QLinear*) are int8, and a Conv/MatMul/Gemm whose data and weight both come
  from a DequantizeLinear of 8-bit tensors counts at the 8-bit precision (what TensorRT runs
  for a Q/DQ pair). A precision the target lacks falls back to fp32, recorded per node.

Memory budget (`memory_budget`, `largest_batch`): weights + activation arena + workspace must
fit the target's memory. TensorRT's default workspace limit is the whole device, but what a
build actually uses is kernel scratch: cuBLASLt's recommended workspace (32 MiB on Hopper),
cuDNN's convolution algorithms (tens to hundreds of MiB, growing with the activations) and
TensorRT tactic scratch. The default estimate is `max(64 MiB, 10% of weights + arena)`. The
CUDA context itself (a few hundred MiB) is not counted; pass `workspace_bytes` to include it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infercc.errors import InferccError
from infercc.ir import Model, Node, dtypes
from infercc.ir.dtypes import tensor_bytes
from infercc.ir.ops import CONTROL_FLOW_OPS, INT8_COMPUTE_OPS
from infercc.ir.shapes import concrete_types
from infercc.outputs import check_output_file, make_parents

if TYPE_CHECKING:
    from infercc.analysis.targets import Target

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
Types = Mapping[str, tuple[int | None, tuple[int | str | None, ...] | None]]

MiB = 2**20
WORKSPACE_MIN_BYTES = 64 * MiB
WORKSPACE_FRACTION = 0.10
FALLBACK_PRECISION = "fp32"

# -- FLOP rules -------------------------------------------------------------------------------

# name -> FLOPs per output element
_PER_OUTPUT: dict[str, int] = {
    **dict.fromkeys(
        (
            "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Relu", "LeakyRelu", "PRelu", "Elu",
            "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus",
            "Softsign", "Mish", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs",
            "Sign", "Floor", "Ceil", "Round", "Clip", "Sin", "Cos", "Tan", "Asin", "Acos",
            "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Where", "Equal", "Less",
            "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN",
            "IsInf", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
        ),
        1,
    ),
    "QuantizeLinear": 2, "DequantizeLinear": 2, "BatchNormalization": 2,
    "Softmax": 5, "LogSoftmax": 5, "Hardmax": 2,
    "LayerNormalization": 8, "InstanceNormalization": 8, "GroupNormalization": 8,
    "SimplifiedLayerNormalization": 6, "RMSNormalization": 6, "SkipLayerNormalization": 9,
    "SkipSimplifiedLayerNormalization": 7, "LpNormalization": 3,
    "Gelu": 8, "FastGelu": 8, "BiasGelu": 9, "QuickGelu": 4,
}  # fmt: skip

# name -> FLOPs per input element
_PER_INPUT: dict[str, int] = {
    **dict.fromkeys(
        ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1"), 1
    ),
    **dict.fromkeys(("ArgMax", "ArgMin", "GlobalAveragePool", "GlobalMaxPool"), 1),
    **dict.fromkeys(("ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"), 2),
    "GlobalLpPool": 2,
}

_DATA_MOVEMENT = frozenset(
    {
        "Reshape", "Transpose", "Concat", "Split", "SplitToSequence", "Gather", "GatherElements",
        "GatherND", "Slice", "Cast", "CastLike", "Identity", "Flatten", "Squeeze", "Unsqueeze",
        "Expand", "Tile", "Pad", "Shape", "Size", "ConstantOfShape", "Constant", "DepthToSpace",
        "SpaceToDepth", "ScatterND", "ScatterElements", "Scatter", "Dropout", "Range", "OneHot",
        "Trilu", "EyeLike", "Compress", "NonZero", "ReverseSequence", "Optional",
        "OptionalGetElement", "OptionalHasElement",
    }
)  # fmt: skip

_DENSE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul"})

Ins = Sequence[Shape | None]


def _present(shapes: Ins, i: int) -> bool:
    return i < len(shapes) and shapes[i] is not None


def _at(shapes: Ins, i: int) -> Shape:
    """Shape `i`: a required input's, or output 0's (which `node_cost` checked)."""
    shape = shapes[i]
    if shape is None:
        raise TypeError(f"shape {i} of a node's required operands is unknown")
    return shape


def _conv(node: Node, ins: Ins, outs: Ins, w: int = 1, bias: int = 2) -> int:
    """Each output element: C/g x prod(kernel) multiply-adds (the weight is [M, C/g, k...])."""
    y = math.prod(_at(outs, 0))
    return 2 * y * math.prod(_at(ins, w)[1:]) + (y if _present(ins, bias) else 0)


def _fused_conv(node: Node, ins: Ins, outs: Ins) -> int:
    """Conv + 1 per output element for the activation (+1 more for the summed input Z)."""
    y = math.prod(_at(outs, 0))
    return _conv(node, ins, outs) + y + (y if _present(ins, 3) else 0)


def _conv_transpose(node: Node, ins: Ins, outs: Ins) -> int:
    """Each input element scatters into M/g x prod(kernel) outputs (weight [C, M/g, k...])."""
    y = math.prod(_at(outs, 0))
    return 2 * math.prod(_at(ins, 0)) * math.prod(_at(ins, 1)[1:]) + (y if _present(ins, 2) else 0)


def _matmul(node: Node, ins: Ins, outs: Ins, a: int = 0) -> int:
    """2 x prod(Y) x K, K the contracted dimension of A (batch dims broadcast into Y)."""
    shape_a = _at(ins, a)
    k = shape_a[-2] if node.attr("transA", 0) and len(shape_a) >= 2 else shape_a[-1]
    return 2 * math.prod(_at(outs, 0)) * (k if shape_a else 1)


def _gemm(node: Node, ins: Ins, outs: Ins) -> int:
    """Y = alpha A'B' + beta C: 2 x M x N x K, plus M x N for C."""
    y = math.prod(_at(outs, 0))
    k = _at(ins, 0)[0] if node.attr("transA", 0) else _at(ins, 0)[1]
    return 2 * y * k + (y if _present(ins, 2) else 0)


def _pool(node: Node, ins: Ins, outs: Ins) -> int:
    return math.prod(_at(outs, 0)) * math.prod(node.attr("kernel_shape", ()) or (1,))


def _variadic(node: Node, ins: Ins, outs: Ins) -> int:
    """Sum/Max/Min of n inputs: n-1 ops per output element; Mean one more (the divide)."""
    n = sum(1 for s in ins if s is not None)
    return math.prod(_at(outs, 0)) * (n if node.op_type == "Mean" else max(n - 1, 0))


def _resize(node: Node, ins: Ins, outs: Ins) -> int:
    """Nearest is a gather (0); linear/cubic interpolation ~ 4 ops per output element."""
    mode = node.attr("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return 0 if mode == "nearest" else 4 * math.prod(_at(outs, 0))


FlopRule = Callable[[Node, Ins, Ins], int]

_RULES: dict[str, FlopRule] = {
    "Conv": _conv,
    "ConvInteger": _conv,
    "QLinearConv": lambda n, i, o: _conv(n, i, o, w=3, bias=8),
    "FusedConv": _fused_conv,
    "ConvTranspose": _conv_transpose,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "MatMulIntegerToFloat": _matmul,
    "FusedMatMul": _matmul,
    "QLinearMatMul": _matmul,
    "Gemm": _gemm,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
    "Sum": _variadic,
    "Max": _variadic,
    "Min": _variadic,
    "Mean": _variadic,
    "Resize": _resize,
    "Upsample": _resize,
}


def counted(op_type: str) -> bool:
    """Whether `node_flops` has a rule for this op type (data movement counts as a rule: 0)."""
    return (
        op_type in _RULES
        or op_type in _PER_OUTPUT
        or op_type in _PER_INPUT
        or op_type in _DATA_MOVEMENT
    )


def node_flops(node: Node, ins: Ins, outs: Ins) -> int:
    """FLOPs of `node` given its (known) input and output shapes; 0 for unmodelled ops."""
    op = node.op_type
    if op in _RULES:
        return _RULES[op](node, ins, outs)
    if op in _PER_OUTPUT:
        return _PER_OUTPUT[op] * math.prod(_at(outs, 0))
    if op in _PER_INPUT:
        return _PER_INPUT[op] * math.prod(_at(ins, 0))
    return 0


# -- node cost --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeCost:
    """What a node computes and moves, at concrete shapes. `precision` is the node's own."""

    name: str
    op_type: str
    flops: int
    bytes_read: int
    bytes_written: int
    precision: str

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOP per byte moved; inf for FLOPs with no traffic, 0 for neither."""
        if self.bytes:
            return self.flops / self.bytes
        return math.inf if self.flops else 0.0


def node_label(node: Node, index: int | None = None) -> str:
    if node.name:
        return node.name
    return f"{node.op_type}#{index}" if index is not None else node.op_type


def _static(shape: Any) -> Shape | None:
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _known(types: Types, name: str) -> tuple[Shape, int] | None:
    """(shape, bytes) of a value when its dtype and every dimension are known."""
    dtype, shape = types.get(name, (None, None))
    static = _static(shape)
    if static is None:
        return None
    nbytes = tensor_bytes(dtype, static)
    return None if nbytes is None else (static, nbytes)


def _io(node: Node, values: Iterable, types: Types) -> tuple[list[Shape | None], int] | None:
    """Shapes (None for omitted slots) and total bytes of distinct values; None if one unknown."""
    shapes: list[Shape | None] = []
    seen: dict[str, int] = {}
    for v in values:
        if v is None:
            shapes.append(None)
            continue
        known = _known(types, v.name)
        if known is None:
            return None
        shapes.append(known[0])
        seen[v.name] = known[1]
    return shapes, sum(seen.values())


def node_cost(node: Node, types: Types, index: int | None = None) -> NodeCost | None:
    """FLOPs, bytes and precision of `node` at the shapes in `types`; None when unknown."""
    if node.op_type in CONTROL_FLOW_OPS or node.subgraphs():
        return None
    ins = _io(node, node.inputs, types)
    outs = _io(node, node.outputs, types)
    if ins is None or outs is None or not outs[0] or outs[0][0] is None:
        return None
    flops = node_flops(node, ins[0], outs[0])
    read = ins[1]
    if node.op_type in _GATHERS and node.is_standard:
        # A gather reads the selected rows (as many bytes as it writes) and its indices, not
        # the whole table: an embedding lookup touches a few rows of a large weight.
        read = min(read, outs[1] + (_bytes_of(node.input(1), types) or 0))
    return NodeCost(
        node_label(node, index), node.op_type, flops, read, outs[1], node_precision(node, types)
    )


_GATHERS = ("Gather", "GatherElements", "GatherND")


def _bytes_of(v, types: Types) -> int | None:
    if v is None or v.name not in types:
        return None
    dtype, shape = types[v.name]
    return tensor_bytes(dtype, shape)


def _dtype(types: Types, v) -> int | None:
    if v is None:
        return None
    dtype = types.get(v.name, (None, None))[0]
    return v.dtype if dtype is None else dtype


def _dequantized(v, types: Types) -> str | None:
    """The 8-bit precision a value was dequantized from (DequantizeLinear of int8/fp8), or None."""
    p = v.producer if v is not None else None
    if p is None or p.op_type != "DequantizeLinear":
        return None
    found = dtypes.precision(_dtype(types, p.input(0)))
    return found if found in ("int8", "fp8") else None


def node_precision(node: Node, types: Types) -> str:
    """The precision a node computes in (see module doc); fp32 when nothing says otherwise."""
    if node.op_type in INT8_COMPUTE_OPS or node.op_type.startswith("QLinear"):
        return "int8"
    if node.op_type in _DENSE_OPS:
        a, b = _dequantized(node.input(0), types), _dequantized(node.input(1), types)
        if a is not None and a == b:
            return a
    for v in [*node.inputs, *node.outputs]:
        precision = dtypes.precision(_dtype(types, v))
        if precision is not None:
            return precision
    return FALLBACK_PRECISION


# -- the report -------------------------------------------------------------------------------


def supports(target: Target, precision: str) -> bool:
    """Whether the target lists a positive peak at `precision`."""
    return precision in target.precisions and target.peak_flops.get(precision, 0) > 0


@dataclass(frozen=True)
class NodeRoofline:
    """One node on the target's roofline. `precision` is the one timed; see `fell_back_from`."""

    cost: NodeCost
    precision: str
    fell_back_from: str | None
    ridge_point: float
    compute_time: float
    memory_time: float

    @property
    def name(self) -> str:
        return self.cost.name

    @property
    def op_type(self) -> str:
        return self.cost.op_type

    @property
    def flops(self) -> int:
        return self.cost.flops

    @property
    def bytes(self) -> int:
        return self.cost.bytes

    @property
    def intensity(self) -> float:
        return self.cost.intensity

    @property
    def time(self) -> float:
        """Roofline time in seconds: the slower of the compute and the memory limit."""
        return max(self.compute_time, self.memory_time)

    @property
    def bound(self) -> str:
        return "compute" if self.intensity >= self.ridge_point else "memory"

    @property
    def achieved_flops(self) -> float:
        """FLOP/s at roofline time: min(peak, intensity x bandwidth) for a node with FLOPs."""
        return self.flops / self.time if self.time > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "flops": self.flops,
            "bytes_read": self.cost.bytes_read,
            "bytes_written": self.cost.bytes_written,
            "intensity": _finite(self.intensity),
            "precision": self.precision,
            "fell_back_from": self.fell_back_from,
            "ridge_point": self.ridge_point,
            "bound": self.bound,
            "time_s": self.time,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def place(cost: NodeCost, target: Target, allow_tf32: bool = False) -> NodeRoofline:
    """Put a node's cost on the target's roofline, falling back to fp32 for a missing precision."""
    precision, fell_back = cost.precision, None
    if (
        precision == "fp32"
        and allow_tf32
        and cost.op_type in _DENSE_OPS
        and supports(target, "tf32")
    ):
        precision = "tf32"
    if not supports(target, precision):
        fell_back, precision = precision, FALLBACK_PRECISION
        if not supports(target, precision):
            raise InferccError(
                f"target {target.name!r} has neither {fell_back} nor {precision} peak",
                "give the target an fp32 peak",
            )
    return NodeRoofline(
        cost,
        precision,
        fell_back,
        target.ridge_point(precision),
        cost.flops / target.peak(precision),
        cost.bytes / target.memory_bandwidth,
    )


@dataclass
class RooflineReport:
    """Every node of a model on a target's roofline, in graph order."""

    target: Target
    input_shapes: dict[str, tuple[int, ...]]
    nodes: list[NodeRoofline]
    unknown: list[str] = field(default_factory=list)
    uncounted_ops: list[str] = field(default_factory=list)

    @property
    def total_time(self) -> float:
        """Sum of node roofline times: a lower bound on one inference's latency (seconds)."""
        return sum(n.time for n in self.nodes)

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def total_bytes(self) -> int:
        return sum(n.bytes for n in self.nodes)

    @property
    def flops_by_precision(self) -> dict[str, int]:
        """FLOPs per node precision (the model's own, before any fallback)."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.cost.precision] = out.get(n.cost.precision, 0) + n.flops
        return out

    @property
    def main_precision(self) -> str:
        """The precision holding the most FLOPs (fp32 for a model with none)."""
        by = self.flops_by_precision
        return max(by, key=lambda p: by[p]) if by and any(by.values()) else FALLBACK_PRECISION

    @property
    def fallbacks(self) -> dict[str, str]:
        """Node name -> the precision it asked for and the target lacked."""
        return {n.name: n.fell_back_from for n in self.nodes if n.fell_back_from}

    def top(self, n: int = 10) -> list[NodeRoofline]:
        """The `n` slowest nodes, slowest first (graph order breaks ties)."""
        return sorted(self.nodes, key=lambda x: -x.time)[:n]

    def time_by_bound(self) -> dict[str, float]:
        out = {"compute": 0.0, "memory": 0.0}
        for n in self.nodes:
            out[n.bound] += n.time
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.name,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "total_time_s": self.total_time,
            "total_flops": self.total_flops,
            "total_bytes": self.total_bytes,
            "main_precision": self.main_precision,
            "flops_by_precision": self.flops_by_precision,
            "time_by_bound_s": self.time_by_bound(),
            "fallbacks": self.fallbacks,
            "unknown_nodes": list(self.unknown),
            "uncounted_ops": list(self.uncounted_ops),
            "nodes": [n.to_dict() for n in self.nodes],
        }


def analyze(
    model: Model,
    target: Target,
    input_shapes: Mapping[str, Sequence[int]],
    allow_tf32: bool = False,
) -> RooflineReport:
    """Roofline of every top-level node at `input_shapes`; see the module doc for the rules.

    `allow_tf32` times fp32 Conv/MatMul/Gemm at the target's tf32 peak (TensorRT's default on
    Ampere and later); off by default, so fp32 means fp32.
    """
    shapes = {k: tuple(int(d) for d in v) for k, v in input_shapes.items()}
    types = concrete_types(model, shapes)
    report = RooflineReport(target, shapes, [])
    uncounted: set[str] = set()
    for i, node in enumerate(model.graph.nodes):
        cost = node_cost(node, types, i)
        if cost is None:
            report.unknown.append(node_label(node, i))
            continue
        if not counted(node.op_type):
            uncounted.add(node.op_type)
        report.nodes.append(place(cost, target, allow_tf32))
    report.uncounted_ops = sorted(uncounted)
    if report.unknown:
        log.info("roofline: %d node(s) of unknown cost", len(report.unknown))
    return report


# -- memory budget ----------------------------------------------------------------------------


def default_workspace(weights_bytes: int, arena_bytes: int) -> int:
    """Kernel scratch estimate: max(64 MiB, 10% of weights + arena) (see module doc)."""
    return max(WORKSPACE_MIN_BYTES, int(WORKSPACE_FRACTION * (weights_bytes + arena_bytes)))


def memory_budget(
    weights_bytes: int, arena_bytes: int, target: Target, workspace_bytes: int | None = None
) -> dict[str, Any]:
    """Whether weights + activation arena + workspace fit the target's memory, and the margin."""
    workspace = (
        default_workspace(weights_bytes, arena_bytes)
        if workspace_bytes is None
        else workspace_bytes
    )
    total = weights_bytes + arena_bytes + workspace
    return {
        "target": target.name,
        "weights_bytes": int(weights_bytes),
        "arena_bytes": int(arena_bytes),
        "workspace_bytes": int(workspace),
        "workspace_rule": "given" if workspace_bytes is not None else "max(64 MiB, 10%)",
        "total_bytes": int(total),
        "memory_bytes": int(target.memory_bytes),
        "fits": total <= target.memory_bytes,
        "headroom_bytes": int(target.memory_bytes - total),
    }


class _Fits:
    """fits(batch) with arena_for's answers cached (each call may run a memory planner)."""

    def __init__(self, arena_for, weights: int, target: Target, workspace: int | None):
        self.arena_for = arena_for
        self.weights = weights
        self.target = target
        self.workspace = workspace
        self.arenas: dict[int, int] = {}

    def arena(self, batch: int) -> int:
        if batch not in self.arenas:
            self.arenas[batch] = int(self.arena_for(batch))
        return self.arenas[batch]

    def __call__(self, batch: int) -> bool:
        return memory_budget(self.weights, self.arena(batch), self.target, self.workspace)["fits"]


def largest_batch(
    arena_for: Callable[[int], int],
    weights_bytes: int,
    target: Target,
    workspace_bytes: int | None = None,
    batch_limit: int = 65536,
) -> int | None:
    """The largest batch <= `batch_limit` whose weights + arena(batch) + workspace fits.

    `arena_for(batch)` is the activation arena at that batch, as the caller's memory plan
    gives it; the answer holds for that plan only. The arena grows about linearly with the
    batch, so the search extrapolates from batches 1 and 2, checks the candidate and its
    neighbour, and widens (doubling) then bisects when the guess was off; with a linear arena
    that is 4 calls. Assumes the arena does not shrink as the batch grows. None when batch 1
    does not fit.
    """
    if batch_limit < 1:
        raise InferccError(f"batch_limit {batch_limit} must be at least 1", "pass batch_limit >= 1")
    fits = _Fits(arena_for, weights_bytes, target, workspace_bytes)
    if not fits(1):
        return None
    if batch_limit == 1:
        return 1
    guess = _extrapolate(fits, batch_limit)
    lo, hi = _bracket(fits, guess, batch_limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    log.debug("largest_batch: %d after %d arena evaluations", lo, len(fits.arenas))
    return lo


def _extrapolate(fits: _Fits, limit: int) -> int:
    """The batch at which the line through arena(1), arena(2) meets the memory left."""
    a1, a2 = fits.arena(1), fits.arena(2)
    slope = a2 - a1
    workspace = fits.workspace
    if workspace is None:
        workspace = default_workspace(fits.weights, a2)
    room = fits.target.memory_bytes - fits.weights - workspace - a1
    if slope <= 0:
        return limit
    return max(1, min(limit, 1 + room // slope))


def _bracket(fits: _Fits, guess: int, limit: int) -> tuple[int, int]:
    """(lo, hi): lo fits, hi does not (hi = limit + 1 when the limit fits), around the guess."""
    if fits(guess):
        lo, step = guess, 1
        while lo < limit:
            probe = min(limit, lo + step)
            if not fits(probe):
                return lo, probe
            lo, step = probe, step * 2
        return limit, limit + 1
    hi, step = guess, 1
    while True:
        probe = max(1, hi - step)
        if fits(probe):
            return probe, hi
        hi, step = probe, step * 2


# -- plot -------------------------------------------------------------------------------------


def plot_roofline(report: RooflineReport, target: Target, path: str | Path) -> Path:
    """Draw every node with FLOPs on the target's roofline (log-log) and save it to `path`.

    x is arithmetic intensity (FLOP/byte), y the FLOP/s a node reaches at its roofline time;
    one roof per precision the nodes ran at, and the five slowest nodes labelled.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InferccError(
            "matplotlib is needed for --plot", 'pip install "infercc[plot]"'
        ) from None
    points = [n for n in report.nodes if n.flops > 0 and math.isfinite(n.intensity)]
    fig = Figure(figsize=(8, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _draw_roofs(ax, target, points)
    _draw_points(ax, points)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s at roofline time")
    bound_ms = report.total_time * 1e3
    ax.set_title(f"{target.name}: {len(points)} nodes with FLOPs, lower bound {bound_ms:.3g} ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    out = check_output_file(path, "--plot")
    make_parents(out)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out


def _draw_roofs(ax: Any, target: Target, points: list[NodeRoofline]) -> None:
    precisions = sorted({n.precision for n in points}) or [FALLBACK_PRECISION]
    xs = [n.intensity for n in points]
    ridges = [target.ridge_point(p) for p in precisions]
    lo = min([*xs, *ridges]) / 10
    hi = max([*xs, *ridges]) * 10
    for p in precisions:
        peak, ridge = target.peak(p), target.ridge_point(p)
        ax.plot([lo, ridge, hi], [lo * target.memory_bandwidth, peak, peak], label=f"{p} roof")


def _draw_points(ax: Any, points: list[NodeRoofline]) -> None:
    for bound, marker in (("compute", "o"), ("memory", "^")):
        sel = [n for n in points if n.bound == bound]
        if sel:
            ax.scatter(
                [n.intensity for n in sel],
                [n.achieved_flops for n in sel],
                s=14,
                marker=marker,
                alpha=0.7,
                label=f"{bound}-bound nodes",
            )
    for rank, n in enumerate(sorted(points, key=lambda x: -x.time)[:5]):
        ax.annotate(  # staggered: the slowest nodes often share a point
            f"{n.name} ({n.op_type})",
            (n.intensity, n.achieved_flops),
            fontsize=7,
            xytext=(4, -10 - 9 * rank),
            textcoords="offset points",
        )
