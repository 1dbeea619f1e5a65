"""The rewrite-rule contract, and the driver that applies rules to a graph.

A rule is three things:

- `ops`: the op types it anchors on (None: every op), standard-domain nodes only unless
  `standard_only` is False;
- `check(node, ctx)`: looks at an anchor node and returns the match, a value (a frozen
  dataclass, as a rule grows) carrying what the check proved for the rewrite: the values
  and constants it found, non-optional. A check says no in one way only, by raising
  `NoMatch`: `NoMatch(reason, at=node_or_value)` when the rewrite would apply but must not
  fire (the reason is what `--explain` shows, "weight is shared with another Conv", with
  `at`, the node or value where matching failed: the anchor when not given), a bare
  `NoMatch()` when the node is none of the rule's business (nothing to explain). `require`
  narrows an Optional the same way. A check never changes the graph;
- `rewrite(node, match, ctx)`: makes the rewrite. It may return nodes it created that rules
  should visit next (an inlined subgraph's nodes), else None.

`Rule` is generic in its match: `Rule[M]` takes a check returning M and a rewrite reading M,
so a rewrite never re-derives as Optional what its check proved.

`apply_rules` walks each graph (and, by default, every subgraph) in topological order and
hands each node to the rules anchored on its op type, in the order given. A refusal is
recorded with `ctx.refuse` and the next rule is tried; a match is rewritten only if
`ctx.allow_rewrite(node)` agrees (bisection's limit), and then no further rule sees the node.
So every rule gets `--explain` and `validate --bisect` without calling either hook itself: one
rewrite is one match, named by its anchor node.

The counts: a rewrite adds one to `rule.name`, or to `match.key` when the match has one (a
rule whose rewrites come in kinds); `RuleRun.refused` lists the refusals made.

Example, a rule that drops `Neg(Neg(x))`:

    def _check(node, ctx) -> Value:
        inner = require(producer(node.input(0), "Neg"))
        if node.output.is_graph_output:
            raise NoMatch("output is a graph output")
        return require(inner.input(0))

    def _rewrite(node, x: Value, ctx) -> None:
        graph = node.owning_graph()
        graph.replace_all_uses_with(node.output, x)
        graph.remove(node)

    DOUBLE_NEG = Rule("double_neg", ("Neg",), _check, _rewrite)
    counts = apply_rules(graph, ctx, [DOUBLE_NEG]).counts
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from infercc.ir.graph import Graph, Node, Value
from infercc.passes.manager import PassContext, graphs_of

M = TypeVar("M")
T = TypeVar("T")


class NoMatch(Exception):
    """What a check raises when its rule does not apply at the node (module docstring).

    `reason`: why the rewrite, which would apply, must not fire (`--explain` lists it); None
    when the node is none of the rule's business. `at`: the node or value where matching
    failed (None: the anchor)."""

    def __init__(self, reason: str | None = None, at: Node | Value | None = None) -> None:
        super().__init__(reason or "no match")
        self.reason = reason
        self.at = at


def require(found: T | None, reason: str | None = None, at: Node | Value | None = None) -> T:
    """`found`, or `NoMatch(reason, at)` when it is None: how a check narrows an Optional."""
    if found is None:
        raise NoMatch(reason, at)
    return found


@dataclass(frozen=True)
class Rule(Generic[M]):
    """A rewrite rule (module docstring): anchors, a check and a rewrite."""

    name: str
    ops: Sequence[str] | None
    check: Callable[[Node, PassContext], M]
    rewrite: Callable[[Node, M, PassContext], Iterable[Node] | None]
    standard_only: bool = True

    def anchors(self, node: Node) -> bool:
        if self.standard_only and not node.is_standard:
            return False
        return self.ops is None or node.op_type in self.ops


@dataclass
class RuleRun:
    """What `apply_rules` did: rewrites per counter, and the refusals made, in order."""

    counts: Counter[str] = field(default_factory=Counter)
    refused: list[tuple[Node, str]] = field(default_factory=list)


def apply_rules(
    graph: Graph, ctx: PassContext, rules: Sequence[Rule[Any]], *, subgraphs: bool = True
) -> RuleRun:
    """Apply `rules` to the nodes of `graph` (and of its subgraphs), see the module docstring."""
    run = RuleRun()
    table = _Dispatch(rules)
    for g in graphs_of(graph) if subgraphs else iter([graph]):
        work = deque(g.nodes)
        while work:
            node = work.popleft()
            if node.graph is not g:
                continue  # removed (or moved) by an earlier rewrite
            found = table.for_op(node.op_type)
            if not found:
                continue  # no rule anchors on this op: the common case, kept cheap
            created = _visit(node, (r for r in found if r.anchors(node)), ctx, run)
            work.extendleft(reversed(created))
    return run


def _visit(node: Node, rules: Iterator[Rule[Any]], ctx: PassContext, run: RuleRun) -> list[Node]:
    for rule in rules:
        try:
            found = rule.check(node, ctx)
        except NoMatch as no:
            if no.reason is not None:
                ctx.refuse(node, no.reason, at=no.at)
                run.refused.append((node, no.reason))
            continue
        if not ctx.allow_rewrite(node):
            return []
        created = rule.rewrite(node, found, ctx)
        run.counts[getattr(found, "key", None) or rule.name] += 1
        return list(created or ())
    return []


class _Dispatch:
    """The rules of each op type, in the order given (rules on every op included)."""

    def __init__(self, rules: Sequence[Rule[Any]]):
        self.rules = list(rules)
        self.by_op: dict[str, list[Rule[Any]]] = {}

    def for_op(self, op_type: str) -> list[Rule[Any]]:
        """The rules whose ops include `op_type` (their `anchors` still checks the domain)."""
        found = self.by_op.get(op_type)
        if found is None:
            found = [r for r in self.rules if r.ops is None or op_type in r.ops]
            self.by_op[op_type] = found
        return found
