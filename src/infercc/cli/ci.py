"""`infercc ci`: every model of a manifest built, validated and timed; reports for CI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import JsonOpt, Progress, finish


@app.command()
def ci(
    config: Annotated[
        Path, typer.Argument(help="The manifest: infercc.toml, or a pyproject.toml.")
    ],
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Models built in parallel (processes).", min=1)
    ] = 1,
    junit: Annotated[
        Path | None, typer.Option(help="Write JUnit XML here (one testcase per model).")
    ] = None,
    json_report: Annotated[
        Path | None, typer.Option("--json-report", help="Write the JSON report here.")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(help="Write a Markdown summary here ($GITHUB_STEP_SUMMARY gets it too)."),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option(help="Where artifacts go (default: the manifest's out_dir).")
    ] = None,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Run this model only (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Compile, validate and time every model of a manifest; write JUnit XML, JSON and
    Markdown reports for CI. One model's failure never stops the others.

    Exit codes: 0 all passed, 1 a model failed (each named with its reason), 2 bad manifest."""
    from infercc.ci.runner import run_ci
    from infercc.cli.render import render_ci

    with Progress(as_json, keep=True) as progress:
        report = run_ci(
            config,
            jobs,
            out_dir=out_dir,
            only=only,
            junit=junit,
            json_report=json_report,
            markdown=markdown,
            on_event=progress.event,
        )
    finish(report, as_json, render_ci)
