"""What fold-constants folds a node to: onnxruntime's own result for it, computed in batches.

The runtime that will run the model is the ground truth, so a folded value is what
onnxruntime computes for the node, not what a second implementation thinks the spec says
(onnx.reference differs from onnxruntime on edge cases: Slice ends of INT64_MAX with a negative
step, Squeeze with an empty axes tensor, LogSoftmax of large values, Unique(sorted=0), ArgMax
over NaN, Cast to string, Resize with align_corners, MaxUnpool with output_shape, ...).

One onnxruntime session per folded node costs a few milliseconds each, so nodes are evaluated
in batches: when fold-constants first asks for a node's value, `Evaluator` collects every node
of that graph that can fold from the constants known at that moment (constants, Constant
nodes, Shape/Size of static shapes, and the outputs of the nodes collected before it), writes
them into one model whose outputs are all their outputs, and runs it once (CPU, graph
optimizations off, one thread: each node runs its own kernel, deterministically). The batch is
cut into sessions of at most `BATCH_BYTES` of predicted results. A batch that onnxruntime
refuses is split in halves until the node at fault is alone; that node is then:

- evaluated with `onnx.reference` when onnxruntime cannot load it on its own (an op, opset or
  type onnxruntime has no kernel for: the model could not run under onnxruntime anyway, and a
  backend such as TensorRT may run the folded form), in the fork server of
  `infercc.isolation`, so that a crash or a runaway allocation there leaves the node unfolded
  (with the reason) instead of killing the process;
- refused when onnxruntime loads it but fails to run it (the model would fail there too).

Nodes that only move elements (Identity, Transpose, Reshape, Unsqueeze, Squeeze with axes,
Concat, Gather, ConstantOfShape) and integer / float32 / float64 Add, Sub and Mul are computed
with numpy (`MOVES`), which puts the same bits in the same places: a transposed weight is then
a view, not a copy made by a single-threaded kernel. Anything numpy refuses goes to
onnxruntime, which says why.

Types the Python binding cannot hand over (bfloat16, float8, 4- and 2-bit types) go in as
initializers and come out through an exact Cast to float32 or int8/uint8, converted back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from infercc.ir.graph import Graph, Node, Value
from infercc.ir.numpy_ops import MOVES
from infercc.isolation import ChildCrashed, call_isolated

log = logging.getLogger(__name__)

BATCH_BYTES = 256 * 2**20  # predicted result bytes per onnxruntime session

# Element types numpy (and so onnxruntime's Python binding) holds natively.
_NATIVE = {
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
    TensorProto.STRING,
    TensorProto.COMPLEX64,
    TensorProto.COMPLEX128,
}
_SIGNED_INTS = {getattr(TensorProto, n) for n in ("INT4", "INT2") if hasattr(TensorProto, n)}
_UNSIGNED_INTS = {getattr(TensorProto, n) for n in ("UINT4", "UINT2") if hasattr(TensorProto, n)}


class EvaluationError(Exception):
    """The node cannot be folded; the message says why."""


@dataclass
class _Result:
    arrays: list[np.ndarray] | None  # the present outputs, in order
    error: str = ""
    by: str = "onnxruntime"


@dataclass
class Stats:
    """What the evaluator did in one pass run."""

    sessions: int = 0
    onnxruntime: int = 0
    numpy: int = 0
    reference: int = 0


Known = Callable[[Value], "np.ndarray | None"]
Plan = Callable[[Graph], "list[Node]"]


class Evaluator:
    """Values of nodes, computed by onnxruntime in batches (module docstring)."""

    def __init__(self, opset_imports: dict[str, int], ir_version: int):
        self.opset_imports = dict(opset_imports)
        self.ir_version = ir_version
        self.opset = int(opset_imports.get("", opset_imports.get("ai.onnx", 1)))
        self.stats = Stats()
        self._results: dict[int, tuple[Node, _Result]] = {}

    def values(self, node: Node, plan: Plan, known: Known) -> tuple[list[np.ndarray], str]:
        """The node's present outputs and the evaluator that computed them; raises
        EvaluationError. `plan(graph)` lists the graph's nodes that can fold from what is known
        (in topological order); `known(value)` is a value's constant, else None."""
        hit = self._results.get(id(node))
        if hit is None or hit[0] is not node:
            self._fill(node, plan, known)
            hit = self._results.get(id(node))
        if hit is None or hit[0] is not node:
            raise EvaluationError("not evaluated")
        result = hit[1]
        if result.arrays is None:
            raise EvaluationError(result.error)
        return result.arrays, result.by

    def _fill(self, node: Node, plan: Plan, known: Known) -> None:
        graph = node.graph
        assert graph is not None

        def known_or_done(v: Value) -> np.ndarray | None:
            done = self._output_value(v)
            return done if done is not None else known(v)

        nodes = [n for n in plan(graph) if not self._has(n)]
        if node not in nodes:
            nodes.append(node)  # planned from what it reads, whatever the plan says
        pending: list[Node] = []
        waiting: set[int] = set()
        for n in nodes:
            if not self._moved(n, waiting, known_or_done):
                pending.append(n)
                waiting.add(id(n))
        for chunk in _chunks(pending):
            self._run(chunk, known_or_done)

    def _moved(self, node: Node, waiting: set[int], known: Known) -> bool:
        """Evaluate a data-movement node with numpy (`MOVES`) when its inputs are known now
        (none comes from a node still `waiting` for onnxruntime)."""
        move = MOVES.get(node.op_type)
        if move is None or any(v is not None and id(v.producer) in waiting for v in node.inputs):
            return False
        inputs = [None if v is None else known(v) for v in node.inputs]
        if any(a is None for v, a in zip(node.inputs, inputs, strict=True) if v is not None):
            return False
        try:
            out = move(node, inputs, self.opset)
        except Exception:  # numpy refuses what onnxruntime would refuse too: it will say
            return False
        if out is None:
            return False
        self._store(node, _Result([np.asarray(out)], by="numpy"))
        self.stats.numpy += 1
        return True

    def _has(self, node: Node) -> bool:
        hit = self._results.get(id(node))
        return hit is not None and hit[0] is node

    def _output_value(self, v: Value) -> np.ndarray | None:
        p = v.producer
        if p is None or not self._has(p):
            return None
        result = self._results[id(p)][1]
        if result.arrays is None:
            return None
        present = [o for o in p.outputs if o is not None]
        for o, arr in zip(present, result.arrays, strict=True):
            if o is v:
                return arr
        return None

    # -- running ---------------------------------------------------------------------------

    def _run(self, nodes: list[Node], known: Known) -> None:
        """Evaluate `nodes` in one session, or split them until the failing node is alone."""
        nodes = self._ready(nodes, known)
        if not nodes:
            return
        try:
            arrays = self._session(nodes, known)
        except _LoadError as e:
            if len(nodes) == 1:
                self._reference(nodes[0], known, str(e))
                return
            self._split(nodes, known)
            return
        except _RunError as e:
            if len(nodes) == 1:
                self._store(nodes[0], _Result(None, f"onnxruntime fails on this node: {e}"))
                return
            self._split(nodes, known)
            return
        it = iter(arrays)
        for n in nodes:
            present = [o for o in n.outputs if o is not None]
            self._store(n, _Result([next(it) for _ in present]))
            self.stats.onnxruntime += 1

    def _split(self, nodes: list[Node], known: Known) -> None:
        half = len(nodes) // 2
        self._run(nodes[:half], known)
        self._run(nodes[half:], known)

    def _ready(self, nodes: list[Node], known: Known) -> list[Node]:
        """The nodes whose inputs are known, or computed by a node kept before them."""
        kept: list[Node] = []
        inside: set[int] = set()
        for n in nodes:
            if self._inputs_ready(n, inside, known):
                kept.append(n)
                inside.add(id(n))
        return kept

    def _inputs_ready(self, node: Node, inside: set[int], known: Known) -> bool:
        for v in node.inputs:
            if v is None:
                continue
            p = v.producer
            if p is not None and id(p) in inside:
                continue
            if self._output_value(v) is None and known(v) is None:
                return False
        return True

    def _store(self, node: Node, result: _Result) -> None:
        self._results[id(node)] = (node, result)

    def _session(self, nodes: list[Node], known: Known) -> list[np.ndarray]:
        import onnxruntime as ort

        batch = _Batch(nodes, known, self._output_value)
        model = batch.model(self.opset_imports, self.ir_version)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 4
        self.stats.sessions += 1
        try:
            sess = ort.InferenceSession(
                model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as e:
            raise _LoadError(_first_line(e)) from None
        try:
            outs = sess.run(None, batch.feeds)
        except Exception as e:
            raise _RunError(_first_line(e)) from None
        return batch.decode(outs)

    def _reference(self, node: Node, known: Known, why: str) -> None:
        inputs = [None if v is None else self._input_array(v, known) for v in node.inputs]
        try:
            arrays = reference(node, inputs, self.opset_imports)
        except EvaluationError as e:
            self._store(node, _Result(None, f"{e} (onnxruntime: {why})"))
            return
        self._store(node, _Result(arrays, by="onnx.reference"))
        self.stats.reference += 1

    def _input_array(self, v: Value, known: Known) -> np.ndarray:
        done = self._output_value(v)
        arr = done if done is not None else known(v)
        assert arr is not None
        return arr


class _LoadError(Exception):
    pass


class _RunError(Exception):
    pass


def _chunks(nodes: list[Node]) -> Iterable[list[Node]]:
    chunk: list[Node] = []
    size = 0
    for n in nodes:
        nbytes = predicted_nbytes(n)
        nbytes = BATCH_BYTES // 4 if nbytes is None else nbytes
        if chunk and size + nbytes > BATCH_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(n)
        size += nbytes
    if chunk:
        yield chunk


class _Batch:
    """The model of a batch of nodes: inputs are the constants they read, outputs all theirs."""

    def __init__(self, nodes: list[Node], known: Known, done: Known):
        self.names: dict[int, str] = {}
        self.feeds: dict[str, np.ndarray] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.protos: list[onnx.NodeProto] = []
        self.outputs: list[tuple[str, Value]] = []
        inside: set[int] = set()
        for n in nodes:
            for v in n.inputs:
                if v is not None and id(v) not in self.names and id(v.producer) not in inside:
                    arr = done(v)
                    self._constant(v, arr if arr is not None else known(v))
            self.protos.append(self._node(n))
            inside.add(id(n))

    def _name(self, v: Value) -> str:
        return self.names.setdefault(id(v), f"v{len(self.names)}")

    def _constant(self, v: Value, arr: np.ndarray | None) -> None:
        assert arr is not None
        name = self._name(v)
        dtype = v.dtype or onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        if dtype in _NATIVE and arr.dtype.kind in "biufcOSU":
            self.feeds[name] = arr if arr.flags.c_contiguous else np.array(arr, order="C")
            self.inputs.append(onnx.helper.make_tensor_value_info(name, dtype, arr.shape))
        else:
            self.initializers.append(onnx.numpy_helper.from_array(np.asarray(arr), name))

    def _node(self, n: Node) -> onnx.NodeProto:
        ins = [self._name(v) if v is not None else "" for v in n.inputs]
        outs = []
        for v in n.outputs:
            if v is None:
                outs.append("")
                continue
            name = self._name(v)
            outs.append(name)
            self.outputs.append((name, v))
        proto = onnx.helper.make_node(n.op_type, ins, outs, domain=n.domain)
        proto.attribute.extend(n.attributes.values())
        return proto

    def model(self, opset_imports: dict[str, int], ir_version: int) -> onnx.ModelProto:
        outputs, extra = [], []
        for name, v in self.outputs:
            if v.dtype in _NATIVE or not v.dtype:
                outputs.append(onnx.ValueInfoProto(name=name))
                continue
            wide = _wide_type(v.dtype)
            extra.append(onnx.helper.make_node("Cast", [name], [name + "_wide"], to=wide))
            outputs.append(onnx.ValueInfoProto(name=name + "_wide"))
        graph = onnx.helper.make_graph(
            self.protos + extra, "fold", self.inputs, outputs, self.initializers
        )
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in opset_imports.items()]
        model = onnx.helper.make_model(graph, opset_imports=opsets)
        model.ir_version = ir_version
        return model

    def decode(self, outs: Sequence) -> list[np.ndarray]:
        arrays = []
        for (_, v), arr in zip(self.outputs, outs, strict=True):
            if not isinstance(arr, np.ndarray):
                raise _RunError(f"output is a {type(arr).__name__}, not a tensor")
            if v.dtype and v.dtype not in _NATIVE:
                arr = arr.astype(onnx.helper.tensor_dtype_to_np_dtype(v.dtype))
            arrays.append(arr)
        return arrays


def _wide_type(dtype: int) -> int:
    """An onnxruntime-readable type holding every value of `dtype` exactly."""
    if dtype in _SIGNED_INTS:
        return TensorProto.INT8
    if dtype in _UNSIGNED_INTS:
        return TensorProto.UINT8
    return TensorProto.FLOAT


def ir_version_for(opset_imports: dict[str, int], model_ir: int) -> int:
    """The IR version of a batch model: the lowest that the standard opset needs (at least 4,
    the first where initializers need not be graph inputs)."""
    version = opset_imports.get("", opset_imports.get("ai.onnx"))
    if version is None:
        return max(int(model_ir), 4)
    try:
        needed = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", version)])
    except Exception:  # an opset newer than onnx's table: the model's own IR version
        needed = int(model_ir)
    return max(int(needed), 4)


# -- onnx.reference, for nodes onnxruntime cannot load ------------------------------------


def reference(
    node: Node, inputs: list[np.ndarray | None], opset_imports: dict[str, int]
) -> list[np.ndarray]:
    """Evaluate a one-node model with onnx.reference; raises EvaluationError."""
    names, feeds, typed = [], {}, []
    seen: dict[int, str] = {}
    for v, arr in zip(node.inputs, inputs, strict=True):
        if v is None or arr is None:
            names.append("")
            continue
        if id(v) not in seen:
            seen[id(v)] = f"in{len(seen)}"
            feeds[seen[id(v)]] = arr
            typed.append(onnx.helper.make_tensor_value_info(seen[id(v)], v.dtype or 0, None))
        names.append(seen[id(v)])
    outs = [f"out{i}" if v is not None else "" for i, v in enumerate(node.outputs)]
    proto = onnx.helper.make_node(node.op_type, names, outs, domain=node.domain)
    proto.attribute.extend(node.attributes.values())
    graph = onnx.helper.make_graph(
        [proto], "fold", typed, [onnx.ValueInfoProto(name=o) for o in outs if o]
    )
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in opset_imports.items()]
    model = onnx.helper.make_model(graph, opset_imports=opsets).SerializeToString()
    try:
        # onnx.reference runs a hostile node's arithmetic as asked (a huge Range or Expand, a
        # native crash in numpy): in the fork server it is a refusal, never a dead process
        results = call_isolated(_evaluate_reference, model, feeds)
    except ChildCrashed as died:
        raise EvaluationError(f"onnx.reference {died.describe()}") from None
    if any(not isinstance(r, np.ndarray | np.generic) for r in results):
        raise EvaluationError("the result is not a tensor (a sequence, map or optional)")
    return [np.asarray(r) for r in results]


def _evaluate_reference(model: bytes, feeds: dict[str, np.ndarray]) -> list[Any]:
    """Run a one-node model with onnx.reference (in the fork server); raises EvaluationError."""
    from onnx.reference import ReferenceEvaluator

    try:
        return list(ReferenceEvaluator(onnx.load_model_from_string(model)).run(None, feeds))
    except Exception as e:
        raise EvaluationError(f"evaluation failed: {type(e).__name__}: {_first_line(e)}") from None


# -- sizes ----------------------------------------------------------------------------------


def predicted_nbytes(node: Node) -> int | None:
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
    rule = SIZE_RULES.get(node.op_type)
    if rule is None:
        return None
    try:
        arrays = [None if v is None or v.const is None else v.const.numpy() for v in node.inputs]
        return tuple(int(d) for d in rule(arrays))
    except Exception:  # a malformed node (or inputs not known yet): evaluation will say why
        return None


def _range_length(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> tuple[int]:
    return (max(math.ceil((float(limit) - float(start)) / float(delta)), 0),)


SIZE_RULES: dict[str, Callable[[list], tuple]] = {
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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
