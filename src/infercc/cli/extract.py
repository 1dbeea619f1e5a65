"""`infercc extract`: the subgraph between named tensors, checked and validated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import JsonOpt, Progress, SeedOpt, ShapeOpt, finish
from infercc.errors import InferccError


@app.command(short_help="Cut out the subgraph between named tensors (checked, validated).")
def extract(
    model: Annotated[
        Path, typer.Argument(metavar="MODEL", help="The ONNX model to cut (never modified).")
    ],
    output_arg: Annotated[
        Path | None,
        typer.Argument(
            metavar="OUTPUT", help="The .onnx file to write (or -o).", show_default=False
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", metavar="PATH", help="Same as OUTPUT.")
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--inputs",
            metavar="NAMES",
            help="Tensors that become the subgraph's inputs, comma-separated (repeatable): "
            "graph inputs or node outputs [default: the graph inputs the outputs need].",
        ),
    ] = None,
    outputs: Annotated[
        list[str] | None,
        typer.Option(
            "--outputs",
            metavar="NAMES",
            help="Tensors that become its outputs, comma-separated (repeatable) [default: the "
            "model's outputs].",
        ),
    ] = None,
    shape: ShapeOpt = None,
    data: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Validate on samples of the original's inputs (a directory of .npz or .npy "
            "files, or one .npz) instead of random inputs.",
        ),
    ] = None,
    no_validate: Annotated[
        bool,
        typer.Option(
            "--no-validate", help="Skip running the subgraph against the original (checker only)."
        ),
    ] = False,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Write the subgraph of MODEL that computes --outputs from --inputs, as a model of its own
    (the nodes between them, and the constants they read).

    e.g. infercc extract model.onnx head.onnx --inputs hidden --outputs logits

    The result is checked with onnx.checker and validated under onnxruntime: the original runs
    on random inputs (or --data) with the cut tensors as extra outputs, the subgraph runs on
    what the original gave its inputs, and its outputs must match. Nothing is written when
    either fails.

    Exit codes: 0 written, 1 the subgraph failed its check (nothing written), 2 bad input."""
    from infercc.cli.render import render_extract
    from infercc.data.profiles import parse_shapes
    from infercc.subgraph import extract as run
    from infercc.subgraph import split_names

    if output_arg is not None and output is not None:
        raise InferccError(
            f"the output is given twice: {output_arg} and -o {output}", "give it once"
        )
    dest = output_arg or output
    if dest is None:
        raise InferccError("no OUTPUT given", "e.g. infercc extract in.onnx out.onnx --outputs y")
    if no_validate and (data is not None or shape):
        flag = "--data" if data is not None else "--shape"
        raise InferccError(f"{flag} has no effect with --no-validate", f"drop {flag}")
    with Progress(as_json) as progress:
        report = run(
            model,
            dest,
            split_names(inputs),
            split_names(outputs),
            shapes=parse_shapes(shape),
            data=data,
            seed=seed,
            validate=not no_validate,
            on_step=progress.step,
        )
    finish(report, as_json, render_extract)
