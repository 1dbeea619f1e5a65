"""The command line run in this process, as `python -m infercc` runs it (`cli.main`: one-line
errors, exit codes), without a subprocess's start-up: `tests.helpers.run_cli`, with the result
as `Ran` (its `text` joins stdout and stderr with rich's line wrapping undone)."""

from __future__ import annotations

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
    """`infercc ARGS` in this process (`monkeypatch` and `capsys` are kept for the callers;
    `run_cli` isolates and captures by itself)."""
    from tests.helpers import run_cli

    done = run_cli(*args)
    return Ran(done.returncode, done.stdout, done.stderr)
