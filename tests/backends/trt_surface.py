"""The TensorRT names infercc's code uses, read from its syntax tree, per TensorRT major.

`collect(sources)` walks every module of `infercc.backends.trt` (the backend included)
and returns the names used on TensorRT objects, each with the majors whose code path uses it,
plus the places it could not follow (`Problem`s, which the test treats as failures):

- TensorRT objects. The package never imports tensorrt: the module comes in as a parameter
  named `trt` (or from `import tensorrt` inside a function). Everything derived from it is a
  TensorRT object too: attributes and call results (`trt.Builder(logger)`, `builder.
  create_builder_config()`), locals assigned from them, loop variables over them, `self.` fields
  set from them, the parameters of package functions they are passed to (followed across
  modules, also through methods found by name), and the results of package functions that
  return them. Calls to builtins (`str`, `int`, `tuple`, `bytes`, ...) and to modules outside
  the package (numpy, json) give plain values.
- Uses. Every attribute read or written on a TensorRT object (`config.set_flag`,
  `trt.BuilderFlag.VERSION_COMPATIBLE`: `BuilderFlag`, `VERSION_COMPATIBLE`), every name given
  to `getattr`/`hasattr` on one, and the methods of classes deriving from a TensorRT class
  (TensorRT calls them: the calibrator's `get_batch`). Dunder names are left out.
- Names by string. A `getattr` name that is not a literal is followed to the strings it can
  hold: locals, loop variables, parameters (through every call site), module constants and
  their items (`_FLAG[requested]`, `HW_LEVELS.get(...)`), fields of package dataclasses read
  back from where they were constructed (`plan.builder_flags` from `PrecisionPlan(...)` in
  `precision.decide`). What cannot be followed is a Problem.
- Majors. A use counts for every supported major, unless it sits in a function marked
  `@tensorrt_majors(...)` (or nested in one), or its string comes from a table declared
  `tensorrt_names(table, ...)`; names followed through a call site also take the caller's
  majors (see `infercc.backends.trt.versions`).
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infercc.backends.trt.versions import SUPPORTED_MAJORS

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
BACKENDS = SRC / "infercc" / "backends"
DATA = ROOT / "tests" / "data"
PACKAGE = "infercc.backends.trt"
# Builtins whose results are plain Python values, whatever they are given; getattr is not
# among them (an attribute of a TensorRT object is one).
_PLAIN = frozenset(dir(builtins)) - {"getattr"}
# Builtins that hand back (some of) what they are given.
_PASSING = frozenset(
    {
        "enumerate",
        "zip",
        "iter",
        "next",
        "reversed",
        "sorted",
        "list",
        "tuple",
        "set",
        "frozenset",
        "filter",
        "min",
        "max",
        "dict",
    }
)


def module_name(path: Path) -> str:
    rel = path.resolve().relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_sources() -> dict[str, str]:
    """module name -> source of every module that handles TensorRT objects."""
    paths = sorted((BACKENDS / "trt").rglob("*.py"))
    return {module_name(p): p.read_text() for p in paths}


# --------------------------------------------------------------------------- results


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


@dataclass(frozen=True)
class Span:
    """The TensorRT versions a use holds on: these majors, from release `since` on."""

    majors: frozenset[int] = frozenset(SUPPORTED_MAJORS)
    since: tuple[int, ...] = ()

    def __and__(self, other: Span) -> Span:
        return Span(self.majors & other.majors, max(self.since, other.since))

    def holds(self, version: str) -> bool:
        key = version_key(version)
        return key[0] in self.majors and key >= self.since

    def __str__(self) -> str:
        text = "/".join(map(str, sorted(self.majors))) or "none"
        return text + (f" from {'.'.join(map(str, self.since))}" if self.since else "")


ALL = Span()


def marked_span(call: ast.Call) -> Span:
    """The Span of a `tensorrt_majors(...)` / `tensorrt_names(table, ...)` mark."""
    args = call.args[1:] if _callee_name(call.func) == "tensorrt_names" else call.args
    majors = [int(a.value) for a in args if isinstance(a, ast.Constant)]
    since = next((k.value for k in call.keywords if k.arg == "since"), None)
    return Span(
        frozenset(majors) if majors else ALL.majors,
        version_key(since.value) if isinstance(since, ast.Constant) else (),
    )


@dataclass(frozen=True)
class Use:
    name: str
    span: Span
    where: str


@dataclass(frozen=True)
class Problem:
    where: str
    what: str


class Unresolved(Exception):
    pass


# --------------------------------------------------------------------------- the index


@dataclass
class Module:
    name: str
    tree: ast.Module
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    constants: dict[str, ast.expr] = field(default_factory=dict)
    functions: dict[str, Func] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


@dataclass
class Func:
    key: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    module: Module
    cls: str | None
    parent: Func | None
    span: Span
    params: list[str]
    defaults: dict[str, ast.expr]
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.module.name.rsplit('.', 1)[-1]}.py:{{line}} {self.key.split(':', 1)[1]}"

    def where(self, node: ast.AST) -> str:
        return self.label.format(line=getattr(node, "lineno", self.node.lineno))

    def local_names(self) -> set[str]:
        found = set(self.params)
        for node in _own_nodes(self.node):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
        return found


def _own_nodes(fn: ast.AST) -> Iterable[ast.AST]:
    """The nodes of a function's body, not those of functions or classes nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _decorator_majors(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Span | None:
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Call) and _callee_name(deco.func) == "tensorrt_majors":
            return marked_span(deco)
    return None


def _imports(nodes: Iterable[ast.AST]) -> dict[str, tuple[str, str | None]]:
    """name -> (module, symbol or None) of the import statements among `nodes`."""
    found: dict[str, tuple[str, str | None]] = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name] = (alias.name, None)
    return found


def _callee_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], dict[str, ast.expr]]:
    a = fn.args
    positional = [p.arg for p in [*a.posonlyargs, *a.args]]
    names = positional + [p.arg for p in a.kwonlyargs]
    defaults = dict(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d})
    return names, defaults


class Index:
    """Modules, functions (methods and nested ones included) and classes of the sources."""

    def __init__(self, sources: Mapping[str, str]):
        self.modules = {name: Module(name, ast.parse(text)) for name, text in sources.items()}
        self.funcs: dict[str, Func] = {}
        for module in self.modules.values():
            self._index_module(module)

    def _index_module(self, module: Module) -> None:
        module.imports.update(_imports(module.tree.body))
        for node in module.tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        module.constants[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is not None:
                    module.constants[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef):
                module.classes[node.name] = node
        self._index_body(module, module.tree.body, None, None, ALL, module.name + ":")

    def _index_body(self, module, body, cls, parent, span, prefix) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                own = _decorator_majors(node)
                mine = span & own if own is not None else span
                params, defaults = _params(node)
                key = prefix + node.name
                func = Func(key, node, module, cls, parent, mine, params, defaults)
                func.imports = dict(parent.imports) if parent else {}
                func.imports.update(_imports(_own_nodes(node)))
                self.funcs[key] = func
                if parent is None and cls is None:
                    module.functions[node.name] = func
                self._index_body(module, node.body, None, func, mine, key + ".")
            elif isinstance(node, ast.ClassDef):
                self._index_body(
                    module, node.body, node.name, parent, span, prefix + node.name + "."
                )
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
                self._index_body(module, getattr(node, "body", []), cls, parent, span, prefix)

    # -- lookups

    def module_alias(self, module: Module, name: str, func: Func | None = None) -> Module | None:
        """The package module an imported name stands for (`from .trt import caches`)."""
        imports = {**module.imports, **(func.imports if func else {})}
        if name not in imports:
            return None
        source, symbol = imports[name]
        full = f"{source}.{symbol}" if symbol else source
        return self.modules.get(full)

    def symbol(
        self, module: Module, name: str, func: Func | None = None
    ) -> tuple[Module, str] | None:
        """(defining module, name) for a name defined in or imported into `module` (or
        imported inside `func`)."""
        if func is not None and name in func.imports:
            source, symbol = func.imports[name]
            if symbol and source in self.modules:
                return self.symbol(self.modules[source], symbol)
        if name in module.functions or name in module.classes or name in module.constants:
            return module, name
        if name in module.imports:
            source, symbol = module.imports[name]
            if symbol and source in self.modules:
                return self.symbol(self.modules[source], symbol)
        return None

    def class_init(self, module: Module, cls: str) -> Func | None:
        return self.funcs.get(f"{module.name}:{cls}.__init__")

    def methods_named(self, name: str) -> list[Func]:
        return [f for f in self.funcs.values() if f.cls and f.node.name == name]

    def dataclass_fields(self, module: Module, cls: str) -> list[tuple[str, ast.expr | None]]:
        node = module.classes[cls]
        return [
            (s.target.id, s.value)
            for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        ]

    def outside_import(self, func: Func, name: str) -> str | None:
        """`infercc.x.f` when `name` is an infercc function imported from outside the sources."""
        imports = {**func.module.imports, **func.imports}
        if name in imports:
            source, symbol = imports[name]
            if source.startswith("infercc") and source not in self.modules and symbol:
                return f"{source}.{symbol}"
        return None


# --------------------------------------------------------------------------- the walk


OBJ, SEQ = "obj", "seq"
Kinds = dict[str, str]


def _merge(a: str | None, b: str | None) -> str | None:
    """The kind of something that may be either: a TensorRT object wins over a sequence."""
    return OBJ if OBJ in (a, b) else (a or b)


class Walker:
    """Taint from `trt` to a fixpoint, then the uses (see the module doc).

    Two kinds of tainted value: OBJ, a TensorRT object (its attributes are uses), and SEQ, a
    Python list or tuple holding such objects (its attributes are list methods; its items
    and loop variables are OBJ)."""

    def __init__(self, sources: Mapping[str, str]):
        self.index = Index(sources)
        self.tainted_params: dict[str, Kinds] = {k: {} for k in self.index.funcs}
        self.tainted_returns: Kinds = {}
        self.tainted_fields: dict[tuple[str, str], Kinds] = {}
        self.call_sites: dict[str, list[tuple[Func, ast.Call]]] = {}
        self.uses: list[Use] = []
        self.problems: list[Problem] = []
        self._changed = False

    # -- the fixpoint

    def run(self) -> Walker:
        self._collect_call_sites()
        self._changed = True
        while self._changed:
            self._changed = False
            for func in self.index.funcs.values():
                self._taint_function(func)
        for func in self.index.funcs.values():
            self._uses_in(func)
        return self

    def _collect_call_sites(self) -> None:
        for func in self.index.funcs.values():
            for node in _own_nodes(func.node):
                if isinstance(node, ast.Call):
                    for callee, _skip in self.callees(node, func):
                        self.call_sites.setdefault(callee.key, []).append((func, node))

    def _note(self, table: Kinds, key: str, kind: str | None) -> None:
        merged = _merge(table.get(key), kind)
        if kind is not None and merged != table.get(key):
            table[key] = merged  # type: ignore[assignment]
            self._changed = True

    def tainted_locals(self, func: Func) -> Kinds:
        """The names of a function bound to TensorRT objects or sequences of them."""
        found: Kinds = {p: OBJ for p in func.params if p == "trt"}
        found.update(self.tainted_params[func.key])
        if func.parent is not None:
            mine = func.local_names()
            found.update(
                {k: v for k, v in self.tainted_locals(func.parent).items() if k not in mine}
            )
        for _ in range(3):  # loops: a later assignment can feed an earlier use
            before = dict(found)
            for node in _own_nodes(func.node):
                self._bind(node, func, found)
            if found == before:
                break
        return found

    def _bind(self, node: ast.AST, func: Func, found: Kinds) -> None:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            kind = self.tainted(node.value, func, found)
            for target in targets:
                self._bind_target(target, func, found, kind)
        elif isinstance(node, ast.For | ast.comprehension):
            if self.tainted(node.iter, func, found):
                self._bind_target(node.target, func, found, OBJ)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            kind = self.tainted(node.context_expr, func, found)
            self._bind_target(node.optional_vars, func, found, kind)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tensorrt":
                    found[alias.asname or "tensorrt"] = OBJ
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tensorrt":
            found.update({alias.asname or alias.name: OBJ for alias in node.names})
        elif isinstance(node, ast.Call):
            # container.append(trt_object): the container holds TensorRT objects
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("append", "extend", "add", "insert"):
                if any(self.tainted(a, func, found) for a in node.args):
                    self._bind_target(f.value, func, found, SEQ)

    def _bind_target(self, target: ast.expr, func: Func, found: Kinds, kind: str | None) -> None:
        if kind is None:
            return
        if isinstance(target, ast.Name):
            found[target.id] = _merge(found.get(target.id), kind)  # type: ignore[assignment]
        elif isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:  # unpacking: each item is an object
                self._bind_target(elt, func, found, OBJ)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, func, found, SEQ)
        elif _is_self_field(target, func):
            fields = self.tainted_fields.setdefault((func.module.name, func.cls or ""), {})
            self._note(fields, target.attr, kind)

    def _taint_function(self, func: Func) -> None:
        found = self.tainted_locals(func)
        for node in _own_nodes(func.node):
            if isinstance(node, ast.Return) and node.value is not None:
                self._note(self.tainted_returns, func.key, self.tainted(node.value, func, found))
            elif isinstance(node, ast.Call):
                self._taint_arguments(node, func, found)

    def _taint_arguments(self, call: ast.Call, func: Func, found: Kinds) -> None:
        for callee, skip in self.callees(call, func, found):
            params = callee.params[skip:]
            pairs = list(zip(params, call.args, strict=False))
            pairs += [(k.arg, k.value) for k in call.keywords if k.arg in callee.params]
            for param, arg in pairs:
                self._note(self.tainted_params[callee.key], param, self.tainted(arg, func, found))

    # -- what is a TensorRT object

    def tainted(self, node: ast.expr | None, func: Func, found: Kinds) -> str | None:
        """OBJ, SEQ or None for an expression (see the class doc)."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            return found.get(node.id)
        if isinstance(node, ast.Attribute):
            if _is_self_field(node, func):
                return self.tainted_fields.get((func.module.name, func.cls or ""), {}).get(
                    node.attr
                )
            return OBJ if self.tainted(node.value, func, found) == OBJ else None
        if isinstance(node, ast.Call):
            return self._call_tainted(node, func, found)
        if isinstance(node, ast.Subscript):
            return OBJ if self.tainted(node.value, func, found) else None
        if isinstance(node, ast.Starred | ast.NamedExpr | ast.Await):
            return self.tainted(node.value, func, found)
        if isinstance(node, ast.IfExp):
            return _merge(
                self.tainted(node.body, func, found), self.tainted(node.orelse, func, found)
            )
        if isinstance(node, ast.BoolOp):
            kinds = [self.tainted(v, func, found) for v in node.values]
            return OBJ if OBJ in kinds else (SEQ if SEQ in kinds else None)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return SEQ if any(self.tainted(e, func, found) for e in node.elts) else None
        if isinstance(node, ast.ListComp | ast.GeneratorExp | ast.SetComp):
            inner = dict(found)
            for gen in node.generators:
                self._bind(gen, func, inner)
            return SEQ if self.tainted(node.elt, func, inner) else None
        return None

    def _call_tainted(self, call: ast.Call, func: Func, found: Kinds) -> str | None:
        f = call.func
        args = [self.tainted(a, func, found) for a in call.args]
        if isinstance(f, ast.Name) and f.id not in found:
            if f.id == "getattr" and call.args:
                return OBJ if args[0] == OBJ else None
            if f.id in ("next", "min", "max"):
                return OBJ if any(args) else None
            if f.id in _PASSING:
                return SEQ if any(args) else None
            if f.id in _PLAIN:
                return None
        if self.tainted(f, func, found) == OBJ:
            return OBJ  # a TensorRT method or class
        kinds = [self.tainted_returns.get(c.key) for c, _ in self.callees(call, func, found)]
        return OBJ if OBJ in kinds else (SEQ if SEQ in kinds else None)

    def callees(
        self, call: ast.Call, func: Func, found: Kinds | None = None
    ) -> list[tuple[Func, int]]:
        """Package functions a call may reach, with how many leading parameters it skips (a
        method found by name, for a receiver that is not a TensorRT object)."""
        index, module, f = self.index, func.module, call.func
        if isinstance(f, ast.Name):
            nested = self._nested(func, f.id)
            if nested is not None:
                return [(nested, 0)]
            found = index.symbol(module, f.id, func)
            return self._defined(*found) if found else []
        if not isinstance(f, ast.Attribute):
            return []
        if isinstance(f.value, ast.Name):
            alias = index.module_alias(module, f.value.id, func)
            if alias is not None:
                return self._defined(alias, f.attr)
            if f.value.id in module.imports or f.value.id in func.imports:
                return []  # np.x, json.x, log.x: outside the package
        if self.tainted(f.value, func, self._quick_locals(func) if found is None else found) == OBJ:
            return []  # a TensorRT method
        return [(m, 1) for m in index.methods_named(f.attr)]

    def _quick_locals(self, func: Func) -> Kinds:
        return {p: OBJ for p in func.params if p == "trt"} | self.tainted_params[func.key]

    def _nested(self, func: Func, name: str) -> Func | None:
        scope: Func | None = func
        while scope is not None:
            key = f"{scope.key}.{name}"
            if key in self.index.funcs:
                return self.index.funcs[key]
            scope = scope.parent
        return None

    def _defined(self, module: Module, name: str) -> list[tuple[Func, int]]:
        if name in module.functions:
            return [(module.functions[name], 0)]
        if name in module.classes:
            init = self.index.class_init(module, name)
            return [(init, 1)] if init else []
        return []

    # -- the uses

    def _uses_in(self, func: Func) -> None:
        found = self.tainted_locals(func)
        for node in _own_nodes(func.node):
            if isinstance(node, ast.Attribute) and not _dunder(node.attr):
                if self.tainted(node.value, func, found) == OBJ and not _is_self_field(node, func):
                    self.uses.append(Use(node.attr, func.span, func.where(node)))
            elif isinstance(node, ast.Call):
                self._lookup_uses(node, func, found)
            elif isinstance(node, ast.ClassDef):
                if any(self.tainted(b, func, found) == OBJ for b in node.bases):
                    self._subclass_uses(node, func)

    def _subclass_uses(self, cls: ast.ClassDef, func: Func) -> None:
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and not _dunder(item.name):
                self.uses.append(Use(item.name, func.span, func.where(item)))

    def _lookup_uses(self, call: ast.Call, func: Func, found: Kinds) -> None:
        f = call.func
        if not (isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and len(call.args) >= 2):
            self._escapes(call, func, found)
            return
        if self.tainted(call.args[0], func, found) != OBJ:
            return
        try:
            names = self.strings(call.args[1], func, set())
        except Unresolved as exc:
            self.problems.append(Problem(func.where(call), f"{f.id} name not followed: {exc}"))
            return
        for name, span in names:
            if not _dunder(name):
                self.uses.append(Use(name, func.span & span, func.where(call)))

    def _escapes(self, call: ast.Call, func: Func, found: Kinds) -> None:
        """A TensorRT object handed to infercc code outside the sources is not followed."""
        if isinstance(call.func, ast.Name):
            outside = self.index.outside_import(func, call.func.id)
            args = [*call.args, *(k.value for k in call.keywords)]
            if outside and any(self.tainted(a, func, found) for a in args):
                self.problems.append(
                    Problem(func.where(call), f"a TensorRT object is passed to {outside}")
                )

    # -- following strings

    def strings(self, node: ast.expr, func: Func | None, seen: set) -> set[tuple[str, frozenset]]:
        """The strings `node` can hold or contain, each with the majors it holds on."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {(node.value, ALL)}
        if isinstance(node, ast.Constant) and node.value is None:
            return set()
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return self._union(self.strings(e, func, seen) for e in node.elts)
        if isinstance(node, ast.Dict):
            return self._union(self.strings(v, func, seen) for v in node.values)
        if isinstance(node, ast.Subscript):
            return self.strings(node.value, func, seen)
        if isinstance(node, ast.IfExp):
            return self.strings(node.body, func, seen) | self.strings(node.orelse, func, seen)
        if isinstance(node, ast.Call):
            return self._call_strings(node, func, seen)
        if isinstance(node, ast.Name):
            return self._name_strings(node.id, func, seen, node)
        if isinstance(node, ast.Attribute):
            return self._attribute_strings(node, func, seen)
        raise Unresolved(f"{ast.unparse(node)!r} is not a name the walker can follow")

    @staticmethod
    def _union(parts: Iterable[set]) -> set:
        out: set = set()
        for part in parts:
            out |= part
        return out

    def _call_strings(self, call: ast.Call, func: Func | None, seen: set) -> set:
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr == "get":
            return self.strings(f.value, func, seen)
        if _callee_name(f) == "tensorrt_names" and call.args:
            span = marked_span(call)
            return {(s, m & span) for s, m in self.strings(call.args[0], func, seen)}
        if _callee_name(f) == "field":  # dataclasses.field(default_factory=...): empty
            return set()
        if func is not None:
            targets = [c for c, _ in self.callees(call, func) if c.node.name != "__init__"]
            if targets:
                return self._union(self._return_strings(t, seen) for t in targets)
        raise Unresolved(f"the result of {ast.unparse(call)!r}")

    def _return_strings(self, callee: Func, seen: set) -> set:
        returns = [
            n.value for n in _own_nodes(callee.node) if isinstance(n, ast.Return) and n.value
        ]
        return self._union(
            {(s, m & callee.span) for s, m in self.strings(v, callee, seen)} for v in returns
        )

    def _name_strings(self, name: str, func: Func, seen: set, node: ast.AST) -> set:
        key = (func.key, name)
        if key in seen:
            return set()
        seen = seen | {key}
        if name in func.local_names():
            return self._local_strings(name, func, seen)
        if func.parent is not None:
            return self._name_strings(name, func.parent, seen, node)
        found = self.index.symbol(func.module, name, func)
        if found and found[1] in found[0].constants:
            return self._strings_in_module(found[0].constants[found[1]], found[0], seen)
        raise Unresolved(f"{name!r} is neither a local, a parameter nor a module constant")

    def _strings_in_module(self, node: ast.expr, module: Module, seen: set) -> set:
        """strings() for module-level expressions (constants name other constants)."""
        if isinstance(node, ast.Name):
            found = self.index.symbol(module, node.id)
            if found and found[1] in found[0].constants and (found, "const") not in seen:
                return self._strings_in_module(
                    found[0].constants[found[1]], found[0], seen | {(found, "const")}
                )
            raise Unresolved(f"module name {node.id!r}")
        if isinstance(node, ast.Call) and _callee_name(node.func) == "tensorrt_names":
            span = marked_span(node)
            inner = self._strings_in_module(node.args[0], module, seen)
            return {(s, m & span) for s, m in inner}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return self._union(self._strings_in_module(e, module, seen) for e in node.elts)
        if isinstance(node, ast.Dict):
            return self._union(self._strings_in_module(v, module, seen) for v in node.values)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {(node.value, ALL)}
        raise Unresolved(f"module constant {ast.unparse(node)!r}")

    def _local_strings(self, name: str, func: Func, seen: set) -> set:
        if name in func.params:
            return self._param_strings(name, func, seen)
        out: set = set()
        for node in _own_nodes(func.node):
            if isinstance(node, ast.Assign) and _binds(node.targets, name):
                out |= self.strings(node.value, func, seen)
            elif isinstance(node, ast.For | ast.comprehension) and _binds([node.target], name):
                out |= self.strings(node.iter, func, seen)
        return out

    def _param_strings(self, name: str, func: Func, seen: set) -> set:
        sites = self.call_sites.get(func.key, [])
        if not sites:
            raise Unresolved(f"parameter {name!r} of {func.key.split(':')[1]} has no caller here")
        out: set = set()
        for caller, call in sites:
            arg = _argument(call, func, name)
            if arg is None:
                default = func.defaults.get(name)
                if default is None:
                    continue
                found = self.strings(default, func, seen)
            else:
                found = self.strings(arg, caller, seen)
            out |= {(s, m & caller.span) for s, m in found}
        return out

    def _attribute_strings(self, node: ast.Attribute, func: Func | None, seen: set) -> set:
        if func is not None and isinstance(node.value, ast.Name):
            alias = self.index.module_alias(func.module, node.value.id, func)
            if alias is not None and node.attr in alias.constants:
                return self._strings_in_module(alias.constants[node.attr], alias, seen)
        out: set = set()
        for cls_module, cls, call, scope in self.objects(node.value, func, seen):
            out |= self._field_strings(cls_module, cls, call, scope, node.attr, seen)
        return out

    def _field_strings(self, module, cls, call, scope, name, seen) -> set:
        fields = self.index.dataclass_fields(module, cls)
        names = [n for n, _ in fields]
        if name not in names:
            raise Unresolved(f"{cls}.{name} is not a field")
        position = names.index(name)
        for k in call.keywords:
            if k.arg == name:
                return self.strings(k.value, scope, seen)
        if position < len(call.args):
            return self.strings(call.args[position], scope, seen)
        default = fields[position][1]
        return set() if default is None else self._call_or_const(default, module, seen)

    def _call_or_const(self, node: ast.expr, module: Module, seen: set) -> set:
        if isinstance(node, ast.Call) and _callee_name(node.func) == "field":
            return set()
        return self._strings_in_module(node, module, seen)

    def objects(self, node: ast.expr, func: Func | None, seen: set) -> list:
        """(module, class, constructor call, scope) of the package objects `node` can be."""
        if func is None:
            raise Unresolved(f"object {ast.unparse(node)!r}")
        if isinstance(node, ast.Call):
            return self._call_objects(node, func, seen)
        if isinstance(node, ast.IfExp):
            return self.objects(node.body, func, seen) + self.objects(node.orelse, func, seen)
        if isinstance(node, ast.Name):
            key = (func.key, node.id, "obj")
            if key in seen:
                return []
            seen = seen | {key}
            if node.id in func.params:
                out = []
                for caller, call in self.call_sites.get(func.key, []):
                    arg = _argument(call, func, node.id)
                    if arg is not None:
                        out += self.objects(arg, caller, seen)
                if not out:
                    raise Unresolved(f"object parameter {node.id!r}")
                return out
            out = []
            for n in _own_nodes(func.node):
                if isinstance(n, ast.Assign) and _binds(n.targets, node.id):
                    out += self.objects(n.value, func, seen)
            return out
        raise Unresolved(f"object {ast.unparse(node)!r}")

    def _call_objects(self, call: ast.Call, func: Func, seen: set) -> list:
        module, f = func.module, call.func
        target: tuple[Module, str] | None = None
        if isinstance(f, ast.Name):
            target = self.index.symbol(module, f.id, func)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            alias = self.index.module_alias(module, f.value.id, func)
            target = (alias, f.attr) if alias else None
        if target and target[1] in target[0].classes:
            return [(target[0], target[1], call, func)]
        out = []
        for callee, _ in self.callees(call, func):
            for n in _own_nodes(callee.node):
                if isinstance(n, ast.Return) and n.value is not None:
                    out += self.objects(n.value, callee, seen)
        if not out:
            raise Unresolved(f"object {ast.unparse(call)!r}")
        return out


def _argument(call: ast.Call, callee: Func, name: str) -> ast.expr | None:
    skip = 1 if callee.cls else 0
    params = callee.params[skip:]
    for k in call.keywords:
        if k.arg == name:
            return k.value
    if name in params and params.index(name) < len(call.args):
        return call.args[params.index(name)]
    return None


def _binds(targets: list[ast.expr], name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


def _is_self_field(node: ast.expr, func: Func) -> bool:
    return (
        func.cls is not None
        and isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


# --------------------------------------------------------------------------- the lists


def collect(sources: Mapping[str, str] | None = None) -> tuple[list[Use], list[Problem]]:
    walker = Walker(package_sources() if sources is None else sources).run()
    return walker.uses, walker.problems


def read_list(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def tensorrt_lists() -> dict[str, set[str]]:
    """Recorded TensorRT version -> its API names."""
    return {p.stem: read_list(p) for p in sorted((DATA / "tensorrt_api").glob("*.txt"))}


def onnxruntime_lists() -> dict[str, dict[str, set[str]]]:
    """Recorded onnxruntime-gpu version -> provider -> its option and value names."""
    found: dict[str, dict[str, set[str]]] = {}
    for path in sorted((DATA / "onnxruntime_gpu_api").glob("*.txt")):
        table: dict[str, set[str]] = {}
        for line in read_list(path):
            provider, name = line.split()
            table.setdefault(provider, set()).add(name)
        found[path.stem] = table
    return found


def major_of(version: str) -> int:
    return int(version.split(".")[0])


def present(name: str, names: set[str]) -> bool:
    """In the list, or the tail of a listed string (the linker's tail merging; see
    bench/trt_api_surface.py)."""
    return name in names or any(n.endswith(name) for n in names)


def missing(uses: Iterable[Use], version: str, names: set[str]) -> list[Use]:
    """The uses on `version`'s path whose name that version lacks."""
    return [u for u in uses if u.span.holds(version) and not present(u.name, names)]
