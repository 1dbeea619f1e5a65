"""The Typer app, its consoles and the entry point: one-line errors, exit codes."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from infercc import __version__
from infercc.errors import EXIT_BAD_INPUT, InferccError

app = typer.Typer(
    name="infercc",
    help=(
        "Ahead-of-time compiler and optimizer for ONNX models.\n\n"
        "Start with: infercc optimize model.onnx   (writes model.opt.onnx, validated against "
        "the original under onnxruntime)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"infercc {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and debug logs on errors.")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )


def main() -> None:
    """Entry point: one-line errors with exit code 2; tracebacks only with --debug."""
    debug = "--debug" in sys.argv[1:]
    try:
        code = app(args=bare_options(sys.argv[1:], ("--ray",)), standalone_mode=False)
        if isinstance(code, int) and code:  # typer.Exit(n) comes back as n in this mode
            sys.exit(code)
    except InferccError as e:
        if debug:
            raise
        _error(escape(e.message) + (f" — {escape(e.hint)}" if e.hint else ""))
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except _click_exceptions() as e:
        e.show()
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # a bug: say so on one line, the traceback with --debug
        if debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        _error(
            f"{type(e).__name__}: {escape(msg)} — rerun with --debug for the traceback and "
            "report it",
            "internal error",
        )
        sys.exit(EXIT_BAD_INPUT)


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


def _click_exceptions() -> tuple[type[Exception], ...]:
    """Usage errors (unknown option, missing argument): typer's vendored click, or click's."""
    found: list[type[Exception]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)
