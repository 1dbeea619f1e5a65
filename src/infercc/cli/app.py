"""The Typer app, its consoles and the entry point: one-line errors, exit codes.

Help is click's plain layout (no Rich markup: `[default: ...]` and `infercc[plot]` print as
written), with readable metavars (`MODEL`, `--shape NAME=SHAPE`) and `-h` beside `--help`.

The global options (`--debug`, `-q`/`--quiet`, `-v`/`--verbose`, `--log-file FILE`) are
accepted anywhere on the line: `_Group.parse_args` moves those that follow the subcommand to
the front before click parses, skipping the values of the subcommand's own options. They also
set how much a report says (`detail()`): `-q` its summary and verdict, `-v` everything.

Output: stdout (`out`) is as wide as the terminal, or `PIPE_WIDTH` on a pipe, and never ends a
line in spaces. Errors: one line on stderr, and with `--json` the same as an object on stdout,
`{"error", "hint", "exit"}`, so that a caller parsing stdout always gets JSON. Progress: one
status line on stderr from the start (`start_status`), taken over by the command's display.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from infercc.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, InferccError
from infercc.version import __version__

# --------------------------------------------------------------------------- consoles

# Width of a console whose file is not a terminal (a pipe, a CI log): wide enough that tables
# keep every value whole; lines are not padded, so nothing gets longer than its content.
PIPE_WIDTH = 4096

# A colour code that ends a line (the spaces before it are stripped, the code kept).
_LAST_ESCAPE = re.compile(r"\x1b\[[0-9;]*m\Z")


class _Console(Console):
    """A rich Console that, when its file is not a terminal, is `PIPE_WIDTH` wide whatever
    $COLUMNS says (colours still follow rich's rules: NO_COLOR, FORCE_COLOR, TTY_COMPATIBLE),
    and whose lines never end in spaces."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if not is_tty(self.file):
            return ConsoleDimensions(PIPE_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def on_broken_pipe(self) -> None:
        """The reader went away (`| head -1`): print nothing more and let the command end
        with its own exit code (rich exits 1 here, which means "validation failed")."""
        self.quiet = True
        silence_stdout()
        raise BrokenPipeError(32, "stdout was closed")

    def _render_buffer(self, buffer: Any) -> str:
        return strip_trailing(super()._render_buffer(buffer))


def strip_trailing(text: str) -> str:
    """`text` with the spaces that end each line removed (colour codes among them kept): rich
    pads table titles and the last column of a borderless table to the table's width. A last
    piece without its newline is left as it is (more of its line may follow)."""
    lines = text.split("\n")
    return "\n".join([*map(_strip_line, lines[:-1]), lines[-1]])


def _strip_line(line: str) -> str:
    codes: list[str] = []
    while True:
        bare = line.rstrip(" \t")
        found = _LAST_ESCAPE.search(bare)
        if found is None:
            return bare + "".join(reversed(codes))
        codes.append(found.group(0))
        line = bare[: found.start()]


def is_tty(file: Any) -> bool:
    """True when `file` is an interactive terminal (not a pipe, file or CI log), or when
    $TTY_COMPATIBLE says (rich's switch: 1 a terminal, 0 none, whatever the file is)."""
    said = os.environ.get("TTY_COMPATIBLE", "")
    if said in ("0", "1"):
        return said == "1"
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # a closed file
        return False


out = _Console()
err = Console(stderr=True)


# --------------------------------------------------------------------------- global options


@dataclass
class Settings:
    """What the global options set for this run."""

    debug: bool = False
    quiet: bool = False
    verbose: int = 0
    log_file: Path | None = None


settings = Settings()

GLOBAL_FLAGS = ("--debug", "-q", "--quiet", "-v", "--verbose")
GLOBAL_WITH_VALUE = ("--log-file",)
_VERBOSE_CLUSTER = re.compile(r"-v+")


def hoist_globals(command: Any, ctx: Any, args: Sequence[str]) -> list[str]:
    """`args` with the global options that follow a subcommand moved to the front.

    The values of the options of each command on the way are stepped over (so `--shape -v`
    keeps its value) and nothing after `--` moves."""
    front: list[str] = []
    rest: list[str] = []
    takes_value = _value_options(command)
    inside = False  # past the first subcommand
    i = 0
    while i < len(args):
        token = args[i]
        name = token.split("=", 1)[0]
        if token == "--":
            rest += args[i:]
            break
        if inside and (token in GLOBAL_FLAGS or _VERBOSE_CLUSTER.fullmatch(token)):
            front.append(token)
        elif inside and name in GLOBAL_WITH_VALUE:
            front += args[i : i + (1 if "=" in token else 2)]
            i += 0 if "=" in token else 1
        elif name in takes_value and "=" not in token:
            rest += args[i : i + 2]
            i += 1
        else:
            rest.append(token)
            sub = _subcommand(command, ctx, token)
            if sub is not None:
                command, inside = sub, True
                takes_value |= _value_options(sub)
        i += 1
    return front + rest


def _subcommand(command: Any, ctx: Any, token: str) -> Any:
    if token.startswith("-") or not hasattr(command, "get_command"):
        return None
    return command.get_command(ctx, token)


def _value_options(command: Any) -> set[str]:
    names: set[str] = set()
    for p in getattr(command, "params", ()):
        if p.param_type_name == "option" and not p.is_flag and not getattr(p, "count", False):
            names.update(p.opts)
            names.update(p.secondary_opts)
    return names


# --------------------------------------------------------------------------- help layout


class Command(typer.core.TyperCommand):
    """Plain help with readable names: `Usage: infercc optimize [OPTIONS] MODEL [OUTPUT]`,
    arguments listed by their metavar, every option that takes a value showing one."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                pieces.append(_argument_usage(p))
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Arguments, then the options: under their panels (`rich_help_panel`, in the order
        the options come) where they have one, the rest under "Options", one column width."""
        args, panels = [], {}
        for p in self.get_params(ctx):
            if p.param_type_name == "argument" and not p.hidden:
                args.append((_argument_name(p), _argument_help(p, ctx)))
            elif p.param_type_name == "option":
                _readable_metavar(p)
                record = p.get_help_record(ctx)
                if record is not None:
                    panel = getattr(p, "rich_help_panel", None) or "Options"
                    panels.setdefault(panel, []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if "Options" in panels:  # click's -h/--help: last
            panels["Options"] = panels.pop("Options")
        width = max((len(first) for rows in panels.values() for first, _ in rows), default=0)
        for panel, rows in panels.items():
            with formatter.section(panel):
                formatter.write_dl(_one_width(rows, min(width, _FIRST_COLUMN)))


_FIRST_COLUMN = 30  # click's widest first column (write_dl's col_max)


def _one_width(rows: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    """`rows` whose widest first column is `width` wide, so that every panel's second column
    starts where the others' do (padding only a row that has help after it)."""
    widest = max(range(len(rows)), key=lambda i: len(rows[i][0]))
    first, text = rows[widest]
    if text and len(first) < width:
        rows = [*rows[:widest], (first.ljust(width), text), *rows[widest + 1 :]]
    return rows


def _argument_name(p: Any) -> str:
    name = p.metavar or p.name.upper()
    return name + ("..." if p.nargs != 1 else "")


def _argument_usage(p: Any) -> str:
    name = _argument_name(p)
    return name if p.required else f"[{name}]"


def _argument_help(p: Any, ctx: Any) -> str:
    text = getattr(p, "help", None) or ""
    default = p.get_default(ctx, call=False) if not p.required else None
    extra = "required" if p.required else (f"default: {default}" if default else "")
    return f"{text}  [{extra}]" if extra else text


def _readable_metavar(p: Any) -> None:
    """An option without an explicit metavar shows its name in capitals (`--warmup WARMUP`),
    never a type such as `<int>` or `<list[str]>`."""
    if p.metavar is None and not p.is_flag and not getattr(p, "count", False):
        p.metavar = p.name.upper()


class Interrupted(Exception):
    """Ctrl-C in a command, carried past typer (which would turn it into a silent exit 130)
    to `main`, which says what was written."""


class Group(typer.core.TyperGroup):
    """The app's groups: global options accepted anywhere (`hoist_globals`); Ctrl-C reaches
    `main` as `Interrupted`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None:
            args = hoist_globals(self, ctx, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            if ctx.parent is not None:
                raise
            raise Interrupted() from None


class Typer(typer.Typer):
    """A Typer whose commands and groups use the layout above."""

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def make_typer(**kwargs: Any) -> Typer:
    return Typer(
        cls=Group,
        rich_markup_mode=None,
        add_completion=False,
        pretty_exceptions_enable=False,
        no_args_is_help=True,
        context_settings=CONTEXT,
        **kwargs,
    )


app = make_typer(
    name="infercc",
    help=(
        "Ahead-of-time compiler and optimizer for ONNX models.\n\n"
        "Start with: infercc optimize model.onnx   (writes model.opt.onnx, validated against "
        "the original under onnxruntime).\n\n"
        "The options below are accepted before or after the command."
    ),
)


def _version(value: bool) -> None:
    if value:
        out.print(f"infercc {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Show tracebacks on errors, and debug logs."),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "-q",
            "--quiet",
            help="No progress display and no warnings; a report says only its summary and verdict.",
        ),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "-v",
            "--verbose",
            count=True,
            show_default=False,
            help="More log lines on stderr (-v info, -vv debug); a report also says what "
            "was not done (every pass, the refusals, each If/Loop body).",
        ),
    ] = 0,
    log_file: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="Also write every log line (debug level) to FILE (appended)."
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    if quiet and verbose:
        raise InferccError("-q and -v exclude each other", "give one of them")
    settings.debug, settings.quiet, settings.verbose, settings.log_file = (
        debug,
        quiet,
        verbose,
        log_file,
    )
    configure_logging(settings)
    ctx = _current_context()
    if ctx is not None and ctx.invoked_subcommand in STATUS_COMMANDS:
        start_status(sys.argv[1:])


def detail() -> int:
    """How much a report says: -1 with -q (its summary lines and verdict), 0 by default (what
    was done), 1 with -v (also what was not: every pass, the refusals, the coverage tree)."""
    return -1 if settings.quiet else min(settings.verbose, 1)


def _current_context() -> Any:
    for module in ("typer._click.globals", "click"):
        try:
            get = importlib.import_module(module).get_current_context
        except (ImportError, AttributeError):
            continue
        ctx = get(silent=True)
        if ctx is not None:
            return ctx
    return None


# --------------------------------------------------------------------------- progress

# The commands whose work takes long enough for a status line (their `Progress` takes it over).
STATUS_COMMANDS = ("optimize", "extract", "bench", "calibrate", "validate", "ci")


@dataclass
class _Status:
    """The status line shown from the start of a command, before its own display."""

    display: Any = None  # rich.progress.Progress on stderr
    task: Any = None


_status = _Status()


def progress_display(transient: bool = True) -> Any:
    """The one progress display on stderr: a spinner, the step's name, a bar and `done/total`
    only once a total is known (never an empty `0/?`), the time since it started. Log lines
    print above it; stdout is left alone (a report printed meanwhile goes to stdout)."""
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars
    from rich.text import Text

    class KnownBar(BarColumn):
        def render(self, task: Any) -> Any:
            return super().render(task) if task.total is not None else Text("")

    class KnownCount(MofNCompleteColumn):
        def render(self, task: Any) -> Any:
            return super().render(task) if task.total is not None else Text("")

    return Bars(
        SpinnerColumn(),
        "{task.description}",
        KnownBar(),
        KnownCount(),
        TimeElapsedColumn(),
        console=err,
        transient=transient,
        redirect_stdout=False,
    )


def start_status(args: Sequence[str], label: str = "starting") -> None:
    """Show `label` on a spinner line at once (while the command imports and reads), unless
    the run is quiet, prints JSON or help, or stderr is no terminal."""
    args = list(args)[: list(args).index("--")] if "--" in args else list(args)
    wanted = not ({"--json", "-h", "--help"} & set(args))
    if _status.display is not None or not wanted or settings.quiet or not err.is_terminal:
        return
    display = progress_display()
    display.start()
    _status.display, _status.task = display, display.add_task(escape(label), total=None)


def take_status() -> tuple[Any, Any]:
    """The status display and its task, for the command's own display to go on with (the
    elapsed time counting from the start); (None, None) when none is shown."""
    taken = (_status.display, _status.task)
    _status.display = _status.task = None
    return taken


def stop_status() -> None:
    """Take the status line off the terminal (before an error, or when nothing took it)."""
    display, _task = take_status()
    if display is not None:
        display.stop()


# --------------------------------------------------------------------------- logging

_HANDLERS: list[logging.Handler] = []


class _Formatter(logging.Formatter):
    """`warning: message` on the console (`warning infercc.x: message` with --debug)."""

    def __init__(self, with_name: bool):
        super().__init__()
        self.with_name = with_name

    def format(self, record: logging.LogRecord) -> str:
        where = f" {record.name}" if self.with_name else ""
        text = f"{record.levelname.lower()}{where}: {record.getMessage()}"
        if record.exc_info and self.with_name:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes (under a progress display,
    its proxy, which prints the line above the display)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def console_level(s: Settings) -> int:
    if s.debug or s.verbose >= 2:
        return logging.DEBUG
    if s.verbose == 1:
        return logging.INFO
    return logging.ERROR if s.quiet else logging.WARNING


def configure_logging(s: Settings) -> None:
    """infercc's log lines to stderr at the level the options ask for, and all of them to
    --log-file. Handlers of an earlier run in this process are replaced."""
    logger = logging.getLogger("infercc")
    for handler in _HANDLERS:
        logger.removeHandler(handler)
        handler.close()
    _HANDLERS.clear()
    console = _StderrHandler()
    console.setLevel(console_level(s))
    console.setFormatter(_Formatter(with_name=s.debug))
    _HANDLERS.append(console)
    if s.log_file is not None:
        _HANDLERS.append(_file_handler(s.log_file))
    for handler in _HANDLERS:
        logger.addHandler(handler)
    logger.setLevel(min(h.level for h in _HANDLERS))


def _file_handler(path: Path) -> logging.Handler:
    try:
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    except OSError as exc:
        raise InferccError(
            f"--log-file {str(path)!r} cannot be opened: {exc.strerror or exc}",
            "give a writable path",
        ) from None
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


# --------------------------------------------------------------------------- entry point


def main() -> None:
    """Entry point: one-line errors with exit code 2; tracebacks only with --debug; with
    --json, the error also as an object on stdout (`json_error`)."""
    from infercc.outputs import forget_written, reclaim_registered

    library_warnings_to_log(_debug())
    run_state.reset()
    forget_written()
    reclaim_registered()  # staging left by killed runs, wherever they staged
    try:
        try:
            code = app(
                args=bare_options(sys.argv[1:], ("--ray",)),
                standalone_mode=False,
                prog_name="infercc",
            )
        finally:
            stop_status()
        _flush_stdout()
        if isinstance(code, int) and code:  # typer.Exit(n) comes back as n in this mode
            sys.exit(code)
    except InferccError as e:
        if _debug():
            raise
        _error(escape(e.message) + (f" — {escape(e.hint)}" if e.hint else ""))
        _fail(e.message, e.hint, e.exit_code)
    except typer.Exit as e:
        _flush_stdout()
        sys.exit(e.exit_code)
    except BrokenPipeError:  # stdout closed early (`| head -1`): not a failure
        silence_stdout()
        sys.exit(0)
    except _click_exceptions() as e:
        e.show()
        command = getattr(getattr(e, "ctx", None), "command_path", None) or "infercc"
        _fail(e.format_message(), f"{command} --help lists the options", EXIT_BAD_INPUT)
    except (Interrupted, KeyboardInterrupt):
        message = interrupted_message()
        err.print(message, highlight=False, markup=False, soft_wrap=True)
        _fail(message, None, EXIT_INTERRUPTED)
    except Exception as e:  # a bug: say so on one line, the traceback with --debug
        if _debug():
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        hint = "rerun with --debug for the traceback and report it"
        _error(f"{type(e).__name__}: {escape(msg)} — {hint}", "internal error")
        _fail(f"internal error: {type(e).__name__}: {msg}", hint, EXIT_FAILED)


@dataclass
class RunState:
    """What this run has done that its ending depends on: whether stdout got its JSON."""

    printed_json: bool = False

    def reset(self) -> None:
        self.printed_json = False


run_state = RunState()


def interrupted_message() -> str:
    """What Ctrl-C left: nothing, or the files published before it came."""
    from infercc.outputs import written_files

    written = written_files()
    if not written:
        return "interrupted; nothing written"
    shown = ", ".join(str(p) for p in written[:3]) + (" ..." if len(written) > 3 else "")
    return f"interrupted after writing {shown}"


def json_error(message: str, hint: str | None, code: int) -> dict[str, Any]:
    """The object `--json` prints on stdout when a command ends without its report."""
    return {"error": message, "hint": hint, "exit": code}


def _fail(message: str, hint: str | None, code: int) -> None:
    """End the run with `code`; under --json, with the error object on stdout unless the
    report was printed."""
    if _wants_json(sys.argv[1:]) and not run_state.printed_json:
        try:
            out.print_json(data=json_error(message, hint, code))
            out.file.flush()
        except BrokenPipeError:
            silence_stdout()
    sys.exit(code)


def _wants_json(args: Sequence[str]) -> bool:
    """--json on the line (before any `--`)."""
    args = list(args)
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def _debug() -> bool:
    """--debug, wherever it was given (also when parsing failed before it was read)."""
    return settings.debug or "--debug" in sys.argv[1:]


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()


def silence_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null, so that nothing more
    (nor the interpreter's final flush) fails on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


def library_warnings_to_log(debug: bool) -> None:
    """Python warnings of the libraries infercc calls (numpy's RuntimeWarning when a folded
    Log meets 0, deprecations) are log records of `py.warnings`, shown with --debug only: they
    are never the first line a user reads on stderr."""
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.DEBUG if debug else logging.ERROR)


def _error(text: str, label: str = "error") -> None:
    err.print(f"[red]{label}:[/] {text}", soft_wrap=True, highlight=False)


def bare_options(args: list[str], names: tuple[str, ...]) -> list[str]:
    """`args` with each of `names` given without its optional value written `NAME=`: it is
    bare when it comes last, before another option, or before an existing file (the manifest
    of `infercc ci --ray infercc.toml`), since an address is never a file."""
    out = []
    for i, arg in enumerate(args):
        if arg in names:
            following = args[i + 1] if i + 1 < len(args) else None
            if following is None or following.startswith("-") or Path(following).is_file():
                arg += "="
        out.append(arg)
    return out


def _click_exceptions() -> tuple[type[Any], ...]:
    """Usage errors (unknown option, missing argument): typer's vendored click, or click's
    (ClickException: `show()`, `format_message()`; typed Any, as the module is found here)."""
    found: list[type[Any]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)
