"""The graph IR: Value, Node, Graph and Model, with use-def links kept in sync.

In the spirit of torch.fx and onnx-ir: a Value knows its producer and its uses, a Node refuses to
be removed while its outputs are still read, nodes live in a doubly linked list kept in
topological order, and `lint()` checks every invariant so a broken graph is caught by the pass
that broke it.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
from onnx import AttributeProto

from infercc.ir.ops import STANDARD_DOMAINS
from infercc.ir.tensor import Tensor

Dim = int | str | None
K = TypeVar("K", bound=Hashable)  # what _stable_kahn orders: nodes, or the importer's keys


class IRError(Exception):
    """An IR invariant was broken (a bug in a pass, not bad user input)."""


class Value:
    """A tensor in the graph: a graph input, a constant (initializer), or a node output."""

    __slots__ = (
        "name",
        "dtype",
        "shape",
        "producer",
        "_uses",
        "const",
        "graph",
        "type_proto",
        "doc_string",
        "keep_info",
        "metadata_props",
        "non_tensor",
    )

    def __init__(
        self,
        name: str,
        dtype: int | None = None,
        shape: tuple[Dim, ...] | None = None,
        const: Tensor | None = None,
    ):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.producer: Node | None = None
        self._uses: dict[tuple[Node, int], None] = {}
        self.const = const
        self.graph: Graph | None = None
        # The declared TypeProto, kept verbatim for graph inputs/outputs and value_info.
        self.type_proto: onnx.TypeProto | None = None
        self.doc_string = ""
        # True when the source model declared value_info for it: the exporter writes it back.
        self.keep_info = False
        self.metadata_props: list[tuple[str, str]] = []
        # True when the value is known to be a sequence, map or optional (not a tensor).
        self.non_tensor = False
        if const is not None:
            self.dtype = const.dtype
            self.shape = const.shape

    def __repr__(self) -> str:
        return f"Value({self.name!r})"

    def uses(self) -> list[tuple[Node, int]]:
        """A snapshot of (node, input_index) pairs reading this value."""
        return list(self._uses)

    def users(self) -> list[Node]:
        """Distinct nodes that read this value, in first-use order."""
        return list(dict.fromkeys(n for n, _ in self._uses))

    @property
    def is_constant(self) -> bool:
        return self.const is not None

    @property
    def is_graph_input(self) -> bool:
        return self.graph is not None and self.producer is None and self.const is None

    @property
    def is_graph_output(self) -> bool:
        return self.graph is not None and any(v is self for v in self.graph.outputs)

    @property
    def tensor(self) -> Tensor:
        """The constant's data; IRError for a value that is no constant."""
        if self.const is None:
            raise IRError(f"value {self.name!r} is not a constant")
        return self.const

    def numpy(self) -> np.ndarray:
        return self.tensor.numpy()

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dimension is a known integer, else None."""
        if self.shape is None:
            return None
        dims = tuple(d for d in self.shape if isinstance(d, int))
        return dims if len(dims) == len(self.shape) else None


class Node:
    """An operator application. Inputs and outputs are Values (None for an omitted optional)."""

    __slots__ = (
        "op_type",
        "domain",
        "name",
        "attributes",
        "_inputs",
        "_outputs",
        "graph",
        "doc_string",
        "overload",
        "metadata_props",
        "_prev",
        "_next",
    )

    def __init__(
        self,
        op_type: str,
        inputs: Iterable[Value | None] = (),
        outputs: Iterable[Value | None] = (),
        *,
        domain: str = "",
        name: str = "",
        attributes: dict[str, Any] | None = None,
    ):
        self.op_type = op_type
        self.domain = domain
        self.name = name
        # name -> AttributeProto, Graph (GRAPH attribute) or list[Graph] (GRAPHS attribute)
        self.attributes: dict[str, Any] = {}
        self._inputs: list[Value | None] = []
        self._outputs: list[Value | None] = []
        self.graph: Graph | None = None
        self.doc_string = ""
        self.overload = ""
        self.metadata_props: list[tuple[str, str]] = []
        self._prev: Node | None = None
        self._next: Node | None = None
        for key, val in (attributes or {}).items():
            self.set_attr(key, val)
        for v in inputs:
            self.append_input(v)
        for v in outputs:
            self._append_output(v)

    def __repr__(self) -> str:
        return f"Node({self.op_type}, {self.name!r})"

    # -- inputs and outputs -------------------------------------------------------------------

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple[Value | None, ...]:
        return tuple(self._outputs)

    @property
    def output(self) -> Value:
        """The first output (most ops have one)."""
        out = self._outputs[0]
        assert out is not None
        return out

    def out(self, i: int) -> Value:
        """Output `i`, which must be there (a node a pass made, or an output a check saw)."""
        value = self._outputs[i] if i < len(self._outputs) else None
        if value is None:
            raise IRError(f"{self!r} has no output {i}")
        return value

    def input(self, i: int) -> Value | None:
        return self._inputs[i] if i < len(self._inputs) else None

    def append_input(self, value: Value | None) -> None:
        self._inputs.append(value)
        if value is not None:
            value._uses[(self, len(self._inputs) - 1)] = None

    def set_input(self, i: int, value: Value | None) -> None:
        old = self._inputs[i]
        if old is not None:
            old._uses.pop((self, i), None)
        self._inputs[i] = value
        if value is not None:
            value._uses[(self, i)] = None

    def replace_inputs(self, values: Iterable[Value | None]) -> None:
        self.clear_inputs()
        for v in values:
            self.append_input(v)

    def clear_inputs(self) -> None:
        for i, old in enumerate(self._inputs):
            if old is not None:
                old._uses.pop((self, i), None)
        self._inputs = []

    def _append_output(self, value: Value | None) -> None:
        if value is not None:
            if value.producer is not None and value.producer is not self:
                raise IRError(f"{value!r} already has a producer {value.producer!r}")
            value.producer = self
        self._outputs.append(value)

    # -- attributes ---------------------------------------------------------------------------

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute as a Python value (ints, floats, strings, arrays for tensors)."""
        a = self.attributes.get(name)
        if a is None:
            return default
        if not isinstance(a, AttributeProto):
            return a
        if a.type == AttributeProto.TENSOR:
            return onnx.numpy_helper.to_array(a.t)
        val = onnx.helper.get_attribute_value(a)
        if isinstance(val, bytes):
            return val.decode("utf-8")
        if isinstance(val, list) and val and isinstance(val[0], bytes):
            return [s.decode("utf-8") for s in val]
        return val

    def set_attr(self, name: str, value: Any) -> None:
        if isinstance(value, AttributeProto):
            self.attributes[name] = value
        elif isinstance(value, Graph) or (
            isinstance(value, list) and value and isinstance(value[0], Graph)
        ):
            self.attributes[name] = value
            for g in [value] if isinstance(value, Graph) else value:
                g.owner = self
        else:
            if isinstance(value, np.ndarray):
                value = onnx.numpy_helper.from_array(value)
            self.attributes[name] = onnx.helper.make_attribute(name, value)

    def subgraphs(self) -> list[Graph]:
        out: list[Graph] = []
        for a in self.attributes.values():
            if isinstance(a, Graph):
                out.append(a)
            elif isinstance(a, list):
                out.extend(a)
        return out

    @property
    def is_standard(self) -> bool:
        return self.domain in STANDARD_DOMAINS

    def owning_graph(self) -> Graph:
        """The graph holding the node (a rewrite's node always has one); IRError if none."""
        if self.graph is None:
            raise IRError(f"{self!r} is not in a graph")
        return self.graph


class Graph:
    """A graph (or subgraph): inputs, constants, nodes in topological order, outputs."""

    def __init__(self, name: str = "", model: Model | None = None):
        self.name = name
        self.doc_string = ""
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self.owner: Node | None = None  # the node whose attribute this subgraph is
        self._model = model
        self._root = Node("__root__")
        self._root._prev = self._root._next = self._root
        self._len = 0
        self.metadata_props: list[tuple[str, str]] = []
        # Declared value_info for values not produced in this graph (rare, kept verbatim).
        self.extra_value_info: list[onnx.ValueInfoProto] = []
        # Sparse initializers: each is also a constant in `initializers` (its dense value, read
        # by passes like any other); the exporter writes the sparse proto back while that
        # constant is still the one imported from it.
        self.sparse_initializers: list[tuple[onnx.SparseTensorProto, Value]] = []
        # Graph input name -> its default value (IR >= 4: an initializer that is also listed as
        # a graph input is a default the caller may override). The input stays an input for
        # every pass; the exporter writes the default back as an initializer.
        self.input_defaults: dict[str, Value] = {}

    # -- model and names ----------------------------------------------------------------------

    @property
    def model(self) -> Model | None:
        g: Graph | None = self
        while g is not None:
            if g._model is not None:
                return g._model
            g = g.owner.graph if g.owner is not None else None
        return None

    @property
    def parent(self) -> Graph | None:
        return self.owner.graph if self.owner is not None else None

    def fresh_name(self, base: str) -> str:
        return self.owning_model().fresh_name(base)

    def owning_model(self) -> Model:
        """The model holding the graph; IRError when it is attached to none."""
        model = self.model
        if model is None:
            raise IRError("graph is not attached to a model")
        return model

    def ensure_opset(self, domain: str, version: int = 1) -> None:
        """Import `domain` into the model (at `version`, unless it imports it already): what
        a rewrite that writes an op of that domain calls."""
        self.owning_model().opset_imports.setdefault(domain, version)

    # -- node list ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Node]:
        node = self._root._next
        while node is not None and node is not self._root:  # the ring holds no None
            nxt = node._next
            yield node
            node = nxt

    @property
    def nodes(self) -> list[Node]:
        return list(self)

    def _link_after(self, anchor: Node, node: Node) -> None:
        if node.graph is not None:
            raise IRError(f"{node!r} already belongs to a graph")
        node.graph = self
        after = _linked(anchor._next)
        node._prev, node._next = anchor, after
        after._prev = node
        anchor._next = node
        self._len += 1
        model = self.model
        if model is not None:
            model.claim_node(node)
            for out in node._outputs:
                if out is not None:
                    out.graph = self
                    model.claim_value(out)

    def append(self, node: Node) -> Node:
        self._link_after(_linked(self._root._prev), node)
        return node

    def insert_before(self, anchor: Node, nodes: Node | Iterable[Node]) -> None:
        for n in [nodes] if isinstance(nodes, Node) else list(nodes):
            self._link_after(_linked(anchor._prev), n)

    def insert_after(self, anchor: Node, nodes: Node | Iterable[Node]) -> None:
        for n in reversed([nodes] if isinstance(nodes, Node) else list(nodes)):
            self._link_after(anchor, n)

    def remove(self, node: Node) -> None:
        """Unlink a node whose outputs nobody reads; refuses otherwise."""
        if node.graph is not self:
            raise IRError(f"{node!r} is not in this graph")
        for out in node._outputs:
            if out is None:
                continue
            if out._uses:
                users = ", ".join(repr(n) for n in out.users()[:3])
                raise IRError(f"cannot remove {node!r}: {out.name!r} is still read by {users}")
            if out.is_graph_output:
                raise IRError(f"cannot remove {node!r}: {out.name!r} is a graph output")
        node.clear_inputs()
        for sub in node.subgraphs():
            _release_subgraph(sub, self.model)
        before, after = _linked(node._prev), _linked(node._next)
        before._next, after._prev = after, before
        node._prev = node._next = None
        node.graph = None
        self._len -= 1
        model = self.model
        if model is not None:
            model.release_node(node)
            for out in node._outputs:
                if out is not None:
                    model.release_value(out)
                    out.producer = None
                    out.graph = None

    # -- values -------------------------------------------------------------------------------

    def add_input(self, value: Value) -> Value:
        self._own(value)
        self.inputs.append(value)
        return value

    def add_initializer(self, value: Value) -> Value:
        if value.const is None:
            raise IRError(f"{value!r} has no constant data")
        self._own(value)
        self.initializers[value.name] = value
        return value

    def _own(self, value: Value) -> None:
        value.graph = self
        model = self.model
        if model is not None:
            model.claim_value(value)

    def make_constant(self, array: np.ndarray | Tensor, base: str) -> Value:
        """A new initializer with a fresh name derived from `base`."""
        tensor = array if isinstance(array, Tensor) else Tensor(np.asarray(array))
        return self.add_initializer(Value(self.fresh_name(base), const=tensor))

    def remove_initializer(self, value: Value) -> None:
        if value._uses:
            raise IRError(f"cannot remove initializer {value.name!r}: still read")
        if any(v is value for v in self.outputs):
            raise IRError(f"cannot remove initializer {value.name!r}: it is a graph output")
        del self.initializers[value.name]
        model = self.model
        if model is not None:
            model.release_value(value)
        value.graph = None

    def make_node(
        self,
        op_type: str,
        inputs: Iterable[Value | None],
        num_outputs: int = 1,
        *,
        before: Node | None = None,
        domain: str = "",
        name: str | None = None,
        attributes: dict[str, Any] | None = None,
        output_names: Iterable[str] | None = None,
    ) -> Node:
        """Create a node with fresh output values, inserted before `before` (or appended)."""
        names = (
            list(output_names)
            if output_names is not None
            else [self.fresh_name(f"{name or op_type}_out") for _ in range(num_outputs)]
        )
        node = Node(
            op_type,
            inputs,
            [Value(n) for n in names],
            domain=domain,
            name=self.fresh_node_name(name or op_type),
            attributes=attributes,
        )
        if before is not None:
            self.insert_before(before, node)
        else:
            self.append(node)
        return node

    def fresh_node_name(self, base: str) -> str:
        model = self.model
        return model.fresh_node_name(base) if model is not None else base

    def replace_all_uses_with(self, old: Value, new: Value) -> None:
        """Every reader of `old` (in this graph, its subgraphs, and the graph outputs) reads `new`.

        A graph output keeps its name: when `old` is an output, `new` takes over the name if
        it is a plain node output of this graph; otherwise an Identity carries the name.
        """
        if old is new:
            return
        for node, i in old.uses():
            node.set_input(i, new)
        if not any(v is old for v in self.outputs):
            return
        model = self.model
        assert model is not None
        out_name = old.name
        model.rename_value(old, model.fresh_name(out_name + "_replaced"))
        if self.can_take_output_name(new):
            model.rename_value(new, out_name)
            carrier = new
        else:
            made = new.producer
            carrier = Value(out_name, new.dtype, new.shape)
            ident = Node("Identity", [new], [carrier], name=self.fresh_node_name("keep_output"))
            local = made is not None and made.graph is self
            self.insert_after(made if made is not None and local else self._root, ident)
        carrier.type_proto = old.type_proto
        _declared_shape(carrier)
        # what the model says of its output (doc_string, metadata) stays with the output
        carrier.doc_string, carrier.metadata_props = old.doc_string, list(old.metadata_props)
        self.outputs = [carrier if v is old else v for v in self.outputs]

    def can_take_output_name(self, value: Value) -> bool:
        """Whether `value` can become a graph output by taking the output's name.

        A node output or constant of this graph can; a graph input, a value that already is a
        graph output, or an outer-scope value cannot (replacing an output by one of those needs
        an Identity, so no-op eliminations must leave such an Identity alone).
        """
        if value.graph is not self or value.is_graph_output:
            return False
        return value.producer is not None or value.const is not None

    def lint(self) -> None:
        """Check every invariant; raises IRError naming the first one broken."""
        _lint_graph(self, set(), set())

    def all_nodes(self) -> Iterator[Node]:
        """Nodes of this graph and, recursively, of its subgraphs."""
        for node in self:
            yield node
            for sub in node.subgraphs():
                yield from sub.all_nodes()

    def toposort(self) -> None:
        """Reorder nodes topologically, stable with respect to the current order."""
        nodes = list(self)
        index = {n: i for i, n in enumerate(nodes)}
        deps: dict[Node, set[Node]] = {n: set() for n in nodes}
        for n in nodes:
            for v in _free_inputs(n):
                p = _local_producer(v, self)
                if p is not None and p is not n:
                    deps[n].add(p)
        order = _stable_kahn(nodes, deps, index)
        if order is None:
            raise cycle_error((d, n) for n, ds in deps.items() for d in ds)
        self._root._prev = self._root._next = self._root
        for n in nodes:
            n._prev = n._next = None
        for n in order:
            last = _linked(self._root._prev)
            n._prev, n._next = last, self._root
            last._next = n
            self._root._prev = n


def _linked(node: Node | None) -> Node:
    """A neighbour in a graph's ring of nodes (the root closes the ring: never None there)."""
    if node is None:
        raise IRError("a node is not linked into its graph")
    return node


def _release_subgraph(graph: Graph, model: Model | None) -> None:
    """Drop a removed node's subgraph: its uses of outer values and its names."""
    for node in graph.all_nodes():
        node.clear_inputs()
        if model is not None:
            model.release_node(node)
            for v in node.outputs:
                if v is not None:
                    model.release_value(v)
    if model is not None:
        for v in [*graph.inputs, *graph.initializers.values()]:
            model.release_value(v)


def _lint_graph(graph: Graph, visible: set[int], names: set[str]) -> None:
    defined = set(visible)

    def define(v: Value, what: str) -> None:
        if v.graph is not graph:
            raise IRError(f"{what} {v.name!r} is not owned by graph {graph.name!r}")
        if v.name in names:
            raise IRError(f"duplicate value name {v.name!r}")
        names.add(v.name)
        defined.add(id(v))

    for v in graph.inputs:
        if v.producer is not None or v.const is not None:
            raise IRError(f"graph input {v.name!r} has a producer or constant data")
        define(v, "graph input")
    for key, v in graph.initializers.items():
        if key != v.name or v.const is None:
            raise IRError(f"initializer {key!r} is inconsistent (name {v.name!r})")
        define(v, "initializer")
    prev = graph._root
    count = 0
    for node in graph:
        count += 1
        if node.graph is not graph or node._prev is not prev:
            raise IRError(f"{node!r} is not linked into graph {graph.name!r} correctly")
        prev = node
        for i, inp in enumerate(node._inputs):
            if inp is None:
                continue
            if id(inp) not in defined:
                raise IRError(f"{node!r} reads {inp.name!r} before it is defined (or never)")
            if (node, i) not in inp._uses:
                raise IRError(f"{inp.name!r} does not record its use by {node!r} at input {i}")
        for sub in node.subgraphs():
            if sub.owner is not node:
                raise IRError(f"subgraph {sub.name!r} of {node!r} has the wrong owner")
            _lint_graph(sub, defined, names)
        for out in node._outputs:
            if out is None:
                continue
            if out.producer is not node:
                raise IRError(f"output {out.name!r} of {node!r} names another producer")
            define(out, "node output")
    if count != graph._len:
        raise IRError(f"graph {graph.name!r} node count is out of sync")
    for v in graph.outputs:
        if id(v) not in defined:
            raise IRError(f"graph output {v.name!r} is not defined")
    for node in graph:
        for out in node._outputs:
            if out is None:
                continue
            for user, i in out._uses:
                if user.graph is None or user.input(i) is not out:
                    raise IRError(f"{out.name!r} lists a stale use by {user!r}")


def _free_inputs(node: Node) -> Iterator[Value]:
    """Values a node reads: its inputs and the outer-scope values its subgraphs read."""
    for v in node._inputs:
        if v is not None:
            yield v
    for sub in node.subgraphs():
        for inner in sub.all_nodes():
            for v in inner._inputs:
                if v is not None:
                    yield v


def _local_producer(value: Value, graph: Graph) -> Node | None:
    """The node of `graph` that (directly or through a subgraph) produces `value`."""
    p = value.producer
    while p is not None and p.graph is not graph:
        g = p.graph
        if g is None or g.owner is None:
            return None
        p = g.owner
    return p


def cycle_in(edges: Iterable[tuple[Any, Any]]) -> list[Any]:
    """The nodes on one cycle of the directed graph `edges` (producer, reader), in cycle order;
    [] when it has none (`networkx.find_cycle`)."""
    import networkx as nx

    g = edges if isinstance(edges, nx.DiGraph) else nx.DiGraph(edges)
    try:
        return [edge[0] for edge in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return []


def node_label(node: Node) -> str:
    """A node as an error message names it: its name and op, or its op and first outputs."""
    if node.name:
        return f"{node.name!r} ({node.op_type})"
    outs = [v.name for v in node.outputs if v is not None][:2]
    return f"({node.op_type} -> {outs})"


def cycle_error(edges: Iterable[tuple[Node, Node]], where: str = "graph") -> IRError:
    """An IRError naming (up to three of) the nodes on one cycle of `edges`."""
    stuck = [node_label(n) for n in cycle_in(edges)][:3]
    return IRError(f"{where} has a cycle (involving {', '.join(stuck)})")


def _stable_kahn(nodes: list[K], deps: dict[K, set[K]], index: dict[K, int]) -> list[K] | None:
    import heapq

    remaining = {n: len(d) for n, d in deps.items()}
    users: dict[K, list[K]] = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    heap = [index[n] for n in nodes if remaining[n] == 0]
    heapq.heapify(heap)
    order: list[K] = []
    while heap:
        n = nodes[heapq.heappop(heap)]
        order.append(n)
        for u in users[n]:
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(heap, index[u])
    return order if len(order) == len(nodes) else None


class Model:
    """A model: the main graph plus everything else a ModelProto holds."""

    def __init__(self, graph: Graph | None = None):
        self.ir_version: int = int(onnx.IR_VERSION)
        self.opset_imports: dict[str, int] = {"": 17}
        self.producer_name = ""
        self.producer_version = ""
        self.domain = ""
        self.model_version = 0
        self.doc_string = ""
        self.metadata_props: list[tuple[str, str]] = []
        self.functions: list[onnx.FunctionProto] = []
        self.training_info: list[onnx.TrainingInfoProto] = []
        self.base_dir: Path | None = None
        # Initializers the source listed as graph inputs too (IR >= 4: overridable defaults),
        # whether kept as inputs or frozen into constants on import.
        self.overridable: list[str] = []
        self._values: dict[str, Value] = {}
        self._node_names: set[str] = set()
        self._counter = itertools.count()
        self.graph = graph if graph is not None else Graph("main", self)
        self.graph._model = self

    # -- name registry ------------------------------------------------------------------------

    def claim_value(self, value: Value) -> None:
        other = self._values.get(value.name)
        if other is not None and other is not value and other is not _PLACEHOLDER:
            raise IRError(f"duplicate value name {value.name!r}")
        if value.name:
            self._values[value.name] = value

    def release_value(self, value: Value) -> None:
        if self._values.get(value.name) is value:
            del self._values[value.name]

    def claim_node(self, node: Node) -> None:
        if node.name:
            self._node_names.add(node.name)

    def release_node(self, node: Node) -> None:
        self._node_names.discard(node.name)

    def value(self, name: str) -> Value | None:
        return self._values.get(name)

    def fresh_name(self, base: str) -> str:
        base = base or "v"
        if base not in self._values:
            self._values[base] = _PLACEHOLDER
            return base
        while True:
            cand = f"{base}__{next(self._counter)}"
            if cand not in self._values:
                self._values[cand] = _PLACEHOLDER
                return cand

    def fresh_node_name(self, base: str) -> str:
        while True:
            cand = f"{base}__{next(self._counter)}"
            if cand not in self._node_names:
                self._node_names.add(cand)
                return cand

    def rename_value(self, value: Value, new_name: str) -> None:
        if self._values.get(new_name) not in (None, _PLACEHOLDER, value):
            raise IRError(f"cannot rename {value.name!r}: {new_name!r} is taken")
        old_name = value.name
        if self._values.get(old_name) is value:
            del self._values[old_name]
        value.name = new_name
        self._values[new_name] = value
        g = value.graph
        if value.const is not None and g is not None and g.initializers.get(old_name) is value:
            g.initializers = {
                (new_name if k == old_name else k): v for k, v in g.initializers.items()
            }


_PLACEHOLDER = Value("__reserved__")


def _declared_shape(output: Value) -> None:
    """A graph output's shape as reading the written file gives it: the declared dims (the
    importer's `apply_type`), so that a second optimize of the result sees what this one saw."""
    tp = output.type_proto
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return
    output.shape = tuple(declared_dim(d) for d in tp.tensor_type.shape.dim)


# dim_params that name no symbol: paddle2onnx writes '?' on every dynamic axis, other exporters
# an empty string. Each such axis is unknown on its own (two '?' are not one symbol).
ANONYMOUS_DIM_PARAMS = frozenset({"", "?"})


def declared_dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """One declared dimension: an int, a symbol's name, or None where unknown (no value, a
    negative dim_value, which Paddle and TensorFlow exports write for a dynamic axis and
    onnxruntime reads as unknown, or an anonymous dim_param)."""
    if d.HasField("dim_value"):
        return int(d.dim_value) if d.dim_value >= 0 else None
    if d.HasField("dim_param") and d.dim_param not in ANONYMOUS_DIM_PARAMS:
        return d.dim_param
    return None
