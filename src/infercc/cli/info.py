"""`infercc inspect`, `infercc passes` and `infercc targets`: what a model, the pipeline and
the target database hold."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import JsonOpt, ShapeOpt, finish


@app.command(short_help="Describe a model: inputs, ops, FLOPs; with --target, its roofline.")
def inspect(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="The ONNX model to describe.")],
    shape: ShapeOpt = None,
    target: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Add the roofline analysis and memory budget on this target "
            "(`infercc targets` lists them).",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --target: draw every node on the target's roofline into this "
            "PNG (needs matplotlib: pip install 'infercc[plot]').",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Describe MODEL: inputs and outputs, opsets, op histogram, parameters, and FLOPs of
    Conv/MatMul/Gemm at a shape profile (--shape pins inputs; other symbolic dims are 1 for the
    first axis and 8 for others).

    With --target: per node FLOPs, bytes, arithmetic intensity, memory- or compute-bound and
    roofline time; the ten slowest nodes; the total roofline latency (a lower bound for one
    inference); and the memory budget (weights + activation arena + workspace), with the
    largest batch that fits when the batch dimension is symbolic."""
    from infercc.analysis.model_info import inspect_model
    from infercc.cli.render import render_inspect
    from infercc.data.profiles import parse_shapes

    report = inspect_model(model, parse_shapes(shape), target=target, plot=plot)
    finish(report, as_json, render_inspect)


@app.command(short_help="List the pipelines and the passes (the names --disable-pass takes).")
def passes(as_json: JsonOpt = False) -> None:
    """List every pipeline (its stages, in order) and every pass with what it does.

    `--disable-pass NAME` of optimize and calibrate takes these names; a pass that the command
    does not run is refused."""
    from infercc.cli.render import render_passes
    from infercc.passes import catalog

    listed = catalog()
    finish(listed, as_json, render_passes, data=listed)


@app.command(short_help="List the targets: peak FLOP/s, memory, bandwidth.")
def targets(as_json: JsonOpt = False) -> None:
    """List the targets --target accepts, with their peak FLOP/s, memory and bandwidth.

    The cpu target is this host, detected (cores, vector features, memory; bandwidth measured
    once, or set with INFERCC_CPU_BANDWIDTH_GBS)."""
    from infercc.analysis.targets import list_targets
    from infercc.cli.render import render_targets

    items = list_targets()
    finish(items, as_json, render_targets, data=[t.to_dict() for t in items])
