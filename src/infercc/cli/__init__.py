"""The command line: a Typer app (`infercc.cli.app`) over the Python API, one module per
command (`optimize`, `extract`, `info`: inspect, passes and targets, `bench`, `calibrate`,
`validate`, `ci`, `cache`), the options and helpers they share (`common`), rendered with rich
(`infercc.cli.render`). Importing this package registers every command, in `--help` order."""

from __future__ import annotations

import importlib

from infercc.cli.app import app, main

COMMAND_MODULES = ("optimize", "extract", "info", "bench", "calibrate", "validate", "ci", "cache")
for _module in COMMAND_MODULES:
    importlib.import_module(f"infercc.cli.{_module}")

__all__ = ["app", "main"]
