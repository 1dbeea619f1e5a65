"""`infercc validate`: a candidate against its reference or goldens, and `--bisect`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import (
    AtolOpt,
    CustomOpLibOpt,
    DataLoaderOpt,
    InputRangeOpt,
    JsonOpt,
    MinCosineOpt,
    Progress,
    RtolOpt,
    SeedOpt,
    ShapeOpt,
    StrictCoverageOpt,
    TolOpt,
    data_source,
    finish,
)
from infercc.config import BuildConfig
from infercc.errors import InferccError


@app.command(short_help="Check an optimized model or artifact against its original.")
def validate(
    candidate: Annotated[
        Path | None,
        typer.Argument(
            metavar="CANDIDATE",
            show_default=False,
            help="The optimized .onnx model, or an artifact directory (run through its "
            "backend). Omit it with --save-golden to only write goldens.",
        ),
    ] = None,
    reference: Annotated[
        Path | None, typer.Option(metavar="MODEL", help="The original model to compare with.")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Samples: a directory of .npz (keyed by input name) or .npy files.",
        ),
    ] = None,
    data_loader: DataLoaderOpt = None,
    input_range: InputRangeOpt = None,
    shape: ShapeOpt = None,
    seed: SeedOpt = 0,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    min_cosine: MinCosineOpt = None,
    tol: TolOpt = None,
    strict_coverage: StrictCoverageOpt = False,
    ort_custom_op_lib: CustomOpLibOpt = None,
    save_golden: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Write the inputs and the reference's outputs here (npz), for --golden later.",
        ),
    ] = None,
    golden: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Compare with goldens written by --save-golden (no reference needed).",
        ),
    ] = None,
    bisect: Annotated[
        bool,
        typer.Option(
            "--bisect",
            help="On failure, rebuild from --reference with passes disabled one at a time, "
            "bisect the guilty pass's rewrites and name the node where outputs first diverge.",
        ),
    ] = False,
    target: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="With --bisect and a plain .onnx candidate: the target it was built for (an "
            "artifact records its whole build in manifest.json; a plain model is rebuilt with "
            "the default options).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check CANDIDATE against --reference (or --golden): per output max abs and relative
    error, cosine and the fraction of elements out of tolerance. Tolerances follow the
    candidate's precision (from its manifest, or read from the model). With --reference, the
    inputs cover a second shape profile when an input has a symbolic dimension, and the report
    says whether they ran each If/Loop body the candidate changed.

    Exit codes: 0 passed, 1 failed (also an artifact that does not load, or a model that
    loads and fails to run), 2 bad input (also a candidate model that cannot be read, whose
    external data leaves its folder, or that onnxruntime refuses to load)."""
    from infercc.check.candidates import validate_candidate
    from infercc.check.tolerances import parse_tolerances
    from infercc.cli.render import render_candidate
    from infercc.data.profiles import parse_profiles

    profiles = parse_profiles(shape)
    from infercc.config import input_ranges
    from infercc.data.feeds import input_ranges as generated_ranges

    source = data_source(data, data_loader)
    ranges = {name: (lo, hi) for name, lo, hi in input_ranges(tuple(input_range or ()))}
    if ranges and (source is not None or golden is not None):
        raise InferccError(
            "--input-range has no effect with "
            + ("--golden" if golden is not None else "--data")
            + ": those inputs are fed as they are",
            "drop --input-range",
        )
    with Progress(as_json) as progress, generated_ranges(ranges):
        report = validate_candidate(
            candidate,
            reference,
            golden=golden,
            save_golden_to=save_golden,
            data=source,
            shapes={p.name: p.opt for p in profiles},
            second_shapes=BuildConfig(shapes=tuple(profiles)).second_pins,
            seed=seed,
            atol=atol,
            rtol=rtol,
            min_cosine=min_cosine,
            tolerances=parse_tolerances(tol),
            bisect=bisect,
            target=target,
            on_step=progress.step,
            strict_coverage=strict_coverage,
            ort_custom_op_libs=tuple(ort_custom_op_lib or ()),
            given_by_user=True,
        )
    finish(report, as_json, render_candidate)
