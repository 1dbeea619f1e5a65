"""`BuildConfig`: one typed, frozen value for everything a build depends on.

The CLI's `optimize` options, the keyword arguments of `infercc.optimize`, a model entry of an
`infercc ci` manifest and the `build` section of an artifact's `manifest.json` are all this
one value: the target, the backend, the precision with its options (float16 inputs and
outputs, ops kept in float32, calibrated ranges), passes disabled and the constant-folding
limit, shape profiles, validation and its tolerances, and the typed options of each backend
(`OrtOptions`, `TrtOptions`).

Each field declares its option once (`infercc.options.Option` in the field's metadata): its
flags with their help, the types of its TOML key, its API keyword and older aliases, the
backend that alone reads it and where `optimize --help` lists it. The key table of
`from_dict`, the API's keywords (`from_keywords`), the command line's options (`from_flags`,
`infercc.cli.common`) and the rules "needs TensorRT", "needs ort" and "needs validation" are
made from those declarations; `tests/test_options.py` checks that each field has its flag, key
and keyword and that the three give the same config.

Values are checked where they are made (an opt level of 7, an unknown hardware compatibility
level, a size that is no size raise `InferccError`); combinations are checked by `check()`,
which holds every rule of the form "X needs Y" or "X has no effect with Y" (`RULES`): a flag
that would change nothing is an error naming the flag and why, never silently dropped.

The backend is decided in one place, `resolve()`: an `.onnx` output is written by no backend
(`none`), an artifact directory by the backend asked for, else `ort` for the cpu target and
`tensorrt` for GPU targets.

`to_dict()` is JSON (and TOML) data, the form an artifact's manifest records; `from_dict()`
reads it back (`BuildConfig.from_dict(c.to_dict()) == c`), and takes sizes as text ("1MiB"),
shapes as specs ("1x3x224x224" or "MIN:OPT:MAX"), and calibrated ranges as a `ranges.json`
path as well.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from infercc import options as _options
from infercc.analysis.memory import ALIGNMENT
from infercc.assumptions import check_assumptions
from infercc.data.loader import is_loader_spec, join_loader_spec, split_loader_spec
from infercc.data.profiles import ShapeProfile, as_shapes, parse_profiles
from infercc.errors import InferccError
from infercc.options import (
    BACKEND,
    OUTPUT,
    PASSES,
    PRECISION,
    SHAPES,
    TENSORRT,
    VALIDATION,
    Flag,
    option,
)
from infercc.precisions import BUILD_PRECISIONS, TOLERANCES, defaults_text, figure
from infercc.util import first_line, parse_size

# TensorRT's HardwareCompatibilityLevel, as --hw-compat spells it; builder optimization levels.
HW_COMPAT = ("none", "ampere+", "same-cc")
OPT_LEVELS = range(0, 6)

Range = tuple[str, float, float]  # tensor name, min, max
OutputTolerance = tuple[str, float, float]  # output name, atol, rtol
InputRange = tuple[str, float, float]  # input name, low, high


# --------------------------------------------------------------------------- shape profiles


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # normalizing a frozen dataclass in __post_init__


def _check_opt_level(level: Any) -> None:
    if level is None:
        return
    if isinstance(level, bool) or not isinstance(level, int) or level not in OPT_LEVELS:
        raise InferccError(f"--opt-level {level!r} is out of range", "give an integer 0-5")


def _profile_list(value: Any, where: str) -> tuple[ShapeProfile, ...]:
    """Shape profiles from ShapeProfile objects, NAME=SPEC strings or a {name: spec} table."""
    if isinstance(value, Mapping):
        value = [f"{name}={_spec_text(spec, where)}" for name, spec in value.items()]
    elif isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    found = [parse_profiles([v])[0] if isinstance(v, str) else v for v in value]
    if not all(isinstance(p, ShapeProfile) for p in found):
        raise InferccError(f"{where}: not a list of shape profiles", "give NAME=MIN:OPT:MAX specs")
    names = [p.name for p in found]
    if len(set(names)) != len(names):
        raise InferccError(f"{where} names an input twice", "give one spec per input")
    return tuple(found)


def _fixed_list(value: Any) -> tuple[ShapeProfile, ...]:
    """--static-shapes: fixed shapes only (a model cannot be fixed to a range)."""
    found = _profile_list(value, "--static-shapes")
    for p in found:
        if not p.is_fixed:
            raise InferccError(
                f"--static-shapes {p.name} gives a range",
                "fix one shape, e.g. --static-shapes input_ids=1x128 (ranges are for --shape)",
            )
    return found


def _profile_set(value: Any, index: int) -> tuple[ShapeProfile, ...]:
    found = _profile_list(value, f"--trt-profile {index}")
    if not found:
        raise InferccError(f"--trt-profile {index} names no input", 'e.g. "ids=1x16:1x64:1x128"')
    return found


def _spec_text(spec: Any, where: str) -> str:
    """A shape spec from its text ("1x3x32x32", "MIN:OPT:MAX") or a list of ints."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Sequence) and all(isinstance(d, int) for d in spec):
        return "x".join(str(d) for d in spec)
    raise InferccError(f'{where}: shape {spec!r} is not "1x3x224x224" or a list of ints', "fix it")


def _shape_spec(p: ShapeProfile) -> str:
    def dims(shape: tuple[int, ...]) -> str:
        return "x".join(str(d) for d in shape)

    return dims(p.opt) if p.is_fixed else ":".join(dims(s) for s in (p.min, p.opt, p.max))


def _specs(profiles: Sequence[ShapeProfile]) -> dict[str, str]:
    return {p.name: _shape_spec(p) for p in profiles}


# --------------------------------------------------------------------------- reading keys
# How a TOML/JSON value becomes a field's (`Option.read`), paths relative to a manifest.


def _path(value: Any, base: Path | None) -> str:
    return str(Path(os.path.normpath(base / value))) if base is not None else str(value)


def _data_text(value: Any) -> str:
    """`data` as the config records it: a path or a loader spec, never the samples."""
    if not isinstance(value, str | os.PathLike):
        raise InferccError(
            f"BuildConfig.data is a path or SCRIPT.py:FN, not a {type(value).__name__}",
            "give samples in memory to the call: optimize(model, output, data=samples)",
        )
    return str(value)


def _data_path(value: Any, base: Path | None) -> str:
    """A `data` path, or a data loader `script.py:fn` whose script path is relative."""
    if is_loader_spec(value):
        script, fn = split_loader_spec(value)
        return join_loader_spec(_path(str(script), base), fn)
    return _path(value, base)


def _paths(value: Any, base: Path | None) -> tuple[str, ...]:
    return tuple(_path(v, base) for v in value)


def _ranges_from(value: Any, base: Path | None) -> Any:
    return _path(value, base) if isinstance(value, str) else value


def _shapes_from(value: Any, base: Path | None) -> tuple[ShapeProfile, ...]:
    """Shapes from a {name: spec} table (each error names `shapes.NAME`) or a spec list."""
    if not isinstance(value, Mapping):
        return _profile_list(value, "shapes")
    found: list[ShapeProfile] = []
    for name, spec in value.items():
        try:
            found += _profile_list({name: spec}, f"shapes.{name}")
        except InferccError as exc:
            raise InferccError(f"shapes.{name}: {exc.message}", exc.hint) from None
    return tuple(found)


_NUMBER = (float,)  # an int is a float where one is due
_LIST = (list, tuple)
_TABLE = (dict, list, tuple)


# --------------------------------------------------------------------------- flags, keywords
# How a flag's parsed value (`Flag.value`), an API keyword's (`Option.api`) or a field's value
# as data (`Option.dump`) differ from the field's own form.


def _abspath(path: Any) -> str:
    return os.path.abspath(path)


def _abspaths(paths: Sequence[Any]) -> tuple[str, ...]:
    return tuple(os.path.abspath(p) for p in paths)


def _loader(spec: str) -> str:
    """--data-loader SCRIPT.py[:FN] with the script's path absolute."""
    script, fn = split_loader_spec(spec)
    return join_loader_spec(os.path.abspath(script), fn)


def _off(on: bool) -> bool:
    """--no-tune, --no-validate: given, the field is False."""
    return not on


def _fp16(on: bool) -> str:
    return "fp16"


def _bf16(on: bool) -> str:
    return "bf16"


def _int8(on: bool) -> str:
    return "int8"


def _fp16_keyword(on: bool) -> str | None:
    """The API's `fp16=True` is `precision="fp16"`; False says nothing."""
    return "fp16" if on else None


def _pins(value: Any) -> Any:
    """The API's `shapes`: {name: shape} pins one concrete shape per input (a range's opt;
    `infercc.data.profiles.as_shapes`); a list of profiles or specs is taken as it is."""
    if not isinstance(value, Mapping):
        return value
    return tuple(ShapeProfile(name, d, d, d) for name, d in (as_shapes(value) or {}).items())


def _pins_win(given: Mapping[str, Any]) -> tuple[ShapeProfile, ...]:
    """The API's `profiles` (what a backend tunes for) with `shapes` pins over them."""
    pins = _profile_list(given.get("shapes", ()), "shapes")
    named = {p.name for p in pins}
    ranges = _profile_list(given.get("profiles", ()), "profiles")
    return (*[p for p in ranges if p.name not in named], *pins)


def _fixed_shapes(value: Any) -> Any:
    """The API's `static_shapes`: {name: dims}, or a list of profiles or specs."""
    if not isinstance(value, Mapping):
        return value
    return tuple(ShapeProfile(n, tuple(d), tuple(d), tuple(d)) for n, d in value.items())


def _pairs(triples: Sequence[tuple[str, float, float]]) -> dict[str, list[float]]:
    return {name: [a, b] for name, a, b in triples}


def _spec_sets(sets: Sequence[Sequence[ShapeProfile]]) -> list[dict[str, str]]:
    return [_specs(p) for p in sets]


def _trt(default: Any, flag: Flag, types: tuple[type, ...], **kw: Any) -> Any:
    """A TensorRT builder option: read by the tensorrt backend alone."""
    return option(default, flag, types=types, panel=TENSORRT, backend="tensorrt", **kw)


# --------------------------------------------------------------------------- backend options


@dataclass(frozen=True)
class OrtOptions:
    """Options of the `ort` backend."""

    optimized_model: bool = option(
        False,
        Flag(
            "--ort-optimized-model",
            "With --backend ort: also save onnxruntime's own optimized graph "
            "(ort_optimized.onnx) for a faster start on this host.",
        ),
        types=(bool,),
        panel=BACKEND,
        backend="ort",
    )

    def to_dict(self) -> dict[str, Any]:
        return _options.to_data(self)


@dataclass(frozen=True)
class TrtOptions:
    """TensorRT builder options (`infercc.backends.trt.settings` turns them into a build).

    `workspace` is bytes (text such as "4GiB" is accepted); None lets the backend size it from
    the target's memory. `profiles` are the optimization profiles after the first (which
    `BuildConfig.shapes` gives), `shape_inputs` the value ranges of shape-tensor inputs.
    """

    workspace: int | None = _trt(
        None,
        Flag(
            "--workspace",
            "The builder's workspace limit, bytes or e.g. 512MiB, 4GiB [default: the target's "
            "memory less weights, activations and 512 MiB].",
            str,
            metavar="SIZE",
        ),
        (int, str),
    )
    opt_level: int | None = _trt(
        None,
        Flag(
            "--opt-level",
            "Builder optimization level 0-5 (TensorRT's default 3; higher builds slower, may "
            "run faster).",
            int,
            metavar="0-5",
            min=0,
            max=5,
        ),
        (int,),
    )
    hw_compat: str = _trt(
        "none",
        Flag(
            "--hw-compat",
            "Hardware compatibility: none, ampere+ (runs on any GPU of compute capability >= "
            "8.0) or same-cc (any GPU of the same compute capability); compatible engines may "
            "run slower.",
            str,
            metavar="LEVEL",
        ),
        (str,),
    )
    version_compatible: bool = _trt(
        False,
        Flag(
            "--version-compatible",
            "Build an engine later TensorRT versions (same major) can load, at some speed cost.",
        ),
        (bool,),
    )
    timing_cache_strict: bool = _trt(
        False,
        Flag(
            "--timing-cache-strict",
            "Fail when no timing cache exists for this TensorRT, GPU and CUDA (reproducible CI "
            "builds).",
        ),
        (bool,),
    )
    strict_target: bool = _trt(
        False,
        Flag(
            "--strict-target",
            "Refuse to build when the GPU here is not the --target's (engines are tuned for, "
            "and tied to, the GPU that builds them).",
        ),
        (bool,),
    )
    plugins: tuple[str, ...] = _trt(
        (),
        Flag(
            "--plugin",
            "A TensorRT plugin library (.so) to load before parsing and loading (repeatable).",
            Path,
            many=True,
            metavar="LIB",
            value=_abspaths,
        ),
        _LIST,
        read=_paths,
    )
    calib_cache: str | None = _trt(
        None,
        Flag(
            "--calib-cache",
            "With --int8 on TensorRT 10: a TensorRT calibration cache (infercc calibrate "
            "writes one) giving the int8 scales.",
            Path,
            metavar="FILE",
            value=_abspath,
        ),
        (str,),
        read=_path,
    )
    profiles: tuple[tuple[ShapeProfile, ...], ...] = _trt(
        (),
        Flag(
            "--trt-profile",
            "One more TensorRT optimization profile, comma-separated NAME=MIN:OPT:MAX specs, "
            'e.g. "ids=1x16:1x64:1x128" (repeatable; --shape is the first).',
            str,
            many=True,
            metavar="SPECS",
            old=("--profile",),
        ),
        _LIST,
        dump=_spec_sets,
    )
    shape_inputs: tuple[ShapeProfile, ...] = _trt(
        (),
        Flag(
            "--shape-input",
            "The range of a shape-tensor input's values, x-separated, e.g. "
            "new_shape=1x64:8x64:32x64 (repeatable).",
            str,
            many=True,
            metavar="NAME=MIN:OPT:MAX",
        ),
        _TABLE,
        dump=_specs,
    )

    def __post_init__(self) -> None:
        if self.workspace is not None:
            _set(self, "workspace", parse_size(self.workspace, "--workspace"))
        _check_opt_level(self.opt_level)
        if self.hw_compat not in HW_COMPAT:
            raise InferccError(
                f"--hw-compat {self.hw_compat!r} is unknown", f"use one of {', '.join(HW_COMPAT)}"
            )
        _set(self, "plugins", tuple(str(p) for p in self.plugins))
        if self.calib_cache is not None:
            _set(self, "calib_cache", str(self.calib_cache))
        _set(self, "profiles", tuple(_profile_set(p, i) for i, p in enumerate(self.profiles, 1)))
        _set(self, "shape_inputs", _profile_list(self.shape_inputs, "--shape-input"))

    def to_dict(self) -> dict[str, Any]:
        return _options.to_data(self)


# --------------------------------------------------------------------------- the config

_FP16_COSINE = figure(TOLERANCES["fp16"].min_cosine)


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build depends on (see the module doc); each field declares its option."""

    target: str = option(
        "cpu",
        Flag(
            "--target",
            "Target to optimize for (`infercc targets` lists them).",
            str,
            metavar="NAME",
        ),
        types=(str,),
        panel=BACKEND,
    )
    backend: str | None = option(  # None: decided by resolve()
        None,
        Flag(
            "--backend",
            "With -o DIR: the backend that builds the artifact (ort, openvino, tensorrt, none; "
            "auto: race the CPU row's backends, keep the fastest that validates) [default: "
            "ort for cpu (openvino with --bf16), tensorrt for GPU targets].",
            str,
            metavar="NAME",
        ),
        types=(str,),
        panel=BACKEND,
    )
    ort_custom_op_libs: tuple[str, ...] = option(
        (),
        Flag(
            "--ort-custom-op-lib",
            "An onnxruntime custom-op library (.so, .dll) implementing the model's custom ops, "
            "registered in every onnxruntime session: validation, tuning (repeatable).",
            Path,
            many=True,
            metavar="LIB",
            value=_abspaths,
        ),
        types=_LIST,
        panel=BACKEND,
        read=_paths,
    )
    precision: str = option(
        "fp32",
        Flag(
            "--fp16",
            "Convert weights and compute to float16 (inputs and outputs keep their types; risky "
            "ops stay float32, listed in the report). Validated by cosine >= "
            f"{_FP16_COSINE} against the original.",
            value=_fp16,
        ),
        Flag(
            "--bf16",
            "bfloat16 compute: on a CPU with avx512_bf16 or amx_bf16, OpenVINO's bf16 kernels "
            "(--backend openvino, the default with --bf16 on CPU targets); with --backend "
            "tensorrt 10.x, TensorRT's (BuilderFlag.BF16). Validated by cosine >= "
            f"{figure(TOLERANCES['bf16'].min_cosine)} per output.",
            value=_bf16,
        ),
        Flag(
            "--int8",
            "Build int8 from the graph's Q/DQ pairs (infercc calibrate writes such a model), or "
            "with --backend tensorrt on TensorRT 10 from --calib-cache.",
            value=_int8,
        ),
        types=(str,),
        panel=PRECISION,
        aliases=(("fp16", _fp16_keyword),),
        exclusive="a build has one precision",
    )
    fp16_io: bool = option(
        False,
        Flag("--fp16-io", "With --fp16: float16 inputs and outputs too."),
        types=(bool,),
        panel=PRECISION,
    )
    keep_fp32: tuple[str, ...] = option(  # op types or node names
        (),
        Flag(
            "--keep-fp32",
            "With --fp16: an op type or node name to keep in float32 (repeatable).",
            str,
            many=True,
            metavar="OP_OR_NODE",
        ),
        types=_LIST,
        panel=PRECISION,
    )
    ranges: tuple[Range, ...] = option(  # calibrated tensor ranges, sorted by name
        (),
        Flag(
            "--ranges",
            "With --fp16: calibrated ranges (the ranges.json `infercc calibrate` writes); a "
            "tensor whose range overflows float16 stays float32.",
            Path,
            metavar="FILE",
            value=_abspath,
        ),
        types=(dict, str, list, tuple),
        panel=PRECISION,
        read=_ranges_from,
        dump=_pairs,
        aliases=(("fp16_ranges", None),),
    )
    portable: bool = option(
        False,
        Flag(
            "--portable",
            "Keep standard ONNX only (no onnxruntime contrib ops; they are made only for "
            "onnxruntime on the cpu target).",
        ),
        types=(bool,),
        panel=PASSES,
    )
    assume: tuple[str, ...] = option(  # infercc.assumptions; sorted, each once
        (),
        Flag(
            "--assume",
            "State an assumption about the inputs (repeatable) under which more rewrites are "
            "exact; the model is then exact only on inputs that satisfy it. nonempty-sequences: "
            "no sequence is all padding (its attention_mask is not all zeros) and no decoder "
            "prompt is padded on the left, which removes the NaN guard after attention Softmax "
            "and the fix-up of GroupQueryAttention's rows that keep no key (a decoder whose "
            "mask is -1e9 fuses only under it). "
            "Recorded in the manifest and the report; validation's random inputs satisfy it.",
            str,
            many=True,
            metavar="NAME",
        ),
        types=_LIST,
        panel=PASSES,
    )
    fold_limit: int | None = option(  # None: fold-constants' default (16 MiB)
        None,
        Flag(
            "--fold-limit",
            "Largest constant that folding may create: bytes or a size, e.g. 1MiB [default: "
            "16MiB].",
            str,
            metavar="SIZE",
        ),
        types=(int, str),
        panel=PASSES,
    )
    freeze_initializers: bool = option(  # IR >= 4 inputs with defaults become constants
        False,
        Flag(
            "--freeze-initializers",
            "Treat initializers the model also lists as graph inputs (IR >= 4: defaults a "
            "caller may override) as constants, so they fold and fuse; they stop being inputs. "
            "Without it they stay inputs.",
        ),
        types=(bool,),
        panel=PASSES,
    )
    disable_passes: tuple[str, ...] = option(
        (),
        Flag(
            "--disable-pass",
            "Skip a pass by name (repeatable); `infercc passes` lists them.",
            str,
            many=True,
            metavar="PASS",
        ),
        types=_LIST,
        panel=PASSES,
    )
    shapes: tuple[ShapeProfile, ...] = option(
        (),
        Flag(
            "--shape",
            "Pin an input's shape, e.g. --shape input_ids=1x128 (repeatable), or give a range "
            "MIN:OPT:MAX, e.g. input_ids=1x128:8x128:32x512 (artifacts are tuned at each). "
            "Symbolic dims not pinned default to 1 (first axis) and 8 (others).",
            str,
            many=True,
            metavar="NAME=SHAPE",
            value=parse_profiles,
        ),
        types=_TABLE,
        panel=SHAPES,
        read=_shapes_from,
        dump=_specs,
        api=_pins,
        aliases=(("profiles", None),),
        merge=_pins_win,
    )
    static_shapes: tuple[ShapeProfile, ...] = option(  # fixed in the model
        (),
        Flag(
            "--static-shapes",
            "Fix an input's dimensions in the model itself, e.g. --static-shapes "
            "input_ids=1x128 (repeatable), so all shape arithmetic after it folds. The result "
            "is valid only for those input shapes (the report and manifest say so); without "
            "it, symbolic dimensions stay symbolic.",
            str,
            many=True,
            metavar="NAME=DIMS",
            value=parse_profiles,
        ),
        types=_TABLE,
        panel=SHAPES,
        read=_shapes_from,
        dump=_specs,
        api=_fixed_shapes,
    )
    verify: bool = option(
        False,
        Flag("--verify", "Check the IR's invariants after every pass (slower)."),
        types=(bool,),
        panel=PASSES,
    )
    external_data: bool = option(  # always on above 2 GB
        False,
        Flag(
            "--external-data",
            "Write weights to <output>.data even when under 2 GB (always done above 2 GB).",
        ),
        types=(bool,),
        panel=OUTPUT,
        api=bool,
    )
    alignment: int = option(
        ALIGNMENT,
        Flag("--align", "Byte alignment of tensors in the memory plan.", int, metavar="N", min=1),
        types=(int,),
        panel=OUTPUT,
    )
    tune: bool = option(
        True,
        Flag("--no-tune", "Build the artifact without autotuning.", value=_off),
        types=(bool,),
        panel=BACKEND,
    )
    validate: bool = option(
        True,
        Flag("--no-validate", "Skip comparing outputs with the original.", value=_off),
        types=(bool,),
        panel=VALIDATION,
        aliases=(("run_validation", None),),
    )
    data: str | None = option(  # samples, or a data loader script.py:fn
        None,
        Flag(
            "--data",
            "Validate on samples: a directory of .npz (one sample each, keyed by input name) or "
            "<input>.npy files, or one .npz.",
            Path,
            metavar="PATH",
            value=_abspath,
        ),
        Flag(
            "--data-loader",
            "Validate on the samples a Python function returns: SCRIPT.py[:FUNCTION] (default "
            "function load_data), a list or generator of {input name: array} dicts "
            "(Polygraphy's --data-loader-script).",
            str,
            metavar="SCRIPT.py[:FN]",
            value=_loader,
        ),
        types=(str,),
        panel=VALIDATION,
        read=_data_path,
        validation=True,
        exclusive="both give the samples",
    )
    input_ranges: tuple[InputRange, ...] = option(  # ranges of generated inputs
        (),
        Flag(
            "--input-range",
            "Draw the generated validation input NAME uniformly from LOW..HIGH (integers: both "
            "ends included), e.g. --input-range pixel_values=0:1 (repeatable; Polygraphy's "
            "--val-range).",
            str,
            many=True,
            metavar="NAME=LOW:HIGH",
        ),
        types=_TABLE,
        panel=VALIDATION,
        dump=_pairs,
        validation=True,
    )
    atol: float | None = option(  # None: the precision's (infercc.precisions)
        None,
        Flag(
            "--atol",
            f"Absolute tolerance [default: {defaults_text('atol')}].",
            float,
            metavar="X",
            min=0.0,
        ),
        types=_NUMBER,
        panel=VALIDATION,
        validation=True,
    )
    rtol: float | None = option(
        None,
        Flag(
            "--rtol",
            f"Relative tolerance [default: {defaults_text('rtol')}].",
            float,
            metavar="X",
            min=0.0,
        ),
        types=_NUMBER,
        panel=VALIDATION,
        validation=True,
    )
    min_cosine: float | None = option(
        None,
        Flag(
            "--min-cosine",
            f"Minimum cosine per output [default: {defaults_text('min_cosine')}].",
            float,
            metavar="X",
            min=0.0,
            max=1.0,
        ),
        types=_NUMBER,
        panel=VALIDATION,
        validation=True,
    )
    tolerances: tuple[OutputTolerance, ...] = option(
        (),
        Flag(
            "--tol",
            "Tolerance of one output, OUTPUT=ATOL:RTOL, e.g. logits=1e-3:1e-2 (repeatable).",
            str,
            many=True,
            metavar="OUTPUT=ATOL:RTOL",
        ),
        types=_TABLE,
        panel=VALIDATION,
        dump=_pairs,
        validation=True,
    )
    strict_coverage: bool = option(
        False,
        Flag(
            "--strict-coverage",
            "Fail validation when a rewritten If/Loop body never ran on the validation inputs "
            "(its rewrites were not checked); without it the report only warns. Give samples "
            "that reach it with --data.",
        ),
        types=(bool,),
        panel=VALIDATION,
        validation=True,
    )
    bisect: bool = option(  # on failure always bisect (else only when it is cheap)
        False,
        Flag(
            "--bisect",
            "When validation fails (or the optimized model does not run), rebuild with passes "
            "disabled to name the pass, rewrite and node that broke it, however long it takes "
            "(without it, only when that should take under 20 s).",
        ),
        types=(bool,),
        panel=VALIDATION,
        validation=True,
    )
    ort: OrtOptions = option(factory=OrtOptions)
    tensorrt: TrtOptions = option(factory=TrtOptions)

    def __post_init__(self) -> None:
        if self.precision not in BUILD_PRECISIONS:
            raise InferccError(
                f"precision {self.precision!r} is unknown",
                f"use one of {', '.join(BUILD_PRECISIONS)}",
            )
        _set(self, "keep_fp32", tuple(str(k) for k in self.keep_fp32))
        _set(self, "disable_passes", tuple(str(p) for p in self.disable_passes))
        _set(self, "assume", check_assumptions(self.assume))
        _set(self, "ranges", _ranges(self.ranges))
        _set(self, "tolerances", _output_tolerances(self.tolerances))
        _set(self, "input_ranges", input_ranges(self.input_ranges))
        _set(self, "shapes", _profile_list(self.shapes, "--shape"))
        _set(self, "static_shapes", _fixed_list(self.static_shapes))
        if self.fold_limit is not None:
            _set(self, "fold_limit", parse_size(self.fold_limit, "--fold-limit"))
        if self.data is not None:
            _set(self, "data", _data_text(self.data))
        _set(self, "ort_custom_op_libs", tuple(str(p) for p in self.ort_custom_op_libs))
        if isinstance(self.alignment, bool) or not isinstance(self.alignment, int):
            raise InferccError(f"--align {self.alignment!r} is not an integer", "e.g. --align 64")
        if self.alignment < 1:
            raise InferccError(f"--align {self.alignment} must be positive", "e.g. --align 64")
        for name in ("atol", "rtol", "min_cosine"):
            _check_tolerance(name, getattr(self, name))

    # -- derived values -----------------------------------------------------------------------

    @property
    def fold_limit_bytes(self) -> int:
        from infercc.passes.fold_constants import DEFAULT_FOLD_LIMIT

        return self.fold_limit if self.fold_limit is not None else DEFAULT_FOLD_LIMIT

    @property
    def shape_pins(self) -> dict[str, tuple[int, ...]]:
        """One concrete shape per input named (a range stands for its opt; an input fixed by
        --static-shapes has its fixed shape)."""
        return {**{p.name: p.opt for p in self.shapes}, **self.static_map}

    @property
    def static_map(self) -> dict[str, tuple[int, ...]]:
        """Input name -> the shape --static-shapes fixes it to."""
        return {p.name: p.opt for p in self.static_shapes}

    @property
    def second_pins(self) -> dict[str, tuple[int, ...]]:
        """The second validation profile's shapes of inputs given as a range: the max, or the
        min when the max is the opt (fixed shapes pin the first profile only)."""
        return {p.name: p.max if p.max != p.opt else p.min for p in self.shapes if not p.is_fixed}

    @property
    def range_map(self) -> dict[str, tuple[float, float]]:
        return {name: (lo, hi) for name, lo, hi in self.ranges}

    @property
    def tolerance_map(self) -> dict[str, tuple[float, float]]:
        return {name: (atol, rtol) for name, atol, rtol in self.tolerances}

    def pass_context(self, profile: Mapping[str, tuple[int, ...]] | None = None) -> Any:
        """The `PassContext` a build with this config runs its passes in (the same for
        `optimize` and `validate --bisect`); `profile` is the input shapes passes size for."""
        from infercc.passes.fp16 import Fp16Settings
        from infercc.passes.manager import PassContext

        options: dict[str, Any] = {"fold_limit": self.fold_limit_bytes, "shapes": profile}
        if self.precision == "fp16":
            keep = tuple(self.keep_fp32)
            options["fp16"] = Fp16Settings(self.fp16_io, keep, self.range_map or None)
        return PassContext(
            target="cpu" if is_cpu(self.target) else self.target,  # CPU rows rewrite alike
            backend=self.backend if self.backend in ("ort", "tensorrt", "openvino") else "ort",
            portable=self.portable,
            options=options,
            verify=self.verify,
            assumptions=frozenset(self.assume),
        )

    # -- the backend --------------------------------------------------------------------------

    def resolve(self, artifact: bool) -> BuildConfig:
        """This config with its target canonical and its backend decided: `none` when the output
        is an .onnx file (`artifact` False), else the one asked for, else `default_backend`."""
        target = canonical_target(self.target)
        if not artifact:
            if self.backend not in (None, "none"):
                raise InferccError(
                    f"--backend {self.backend} builds an artifact directory, but -o names an "
                    ".onnx file",
                    "give a directory with -o (e.g. -o build/model) to build with a backend",
                )
            return replace(self, target=target, backend="none")
        backend = self.backend or default_backend(target, self.precision)
        return replace(self, target=target, backend=backend)

    def check(self) -> BuildConfig:
        """Raise InferccError on the first rule of `RULES` this config breaks; else return it.
        A config whose backend is not decided yet is checked as an artifact build."""
        resolved = self.resolve(artifact=True)
        for rule in RULES:
            broken = rule(resolved)
            if broken is not None:
                raise InferccError(*broken)
        return self

    # -- as data, flags and keywords: made from the fields' options ----------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON data (the manifest's `build` section); `from_dict` reads it back."""
        return _options.to_data(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: Path | None = None) -> BuildConfig:
        """A config from `to_dict()` data, a ci manifest entry or JSON; InferccError naming the
        key on anything else. Relative paths (data, ranges, plugins, calib_cache) are taken
        relative to `base` when it is given."""
        return cls(**_options.read_table(cls, data, "", base))

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> BuildConfig:
        """A config from the command line's parsed flags, by parameter name (`align`,
        `no_tune`, `disable_pass`; `infercc.cli.common.build_parameters` makes them)."""
        return _options.from_flags(cls, values)

    @classmethod
    def from_keywords(cls, options: Mapping[str, Any]) -> BuildConfig:
        """A config from the Python API's keywords (`infercc.api.build_config`): field names,
        tables as dicts or `OrtOptions`/`TrtOptions`, and the older names (`run_validation`,
        `fp16`, `fp16_ranges`, `profiles`)."""
        return _options.from_keywords(cls, options)


# Every top-level key of a build table (a ci manifest's model entry takes these).
BUILD_KEYS = tuple(f.name for f in fields(BuildConfig))


# --------------------------------------------------------------------------- normalizing


def _ranges(value: Any) -> tuple[Range, ...]:
    if isinstance(value, (str, os.PathLike)):
        value = read_ranges(value)
    if isinstance(value, Mapping):
        value = [(name, *pair) for name, pair in value.items()]
    try:
        found = [(str(name), float(lo), float(hi)) for name, lo, hi in value]
    except (TypeError, ValueError):
        raise InferccError(
            "--ranges: not a table of tensor name -> (min, max)",
            "pass the ranges.json that `infercc calibrate` writes",
        ) from None
    return tuple(sorted(found))


def read_ranges(
    source: str | os.PathLike[str] | Mapping[str, tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """Tensor ranges for `--fp16`: a calibrate `ranges.json` (name -> {min, max, ...}) or a
    mapping name -> (min, max)."""
    if isinstance(source, Mapping):
        return {str(k): (float(v[0]), float(v[1])) for k, v in source.items()}
    path = Path(source)
    try:
        data = json.loads(path.read_text())
        return {str(k): (float(v["min"]), float(v["max"])) for k, v in data.items()}
    except FileNotFoundError:
        raise InferccError(f"ranges file {str(path)!r} does not exist", "check the path") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise InferccError(
            f"cannot read ranges from {str(path)!r}: {first_line(exc)}",
            "pass the ranges.json that `infercc calibrate` writes (name -> {min, max})",
        ) from None


def _output_tolerances(value: Any) -> tuple[OutputTolerance, ...]:
    """Per-output (atol, rtol) from a {name: (atol, rtol) | "ATOL:RTOL" | {atol, rtol}} table,
    `--tol OUTPUT=ATOL:RTOL` specs or a sequence of (name, atol, rtol); sorted by name."""
    if isinstance(value, Mapping):
        items = [(name, pair, f"for output {name!r}: {pair!r}") for name, pair in value.items()]
    else:
        items = [_tol_spec(v) if isinstance(v, str) else (v[0], v[1:], repr(v)) for v in value]
    found: dict[str, tuple[float, float]] = {}
    for name, pair, shown in items:
        if isinstance(pair, str):
            pair = pair.split(":")
        if isinstance(pair, Mapping) and set(pair) <= {"atol", "rtol"}:
            pair = (pair.get("atol", 0.0), pair.get("rtol", 0.0))
        try:
            atol, rtol = (float(x) for x in pair)
        except (TypeError, ValueError):
            atol = rtol = -1.0
        if min(atol, rtol) < 0 or math.isnan(atol + rtol):
            raise InferccError(
                f"bad --tol {shown}", "write OUTPUT=ATOL:RTOL, e.g. --tol logits=1e-3:1e-2"
            )
        if str(name) in found:
            raise InferccError(f"--tol given twice for output {name!r}", "pass one per output")
        found[str(name)] = (atol, rtol)
    return tuple(sorted((name, a, r) for name, (a, r) in found.items()))


def _tol_spec(spec: str) -> tuple[str, str, str]:
    """`OUTPUT=ATOL:RTOL` -> (output, "ATOL:RTOL", the spec as messages show it)."""
    name, sep, rest = spec.rpartition("=")
    if not sep or not name:
        raise InferccError(
            f"bad --tol {spec!r}", "write OUTPUT=ATOL:RTOL, e.g. --tol logits=1e-3:1e-2"
        )
    return name, rest, repr(spec)


def input_ranges(value: Any) -> tuple[InputRange, ...]:
    """Value ranges of generated inputs from `--input-range NAME=LOW:HIGH` specs, a table
    {name: (low, high) | "LOW:HIGH"}, or (name, low, high) triples; sorted by name."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = [_range_spec(v) if isinstance(v, str) else (v[0], v[1:]) for v in value]
    found: dict[str, tuple[float, float]] = {}
    for name, pair in items:
        if isinstance(pair, str):
            pair = pair.split(":")
        try:
            low, high = (float(x) for x in pair)
        except (TypeError, ValueError):
            low, high = math.nan, math.nan
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise InferccError(
                f"bad --input-range for input {name!r}: {pair!r}",
                "write NAME=LOW:HIGH with finite LOW <= HIGH, e.g. --input-range sr=8000:16000",
            )
        if str(name) in found:
            raise InferccError(
                f"--input-range given twice for input {name!r}", "pass one range per input"
            )
        found[str(name)] = (low, high)
    return tuple(sorted((name, lo, hi) for name, (lo, hi) in found.items()))


def _range_spec(spec: str) -> tuple[str, str]:
    name, sep, rest = spec.rpartition("=")
    if not sep or not name:
        raise InferccError(
            f"bad --input-range {spec!r}: expected NAME=LOW:HIGH",
            "e.g. --input-range pixel_values=0:1",
        )
    return name, rest


def _check_tolerance(name: str, value: float | None) -> None:
    if value is None:
        return
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InferccError(f"{flag} {value!r} is not a number", f"e.g. {flag} 0.001")
    if name == "min_cosine" and value > 1.0:
        raise InferccError(
            f"--min-cosine {value!r} can never hold: a cosine is at most 1",
            "e.g. --min-cosine 0.999",
        )
    if value < 0:
        raise InferccError(f"{flag} {value!r} is negative", f"give 0 or more, e.g. {flag} 0.001")


def canonical_target(target: str) -> str:
    """The database's name for a target (unknown names raise with the list)."""
    from infercc.analysis.targets import get_target

    return "cpu" if target.lower() == "cpu" else get_target(target).name


def is_cpu(target: str) -> bool:
    """`cpu` (this host) or a CPU row such as x86-avx2."""
    from infercc.analysis.targets import is_cpu as _is_cpu

    return _is_cpu(target)


def default_backend(target: str, precision: str = "fp32") -> str:
    """ort for CPU targets (openvino for bf16: onnxruntime's CPU provider has no bfloat16
    kernels on x86), tensorrt for GPU targets."""
    if not is_cpu(target):
        return "tensorrt"
    return "openvino" if precision == "bf16" else "ort"


# --------------------------------------------------------------------------- rules

Broken = tuple[str, str] | None  # (message naming the flag, hint)
Rule = Callable[[BuildConfig], Broken]


def _backend_words(c: BuildConfig) -> str:
    if c.backend == "none":
        return "no backend (an .onnx output, or --backend none)"
    return f"backend {c.backend}"


def _fp16_options_need_fp16(c: BuildConfig) -> Broken:
    """--fp16-io, --keep-fp32 and --ranges steer the float16 rewrite: without --fp16 there is
    none."""
    given = {
        "--fp16-io": (c.fp16_io, "float16 inputs and outputs come with the float16 rewrite"),
        "--keep-fp32": (c.keep_fp32, "it names what the float16 rewrite leaves in float32"),
        "--ranges": (c.ranges, "ranges are for --fp16 only"),
    }
    for flag, (value, why) in given.items():
        if value and c.precision != "fp16":
            return (f"{flag} has no effect without --fp16: {why}", f"add --fp16, or drop {flag}")
    return None


def fp16_passes() -> tuple[str, ...]:
    """The passes only `--fp16` runs (the fp16 pipeline's, less optimize's): the float16
    rewrite itself (convert-fp16)."""
    from infercc.passes.pipelines import FP16, OPTIMIZE

    return tuple(n for n in FP16.passes if n not in OPTIMIZE.passes)


def option_passes(option: str) -> tuple[str, ...]:
    """The passes that read `PassContext` option `option`: those that declare it at
    registration (`register_pass(..., reads=...)`)."""
    return _declaring("reads", option)


def _declaring(declaration: str, name: str) -> tuple[str, ...]:
    """The registered passes whose declaration `declaration` (a `PassInfo` field: reads,
    assumptions) names `name`."""
    import infercc.passes  # noqa: F401  (registers the passes)
    from infercc.passes.manager import REGISTRY

    return tuple(p for p, info in REGISTRY.items() if name in getattr(info, declaration))


def _fp16_needs_convert_pass(c: BuildConfig) -> Broken:
    """--fp16 with its rewrite (convert-fp16) disabled would build an fp32 model labelled
    fp16; that pass disabled without --fp16 changes nothing."""
    for name in fp16_passes():
        if name in c.disable_passes and c.precision == "fp16":
            return (f"--fp16 has no effect with --disable-pass {name}", "drop one of them")
        if name in c.disable_passes:
            return (f"--disable-pass {name} has no effect without --fp16", "drop it")
    return None


def _bf16_needs_a_bf16_backend(c: BuildConfig) -> Broken:
    """bf16 is a backend's kernel choice, not a graph rewrite: OpenVINO's on a CPU target,
    TensorRT's on a GPU. onnxruntime's CPU provider has no bfloat16 kernels on x86."""
    if c.precision != "bf16" or c.backend in ("openvino", "tensorrt", "auto"):
        return None
    if is_cpu(c.target):
        why = "onnxruntime's CPU provider has no bfloat16 kernels" if c.backend == "ort" else ""
        return (
            f"--bf16 needs --backend openvino on a CPU target (this build has "
            f"{_backend_words(c)}{': ' + why if why else ''})",
            "build an artifact with -o DIR --backend openvino --bf16, or use --int8",
        )
    return (
        f"--bf16 needs --backend tensorrt (this build has {_backend_words(c)})",
        "use --fp16 (a graph rewrite every backend runs)",
    )


def _bf16_needs_a_target_with_bf16(c: BuildConfig) -> Broken:
    """A bfloat16 build on a target without bfloat16 would run fp32 (OpenVINO falls back
    silently): refused, naming the ISA found and the targets that have it."""
    if c.precision != "bf16":
        return None
    from infercc.analysis.targets import bf16_cpu_targets, get_target, host_cpu_info

    target = get_target(c.target)
    if "bf16" not in target.precisions:
        if target.kind == "cpu":
            row = target.cpu_class or "an unknown CPU class"
            return (
                f"--bf16 has no effect on the {target.name} target ({row}): its CPU has "
                "neither avx512_bf16 nor amx_bf16",
                "CPU targets with bfloat16: " + ", ".join(bf16_cpu_targets()),
            )
        return (
            f"--bf16 has no effect on the {target.name} target: it has no bfloat16",
            f"{target.name} has: {', '.join(target.precisions)}",
        )
    info, _cores = host_cpu_info()
    host_bf16 = any(f in info.features for f in ("avx512_bf16", "amx_bf16"))
    if target.kind == "cpu" and c.backend in ("openvino", "auto") and not host_bf16:
        row = info.row.name if info.row is not None else "an unknown CPU class"
        return (
            f"--bf16 for {target.name} needs this CPU to have bfloat16 to compile and validate "
            f"on, and it is {row} (no avx512_bf16, no amx_bf16)",
            "build on a host of a CPU row with bfloat16: " + ", ".join(bf16_cpu_targets()),
        )
    return None


def _openvino_needs_a_cpu_target(c: BuildConfig) -> Broken:
    if c.backend in ("openvino", "auto") and not is_cpu(c.target):
        return (
            f"--backend {c.backend} needs a CPU --target (the {c.target} target is a GPU)",
            "give --target cpu (or a CPU row), or use --backend tensorrt",
        )
    return None


def _fp16_on_openvino(c: BuildConfig) -> Broken:
    """OpenVINO's CPU plugin computes a float16 graph in fp32 or bf16: the rewrite buys
    nothing there but its rounding."""
    if c.backend == "openvino" and c.precision == "fp16":
        return (
            "--fp16 has no effect on --backend openvino: its CPU plugin computes float16 "
            "graphs in fp32 or bf16",
            "use --bf16 where the CPU has bfloat16, or --int8 on a calibrated model",
        )
    return None


def _backend_option_given(c: BuildConfig, backend: str) -> str | None:
    """The flag of the first option that `backend` alone reads (its field's `Option.backend`)
    and that `c` sets to other than its default."""
    return next((leaf.option.flag for leaf in _options.given(c, backend=backend)), None)


def _tensorrt_options_need_tensorrt(c: BuildConfig) -> Broken:
    """Every TensorRT builder option changes only a TensorRT engine."""
    flag = _backend_option_given(c, "tensorrt") if c.backend != "tensorrt" else None
    if flag is not None:
        return (
            f"{flag} has no effect: it is a TensorRT builder option and this build has "
            f"{_backend_words(c)}",
            "build with --backend tensorrt -o DIR, or drop it",
        )
    return None


def _calib_cache_needs_int8(c: BuildConfig) -> Broken:
    if c.tensorrt.calib_cache is not None and c.precision != "int8":
        return ("--calib-cache has no effect without --int8", "add --int8, or drop --calib-cache")
    return None


def _ort_options_need_ort(c: BuildConfig) -> Broken:
    flag = _backend_option_given(c, "ort") if c.backend not in ("ort", "auto") else None
    if flag is not None:
        return (
            f"{flag} has no effect: this build has {_backend_words(c)}",
            "build with --backend ort -o DIR, or drop it",
        )
    return None


def _tensorrt_needs_a_gpu_target(c: BuildConfig) -> Broken:
    if c.backend == "tensorrt" and is_cpu(c.target):
        return (
            f"--backend tensorrt needs a GPU --target (the {c.target} target has no TensorRT)",
            "give --target a100 (or another GPU), or use --backend ort",
        )
    return None


def _no_tune_needs_a_tuning_backend(c: BuildConfig) -> Broken:
    if not c.tune and c.backend == "none":
        return (
            "--no-tune has no effect: nothing is tuned without a backend",
            "drop --no-tune, or build an artifact with --backend ort or tensorrt",
        )
    if not c.tune and c.backend == "openvino" and c.precision != "int8":
        return (
            f"--no-tune has no effect on an openvino {c.precision} build: it compiles one "
            "configuration (only int8 races its float rest in f32 and bf16)",
            "drop --no-tune",
        )
    return None


def _custom_op_libs_need_a_session(c: BuildConfig) -> Broken:
    """--ort-custom-op-lib is read by onnxruntime sessions: validation's, and the ort backend's
    tuning; a build that makes neither (TensorRT or no backend, without validation) has none."""
    if c.ort_custom_op_libs and not c.validate and c.backend != "ort":
        return (
            "--ort-custom-op-lib has no effect with --no-validate: no onnxruntime session runs "
            f"the model (backend {c.backend})",
            "drop --ort-custom-op-lib, or validate",
        )
    return None


def _validation_options_need_validation(c: BuildConfig) -> Broken:
    """Tolerances, samples, coverage and the bisection of a failure are only read by
    validation (the options that declare `validation`)."""
    if c.validate:
        return None
    for leaf in _options.given(c, validation=True):
        flag = leaf.option.flag
        return (f"{flag} has no effect with --no-validate", f"drop {flag} or --no-validate")
    return None


def _input_ranges_need_generated_inputs(c: BuildConfig) -> Broken:
    """--input-range shapes the random inputs; samples from --data are fed as they are."""
    if c.input_ranges and c.data is not None and c.validate:
        return (
            "--input-range has no effect with --data: the samples are fed as they are",
            "drop --input-range, or --data to validate on generated inputs",
        )
    return None


def _fold_limit_needs_folding(c: BuildConfig) -> Broken:
    """--fold-limit with every pass that reads it (fold-constants) disabled."""
    readers = option_passes("fold_limit")
    if c.fold_limit is not None and all(p in c.disable_passes for p in readers):
        return (
            f"--fold-limit has no effect with --disable-pass {' '.join(readers)}",
            "drop one of them",
        )
    return None


def _portable_needs_fused_ops_to_avoid(c: BuildConfig) -> Broken:
    """--portable keeps onnxruntime's contrib ops out; only fuse-conv-activation (FusedConv)
    and emit-attention (Attention) make one, and only for onnxruntime on the cpu target
    (PassContext.fused_ops_allowed)."""
    if not c.portable:
        return None
    if not is_cpu(c.target) or c.backend in ("tensorrt", "openvino"):
        where = f"the {c.target} target" if not is_cpu(c.target) else f"backend {c.backend}"
        return (
            f"--portable has no effect with {where}: only onnxruntime on the cpu target gets "
            "contrib ops",
            "drop --portable",
        )
    return None


def assumption_passes(name: str) -> tuple[str, ...]:
    """The passes whose rewrites assumption `name` can enable: those that declare it at
    registration (`register_pass(..., assumptions=...)`)."""
    return _declaring("assumptions", name)


def _assumptions_need_their_passes(c: BuildConfig) -> Broken:
    """--assume with every pass that reads the assumption disabled would change nothing."""
    for name in c.assume:
        readers = assumption_passes(name)
        if all(p in c.disable_passes for p in readers):
            return (
                f"--assume {name} has no effect: the passes that use it are disabled",
                f"drop --assume, or enable {' or '.join(readers)}",
            )
    return None


def _disabled_passes_exist(c: BuildConfig) -> Broken:
    import infercc.passes  # noqa: F401  (registers the passes)
    from infercc.passes.manager import REGISTRY

    for name in c.disable_passes:
        if name not in REGISTRY:
            return (
                f"unknown pass {name!r} (--disable-pass)",
                "known passes: " + ", ".join(sorted(REGISTRY)),
            )
    return None


def _disabled_passes_run(c: BuildConfig) -> Broken:
    """A known pass that this build's pipelines do not run (an int8 pass in optimize)."""
    from infercc.passes.manager import REGISTRY
    from infercc.passes.pipelines import optimize_stages

    fp16 = set(fp16_passes())  # without --fp16: _fp16_needs_convert_pass says why
    runs = {name for stage in optimize_stages(c.precision) for name in stage} | fp16
    for name in c.disable_passes:
        if name in REGISTRY and name not in runs:
            return (
                f"--disable-pass {name} has no effect: optimize does not run it",
                "optimize runs: " + ", ".join(sorted(runs - fp16)),
            )
    return None


def _shapes_agree_with_static_shapes(c: BuildConfig) -> Broken:
    """A model fixed to one shape accepts only that shape: a --shape (or range) naming another
    for the same input could never run."""
    fixed = c.static_map
    for p in c.shapes:
        if p.name in fixed and not (p.is_fixed and p.opt == fixed[p.name]):
            return (
                f"--shape {p.name} differs from --static-shapes {p.name}: the model will accept "
                "only the fixed shape",
                f"drop --shape {p.name}",
            )
    return None


RULES: tuple[Rule, ...] = (
    _disabled_passes_exist,
    _disabled_passes_run,
    _fp16_options_need_fp16,
    _fp16_needs_convert_pass,
    _openvino_needs_a_cpu_target,
    _bf16_needs_a_bf16_backend,
    _bf16_needs_a_target_with_bf16,
    _fp16_on_openvino,
    _tensorrt_needs_a_gpu_target,
    _tensorrt_options_need_tensorrt,
    _calib_cache_needs_int8,
    _ort_options_need_ort,
    _no_tune_needs_a_tuning_backend,
    _custom_op_libs_need_a_session,
    _validation_options_need_validation,
    _input_ranges_need_generated_inputs,
    _fold_limit_needs_folding,
    _portable_needs_fused_ops_to_avoid,
    _shapes_agree_with_static_shapes,
    _assumptions_need_their_passes,
)
