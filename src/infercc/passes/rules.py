"""The rewrite-rule contract, and the driver that applies rules to a graph.

A rule is three things:

- `ops`: the op types it anchors on (None: every op), standard-domain nodes only unless
  `standard_only` is False;
- `check(node, ctx)`: looks at an anchor node and returns a match (any object the rewrite
  needs), `Refuse(reason)` when the rewrite would apply but must not fire (the reason is what
  `--explain` shows: "weight is shared with another Conv"), or None when the node is none of
  the rule's business. A check never changes the graph;
- `rewrite(node, match, ctx)`: makes the rewrite. It may return nodes it created that rules
  should visit next (an inlined subgraph's nodes), else None.

`apply_rules` walks each graph (and, by default, every subgraph) in topological order and
hands each node to the rules anchored on its op type, in the order given. A refusal is
recorded with `ctx.refuse` and the next rule is tried; a match is rewritten only if
`ctx.allow_rewrite(node)` agrees (bisection's limit), and then no further rule sees the node.
So every rule gets `--explain` and `validate --bisect` without calling either hook itself: one
rewrite is one match, named by its anchor node.

The counts: a rewrite adds one to `rule.name`, or to `match.key` when the match has one (a
rule whose rewrites come in kinds); `RuleRun.refused` lists the refusals made.

Example, a rule that drops `Neg(Neg(x))`:

    def _check(node, ctx):
        inner = producer(node.input(0), "Neg")
        if inner is None:
            return None
        if node.output.is_graph_output:
            return Refuse("output is a graph output")
        return inner.input(0)

    def _rewrite(node, x, ctx):
        node.graph.replace_all_uses_with(node.output, x)
        node.graph.remove(node)

    DOUBLE_NEG = Rule("double_neg", ("Neg",), _check, _rewrite)
    counts = apply_rules(graph, ctx, [DOUBLE_NEG]).counts
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from infercc.ir.graph import Graph, Node
from infercc.passes.manager import PassContext, graphs_of

Check = Callable[[Node, PassContext], Any]
Rewrite = Callable[[Node, Any, PassContext], "Iterable[Node] | None"]


@dataclass(frozen=True)
class Refuse:
    """What a check returns when the rewrite applies to the node but must not fire."""

    reason: str


@dataclass(frozen=True)
class Rule:
    """A rewrite rule (module docstring): anchors, a check and a rewrite."""

    name: str
    ops: Sequence[str] | None
    check: Check
    rewrite: Rewrite
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
    graph: Graph, ctx: PassContext, rules: Sequence[Rule], *, subgraphs: bool = True
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


def _visit(node: Node, rules: Iterator[Rule], ctx: PassContext, run: RuleRun) -> list[Node]:
    for rule in rules:
        outcome = rule.check(node, ctx)
        if outcome is None:
            continue
        if isinstance(outcome, Refuse):
            ctx.refuse(node, outcome.reason)
            run.refused.append((node, outcome.reason))
            continue
        if not ctx.allow_rewrite(node):
            return []
        created = rule.rewrite(node, outcome, ctx)
        run.counts[getattr(outcome, "key", None) or rule.name] += 1
        return list(created or ())
    return []


class _Dispatch:
    """The rules of each op type, in the order given (rules on every op included)."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = list(rules)
        self.by_op: dict[str, list[Rule]] = {}

    def for_op(self, op_type: str) -> list[Rule]:
        """The rules whose ops include `op_type` (their `anchors` still checks the domain)."""
        found = self.by_op.get(op_type)
        if found is None:
            found = [r for r in self.rules if r.ops is None or op_type in r.ops]
            self.by_op[op_type] = found
        return found
