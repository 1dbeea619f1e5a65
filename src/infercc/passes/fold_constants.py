"""fold-constants: replace what can be computed ahead of time by its value.

Rewrites, in every graph and subgraph, walking nodes in topological order:

- a Constant node (value, value_float(s), value_int(s), value_string(s)) becomes an initializer
  with the same name; a sparse_value Constant stays a node;
- Shape / Size of a value whose (selected) dimensions are all known integers becomes an int64
  constant; a symbolic or unknown dimension is never baked in;
- a standard-domain node whose inputs are all constants (omitted optional inputs allowed) and
  whose outputs are tensors becomes its outputs' values, as onnxruntime computes them
  (`infercc.passes.evaluate`: one session per batch of such nodes, onnx.reference only for a
  node onnxruntime cannot load); each value keeps the shape and type it was computed with;
- an If with a constant condition is replaced by the nodes of the branch it takes.

Exact because ONNX operators are pure functions of their inputs: a node whose inputs are known
computes the same value at every run, so the value can stand for the node, and the value is
the one the runtime computes (not another implementation's reading of the spec). Shape and
Size read only the shape, which is fixed when every dimension is an integer. An If whose
condition is a constant always runs the same branch, and the branch's nodes already read
outer-scope values directly. Never folded: quantization nodes (the backend needs them), random
ops and Dropout in training mode with a non-zero ratio (folding would freeze one sample), nodes
of other domains, Loop/Scan and other subgraph-holding nodes, nodes whose output is a sequence,
map or optional (a constant is a tensor), and any result over its option `fold_limit` bytes (checked
before evaluating where the size is predictable). Graph outputs keep their names; no existing
initializer is modified.

One rule (`infercc.passes.rules`) on every op: its check computes the value (or the branch
an If takes) and says why a node does not fold; for bisection one rewrite is one node replaced
by its value (a Constant, a Shape/Size, an evaluated node) or one If inlined.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import onnx

from infercc.ir.graph import Graph, Model, Node, Value
from infercc.ir.ops import NON_TENSOR_OPS, QUANTIZATION_OPS, RANDOM_OPS, STANDARD_DOMAINS
from infercc.ir.tensor import Tensor
from infercc.passes.evaluate import (
    SIZE_RULES,
    EvaluationError,
    Evaluator,
    ir_version_for,
    predicted_nbytes,
)
from infercc.passes.manager import (
    PassContext,
    PassOption,
    PassResult,
    register_option,
    register_pass,
)
from infercc.passes.match import constant_node_tensor, default_opset, is_live
from infercc.passes.rules import NoMatch, Rule, apply_rules, require

log = logging.getLogger(__name__)

DEFAULT_FOLD_LIMIT = 16 * 2**20

FOLD_LIMIT: PassOption[int] = register_option(
    "fold_limit", int, "the largest constant folding may create, bytes", DEFAULT_FOLD_LIMIT
)

NEVER_FOLD = {
    **dict.fromkeys(QUANTIZATION_OPS, "quantization node: kept for the backend"),
    **dict.fromkeys(RANDOM_OPS, "random op: folding would freeze one sample"),
    **dict.fromkeys(NON_TENSOR_OPS, "its output is a sequence or optional, not a tensor"),
}


@register_pass("fold-constants", reads=("fold_limit",))
def fold_constants(graph: Graph, ctx: PassContext) -> PassResult:
    """Turn Constant nodes into initializers and evaluate what depends only on constants."""
    model = graph.model
    assert model is not None
    folder = _Folder(model, FOLD_LIMIT.read(ctx))
    run = apply_rules(graph, ctx, [Rule("folded", None, folder.check, _rewrite, False)])
    stats = {**dict.fromkeys(_KINDS, 0), **run.counts, "refused": len(run.refused)}
    evaluated = folder.evaluator.stats
    stats.update(
        sessions=evaluated.sessions,
        by_onnxruntime=evaluated.onnxruntime,
        by_numpy=evaluated.numpy,
        by_reference=evaluated.reference,
    )
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

    def __init__(self, model: Model, limit: int):
        self.opset = default_opset(model)
        self.limit = limit
        opsets = dict(model.opset_imports)
        self.evaluator = Evaluator(opsets, ir_version_for(opsets, model.ir_version))

    def check(self, node: Node, ctx: PassContext) -> _Values | _Branch:
        if not is_live(node):
            raise NoMatch()
        return self._fold(node)

    def _fold(self, node: Node) -> _Values | _Branch:
        if node.domain not in STANDARD_DOMAINS:
            if _all_inputs_constant(node):
                raise NoMatch(f"domain {node.domain!r} is not evaluated")
            raise NoMatch()
        if node.op_type == "Constant":
            return _Values("constants", [_constant_tensor(node)])
        if node.op_type in ("Shape", "Size") and _shape_known(node):
            return _Values("shapes", [Tensor(_shape_value(node))])
        if not _all_inputs_constant(node):
            raise NoMatch()
        if node.op_type == "If":
            return _Branch(_if_taken(node))
        return _Values("folded", self.evaluate(node))

    def evaluate(self, node: Node) -> list[Tensor | None]:
        reason = self._why_not(node)
        if reason is not None:
            raise NoMatch(reason)
        try:
            arrays, by = self.evaluator.values(node, self._plan, _known)
        except EvaluationError as e:
            raise NoMatch(str(e)) from None
        size = sum(a.nbytes for a in arrays)
        if size > self.limit:
            raise NoMatch(f"result is {size} bytes, over the fold limit of {self.limit}")
        it = iter(arrays)  # the arrays of the outputs present, in order
        return [_tensor(next(it), v, by) if v is not None else None for v in node.outputs]

    def _why_not(self, node: Node) -> str | None:
        """Why a node with known inputs must not be evaluated, or None."""
        try:
            _check_foldable(node, self.opset)
        except NoMatch as e:
            return e.reason
        predicted = predicted_nbytes(node)
        if predicted is not None and predicted > self.limit:
            return f"result would be {predicted} bytes, over the fold limit of {self.limit}"
        return None

    def _plan(self, graph: Graph) -> list[Node]:
        """The nodes of `graph` that can fold from what is known now, in order: what one
        onnxruntime session evaluates (`infercc.passes.evaluate`)."""
        ready: set[int] = set()
        plan: list[Node] = []
        for n in graph:
            if not _plannable(n) or not is_live(n):
                continue
            if not all(v is None or id(v) in ready or _is_known(v) for v in n.inputs):
                continue
            if self._why_not(n) is not None:
                continue
            if n.op_type in SIZE_RULES and not _all_inputs_constant(n):
                if predicted_nbytes(n) is None:
                    continue  # its size is known only once its inputs are: a later batch
            plan.append(n)
            ready.update(id(v) for v in n.outputs if v is not None)
        return plan


def _plannable(node: Node) -> bool:
    return (
        node.domain in STANDARD_DOMAINS
        and node.op_type not in ("Constant", "Shape", "Size", "If")
        and not node.subgraphs()
    )


def _is_known(v: Value) -> bool:
    """Whether `v` is a constant, or the output of a Constant or of a foldable Shape/Size."""
    if v.const is not None:
        return True
    p = v.producer
    if p is None or p.domain not in STANDARD_DOMAINS:
        return False
    if p.op_type == "Constant":
        return constant_node_tensor(p) is not None
    return p.op_type in ("Shape", "Size") and _shape_known(p)


def _known(v: Value) -> np.ndarray | None:
    """The value of `v` when `_is_known`, else None."""
    if v.const is not None:
        return v.const.numpy()
    if not _is_known(v):
        return None
    p = v.producer
    assert p is not None
    if p.op_type == "Constant":
        tensor = constant_node_tensor(p)
        return None if tensor is None else tensor.numpy()
    return _shape_value(p)


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
        raise NoMatch(reason)
    if node.op_type == "Dropout" and _dropout_draws(node, opset):
        raise NoMatch("Dropout in training mode is random: folding would freeze one sample")
    if node.subgraphs():
        raise NoMatch("control flow with subgraphs is not evaluated")
    if any(v is not None and v.non_tensor for v in node.outputs):
        raise NoMatch("its output is a sequence, map or optional, not a tensor")


def _dropout_draws(node: Node, opset: int) -> bool:
    """True when a Dropout draws a random mask: training mode (or unknown), ratio not 0."""
    if opset < 7:
        return node.attr("is_test", 0) != 1 and node.attr("ratio", 0.5) != 0
    mode, ratio = node.input(2), node.input(1)
    if mode is None:
        return False
    mode_value = _known(mode)
    if mode_value is not None and not bool(np.asarray(mode_value).reshape(-1)[0]):
        return False
    return ratio is None or _ratio(ratio) != 0.0


def _ratio(ratio: Value) -> float | None:
    value = _known(ratio)
    return None if value is None else float(np.asarray(value).reshape(-1)[0])


def _shape_known(node: Node) -> bool:
    v = node.input(0)
    if v is None or v.shape is None:
        return False
    return all(isinstance(d, int) and d >= 0 for d in _selected_dims(node, v.shape))


def _selected_dims(node: Node, shape: tuple) -> tuple:
    if node.op_type == "Size":
        return shape
    start, end = node.attr("start", 0), node.attr("end")
    return shape[start:end]  # ONNX clamps start/end like Python slicing does


def _shape_value(node: Node) -> np.ndarray:
    """The value of a Shape or Size node whose input's shape `_shape_known` holds."""
    x = node.input(0)
    assert x is not None and x.shape is not None
    dims = _selected_dims(node, x.shape)
    if node.op_type == "Size":
        return np.array(math.prod(dims), dtype=np.int64)
    return np.array(dims, dtype=np.int64)


# -- results -----------------------------------------------------------------------------------


def _tensor(arr: np.ndarray, v: Value, by: str) -> Tensor:
    """The value as computed: onnxruntime's dtype and shape. onnx.reference's numpy results
    take the dtype ONNX declares for `v` (it returns int32 where ONNX says int64, say)."""
    if by == "onnx.reference" and v.dtype:
        target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.dtype))
        if arr.dtype != target:
            arr = arr.astype(target)
        return Tensor(arr, dtype=v.dtype)
    if v.dtype and arr.dtype == np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.dtype)):
        return Tensor(arr, dtype=v.dtype)
    return Tensor(arr)


# -- rewriting ---------------------------------------------------------------------------------


def _constant_tensor(node: Node) -> Tensor:
    tensor = constant_node_tensor(node)
    if tensor is None:
        raise NoMatch("sparse or empty Constant stays a node")
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
    cond = require(node.input(0)).numpy()
    if cond.size != 1:
        raise NoMatch(f"If condition has {cond.size} elements")
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
    outs: list[Value] = [mapping.get(id(v), v) for v in taken.outputs]
    _retire(model, dropped)
    for old in taken:
        old.clear_inputs()  # its replacement reads the same values now
    names = [(v.name if v is not None else "") for v in node.outputs]
    for old_out, new_out in zip(node.outputs, outs, strict=True):
        if old_out is not None:
            graph.replace_all_uses_with(old_out, new_out)
    # Both branches are dealt with (moved or retired): detach them so that removing the If
    # does not release the nested subgraphs that moved with their nodes.
    node.attributes.pop("then_branch", None)
    node.attributes.pop("else_branch", None)
    graph.remove(node)
    _restore_names(model, names, outs, set(map(id, mapping.values())))
    return moved


def _move_initializer(graph: Graph, old: Value) -> Value:
    graph.owning_model().release_value(old)
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
    for value in [*graph.inputs, *graph.initializers.values()]:
        model.release_value(value)
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
