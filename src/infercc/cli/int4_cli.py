"""The `calibrate --int4` branch of the command line: which flags belong to which precision."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infercc.errors import InferccError

_INT4_FLAGS = {
    "block_size": "--block-size",
    "symmetric": "--symmetric/--asymmetric",
    "portable": "--portable",
    "accuracy_level": "--accuracy-level",
    "lm_head": "--lm-head/--no-lm-head",
    "embeddings": "--embeddings/--no-embeddings",
    "assume": "--assume",
    "shape": "--shape",
    "bisect": "--bisect",
}
_INT8_FLAGS = {
    "percentile": "--percentile",
    "min_cosine": "--min-cosine",
    "max_top1_drop": "--max-top1-drop",
    "min_cosine_floor": "--min-cosine-floor",
    "activations": "--activations",
    "weight_bits": "--weight-bits",
    "activation_matmuls": "--activation-matmuls",
    "max_trials": "--max-trials",
    "outlier_channels": "--no-outlier-channels",
}


def int4_only_flags(given: Mapping[str, Any]) -> None:
    """Refuse int4 flags on an int8 run: they would have no effect."""
    for key, value in given.items():
        if value is not None:
            raise InferccError(
                f"{_INT4_FLAGS[key]} applies to --int4 only", "add --int4 or drop it"
            )


def check_int8_only_flags(**given: Any) -> None:
    """Refuse int8 flags on an int4 run."""
    for key, value in given.items():
        if value is not None:
            raise InferccError(
                f"{_INT8_FLAGS[key]} applies to int8 calibration, not --int4",
                "drop it (int4 is weight-only: no activation ranges, no sensitivity search)",
            )


def calibrate_shapes(specs: Sequence[str] | None) -> dict[str, tuple[int, ...]] | None:
    """`--shape` specs parsed as optimize parses them; a range is refused (calibrate runs one
    shape, there is nothing to tune at the others)."""
    from infercc.data.profiles import parse_profiles

    profiles = parse_profiles(list(specs or []))
    for p in profiles:
        if not p.is_fixed:
            raise InferccError(
                f"--shape {p.name} gives a range: calibrate's random inputs take one shape",
                f"give one shape, e.g. --shape {p.name}={'x'.join(map(str, p.opt))}",
            )
    return {p.name: p.opt for p in profiles} or None


def run_int4(
    model: Path,
    output: Path,
    data: Path | None,
    method: str | None,
    flags: Mapping[str, Any],
    exclude: Sequence[str],
    num_samples: int | None,
    holdout: float,
    preprocess: str | None,
    target: str,
    speed_check: bool,
    step: Callable[[str], None],
    tick: Callable[[int, int | None], None] | None,
):
    from infercc.calib.weight_only import calibrate_int4

    def pick(key: str, default: Any) -> Any:
        return default if flags.get(key) is None else flags[key]

    return calibrate_int4(
        model,
        output,
        data=data,
        method=method or "rtn",
        block_size=pick("block_size", None),
        symmetric=flags.get("symmetric"),
        portable=bool(flags.get("portable")),
        target=target,
        accuracy_level=pick("accuracy_level", "auto"),
        exclude=exclude,
        lm_head=pick("lm_head", True),
        embeddings=pick("embeddings", False),
        num_samples=num_samples,
        holdout=holdout,
        preprocess=preprocess,
        speed_check=speed_check,
        assume=flags.get("assume") or (),
        disable_passes=flags.get("disable_pass") or (),
        shapes=calibrate_shapes(flags.get("shape")),
        verify=bool(flags.get("verify")),
        bisect=bool(flags.get("bisect")),
        on_step=step,
        on_progress=tick,
    )
