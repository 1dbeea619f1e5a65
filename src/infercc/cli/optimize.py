"""`infercc optimize`: its options make one `BuildConfig`, which `infercc.api.optimize` builds.

The build options are not written here: `with_build_options` gives the command one Typer
option per flag declared on `BuildConfig`'s fields (`infercc.config`), listed in --help by
panel, and `BuildConfig.from_flags` reads them back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from infercc.cli.app import app, err, settings
from infercc.cli.common import Progress, cache_dir_option, finish, with_build_options
from infercc.config import BuildConfig
from infercc.errors import InferccError
from infercc.options import BACKEND, OUTPUT, PASSES, REPORT, flag_keys

# The options that are not build options (those come from BuildConfig's fields), each in its
# panel of --help.
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "-o",
        "--output",
        metavar="PATH",
        help="Where to write the optimized model [default: <stem>.opt.onnx beside the input]; "
        "a path not ending in .onnx (any case) builds an artifact directory with --backend "
        "(said on stderr). Same as the second argument.",
        rich_help_panel=OUTPUT,
    ),
]
BackendCacheDirOpt = Annotated[Path | None, cache_dir_option(BACKEND)]
ExplainOpt = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="List every rewrite that matched but refused, and why.",
        rich_help_panel=PASSES,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON object on stdout instead of tables.", rich_help_panel=REPORT
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
        rich_help_panel=REPORT,
    ),
]
SaveConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--save-config",
        metavar="FILE",
        help="Write the resolved build (model, output, every option) to FILE, TOML for a "
        ".toml name, else JSON, for --config to replay.",
        rich_help_panel=REPORT,
    ),
]


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
    cache_dir: BackendCacheDirOpt = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    config: ConfigOpt = None,
    save_config: SaveConfigOpt = None,
    **flags: Any,
) -> None:
    """Optimize MODEL: fold constants, drop dead code and no-ops, fuse Conv+BN+activation,
    Q/K/V projections and MatMul+bias (into Gemm), attention into onnxruntime's Attention op
    and RoPE into RotaryEmbedding (cpu target; a decoder's attention with its KV cache into
    GroupQueryAttention, exact on padded rows too), schedule for memory; validate
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
    from infercc.cli.render import render_optimize

    given = BuildConfig.from_flags(flags)
    out = _one_output(output_arg, output)
    cfg = given
    if config is not None:
        from infercc.record import load_record

        record = load_record(config)
        cfg = merge_flags(record.config, given, given_flags(ctx))
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


with_build_options(optimize, first=("output",))
app.command(short_help="Optimize a model, validate it, write it (or build an artifact).")(optimize)


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


# CLI parameter -> the BuildConfig key it sets ("ort.x" / "tensorrt.x": a key of that table),
# made from the fields' declarations.
FLAG_KEYS = flag_keys(BuildConfig)


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
