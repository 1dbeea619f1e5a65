"""The command line run in this process, as `python -m infercc` runs it (`cli.main`: one-line
errors, exit codes), without a subprocess's start-up."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        """stdout and stderr with rich's line wrapping undone."""
        return " ".join((self.out + " " + self.err).split())


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> Ran:
    from infercc.cli import main

    monkeypatch.setattr(sys, "argv", ["infercc", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)
