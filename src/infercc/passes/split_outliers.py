"""split-outlier-channels: keep the few huge input channels of a projection in float.

Trained transformers carry a handful of activation channels far larger than the rest (see
`infercc.calib.outliers`, which measures them on the calibration samples): a per-tensor int8
scale set by one of them leaves every other channel a few quantization steps.

So, for a MatMul `X @ W` with a constant float32 weight W [K, N] and an activation X of rank
>= 3 (a transformer's [batch, sequence, K] projections) whose calibrated channel maxima have
outliers, the MatMul is split exactly:

    X @ W  =  (X * m) @ W0  +  X[..., idx] @ W[idx, :]

where `idx` are the outlier channels, `m` is 1 everywhere but 0 there, and W0 is W with the
`idx` rows zeroed (they meet only zeros in X * m). The first MatMul is quantized as usual: its
input's range no longer holds the outliers, and its weight's per-column scales are set by the
channels it computes with; the second (k <= 8 channels) stays float. The cost is a Gather of
k channels, a [..., k] x [k, N] MatMul and an Add per split projection (after its bias Add,
when it has one, so that the int8 MatMul and its bias stay one op: fuse-int8-matmul), and the
Mul by the mask, which quantize-qdq then drops (its Q reads X: the masked channels meet zero
weights whatever they round to). (LLM.int8() decomposes the same way, choosing the channels
per batch at run time; here they are fixed by calibration, so the graph stays static ONNX that
onnxruntime and TensorRT run.) Exact: the mask zeroes exactly the
channels the Gather picks, so the two products add up to X @ W (up to summation order).

The pass reads its option `outlier_channels` (MatMul name -> channels) and splits those MatMuls of
the main graph, one rule (`infercc.passes.rules`) on MatMul: a named MatMul that is no candidate
(`candidates`), or whose channels fall outside its K, is refused with the reason. It runs once per
pipeline (`once`): the split MatMul keeps its name and would be split again. Its details map each
new float MatMul's name to the name of the MatMul it was split from.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
from onnx import TensorProto

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

OUTLIER_CHANNELS: PassOption[Mapping[str, Sequence[int]]] = register_option(
    "outlier_channels", Mapping, "MatMul name -> input channels kept float", factory=dict
)

MIN_K = 64


@register_pass("split-outlier-channels", once=True, reads=("outlier_channels",))
def split_outlier_channels(graph: Graph, ctx: PassContext) -> PassResult:
    """Split a MatMul over the input channels calibration found huge, which stay float."""
    channels = OUTLIER_CHANNELS.read(ctx)
    model = graph.model
    if not channels or model is None or graph is not model.graph:
        return PassResult(changed=False, stats={"split": 0, "channels": 0}, details={})
    missing = sorted(set(channels) - {node.name for node in graph})
    if missing:
        raise InferccError(
            f"outlier channels name MatMul(s) not in the main graph: {', '.join(missing)}",
            "give the names of the MatMul nodes to split",
        )
    splitter = _Splitter(channels)
    rule = Rule("split", ("MatMul",), splitter.check, splitter.rewrite)
    counts = apply_rules(graph, ctx, [rule], subgraphs=False).counts
    made = splitter.made
    stats = {"split": counts["split"], "channels": sum(len(channels[n]) for n in made.values())}
    return PassResult(changed=bool(made), stats=stats, details=made)


def split(model: Model, channels: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """Split each named MatMul over its outlier channels (module docstring), in place: the
    pass alone, through the pass manager. Returns the new float MatMul's name -> the split
    MatMul's name."""
    ctx = PassContext(options={"outlier_channels": dict(channels)})
    report = run_passes(model, ctx, ["split-outlier-channels"])
    return report.details("split-outlier-channels") or {}


def candidates(model: Model) -> dict[str, str]:
    """MatMul node name -> its activation input name, for the MatMuls that may be split."""
    found = {}
    for node in model.graph:
        if node.op_type != "MatMul" or not node.is_standard or not node.name:
            continue
        x = node.input(0)
        if x is not None and _candidate_problem(node) is None:
            found[node.name] = x.name
    return found


def _candidate_problem(node: Node) -> str | None:
    """Why a MatMul cannot be split (None when it can)."""
    x, w = node.input(0), node.input(1)
    if x is None or w is None or const_value(x) is not None:
        return "its input A is not an activation"
    weight = const_value(w)
    if weight is None or weight.dtype != np.float32 or weight.ndim != 2:
        return "its weight is not a constant float32 matrix"
    if x.shape is None or len(x.shape) < 3 or x.dtype != TensorProto.FLOAT:
        return "its input is not a float32 activation of rank >= 3"
    if weight.shape[0] < MIN_K:
        return f"it has fewer than {MIN_K} input channels"
    return None


class _Splitter:
    """The rule's state for one run: the channels to split at, and the float MatMuls made."""

    def __init__(self, channels: Mapping[str, Sequence[int]]):
        self.channels = channels
        self.made: dict[str, str] = {}

    def check(self, node: Node, ctx: PassContext) -> np.ndarray:
        if node.name not in self.channels:
            raise NoMatch()
        problem = _candidate_problem(node)
        weight = const_value(node.input(1))
        if problem is not None or weight is None:
            raise NoMatch(f"outlier channels given, but {problem}")
        idx = np.asarray(sorted(self.channels[node.name]), np.int64)
        k = int(weight.shape[0])
        if idx.size == 0 or idx[0] < 0 or idx[-1] >= k:
            raise NoMatch(f"outlier channels {idx.tolist()} are not channels of its {k} inputs")
        return idx

    def rewrite(self, node: Node, idx: np.ndarray, ctx: PassContext) -> None:
        self.made[_split_one(node.owning_graph().owning_model(), node, idx)] = node.name


def _split_one(model: Model, node: Node, idx: np.ndarray) -> str:
    graph = model.graph
    x, w = node.input(0), node.input(1)
    weight = const_value(w)
    assert x is not None and w is not None and weight is not None
    mask = np.ones(weight.shape[0], np.float32)
    mask[idx] = 0.0
    base = node.name
    mask_c = graph.make_constant(mask, f"{base}_outlier_mask")
    idx_c = graph.make_constant(idx, f"{base}_outlier_channels")
    w_out = graph.make_constant(weight[idx, :].copy(), f"{base}_outlier_weight")
    inliers = weight.copy()
    inliers[idx, :] = 0.0
    w_in = graph.make_constant(inliers, f"{base}_inlier_weight")
    masked = graph.make_node("Mul", [x, mask_c], before=node, name=f"{base}_mask")
    picked = graph.make_node(
        "Gather", [x, idx_c], before=node, name=f"{base}_outlier_gather", attributes={"axis": -1}
    )
    floating = graph.make_node(
        "MatMul", [picked.output, w_out], before=node, name=f"{base}_outliers"
    )
    for made in (masked, picked, floating):
        made.output.dtype = TensorProto.FLOAT
    masked.output.shape = x.shape
    node.set_input(0, masked.output)
    node.set_input(1, w_in)
    if w.const is not None and not w.uses() and not w.is_graph_output:
        if graph.initializers.get(w.name) is w:
            graph.remove_initializer(w)
    # The sum goes after the projection's bias Add when it has one, so that the int8 MatMul
    # and its bias stay next to each other (fuse-int8-matmul makes them one op).
    found = bias_add(node.output)
    after = found[0] if found is not None else node
    out = after.output
    total_out = Value(graph.fresh_name(f"{base}_sum_out"), out.dtype, out.shape)
    total = Node(
        "Add", [out, floating.output], [total_out], name=graph.fresh_node_name(f"{base}_sum")
    )
    graph.insert_after(after, total)
    # Readers and a graph output move to the sum; the sum keeps reading the MatMul (or bias).
    graph.replace_all_uses_with(out, total_out)
    total.set_input(0, out)
    logger.info("%s: %d outlier channel(s) %s stay float", base, idx.size, idx.tolist())
    return floating.name
