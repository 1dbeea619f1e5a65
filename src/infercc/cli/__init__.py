"""The command line: a Typer app over the Python API (`infercc.cli.commands`), rendered with
rich (`infercc.cli.render`)."""

from __future__ import annotations

from infercc.cli.commands import app, main

__all__ = ["app", "main"]
