"""ModelProto -> IR. The only code that reads ONNX protobuf (besides the exporter's writer).

Everything a ModelProto holds is kept: initializers (decoded lazily, external data
memory-mapped), Constant nodes, every attribute, subgraphs with outer-scope references, symbolic
dimensions, value_info, opset imports of any domain, model-local functions, metadata, docs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from infercc.errors import InferccError
from infercc.ir.graph import (
    Graph,
    IRError,
    Model,
    Node,
    Value,
    _stable_kahn,
    cycle_in,
    declared_dim,
)
from infercc.ir.ops import STANDARD_DOMAINS
from infercc.ir.tensor import Tensor
from infercc.ir.wire import RawSlice, read_model
from infercc.util import first_line, gc_paused

log = logging.getLogger(__name__)

_MAX_PROTO = 2**31 - 1


def load_model(path: str | Path, freeze_initializers: bool = False) -> Model:
    """Read a model file into the IR without reading external weights (see `import_model`
    for `freeze_initializers`)."""
    path = Path(path)
    if not path.exists():
        raise InferccError(f"model file not found: {path}", "check the path")
    if path.is_dir():
        raise InferccError(f"{path} is a directory, not an ONNX model file", "pass the .onnx file")
    size = path.stat().st_size
    if size > _MAX_PROTO:
        raise InferccError(
            f"{path} is {size / 2**30:.1f} GiB in one file; protobuf cannot read over 2 GiB",
            "save the model with external data (onnx.save(..., save_as_external_data=True))",
        )
    try:
        proto, slices = read_model(path)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InferccError(
            f"{path} is not a valid ONNX model: protobuf could not parse it ({first_line(e, 160)})",
            "the file may be truncated or not an ONNX file; re-export the model",
        ) from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise InferccError(
            f"{path} holds no ONNX graph (empty, truncated or not an ONNX file)",
            "re-export the model",
        )
    return import_model(
        proto, base_dir=path.parent, raw_slices=slices, freeze_initializers=freeze_initializers
    )


def import_model(
    proto: onnx.ModelProto,
    base_dir: Path | None = None,
    raw_slices: list[RawSlice | None] | None = None,
    freeze_initializers: bool = False,
) -> Model:
    """Build the IR from a ModelProto (which the IR then references: do not modify it).

    `raw_slices` (from `wire.read_model`) says where each main-graph initializer's raw bytes
    lie in the source file, for tensors that were not read into memory.

    An initializer the main graph also lists as an input is, from IR 4 on, a default the
    caller may override: it stays a graph input (with its default, `Graph.input_defaults`),
    so no pass folds or fuses through it, unless `freeze_initializers` makes it a constant
    (and drops the input). Before IR 4 every initializer had to be listed as an input, so
    there they are constants. `Model.overridable` names them either way.
    """
    _check_versions(proto)
    model = Model(Graph(proto.graph.name))
    model.ir_version = proto.ir_version
    model.opset_imports = {op.domain: op.version for op in proto.opset_import}
    model.producer_name = proto.producer_name
    model.producer_version = proto.producer_version
    model.domain = proto.domain
    model.model_version = proto.model_version
    model.doc_string = proto.doc_string
    model.metadata_props = [(p.key, p.value) for p in proto.metadata_props]
    model.functions = list(proto.functions)
    model.training_info = list(proto.training_info)
    model.base_dir = base_dir
    try:
        with gc_paused():
            importer = _Importer(model, base_dir, raw_slices)
            importer.overridable = proto.ir_version >= 4 and not freeze_initializers
            importer.graph(proto.graph, model.graph, None)
    except IRError as e:
        raise InferccError(
            f"invalid model: {e}", "the model breaks ONNX's rules; re-export it"
        ) from None
    return model


def _check_versions(proto: onnx.ModelProto) -> None:
    if proto.ir_version > onnx.IR_VERSION:
        raise InferccError(
            f"model IR version {proto.ir_version} is newer than the installed onnx supports "
            f"({onnx.IR_VERSION})",
            "upgrade onnx (pip install -U onnx)",
        )
    latest = onnx.defs.onnx_opset_version()
    for op in proto.opset_import:
        if op.domain in STANDARD_DOMAINS and op.version > latest:
            raise InferccError(
                f"model uses opset {op.version} but the installed onnx knows up to {latest}",
                "upgrade onnx (pip install -U onnx), or export the model with a lower opset",
            )
    if not any(op.domain in STANDARD_DOMAINS for op in proto.opset_import) and proto.graph.node:
        if any(n.domain in STANDARD_DOMAINS for n in proto.graph.node):
            raise InferccError(
                "model has standard ONNX nodes but no opset import for the default domain",
                "re-export the model with an opset version",
            )


def _dims(type_proto: onnx.TypeProto) -> tuple[int | str | None, ...] | None:
    """The dims: ints, symbol names, None where unknown (`graph.declared_dim`)."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(declared_dim(d) for d in type_proto.tensor_type.shape.dim)


def apply_type(value: Value, type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind is not None and kind != "tensor_type":
        value.non_tensor = True
    if type_proto.HasField("tensor_type"):
        if type_proto.tensor_type.elem_type:
            value.dtype = type_proto.tensor_type.elem_type
        dims = _dims(type_proto)
        if dims is not None:
            value.shape = dims


class _Importer:
    def __init__(
        self, model: Model, base_dir: Path | None, raw_slices: list[RawSlice | None] | None
    ):
        self.model = model
        self.base_dir = base_dir
        self.raw_slices = raw_slices
        self.overridable = False

    def graph(self, gp: onnx.GraphProto, graph: Graph, outer: dict[str, Value] | None) -> Graph:
        graph.name = gp.name
        graph.doc_string = gp.doc_string
        graph.metadata_props = [(p.key, p.value) for p in gp.metadata_props]
        scope: dict[str, Value] = {}
        slices = self.raw_slices if outer is None and self.raw_slices else []
        listed = {vi.name for vi in gp.input} if outer is None else set()
        if outer is None:
            self.model.overridable = [t.name for t in gp.initializer if t.name in listed]
        for i, t in enumerate(gp.initializer):
            self._define(scope, t.name, "initializer")
            source = slices[i] if i < len(slices) else None
            v = Value(t.name, const=Tensor.from_proto(t, self.base_dir, source))
            v.doc_string = t.doc_string
            if self.overridable and t.name in listed:
                graph.input_defaults[t.name] = v  # a default: the input below stands for it
                continue
            scope[t.name] = graph.add_initializer(v)
        for sp in gp.sparse_initializer:
            v = self._sparse(sp)
            self._define(scope, v.name, "sparse initializer")
            scope[v.name] = graph.add_initializer(v)
            graph.sparse_initializers.append((sp, v))
        for vi in gp.input:
            if vi.name in graph.initializers:
                # IR < 4 lists every initializer as an input too (or --freeze-initializers):
                # it is a constant.
                graph.initializers[vi.name].type_proto = vi.type
                continue
            if vi.name not in graph.input_defaults:
                self._define(scope, vi.name, "graph input")
            v = Value(vi.name)
            apply_type(v, vi.type)
            v.type_proto = vi.type
            v.doc_string = vi.doc_string
            v.metadata_props = [(p.key, p.value) for p in vi.metadata_props]
            scope[vi.name] = graph.add_input(v)
        infos = {vi.name: vi for vi in gp.value_info}
        for node_proto in self._ordered(gp, scope, outer):
            self.node(node_proto, graph, scope, outer)
        for vi in gp.output:
            v = self._resolve(vi.name, scope, outer, f"graph output {vi.name!r}")
            if v.graph is not graph:
                raise InferccError(
                    f"graph output {vi.name!r} of {gp.name!r} is an outer-scope value",
                    "unsupported model form; re-export it",
                )
            apply_type(v, vi.type)
            v.type_proto = vi.type
            v.doc_string = v.doc_string or vi.doc_string
            v.metadata_props = v.metadata_props or [(p.key, p.value) for p in vi.metadata_props]
            graph.outputs.append(v)
        for name, vi in infos.items():
            found = scope.get(name)
            if found is None or found.graph is not graph:
                graph.extra_value_info.append(vi)
                continue
            if found.type_proto is None:
                apply_type(found, vi.type)
                found.keep_info = True
        return graph

    def _sparse(self, sp: onnx.SparseTensorProto) -> Value:
        """A sparse initializer's dense value, as onnxruntime reads it."""
        name = sp.values.name
        try:
            dense = sparse_to_dense(sp, self.base_dir)
        except (ValueError, IndexError) as e:
            raise InferccError(
                f"sparse initializer {name!r} is malformed: {first_line(e, 160)}",
                "re-export the model",
            ) from None
        v = Value(name, const=Tensor(dense, dtype=sp.values.data_type))
        v.doc_string = sp.values.doc_string
        return v

    def _define(self, scope: dict[str, Value], name: str, what: str) -> None:
        if name in scope or self.model.value(name) is not None:
            raise InferccError(
                f"duplicate value name {name!r} ({what} defined twice)",
                "every tensor name must be assigned once; re-export the model",
            )

    def _resolve(
        self, name: str, scope: dict[str, Value], outer: dict[str, Value] | None, who: str
    ) -> Value:
        v = scope.get(name)
        if v is None and outer is not None:
            v = outer.get(name)
        if v is None:
            raise InferccError(
                f"{who} reads {name!r}, which no node, graph input or initializer defines",
                "the model is incomplete (a missing initializer or a dangling reference); "
                "re-export it",
            )
        return v

    def _ordered(
        self, gp: onnx.GraphProto, scope: dict[str, Value], outer: dict[str, Value] | None
    ) -> list[onnx.NodeProto]:
        """The nodes in topological order (the file's order when it already is one)."""
        nodes = list(gp.node)
        producer: dict[str, int] = {}
        for i, n in enumerate(nodes):
            for o in n.output:
                if not o:
                    continue
                if o in producer or o in scope:
                    raise InferccError(
                        f"duplicate value name {o!r}: assigned by more than one node or input",
                        "every tensor name must be assigned once; re-export the model",
                    )
                producer[o] = i
        sorted_already = True
        deps: list[set[int]] = []
        for i, n in enumerate(nodes):
            d = {producer[x] for x in _node_reads(n) if x in producer}
            d.discard(i)
            if any(j > i for j in d):
                sorted_already = False
            deps.append(d)
            if i in {producer.get(x) for x in n.input if x}:
                raise InferccError(
                    f"graph has a cycle: node {_label(n)} reads its own output",
                    "the model is malformed; re-export it",
                )
        if sorted_already:
            return nodes
        keys = [_NodeKey(i) for i in range(len(nodes))]
        order = _stable_kahn(
            keys,
            {keys[i]: {keys[j] for j in deps[i]} for i in range(len(nodes))},
            {k: k.i for k in keys},
        )
        if order is None:
            cycle = cycle_in((j, i) for i, d in enumerate(deps) for j in d)
            stuck = [_label(nodes[i]) for i in cycle][:3]
            raise InferccError(
                f"graph has a cycle (involving {', '.join(stuck)})",
                "the model is malformed; re-export it",
            )
        log.info("graph %r was not in topological order; sorted it", gp.name)
        return [nodes[k.i] for k in order]

    def node(
        self,
        np_: onnx.NodeProto,
        graph: Graph,
        scope: dict[str, Value],
        outer: dict[str, Value] | None,
    ) -> None:
        inputs = [self._input(x, scope, outer, np_) if x else None for x in np_.input]
        node = Node(np_.op_type, inputs, domain=np_.domain, name=np_.name)
        node.doc_string = np_.doc_string
        node.overload = getattr(np_, "overload", "")
        node.metadata_props = [(p.key, p.value) for p in getattr(np_, "metadata_props", [])]
        for a in np_.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                node.set_attr(a.name, self._subgraph(a.g, _chain(outer, scope), node))
            elif a.type == onnx.AttributeProto.GRAPHS:
                inner = _chain(outer, scope)
                node.set_attr(a.name, [self._subgraph(g, inner, node) for g in a.graphs])
            else:
                node.attributes[a.name] = a
        for o in np_.output:
            if not o:
                node._append_output(None)
                continue
            self._define(scope, o, f"output of node {_label(np_)}")
            v = Value(o)
            node._append_output(v)
            scope[o] = v
        graph.append(node)

    def _input(
        self, name: str, scope: dict[str, Value], outer: dict[str, Value] | None, np_
    ) -> Value:
        v = scope.get(name)
        if v is None:
            v = self._resolve(name, scope, outer, f"node {_label(np_)}")
        return v

    def _subgraph(self, gp: onnx.GraphProto, outer: dict[str, Value], owner: Node) -> Graph:
        sub = Graph(gp.name, self.model)
        sub.owner = owner
        return self.graph(gp, sub, outer)


def sparse_to_dense(sp: onnx.SparseTensorProto, base_dir: Path | None = None):
    """The dense array of a SparseTensorProto: zeros, with `values` at `indices` (linear
    indices of shape [NNZ], or coordinates of shape [NNZ, rank])."""
    import numpy as np

    values = Tensor.from_proto(sp.values, base_dir).numpy()
    indices = Tensor.from_proto(sp.indices, base_dir).numpy().astype(np.int64)
    dims = tuple(int(d) for d in sp.dims)
    dense = np.zeros(int(np.prod(dims, dtype=np.int64)), dtype=values.dtype)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices[:, 0]
    dense[indices.reshape(-1)] = values.reshape(-1)
    return dense.reshape(dims)


def _chain(outer: dict[str, Value] | None, scope: dict[str, Value]) -> dict[str, Value]:
    """The names visible inside a subgraph: the enclosing scopes, innermost last."""
    return {**(outer or {}), **scope}


class _NodeKey:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _node_reads(n: onnx.NodeProto) -> set[str]:
    """Names a node reads, including free names read inside its subgraphs."""
    names = {x for x in n.input if x}
    for a in n.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            inner_defined = {t.name for t in g.initializer} | {vi.name for vi in g.input}
            for sub in g.node:
                inner_defined.update(o for o in sub.output if o)
            for sub in g.node:
                names.update(x for x in _node_reads(sub) if x not in inner_defined)
            names.update(vi.name for vi in g.output if vi.name not in inner_defined)
    return names


def _label(n: onnx.NodeProto) -> str:
    return f"{n.name!r} ({n.op_type})" if n.name else f"({n.op_type} -> {list(n.output)[:2]})"
