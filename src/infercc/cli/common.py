"""What the commands share: option types, one progress display, and the tail every report
command ends with (JSON or tables, then exit 0 or 1)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from infercc.cli.app import err, out
from infercc.errors import EXIT_VALIDATION_FAILED

# --------------------------------------------------------------------------- option types

ShapeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--shape",
        help="Pin an input's shape, e.g. --shape input_ids=1x128 (repeatable), or give a range "
        "MIN:OPT:MAX, e.g. input_ids=1x128:8x128:32x512 (artifacts are tuned at each). "
        "Symbolic dims not pinned default to 1 (first axis) and 8 (others).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")
]
CacheDirOpt = Annotated[
    Path | None,
    typer.Option(
        help="Tuning cache directory [default: $INFERCC_CACHE_DIR or ~/.cache/infercc].",
        envvar="INFERCC_CACHE_DIR",
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Seed of the random inputs.")]

# Tolerances: optimize's validation and `infercc validate` (defaults: infercc.precisions).
AtolOpt = Annotated[
    float | None,
    typer.Option(help="Absolute tolerance [default: 1e-4 for fp32; none for fp16, bf16, int8]."),
]
RtolOpt = Annotated[
    float | None,
    typer.Option(help="Relative tolerance [default: 1e-3 for fp32; none for fp16, bf16, int8]."),
]
MinCosineOpt = Annotated[
    float | None,
    typer.Option(
        help="Minimum cosine per output [default: 0.9999 fp32, 0.999 fp16/bf16, 0.99 int8]."
    ),
]
StrictCoverageOpt = Annotated[
    bool,
    typer.Option(
        "--strict-coverage",
        help="Fail validation when a rewritten If/Loop body never ran on the validation "
        "inputs (its rewrites were not checked); without it the report only warns. Give "
        "samples that reach it with --data.",
    ),
]
TolOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tol",
        help="Tolerance of one output, OUTPUT=ATOL:RTOL, e.g. logits=1e-3:1e-2 (repeatable).",
    ),
]


# --------------------------------------------------------------------------- progress


class Progress:
    """The one progress display, on stderr (silent under --json or without a terminal).

    `step(text)` names the current step on a spinner line; `tick(done, total)` fills a bar
    under it (runs, samples); `event(name, what)` keeps one line per name (ci's models).
    Quiet, every method does nothing, so commands pass them to the API unconditionally.
    """

    def __init__(self, quiet: bool, label: str = "starting", keep: bool = False):
        self.quiet = quiet or not err.is_terminal
        self.label, self.keep = label, keep
        self.progress: Any = None
        self.main: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        if not self.quiet:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bars

            self.progress = Bars(
                SpinnerColumn(),
                "{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err,
                transient=not self.keep,
            )
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def _line(self) -> Any:
        if self.main is None:
            self.main = self.progress.add_task(escape(self.label), total=None)
        return self.main

    def step(self, text: str) -> None:
        if self.progress is not None:
            self.progress.update(self._line(), description=escape(text), completed=0, total=None)

    def tick(self, done: int, total: int | None) -> None:
        if self.progress is not None:
            self.progress.update(self._line(), completed=done, total=total)

    def event(self, name: str, what: str) -> None:
        if self.progress is None:
            return
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(escape(name), total=1)
        done = what in ("passed", "failed")
        self.progress.update(
            self.tasks[name], description=f"{escape(name)}: {what}", completed=int(done)
        )


# --------------------------------------------------------------------------- the tail


def finish(
    report: Any,
    as_json: bool,
    render: Callable[[Any, Console], None],
    data: Any = None,
) -> None:
    """Print `report` as JSON (`data`, else its `to_dict()`) or through `render`; exit 1 when
    it has a `passed` that is false."""
    if as_json:
        out.print_json(json.dumps(report.to_dict() if data is None else data))
    else:
        render(report, out)
    if not getattr(report, "passed", True):
        raise typer.Exit(EXIT_VALIDATION_FAILED)
