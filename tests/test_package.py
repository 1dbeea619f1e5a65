"""The package's shape: no import cycle between its modules (imports inside functions count),
and no module named like a standard-library module.

An import of `a.b.c` (or `from a.b import c` where c is a module) is an edge to module a.b.c;
`from a.b import name` is an edge to a.b (its `__init__`). Importing a submodule also runs its
parents' `__init__`, but a package importing its own submodules is how packages work, so that
implicit edge is not counted. Backends resolved by name through `importlib` (the registry's
built-ins, entry points) are not imports.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import networkx as nx

import infercc

SRC = Path(infercc.__file__).resolve().parent


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module and package under `root` (a package dir)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(root: Path) -> nx.DiGraph:
    """Edges module -> module it imports (anywhere in its body), with the line of the import."""
    known = modules(root)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, known):
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                if target in known and target != name:
                    graph.add_edge(name, target, line=node.lineno)
    return graph


@functools.cache
def code_graph() -> nx.DiGraph:
    """`import_graph` of infercc itself, built once per test run (read it, do not change it)."""
    return import_graph(SRC)


def cycles(graph: nx.DiGraph) -> list[str]:
    """One readable cycle (a shortest one, from its first module by name) per strongly
    connected group of modules."""
    found = []
    for group in nx.strongly_connected_components(graph):
        if len(group) < 2:
            continue
        cycle = min(nx.simple_cycles(graph.subgraph(group), length_bound=8), key=len)
        start = cycle.index(min(cycle))
        cycle = cycle[start:] + cycle[:start]
        hops = [
            f"{a} (line {graph.edges[a, b]['line']})"
            for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True)
        ]
        found.append(" -> ".join([*hops, cycle[0]]))
    return sorted(found)


def stdlib_names(root: Path) -> list[str]:
    """Modules and packages whose own name is a standard-library module's."""
    return sorted(
        name
        for name in modules(root)
        if name.rpartition(".")[2] in sys.stdlib_module_names
        and not name.rpartition(".")[2].startswith("__")
    )


def test_no_import_cycle_between_modules() -> None:
    assert cycles(code_graph()) == []


def test_no_module_is_named_like_a_standard_library_module() -> None:
    assert stdlib_names(SRC) == []


def test_the_checks_find_a_cycle_through_a_function_and_a_stdlib_name(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import a\n")
    (pkg / "sub" / "a.py").write_text("from pkg.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import inspect\n")
    (pkg / "inspect.py").write_text("from pkg.sub import a as _a\n")
    graph = import_graph(pkg)
    assert graph.edges["pkg.sub.b", "pkg.inspect"]["line"] == 2
    assert cycles(graph) == [
        "pkg.inspect (line 1) -> pkg.sub.a (line 1) -> pkg.sub.b (line 2) -> pkg.inspect"
    ]
    assert stdlib_names(pkg) == ["pkg.inspect"]
    assert "pkg.sub" not in nx.descendants(graph, "pkg.sub.a")  # no implicit parent edges
