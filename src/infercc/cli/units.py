"""Human-readable sizes, counts and shapes, the table columns of the rendered reports, and prose.

Tables never cut a value: figures stay on one line and never end in an ellipsis, names and
text fold onto more lines when a terminal is narrow (on a pipe the console is wide enough that
every row prints whole: `infercc.cli.app.PIPE_WIDTH`). Prose (notes, reasons: sentences that
can run to hundreds of characters) is never put in a table: `prose` prints it under the table,
wrapped at the terminal's width, or at `PROSE_WIDTH` on a pipe, and never breaks a word or a
path."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infercc.util import num

# Prose on a pipe or log wraps at this width (on a terminal, at the terminal's, when narrower).
PROSE_WIDTH = 100


def scaled(x: float | None, factor: float, offset: float = 0.0) -> float | None:
    """`(x + offset) * factor`, None for None (a percentage of a missing ratio)."""
    return None if x is None else (x + offset) * factor


def human_bytes(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return num(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_count(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return num(n)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def shape_text(dims: Sequence[Any] | None) -> str:
    """`[batch, 128, 64]` (escaped for rich markup, which would read `[batch, ...]` as a
    style); an unknown rank is `?`, an unknown dimension `?`."""
    if dims is None:
        return "?"
    return escape("[" + ", ".join("?" if d is None else str(d) for d in dims) + "]")


def shapes_text(shapes: Mapping[str, Sequence[Any]]) -> str:
    """`image [1, 3, 32, 32], mask [1, 8]` (escaped for rich markup)."""
    return ", ".join(f"{escape(name)} {shape_text(dims)}" for name, dims in shapes.items())


def table(title: str | None = None, **kwargs: Any) -> Table:
    return Table(title=title, title_justify="left", **kwargs)


def text_column(t: Table, header: str, **kwargs: Any) -> None:
    """A column of names or prose: folds onto more lines rather than being cut."""
    t.add_column(header, overflow="fold", **kwargs)


def number_column(t: Table, header: str, **kwargs: Any) -> None:
    """A column of figures: right-aligned, kept on one line; never cut (a terminal too
    narrow folds it rather than end it in an ellipsis)."""
    t.add_column(header, justify="right", no_wrap=True, overflow="fold", **kwargs)


def accuracy_table(
    title: str, outputs: Mapping[str, Mapping[str, Any]], num: Callable[[Any, str], str]
) -> Table:
    """A quantized model's outputs against fp32 (int8 and int4 reports): cosine, max abs and
    top-1 agreement per output; `num(value, fmt)` prints a figure ("-" for a missing one)."""
    t = table(title)
    text_column(t, "output")
    for col in ("cosine", "max abs", "top-1 agreement"):
        number_column(t, col)
    for name, q in outputs.items():
        agree = q["top1_agreement"]
        t.add_row(
            escape(name),
            num(q["cosine"], ".6f"),
            num(q["max_abs"], ".3g"),
            num(agree, ".2%"),
        )
    return t


def prose(
    console: Console,
    text: str,
    indent: str = "",
    hang: str = "  ",
    style: str | None = None,
) -> None:
    """Print `text` (plain, not markup) wrapped at the console's width, at most `PROSE_WIDTH`:
    the first line after `indent`, the others after `indent + hang`; a word longer than a
    line (a path) stays whole on its own line."""
    width = min(console.width, PROSE_WIDTH)
    first, rest = indent, indent + hang
    for paragraph in text.splitlines() or [""]:
        lines = textwrap.wrap(
            paragraph,
            width,
            initial_indent=first,
            subsequent_indent=rest,
            break_long_words=False,
            break_on_hyphens=False,
        )
        for line in lines or [first.rstrip()]:
            console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)
        first = rest


def render_bisect_verdict(b: dict[str, Any], console: Console) -> None:
    """A build's bisection verdict (`BisectReport.to_dict()`) in one line, red when it names
    a guilty pass."""
    guilty = b.get("reproduced") and b.get("guilty_pass")
    text = f"bisect ({b['trials']} rebuilds): {b['message']}"
    prose(console, text, style="red" if guilty else None)


def render_refusals(refusals: list[dict[str, str]], console: Console) -> None:
    """--explain's table of refused rewrites (`Refusal.to_dict()` rows), optimize's and
    calibrate --int4's."""
    if not refusals:
        console.print("no rewrite was refused")
        return
    t = table("refused rewrites")
    for col in ("pass", "node", "op", "reason", "failed at"):
        text_column(t, col)
    for r in refusals:
        t.add_row(r["pass"], r["node"], r["op"], r["reason"], r.get("at", ""))
    console.print(t)


def hint_line(hint: Mapping[str, Any]) -> str:
    """One line for an assumption hint of a report (`infercc.assumptions.hints`): the
    assumption not stated, what it promises, its flag and the rewrites it would allow."""
    refused = ", ".join(f"{p} {n}" for p, n in hint["rewrites"].items())
    return (
        f"not assumed: {hint['name']} ({hint['doc']}): {hint['flag']} would allow {refused}; "
        "the model is then exact only on inputs that satisfy it"
    )
