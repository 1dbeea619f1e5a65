"""The layering docs/ARCHITECTURE.md declares, checked against the code.

ARCHITECTURE.md's table (header `| unit | holds | may import |`) has one row per top-level
module or package of src/infercc, lowest first. A backticked name in a row's "may import" cell
allows that unit (`analysis`) or only that module and what is under it (`analysis.memory`); text
outside backticks says why. The checks:

- every import in src/infercc from one unit into another (anywhere in a module, inside
  functions too: the edges of `tests.test_package.import_graph`) is one its row allows;
- a row allows only rows above it, so the table itself has no cycle, and the code has no cycle
  between its top-level packages either;
- every unit has one row, every allowed name exists, and every module is named in the document
  by its path under src/infercc in backticks (`ir/graph.py`; a package as `ir/`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from tests.test_package import SRC, code_graph, import_graph, modules

DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
HEADER = "| unit | holds | may import |"
ROOT = "__init__"  # the unit of the package's own __init__.py


@dataclass(frozen=True)
class Row:
    units: tuple[str, ...]  # dotted, under the package: "ir", "config", "__init__"
    allowed: tuple[str, ...]  # dotted: "ir", "analysis.memory"
    line: int  # in the document


def _dotted(text: str) -> str:
    return text.removesuffix("/").removesuffix(".py").replace("/", ".")


def parse_table(text: str) -> list[Row]:
    """The rows of the "may import" table, in the document's order."""
    lines = text.splitlines()
    start = [i for i, line in enumerate(lines) if line.strip() == HEADER]
    assert len(start) == 1, f"ARCHITECTURE.md needs one table headed {HEADER!r}"
    rows = []
    for i in range(start[0] + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", lines[i].strip())[1:-1]
        assert len(cells) == 3, f"ARCHITECTURE.md line {i + 1}: a row has three cells"
        units, allowed = (re.findall(r"`([^`]+)`", cells[k]) for k in (0, 2))
        rows.append(Row(tuple(map(_dotted, units)), tuple(allowed), i + 1))
    return rows


def unit_of(module: str) -> str:
    """`pkg.ir.graph` -> `ir`, `pkg.config` -> `config`, `pkg` -> `__init__`."""
    parts = module.split(".")[1:]
    return parts[0] if parts else ROOT


def _relative(module: str) -> str:
    return module.partition(".")[2] or ROOT


def _allows(allowed: tuple[str, ...], target: str) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def table_errors(rows: list[Row], root: Path) -> list[str]:
    """Units without a row or with two, rows naming what does not exist, and rows allowing a
    unit that is not above them."""
    known = {_relative(m) for m in modules(root)}
    units = {unit_of(m) for m in modules(root)}
    errors = []
    seen: dict[str, int] = {}  # unit -> the line of its row
    for row in rows:
        for name in row.allowed:
            if name not in known:
                errors.append(f"line {row.line}: allows {name}, which does not exist")
            elif name.split(".")[0] not in seen:
                errors.append(f"line {row.line}: allows {name}, which is not in a row above")
        for unit in row.units:
            if unit in seen:
                errors.append(f"line {row.line}: {unit} has a row already (line {seen[unit]})")
            if unit not in units:
                errors.append(f"line {row.line}: {unit} is no module or package of {root.name}")
            seen[unit] = row.line
    errors += [f"{u} has no row" for u in sorted(units - set(seen))]
    return errors


def violations(graph: nx.DiGraph, rows: list[Row]) -> list[str]:
    """Each import from one unit into another that the importer's row does not allow."""
    allowed = {unit: row.allowed for row in rows for unit in row.units}
    found = []
    for source, target, data in sorted(graph.edges(data=True)):
        unit = unit_of(source)
        if unit == unit_of(target) or _allows(allowed.get(unit, ()), _relative(target)):
            continue
        found.append(f"{source} (line {data['line']}) imports {target}: {unit}'s row forbids it")
    return found


def package_graph(graph: nx.DiGraph) -> nx.DiGraph:
    """Unit -> unit it imports, each edge with one import that makes it."""
    units = nx.DiGraph()
    for source, target, data in sorted(graph.edges(data=True)):
        a, b = unit_of(source), unit_of(target)
        if a != b and not units.has_edge(a, b):
            units.add_edge(a, b, via=f"{source} line {data['line']}")
    return units


def package_cycles(units: nx.DiGraph) -> list[str]:
    """One shortest cycle per strongly connected group of units, each hop with its import."""
    found = []
    for group in nx.strongly_connected_components(units):
        if len(group) > 1:
            cycle = min(nx.simple_cycles(units.subgraph(group), length_bound=8), key=len)
            start = cycle.index(min(cycle))
            cycle = cycle[start:] + cycle[:start]
            hops = zip(cycle, [*cycle[1:], cycle[0]], strict=True)
            found.append(
                " -> ".join([*(f"{a} ({units.edges[a, b]['via']})" for a, b in hops), cycle[0]])
            )
    return sorted(found)


def unnamed_modules(root: Path, text: str) -> list[str]:
    """Modules whose path under `root` (a package as `dir/`) the document never names."""
    names = []
    for path in modules(root).values():
        rel = path.relative_to(root).as_posix()
        name = rel.removesuffix("__init__.py") if rel != "__init__.py" else rel
        if f"`{name}`" not in text:
            names.append(name)
    return sorted(names)


def test_the_table_names_every_unit_once_and_allows_only_rows_above() -> None:
    assert table_errors(parse_table(DOC.read_text()), SRC) == []


def test_every_import_is_one_the_table_allows() -> None:
    assert violations(code_graph(), parse_table(DOC.read_text())) == []


def test_no_import_cycle_between_packages() -> None:
    units = package_graph(code_graph())
    assert "backends" in units and "runtime" in units["backends"]  # the graph is the code's
    assert package_cycles(units) == []


def test_every_module_is_named_in_architecture_md() -> None:
    assert unnamed_modules(SRC, DOC.read_text()) == []


def test_the_checks_find_what_breaks_the_table(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from pkg import high\n")
    (pkg / "low" / "b.py").write_text("")
    (pkg / "high.py").write_text("from pkg.low import b\n")
    (pkg / "orphan.py").write_text("")
    doc = "\n".join(
        [
            HEADER,
            "| --- | --- | --- |",
            "| `low/` | `low/a.py` | `__init__` (not above) |",
            "| `high.py` | | `low.b` (its one use), `gone` |",
            "| `__init__.py` | | nothing |",
            "",
            "| `not/` | a table row after the table | `high` |",
        ]
    )
    rows = parse_table(doc)
    assert [r.units for r in rows] == [("low",), ("high",), (ROOT,)]
    assert table_errors(rows, pkg) == [
        "line 3: allows __init__, which is not in a row above",
        "line 4: allows gone, which does not exist",
        "orphan has no row",
    ]
    graph = import_graph(pkg)
    assert violations(graph, rows) == ["pkg.low.a (line 2) imports pkg.high: low's row forbids it"]
    assert package_cycles(package_graph(graph)) == [
        "high (pkg.high line 1) -> low (pkg.low.a line 2) -> high"
    ]
    assert unnamed_modules(pkg, doc) == ["low/b.py", "orphan.py"]
