"""What the commands share: option types, one progress display, and the tail every report
command ends with (JSON or tables, then exit 0 or 1).

Every JSON report that is an object carries `run`: the command, infercc's version and the
resolved value of every option (defaults filled in, paths absolute), so a report says exactly
what ran (`infercc optimize --config REPORT.json` replays an optimize)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from infercc.cli.app import err, out, settings, silence_stdout
from infercc.errors import EXIT_VALIDATION_FAILED
from infercc.util import json_text
from infercc.version import __version__

# --------------------------------------------------------------------------- option types

ShapeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--shape",
        metavar="NAME=SHAPE",
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
        metavar="DIR",
        help="Tuning cache directory [default: $INFERCC_CACHE_DIR or ~/.cache/infercc].",
        envvar="INFERCC_CACHE_DIR",
    ),
]
SeedOpt = Annotated[int, typer.Option(metavar="N", help="Seed of the random inputs.")]

# Tolerances: optimize's validation and `infercc validate` (defaults: infercc.precisions).
AtolOpt = Annotated[
    float | None,
    typer.Option(
        metavar="X",
        min=0.0,
        help="Absolute tolerance [default: 1e-4 for fp32; none for fp16, bf16, int8].",
    ),
]
RtolOpt = Annotated[
    float | None,
    typer.Option(
        metavar="X",
        min=0.0,
        help="Relative tolerance [default: 1e-3 for fp32; none for fp16, bf16, int8].",
    ),
]
MinCosineOpt = Annotated[
    float | None,
    typer.Option(
        metavar="X",
        min=0.0,
        max=1.0,
        help="Minimum cosine per output [default: 0.9999 fp32, 0.999 fp16/bf16, 0.99 int8].",
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
        metavar="OUTPUT=ATOL:RTOL",
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
        self.quiet = quiet or settings.quiet or not err.is_terminal
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
    """Print `report` as JSON (`data`, else its `to_dict()`, with the `run` record) or through
    `render`; exit 1 when it has a `passed` that is false. A reader that closed stdout early
    (`| head -1`) is not a failure: the exit code is the report's."""
    try:
        if as_json:
            payload = report.to_dict() if data is None else data
            record = run_record()
            if isinstance(payload, dict) and record is not None:
                payload = {**payload, "run": record}
            out.print_json(json_text(payload))
        else:
            render(report, out)
        out.file.flush()
    except BrokenPipeError:
        silence_stdout()
    if not getattr(report, "passed", True):
        raise typer.Exit(EXIT_VALIDATION_FAILED)


def run_record(ctx: Any = None) -> dict[str, Any] | None:
    """What ran: the command (`cache ls`), infercc's version and every option's resolved
    value, from click's context (defaults filled in; paths absolute); None outside a
    command."""
    ctx = ctx or _current_context()
    if ctx is None:
        return None
    names, options = [], {}
    node = ctx
    while node is not None:
        if node.parent is not None:
            names.append(node.info_name)
        options = {**{k: _plain(v) for k, v in node.params.items()}, **options}
        node = node.parent
    return {"command": " ".join(reversed(names)), "infercc": __version__, "options": options}


def _current_context() -> Any:
    for module in ("typer._click.globals", "click"):
        try:
            get = __import__(module, fromlist=["get_current_context"]).get_current_context
        except (ImportError, AttributeError):
            continue
        ctx = get(silent=True)
        if ctx is not None:
            return ctx
    return None


def _plain(value: Any) -> Any:
    """A JSON form of an option's value."""
    if isinstance(value, os.PathLike):
        return os.path.abspath(os.fspath(value))
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- validation inputs

InputRangeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input-range",
        help="Draw the generated validation input NAME uniformly from LOW..HIGH (integers: "
        "both ends included), e.g. --input-range pixel_values=0:1 (repeatable; Polygraphy's "
        "--val-range).",
        metavar="NAME=LOW:HIGH",
    ),
]
DataLoaderOpt = Annotated[
    str | None,
    typer.Option(
        "--data-loader",
        help="Validate on the samples a Python function returns: SCRIPT.py[:FUNCTION] "
        "(default function load_data), a list or generator of {input name: array} dicts "
        "(Polygraphy's --data-loader-script).",
        metavar="SCRIPT.py[:FN]",
    ),
]


def data_source(data: str | Path | None, data_loader: str | None) -> str | None:
    """The one source of validation samples: --data or --data-loader (both: an error)."""
    from infercc.data.loader import join_loader_spec, split_loader_spec
    from infercc.errors import InferccError

    if data is not None and data_loader is not None:
        raise InferccError("--data and --data-loader both give the samples", "pass one of them")
    if data_loader is not None:
        script, fn = split_loader_spec(data_loader)
        return join_loader_spec(os.path.abspath(script), fn)
    return str(data) if data is not None else None
