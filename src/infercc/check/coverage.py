"""Which If/Loop/Scan bodies the validation inputs executed, and which of them a pass rewrote.

A rewrite inside a branch that the validation inputs never take is not validated: the outputs
agree whatever the branch computes. So validation reports, per body, whether it was
**rewritten** and whether it was **executed**, and `--strict-coverage` makes a rewritten body
that never ran a failure.

**Executed** is measured exactly, on an instrumented copy of the candidate that computes one
extra bool output per body, true when the body ran at least once:

- an `If` gets one more output per flag: its own branches' flags are constants (true in the
  branch itself, false in the other), and the flags of bodies nested in a branch are that
  branch's outputs (false from the other branch);
- a `Loop` or `Scan` gets one more loop-carried state per flag, false initially: its own body
  sets it true, and a nested body's flag is OR-ed into it on every iteration, so a body that
  never iterates leaves it false;
- the main graph gets the flags as outputs.

The extra outputs change no other value, so the instrumented copy runs in place of the
candidate (one run, not two). A body of another op (a custom op with a graph attribute, Scan
before opset 9) is reported with `executed` unknown.

**Rewritten** comes from the build where there is one: a body whose nodes, inputs, outputs,
attributes or constants differ after the passes from before them (compared on the IR, body by
body, before each pass, so the passes that changed it are named: `BodyTracker`). Without a
build record (`infercc validate`), a candidate body is rewritten when the reference has no
identical body (the same nodes, in order, with the same names, attributes and constants).

A body is named by its place: the owner node's index and name and the attribute, at each
level (`Loop 'scan_rows' body > If 'pick' then_branch`), the same in the IR after the passes
and in the exported model.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

from infercc.ir.graph import Graph, Model
from infercc.ir.ops import STANDARD_DOMAINS

logger = logging.getLogger(__name__)

Level = tuple[int, str, str]  # owner node index, owner node name, attribute (label)
Key = tuple[Level, ...]
_FLAG_PREFIX = "infercc_coverage_"


# --------------------------------------------------------------------------- report


@dataclass
class BodyCoverage:
    """One If/Loop/Scan body: whether a pass rewrote it and whether the inputs ran it."""

    path: str
    node: str
    op_type: str
    branch: str
    rewritten: bool | None  # None: unknown (no build record, no reference)
    passes: list[str]
    executed: bool | None  # None: not measured
    how: str  # what makes it run

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "node": self.node,
            "op_type": self.op_type,
            "branch": self.branch,
            "rewritten": self.rewritten,
            "passes": list(self.passes),
            "executed": self.executed,
            "how": self.how,
        }


@dataclass
class CoverageReport:
    """Every body of the candidate; `strict`: a rewritten body that did not run fails."""

    bodies: list[BodyCoverage] = field(default_factory=list)
    strict: bool = False
    error: str | None = None  # why execution could not be measured

    @property
    def unexecuted(self) -> list[BodyCoverage]:
        """Bodies rewritten (or not known to be untouched) that the inputs did not run."""
        return [b for b in self.bodies if b.rewritten is not False and b.executed is not True]

    @property
    def passed(self) -> bool:
        return not (self.strict and self.unexecuted)

    def message(self) -> str | None:
        """One line on what was not validated, naming the first body and how to reach it."""
        missed = self.unexecuted
        if not missed:
            return None
        first = missed[0]
        more = f" and {len(missed) - 1} more" if len(missed) > 1 else ""
        ran = "was not measured for" if first.executed is None else "never ran in"
        return (
            f"the validation inputs {ran} rewritten body {first.path}{more}, so its rewrites "
            f"are not validated: it {first.how}; give samples that reach it with --data DIR"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "strict": self.strict,
            "passed": self.passed,
            "error": self.error,
            "bodies": [b.to_dict() for b in self.bodies],
            "unexecuted": [b.path for b in self.unexecuted],
        }


# --------------------------------------------------------------------------- bodies in protos


@dataclass
class _ProtoBody:
    key: Key
    path: str
    owner: onnx.NodeProto
    label: str
    graph: onnx.GraphProto
    how: str


def proto_bodies(model: onnx.ModelProto) -> list[_ProtoBody]:
    """Every body of the model's graphs, parents before children."""
    producers = {o: n for n in _all_nodes(model.graph) for o in n.output}
    return list(_walk_proto(model.graph, (), "", producers))


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", g


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for _, g in _subgraphs(node):
            yield from _all_nodes(g)


def _walk_proto(
    graph: onnx.GraphProto, prefix: Key, path: str, producers: Mapping[str, onnx.NodeProto]
) -> Iterator[_ProtoBody]:
    for index, node in enumerate(graph.node):
        for label, g in _subgraphs(node):
            key = (*prefix, (index, node.name, label))
            here = f"{path} > " if path else ""
            here += f"{node.op_type} {node.name or '#' + str(index)!r} {label}"
            yield _ProtoBody(key, here, node, label, g, _how(node, label, producers))
            yield from _walk_proto(g, key, here, producers)


def _how(node: onnx.NodeProto, label: str, producers: Mapping[str, onnx.NodeProto]) -> str:
    """What makes the body run, in words."""

    def named(value: str) -> str:
        p = producers.get(value)
        if p is None:
            return repr(value)
        return f"{value!r} (from {p.op_type}{' ' + repr(p.name) if p.name else ''})"

    inputs = list(node.input)
    if node.op_type == "If" and inputs:
        return f"runs when {named(inputs[0])} is {'true' if label == 'then_branch' else 'false'}"
    if node.op_type == "Loop":
        parts = []
        if inputs and inputs[0]:
            parts.append(f"trip count {named(inputs[0])} > 0")
        if len(inputs) > 1 and inputs[1]:
            parts.append(f"{named(inputs[1])} is true")
        return "runs when " + " and ".join(parts) if parts else "runs on every call"
    if node.op_type == "Scan":
        count = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 1)
        scanned = inputs[len(inputs) - count] if inputs else "?"
        return f"runs when scan input {scanned!r} is not empty"
    return f"runs when {node.op_type} {node.name!r} calls it"


# --------------------------------------------------------------------------- instrumenting


class _Names:
    """Fresh value names that collide with none of the model's."""

    def __init__(self, model: onnx.ModelProto):
        taken: set[str] = set()
        for graph in _graphs(model.graph):
            taken.update(v.name for v in (*graph.input, *graph.output, *graph.value_info))
            taken.update(t.name for t in graph.initializer)
            for node in graph.node:
                taken.update(node.output)
        self.taken = taken
        self.counter = itertools.count()

    def fresh(self) -> str:
        while True:
            name = f"{_FLAG_PREFIX}{next(self.counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for _, g in _subgraphs(node):
            yield from _graphs(g)


def _flag_info(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.BOOL, [])


def _constant(names: _Names, value: bool) -> tuple[onnx.NodeProto, str]:
    out = names.fresh()
    tensor = helper.make_tensor(out + "_value", TensorProto.BOOL, [], [value])
    return helper.make_node("Constant", [], [out], value=tensor), out


@dataclass
class _Instrumenter:
    names: _Names
    opset: int
    measured: set[Key] = field(default_factory=set)

    def graph(self, graph: onnx.GraphProto, prefix: Key) -> list[tuple[Key, str]]:
        """Instrument `graph`'s nodes; the flags of every body under it, as values of it."""
        flags: list[tuple[Key, str]] = []
        nodes: list[onnx.NodeProto] = []
        for index, node in enumerate(list(graph.node)):
            if any(True for _ in _subgraphs(node)):
                nodes += self.node(node, (*prefix,), index, flags)
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        return flags

    def node(
        self, node: onnx.NodeProto, prefix: Key, index: int, flags: list[tuple[Key, str]]
    ) -> list[onnx.NodeProto]:
        """Instrument one node that owns bodies; returns the nodes to put before it."""
        if node.domain not in STANDARD_DOMAINS:
            return []
        if node.op_type == "If":
            flags += self._if(node, prefix, index)
            return []
        if node.op_type == "Loop":
            return self._carried(node, prefix, index, "body", flags, loop=True)
        if node.op_type == "Scan" and self.opset >= 9:
            return self._carried(node, prefix, index, "body", flags, loop=False)
        return []

    def _if(self, node: onnx.NodeProto, prefix: Key, index: int) -> list[tuple[Key, str]]:
        branches = {a.name: a.g for a in node.attribute if a.type == AttributeProto.GRAPH}
        if set(branches) != {"then_branch", "else_branch"}:
            return []
        entries: list[tuple[Key, str, str | None]] = []  # key, branch, value in that branch
        for label, g in branches.items():
            key = (*prefix, (index, node.name, label))
            self.measured.add(key)
            entries.append((key, label, None))
            entries += [(k, label, v) for k, v in self.graph(g, key)]
        found = []
        for key, side, value in entries:
            for label, g in branches.items():
                if label == side and value is not None:
                    g.output.append(_flag_info(value))
                    continue
                const, out = _constant(self.names, label == side)
                g.node.append(const)
                g.output.append(_flag_info(out))
            result = self.names.fresh()
            node.output.append(result)
            found.append((key, result))
        return found

    def _carried(
        self,
        node: onnx.NodeProto,
        prefix: Key,
        index: int,
        label: str,
        flags: list[tuple[Key, str]],
        loop: bool,
    ) -> list[onnx.NodeProto]:
        """A Loop's or Scan's body: one more loop-carried state per flag."""
        body = next((a.g for a in node.attribute if a.name == label), None)
        if body is None:
            return []
        key = (*prefix, (index, node.name, label))
        self.measured.add(key)
        entries: list[tuple[Key, str | None]] = [(key, None), *self.graph(body, key)]
        if loop:
            carried = len(node.input) - 2
            at_input, at_body_in, at_body_out, at_output = len(node.input), 2 + carried, 1, 0
            at_body_out += carried
            at_output += carried
        else:
            count = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
            carried = len(node.input) - count
            at_input = at_body_in = at_body_out = at_output = carried
        before: list[onnx.NodeProto] = []
        body_inputs, body_outputs = list(body.input), list(body.output)
        node_inputs, node_outputs = list(node.input), list(node.output)
        for offset, (flag_key, inner) in enumerate(entries):
            init_node, init = _constant(self.names, False)
            before.append(init_node)
            state_in, state_out, result = (self.names.fresh() for _ in range(3))
            if inner is None:
                update = helper.make_node("Identity", [_true(self.names, body)], [state_out])
            else:
                update = helper.make_node("Or", [state_in, inner], [state_out])
            body.node.append(update)
            node_inputs.insert(at_input + offset, init)
            body_inputs.insert(at_body_in + offset, _flag_info(state_in))
            body_outputs.insert(at_body_out + offset, _flag_info(state_out))
            node_outputs.insert(at_output + offset, result)
            flags.append((flag_key, result))
        _replace(body.input, body_inputs)
        _replace(body.output, body_outputs)
        del node.input[:]
        node.input.extend(node_inputs)
        del node.output[:]
        node.output.extend(node_outputs)
        return before


def _true(names: _Names, body: onnx.GraphProto) -> str:
    const, out = _constant(names, True)
    body.node.append(const)
    return out


def _replace(field_: Any, items: Sequence[onnx.ValueInfoProto]) -> None:
    copies = []
    for item in items:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(item)
        copies.append(copy)
    del field_[:]
    field_.extend(copies)


def instrument(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[Key, str]]:
    """A copy of `model` with one bool output per body it can measure (module docstring):
    the copy and body key -> output name."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    opset = next((o.version for o in copy.opset_import if o.domain in STANDARD_DOMAINS), 1)
    inst = _Instrumenter(_Names(copy), opset)
    flags = inst.graph(copy.graph, ())
    for _, name in flags:
        copy.graph.output.append(_flag_info(name))
    return copy, dict(flags)


def executed(flags: Mapping[Key, str], outputs: Sequence[Mapping[str, Any]]) -> dict[Key, bool]:
    """Key -> whether the body ran on any of the samples' outputs."""
    return {
        key: any(bool(np.asarray(out[name]).any()) for out in outputs if name in out)
        for key, name in flags.items()
    }


def strip(flags: Mapping[Key, str], outputs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    names = set(flags.values())
    return [{k: v for k, v in out.items() if k not in names} for out in outputs]


# --------------------------------------------------------------------------- rewritten: the IR


def _ir_bodies(graph: Graph, prefix: Key = ()) -> Iterator[tuple[Key, Any, Graph]]:
    for index, node in enumerate(graph):
        for attr, value in node.attributes.items():
            if isinstance(value, Graph):
                subs = [(attr, value)]
            elif isinstance(value, list) and value and isinstance(value[0], Graph):
                subs = [(f"{attr}[{i}]", g) for i, g in enumerate(value)]
            else:
                continue
            for label, g in subs:
                key = (*prefix, (index, node.name, label))
                yield key, node, g
                yield from _ir_bodies(g, key)


def _digest(graph: Graph, keep: dict[int, Any]) -> tuple:
    """What a body computes, as comparable data (constants by identity, kept alive)."""

    def ref(v: Any) -> tuple:
        if v is None:
            return ("",)
        if v.const is not None:
            keep[id(v.const)] = v.const
            return (v.name, id(v.const))
        return (v.name,)

    items: list[Any] = [tuple(ref(v) for v in graph.inputs)]
    items.append(tuple(ref(v) for v in graph.initializers.values()))
    for node in graph:
        attrs = []
        for name, a in node.attributes.items():
            if isinstance(a, Graph):
                attrs.append((name, _digest(a, keep)))
            elif isinstance(a, list) and a and isinstance(a[0], Graph):
                attrs.append((name, tuple(_digest(g, keep) for g in a)))
            else:
                attrs.append((name, a.SerializeToString()))
        ins = tuple(ref(v) for v in node.inputs)
        outs = tuple(v.name if v is not None else "" for v in node.outputs)
        items.append((node.op_type, node.domain, ins, outs, tuple(attrs)))
    items.append(tuple(ref(v) for v in graph.outputs))
    return tuple(items)


class BodyTracker:
    """Which pass changed which body of an IR model: the bodies' digests are taken before the
    passes and again before each pass (`before_pass`, the pass manager's `on_pass`); `finish`
    names the rewritten bodies of the result. A model without bodies costs nothing."""

    def __init__(self, model: Model):
        self.model = model
        self.keep: dict[int, Any] = {}  # graphs and constants compared by id, kept alive
        self.first = self._digests()
        self.last = self.first
        self.changed_by: dict[int, list[str]] = {}
        self.current: str | None = None

    def _digests(self) -> dict[int, tuple]:
        found = {}
        for _key, _node, g in _ir_bodies(self.model.graph):
            self.keep[id(g)] = g
            found[id(g)] = _digest(g, self.keep)
        return found

    def before_pass(self, name: str) -> None:
        self._close()
        self.current = name

    def _close(self) -> None:
        if self.current is None or not self.first:
            return  # no bodies before the passes: nothing to follow
        now = self._digests()
        for gid, digest in now.items():
            if self.last.get(gid) != digest:
                passes = self.changed_by.setdefault(gid, [])
                if self.current not in passes:
                    passes.append(self.current)
        self.last = now

    def finish(self) -> dict[Key, list[str]]:
        """Body key (in the model after the passes) -> the passes that changed it, in order;
        only rewritten bodies are listed (a body a pass created has no pass named when the
        model had no bodies before). The tracker lets go of the model after this."""
        self._close()
        self.current = None
        found: dict[Key, list[str]] = {}
        for key, _node, g in _ir_bodies(self.model.graph):
            gid = id(g)
            passes = self.changed_by.get(gid, [])
            if passes or gid not in self.first or self.first[gid] != _digest(g, self.keep):
                found[key] = list(passes)
        self.keep.clear()
        self.first = self.last = {}
        return found


# --------------------------------------------------------------------------- rewritten: protos


def _proto_digest(graph: onnx.GraphProto) -> str:
    h = hashlib.sha256()
    for node in graph.node:
        h.update(node.SerializeToString(deterministic=True))
    for t in graph.initializer:
        h.update(t.SerializeToString(deterministic=True))
    for v in (*graph.input, *graph.output):
        h.update(v.name.encode())
    return h.hexdigest()


def rewritten_against(
    reference: onnx.ModelProto, candidate: onnx.ModelProto
) -> dict[Key, list[str]]:
    """Candidate bodies the reference has no identical copy of (same nodes, in order, with the
    same inputs, outputs, attributes and constants), wherever the reference holds it."""
    originals = {_proto_digest(body.graph) for body in proto_bodies(reference)}
    return {
        body.key: []
        for body in proto_bodies(candidate)
        if _proto_digest(body.graph) not in originals
    }


# --------------------------------------------------------------------------- the report


def report(
    bodies: Sequence[_ProtoBody],
    ran: Mapping[Key, bool] | None,
    rewritten: Mapping[Key, Sequence[str]] | None,
    strict: bool,
    error: str | None = None,
) -> CoverageReport:
    """The coverage of `bodies`: `ran` from `executed` (None: not measured); `rewritten` as
    `rewritten_bodies` gives it (None: unknown)."""
    listed = []
    for b in bodies:
        passes = list((rewritten or {}).get(b.key, []))
        listed.append(
            BodyCoverage(
                path=b.path,
                node=b.owner.name,
                op_type=b.owner.op_type,
                branch=b.label,
                rewritten=None if rewritten is None else b.key in rewritten,
                passes=passes,
                executed=None if ran is None else ran.get(b.key),
                how=b.how,
            )
        )
    return CoverageReport(listed, strict, error)
