"""`infercc ci`: every model of a manifest built, validated and timed; reports for CI."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import JsonOpt, Progress, finish, run_record
from infercc.errors import InferccError

EXIT_INTERRUPTED = 130


@app.command(short_help="Build, validate and time every model of a manifest; CI reports.")
def ci(
    config: Annotated[
        Path,
        typer.Argument(metavar="MANIFEST", help="The manifest: infercc.toml, or a pyproject.toml."),
    ],
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            metavar="N",
            help="Models built in parallel (processes) [default: 1].",
            min=1,
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="[ADDRESS]",
            help="Run each model as a task on a Ray cluster instead: --ray alone starts or joins "
            "a local one, --ray auto joins the one in RAY_ADDRESS, --ray HOST:PORT that one. A GPU "
            "target's model runs on a node with that GPU (a100 -> A100). Needs "
            'pip install "infercc[ray]"; the manifest\'s [ray] table has its settings.',
        ),
    ] = None,
    junit: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Write JUnit XML here (one testcase per model)."),
    ] = None,
    json_report: Annotated[
        Path | None,
        typer.Option("--json-report", metavar="FILE", help="Write the JSON report here."),
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Write a Markdown summary here ($GITHUB_STEP_SUMMARY gets it too).",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Where artifacts go [default: the manifest's out_dir]."),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", metavar="NAME", help="Run this model only (repeatable)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Compile, validate and time every model of a manifest; write JUnit XML, JSON and
    Markdown reports for CI. One model's failure never stops the others.

    Exit codes: 0 all passed, 1 a model failed (each named with its reason), 2 bad manifest
    (or, with --ray, a target no node of the cluster has), 130 interrupted (the reports are
    written for what finished)."""
    from infercc.ci.runner import run_ci
    from infercc.cli.render import render_ci

    if ray is not None and jobs is not None:
        raise InferccError(
            "--jobs has no effect with --ray: Ray runs as many models at once as the cluster fits",
            "drop --jobs; [ray] cpus in the manifest sets the CPUs each model asks for",
        )
    with Progress(as_json, keep=True) as progress:
        report = run_ci(
            config,
            jobs or 1,
            ray=True if ray == "" else ray,
            out_dir=out_dir,
            only=only,
            junit=junit,
            json_report=json_report,
            markdown=markdown,
            on_event=progress.event,
            run=run_record(),
        )
    if report.interrupted:
        with contextlib.suppress(typer.Exit):
            finish(report, as_json, render_ci)
        raise typer.Exit(EXIT_INTERRUPTED)
    finish(report, as_json, render_ci)
