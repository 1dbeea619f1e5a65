"""What the commands share: option types, one progress display, and the tail every report
command ends with (JSON or tables, then exit 0 or 1).

A build option's flags are Typer options made from its field's declaration
(`infercc.options.Flag`): `with_build_options` gives `optimize` all of them, and the options
other commands share with it (`--shape`, the tolerances, `--data-loader`) are the same flags.

Every JSON report that is an object carries `run`: the command, infercc's version and the
resolved value of every option (defaults filled in, paths absolute), so a report says exactly
what ran (`infercc optimize --config REPORT.json` replays an optimize)."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from infercc.cli.app import (
    err,
    out,
    progress_display,
    run_state,
    settings,
    silence_stdout,
    take_status,
)
from infercc.config import BuildConfig
from infercc.errors import EXIT_VALIDATION_FAILED
from infercc.options import PANELS, Flag, Leaf, flags_by_name, leaves, param_name
from infercc.util import json_text
from infercc.version import __version__

# --------------------------------------------------------------------------- option types


def flag_type(flag: Flag, default: Any, panel: str | None = None, spelling: str = "") -> Any:
    """The `Annotated` type of a Typer option for a build option's `flag` (its name, help,
    value type, metavar and bounds as declared on the field, `infercc.config`); under an old
    `spelling` the option is hidden."""
    kind: Any = bool if flag.takes is None else flag.takes
    if flag.many:
        kind = list[kind]
    if default is None:
        kind = kind | None
    info = typer.Option(
        spelling or flag.name,
        metavar=flag.metavar,
        help=flag.help,
        min=flag.min,
        max=flag.max,
        rich_help_panel=panel,
        hidden=bool(spelling),
    )
    return Annotated[kind, info]


def flag_default(flag: Flag, leaf: Leaf) -> Any:
    """What a flag is when not given: off, no value, or its field's default where the flag's
    value is the field's (`--align` 64, `--target` cpu)."""
    if flag.takes is None:
        return False
    if flag.many or flag.value is not None or len(leaf.option.flags) > 1:
        return None
    return leaf.default


def build_parameters() -> list[inspect.Parameter]:
    """A keyword parameter for every flag of every build option (old spellings hidden), in
    the declaration's order, each listed in --help under its option's panel."""
    found = []
    for leaf in leaves(BuildConfig):
        for flag in leaf.option.flags:
            default = flag_default(flag, leaf)
            for spelling in flag.spellings:
                old = "" if spelling == flag.name else spelling
                found.append(
                    inspect.Parameter(
                        param_name(spelling),
                        inspect.Parameter.KEYWORD_ONLY,
                        default=default,
                        annotation=flag_type(flag, default, leaf.option.panel, old),
                    )
                )
    return found


def with_build_options(command: Callable[..., Any], first: tuple[str, ...] = ()) -> None:
    """Give `command` (whose `**flags` takes them) a signature with every build option's
    flags, its options sorted by panel (`infercc.options.PANELS`; `first` at the head of
    theirs), so typer makes them options and --help lists them panel by panel."""
    own = inspect.signature(command, eval_str=True).parameters.values()
    fixed = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [p for p in fixed if p.default is not inspect.Parameter.empty and _panel(p)]
    head = [p for p in fixed if p not in options]
    built = build_parameters()

    def order(item: tuple[int, inspect.Parameter]) -> tuple[int, int, int]:
        i, p = item
        rank = 0 if p.name in first else 1 if i >= len(options) else 2  # own options last
        return PANELS.index(_panel(p) or ""), rank, i

    ranked = [p for _, p in sorted(enumerate([*options, *built]), key=order)]
    params = [*head, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in ranked)]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]


def _panel(p: inspect.Parameter) -> str | None:
    for meta in getattr(p.annotation, "__metadata__", ()):
        panel = getattr(meta, "rich_help_panel", None)
        if panel is not None:
            return panel
    return None


FLAGS = flags_by_name(BuildConfig)


def shared_option(name: str, help: str | None = None, default: Any = None) -> Any:
    """A build option's flag as other commands take it: its declaration's name, value type,
    metavar and bounds (no panel), with `help` where that command means more by it than
    optimize does (calibrate's --shape pins its random inputs); not given: `default` (off,
    for an on/off flag), which the command gives its parameter too."""
    flag = FLAGS[name] if help is None else dataclasses.replace(FLAGS[name], help=help)
    return flag_type(flag, False if flag.takes is None else default)


ShapeOpt = shared_option("--shape")
CustomOpLibOpt = shared_option("--ort-custom-op-lib")

# The build options calibrate shares with optimize: each declaration's flag (name, value type,
# metavar), with what calibrate means by it.
PortableOpt = shared_option(
    "--portable",
    "--int4: standard ONNX (int4 DequantizeLinear, opset 21) instead of onnxruntime's MatMulNBits.",
)
AssumeOpt = shared_option(
    "--assume",
    "--int4 MatMulNBits: state an assumption about the inputs (repeatable). "
    "nonempty-sequences: no sequence is all padding and no prompt is padded on the "
    "left, under which a decoder's GroupQueryAttention needs no fix-up of the rows that "
    "keep no key (and one whose mask is -1e9 fuses at all; listed in the report).",
)
CalibrateShapeOpt = shared_option(
    "--shape",
    "--int4 without --data: pin an input's shape in the random inputs, e.g. "
    "--shape input_ids=1x128 (repeatable; parsed and checked as optimize's --shape, "
    "one shape, no range). A decoder's --shape pins one call: its batch and new "
    "tokens (a prompt is fed in calls of that many), or its cache length.",
)
TargetOpt = shared_option(
    "--target",
    "Where the model will run: cpu (this host), a CPU row such as x86-avx2 or "
    "x86-avx512-vnni (its int8 and int4 forms; `infercc targets` lists them), or a GPU. "
    "A target that is not this host is evaluated as its Q/DQ graph, without the kernel "
    "check and the speed race.",
    default="cpu",
)
DisablePassOpt = shared_option(
    "--disable-pass",
    "Skip a pass of the calibrate-fp32 or int8 pipeline (with --int4: of "
    "calibrate-int4, or calibrate-fp32 with --portable) by name (repeatable); "
    "`infercc passes` lists them.",
)
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")
]


def cache_dir_option(panel: str | None = None) -> Any:
    return typer.Option(
        metavar="DIR",
        help="Tuning cache directory [default: $INFERCC_CACHE_DIR or ~/.cache/infercc].",
        envvar="INFERCC_CACHE_DIR",
        rich_help_panel=panel,
    )


CacheDirOpt = Annotated[Path | None, cache_dir_option()]
SeedOpt = Annotated[int, typer.Option(metavar="N", help="Seed of the random inputs.")]
VerifyOpt = shared_option("--verify")

# Tolerances: optimize's validation and `infercc validate` (defaults: infercc.precisions).
AtolOpt = shared_option("--atol")
RtolOpt = shared_option("--rtol")
MinCosineOpt = shared_option("--min-cosine")
StrictCoverageOpt = shared_option("--strict-coverage")
TolOpt = shared_option("--tol")


# --------------------------------------------------------------------------- progress


class Progress:
    """The one progress display, on stderr (silent under --json or without a terminal).

    `step(text)` names the current step on a spinner line; `tick(done, total)` fills a bar
    under it (runs, samples); `event(name, what)` keeps one line per name (ci's models).
    Quiet, every method does nothing, so commands pass them to the API unconditionally. It
    goes on with the status line the app showed from the start (`app.take_status`), so the
    spinner and its clock never stop between the command's start and its first step.
    """

    def __init__(self, quiet: bool, label: str = "starting", keep: bool = False):
        self.quiet = quiet or settings.quiet or not err.is_terminal
        self.label, self.keep = label, keep
        self.progress: Any = None
        self.main: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        shown, task = take_status()
        if self.quiet or self.keep:  # ci keeps its lines: a display of its own
            if shown is not None:
                shown.stop()
            shown = task = None
        if not self.quiet:
            if shown is None:
                shown = progress_display(transient=not self.keep)
                shown.start()
            else:
                shown.update(task, description=escape(self.label))
            self.progress, self.main = shown, task
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _line(self) -> Any:
        if self.main is None:
            self.main = self.progress.add_task(escape(self.label), total=None)
        return self.main

    def step(self, text: str) -> None:
        """A new step: its name on a spinner line (rich's update cannot take a bar back to a
        spinner, total=None there meaning "unchanged": a bar of an earlier step's ticks would
        stay at 0/N through every later step; the line is made anew instead)."""
        if self.progress is None:
            return
        task = self._line()
        if self.progress.tasks[self._index(task)].total is not None:
            self.progress.remove_task(task)
            self.main = self.progress.add_task(escape(text), total=None)
        else:
            self.progress.update(task, description=escape(text), completed=0)

    def _index(self, task: Any) -> int:
        return next(i for i, t in enumerate(self.progress.tasks) if t.id == task)

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
            run_state.printed_json = True
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
    names: list[str] = []
    options: dict[str, Any] = {}
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

InputRangeOpt = shared_option("--input-range")
DataLoaderOpt = shared_option("--data-loader")


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
