"""The pass registry and the pipeline manager.

A pass is a function `(graph, ctx) -> PassResult`, registered by name. The manager runs the
pipeline in order, repeatedly, until no pass changes the graph (a fixpoint) or the step cap is
reached, then the `final` passes (reordering only: schedule-memory) once; it times each pass,
sums its statistics, re-infers shapes after a change, lints the graph after every pass under
`verify`, and names the pass in any error.

Bisection hooks (used by `infercc validate --bisect`): a pass that calls
`ctx.allow_rewrite(node)` before each rewrite gets its rewrites counted and can be cut off
after the first `ctx.rewrite_limits[name]` of them; any pass can be cut off after its first
`ctx.run_limits[name]` runs. Without limits both hooks change nothing. Rules applied by
`infercc.passes.rules` get both hooks from the driver.

What a pass reads is in `PassContext`: the facts every pass may read (target, backend,
portable) are its typed fields; the options (the shape profile, fp16 and int8 settings, ...)
are registered, each with its type and default, by the module of the pass that owns it
(`register_option`, as TVM registers pass-config keys), and read only by the passes that
declare them at registration (`register_pass(..., reads=...)`); reading an undeclared option
inside a pass raises, as asking an undeclared assumption does. A pass also
declares what it requires of the graph it is given and what it ensures of its result
(`CONDITIONS`, and `opset>=N` / `opset<=N`); the manager checks both under `verify`, where it
lints after every pass. What a pass finds that is not a count (memory peaks, the nodes kept
in float32, the quantization report) it returns in `PassResult.details`, which the manager
keeps per pass (`PipelineReport.details(name)`), merging the details of repeated runs when
they know how.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from infercc.errors import InferccError, PassError
from infercc.ir.graph import Graph, IRError, Model, Node, Value, node_label
from infercc.ir.shapes import infer_shapes
from infercc.passes.pipelines import OPTIMIZE

log = logging.getLogger(__name__)


@dataclass
class Refusal:
    """A rewrite that matched but did not fire, and why: at the anchor `node`, matching
    failed `at` a node or value (`where`'s label: the anchor's own when it failed there)."""

    pass_name: str
    node: str
    op_type: str
    reason: str
    at: str = ""

    def to_dict(self) -> dict[str, str]:
        return {
            "pass": self.pass_name,
            "node": self.node,
            "op": self.op_type,
            "reason": self.reason,
            "at": self.at,
        }


def where(at: Node | Value) -> str:
    """How a refusal names the node (`'name' (Op)`) or value (`tensor 'name'`) it failed at."""
    return node_label(at) if isinstance(at, Node) else f"tensor {at.name!r}"


SHARED = "shared"  # a fact every pass may read
OPTION = "option"  # read only by the passes that declare it: register_pass(..., reads=...)
ASSUMPTIONS = "assumptions"  # asked only through PassContext.stated / assumes
OPTIONS_FIELD = "options"  # read only through PassContext.option / PassOption.read


def _shared(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"kind": SHARED, "doc": doc})


T = TypeVar("T")


@dataclass(frozen=True)
class PassOption(Generic[T]):
    """An option of the pass context, registered by the module of the pass that reads it (as
    TVM registers a pass-config key with its type): its name, its type (`kind`, what a value
    set for it must be an instance of), what it is, its default and the module that owns it.
    A pass reads it with `OPTION.read(ctx)` (the typed form of `ctx.option(name)`), after
    declaring it with `register_pass(..., reads=(name,))`."""

    name: str
    kind: Any
    doc: str
    default: Callable[[], T]
    owner: str

    def read(self, ctx: PassContext) -> T:
        value: T = ctx.option(self.name)
        return value

    @property
    def type_name(self) -> str:
        """`int`, `QuantizeSettings | None`: the kind as one writes it."""
        args = getattr(self.kind, "__args__", None)
        if args is not None and getattr(self.kind, "__origin__", None) is None:  # a union
            return " | ".join("None" if a is type(None) else a.__name__ for a in args)
        return getattr(self.kind, "__name__", str(self.kind))


OPTIONS: dict[str, PassOption[Any]] = {}


def register_option(
    name: str,
    kind: Any,
    doc: str,
    default: Any = None,
    factory: Callable[[], Any] | None = None,
) -> PassOption[Any]:
    """Register context option `name` (called at the top of the module of the pass that reads
    it, before that pass's `register_pass`): a value set for it must be an instance of `kind`
    (a class, or a union such as `QuantizeSettings | None`); unset, it is `factory()` or
    `default`. Annotate the result where it is kept (`QUANTIZE: PassOption[QuantizeSettings |
    None] = register_option(...)`) so that `read` is typed."""
    caller = sys._getframe(1).f_globals.get("__name__", "?")
    known = OPTIONS.get(name)
    if known is not None and known.owner != caller:
        raise InferccError(
            f"context option {name!r} is registered twice ({known.owner} and {caller})",
            "an option has one owner: read it from there",
        )
    if name in _KINDS:
        raise InferccError(f"context option {name!r} would hide PassContext.{name}", "rename it")
    make = factory if factory is not None else (lambda: default)
    option: PassOption[Any] = PassOption(name, kind, doc, make, caller)
    OPTIONS[name] = option
    return option


@dataclass
class PassContext:
    """What passes may know about the job (target, inputs of the passes that need them) and a
    log of refusals and rewrites.

    The shared facts (`target`, `backend`, `portable`, `fused_ops_allowed`) every pass may read. The
    options (`options`: name -> value) are registered by the modules of the passes that read them
    (`register_option`, each with its type and default); a pass reads one (`OPTION.read(ctx)`) only
    when it declares it (`register_pass(..., reads=(name,))`), else the read raises, as does reading
    `options` directly. `verify` is the manager's. `assumptions`: what the user stated about the
    inputs (`infercc.assumptions`); a rewrite exact only under one asks `assumes(name)`, which
    records the use (`assumed`: assumption -> pass -> rewrites) for the report; one refused only
    for want of an unstated assumption says so with `wants(name, node)` (`wanted`, the report's
    hint). Every read of a shared fact or option inside a pass is recorded in `options_read`
    (pass -> names). `BuildConfig.pass_context` fills it for a build.
    """

    target: str = _shared("cpu", "the target rewrites are for ('cpu' for every CPU row)")
    backend: str = _shared("ort", "the runtime the output is for: ort, openvino or tensorrt")
    portable: bool = _shared(False, "standard ONNX only: no onnxruntime contrib op")
    options: dict[str, Any] = field(
        default_factory=dict, metadata={"kind": OPTIONS_FIELD, "doc": "the registered options set"}
    )
    verify: bool = False  # the manager's: lint and check declared conditions after every pass
    assumptions: frozenset[str] = field(
        default=frozenset(), metadata={"kind": ASSUMPTIONS, "doc": "the user's --assume"}
    )
    assumed: dict[str, dict[str, int]] = field(default_factory=dict)
    wanted: dict[str, dict[str, int]] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    current_pass: str = ""
    rewrite_limits: dict[str, int] = field(default_factory=dict)
    run_limits: dict[str, int] = field(default_factory=dict)
    rewrites: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    options_read: dict[str, set[str]] = field(default_factory=dict, repr=False, compare=False)
    _seen: set[tuple[str, str, str]] = field(default_factory=set)
    _wanted_at: set[tuple[str, str, str]] = field(default_factory=set)
    _reader: str = field(default="", repr=False, compare=False)  # the pass running, if any
    _undeclared: list[InferccError] = field(default_factory=list, repr=False, compare=False)

    if not TYPE_CHECKING:  # mypy keeps checking attribute names as usual

        def __getattribute__(self, name: str) -> Any:
            kind = _KINDS.get(name)
            if kind is not None:
                reader = object.__getattribute__(self, "_reader")
                if reader:
                    _check_read(self, reader, name, kind)
            return object.__getattribute__(self, name)

    def __post_init__(self) -> None:
        for name, value in self.options.items():
            _check_option(name, value)

    def option(self, name: str) -> Any:
        """The value of context option `name` (its default when unset). Inside a pass, only
        an option the pass declared (`register_pass(..., reads=...)`); the read is recorded
        in `options_read`. Passes read through the option's typed handle: `OPTION.read(ctx)`."""
        if name not in OPTIONS:
            _check_option(name, None)
        reader = self._reader
        if reader:
            _check_read(self, reader, name, OPTION)
        given = object.__getattribute__(self, "options")
        return given[name] if name in given else OPTIONS[name].default()

    def set_option(self, name: str, value: Any) -> None:
        """Set context option `name` (a registered `PassOption`; the value must be of its
        kind)."""
        _check_option(name, value)
        self.options[name] = value

    def refuse(self, node: Node, reason: str, at: Node | Value | None = None) -> None:
        """Record that a rewrite at `node` did not fire, matching having failed `at` a node or
        value (None: `node` itself); --explain shows both."""
        key = (self.current_pass, node.name or str(id(node)), reason)
        if key not in self._seen:
            self._seen.add(key)
            label = where(at if at is not None else node)
            self.refusals.append(Refusal(self.current_pass, node.name, node.op_type, reason, label))

    def allow_rewrite(self, node: Node) -> bool:
        """Ask before rewriting at `node`: False once the current pass has used up its
        `rewrite_limits` entry (bisection); else the rewrite is logged in `rewrites`."""
        done = self.rewrites.setdefault(self.current_pass, [])
        limit = self.rewrite_limits.get(self.current_pass)
        if limit is not None and len(done) >= limit:
            return False
        done.append((node.name, node.op_type))
        return True

    def stated(self, name: str) -> bool:
        """Whether the user stated assumption `name` (a question only a pass that declared
        it at registration may ask)."""
        info = REGISTRY.get(self.current_pass)
        if info is not None and name not in info.assumptions:
            raise _undeclared(
                self,
                f"pass {self.current_pass!r} reads assumption {name!r}, which it does not declare",
                f"register it with @register_pass({self.current_pass!r}, assumptions=({name!r},))",
            )
        return name in object.__getattribute__(self, "assumptions")

    def assumes(self, name: str) -> bool:
        """Whether the user stated assumption `name`; when so, the rewrite about to be made
        is counted as enabled by it (for the current pass)."""
        if not self.stated(name):
            return False
        per_pass = self.assumed.setdefault(name, {})
        per_pass[self.current_pass] = per_pass.get(self.current_pass, 0) + 1
        return True

    def wants(self, name: str, node: Node) -> None:
        """Record that the rewrite at `node` was refused only because the user did not state
        assumption `name` (`wanted`: assumption -> pass -> rewrites, each node counted once):
        what the report offers as a hint. A question only a pass that declared it may ask."""
        if self.stated(name):
            return
        key = (name, self.current_pass, node.name or str(id(node)))
        if key in self._wanted_at:
            return
        self._wanted_at.add(key)
        per_pass = self.wanted.setdefault(name, {})
        per_pass[self.current_pass] = per_pass.get(self.current_pass, 0) + 1

    def settled(self, name: str, node: Node) -> None:
        """A later rewrite removed `node` exactly without assumption `name`: an earlier
        pass's want of it at that node (`wants`) is withdrawn from the hint."""
        label = node.name or str(id(node))
        for key in [k for k in self._wanted_at if k[0] == name and k[2] == label]:
            self._wanted_at.discard(key)
            per_pass = self.wanted[name]
            per_pass[key[1]] -= 1
            if per_pass[key[1]] == 0:
                del per_pass[key[1]]
            if not per_pass:
                del self.wanted[name]

    @property
    def fused_ops_allowed(self) -> bool:
        """True when the output may use onnxruntime's contrib ops (com.microsoft)."""
        return not self.portable and self.backend == "ort"


@dataclass
class PassResult:
    """What one run of a pass did: whether it changed the graph, counts (summed over runs by
    the manager), and `details` that are not counts (an object; when it has a
    `merged(later)` method, the manager merges the details of successive runs with it, else
    the last run's stand)."""

    changed: bool
    stats: dict[str, int] = field(default_factory=dict)
    details: Any = None


PassFn = Callable[[Graph, PassContext], PassResult]

_KINDS: dict[str, str] = {f.name: f.metadata["kind"] for f in fields(PassContext) if f.metadata}
_KINDS["fused_ops_allowed"] = SHARED


def option_fields() -> list[dict[str, Any]]:
    """The shared facts of `PassContext` and the options the passes registered: name, kind,
    type, what it is, and (an option) the module that owns it."""
    shared = [
        {"name": f.name, "kind": SHARED, "type": str(f.type), "doc": f.metadata["doc"]}
        for f in fields(PassContext)
        if f.metadata.get("kind") == SHARED
    ]
    return shared + [
        {"name": o.name, "kind": OPTION, "type": o.type_name, "doc": o.doc, "owner": o.owner}
        for o in OPTIONS.values()
    ]


def _check_option(name: str, value: Any) -> None:
    """Raise InferccError for an unregistered option name or a value not of its kind."""
    option = OPTIONS.get(name)
    if option is None:
        raise InferccError(
            f"{name!r} is no pass context option",
            "options (registered by their passes): " + ", ".join(sorted(OPTIONS)),
        )
    kind = getattr(option.kind, "__origin__", option.kind)  # Mapping[str, X] -> Mapping
    if value is not None and not isinstance(value, kind):
        raise InferccError(
            f"context option {name!r} takes {option.type_name}, not {type(value).__name__}",
            f"see {option.owner}",
        )


def _check_read(ctx: PassContext, reader: str, name: str, kind: str) -> None:
    """Inside pass `reader`: record its read of `name`, and refuse an undeclared option or a
    direct read of the assumptions."""
    read = object.__getattribute__(ctx, "options_read")
    read.setdefault(reader, set()).add(name)
    info = REGISTRY.get(reader)
    if kind == OPTION and info is not None and name not in info.reads:
        raise _undeclared(
            ctx,
            f"pass {reader!r} reads option {name!r} of its context, which it does not declare",
            f"register it with @register_pass({reader!r}, reads=({name!r},))",
        )
    if kind == OPTIONS_FIELD:
        raise _undeclared(
            ctx,
            f"pass {reader!r} reads the context's options directly",
            "read an option through its handle (OPTION.read(ctx)), and declare it with "
            f"@register_pass({reader!r}, reads=(name,))",
        )
    if kind == ASSUMPTIONS:
        raise _undeclared(
            ctx,
            f"pass {reader!r} reads the assumptions directly",
            "ask ctx.stated(name) or ctx.assumes(name), and declare the assumption with "
            f"@register_pass({reader!r}, assumptions=(name,))",
        )


def _undeclared(ctx: PassContext, message: str, hint: str) -> InferccError:
    """The error of an undeclared read, also kept on the context: the manager raises it after
    the pass returns even where the pass caught it (a pass may catch InferccError)."""
    error = InferccError(message, hint)
    object.__getattribute__(ctx, "_undeclared").append(error)
    return error


@dataclass(frozen=True)
class Condition:
    """A fact about a graph a pass may require or ensure; `check` says what breaks it (None:
    it holds). Checked by the manager under `verify`."""

    name: str
    doc: str
    check: Callable[[Model], str | None]


def _lint(model: Model) -> str | None:
    model.graph.lint()  # raises IRError: the manager's "broke the graph" error
    return None


def _dead_node(model: Model) -> str | None:
    for graph in graphs_of(model.graph):
        outputs = {id(v) for v in graph.outputs}
        for node in graph:
            if not any(v is not None and (v._uses or id(v) in outputs) for v in node.outputs):
                return f"{node_label(node)} has no output anything reads"
    return None


CONDITIONS: dict[str, Condition] = {
    c.name: c
    for c in (
        Condition("lint", "the IR's invariants hold (Graph.lint); every pass ensures it", _lint),
        Condition(
            "no-dead-nodes",
            "every node has an output read by a node, a subgraph or a graph output",
            _dead_node,
        ),
    )
}
_OPSET = re.compile(r"^opset(>=|<=)(\d+)$")
ALWAYS_ENSURED = ("lint",)


def condition(name: str) -> Condition:
    """The condition `name`: one of `CONDITIONS`, or `opset>=N` / `opset<=N` (the default
    domain's opset import)."""
    if name in CONDITIONS:
        return CONDITIONS[name]
    m = _OPSET.match(name)
    if m is None:
        raise InferccError(
            f"unknown pass condition {name!r}",
            "known: " + ", ".join([*CONDITIONS, "opset>=N", "opset<=N"]),
        )
    op, bound = m.group(1), int(m.group(2))

    def check(model: Model) -> str | None:
        version = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        ok = version is not None and (version >= bound if op == ">=" else version <= bound)
        return None if ok else f"the model has opset {version}"

    return Condition(name, f"the default domain's opset is {op} {bound}", check)


@dataclass
class PassInfo:
    name: str
    fn: PassFn
    doc: str
    final: bool = False  # runs once after the fixpoint: it only reorders, shapes stay valid
    once: bool = False  # runs in the first round only: its rewrite would apply to its result
    assumptions: tuple[str, ...] = ()  # the assumptions (`infercc.assumptions`) it may use
    reads: tuple[str, ...] = ()  # the PassContext options it reads (beyond the shared facts)
    requires: tuple[str, ...] = ()  # conditions of the graph it is given
    ensures: tuple[str, ...] = ALWAYS_ENSURED  # conditions of the graph it leaves


REGISTRY: dict[str, PassInfo] = {}


def register_pass(
    name: str,
    *,
    final: bool = False,
    once: bool = False,
    assumptions: tuple[str, ...] = (),
    reads: tuple[str, ...] = (),
    requires: tuple[str, ...] = (),
    ensures: tuple[str, ...] = (),
) -> Callable[[PassFn], PassFn]:
    """Register a pass. `final`: a pass that only reorders nodes (no value, type or shape
    changes, nothing another pass could act on) runs once, after the others reach their
    fixpoint, and its change neither re-infers shapes nor starts another round. `once`: a
    pass that runs in the first round only (a rewrite driven by measurements of the graph it
    was given, which would apply again to its own result). `assumptions`: the user's
    assumptions the pass may read (`PassContext.stated` / `assumes` refuse any other), from
    which `--assume`'s "has no effect" rule and the catalogue are derived. `reads`: the
    `PassContext` options it reads (reading another raises while it runs). `requires` /
    `ensures`: conditions (`condition`) of the graph before / after it, checked under
    `verify`; every pass ensures `lint`."""
    unknown = [n for n in reads if n not in OPTIONS]
    if unknown:
        raise InferccError(
            f"pass {name!r} declares it reads {unknown[0]!r}, which is no registered context "
            "option",
            "register it first, in the pass's module: register_option(name, type, doc, default)"
            "; registered: " + ", ".join(OPTIONS),
        )
    for cond in (*requires, *ensures):
        condition(cond)

    def deco(fn: PassFn) -> PassFn:
        doc = _summary(fn.__doc__)
        REGISTRY[name] = PassInfo(
            name,
            fn,
            doc,
            final,
            once,
            tuple(assumptions),
            tuple(reads),
            tuple(requires),
            tuple(dict.fromkeys([*ALWAYS_ENSURED, *ensures])),
        )
        return fn

    return deco


def _summary(doc: str | None) -> str:
    """A pass's description: its docstring's first paragraph on one line (a first line alone
    may stop mid-sentence)."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split())


DEFAULT_PIPELINE = OPTIMIZE.passes  # every pipeline is named in infercc.passes.pipelines


@dataclass
class PassStats:
    runs: int = 0
    changed: int = 0
    time_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    details: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "changed": self.changed,
            "time_s": round(self.time_s, 6),
            **self.counts,
        }

    def add(self, later: PassStats) -> None:
        """Fold in the stats of the same pass run in a later stage: runs, changes, time and
        counts summed; the later details (what it last returned) kept when it has some."""
        self.runs += later.runs
        self.changed += later.changed
        self.time_s += later.time_s
        for key, value in later.counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        if later.details is not None:
            self.details = later.details


@dataclass
class PipelineReport:
    passes: dict[str, PassStats]
    iterations: int
    reached_fixpoint: bool
    refusals: list[Refusal]

    def details(self, name: str) -> Any:
        """What pass `name` returned beyond counts (merged over its runs), or None."""
        st = self.passes.get(name)
        return None if st is None else st.details

    def add_stage(self, later: PipelineReport) -> None:
        """Fold in a later stage of the same build: a pass that ran in both has its counts
        summed over both (`PassStats.add`), as over the runs within one stage."""
        for name, stats in later.passes.items():
            if name in self.passes:
                self.passes[name].add(stats)
            else:
                self.passes[name] = stats


def check_pass_names(names: Iterable[str]) -> None:
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise InferccError(
            f"unknown pass {unknown[0]!r}",
            "known passes: " + ", ".join(sorted(REGISTRY)),
        )


def run_passes(
    model: Model,
    ctx: PassContext | None = None,
    pipeline: Iterable[str] = DEFAULT_PIPELINE,
    disabled: Iterable[str] = (),
    max_iterations: int = 8,
    on_pass: Callable[[str], None] | None = None,
) -> PipelineReport:
    """Run the pipeline to a fixpoint (or `max_iterations` rounds)."""
    ctx = ctx or PassContext()
    pipeline = list(pipeline)
    disabled = set(disabled)
    check_pass_names([*pipeline, *disabled])
    stats = {name: PassStats() for name in pipeline if name not in disabled}
    rounds = [name for name in stats if not REGISTRY[name].final]
    finals = [name for name in stats if REGISTRY[name].final]
    infer_shapes(model)
    iterations = 0
    fixpoint = False
    while iterations < max_iterations:
        iterations += 1
        changed_round = False
        for name in rounds:
            if stats[name].runs >= ctx.run_limits.get(name, max_iterations):
                continue
            if REGISTRY[name].once and iterations > 1:
                continue
            if on_pass is not None:
                on_pass(name)
            result = _run_one(name, model, ctx, stats[name])
            if result.changed:
                changed_round = True
                infer_shapes(model)
        if not changed_round:
            fixpoint = True
            break
    for name in finals:
        if ctx.run_limits.get(name, 1) < 1:
            continue
        if on_pass is not None:
            on_pass(name)
        _run_one(name, model, ctx, stats[name])
    return PipelineReport(stats, iterations, fixpoint, ctx.refusals)


def _run_one(name: str, model: Model, ctx: PassContext, st: PassStats) -> PassResult:
    info = REGISTRY[name]
    ctx.current_pass = name
    t0 = time.perf_counter()
    outer = ctx._reader
    try:
        if ctx.verify:
            _check_conditions(name, model, info.requires, "requires")
        ctx._reader = name  # reads of undeclared options raise while the pass runs
        try:
            result = info.fn(model.graph, ctx)
        finally:
            ctx._reader = outer
        if ctx._undeclared:
            first = ctx._undeclared[0]
            ctx._undeclared.clear()
            raise first
        if ctx.verify:
            _check_conditions(name, model, info.ensures, "did not ensure")
    except InferccError:
        raise
    except IRError as e:
        raise PassError(
            f"pass {name!r} broke the graph: {e}",
            f"this is a bug in infercc; rerun with --disable-pass {name} to skip it",
        ) from e
    except Exception as e:
        raise PassError(
            f"pass {name!r} failed: {type(e).__name__}: {e}",
            f"this is a bug in infercc; rerun with --disable-pass {name} to skip it",
        ) from e
    finally:
        st.time_s += time.perf_counter() - t0
    st.runs += 1
    st.changed += int(result.changed)
    for key, val in result.stats.items():
        st.counts[key] = st.counts.get(key, 0) + val
    if result.details is not None:
        merge = getattr(st.details, "merged", None)
        st.details = merge(result.details) if merge is not None else result.details
    log.debug("pass %s: changed=%s %s", name, result.changed, result.stats)
    return result


def _check_conditions(name: str, model: Model, conditions: Sequence[str], verb: str) -> None:
    """Raise PassError on the first of `conditions` the model breaks (`lint` raises IRError,
    which the manager reports as the pass having broken the graph)."""
    for cond in conditions:
        broken = condition(cond).check(model)
        if broken is not None:
            raise PassError(
                f"pass {name!r} {verb} {cond}: {broken}",
                f"this is a bug in infercc; rerun with --disable-pass {name} to skip it"
                if verb != "requires"
                else f"run a pipeline that gives it {cond}, or --disable-pass {name}",
                bad_input=verb == "requires",
            )


def graphs_of(graph: Graph) -> Iterator[Graph]:
    """The graph and every subgraph under it, parents first."""
    yield graph
    for node in list(graph):
        if not node.attributes:
            continue
        for sub in node.subgraphs():
            yield from graphs_of(sub)
