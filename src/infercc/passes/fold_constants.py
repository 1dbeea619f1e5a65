"""fold-constants: replace what can be computed ahead of time by its value.

Rewrites, in every graph and subgraph, walking nodes in topological order:

- a Constant node (value, value_float(s), value_int(s), value_string(s)) becomes an initializer
  with the same name; a sparse_value Constant stays a node;
- Shape / Size of a value whose (selected) dimensions are all known integers becomes an int64
  constant; a symbolic or unknown dimension is never baked in;
- a standard-domain node whose inputs are all constants (omitted optional inputs allowed) is
  evaluated with `onnx.reference` (a numpy path for a few cheap ops gives the same results) and
  its outputs become initializers, cast to the dtype ONNX declares for them;
- an If with a constant condition is replaced by the nodes of the branch it takes.

Exact because ONNX operators are pure functions of their inputs: a node whose inputs are known
computes the same value at every run, so the value can stand for the node. Shape and Size read
only the shape, which is fixed when every dimension is an integer. An If whose condition is a
constant always runs the same branch, and the branch's nodes already read outer-scope values
directly. Never folded: quantization nodes (the backend needs them), random ops and Dropout in
training mode with a non-zero ratio (folding would freeze one sample), nodes of other domains,
Loop/Scan and other subgraph-holding nodes, and any result over `ctx.fold_limit` bytes (checked
before evaluating where the size is predictable). Ops that onnx defines by a function of the
input types (GroupNormalization, ...) are evaluated with typed inputs.
Graph outputs keep their names; no existing initializer is modified.

One rule (`infercc.passes.rules`) on every op: its check computes the value (or the branch
an If takes) and says why a node does not fold; for bisection one rewrite is one node replaced
by its value (a Constant, a Shape/Size, an evaluated node) or one If inlined.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from infercc.ir.graph import Graph, Model, Node, Value
from infercc.ir.ops import QUANTIZATION_OPS, RANDOM_OPS, STANDARD_DOMAINS
from infercc.ir.tensor import Tensor
from infercc.passes.manager import PassContext, PassResult, register_pass
from infercc.passes.match import constant_node_tensor, default_opset, is_live
from infercc.passes.rules import Refuse, Rule, apply_rules

log = logging.getLogger(__name__)

NEVER_FOLD = {
    **dict.fromkeys(QUANTIZATION_OPS, "quantization node: kept for the backend"),
    **dict.fromkeys(RANDOM_OPS, "random op: folding would freeze one sample"),
}


class _Refuse(Exception):
    """A node cannot be folded; the message is the reason."""


@register_pass("fold-constants")
def fold_constants(graph: Graph, ctx: PassContext) -> PassResult:
    """Turn Constant nodes into initializers and evaluate what depends only on constants."""
    model = graph.model
    assert model is not None
    folder = _Folder(default_opset(model))
    run = apply_rules(graph, ctx, [Rule("folded", None, folder.check, _rewrite, False)])
    stats = {**dict.fromkeys(_KINDS, 0), **run.counts, "refused": len(run.refused)}
    return PassResult(changed=any(stats[k] for k in _KINDS), stats=stats)


_KINDS = ("constants", "folded", "shapes", "ifs")


@dataclass(frozen=True)
class _Values:
    """The node's outputs are these constants (None for an output nobody reads)."""

    key: str
    tensors: list[Tensor | None]


@dataclass(frozen=True)
class _Branch:
    """The If always takes this branch (True: then_branch)."""

    then: bool
    key: str = "ifs"


class _Folder:
    """The check of fold-constants: what a live node folds to, or why it does not."""

    def __init__(self, opset: int):
        self.opset = opset

    def check(self, node: Node, ctx: PassContext) -> _Values | _Branch | Refuse | None:
        if not is_live(node):
            return None
        try:
            return self._fold(node, ctx.fold_limit)
        except _Refuse as e:
            return Refuse(str(e))

    def _fold(self, node: Node, limit: int) -> _Values | _Branch | None:
        if node.domain not in STANDARD_DOMAINS:
            if _all_inputs_constant(node):
                raise _Refuse(f"domain {node.domain!r} is not evaluated")
            return None
        if node.op_type == "Constant":
            return _Values("constants", [_constant_tensor(node)])
        if node.op_type in ("Shape", "Size") and _shape_known(node):
            return _Values("shapes", [Tensor(_shape_value(node))])
        if not _all_inputs_constant(node):
            return None
        if node.op_type == "If":
            return _Branch(_if_taken(node))
        return _Values("folded", self.evaluate(node, limit))

    def evaluate(self, node: Node, limit: int) -> list[Tensor | None]:
        _check_foldable(node, self.opset)
        predicted = _predicted_nbytes(node)
        if predicted is not None and predicted > limit:
            raise _Refuse(f"result would be {predicted} bytes, over the fold limit of {limit}")
        arrays = _evaluate(node, self.opset)
        size = sum(a.nbytes for a in arrays)
        if size > limit:
            raise _Refuse(f"result is {size} bytes, over the fold limit of {limit}")
        return [_conform(a, v) if v is not None else None for a, v in _pair(node, arrays)]


def _rewrite(node: Node, found: _Values | _Branch, ctx: PassContext) -> list[Node] | None:
    """Replace the node by its values, or inline the branch an If takes (whose moved nodes
    are visited next)."""
    graph = node.graph
    assert graph is not None
    if isinstance(found, _Branch):
        return _inline_if(graph, node, found.then)
    _substitute(graph, node, found.tensors)
    return None


# -- conditions --------------------------------------------------------------------------------


def _all_inputs_constant(node: Node) -> bool:
    return all(v.const is not None for v in node.inputs if v is not None)


def _check_foldable(node: Node, opset: int) -> None:
    reason = NEVER_FOLD.get(node.op_type)
    if reason is not None:
        raise _Refuse(reason)
    if node.op_type == "Dropout" and _dropout_draws(node, opset):
        raise _Refuse("Dropout in training mode is random: folding would freeze one sample")
    if node.subgraphs():
        raise _Refuse("control flow with subgraphs is not evaluated")


def _dropout_draws(node: Node, opset: int) -> bool:
    """True when a Dropout (all inputs constant) draws a random mask: training mode, ratio > 0."""
    if opset < 7:
        return node.attr("is_test", 0) != 1 and node.attr("ratio", 0.5) != 0
    mode, ratio = node.input(2), node.input(1)
    if mode is None or not bool(np.asarray(mode.numpy()).reshape(-1)[0]):
        return False
    return ratio is None or float(np.asarray(ratio.numpy()).reshape(-1)[0]) != 0.0


def _shape_known(node: Node) -> bool:
    v = node.input(0)
    if v is None or v.shape is None:
        return False
    return all(isinstance(d, int) for d in _selected_dims(node, v.shape))


def _selected_dims(node: Node, shape: tuple) -> tuple:
    if node.op_type == "Size":
        return shape
    start, end = node.attr("start", 0), node.attr("end")
    return shape[start:end]  # ONNX clamps start/end like Python slicing does


def _shape_value(node: Node) -> np.ndarray:
    dims = _selected_dims(node, node.input(0).shape)  # type: ignore[union-attr]
    if node.op_type == "Size":
        return np.array(math.prod(dims), dtype=np.int64)
    return np.array(dims, dtype=np.int64)


# -- sizes -------------------------------------------------------------------------------------


def _predicted_nbytes(node: Node) -> int | None:
    """Bytes the outputs will take, when their shapes are known before evaluating."""
    total = 0
    for i, v in enumerate(node.outputs):
        if v is None:
            continue
        shape = v.static_shape
        if shape is None and i == 0:
            shape = _shape_from_inputs(node)
        if shape is None:
            return None
        total += math.prod(shape) * _itemsize(v.dtype or _guess_dtype(node))
    return total


def _shape_from_inputs(node: Node) -> tuple[int, ...] | None:
    rule = _SHAPE_RULES.get(node.op_type)
    if rule is None:
        return None
    try:
        return tuple(int(d) for d in rule([_array(v) for v in node.inputs]))
    except Exception:  # a malformed node: evaluation will say why
        return None


def _range_length(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> tuple[int]:
    return (max(math.ceil((float(limit) - float(start)) / float(delta)), 0),)


_SHAPE_RULES: dict[str, Callable[[list], tuple]] = {
    "ConstantOfShape": lambda a: tuple(a[0].reshape(-1)),
    "Expand": lambda a: np.broadcast_shapes(a[0].shape, tuple(a[1].reshape(-1))),
    "Tile": lambda a: tuple(s * r for s, r in zip(a[0].shape, a[1].reshape(-1), strict=True)),
    "Range": lambda a: _range_length(*a[:3]),
}


def _guess_dtype(node: Node) -> int:
    if node.op_type == "ConstantOfShape":
        value = node.attr("value")
        return onnx.helper.np_dtype_to_tensor_dtype(value.dtype) if value is not None else 1
    first = node.input(0)
    return first.dtype if first is not None and first.dtype else TensorProto.DOUBLE


def _itemsize(dtype: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    except Exception:  # an ONNX type numpy does not know: assume the widest
        return 8


# -- evaluation --------------------------------------------------------------------------------


def _array(v: Value | None) -> np.ndarray | None:
    return None if v is None else np.asarray(v.numpy())


def _evaluate(node: Node, opset: int) -> list[np.ndarray]:
    """The node's present outputs, in order."""
    fast = _FAST.get(node.op_type)
    inputs = [_array(v) for v in node.inputs]
    if fast is not None:
        try:
            out = fast(node, inputs, opset)
        except Exception as e:
            raise _Refuse(f"evaluation failed: {type(e).__name__}: {_first_line(e)}") from None
        if out is not None:
            return [np.asarray(out)]
    return _reference(node, inputs, opset)


def _reference(node: Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Evaluate a one-node model with onnx.reference."""
    names, feeds = _feed_names(node, inputs)
    outs = [f"out{i}" if v is not None else "" for i, v in enumerate(node.outputs)]
    proto = onnx.helper.make_node(node.op_type, names, outs)
    proto.attribute.extend(node.attributes.values())
    graph = onnx.helper.make_graph(
        [proto],
        "fold",
        [_typed_input(n, v) for n, v in zip(feeds, _distinct(node), strict=True)],
        [onnx.ValueInfoProto(name=o) for o in outs if o],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        results = ReferenceEvaluator(model).run(None, feeds)
    except Exception as e:
        raise _Refuse(f"evaluation failed: {type(e).__name__}: {_first_line(e)}") from None
    return [np.asarray(r) for r in results]


def _distinct(node: Node) -> list[Value]:
    """The node's present inputs, each value once, in first-use order (as `_feed_names`)."""
    seen: dict[int, Value] = {}
    for v in node.inputs:
        if v is not None:
            seen.setdefault(id(v), v)
    return list(seen.values())


def _typed_input(name: str, v: Value) -> onnx.ValueInfoProto:
    """A graph input with its element type: ops defined by a context-dependent function
    (GroupNormalization, ...) build their body from the input types."""
    return onnx.helper.make_tensor_value_info(name, v.dtype or 0, None)


def _feed_names(
    node: Node, inputs: list[np.ndarray | None]
) -> tuple[list[str], dict[str, np.ndarray]]:
    names: list[str] = []
    feeds: dict[str, np.ndarray] = {}
    seen: dict[int, str] = {}
    for v, arr in zip(node.inputs, inputs, strict=True):
        if v is None or arr is None:
            names.append("")
            continue
        name = seen.setdefault(id(v), f"in{len(seen)}")
        feeds[name] = arr
        names.append(name)
    return names, feeds


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def _pair(node: Node, arrays: list[np.ndarray]) -> list[tuple[np.ndarray | None, Value | None]]:
    it = iter(arrays)
    return [(next(it) if v is not None else None, v) for v in node.outputs]


def _conform(arr: np.ndarray, v: Value) -> Tensor:
    """The result as the dtype ONNX declares for `v`, refusing a shape that disagrees."""
    if v.shape is not None and len(v.shape) != arr.ndim:
        raise _Refuse(f"evaluated rank {arr.ndim} differs from the inferred rank {len(v.shape)}")
    static = v.static_shape
    if static is not None and static != arr.shape:
        raise _Refuse(f"evaluated shape {arr.shape} differs from the inferred shape {static}")
    if v.dtype:
        target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.dtype))
        if arr.dtype != target:
            arr = arr.astype(target)
        return Tensor(arr, dtype=v.dtype)
    return Tensor(arr)


# -- the numpy path: a few cheap, common ops with exactly the reference's semantics -----------

_CASTABLE = {
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.FLOAT16,
    TensorProto.BOOL,
    TensorProto.INT8,
    TensorProto.INT16,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.UINT8,
    TensorProto.UINT16,
    TensorProto.UINT32,
    TensorProto.UINT64,
}


def _axes(node: Node, inputs: list, opset: int) -> list[int] | None:
    if opset >= 13:
        axes = inputs[1] if len(inputs) > 1 else None
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    return node.attr("axes")


def _fast_unsqueeze(node: Node, a: list, opset: int) -> np.ndarray:
    return np.expand_dims(a[0], tuple(_axes(node, a, opset) or ()))


def _fast_squeeze(node: Node, a: list, opset: int) -> np.ndarray:
    axes = _axes(node, a, opset)
    return np.squeeze(a[0]) if axes is None else np.squeeze(a[0], tuple(axes))


def _fast_reshape(node: Node, a: list, opset: int) -> np.ndarray | None:
    if len(a) < 2 or a[1] is None:
        return None  # opset 1-4 Reshape takes the shape as an attribute
    shape = [int(d) for d in a[1].reshape(-1)]
    if not node.attr("allowzero", 0):
        shape = [a[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return np.reshape(a[0], shape)


def _fast_cast(node: Node, a: list, opset: int) -> np.ndarray | None:
    to = node.attr("to")
    if to not in _CASTABLE or a[0].dtype.kind not in "biuf":
        return None
    return a[0].astype(onnx.helper.tensor_dtype_to_np_dtype(to))


def _fast_binary(fn: Callable) -> Callable:
    def run(node: Node, a: list, opset: int) -> np.ndarray | None:
        if a[0].dtype != a[1].dtype or a[0].dtype.kind not in "iuf":
            return None
        return np.asarray(fn(a[0], a[1])).astype(a[0].dtype, copy=False)

    return run


def _fast_constant_of_shape(node: Node, a: list, opset: int) -> np.ndarray:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    return np.full(tuple(int(d) for d in a[0].reshape(-1)), value.reshape(-1)[0], value.dtype)


def _fast_transpose(node: Node, a: list, opset: int) -> np.ndarray:
    perm = node.attr("perm")
    return np.transpose(a[0], None if perm is None else tuple(perm))


_FAST: dict[str, Callable[[Node, list, int], np.ndarray | None]] = {
    "Identity": lambda n, a, o: a[0],
    "Unsqueeze": _fast_unsqueeze,
    "Squeeze": _fast_squeeze,
    "Concat": lambda n, a, o: np.concatenate([x for x in a if x is not None], n.attr("axis")),
    "Gather": lambda n, a, o: np.take(a[0], a[1], axis=n.attr("axis", 0)),
    "Reshape": _fast_reshape,
    "Cast": _fast_cast,
    "Transpose": _fast_transpose,
    "Add": _fast_binary(np.add),
    "Sub": _fast_binary(np.subtract),
    "Mul": _fast_binary(np.multiply),
    "ConstantOfShape": _fast_constant_of_shape,
}


# -- rewriting ---------------------------------------------------------------------------------


def _constant_tensor(node: Node) -> Tensor:
    tensor = constant_node_tensor(node)
    if tensor is None:
        raise _Refuse("sparse or empty Constant stays a node")
    return tensor


def _substitute(graph: Graph, node: Node, tensors: list[Tensor | None]) -> None:
    """Replace the node's outputs by initializers that take over their names, drop the node."""
    renames: list[tuple[Value, str]] = []
    for v, tensor in zip(node.outputs, tensors, strict=True):
        if v is None or tensor is None or not (v._uses or v.is_graph_output):
            continue
        const = graph.make_constant(tensor, v.name)
        renames.append((const, v.name))
        graph.replace_all_uses_with(v, const)
    graph.remove(node)
    model = graph.model
    assert model is not None
    for const, name in renames:
        if const.name != name:
            model.rename_value(const, name)


# -- If with a constant condition ---------------------------------------------------------------


def _if_taken(node: Node) -> bool:
    """The constant condition of an If (True: the then branch runs)."""
    cond = node.input(0).numpy()  # type: ignore[union-attr]
    if cond.size != 1:
        raise _Refuse(f"If condition has {cond.size} elements")
    return bool(cond.reshape(-1)[0])


def _inline_if(graph: Graph, node: Node, then: bool) -> list[Node]:
    """Move the taken branch before the If, route its outputs to the If's readers."""
    taken = node.attr("then_branch" if then else "else_branch")
    dropped = node.attr("else_branch" if then else "then_branch")
    model = graph.model
    assert model is not None
    mapping: dict[int, Value] = {}
    for old in list(taken.initializers.values()):
        mapping[id(old)] = _move_initializer(graph, old)
    moved = [_move_node(graph, old, node, mapping) for old in taken.nodes]
    for new in moved:
        _remap_subgraphs(new, mapping)
    outs = [mapping.get(id(v), v) for v in taken.outputs]
    _retire(model, dropped)
    for old in taken:
        old.clear_inputs()  # its replacement reads the same values now
    names = [(v.name if v is not None else "") for v in node.outputs]
    for old, new in zip(node.outputs, outs, strict=True):
        if old is not None:
            graph.replace_all_uses_with(old, new)
    # Both branches are dealt with (moved or retired): detach them so that removing the If
    # does not release the nested subgraphs that moved with their nodes.
    node.attributes.pop("then_branch", None)
    node.attributes.pop("else_branch", None)
    graph.remove(node)
    _restore_names(model, names, outs, set(map(id, mapping.values())))
    return moved


def _move_initializer(graph: Graph, old: Value) -> Value:
    graph.model.release_value(old)  # type: ignore[union-attr]
    new = Value(old.name, const=old.const)
    new.doc_string = old.doc_string
    return graph.add_initializer(new)


def _move_node(graph: Graph, old: Node, anchor: Node, mapping: dict[int, Value]) -> Node:
    model = graph.model
    assert model is not None
    outputs: list[Value | None] = []
    for v in old.outputs:
        if v is None:
            outputs.append(None)
            continue
        model.release_value(v)
        new_v = Value(v.name, v.dtype, v.shape)
        mapping[id(v)] = new_v
        outputs.append(new_v)
    model.release_node(old)
    new = Node(
        old.op_type,
        [mapping.get(id(v), v) if v is not None else None for v in old.inputs],
        outputs,
        domain=old.domain,
        name=old.name,
        attributes=dict(old.attributes),
    )
    new.doc_string, new.overload = old.doc_string, old.overload
    new.metadata_props = list(old.metadata_props)
    graph.insert_before(anchor, new)
    return new


def _remap_subgraphs(node: Node, mapping: dict[int, Value]) -> None:
    """Nested subgraphs moved with `node` read branch values: point them at the new ones."""
    for sub in node.subgraphs():
        for inner in sub.all_nodes():
            for i, v in enumerate(inner.inputs):
                if v is not None and id(v) in mapping:
                    inner.set_input(i, mapping[id(v)])


def _retire(model: Model, graph: Graph) -> None:
    """Drop a discarded branch's uses of outer values and release its names."""
    for v in [*graph.inputs, *graph.initializers.values()]:
        model.release_value(v)
    for n in graph.nodes:
        n.clear_inputs()
        model.release_node(n)
        for v in n.outputs:
            if v is not None:
                model.release_value(v)
        for sub in n.subgraphs():
            _retire(model, sub)


def _restore_names(model: Model, names: list[str], outs: list[Value], ours: set[int]) -> None:
    """Inlined values that replace the If's outputs take the If's output names."""
    done: set[int] = set()
    for name, v in zip(names, outs, strict=True):
        if not name or id(v) not in ours or id(v) in done or v.is_graph_output:
            continue
        done.add(id(v))
        if model.value(name) is None:
            model.rename_value(v, name)
