"""`infercc optimize`: its options make one `BuildConfig`, which `infercc.api.optimize` builds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import (
    AtolOpt,
    CacheDirOpt,
    JsonOpt,
    MinCosineOpt,
    Progress,
    RtolOpt,
    ShapeOpt,
    StrictCoverageOpt,
    TolOpt,
    finish,
)
from infercc.config import BuildConfig, OrtOptions, TrtOptions
from infercc.errors import InferccError

_TRT = "With --backend tensorrt: "

OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "-o",
        "--output",
        help="Where to write the optimized model [default: <stem>.opt.onnx beside the input]; "
        "a path not ending in .onnx builds an artifact directory with --backend.",
    ),
]
TargetOpt = Annotated[
    str, typer.Option(help="Target to optimize for (`infercc targets` lists them).")
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        help="With -o DIR: the backend that builds the artifact (ort, tensorrt, "
        "none) [default: ort for cpu, tensorrt for GPU targets]."
    ),
]
StaticShapesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--static-shapes",
        metavar="NAME=DIMS",
        help="Fix an input's dimensions in the model itself, e.g. --static-shapes "
        "input_ids=1x128 (repeatable), so all shape arithmetic after it folds. The result is "
        "valid only for those input shapes (the report and manifest say so); without it, "
        "symbolic dimensions stay symbolic.",
    ),
]
NoTuneOpt = Annotated[
    bool, typer.Option("--no-tune", help="Build the artifact without autotuning.")
]
OrtOptimizedOpt = Annotated[
    bool,
    typer.Option(
        "--ort-optimized-model",
        help="With --backend ort: also save onnxruntime's own optimized graph "
        "(ort_optimized.onnx) for a faster start on this host.",
    ),
]
DataOpt = Annotated[
    Path | None,
    typer.Option(
        help="Validate on samples: a directory of .npz (one sample each, keyed by "
        "input name) or <input>.npy files, or one .npz."
    ),
]
DisablePassOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--disable-pass", help="Skip a pass by name (repeatable); `infercc passes` lists them."
    ),
]
AssumeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--assume",
        help="State an assumption about the inputs (repeatable) under which more rewrites are "
        "exact; the model is then exact only on inputs that satisfy it. nonempty-sequences: no "
        "sequence is all padding (its attention_mask is not all zeros), which removes the NaN "
        "guard after attention Softmax. Recorded in the manifest and the report; validation's "
        "random inputs satisfy it.",
    ),
]
PortableOpt = Annotated[
    bool,
    typer.Option(
        help="Keep standard ONNX only (no onnxruntime contrib ops; they are made only for "
        "onnxruntime on the cpu target)."
    ),
]
NoValidateOpt = Annotated[
    bool, typer.Option("--no-validate", help="Skip comparing outputs with the original.")
]
VerifyOpt = Annotated[
    bool, typer.Option(help="Check the IR's invariants after every pass (slower).")
]
FoldLimitOpt = Annotated[
    str | None,
    typer.Option(
        help="Largest constant constant folding may create: bytes or a size, e.g. 1MiB "
        "[default: 16MiB]."
    ),
]
FreezeInitializersOpt = Annotated[
    bool,
    typer.Option(
        "--freeze-initializers",
        help="Treat initializers the model also lists as graph inputs (IR >= 4: defaults a "
        "caller may override) as constants, so they fold and fuse; they stop being inputs. "
        "Without it they stay inputs.",
    ),
]
ExternalDataOpt = Annotated[
    bool,
    typer.Option(
        "--external-data",
        help="Write weights to <output>.data even when under 2 GB (always done above 2 GB).",
    ),
]
AlignOpt = Annotated[int, typer.Option(help="Byte alignment of tensors in the memory plan.", min=1)]
Fp16Opt = Annotated[
    bool,
    typer.Option(
        "--fp16",
        help="Convert weights and compute to float16 (inputs and outputs keep their types; "
        "risky ops stay float32, listed in the report). Validated by cosine >= 0.999 "
        "against the original.",
    ),
]
Fp16IoOpt = Annotated[
    bool, typer.Option("--fp16-io", help="With --fp16: float16 inputs and outputs too.")
]
KeepFp32Opt = Annotated[
    list[str] | None,
    typer.Option(
        "--keep-fp32", help="With --fp16: an op type or node name to keep in float32 (repeatable)."
    ),
]
RangesOpt = Annotated[
    Path | None,
    typer.Option(
        help="With --fp16: calibrated ranges (the ranges.json `infercc calibrate` "
        "writes); a tensor whose range overflows float16 stays float32."
    ),
]
BisectOpt = Annotated[
    bool,
    typer.Option(
        "--bisect",
        help="When validation fails (or the optimized model does not run), rebuild with "
        "passes disabled to name the pass, rewrite and node that broke it, however long it "
        "takes (without it, only when that should take under 20 s).",
    ),
]
ExplainOpt = Annotated[
    bool, typer.Option(help="List every rewrite that matched but refused, and why.")
]
PluginOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--plugin",
        metavar="LIB",
        help=_TRT + "a TensorRT plugin library (.so) to load before parsing and loading "
        "(repeatable).",
    ),
]
WorkspaceOpt = Annotated[
    str | None,
    typer.Option(
        help=_TRT + "the builder's workspace limit, bytes or e.g. 512MiB, 4GiB [default: the "
        "target's memory less weights, activations and 512 MiB].",
    ),
]
OptLevelOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=5,
        help=_TRT + "builder optimization level 0-5 (TensorRT's default 3; higher builds "
        "slower, may run faster).",
    ),
]
HwCompatOpt = Annotated[
    str,
    typer.Option(
        help=_TRT + "hardware compatibility: none, ampere+ (runs on any GPU of compute "
        "capability >= 8.0) or same-cc (any GPU of the same compute capability); compatible "
        "engines may run slower.",
    ),
]
VersionCompatibleOpt = Annotated[
    bool,
    typer.Option(
        "--version-compatible",
        help=_TRT + "build an engine later TensorRT versions (same major) can load, at some "
        "speed cost.",
    ),
]
TimingCacheStrictOpt = Annotated[
    bool,
    typer.Option(
        "--timing-cache-strict",
        help=_TRT + "fail when no timing cache exists for this TensorRT, GPU and CUDA "
        "(reproducible CI builds).",
    ),
]
StrictTargetOpt = Annotated[
    bool,
    typer.Option(
        "--strict-target",
        help=_TRT + "refuse to build when the GPU here is not the --target's (engines are "
        "tuned for, and tied to, the GPU that builds them).",
    ),
]
Bf16Opt = Annotated[
    bool,
    typer.Option(
        "--bf16",
        help="With --backend tensorrt 10.x: let TensorRT choose bfloat16 kernels "
        "(BuilderFlag.BF16). TensorRT 11 takes precision from the graph only.",
    ),
]
Int8Opt = Annotated[
    bool,
    typer.Option(
        "--int8",
        help="Build int8 from the graph's Q/DQ pairs (infercc calibrate writes such a model), "
        "or with --backend tensorrt on TensorRT 10 from --calib-cache.",
    ),
]
CalibCacheOpt = Annotated[
    Path | None,
    typer.Option(
        help="With --int8 on TensorRT 10: a TensorRT calibration cache (infercc calibrate "
        "writes one) giving the int8 scales.",
    ),
]
ProfileOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--profile",
        metavar="SPECS",
        help=_TRT + "one more optimization profile, comma-separated NAME=MIN:OPT:MAX specs, "
        'e.g. "ids=1x16:1x64:1x128" (repeatable; --shape is the first).',
    ),
]
ShapeInputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--shape-input",
        metavar="NAME=MIN:OPT:MAX",
        help=_TRT + "the range of a shape-tensor input's values, x-separated, e.g. "
        "new_shape=1x64:8x64:32x64 (repeatable).",
    ),
]


@app.command()
def optimize(
    model: Annotated[Path, typer.Argument(help="The ONNX model to optimize (never modified).")],
    output: OutputOpt = None,
    target: TargetOpt = "cpu",
    shape: ShapeOpt = None,
    static_shapes: StaticShapesOpt = None,
    backend: BackendOpt = None,
    cache_dir: CacheDirOpt = None,
    no_tune: NoTuneOpt = False,
    ort_optimized_model: OrtOptimizedOpt = False,
    data: DataOpt = None,
    disable_pass: DisablePassOpt = None,
    portable: PortableOpt = False,
    assume: AssumeOpt = None,
    no_validate: NoValidateOpt = False,
    verify: VerifyOpt = False,
    fold_limit: FoldLimitOpt = None,
    freeze_initializers: FreezeInitializersOpt = False,
    external_data: ExternalDataOpt = False,
    align: AlignOpt = 64,
    fp16: Fp16Opt = False,
    fp16_io: Fp16IoOpt = False,
    keep_fp32: KeepFp32Opt = None,
    ranges: RangesOpt = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    min_cosine: MinCosineOpt = None,
    tol: TolOpt = None,
    strict_coverage: StrictCoverageOpt = False,
    bisect: BisectOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    plugin: PluginOpt = None,
    workspace: WorkspaceOpt = None,
    opt_level: OptLevelOpt = None,
    hw_compat: HwCompatOpt = "none",
    version_compatible: VersionCompatibleOpt = False,
    timing_cache_strict: TimingCacheStrictOpt = False,
    strict_target: StrictTargetOpt = False,
    bf16: Bf16Opt = False,
    int8: Int8Opt = False,
    calib_cache: CalibCacheOpt = None,
    profile: ProfileOpt = None,
    shape_input: ShapeInputOpt = None,
) -> None:
    """Optimize MODEL: fold constants, drop dead code and no-ops, fuse Conv+BN+activation and
    Q/K/V projections, attention into onnxruntime's Attention op (cpu target), schedule for
    memory; validate against the original; write the result atomically, with its memory plan
    (<stem>.memory_plan.json) beside it.

    -o model.opt.onnx writes the optimized model; -o DIR builds an artifact directory there
    with --backend (model.onnx, manifest.json, memory_plan.json and the backend's tuned files).
    A flag that would change nothing for this build (a TensorRT option without TensorRT,
    --keep-fp32 without --fp16, ...) is an error naming it.

    Validation runs the original and the optimized model on the same inputs, at a second
    shape profile too when an input has a symbolic dimension (a range --shape NAME=MIN:OPT:MAX
    pins the second at MAX), and reports whether the inputs ran each rewritten If/Loop body.
    When the original fails on the generated inputs, other sizes and values are tried first.

    Exit codes: 0 success, 1 validation failed or the optimized model does not run (nothing
    written; infercc's failure), 2 bad input.
    """
    from infercc.api import optimize as run
    from infercc.check.tolerances import parse_tolerances
    from infercc.cli.render import render_optimize
    from infercc.data.profiles import parse_profiles

    config = BuildConfig(
        target=target,
        backend=backend,
        precision=_precision(fp16=fp16, bf16=bf16, int8=int8),
        fp16_io=fp16_io,
        keep_fp32=tuple(keep_fp32 or ()),
        ranges=str(ranges) if ranges is not None else (),
        portable=portable,
        assume=tuple(assume or ()),
        fold_limit=fold_limit,
        freeze_initializers=freeze_initializers,
        disable_passes=tuple(disable_pass or ()),
        shapes=tuple(parse_profiles(shape)),
        static_shapes=tuple(parse_profiles(static_shapes)),
        verify=verify,
        external_data=external_data,
        alignment=align,
        tune=not no_tune,
        validate=not no_validate,
        data=str(data) if data is not None else None,
        atol=atol,
        rtol=rtol,
        min_cosine=min_cosine,
        tolerances=parse_tolerances(tol),
        strict_coverage=strict_coverage,
        bisect=bisect,
        ort=OrtOptions(optimized_model=ort_optimized_model),
        tensorrt=TrtOptions(
            workspace=workspace,
            opt_level=opt_level,
            hw_compat=hw_compat,
            version_compatible=version_compatible,
            timing_cache_strict=timing_cache_strict,
            strict_target=strict_target,
            plugins=tuple(str(p) for p in plugin or ()),
            calib_cache=str(calib_cache) if calib_cache is not None else None,
            profiles=tuple(profile or ()),
            shape_inputs=tuple(shape_input or ()),
        ),
    )
    with Progress(as_json) as progress:
        report = run(model, output, config, cache_dir=cache_dir, on_step=progress.step)
    finish(report, as_json, lambda r, console: render_optimize(r, console, explain=explain))


def _precision(**flags: bool) -> str:
    """fp32, or the one precision flag given; two of them are an error."""
    given = [name for name, on in flags.items() if on]
    if len(given) > 1:
        raise InferccError(
            f"--{given[0]} and --{given[1]} exclude each other: a build has one precision",
            "pick one",
        )
    return given[0] if given else "fp32"
