"""`infercc bench`: latency per batch size, or two models raced interleaved."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app
from infercc.cli.common import CustomOpLibOpt, JsonOpt, Progress, SeedOpt, ShapeOpt, finish
from infercc.errors import InferccError
from infercc.util import parse_duration

DEFAULT_ITERS = 100


@app.command(short_help="Latency and throughput per batch size; two models raced interleaved.")
def bench(
    model: Annotated[
        Path,
        typer.Argument(metavar="MODEL", help="An .onnx model or an artifact directory."),
    ],
    shape: ShapeOpt = None,
    batch: Annotated[
        str | None,
        typer.Option(
            metavar="SIZES",
            help="Batch sizes to run, comma-separated, e.g. 1,8,32 [default: the "
            "model's own batch]. Sets the first axis of every input whose first axis "
            "is symbolic.",
        ),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Untimed runs first, per batch size [default: 10; with --generate: 1 "
            "warm-up generation].",
            min=0,
        ),
    ] = None,
    iters: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help=f"Timed runs per batch size [default: {DEFAULT_ITERS}; with --duration, "
            "the least number of runs, default 1; with --generate: 3 timed generations].",
            min=1,
        ),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(
            metavar="TIME",
            help="Time each batch size for this long, e.g. 10s, 500ms, 2m (and at least "
            "--iters runs), as trtexec's --duration.",
        ),
    ] = None,
    ort_profile: Annotated[
        bool,
        typer.Option(
            "--ort-profile",
            help="Also profile each batch size with onnxruntime's profiler (a separate "
            "session, after the timing) and list the op types and nodes that take the time.",
        ),
    ] = False,
    profile: Annotated[
        bool, typer.Option("--profile", hidden=True, help="The old spelling of --ort-profile.")
    ] = False,
    compare: Annotated[
        Path | None,
        typer.Option(
            metavar="OTHER",
            help="A second model or artifact, run interleaved with MODEL (A B A B "
            "...) on the same inputs: prints the per-pair time ratio B/A.",
        ),
    ] = None,
    seed: SeedOpt = 0,
    generate: Annotated[
        int | None,
        typer.Option(
            "--generate",
            metavar="N",
            help="For a decoder with KV-cache inputs/outputs: a greedy loop making N tokens "
            "(prefill, then N-1 decode steps feeding present back as past); reports TTFT, "
            "TPOT p50/p90/p99, decode tokens/s and peak memory. With --compare, the two "
            "decoders interleaved per step.",
            min=1,
        ),
    ] = None,
    prompt_len: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="With --generate: prompt tokens (random ids) [default: 64].", min=1
        ),
    ] = None,
    prompt: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --generate: the prompt as token ids (integers separated by spaces, "
            "commas or newlines, or an integer .npy; one row per prompt). No tokenizer runs.",
        ),
    ] = None,
    no_memory: Annotated[
        bool,
        typer.Option(
            "--no-memory",
            help="With --generate: skip the peak-memory run (one more generation in a fresh "
            "process).",
        ),
    ] = False,
    spin: Annotated[
        bool,
        typer.Option(
            "--spin",
            help="With --generate (one model): onnxruntime's idle threads spin between "
            "decode steps, its default. Without it they do not: in a Python decode loop "
            "spinning threads hold the cores during the work between steps (measured "
            "0.5x-0.7x the tokens/s on a 2-core host).",
        ),
    ] = False,
    ort_custom_op_lib: CustomOpLibOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure latency (p50/p90/p99/mean) and throughput per batch size, or compare two
    models/artifacts run interleaved so the comparison holds on a noisy machine.

    With --generate N: the generation benchmark of a decoder (time to first token, time per
    output token, decode tokens/s, peak memory).

    --duration times for a while instead of a number of runs; --ort-profile adds onnxruntime's
    per-op profile (top ops by time)."""
    from infercc.cli.render import render_bench, render_compare
    from infercc.data.profiles import parse_shapes
    from infercc.runtime import bench as engine

    batches = parse_batches(batch)
    profile = ort_profile or profile  # --profile: the old spelling
    if generate is not None:
        if shape:
            raise InferccError(
                "--shape has no effect with --generate", "the prompt sets the shapes: drop it"
            )
        if ort_custom_op_lib:
            raise InferccError(
                "--ort-custom-op-lib is not supported with --generate (its peak-memory run is "
                "a separate process)",
                "bench the decoder's latency without --generate, or drop --ort-custom-op-lib",
            )
        for flag, on in (("--duration", duration is not None), ("--ort-profile", profile)):
            if on:
                raise InferccError(
                    f"{flag} has no effect with --generate", "time the generation without it"
                )
        if spin and compare is not None:
            raise InferccError(
                "--spin has no effect with --compare: a race's sessions never spin (one "
                "side's spinning threads would slow the other's steps)",
                "drop --spin, or time one model with --generate --spin",
            )
        _bench_generate(
            model,
            compare,
            generate,
            batches,
            (prompt_len, prompt),
            (warmup, iters, seed),
            not no_memory,
            as_json,
            spin,
        )
        return
    for flag, value in (("--prompt-len", prompt_len), ("--prompt", prompt)):
        if value is not None:
            raise InferccError(f"{flag} needs --generate", "add --generate N, or drop it")
    for flag, on in (("--no-memory", no_memory), ("--spin", spin)):
        if on:
            raise InferccError(f"{flag} needs --generate", "drop it")
    warmup = 10 if warmup is None else warmup
    shapes = parse_shapes(shape)
    seconds = parse_duration(duration) if duration is not None else None
    runs = iters if iters is not None else (1 if seconds is not None else DEFAULT_ITERS)
    if profile and compare is not None:
        raise InferccError(
            "--ort-profile has no effect with --compare: races are not profiled",
            "profile each model with its own `infercc bench MODEL --ort-profile`",
        )
    libs = tuple(ort_custom_op_lib or ())
    with Progress(as_json, "compare" if compare else "bench") as progress:
        if compare is not None:
            report = engine.compare(
                model,
                compare,
                shapes,
                batches,
                warmup,
                runs,
                seed,
                progress.tick,
                duration=seconds,
                ort_custom_op_libs=libs,
            )
        else:
            report = engine.bench(
                model,
                shapes,
                batches,
                warmup,
                runs,
                seed,
                progress.tick,
                duration=seconds,
                profile=profile,
                ort_custom_op_libs=libs,
            )
    finish(report, as_json, render_compare if compare is not None else render_bench)


def _bench_generate(
    model: Path,
    other: Path | None,
    new_tokens: int,
    batches: list[int] | None,
    prompting: tuple[int | None, Path | None],
    counts: tuple[int | None, int | None, int],
    memory: bool,
    as_json: bool,
    spin: bool = False,
) -> None:
    from infercc.cli.render_decoder import render_generate, render_generate_compare
    from infercc.runtime import generate as gen

    if batches is not None and len(batches) != 1:
        raise InferccError(
            f"--generate runs one batch size, --batch gives {len(batches)}", "e.g. --batch 1"
        )
    prompt_len, prompt_file = prompting
    warmup, iters, seed = counts
    batch = batches[0] if batches else None
    prompt = gen.read_prompt(prompt_file) if prompt_file is not None else None
    warmup = gen.DEFAULT_WARMUP if warmup is None else warmup
    runs = gen.DEFAULT_RUNS if iters is None else iters
    # the two differ in their models and in spinning (compare's races never spin)
    run = (
        functools.partial(gen.compare_generation, model, other)
        if other is not None
        else functools.partial(gen.generate, model, spinning=spin)
    )
    with Progress(as_json, "generate") as progress:
        report = run(
            new_tokens,
            prompt_len=prompt_len,
            batch=batch,
            prompt=prompt,
            warmup=warmup,
            runs=runs,
            seed=seed,
            memory=memory,
            on_progress=progress.tick,
        )
    finish(report, as_json, render_generate_compare if other is not None else render_generate)


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
