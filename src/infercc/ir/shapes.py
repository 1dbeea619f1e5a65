"""Shape and type inference for the IR, through `onnx.shape_inference`.

Inference runs on a skeleton of the model: large weights become typed graph inputs, so no
weight bytes are serialized; small integer constants keep their data so that data propagation
can resolve Reshape targets and Shape arithmetic.

What onnx infers must be what onnxruntime computes, since passes fold shapes and remove
"no-ops" on its word:

- a shape the model declares for a node's output (value_info, graph outputs) is not given to
  inference (onnx keeps a declared shape that contradicts the one it computes); the inferred
  dimensions win, the declared ones only fill in what inference leaves unknown;
- where onnx's inference is known to disagree with onnxruntime, the skeleton's node is first
  rewritten into a form both read alike (`_as_runtime_reads`), and inference runs again:
  Unsqueeze/Squeeze with negative axes before opset 11 (onnxruntime counts them from the
  back; onnx's inference ignores them), Squeeze with an empty axes tensor (onnxruntime
  squeezes every dimension of size 1), and Slice ending at INT32_MAX or INT64_MAX with a
  negative step (onnxruntime reads it as "to the beginning", onnx clamps it to the last
  element).
"""

from __future__ import annotations

import logging
import math
from functools import cached_property
from typing import TYPE_CHECKING

import onnx

from infercc import isolation
from infercc.errors import InferccError
from infercc.ir.exporter import export_model, type_proto_of
from infercc.ir.graph import Model, Value
from infercc.ir.importer import apply_type
from infercc.ir.numpy_ops import MOVES, ProtoAttrs
from infercc.ir.ops import (
    MS_DOMAIN,
    NON_TENSOR_OPS,
    QUANTIZATION_OPS,
    RANDOM_OPS,
    STANDARD_DOMAINS,
)
from infercc.isolation import ChildCrashed, call_forked, call_isolated

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

_KEEP_DATA_ELEMENTS = 64


def _typed_skeleton(model: Model) -> onnx.ModelProto:
    """The model without weight bytes: large initializers become typed graph inputs."""
    skeleton = export_model(model, with_weights=False)
    _forget_declared_shapes(skeleton.graph)
    add_weightless_constants(model, skeleton.graph)
    _standard_stand_ins(skeleton.graph)
    return skeleton


def add_weightless_constants(model: Model, graph: onnx.GraphProto) -> None:
    """Give a weightless skeleton's `graph` the model's constants: small ones (shape targets,
    at most `_KEEP_DATA_ELEMENTS`) as initializers with their data, the others as typed graph
    inputs, so that shape inference sees every constant's type and the small ones' values."""
    for v in model.graph.initializers.values():
        const = v.const
        assert const is not None
        if const.size <= _KEEP_DATA_ELEMENTS and not const.is_external:
            graph.initializer.append(const.to_proto(v.name))
        else:
            vi = graph.input.add(name=v.name)
            vi.type.CopyFrom(type_proto_of(v))


def _standard_stand_ins(graph: onnx.GraphProto) -> None:
    """onnx cannot type onnxruntime's contrib ops; for inference only, use the standard op of
    the same output type and shape (FusedConv is a Conv followed by an elementwise activation).
    """
    for n in graph.node:
        if n.domain == MS_DOMAIN and n.op_type == "FusedConv":
            keep = [a for a in n.attribute if a.name not in ("activation", "activation_params")]
            n.domain, n.op_type = "", "Conv"
            del n.attribute[:]
            n.attribute.extend(keep)
            del n.input[3:]  # FusedConv's optional Z (sum) input has no Conv counterpart


def _infer(skeleton: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnx's inference of the skeleton, in a forked child (`infercc.isolation`): a node that
    crashes onnx's C++ or makes it grow without end is a one-line error naming that node."""
    try:
        data = call_isolated(_infer_bytes, skeleton)
    except ChildCrashed as died:
        raise _crash_error(skeleton, died) from None
    return onnx.ModelProto.FromString(data) if data is not None else None


def _infer_bytes(skeleton: onnx.ModelProto, nodes: int | None = None) -> bytes | None:
    """The inferred model, serialized (what travels back from the child); with `nodes`, of
    the graph cut after its first `nodes` nodes."""
    if nodes is not None:
        cut = onnx.ModelProto()
        cut.CopyFrom(skeleton)
        del cut.graph.node[nodes:]
        del cut.graph.output[:]
        skeleton = cut
    try:
        inferred = onnx.shape_inference.infer_shapes(
            skeleton, check_type=False, strict_mode=False, data_prop=True
        )
    except MemoryError:  # the child's memory cap: a crash, not a custom op
        raise
    except Exception as e:  # inference is best effort: a custom op can stop it
        log.info("shape inference failed: %s", str(e).splitlines()[0] if str(e) else e)
        return None
    return inferred.SerializeToString()


def _crash_error(skeleton: onnx.ModelProto, died: ChildCrashed) -> InferccError:
    index = _crashing_node(skeleton)
    where = ""
    if index is not None:
        node = skeleton.graph.node[index]
        name = f"node {node.name!r}" if node.name else f"the graph's node #{index}"
        where = f"on {name} ({node.op_type})"
    return InferccError(
        f"onnx shape inference {died.describe()} {where}".rstrip(),
        "an attribute or constant input of that node is out of the range onnx handles (a Slice "
        "step of 2**62, say): fix it where the model is exported",
    )


def _crashing_node(skeleton: onnx.ModelProto) -> int | None:
    """The index of the first top-level node whose graph prefix crashes inference (bisection
    over prefix lengths, each probe a child with a quarter of the memory allowance), None if
    no prefix does."""
    nodes = skeleton.graph.node
    low, high = 0, len(nodes)  # prefix `low` is known good; find the smallest crashing one
    if not _prefix_crashes(skeleton, high):
        return None
    while high - low > 1:
        mid = (low + high) // 2
        if _prefix_crashes(skeleton, mid):
            high = mid
        else:
            low = mid
    return high - 1


def _prefix_crashes(skeleton: onnx.ModelProto, count: int) -> bool:
    with isolation.allowance(isolation.memory_allowance() // 4):
        try:
            call_forked(_infer_bytes, skeleton, count)
        except ChildCrashed:
            return True
    return False


def infer_shapes(model: Model) -> None:
    """Fill in dtype and shape of every value that onnx's inference can type."""
    skeleton = _typed_skeleton(model)
    inferred = _infer(skeleton)
    if inferred is None:
        return
    if _as_runtime_reads(skeleton, inferred):
        inferred = _infer(skeleton) or inferred
    for vi in _all_value_infos(inferred.graph):
        value = model.value(vi.name)
        if value is not None and value.const is None:
            _merge(value, vi.type)


def _all_value_infos(graph: onnx.GraphProto):
    yield from graph.value_info
    yield from graph.output
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_value_infos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_value_infos(g)


def _merge(value: Value, type_proto: onnx.TypeProto) -> None:
    before_shape = value.shape
    before_dtype = value.dtype
    apply_type(value, type_proto)
    if before_dtype is not None and value.dtype is None:
        value.dtype = before_dtype
    if before_shape is None or value.shape is None or len(before_shape) != len(value.shape):
        if value.shape is None:
            value.shape = before_shape
        return
    value.shape = tuple(_better(a, b) for a, b in zip(before_shape, value.shape, strict=True))


def _better(old, new):
    """Inference's dimension, unless it knows less than the one before."""
    if isinstance(new, int):
        return new
    if isinstance(old, int):
        return old
    return old if old is not None else new


# -- declared shapes: hints, never trusted over inference ------------------------------------


def _forget_declared_shapes(graph: onnx.GraphProto) -> None:
    """Drop the declared shapes of standard nodes' outputs from the skeleton (recursively),
    keeping their element types: inference computes those shapes itself. Outputs of other
    domains keep theirs (inference cannot compute them). A negative dim_value is unknown."""
    standard = {o for n in graph.node if n.domain in STANDARD_DOMAINS for o in n.output if o}
    for vi in [*graph.value_info, *graph.output]:
        if vi.name in standard and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_value") and d.dim_value < 0:
                    d.Clear()  # a dynamic axis (Paddle, TensorFlow): unknown, not -1
    for n in graph.node:
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                _forget_declared_shapes(g)


# -- where onnx's inference reads a node unlike onnxruntime -----------------------------------

_INT_MAX_ENDS = (2**31 - 1, 2**63 - 1)


def _as_runtime_reads(skeleton: onnx.ModelProto, inferred: onnx.ModelProto) -> bool:
    """Rewrite the skeleton's nodes that onnx's inference reads unlike onnxruntime (module
    docstring) into forms both read alike; True when one was rewritten."""
    from onnx import numpy_helper

    opset = _standard_opset(skeleton)
    fixer = _Fixer(skeleton.graph, opset, inferred, numpy_helper)
    for graph in _graphs(skeleton.graph):
        for node in graph.node:
            if node.domain in STANDARD_DOMAINS:
                fixer.fix(node)
    return fixer.changed


def _standard_opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in STANDARD_DOMAINS:
            return int(op.version)
    return int(onnx.defs.onnx_opset_version())


def _graphs(graph: onnx.GraphProto):
    yield graph
    for n in graph.node:
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                yield from _graphs(g)


def _ranks(inferred: onnx.ModelProto) -> dict[str, tuple]:
    """Name -> inferred dims (ints, or None where unknown) of every typed value."""
    out: dict[str, tuple] = {}
    for vi in [*_all_value_infos(inferred.graph), *inferred.graph.input]:
        t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if t is not None and t.HasField("shape"):
            dims = t.shape.dim
            out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    for t in inferred.graph.initializer:
        out[t.name] = tuple(t.dims)
    return out


def _small_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray | list[int]]:
    from onnx import numpy_helper

    out: dict[str, np.ndarray | list[int]] = {}
    for g in _graphs(graph):
        for t in g.initializer:
            out[t.name] = numpy_helper.to_array(t)
        for n in g.node:
            if n.op_type == "Constant" and n.domain in STANDARD_DOMAINS and n.attribute:
                a = n.attribute[0]
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    out[n.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_ints":
                    out[n.output[0]] = list(a.ints)
    return out


class _Fixer:
    """The rewrites; the inferred dims and the small constants they read are gathered on first
    use (most models have no node to fix, and gathering them walks the whole model)."""

    def __init__(self, main: onnx.GraphProto, opset: int, inferred: onnx.ModelProto, nh):
        self.main, self.opset, self.inferred, self.nh = main, opset, inferred, nh
        self.changed = False

    @cached_property
    def ranks(self) -> dict[str, tuple]:
        return _ranks(self.inferred)

    @cached_property
    def consts(self) -> dict[str, np.ndarray | list[int]]:
        return _small_constants(self.main)

    def fix(self, node: onnx.NodeProto) -> None:
        if node.op_type in ("Unsqueeze", "Squeeze") and self.opset < 11:
            self._negative_axes(node)
        elif node.op_type == "Squeeze" and self.opset >= 13 and len(node.input) > 1:
            self._empty_axes(node)
        elif node.op_type == "Slice" and self.opset >= 10 and len(node.input) > 4:
            self._int_max_ends(node)

    def _negative_axes(self, node: onnx.NodeProto) -> None:
        attr = next((a for a in node.attribute if a.name == "axes"), None)
        if attr is None or all(a >= 0 for a in attr.ints):
            return
        dims = self.ranks.get(node.input[0])
        if dims is None:
            return
        rank = len(dims) + (len(attr.ints) if node.op_type == "Unsqueeze" else 0)
        axes = [a + rank if a < 0 else a for a in attr.ints]
        del attr.ints[:]
        attr.ints.extend(axes)
        self.changed = True

    def _empty_axes(self, node: onnx.NodeProto) -> None:
        axes = self.consts.get(node.input[1])
        if axes is None or len(axes) != 0:
            return
        dims = self.ranks.get(node.input[0])
        if dims is not None and all(isinstance(d, int) and d > 0 for d in dims):
            ones = [i for i, d in enumerate(dims) if d == 1]
            node.input[1] = self._constant(ones, "squeeze_axes")
        else:  # which dimensions are 1 is not known: the output's shape is not either
            node.input[1] = self._unknown_ints("squeeze_axes")
        self.changed = True

    def _int_max_ends(self, node: onnx.NodeProto) -> None:
        ends, steps = self.consts.get(node.input[2]), self.consts.get(node.input[4])
        if ends is None or steps is None or len(ends) != len(steps):
            return
        ends = [int(e) for e in ends]
        fixed = [
            -(2**63) if int(s) < 0 and e in _INT_MAX_ENDS else e
            for e, s in zip(ends, steps, strict=True)
        ]
        if fixed != ends:
            node.input[2] = self._constant(fixed, "slice_ends")
            self.changed = True

    def _constant(self, values: list[int], base: str) -> str:
        import numpy as np

        name = f"__infercc_{base}_{len(self.main.initializer)}"
        self.main.initializer.append(self.nh.from_array(np.array(values, np.int64), name))
        return name

    def _unknown_ints(self, base: str) -> str:
        name = f"__infercc_{base}_{len(self.main.input)}"
        vi = self.main.input.add(name=name)
        vi.type.tensor_type.elem_type = onnx.TensorProto.INT64
        vi.type.tensor_type.shape.dim.add()
        return name


def concrete_types(
    model: Model, input_shapes: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int | None, tuple[int | str | None, ...] | None]]:
    """Value name -> (dtype, shape) with the graph inputs pinned to `input_shapes`.

    The IR is not modified (its inputs keep their symbolic dimensions). Inference runs on a
    weightless skeleton whose inputs carry the concrete shapes; where onnx's data propagation
    stops (Shape -> Slice -> Range chains, say), the small integer tensors that compute shapes
    are evaluated with `onnx.reference` and put back as constants of the same name, and
    inference runs again, until nothing more resolves.
    """
    skeleton = _typed_skeleton(model)
    for vi in skeleton.graph.input:
        dims = input_shapes.get(vi.name)
        if dims is not None and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.shape.Clear()
            for d in dims:
                vi.type.tensor_type.shape.dim.add().dim_value = int(d)
    types: dict[str, tuple[int | None, tuple[int | str | None, ...] | None]] = {}
    for node in model.graph.all_nodes():
        for v in node.outputs:
            if v is not None:
                types[v.name] = (v.dtype, v.shape)
    for v in [*model.graph.inputs, *model.graph.initializers.values()]:
        types[v.name] = (v.dtype, v.shape)
    for _ in range(16):
        inferred = _infer(skeleton)
        if inferred is None:
            break
        if _as_runtime_reads(skeleton, inferred):
            inferred = _infer(skeleton) or inferred
        _collect(inferred, types)
        if all(_static(shape) for _, shape in types.values()):
            break  # inference sized everything: nothing left for the evaluator to resolve
        if not _evaluate_shape_tensors(skeleton, types):
            break
    symbols = _bindings(model, input_shapes)
    for name, (dtype, shape) in types.items():
        if shape is not None and not _static(shape):
            types[name] = (
                dtype,
                tuple(symbols.get(d, d) if isinstance(d, str) else d for d in shape),
            )
    return types


def _bindings(model: Model, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Symbolic dimension name -> the value the pinned input shapes give it."""
    out: dict[str, int] = {}
    for v in model.graph.inputs:
        for d, n in zip(v.shape or (), input_shapes.get(v.name, ()), strict=False):
            if isinstance(d, str):
                out.setdefault(d, int(n))
    return out


def _collect(inferred: onnx.ModelProto, types: dict) -> None:
    infos = [*_all_value_infos(inferred.graph), *inferred.graph.input]
    for vi in infos:
        if vi.name in types and vi.type.HasField("tensor_type"):
            probe = Value(vi.name, *types[vi.name])
            probe.shape = None
            apply_type(probe, vi.type)
            if probe.shape is not None and not (
                _static(types[vi.name][1]) and not _static(probe.shape)
            ):  # a later round never unlearns a size an earlier one found
                types[vi.name] = (probe.dtype or types[vi.name][0], probe.shape)
    for t in inferred.graph.initializer:
        types[t.name] = (t.data_type, tuple(t.dims))


_SHAPE_TENSOR_LIMIT = 1024  # elements: shape arithmetic, never activations


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _evaluate_shape_tensors(skeleton: onnx.ModelProto, types: dict) -> bool:
    """Replace Shape/Size of static values, and small int nodes of known inputs, by constants."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = skeleton.graph
    data = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    keep, changed = [], False
    for node in g.node:
        arrays = _shape_node_value(node, types, data)
        if arrays is None and _evaluable(node, types, data):
            arrays = _integer_value(node, data, _standard_opset(skeleton))
        if arrays is None and _evaluable(node, types, data):
            try:
                one = onnx.helper.make_model(
                    onnx.helper.make_graph([node], "eval", [], []),
                    opset_imports=skeleton.opset_import,
                )
                arrays = ReferenceEvaluator(one).run(
                    list(node.output), {x: data[x] for x in node.input if x}
                )
            except Exception:
                arrays = None
        if arrays is None:
            keep.append(node)
            continue
        changed = True
        if any(not hasattr(a, "shape") for a in arrays):  # a sequence or optional
            keep.append(node)
            continue
        for name, arr in zip(node.output, arrays, strict=False):
            if name:
                data[name] = arr
                g.initializer.append(numpy_helper.from_array(arr, name))
    if changed:
        del g.node[:]
        g.node.extend(keep)
    return changed


def _shape_node_value(node: onnx.NodeProto, types: dict, data: dict):
    import numpy as np

    if node.domain not in STANDARD_DOMAINS or node.op_type not in ("Shape", "Size"):
        return None
    shape = types.get(node.input[0], (None, None))[1]
    if not _static(shape):
        return None
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape)), np.int64)]
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    return [np.array(shape[slice(start, end)], np.int64)]


_SHARED_MOVES = ("Add", "Sub", "Mul", "Unsqueeze", "Squeeze", "Concat", "Gather")


def _integer_value(node: onnx.NodeProto, data: dict, opset: int) -> list | None:
    """Integer shape tensors numpy computes exactly as onnxruntime does: fold-constants' data
    movement and wrapping arithmetic (`infercc.ir.numpy_ops.MOVES`) for Add, Sub, Mul,
    Unsqueeze, Squeeze, Concat and Gather, and here Range, Squeeze without axes (onnxruntime
    drops every dimension of 1) and Cast between integers. Spares loading onnx.reference for
    them; None otherwise."""
    import numpy as np

    given = [data[x] if x else None for x in node.input]
    ins = [a for a in given if a is not None]
    if not given or len(ins) != len(given) or any(a.dtype.kind not in "iu" for a in ins):
        return None
    attrs = ProtoAttrs(node)
    op = node.op_type
    if op == "Range" and len(ins) == 3 and all(a.ndim == 0 for a in ins) and ins[2] != 0:
        return [np.arange(ins[0], ins[1], ins[2], dtype=ins[0].dtype)]
    if op == "Squeeze":
        axes = ins[1] if opset >= 13 and len(ins) > 1 else attrs.attr("axes")
        if axes is None or len(axes) == 0:  # none, or an empty tensor
            return [np.squeeze(ins[0], axis=tuple(i for i, d in enumerate(ins[0].shape) if d == 1))]
    if op in _SHARED_MOVES:
        try:
            out = MOVES[op](attrs, ins, opset)
        except (ValueError, IndexError, TypeError):  # out-of-range axes or indices
            return None
        return None if out is None else [out]
    if op == "Cast" and len(ins) == 1:
        to = onnx.helper.tensor_dtype_to_np_dtype(int(attrs.attr("to", 0)))
        if np.dtype(to).kind in "iu" and np.can_cast(ins[0].dtype, to, "safe"):
            return [ins[0].astype(to)]
    return None


def _evaluable(node: onnx.NodeProto, types: dict, data: dict) -> bool:
    if (
        node.domain not in STANDARD_DOMAINS
        or node.attribute
        and any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        )
    ):
        return False
    if not all(x in data for x in node.input if x):
        return False
    if any(data[x].size > _SHAPE_TENSOR_LIMIT for x in node.input if x):
        return False
    for out in node.output:
        dtype, shape = types.get(out, (None, None))
        if _static(shape) and int(math.prod(shape)) > _SHAPE_TENSOR_LIMIT:
            return False
    if node.op_type in _NO_EVAL:
        return False
    size = _generated_size(node, data)
    return size is None or size <= _SHAPE_TENSOR_LIMIT


def _generated_size(node: onnx.NodeProto, data: dict) -> int | None:
    """Output elements of the ops whose output can dwarf their inputs (else None)."""
    import numpy as np

    ins = [data[x] if x else None for x in node.input]

    def arg(i: int) -> np.ndarray:
        found = ins[i]
        if found is None:
            raise TypeError(f"input {i} is omitted")
        return found

    try:
        if node.op_type == "ConstantOfShape":
            return int(np.prod(arg(0)))
        if node.op_type == "Expand":
            return int(np.prod(np.broadcast_shapes(arg(0).shape, tuple(int(d) for d in arg(1)))))
        if node.op_type == "Tile":
            return int(np.prod(np.array(arg(0).shape) * arg(1)))
        if node.op_type == "Range":
            return int(np.ceil((arg(1) - arg(0)) / arg(2)))
    except (ValueError, TypeError, ZeroDivisionError):
        return _SHAPE_TENSOR_LIMIT + 1
    return None


_NO_EVAL = RANDOM_OPS | QUANTIZATION_OPS | NON_TENSOR_OPS
