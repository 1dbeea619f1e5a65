"""`infercc optimize`: its options make one `BuildConfig`, which `infercc.api.optimize` builds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from infercc.cli.app import app, err, settings
from infercc.cli.common import (
    AtolOpt,
    CacheDirOpt,
    DataLoaderOpt,
    InputRangeOpt,
    JsonOpt,
    MinCosineOpt,
    Progress,
    RtolOpt,
    ShapeOpt,
    StrictCoverageOpt,
    TolOpt,
    data_source,
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
        metavar="PATH",
        help="Where to write the optimized model [default: <stem>.opt.onnx beside the input]; "
        "a path not ending in .onnx (any case) builds an artifact directory with --backend "
        "(said on stderr). Same as the second argument.",
    ),
]
TargetOpt = Annotated[
    str,
    typer.Option(metavar="NAME", help="Target to optimize for (`infercc targets` lists them)."),
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
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
        metavar="PATH",
        help="Validate on samples: a directory of .npz (one sample each, keyed by "
        "input name) or <input>.npy files, or one .npz."
    ),
]
DisablePassOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--disable-pass",
        metavar="PASS",
        help="Skip a pass by name (repeatable); `infercc passes` lists them.",
    ),
]
AssumeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--assume",
        metavar="NAME",
        help="State an assumption about the inputs (repeatable) under which more rewrites are "
        "exact; the model is then exact only on inputs that satisfy it. nonempty-sequences: no "
        "sequence is all padding (its attention_mask is not all zeros) and no decoder prompt is "
        "padded on the left, which removes the NaN guard after attention Softmax and turns a "
        "decoder's attention with its KV cache into GroupQueryAttention. Recorded in the "
        "manifest and the report; validation's random inputs satisfy it.",
    ),
]
PortableOpt = Annotated[
    bool,
    typer.Option(
        "--portable",
        help="Keep standard ONNX only (no onnxruntime contrib ops; they are made only for "
        "onnxruntime on the cpu target)."
    ),
]
NoValidateOpt = Annotated[
    bool, typer.Option("--no-validate", help="Skip comparing outputs with the original.")
]
VerifyOpt = Annotated[
    bool, typer.Option("--verify", help="Check the IR's invariants after every pass (slower).")
]
FoldLimitOpt = Annotated[
    str | None,
    typer.Option(
        metavar="SIZE",
        help="Largest constant that folding may create: bytes or a size, e.g. 1MiB "
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
AlignOpt = Annotated[
    int, typer.Option(metavar="N", help="Byte alignment of tensors in the memory plan.", min=1)
]
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
        "--keep-fp32",
        metavar="OP_OR_NODE",
        help="With --fp16: an op type or node name to keep in float32 (repeatable).",
    ),
]
RangesOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
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
    bool, typer.Option("--explain", help="List every rewrite that matched but refused, and why.")
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
        metavar="SIZE",
        help=_TRT + "the builder's workspace limit, bytes or e.g. 512MiB, 4GiB [default: the "
        "target's memory less weights, activations and 512 MiB].",
    ),
]
OptLevelOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=5,
        metavar="0-5",
        help=_TRT + "builder optimization level 0-5 (TensorRT's default 3; higher builds "
        "slower, may run faster).",
    ),
]
HwCompatOpt = Annotated[
    str,
    typer.Option(
        metavar="LEVEL",
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
        metavar="FILE",
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


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="Replay a build from FILE: a record that --save-config wrote (TOML or JSON), "
        "an optimize --json report, or an artifact's manifest.json. It gives the build "
        "options (and the model and output, where it names them); flags given here win.",
    ),
]
SaveConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--save-config",
        metavar="FILE",
        help="Write the resolved build (model, output, every option) to FILE, TOML for a "
        ".toml name, else JSON, for --config to replay.",
    ),
]


@app.command(short_help="Optimize a model, validate it, write it (or build an artifact).")
def optimize(
    ctx: typer.Context,
    model: Annotated[
        Path | None,
        typer.Argument(
            metavar="MODEL",
            help="The ONNX model to optimize (never modified); may come from --config.",
            show_default=False,
        ),
    ] = None,
    output_arg: Annotated[
        Path | None,
        typer.Argument(
            metavar="OUTPUT",
            help="Where to write the result, as -o (give one of the two).",
            show_default=False,
        ),
    ] = None,
    output: OutputOpt = None,
    target: TargetOpt = "cpu",
    shape: ShapeOpt = None,
    static_shapes: StaticShapesOpt = None,
    backend: BackendOpt = None,
    cache_dir: CacheDirOpt = None,
    no_tune: NoTuneOpt = False,
    ort_optimized_model: OrtOptimizedOpt = False,
    data: DataOpt = None,
    data_loader: DataLoaderOpt = None,
    input_range: InputRangeOpt = None,
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
    config: ConfigOpt = None,
    save_config: SaveConfigOpt = None,
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
    """Optimize MODEL: fold constants, drop dead code and no-ops, fuse Conv+BN+activation,
    Q/K/V projections and MatMul+bias (into Gemm), attention into onnxruntime's Attention op
    and RoPE into RotaryEmbedding (cpu target; a decoder's attention with its KV cache into
    GroupQueryAttention with --assume nonempty-sequences), schedule for memory; validate
    against the original; write the result atomically, with its memory plan
    (<stem>.memory_plan.json) beside it.

    `infercc optimize in.onnx out.onnx` (or -o out.onnx) writes the optimized model; an
    OUTPUT not ending in .onnx is an artifact directory built with --backend (model.onnx,
    manifest.json, memory_plan.json and the backend's tuned files). A flag that would change
    nothing for this build (a TensorRT option without TensorRT, --keep-fp32 without --fp16,
    ...) is an error naming it.

    Validation runs the original and the optimized model on the same inputs, at a second
    shape profile too when an input has a symbolic dimension (a range --shape NAME=MIN:OPT:MAX
    pins the second at MAX), and reports whether the inputs ran each rewritten If/Loop body.
    When the original fails on the generated inputs, other sizes and values are tried first.
    A decoder with KV-cache inputs is validated at a prefill and at a chunk after a past.

    Exit codes: 0 success, 1 validation failed or the optimized model does not run (nothing
    written; infercc's failure), 2 bad input.
    """
    from infercc.api import default_output, is_model_file
    from infercc.api import optimize as run
    from infercc.check.tolerances import parse_tolerances
    from infercc.cli.render import render_optimize
    from infercc.data.profiles import parse_profiles

    flags = BuildConfig(
        target=target,
        backend=backend,
        precision=_precision(fp16=fp16, bf16=bf16, int8=int8),
        fp16_io=fp16_io,
        keep_fp32=tuple(keep_fp32 or ()),
        ranges=_abspath(ranges) or (),
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
        data=data_source(_abspath(data), data_loader),
        input_ranges=tuple(input_range or ()),
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
            plugins=tuple(_abspath(p) for p in plugin or ()),
            calib_cache=_abspath(calib_cache),
            profiles=tuple(profile or ()),
            shape_inputs=tuple(shape_input or ()),
        ),
    )
    out = _one_output(output_arg, output)
    cfg = flags
    if config is not None:
        from infercc.record import load_record

        record = load_record(config)
        cfg = merge_flags(record.config, flags, given_flags(ctx))
        model = model or record.model
        out = out or record.output
    if model is None:
        raise InferccError("no MODEL given", "name the model, or give --config with a model")
    out = out or default_output(model)
    ctx.params.update(model=model, output=out)  # the run record names what was resolved
    ctx.params.pop("output_arg", None)
    resolved = cfg.resolve(artifact=not is_model_file(out))
    if save_config is not None and not save_config.parent.is_dir():
        raise InferccError(
            f"--save-config: directory {save_config.parent} does not exist", "create it first"
        )
    with Progress(as_json) as progress:
        report = run(model, out, cfg, cache_dir=cache_dir, on_step=progress.step)
    if not is_model_file(out) and out.suffix:
        _say_artifact(out, resolved.backend, report.passed)
    if save_config is not None:  # the build was valid: record it (also when validation failed)
        from infercc.record import save_record

        save_record(save_config, model, out, resolved)
    finish(report, as_json, lambda r, console: render_optimize(r, console, explain=explain))


def _abspath(path: Path | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def _one_output(positional: Path | None, option: Path | None) -> Path | None:
    if positional is not None and option is not None:
        raise InferccError(
            f"the output is given twice: {positional} and -o {option}",
            "give it once: infercc optimize in.onnx out.onnx, or -o out.onnx",
        )
    return positional or option


_NEAR_ONNX = ("onx", "onn", "onxx", "omnx", "onnnx", "onnx2", "nnx", "onmx", "oonx")


def _say_artifact(out: Path, backend: str | None, built: bool) -> None:
    """Say that an output named like a file (`m.onxx`, `model.pb`) got an artifact directory:
    only a name ending in .onnx (any case) is written as a model file."""
    suffix = out.suffix.lower().lstrip(".")
    typo = f"; did you mean {out.with_suffix('.onnx').name}?" if suffix in _NEAR_ONNX else ""
    what = "built" if built else "would have built"
    if not settings.quiet:
        err.print(
            f"note: {out} does not end in .onnx, so infercc {what} an artifact directory "
            f"there (backend {backend}){typo}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


# CLI parameter -> the BuildConfig key it sets ("ort.x" / "tensorrt.x": a key of that table).
FLAG_KEYS = {
    "target": "target",
    "backend": "backend",
    "fp16": "precision",
    "bf16": "precision",
    "int8": "precision",
    "fp16_io": "fp16_io",
    "keep_fp32": "keep_fp32",
    "ranges": "ranges",
    "portable": "portable",
    "fold_limit": "fold_limit",
    "freeze_initializers": "freeze_initializers",
    "disable_pass": "disable_passes",
    "shape": "shapes",
    "static_shapes": "static_shapes",
    "assume": "assume",
    "verify": "verify",
    "external_data": "external_data",
    "align": "alignment",
    "no_tune": "tune",
    "no_validate": "validate",
    "data": "data",
    "data_loader": "data",
    "input_range": "input_ranges",
    "atol": "atol",
    "rtol": "rtol",
    "min_cosine": "min_cosine",
    "tol": "tolerances",
    "strict_coverage": "strict_coverage",
    "bisect": "bisect",
    "ort_optimized_model": "ort.optimized_model",
    "plugin": "tensorrt.plugins",
    "workspace": "tensorrt.workspace",
    "opt_level": "tensorrt.opt_level",
    "hw_compat": "tensorrt.hw_compat",
    "version_compatible": "tensorrt.version_compatible",
    "timing_cache_strict": "tensorrt.timing_cache_strict",
    "strict_target": "tensorrt.strict_target",
    "calib_cache": "tensorrt.calib_cache",
    "profile": "tensorrt.profiles",
    "shape_input": "tensorrt.shape_inputs",
}


def given_flags(ctx: Any) -> list[str]:
    """The build keys of the options given on the command line (or by environment)."""
    keys = []
    for name, key in FLAG_KEYS.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            keys.append(key)
    return keys


def merge_flags(base: BuildConfig, flags: BuildConfig, keys: list[str]) -> BuildConfig:
    """`base` (a replayed record) with the values of `keys` taken from `flags`."""
    data, over = base.to_dict(), flags.to_dict()
    for key in keys:
        table, _, sub = key.rpartition(".")
        if table:
            data[table] = {**data[table], sub: over[table][sub]}
        else:
            data[key] = over[key]
    return BuildConfig.from_dict(data)


def _precision(**flags: bool) -> str:
    """fp32, or the one precision flag given; two of them are an error."""
    given = [name for name, on in flags.items() if on]
    if len(given) > 1:
        raise InferccError(
            f"--{given[0]} and --{given[1]} exclude each other: a build has one precision",
            "pick one",
        )
    return given[0] if given else "fp32"
