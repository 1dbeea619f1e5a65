"""`BuildConfig`: one typed, frozen value for everything a build depends on.

The CLI's `optimize` options, the keyword arguments of `infercc.optimize`, a model entry of an
`infercc ci` manifest and the `build` section of an artifact's `manifest.json` are all this
one value: the target, the backend, the precision with its options (float16 inputs and
outputs, ops kept in float32, calibrated ranges), passes disabled and the constant-folding
limit, shape profiles, validation and its tolerances, and the typed options of each backend
(`OrtOptions`, `TrtOptions`).

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
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from infercc.assumptions import check_assumptions
from infercc.data.loader import is_loader_spec, join_loader_spec, split_loader_spec
from infercc.data.profiles import ShapeProfile, parse_profiles
from infercc.errors import InferccError
from infercc.precisions import BUILD_PRECISIONS
from infercc.util import first_line, parse_size

DEFAULT_ALIGNMENT = 64
# TensorRT's HardwareCompatibilityLevel, as --hw-compat spells it; builder optimization levels.
HW_COMPAT = ("none", "ampere+", "same-cc")
OPT_LEVELS = range(0, 6)
# Passes named in rules below.
FOLD_PASS = "fold-constants"
FP16_PASS = "convert-fp16"

Range = tuple[str, float, float]  # tensor name, min, max
OutputTolerance = tuple[str, float, float]  # output name, atol, rtol
InputRange = tuple[str, float, float]  # input name, low, high


# --------------------------------------------------------------------------- backend options


@dataclass(frozen=True)
class OrtOptions:
    """Options of the `ort` backend."""

    optimized_model: bool = False  # --ort-optimized-model: save onnxruntime's optimized graph

    def to_dict(self) -> dict[str, Any]:
        return {"optimized_model": self.optimized_model}


@dataclass(frozen=True)
class TrtOptions:
    """TensorRT builder options (`infercc.backends.trt.settings` turns them into a build).

    `workspace` is bytes (text such as "4GiB" is accepted); None lets the backend size it from
    the target's memory. `profiles` are the optimization profiles after the first (which
    `BuildConfig.shapes` gives), `shape_inputs` the value ranges of shape-tensor inputs.
    """

    workspace: int | None = None
    opt_level: int | None = None
    hw_compat: str = "none"
    version_compatible: bool = False
    timing_cache_strict: bool = False
    strict_target: bool = False
    plugins: tuple[str, ...] = ()
    calib_cache: str | None = None
    profiles: tuple[tuple[ShapeProfile, ...], ...] = ()
    shape_inputs: tuple[ShapeProfile, ...] = ()

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
        return {
            "workspace": self.workspace,
            "opt_level": self.opt_level,
            "hw_compat": self.hw_compat,
            "version_compatible": self.version_compatible,
            "timing_cache_strict": self.timing_cache_strict,
            "strict_target": self.strict_target,
            "plugins": list(self.plugins),
            "calib_cache": self.calib_cache,
            "profiles": [_specs(p) for p in self.profiles],
            "shape_inputs": _specs(self.shape_inputs),
        }


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
    found = _profile_list(value, f"--profile {index}")
    if not found:
        raise InferccError(f"--profile {index} names no input", 'e.g. "ids=1x16:1x64:1x128"')
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


# --------------------------------------------------------------------------- the config


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build depends on (see the module doc). Field comments give the CLI flag."""

    target: str = "cpu"  # --target
    backend: str | None = None  # --backend; None: decided by resolve()
    precision: str = "fp32"  # --fp16, --bf16, --int8
    fp16_io: bool = False  # --fp16-io
    keep_fp32: tuple[str, ...] = ()  # --keep-fp32 (op types or node names)
    ranges: tuple[Range, ...] = ()  # --ranges (calibrated tensor ranges, sorted by name)
    portable: bool = False  # --portable
    assume: tuple[str, ...] = ()  # --assume (infercc.assumptions; sorted, each once)
    fold_limit: int | None = None  # --fold-limit; None: fold-constants' default (16 MiB)
    freeze_initializers: bool = False  # --freeze-initializers (IR >= 4 inputs with defaults)
    disable_passes: tuple[str, ...] = ()  # --disable-pass
    shapes: tuple[ShapeProfile, ...] = ()  # --shape
    static_shapes: tuple[ShapeProfile, ...] = ()  # --static-shapes (fixed in the model)
    verify: bool = False  # --verify
    external_data: bool = False  # --external-data (always on above 2 GB)
    alignment: int = DEFAULT_ALIGNMENT  # --align
    tune: bool = True  # --no-tune
    validate: bool = True  # --no-validate
    data: str | None = None  # --data (samples) or --data-loader (script.py:fn)
    input_ranges: tuple[InputRange, ...] = ()  # --input-range NAME=LOW:HIGH (generated inputs)
    atol: float | None = None  # --atol; None: the precision's (infercc.precisions)
    rtol: float | None = None  # --rtol
    min_cosine: float | None = None  # --min-cosine
    tolerances: tuple[OutputTolerance, ...] = ()  # --tol OUTPUT=ATOL:RTOL
    strict_coverage: bool = False  # --strict-coverage: a rewritten body never run fails
    bisect: bool = False  # --bisect: on failure always bisect (else only when it is cheap)
    ort: OrtOptions = field(default_factory=OrtOptions)
    tensorrt: TrtOptions = field(default_factory=TrtOptions)

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
            _set(self, "data", str(self.data))
        if isinstance(self.alignment, bool) or not isinstance(self.alignment, int):
            raise InferccError(f"--align {self.alignment!r} is not an integer", "e.g. --align 64")
        if self.alignment < 1:
            raise InferccError(f"--align {self.alignment} must be positive", "e.g. --align 64")
        for name in ("atol", "rtol", "min_cosine"):
            _check_tolerance(name, getattr(self, name))

    # -- derived values -----------------------------------------------------------------------

    @property
    def fold_limit_bytes(self) -> int:
        from infercc.passes.manager import DEFAULT_FOLD_LIMIT

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
        from infercc.passes.manager import PassContext

        ctx = PassContext(
            target="cpu" if is_cpu(self.target) else self.target,  # CPU rows rewrite alike
            portable=self.portable,
            fold_limit=self.fold_limit_bytes,
            verify=self.verify,
        )
        ctx.backend = self.backend if self.backend in ("ort", "tensorrt") else "ort"
        ctx.shapes = profile
        ctx.assumptions = frozenset(self.assume)
        if self.precision == "fp16":
            ctx.fp16_io, ctx.keep_fp32 = self.fp16_io, tuple(self.keep_fp32)
            ctx.ranges = self.range_map or None
        return ctx

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
        return replace(self, target=target, backend=self.backend or default_backend(target))

    def check(self) -> BuildConfig:
        """Raise InferccError on the first rule of `RULES` this config breaks; else return it.
        A config whose backend is not decided yet is checked as an artifact build."""
        resolved = self.resolve(artifact=True)
        for rule in RULES:
            broken = rule(resolved)
            if broken is not None:
                raise InferccError(*broken)
        return self

    # -- as data ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON data (the manifest's `build` section); `from_dict` reads it back."""
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            keep_fp32=list(self.keep_fp32),
            ranges={name: [lo, hi] for name, lo, hi in self.ranges},
            disable_passes=list(self.disable_passes),
            assume=list(self.assume),
            shapes=_specs(self.shapes),
            static_shapes=_specs(self.static_shapes),
            tolerances={name: [a, r] for name, a, r in self.tolerances},
            input_ranges={name: [lo, hi] for name, lo, hi in self.input_ranges},
            ort=self.ort.to_dict(),
            tensorrt=self.tensorrt.to_dict(),
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: Path | None = None) -> BuildConfig:
        """A config from `to_dict()` data, a ci manifest entry or JSON; InferccError naming the
        key on anything else. Relative paths (data, ranges, plugins, calib_cache) are taken
        relative to `base` when it is given."""
        return cls(**_read_keys(data, _TOP_KEYS, "", base))


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
    """Per-output (atol, rtol) from a {name: (atol, rtol) | "ATOL:RTOL" | {atol, rtol}} table
    or a sequence of (name, atol, rtol)."""
    items = value.items() if isinstance(value, Mapping) else [(v[0], v[1:]) for v in value]
    found = []
    for name, pair in items:
        if isinstance(pair, str):
            pair = pair.split(":")
        if isinstance(pair, Mapping) and set(pair) <= {"atol", "rtol"}:
            pair = (pair.get("atol", 0.0), pair.get("rtol", 0.0))
        try:
            atol, rtol = (float(x) for x in pair)
        except (TypeError, ValueError):
            atol = rtol = -1.0
        if min(atol, rtol) < 0:
            raise InferccError(
                f"bad --tol for output {name!r}: {pair!r}",
                "write OUTPUT=ATOL:RTOL, e.g. --tol logits=1e-3:1e-2",
            )
        found.append((str(name), atol, rtol))
    return tuple(sorted(found))


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


def default_backend(target: str) -> str:
    return "ort" if is_cpu(target) else "tensorrt"


# --------------------------------------------------------------------------- from data

# key -> (type, how to read it); `None`: the value as is.
_Reader = Callable[[Any, Path | None], Any] | None


def _path(value: Any, base: Path | None) -> str:
    return str(Path(os.path.normpath(base / value))) if base is not None else str(value)


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


_TRT_KEYS: dict[str, tuple[tuple[type, ...], _Reader]] = {
    "workspace": ((int, str), None),
    "opt_level": ((int,), None),
    "hw_compat": ((str,), None),
    "version_compatible": ((bool,), None),
    "timing_cache_strict": ((bool,), None),
    "strict_target": ((bool,), None),
    "plugins": ((list, tuple), _paths),
    "calib_cache": ((str,), _path),
    "profiles": ((list, tuple), None),
    "shape_inputs": ((dict, list, tuple), None),
}
_ORT_KEYS: dict[str, tuple[tuple[type, ...], _Reader]] = {"optimized_model": ((bool,), None)}


def _trt_from(value: Any, base: Path | None) -> TrtOptions:
    return TrtOptions(**_read_keys(value, _TRT_KEYS, "tensorrt.", base))


def _ort_from(value: Any, base: Path | None) -> OrtOptions:
    return OrtOptions(**_read_keys(value, _ORT_KEYS, "ort.", base))


_NUMBER = (float,)  # an int is a float where one is due
_TOP_KEYS: dict[str, tuple[tuple[type, ...], _Reader]] = {
    "target": ((str,), None),
    "backend": ((str,), None),
    "precision": ((str,), None),
    "fp16_io": ((bool,), None),
    "keep_fp32": ((list, tuple), None),
    "ranges": ((dict, str, list, tuple), _ranges_from),
    "portable": ((bool,), None),
    "assume": ((list, tuple), None),
    "fold_limit": ((int, str), None),
    "freeze_initializers": ((bool,), None),
    "disable_passes": ((list, tuple), None),
    "shapes": ((dict, list, tuple), _shapes_from),
    "static_shapes": ((dict, list, tuple), _shapes_from),
    "verify": ((bool,), None),
    "external_data": ((bool,), None),
    "alignment": ((int,), None),
    "tune": ((bool,), None),
    "validate": ((bool,), None),
    "data": ((str,), _data_path),
    "input_ranges": ((dict, list, tuple), None),
    "atol": (_NUMBER, None),
    "rtol": (_NUMBER, None),
    "min_cosine": (_NUMBER, None),
    "tolerances": ((dict, list, tuple), None),
    "strict_coverage": ((bool,), None),
    "bisect": ((bool,), None),
    "ort": ((dict,), _ort_from),
    "tensorrt": ((dict,), _trt_from),
}
BUILD_KEYS = tuple(_TOP_KEYS)


def _of_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types) or (float in types and isinstance(value, int))


def _read_keys(
    data: Any, keys: Mapping[str, tuple[tuple[type, ...], _Reader]], prefix: str, base: Path | None
) -> dict[str, Any]:
    """Keyword arguments from a table: every key known and of its type, None meaning unset."""
    if not isinstance(data, Mapping):
        raise InferccError(f"build {prefix.rstrip('.') or 'config'} must be a table", "fix it")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in keys:
            raise InferccError(
                f"unknown build key {prefix}{key!r}", "known keys: " + ", ".join(sorted(keys))
            )
        if value is None:
            continue
        types, reader = keys[key]
        if not _of_type(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise InferccError(f"{prefix}{key} must be a {wanted}", f"fix {key} = ...")
        out[key] = reader(value, base) if reader is not None else value
    return out


# --------------------------------------------------------------------------- rules

Broken = tuple[str, str] | None  # (message naming the flag, hint)
Rule = Callable[[BuildConfig], Broken]

_TRT_FLAGS = {
    "workspace": "--workspace",
    "opt_level": "--opt-level",
    "hw_compat": "--hw-compat",
    "version_compatible": "--version-compatible",
    "timing_cache_strict": "--timing-cache-strict",
    "strict_target": "--strict-target",
    "plugins": "--plugin",
    "calib_cache": "--calib-cache",
    "profiles": "--profile",
    "shape_inputs": "--shape-input",
}


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


def _fp16_needs_convert_pass(c: BuildConfig) -> Broken:
    """--fp16 with convert-fp16 disabled would build an fp32 model labelled fp16."""
    if FP16_PASS in c.disable_passes and c.precision == "fp16":
        return (
            f"--fp16 has no effect with --disable-pass {FP16_PASS}",
            "drop one of them",
        )
    if FP16_PASS in c.disable_passes:
        return (f"--disable-pass {FP16_PASS} has no effect without --fp16", "drop it")
    return None


def _bf16_needs_tensorrt(c: BuildConfig) -> Broken:
    """bf16 is a TensorRT builder choice: no graph rewrite makes a bfloat16 model."""
    if c.precision == "bf16" and c.backend != "tensorrt":
        return (
            f"--bf16 needs --backend tensorrt (this build has {_backend_words(c)})",
            "use --fp16 (a graph rewrite every backend runs)",
        )
    return None


def _bf16_needs_a_target_with_bf16(c: BuildConfig) -> Broken:
    if c.precision != "bf16" or is_cpu(c.target):
        return None
    from infercc.analysis.targets import get_target

    target = get_target(c.target)
    if "bf16" not in target.precisions:
        return (
            f"--bf16 has no effect on the {target.name} target: it has no bfloat16",
            f"{target.name} has: {', '.join(target.precisions)}",
        )
    return None


def _tensorrt_options_need_tensorrt(c: BuildConfig) -> Broken:
    """Every TensorRT builder option changes only a TensorRT engine."""
    if c.backend == "tensorrt":
        return None
    default = TrtOptions()
    for name, flag in _TRT_FLAGS.items():
        if getattr(c.tensorrt, name) != getattr(default, name):
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
    if c.ort.optimized_model and c.backend != "ort":
        return (
            f"--ort-optimized-model has no effect: this build has {_backend_words(c)}",
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
    return None


def _validation_options_need_validation(c: BuildConfig) -> Broken:
    """Tolerances, samples, coverage and the bisection of a failure are only read by
    validation."""
    given = {
        "--atol": c.atol,
        "--rtol": c.rtol,
        "--min-cosine": c.min_cosine,
        "--tol": c.tolerances or None,
        "--data": c.data,
        "--input-range": c.input_ranges or None,
        "--strict-coverage": c.strict_coverage or None,
        "--bisect": c.bisect or None,
    }
    for flag, value in given.items():
        if value is not None and not c.validate:
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
    if c.fold_limit is not None and FOLD_PASS in c.disable_passes:
        return (
            f"--fold-limit has no effect with --disable-pass {FOLD_PASS}",
            "drop one of them",
        )
    return None


def _portable_needs_fused_ops_to_avoid(c: BuildConfig) -> Broken:
    """--portable keeps onnxruntime's contrib ops out; only fuse-conv-activation (FusedConv)
    and emit-attention (Attention) make one, and only for onnxruntime on the cpu target
    (PassContext.fused_ops_allowed)."""
    if not c.portable:
        return None
    if not is_cpu(c.target) or c.backend == "tensorrt":
        where = f"the {c.target} target" if not is_cpu(c.target) else "backend tensorrt"
        return (
            f"--portable has no effect with {where}: only onnxruntime on the cpu target gets "
            "contrib ops",
            "drop --portable",
        )
    return None


def assumption_passes(name: str) -> tuple[str, ...]:
    """The passes whose rewrites assumption `name` can enable: those that declare it at
    registration (`register_pass(..., assumptions=...)`)."""
    import infercc.passes  # noqa: F401  (registers the passes)
    from infercc.passes.manager import REGISTRY

    return tuple(p for p, info in REGISTRY.items() if name in info.assumptions)


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

    runs = {name for stage in optimize_stages(c.precision) for name in stage} | {FP16_PASS}
    for name in c.disable_passes:
        if name in REGISTRY and name not in runs:
            return (
                f"--disable-pass {name} has no effect: optimize does not run it",
                "optimize runs: " + ", ".join(sorted(runs - {FP16_PASS})),
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
    _bf16_needs_tensorrt,
    _bf16_needs_a_target_with_bf16,
    _tensorrt_needs_a_gpu_target,
    _tensorrt_options_need_tensorrt,
    _calib_cache_needs_int8,
    _ort_options_need_ort,
    _no_tune_needs_a_tuning_backend,
    _validation_options_need_validation,
    _input_ranges_need_generated_inputs,
    _fold_limit_needs_folding,
    _portable_needs_fused_ops_to_avoid,
    _shapes_agree_with_static_shapes,
    _assumptions_need_their_passes,
)
