"""`infercc bench`: latency per batch size, or two models raced interleaved."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import JsonOpt, Progress, SeedOpt, ShapeOpt, finish
from infercc.errors import InferccError


@app.command()
def bench(
    model: Annotated[Path, typer.Argument(help="An .onnx model or an artifact directory.")],
    shape: ShapeOpt = None,
    batch: Annotated[
        str | None,
        typer.Option(
            help="Batch sizes to run, comma-separated, e.g. 1,8,32 [default: the "
            "model's own batch]. Sets the first axis of every input whose first axis "
            "is symbolic."
        ),
    ] = None,
    warmup: Annotated[int, typer.Option(help="Untimed runs first, per batch size.", min=0)] = 10,
    iters: Annotated[int, typer.Option(help="Timed runs per batch size.", min=1)] = 100,
    compare: Annotated[
        Path | None,
        typer.Option(
            help="A second model or artifact, run interleaved with MODEL (A B A B "
            "...) on the same inputs: prints the per-pair time ratio B/A."
        ),
    ] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Measure latency (p50/p90/p99/mean) and throughput per batch size, or compare two
    models/artifacts run interleaved so the comparison holds on a noisy machine."""
    from infercc.cli.render import render_bench, render_compare
    from infercc.data.profiles import parse_shapes
    from infercc.runtime import bench as engine

    batches = parse_batches(batch)
    shapes = parse_shapes(shape)
    with Progress(as_json, "compare" if compare else "bench") as progress:
        if compare is not None:
            report = engine.compare(
                model, compare, shapes, batches, warmup, iters, seed, progress.tick
            )
        else:
            report = engine.bench(model, shapes, batches, warmup, iters, seed, progress.tick)
    finish(report, as_json, render_compare if compare is not None else render_bench)


def parse_batches(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise InferccError(f"bad --batch {text!r}", "give positive integers, e.g. --batch 1,8,32")
    return values
