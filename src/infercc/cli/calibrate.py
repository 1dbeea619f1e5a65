"""`infercc calibrate`: an int8 QDQ model from real samples."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import (
    AssumeOpt,
    CalibrateShapeOpt,
    CustomOpLibOpt,
    DisablePassOpt,
    JsonOpt,
    PortableOpt,
    Progress,
    TargetOpt,
    VerifyOpt,
    finish,
)
from infercc.errors import InferccError
from infercc.precisions import INT8_COSINE_FLOOR


@app.command(short_help="Quantize a model: int8 (QDQ) from real samples, or int4 weights.")
def calibrate(
    model: Annotated[
        Path | None,
        typer.Argument(
            metavar="MODEL", help="The fp32 ONNX model to quantize.", show_default=False
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="DIR",
            help="Directory for model_int8.onnx, ranges.json, calibration.cache, "
            "calibration_report.json and manifest.json (--int4: model_int4.onnx and "
            "calibration_report.json), so `infercc bench DIR` and `infercc validate DIR` "
            "take it; a previous calibration output there is replaced, any other non-empty "
            "directory refused [default: <stem>.int8/ beside the input, <stem>.int4/ with "
            "--int4].",
            show_default=False,
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Samples: a directory of .npz files (one sample each, keyed by input "
            "name) or <input>.npy files, or one .npz of stacked samples (every array with "
            "one more axis than the input: N samples on axis 0), or a directory of images "
            "(jpg, png, bmp, webp; needs --preprocess). A decoder's samples hold input_ids "
            "only. Required for int8, and for --int4 with --method awq or gptq.",
        ),
    ] = None,
    int8: Annotated[
        bool, typer.Option("--int8", help="Quantize to int8 (QDQ), the default.")
    ] = False,
    int4: Annotated[
        bool,
        typer.Option(
            "--int4",
            help="Weight-only int4 for MatMul/Gemm weights (and, with --embeddings, embedding "
            "tables): MatMulNBits "
            "for the cpu target, blocked DequantizeLinear with --portable or a GPU target.",
        ),
    ] = False,
    method: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="int8 range method: minmax, entropy (KL, as TensorRT's entropy "
            "calibrator) or percentile [default: chosen from the model: percentile for a "
            "transformer (Softmax over a MatMul of two activations), minmax otherwise; the "
            "report says which and why]. --int4: rtn (default; round to nearest, no data), awq "
            "(activation-aware scales) or gptq (error-compensating rounding).",
        ),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="--int4: weights per scale along K, 32, 64 or 128 [default: the target's CPU "
            "row's, 32].",
        ),
    ] = None,
    symmetric: Annotated[
        bool | None,
        typer.Option(
            "--symmetric/--asymmetric",
            help="--int4: zero point fixed at 8 (symmetric, the default: TensorRT's and "
            "onnxruntime-genai's form) or a 4-bit zero point per block (--asymmetric, cpu "
            "target only: 2.5% more bytes).",
            show_default=False,
        ),
    ] = None,
    portable: PortableOpt = False,
    accuracy_level: Annotated[
        str | None,
        typer.Option(
            metavar="LEVEL",
            help="--int4 MatMulNBits: auto (the target's CPU row: 4, int8 compute, where it "
            "has the kernel, unless level 4 races clearly slower on this host or loses "
            "accuracy on the held-out --data samples), 0, 1, 2, 3 or 4 [default: auto].",
        ),
    ] = None,
    lm_head: Annotated[
        bool | None,
        typer.Option(
            "--lm-head/--no-lm-head",
            help="--int4: quantize the LM head (the projection to the output) [default: yes].",
            show_default=False,
        ),
    ] = None,
    embeddings: Annotated[
        bool | None,
        typer.Option(
            "--embeddings/--no-embeddings",
            help="--int4 MatMulNBits: quantize embedding tables (GatherBlockQuantized) "
            "[default: no: float, as onnxruntime's quantizer and onnxruntime-genai keep them; "
            "int4 tables cost top-1 agreement, the report lists the bytes they would save].",
            show_default=False,
        ),
    ] = None,
    assume: AssumeOpt = None,
    shape: CalibrateShapeOpt = None,
    percentile: Annotated[
        float | None,
        typer.Option(
            metavar="P",
            min=0.0,
            max=100.0,
            help="The percentile method's percentile of |x| kept in range (alone, it selects "
            "--method percentile) [default: 99.999 for a transformer, else 99.99].",
        ),
    ] = None,
    num_samples: Annotated[
        int | None, typer.Option(metavar="N", help="Use at most this many samples.", min=1)
    ] = None,
    holdout: Annotated[
        float,
        typer.Option(
            metavar="FRACTION",
            min=0.0,
            max=1.0,
            help="Fraction of the samples held out to measure accuracy.",
        ),
    ] = 0.2,
    min_cosine: Annotated[
        float | None,
        typer.Option(
            metavar="X",
            min=0.0,
            max=1.0,
            help="Accuracy target: minimum output cosine vs fp32; the "
            "most sensitive layers move back to float until it holds. 0 turns it off "
            "[default: 0.99 for a transformer unless --max-top1-drop is given, none "
            "otherwise; a default target missed at the --max-trials cap is reported, not a "
            "failure].",
        ),
    ] = None,
    max_top1_drop: Annotated[
        float | None,
        typer.Option(
            metavar="POINTS",
            min=0.0,
            max=100.0,
            help="Accuracy target: largest top-1 disagreement with fp32, in points.",
        ),
    ] = None,
    min_cosine_floor: Annotated[
        float | None,
        typer.Option(
            metavar="X",
            min=0.0,
            max=1.0,
            help="Without an accuracy target (or with the default one missed at the "
            "--max-trials cap), the lowest output cosine vs fp32 accepted: below it the run "
            'fails (exit 1, nothing written); the verdict says "no accuracy target", never '
            '"passed". 0 turns it off; refused with --min-cosine or --max-top1-drop, which '
            f"decide alone [default: {INT8_COSINE_FLOOR}].",
            show_default=False,
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option("--exclude", metavar="NODE", help="A node to keep in float (repeatable)."),
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
            'E.g. "imagenet,order=bgr". Needs Pillow: pip install "infercc[images]".',
        ),
    ] = None,
    target: TargetOpt = "cpu",
    activations: Annotated[
        str,
        typer.Option(
            metavar="TYPE",
            help="Activation quantization: int8 (symmetric; the form TensorRT takes), uint8 "
            "(asymmetric; onnxruntime's fast CPU form, twice the resolution on one-sided "
            "tensors), or auto (uint8 for cpu, int8 for GPU targets).",
        ),
    ] = "auto",
    weight_bits: Annotated[
        str,
        typer.Option(
            metavar="auto|8|7",
            help="int8 weight width: auto (the target's CPU row decides: 7 where the int8 "
            "kernels sum u8 x s8 pairs in int16 with saturation, AVX2 without VNNI; 8 with "
            "VNNI, AMX, arm64 and GPUs), 8, or 7 (weights within +-64).",
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
            metavar="N",
            help="Cap on sensitivity trials (each quantizes and evaluates once) when an "
            "accuracy target is set.",
            min=0,
        ),
    ] = 64,
    speed_check: Annotated[
        bool,
        typer.Option(
            "--speed-check/--no-speed-check",
            show_default=False,
            help="Race int8 against fp32 on this host (interleaved) and say when int8 is "
            "slower (on by default).",
        ),
    ] = True,
    outlier_channels: Annotated[
        bool,
        typer.Option(
            "--outlier-channels/--no-outlier-channels",
            show_default=False,
            help="Split a transformer projection whose input has a few huge channels: those "
            "channels stay float, the rest int8 (exact; a Gather, small MatMul and Add each). "
            "On by default, as the first remedy when the all-int8 model misses the accuracy "
            "target (always, without a target).",
        ),
    ] = True,
    disable_pass: DisablePassOpt = None,
    verify: VerifyOpt = False,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="List every rewrite that matched but refused, and why, as optimize --explain "
            "does: the fp32 passes' (decoder fusions included), then int8's quantize-qdq (the "
            "final candidate's) or --int4's quantize-int4 (each weight or table kept float: "
            "not a constant, excluded, the LM head with --no-lm-head, an embedding without "
            "--embeddings, ...). --json always carries them (refusals).",
        ),
    ] = False,
    bisect: Annotated[
        bool,
        typer.Option(
            "--bisect",
            help="--int4: before quantizing, rebuild the fp32 passes (calibrate-int4, or "
            "calibrate-fp32 with --portable) and judge them against the original on up to 4 "
            "evaluation samples at fp32's tolerance; when they change its outputs, name the "
            "pass, the rewrite and the node where outputs diverge, as optimize's bisection "
            "does, and fail (exit 1, nothing written). quantize-int4 itself is not bisected: "
            "int4 is lossy by design and has no accuracy target to break (--exclude NODE "
            "keeps a weight float).",
        ),
    ] = False,
    ort_custom_op_lib: CustomOpLibOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Calibrate MODEL on real samples and write an int8 QDQ model, its ranges and a TensorRT
    calibration cache; report accuracy against fp32 on held-out samples.

    With --int4: weight-only int4 (RTN, AWQ or GPTQ) of MatMul/Gemm weights (and embeddings),
    with accuracy (next-token top-1 agreement and perplexity for decoders), layers left float
    and why, size before and after, and int4 raced against fp32 on this host.

    The int8 output directory (<stem>.int8/ beside MODEL unless -o names one) holds a
    manifest.json: `infercc bench DIR` times the int8 model and `infercc validate DIR
    --reference MODEL` checks it. A model below opset 13 is converted for int8 (said, and
    recorded in the report) and the int8 model is evaluated against the original.

    The verdict says "passed" only when an accuracy target was checked and met; without one
    it says "no accuracy target" with the cosine measured, and fails below
    --min-cosine-floor.

    Exit codes: 0 success, 1 the target or the floor was missed (nothing written), 2 bad
    input."""
    from infercc.calib.calibrate import calibrate as run
    from infercc.calib.report import default_calibration_dir
    from infercc.cli.int4_cli import check_int8_only_flags, int4_only_flags, run_int4
    from infercc.cli.render import render_calibration
    from infercc.runtime.ort_support import custom_op_libraries

    if int8 and int4:
        raise InferccError("--int8 and --int4 exclude each other", "pass one of them")
    if model is None:
        raise InferccError(
            "no MODEL given", "name the fp32 model: infercc calibrate MODEL --data DIR"
        )
    output = output or default_calibration_dir(model, "int4" if int4 else "int8")
    int4_flags = dict(
        block_size=block_size,
        symmetric=symmetric,
        portable=portable or None,
        accuracy_level=accuracy_level,
        lm_head=lm_head,
        embeddings=embeddings,
        assume=assume or None,
        disable_pass=disable_pass or None,
        shape=shape or None,
        verify=verify or None,
        bisect=bisect or None,
    )
    if int4:
        check_int8_only_flags(
            percentile=percentile,
            min_cosine=min_cosine,
            max_top1_drop=max_top1_drop,
            min_cosine_floor=min_cosine_floor,
            activations=None if activations == "auto" else activations,
            weight_bits=None if weight_bits == "auto" else weight_bits,
            activation_matmuls=activation_matmuls or None,
            max_trials=None if max_trials == 64 else max_trials,
            outlier_channels=None if outlier_channels else False,
        )
        with custom_op_libraries(ort_custom_op_lib or ()), Progress(as_json) as progress:
            report = run_int4(
                model,
                output,
                data,
                method,
                int4_flags,
                exclude or [],
                num_samples,
                holdout,
                preprocess,
                target,
                speed_check,
                progress.step,
                progress.tick,
            )
        from infercc.cli.render_decoder import render_int4

        finish(report, as_json, lambda r, console: render_int4(r, console, explain=explain))
        return
    both = ("disable_pass", "verify")  # flags of either kind of calibration
    int4_only_flags({k: v for k, v in int4_flags.items() if k not in both})  # --shape, --bisect
    if data is None:
        raise InferccError("int8 calibration needs samples", "pass --data DIR")
    if min_cosine_floor is not None and (min_cosine or max_top1_drop is not None):
        given = "--min-cosine" if min_cosine else "--max-top1-drop"
        raise InferccError(
            f"--min-cosine-floor has no effect with {given}: the target decides the verdict",
            "drop --min-cosine-floor (it holds runs without a target), or drop the target",
        )
    with custom_op_libraries(ort_custom_op_lib or ()), Progress(as_json) as progress:
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
            min_cosine_floor=min_cosine_floor,
            exclude=exclude or [],
            preprocess=preprocess,
            target=target,
            activations=activations,
            weight_bits=weight_bits,
            activation_matmuls=activation_matmuls,
            max_trials=max_trials,
            speed_check=speed_check,
            outlier_channels=outlier_channels,
            disable_passes=disable_pass or [],
            verify=verify,
            on_step=progress.step,
            on_progress=progress.tick,
        )
    finish(report, as_json, lambda r, console: render_calibration(r, console, explain=explain))
