"""`infercc inspect`: what a model holds, what it costs, and — for a target — what bounds it.

Without a target: inputs, outputs, opsets, op histogram, parameters, and the FLOPs of the
matrix ops (Conv, ConvTranspose, MatMul, Gemm and their fused forms) at a shape profile.
With `target`: the roofline analysis of every node (`infercc.analysis.roofline`), the total roofline
latency, and the memory budget on the target: weights + activation arena (planned by
`infercc.analysis.memory`) + workspace, and the largest batch that fits when the batch is symbolic.

The shape profile: `shapes` pins inputs; other symbolic dimensions take the defaults of
`data.signature.resolve_shapes` (1 for the first axis, 8 for others), the same as validation.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercc.analysis.decoder import decoder_memory
from infercc.analysis.memory import plan_memory
from infercc.analysis.roofline import analyze, largest_batch, memory_budget, node_cost
from infercc.analysis.targets import Target, get_target
from infercc.data.signature import check_shape_names, shape_profile
from infercc.errors import InferccError
from infercc.ir import Model, Value, dtypes, export_model, load_model
from infercc.ir.ops import STANDARD_DOMAINS
from infercc.ir.shapes import concrete_types
from infercc.ir.tensor import external_info

MATRIX_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul")


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list[int | str | None] | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape}


@dataclass
class InspectReport:
    path: str
    size: int
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    nodes: int
    ops: dict[str, int]
    parameters: int
    parameter_bytes: int
    shape_profile: dict[str, list[int]] | None
    flops: int
    flops_by_op: dict[str, int]
    flops_unknown_nodes: list[str]
    target: dict[str, Any] | None = None
    roofline: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "opsets": self.opsets,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "nodes": self.nodes,
            "ops": self.ops,
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "shape_profile": self.shape_profile,
            "flops": self.flops,
            "flops_by_op": self.flops_by_op,
            "flops_unknown_nodes": self.flops_unknown_nodes,
            "target": self.target,
            "roofline": self.roofline,
            "memory": self.memory,
        }


def _info(v: Value) -> TensorInfo:
    return TensorInfo(v.name, dtypes.name(v.dtype), list(v.shape) if v.shape is not None else None)


def inspect_model(
    path: str | os.PathLike[str],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    target: str | None = None,
    plot: str | os.PathLike[str] | None = None,
) -> InspectReport:
    """Describe a model; with a target, add the roofline analysis and the memory budget."""
    model = load_model(Path(path))
    check_shape_names(model, shapes, path)
    tgt = get_target(target) if target is not None else None
    if plot is not None and tgt is None:
        raise InferccError("--plot needs a target", "add --target a100 (see infercc targets)")
    profile = shape_profile(model, shapes)
    types = concrete_types(model, profile) if profile is not None else {}
    flops_by_op, unknown = _matrix_flops(model, types)
    params = [v.const for v in model.graph.initializers.values() if v.const is not None]
    report = InspectReport(
        path=str(path),
        size=model_files_size(Path(path), model),
        ir_version=model.ir_version,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        opsets=dict(model.opset_imports),
        inputs=[_info(v) for v in model.graph.inputs],
        outputs=[_info(v) for v in model.graph.outputs],
        nodes=sum(1 for _ in model.graph.all_nodes()),
        ops=op_histogram(model),
        parameters=sum(t.size for t in params),
        parameter_bytes=sum(t.nbytes for t in params),
        shape_profile={k: list(v) for k, v in profile.items()} if profile is not None else None,
        flops=sum(flops_by_op.values()),
        flops_by_op=flops_by_op,
        flops_unknown_nodes=unknown,
    )
    if tgt is not None and profile is not None:
        _add_target_analysis(report, model, tgt, profile, plot)
    return report


def _matrix_flops(model: Model, types: dict) -> tuple[dict[str, int], list[str]]:
    flops: dict[str, int] = {}
    unknown: list[str] = []
    for i, node in enumerate(model.graph):
        if node.op_type not in MATRIX_OPS:
            continue
        cost = node_cost(node, types, i)
        if cost is None:
            unknown.append(node.name or f"{node.op_type}#{i}")
        else:
            flops[node.op_type] = flops.get(node.op_type, 0) + cost.flops
    return flops, unknown


def _add_target_analysis(
    report: InspectReport,
    model: Model,
    target: Target,
    profile: dict[str, tuple[int, ...]],
    plot: str | os.PathLike[str] | None,
) -> None:
    from infercc.analysis.roofline import plot_roofline

    roof = analyze(model, target, profile)
    plan = plan_memory(model, profile)
    report.target = target.to_dict()
    report.roofline = roof.to_dict()
    report.roofline["top"] = [n.to_dict() for n in roof.top(10)]
    budget = memory_budget(plan.weights_bytes, plan.arena_bytes, target)
    batch_inputs = _symbolic_batch_inputs(model)
    budget["largest_batch"] = (
        largest_batch(
            lambda b: plan_memory(model, _with_batch(profile, batch_inputs, b)).arena_bytes,
            plan.weights_bytes,
            target,
        )
        if batch_inputs
        else None
    )
    budget["batch_inputs"] = batch_inputs
    budget["lower_bound_bytes"] = plan.lower_bound_bytes
    budget["unplanned_tensors"] = len(plan.unknown)
    budget["decoder"] = decoder_memory(model, export_model(model, with_weights=False), target)
    report.memory = budget
    if plot is not None:
        plot_roofline(roof, target, Path(plot))


def _symbolic_batch_inputs(model: Model) -> list[str]:
    """Inputs whose first dimension is symbolic (the batch, by convention)."""
    return [v.name for v in model.graph.inputs if v.shape and not isinstance(v.shape[0], int)]


def _with_batch(
    profile: dict[str, tuple[int, ...]], names: list[str], batch: int
) -> dict[str, tuple[int, ...]]:
    return {k: ((batch, *v[1:]) if k in names and v else v) for k, v in profile.items()}


def op_histogram(model: Model) -> dict[str, int]:
    """Op type -> count over the main graph and its subgraphs (custom domains as domain.Op)."""
    counts = Counter(
        n.op_type if n.domain in STANDARD_DOMAINS else f"{n.domain}.{n.op_type}"
        for n in model.graph.all_nodes()
    )
    return dict(sorted(counts.items()))


def model_files_size(path: Path, model: Model | None = None) -> int:
    """Bytes on disk: the model file plus the external data files it references."""
    size = path.stat().st_size
    if model is None:
        return size
    locations = {
        external_info(v.const.proto).get("location")
        for v in model.graph.initializers.values()
        if v.const is not None and v.const.is_external
    }
    for loc in locations:
        if loc and (path.parent / loc).is_file():
            size += (path.parent / loc).stat().st_size
    return size
