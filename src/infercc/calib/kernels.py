"""Do onnxruntime's int8 kernels compute what each quantized node's Q/DQ graph means?

onnxruntime's CPU provider fuses DequantizeLinear -> Conv / MatMul / Gemm -> QuantizeLinear into
integer kernels (QLinearConv, QGemm, QLinearMatMul, MatMulIntegerToFloat). A fused kernel must
compute what the unfused graph computes in float, up to rounding: the Q/DQ graph is the
meaning of the int8 model. Some releases do not. On CPUs with AMX-INT8, onnxruntime 1.21 to
1.24 give wrong uint8 x int8 products once a GEMM has 32 rows or more and some output-channel
counts (onnxruntime#26324; fixed in 1.25): the first Conv of shufflenet (3 -> 24 channels)
came out up to 195 steps off on 1% of its outputs, and the int8 model's cosine against fp32
fell from 0.98 to 0.34. onnxruntime 1.23 is the newest there is for Python 3.10, and int8
activations do not avoid it (onnxruntime turns them into uint8 before fusing Conv).

`broken_kernels(model_path, sample, nodes)` cuts each quantized node out of the QDQ model with its
Q/DQ pairs, runs it on its real input values with onnxruntime's graph optimizations on (the
fused kernel) and off (the Q/DQ graph in float), and returns the nodes whose results differ by
more than rounding, each with the reason. `calibrate` keeps those nodes float, so the int8 model
it writes computes what it claims on the onnxruntime it ran on. Which int8 form a target gets,
so that its kernels are exact by design (7-bit weights where u8 x s8 pairs are summed in int16
with saturation), is `infercc.calib.forms`; this check catches what no form avoids (a kernel
bug) on the host, which is why it runs only when the host is the target.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike, fspath

import numpy as np
import onnx
import onnxruntime as ort

from infercc.calib.observers import tensor_values
from infercc.util import first_line

logger = logging.getLogger(__name__)

DEFAULT_CAUSE = "kept in float, so the model computes what its Q/DQ graph means"
MAX_STEPS = 1  # a fused kernel may round an integer output one step differently
MAX_FLOAT_ERROR = 0.01  # of the largest output magnitude, for float outputs (MatMulIntegerToFloat)
_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


@dataclass
class NodeModel:
    """One quantized node cut out of a QDQ model: the model and the float inputs it reads."""

    node: str
    model: onnx.ModelProto
    inputs: list[str]


def broken_kernels(
    model_path: str | PathLike[str],
    sample: Mapping[str, np.ndarray],
    nodes: Sequence[str],
    cause: str | None = None,
) -> dict[str, str]:
    """Node name -> why its fused int8 kernel is wrong here, for those of the `nodes` of the
    QDQ model at `model_path` whose kernel disagrees with their Q/DQ graph on the values they
    read when the model runs on `sample`. `cause` (`infercc.calib.forms.kernel_cause`) is the
    known cause on this host and the remedy, said after the measured difference."""
    model = onnx.load(fspath(model_path))
    producer = {out: n for n in model.graph.node for out in n.output if out}
    by_name = {n.name: n for n in model.graph.node if n.name}
    wanted = [by_name[name] for name in nodes if name in by_name]
    names = sorted({name for node in wanted for name in _input_side(node, producer)[1]})
    # Graph inputs come from the sample itself (onnxruntime 1.23 hands back a graph input
    # asked for as an output without copying it).
    values = {name: np.asarray(sample[name]) for name in names if name in sample}
    inner = [name for name in names if name not in values]
    if inner:
        values.update(next(tensor_values(model_path, [sample], inner)))
    cuts = node_models(model, nodes, {name: value.shape for name, value in values.items()})
    broken = {}
    for cut in cuts:
        reason = compare_kernel(cut.model, {name: values[name] for name in cut.inputs})
        if reason is not None:
            op = next(n.op_type for n in cut.model.graph.node if n.name == cut.node)
            broken[cut.node] = (
                f"onnxruntime {ort.__version__}'s int8 kernel for this {op} is wrong on this "
                f"CPU ({reason} against its Q/DQ graph); {cause or DEFAULT_CAUSE}"
            )
            logger.info("%s: %s", cut.node, broken[cut.node])  # the report lists it
    return broken


def node_models(
    model: onnx.ModelProto,
    nodes: Sequence[str],
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[NodeModel]:
    """Each named node with the Q/DQ pairs around it, as a model of its own (whose float
    inputs have the `shapes` given, unknown dims otherwise)."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output if out}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    by_name = {n.name: n for n in graph.node if n.name}
    order = {id(n): i for i, n in enumerate(graph.node)}
    cuts = []
    for name in nodes:
        node = by_name.get(name)
        if node is not None:
            parts, inputs, output = _cut(model, node, producer, readers)
            parts.sort(key=lambda n: order[id(n)])
            cut = _node_model(model, parts, inputs, output, shapes or {})
            cuts.append(NodeModel(name, cut, inputs))
    return cuts


def _cut(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    producer: Mapping[str, onnx.NodeProto],
    readers: Mapping[str, list[onnx.NodeProto]],
) -> tuple[list[onnx.NodeProto], list[str], str]:
    """The nodes of the cut, the float tensors it takes and the tensor it gives."""
    parts, inputs = _input_side(node, producer)
    parts.append(node)
    output = node.output[0]
    for via in ("Relu", _Q):  # quantize-qdq puts a uint8 output pair after a sole Relu
        after = readers.get(output, [])
        if len(after) != 1 or after[0].op_type != via or output in _graph_outputs(model):
            continue
        parts.append(after[0])
        output = after[0].output[0]
    if parts[-1].op_type != _Q and parts[-1] is not node:  # a Relu with no Q after it
        parts.pop()
        output = node.output[0]
    return parts, inputs, output


def _input_side(
    node: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto]
) -> tuple[list[onnx.NodeProto], list[str]]:
    """The DQ (and Q) nodes feeding `node`, and the float tensors the cut model takes."""
    parts: list[onnx.NodeProto] = []
    inputs: list[str] = []
    for name in node.input:
        dq = producer.get(name)
        if dq is None or dq.op_type != _DQ:
            if dq is not None:  # a float input made by another node: the cut takes it as is
                inputs.append(name)
            continue
        parts.append(dq)
        q = producer.get(dq.input[0])
        if q is not None and q.op_type == _Q:
            parts.append(q)
            inputs.append(q.input[0])
    return _unique(parts), list(dict.fromkeys(inputs))


def _unique(parts: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    seen: dict[int, onnx.NodeProto] = {}
    for n in parts:
        seen.setdefault(id(n), n)
    return list(seen.values())


def _graph_outputs(model: onnx.ModelProto) -> set[str]:
    return {o.name for o in model.graph.output}


def _node_model(
    model: onnx.ModelProto,
    parts: list[onnx.NodeProto],
    inputs: list[str],
    output: str,
    shapes: Mapping[str, Sequence[int]],
) -> onnx.ModelProto:
    made = {out for n in parts for out in n.output}
    read = {name for n in parts for name in n.input if name and name not in made}
    inits = [t for t in model.graph.initializer if t.name in read and t.name not in inputs]
    graph = onnx.helper.make_graph(
        parts,
        "kernel_check",
        [_float_input(name, shapes.get(name)) for name in inputs],
        [onnx.helper.make_tensor_value_info(output, _output_type(parts[-1], inits), None)],
        initializer=inits,
    )
    cut = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    cut.ir_version = model.ir_version
    return cut


def _output_type(last: onnx.NodeProto, inits: list[onnx.TensorProto]) -> int:
    """A QuantizeLinear's output has its zero point's type (uint8 without one); the node's
    own output is float."""
    if last.op_type != _Q:
        return onnx.TensorProto.FLOAT
    zero_points = [t for t in inits if len(last.input) > 2 and t.name == last.input[2]]
    return zero_points[0].data_type if zero_points else onnx.TensorProto.UINT8


def _float_input(name: str, shape: Sequence[int] | None) -> onnx.ValueInfoProto:
    dims = None if shape is None else list(shape)
    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)


def compare_kernel(cut: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> str | None:
    """How far the fused kernel is from the Q/DQ graph, when beyond rounding; else None."""
    data = cut.SerializeToString()
    try:
        fused = _run(data, feeds, optimize=True)
        graph = _run(data, feeds, optimize=False)
    except Exception as exc:  # onnxruntime raises its own exception types
        logger.info("kernel check skipped: %s", first_line(exc))
        return None
    return _difference(fused, graph)


def _run(data: bytes, feeds: Mapping[str, np.ndarray], optimize: bool) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 4
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))[0]


def _difference(fused: np.ndarray, graph: np.ndarray) -> str | None:
    if fused.shape != graph.shape:
        return f"shape {list(fused.shape)} instead of {list(graph.shape)}"
    if graph.dtype.kind in "iu":
        steps = np.abs(fused.astype(np.int64) - graph.astype(np.int64))
        if steps.size and steps.max() > MAX_STEPS:
            share = float(np.mean(steps > MAX_STEPS))
            return f"up to {int(steps.max())} steps off on {share:.1%} of its outputs"
        return None
    diff = np.abs(fused.astype(np.float64) - graph.astype(np.float64))
    scale = float(np.abs(graph).max()) if graph.size else 0.0
    if diff.size and diff.max() > MAX_FLOAT_ERROR * max(scale, 1e-12):
        return f"max error {float(diff.max()):.3g} where its outputs reach {scale:.3g}"
    return None
