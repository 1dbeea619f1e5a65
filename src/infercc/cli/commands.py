"""The `infercc` command line: parse options, call the Python API, render. No logic here."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from infercc import __version__
from infercc.errors import EXIT_BAD_INPUT, EXIT_VALIDATION_FAILED, InferccError

app = typer.Typer(
    name="infercc",
    help=(
        "Ahead-of-time compiler and optimizer for ONNX models.\n\n"
        "Start with: infercc optimize model.onnx   (writes model.opt.onnx, validated against "
        "the original under onnxruntime)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}
out = Console()
err = Console(stderr=True)

ShapeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--shape",
        help="Pin an input's shape, e.g. --shape input_ids=1x128 (repeatable), or give a range "
        "MIN:OPT:MAX, e.g. input_ids=1x128:8x128:32x512 (artifacts are tuned at each). "
        "Symbolic dims not pinned default to 1 (first axis) and 8 (others).",
    ),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"infercc {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and debug logs on errors.")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )


@app.command()
def optimize(
    model: Annotated[Path, typer.Argument(help="The ONNX model to optimize (never modified).")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Where to write the optimized model [default: <stem>.opt.onnx beside the input].",
        ),
    ] = None,
    target: Annotated[
        str, typer.Option(help="Target to optimize for (`infercc targets` lists them).")
    ] = "cpu",
    shape: ShapeOpt = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="With -o DIR: the backend that builds the artifact (ort, tensorrt, "
            "none) [default: ort for cpu, tensorrt for GPU targets]."
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="Tuning cache directory [default: $INFERCC_CACHE_DIR or ~/.cache/infercc].",
            envvar="INFERCC_CACHE_DIR",
        ),
    ] = None,
    no_tune: Annotated[
        bool, typer.Option("--no-tune", help="Build the artifact without autotuning.")
    ] = False,
    ort_optimized_model: Annotated[
        bool,
        typer.Option(
            "--ort-optimized-model",
            help="With --backend ort: also save "
            "onnxruntime's own optimized graph (ort_optimized.onnx) for a faster "
            "start on this host.",
        ),
    ] = False,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Validate on samples: a directory of .npz (one sample each, keyed by "
            "input name) or <input>.npy files, or one .npz."
        ),
    ] = None,
    disable_pass: Annotated[
        list[str] | None,
        typer.Option(
            "--disable-pass", help="Skip a pass by name (repeatable); `infercc passes` lists them."
        ),
    ] = None,
    portable: Annotated[
        bool, typer.Option(help="Keep standard ONNX only (no onnxruntime contrib ops).")
    ] = False,
    no_validate: Annotated[
        bool, typer.Option("--no-validate", help="Skip comparing outputs with the original.")
    ] = False,
    verify: Annotated[
        bool, typer.Option(help="Check the IR's invariants after every pass (slower).")
    ] = False,
    fold_limit: Annotated[
        int, typer.Option(help="Largest constant (bytes) that constant folding may create.")
    ] = 16 * 2**20,
    external_data: Annotated[
        bool,
        typer.Option(
            "--external-data",
            help="Write weights to <output>.data even when under 2 GB (always done above 2 GB).",
        ),
    ] = False,
    align: Annotated[
        int, typer.Option(help="Byte alignment of tensors in the memory plan.", min=1)
    ] = 64,
    fp16: Annotated[
        bool,
        typer.Option(
            "--fp16",
            help="Convert weights and compute to float16 (inputs and "
            "outputs keep their types; risky ops stay float32, listed in the "
            "report). Validated by cosine >= 0.999 against the original.",
        ),
    ] = False,
    fp16_io: Annotated[
        bool, typer.Option("--fp16-io", help="With --fp16: float16 inputs and outputs too.")
    ] = False,
    keep_fp32: Annotated[
        list[str] | None,
        typer.Option(
            "--keep-fp32",
            help="With --fp16: an op type or node name to keep in float32 (repeatable).",
        ),
    ] = None,
    ranges: Annotated[
        Path | None,
        typer.Option(
            help="With --fp16: calibrated ranges (the ranges.json `infercc calibrate` "
            "writes); a tensor whose range overflows float16 stays float32."
        ),
    ] = None,
    atol: Annotated[
        float | None,
        typer.Option(help="Validation absolute tolerance [default: 1e-4; none for fp16]."),
    ] = None,
    rtol: Annotated[
        float | None,
        typer.Option(help="Validation relative tolerance [default: 1e-3; none for fp16]."),
    ] = None,
    min_cosine: Annotated[
        float | None,
        typer.Option(help="Validation minimum cosine [default: 0.9999; 0.999 for fp16]."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")
    ] = False,
    explain: Annotated[
        bool, typer.Option(help="List every rewrite that matched but refused, and why.")
    ] = False,
    plugin: Annotated[
        list[Path] | None,
        typer.Option(
            "--plugin",
            metavar="LIB",
            help="With --backend tensorrt: a TensorRT plugin library (.so) to load before "
            "parsing and loading (repeatable).",
        ),
    ] = None,
    workspace: Annotated[
        str | None,
        typer.Option(
            help="With --backend tensorrt: the builder's workspace limit, bytes or e.g. 512MiB, "
            "4GiB [default: the target's memory less weights, activations and 512 MiB].",
        ),
    ] = None,
    opt_level: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=5,
            help="With --backend tensorrt: builder optimization level 0-5 (TensorRT's default "
            "3; higher builds slower, may run faster).",
        ),
    ] = None,
    hw_compat: Annotated[
        str,
        typer.Option(
            help="With --backend tensorrt: hardware compatibility: none, ampere+ (runs on any "
            "GPU of compute capability >= 8.0) or same-cc (any GPU of the same compute "
            "capability); compatible engines may run slower.",
        ),
    ] = "none",
    version_compatible: Annotated[
        bool,
        typer.Option(
            "--version-compatible",
            help="With --backend tensorrt: build an engine later TensorRT versions (same major) "
            "can load, at some speed cost.",
        ),
    ] = False,
    timing_cache_strict: Annotated[
        bool,
        typer.Option(
            "--timing-cache-strict",
            help="With --backend tensorrt: fail when no timing cache exists for this TensorRT, "
            "GPU and CUDA (reproducible CI builds).",
        ),
    ] = False,
    strict_target: Annotated[
        bool,
        typer.Option(
            "--strict-target",
            help="With --backend tensorrt: refuse to build when the GPU here is not the "
            "--target's (engines are tuned for, and tied to, the GPU that builds them).",
        ),
    ] = False,
    bf16: Annotated[
        bool,
        typer.Option(
            "--bf16",
            help="With --backend tensorrt 10.x: let TensorRT choose bfloat16 kernels "
            "(BuilderFlag.BF16). TensorRT 11 takes precision from the graph only.",
        ),
    ] = False,
    int8: Annotated[
        bool,
        typer.Option(
            "--int8",
            help="With --backend tensorrt: build int8 from the graph's Q/DQ pairs (infercc "
            "calibrate), or on TensorRT 10 from --calib-cache.",
        ),
    ] = False,
    calib_cache: Annotated[
        Path | None,
        typer.Option(
            help="With --int8 on TensorRT 10: a TensorRT calibration cache (infercc calibrate "
            "writes one) giving the int8 scales.",
        ),
    ] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            "--profile",
            metavar="SPECS",
            help="With --backend tensorrt: one more optimization profile, comma-separated "
            'NAME=MIN:OPT:MAX specs, e.g. "ids=1x16:1x64:1x128" (repeatable; --shape is the '
            "first).",
        ),
    ] = None,
    shape_input: Annotated[
        list[str] | None,
        typer.Option(
            "--shape-input",
            metavar="NAME=MIN:OPT:MAX",
            help="With --backend tensorrt: the range of a shape-tensor input's values, "
            "x-separated, e.g. new_shape=1x64:8x64:32x64 (repeatable).",
        ),
    ] = None,
) -> None:
    """Optimize MODEL: fold constants, drop dead code and no-ops, fuse Conv+BN+activation and
    Q/K/V projections, schedule for memory; validate against the original; write the result
    atomically, with its memory plan (<stem>.memory_plan.json) beside it.

    -o model.opt.onnx writes the optimized model; -o DIR builds an artifact directory there
    with --backend (model.onnx, manifest.json, memory_plan.json and the backend's tuned files).

    Exit codes: 0 success, 1 validation failed (nothing written), 2 bad input.
    """
    from infercc.api import optimize as run
    from infercc.cli.render import render_optimize
    from infercc.data.profiles import parse_profiles

    with _progress(as_json) as step:
        report = run(
            model,
            output,
            target=target,
            profiles=parse_profiles(shape),
            backend=backend,
            cache_dir=cache_dir,
            tune=not no_tune,
            backend_options=_backend_options(
                backend,
                target,
                save_optimized=ort_optimized_model,
                cache_dir=str(cache_dir) if cache_dir else None,
                validate=not no_validate,
                plugins=[str(p) for p in plugin or []],
                workspace=workspace,
                opt_level=opt_level,
                hw_compat=hw_compat,
                version_compatible=version_compatible,
                timing_cache_strict=timing_cache_strict,
                strict_target=strict_target,
                precision="int8" if int8 else "bf16" if bf16 else None,
                calib_cache=str(calib_cache) if calib_cache else None,
                profiles=profile or [],
                shape_inputs=shape_input or [],
            ),
            data=data,
            disable_passes=disable_pass or [],
            portable=portable,
            run_validation=not no_validate,
            fold_limit=fold_limit,
            verify=verify,
            external_data=True if external_data else None,
            atol=atol,
            rtol=rtol,
            min_cosine=min_cosine,
            fp16=fp16,
            fp16_io=fp16_io,
            keep_fp32=keep_fp32 or [],
            fp16_ranges=ranges,
            alignment=align,
            on_step=step,
        )
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        render_optimize(report, out, explain=explain)
    if not report.passed:
        raise typer.Exit(EXIT_VALIDATION_FAILED)


_TRT_ONLY = {"precision": "--bf16/--int8", "calib_cache": "--calib-cache"}


def _backend_options(backend: str | None, target: str, **options: object) -> dict[str, object]:
    """The optimize options meant for the backend; TensorRT-only precisions refused elsewhere."""
    trt = backend == "tensorrt" or (backend is None and target.lower() != "cpu")
    for key, flag in _TRT_ONLY.items():
        if options.get(key) and not trt:
            raise InferccError(
                f"{flag} needs --backend tensorrt",
                "use --fp16 (a graph rewrite every backend runs), or infercc calibrate for int8",
            )
    dropped = (None, False)
    return {
        k: v
        for k, v in options.items()
        if k == "validate" or not (any(v is d for d in dropped) or v == [])
    }


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(help="The ONNX model to describe.")],
    shape: ShapeOpt = None,
    target: Annotated[
        str | None,
        typer.Option(
            help="Add the roofline analysis and memory budget on this target "
            "(`infercc targets` lists them)."
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="With --target: draw every node on the target's roofline into this "
            "PNG (needs matplotlib: pip install 'infercc[plot]')."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
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
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        render_inspect(report, out)


@app.command()
def passes(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List every pipeline (its stages, in order) and every pass with what it does.

    `--disable-pass NAME` of optimize and calibrate takes these names; a pass that the command
    does not run is refused."""
    from infercc.cli.render import render_passes
    from infercc.passes import catalog

    listed = catalog()
    if as_json:
        out.print_json(json.dumps(listed))
    else:
        render_passes(listed, out)


@app.command()
def targets(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the targets --target accepts, with their peak FLOP/s, memory and bandwidth.

    The cpu target is this host, detected (cores, vector features, memory; bandwidth measured
    once, or set with INFERCC_CPU_BANDWIDTH_GBS)."""
    from infercc.analysis.targets import list_targets
    from infercc.cli.render import render_targets

    items = list_targets()
    if as_json:
        out.print_json(json.dumps([t.to_dict() for t in items]))
    else:
        render_targets(items, out)


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
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure latency (p50/p90/p99/mean) and throughput per batch size, or compare two
    models/artifacts run interleaved so the comparison holds on a noisy machine."""
    from infercc.cli.render import render_bench, render_compare
    from infercc.data.profiles import parse_shapes
    from infercc.runtime import bench as engine

    batches = _parse_batches(batch)
    shapes = parse_shapes(shape)
    with _bar(as_json, "compare" if compare else "bench") as tick:
        if compare is not None:
            report = engine.compare(model, compare, shapes, batches, warmup, iters, seed, tick)
        else:
            report = engine.bench(model, shapes, batches, warmup, iters, seed, tick)
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    elif compare is not None:
        render_compare(report, out)
    else:
        render_bench(report, out)


def _parse_batches(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise InferccError(f"bad --batch {text!r}", "give positive integers, e.g. --batch 1,8,32")
    return values


class _bar:
    """A progress bar on stderr for timed runs (silent under --json or without a TTY)."""

    def __init__(self, quiet: bool, label: str):
        self.quiet = quiet or not err.is_terminal
        self.label = label
        self.progress = None
        self.task = None

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self.progress = Progress(
            "{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self.progress.__enter__()
        self.task = self.progress.add_task(self.label, total=None)

        def tick(done: int, total: int) -> None:
            self.progress.update(self.task, completed=done, total=total)

        return tick

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


class _steps_bar:
    """One line on stderr: the current step, with a bar while calibration samples stream
    (silent under --json or without a TTY). Yields (on_step, on_progress)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or not err.is_terminal
        self.progress = None

    def __enter__(self):
        if self.quiet:
            return (lambda _msg: None), None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn

        self.progress = Progress(
            SpinnerColumn(),
            "{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        )
        self.progress.__enter__()
        task = self.progress.add_task("starting", total=None)

        def step(msg: str) -> None:
            self.progress.update(task, description=msg, completed=0, total=None)

        def tick(done: int, total: int | None) -> None:
            self.progress.update(task, completed=done, total=total)

        return step, tick

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


@app.command()
def calibrate(
    model: Annotated[Path, typer.Argument(help="The fp32 ONNX model to quantize.")],
    data: Annotated[
        Path,
        typer.Option(
            help="Samples: a directory of .npz files (one sample each, keyed by input "
            "name) or <input>.npy files, or one .npz of stacked samples (every array with "
            "one more axis than the input: N samples on axis 0), or a directory of images "
            "(jpg, png, bmp, webp; needs --preprocess)."
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            help="Directory for model_int8.onnx, ranges.json, "
            "calibration.cache and calibration_report.json.",
        ),
    ],
    int8: Annotated[bool, typer.Option("--int8", help="Quantize to int8 (QDQ).")] = True,
    method: Annotated[
        str,
        typer.Option(
            help="Range method: minmax, entropy (KL, as TensorRT's entropy "
            "calibrator) or percentile."
        ),
    ] = "minmax",
    percentile: Annotated[float, typer.Option(help="With --method percentile.")] = 99.99,
    num_samples: Annotated[
        int | None, typer.Option(help="Use at most this many samples.", min=1)
    ] = None,
    holdout: Annotated[
        float, typer.Option(help="Fraction of the samples held out to measure accuracy.")
    ] = 0.2,
    min_cosine: Annotated[
        float | None,
        typer.Option(
            help="Accuracy target: minimum output cosine vs fp32; the "
            "most sensitive layers move back to float until it holds."
        ),
    ] = None,
    max_top1_drop: Annotated[
        float | None,
        typer.Option(help="Accuracy target: largest top-1 disagreement with fp32, in points."),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="A node to keep in float (repeatable).")
    ] = None,
    preprocess: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help="How images become tensors: a preset (imagenet: torchvision's resize "
            "crop/0.875, center crop, scale=1/255, ImageNet mean/std, RGB; raw: pixels 0-255) "
            "and/or comma-separated key=value items overriding it: input=NAME, resize=S|HxW|"
            "none (S: shorter side), crop=S|HxW|none (center; default: the model's H x W), "
            "scale=F|A/B, mean=R/G/B, std=R/G/B, order=rgb|bgr|gray, layout=nchw|nhwc, "
            "dtype=float32|float16|uint8|..., interp=bilinear|bicubic|nearest|lanczos. "
            'E.g. "imagenet,order=bgr". Needs Pillow: pip install "infercc\\[images]".',
        ),
    ] = None,
    target: Annotated[
        str, typer.Option(help="Where the int8 model will run; decides --activations auto.")
    ] = "cpu",
    activations: Annotated[
        str,
        typer.Option(
            help="Activation quantization: int8 (symmetric; the form TensorRT takes), uint8 "
            "(asymmetric; onnxruntime's fast CPU form, twice the resolution on one-sided "
            "tensors), or auto (uint8 for cpu, int8 for GPU targets)."
        ),
    ] = "auto",
    activation_matmuls: Annotated[
        bool,
        typer.Option(
            "--activation-matmuls",
            help="Also quantize MatMuls of two activations (attention); off by default: "
            "little speed, much accuracy lost.",
        ),
    ] = False,
    max_trials: Annotated[
        int,
        typer.Option(
            help="Cap on sensitivity trials (each quantizes and evaluates once) when an "
            "accuracy target is set.",
            min=0,
        ),
    ] = 64,
    speed_check: Annotated[
        bool,
        typer.Option(
            help="Race int8 against fp32 on this host (interleaved) and say when int8 is slower."
        ),
    ] = True,
    outlier_channels: Annotated[
        bool,
        typer.Option(
            help="Split a transformer projection whose input has a few huge channels: those "
            "channels stay float, the rest int8 (exact; a Mul, Gather, small MatMul and Add)."
        ),
    ] = True,
    disable_pass: Annotated[
        list[str] | None,
        typer.Option(
            "--disable-pass",
            help="Skip a pass of the calibrate-fp32 or int8 pipeline by name (repeatable); "
            "`infercc passes` lists them.",
        ),
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="Check the IR's invariants after every pass (slower).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Calibrate MODEL on real samples and write an int8 QDQ model, its ranges and a TensorRT
    calibration cache; report accuracy against fp32 on held-out samples."""
    from infercc.calib.calibrate import calibrate as run

    if not int8:
        raise InferccError("calibrate builds int8 models only", "pass --int8")
    with _steps_bar(as_json) as (step, tick):
        report = run(
            model,
            data,
            output,
            method=method,
            percentile=percentile,
            num_samples=num_samples,
            holdout=holdout,
            min_cosine=min_cosine,
            max_top1_drop=max_top1_drop,
            exclude=exclude or [],
            preprocess=preprocess,
            target=target,
            activations=activations,
            activation_matmuls=activation_matmuls,
            max_trials=max_trials,
            speed_check=speed_check,
            outlier_channels=outlier_channels,
            disable_passes=disable_pass or [],
            verify=verify,
            on_step=step,
            on_progress=tick,
        )
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        from infercc.cli.render import render_calibration

        render_calibration(report, out)
    if not report.passed:
        raise typer.Exit(EXIT_VALIDATION_FAILED)


@app.command()
def validate(
    candidate: Annotated[
        Path | None,
        typer.Argument(
            help="The optimized .onnx model, or an artifact directory (run through its "
            "backend). Omit it with --save-golden to only write goldens."
        ),
    ] = None,
    reference: Annotated[
        Path | None, typer.Option(help="The original model to compare with.")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Samples: a directory of .npz (keyed by input name) or .npy files."),
    ] = None,
    shape: ShapeOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    atol: Annotated[
        float | None, typer.Option(help="Absolute tolerance (default: 1e-4 for fp32).")
    ] = None,
    rtol: Annotated[
        float | None, typer.Option(help="Relative tolerance (default: 1e-3 for fp32).")
    ] = None,
    min_cosine: Annotated[
        float | None,
        typer.Option(help="Minimum cosine (default: 0.9999 fp32, 0.999 fp16, 0.99 int8)."),
    ] = None,
    tol: Annotated[
        list[str] | None,
        typer.Option(
            "--tol", help="Tolerance of one output, OUTPUT=ATOL:RTOL, e.g. logits=1e-3:1e-2."
        ),
    ] = None,
    save_golden: Annotated[
        Path | None,
        typer.Option(
            help="Write the inputs and the reference's outputs here (npz), for --golden later."
        ),
    ] = None,
    golden: Annotated[
        Path | None,
        typer.Option(help="Compare with goldens written by --save-golden (no reference needed)."),
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
        str | None, typer.Option(help="With --bisect: the target the candidate was built for.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Check CANDIDATE against --reference (or --golden): per output max abs and relative
    error, cosine and the fraction of elements out of tolerance. Tolerances follow the
    candidate's precision (from its manifest, or read from the model).

    Exit codes: 0 passed, 1 failed, 2 bad input."""
    from infercc.check.candidates import validate_candidate
    from infercc.check.tolerances import parse_tolerances
    from infercc.cli.render import render_candidate
    from infercc.data.profiles import parse_shapes

    with _progress(as_json) as step:
        report = validate_candidate(
            candidate,
            reference,
            golden=golden,
            save_golden_to=save_golden,
            data=data,
            shapes=parse_shapes(shape),
            seed=seed,
            atol=atol,
            rtol=rtol,
            min_cosine=min_cosine,
            tolerances=parse_tolerances(tol),
            bisect=bisect,
            target=target,
            on_step=step,
        )
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        render_candidate(report, out)
    if not report.passed:
        raise typer.Exit(EXIT_VALIDATION_FAILED)


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
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compile, validate and time every model of a manifest; write JUnit XML, JSON and
    Markdown reports for CI. One model's failure never stops the others.

    Exit codes: 0 all passed, 1 a model failed (each named with its reason), 2 bad manifest."""
    from infercc.ci.runner import run_ci
    from infercc.cli.render import render_ci

    with _ci_progress(as_json) as on_event:
        report = run_ci(
            config,
            jobs,
            out_dir=out_dir,
            only=only,
            junit=junit,
            json_report=json_report,
            markdown=markdown,
            on_event=on_event,
        )
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        render_ci(report, out)
    if not report.passed:
        raise typer.Exit(EXIT_VALIDATION_FAILED)


class _ci_progress:
    """One spinner line per model on stderr (silent under --json or without a TTY)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or not err.is_terminal
        self.progress = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(), "{task.description}", TimeElapsedColumn(), console=err
        )
        self.progress.__enter__()
        return self.event

    def event(self, name: str, what: str) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=1)
        done = what in ("passed", "failed")
        self.progress.update(
            self.tasks[name], description=f"{escape(name)}: {what}", completed=int(done)
        )

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


cache_app = typer.Typer(
    help="The tuning cache: what was tuned, for which model, shapes and host.",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")
CacheDirOpt = Annotated[
    Path | None,
    typer.Option(
        help="Tuning cache directory [default: $INFERCC_CACHE_DIR or ~/.cache/infercc].",
        envvar="INFERCC_CACHE_DIR",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@cache_app.command("ls")
def cache_ls(cache_dir: CacheDirOpt = None, as_json: JsonOpt = False) -> None:
    """List the cache's entries (digest, backend, provider, shapes, hits)."""
    from infercc.cli.render import render_cache_entries
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir) as cache:
        entries = cache.entries()
        if as_json:
            out.print_json(json.dumps({"path": str(cache.path), "entries": entries}))
        else:
            render_cache_entries(cache.path, entries, out)


@cache_app.command("show")
def cache_show(
    digest: Annotated[str, typer.Argument(help="An entry's digest, or its first characters.")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Print the entries whose digest starts with DIGEST, with their tuning choices (JSON)."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir) as cache:
        found = cache.show(digest)
    if not found:
        raise InferccError(f"no cache entry starts with {digest!r}", "infercc cache ls lists them")
    out.print_json(json.dumps(found))


@cache_app.command("clear")
def cache_clear(cache_dir: CacheDirOpt = None) -> None:
    """Remove every entry."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir) as cache:
        n = cache.clear()
    out.print(f"removed {n} entr{'y' if n == 1 else 'ies'}")


@cache_app.command("export")
def cache_export(
    path: Annotated[Path, typer.Argument(help="JSON file to write.")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Write every entry to a JSON file (to share tuning results across machines of one kind)."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir) as cache:
        n = cache.export(path)
    out.print(f"exported {n} entr{'y' if n == 1 else 'ies'} to {path}")


@cache_app.command("import")
def cache_import(
    path: Annotated[Path, typer.Argument(help="JSON file written by `infercc cache export`.")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Merge entries from an exported file (the newer entry wins on conflicts)."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir) as cache:
        n = cache.import_(path)
    out.print(f"imported {n} entr{'y' if n == 1 else 'ies'} from {path}")


class _progress:
    """A spinner on stderr naming the current step (silent under --json or without a TTY)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or not err.is_terminal
        self.status = None

    def __enter__(self):
        if self.quiet:
            return lambda _msg: None
        self.status = err.status("starting")
        self.status.__enter__()
        return lambda msg: self.status.update(msg)

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)


def main() -> None:
    """Entry point: one-line errors with exit code 2; tracebacks only with --debug."""
    debug = "--debug" in sys.argv[1:]
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:  # typer.Exit(n) comes back as n in this mode
            sys.exit(code)
    except InferccError as e:
        if debug:
            raise
        err.print(
            f"[red]error:[/] {escape(e.message)}" + (f" — {escape(e.hint)}" if e.hint else ""),
            soft_wrap=True,
            highlight=False,
        )
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except _click_exceptions() as e:
        e.show()
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # a bug: say so on one line, the traceback with --debug
        if debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        err.print(
            f"[red]internal error:[/] {type(e).__name__}: {escape(msg)} — rerun with --debug "
            "for the traceback and report it",
            soft_wrap=True,
            highlight=False,
        )
        sys.exit(EXIT_BAD_INPUT)


def _click_exceptions() -> tuple[type[Exception], ...]:
    """Usage errors (unknown option, missing argument): typer's vendored click, or click's."""
    found: list[type[Exception]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)
