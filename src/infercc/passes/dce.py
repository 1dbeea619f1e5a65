"""eliminate-dead-code: remove what no graph output depends on.

Exact because ONNX operators are pure functions of their inputs: a node none of whose outputs
is read (directly, through a subgraph, or as a graph output) cannot change any output. The same
holds for initializers nobody reads, value_info of removed values (the exporter writes only live
values), model-local functions no node calls (directly, or from a function body, inside its
If/Loop/Scan subgraphs too), and opset imports of domains no node uses. The
default domain's import always stays; graph inputs stay (they are the model's interface).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import onnx

from infercc.ir.graph import Graph, Model
from infercc.ir.ops import STANDARD_DOMAINS
from infercc.passes.manager import PassContext, PassResult, graphs_of, register_pass


@register_pass("eliminate-dead-code", ensures=("no-dead-nodes",))
def eliminate_dead_code(graph: Graph, ctx: PassContext) -> PassResult:
    """Remove unused nodes, initializers, functions and opset imports."""
    nodes = sum(_dead_nodes(g) for g in graphs_of(graph))
    inits = sum(_dead_initializers(g) for g in graphs_of(graph))
    model = graph.model
    funcs = opsets = 0
    if model is not None and graph is model.graph:
        funcs = _dead_functions(model)
        opsets = _dead_opsets(model)
    stats = {"nodes": nodes, "initializers": inits, "functions": funcs, "opsets": opsets}
    return PassResult(changed=any(stats.values()), stats=stats)


def _dead_nodes(graph: Graph) -> int:
    outputs = {id(v) for v in graph.outputs}
    removed = 0
    for node in reversed(graph.nodes):
        live = any(v is not None and (v._uses or id(v) in outputs) for v in node.outputs)
        if not live:
            graph.remove(node)
            removed += 1
    return removed


def _dead_initializers(graph: Graph) -> int:
    outputs = {id(v) for v in graph.outputs}
    dead = [v for v in graph.initializers.values() if not v._uses and id(v) not in outputs]
    for v in dead:
        graph.remove_initializer(v)
    return len(dead)


def _used_ops(model: Model) -> set[tuple[str, str]]:
    """(domain, op) of every node that can run: in the graphs, and in the bodies of the
    functions they call, subgraphs (If/Loop/Scan bodies) of those bodies included."""
    used = {(n.domain, n.op_type) for n in model.graph.all_nodes()}
    by_key = {(f.domain, f.name): f for f in model.functions}
    todo = [k for k in used if k in by_key]
    while todo:
        for n in _proto_nodes(by_key[todo.pop()].node):
            key = (n.domain, n.op_type)
            if key not in used:
                used.add(key)
                if key in by_key:
                    todo.append(key)
    return used


def _proto_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """The nodes and, recursively, the nodes of their graph attributes."""
    for n in nodes:
        yield n
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                yield from _proto_nodes(g.node)


def _dead_functions(model: Model) -> int:
    used = _used_ops(model)
    keep = [f for f in model.functions if (f.domain, f.name) in used]
    removed = len(model.functions) - len(keep)
    model.functions = keep
    return removed


def _dead_opsets(model: Model) -> int:
    domains = {d for d, _ in _used_ops(model)} | {f.domain for f in model.functions}
    domains |= {o.domain for f in model.functions for o in f.opset_import}
    domains |= set(STANDARD_DOMAINS) & set(model.opset_imports)
    if "ai.onnx" in domains:
        domains.add("")
    dead = [d for d in model.opset_imports if d not in domains and d != ""]
    for d in dead:
        del model.opset_imports[d]
    return len(dead)
