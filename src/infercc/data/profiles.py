"""Parse `--shape` options: fixed shapes (`NAME=1x3x224x224`) and ranges (`NAME=min:opt:max`).

A spec is split on its *last* `=`, so input names holding `/` or `:` (common in exported
models) work; the part after it is `x`-separated non-negative integers, or nothing for a
scalar (`NAME=` means shape `()`). A range `NAME=1x128:8x128:32x512` gives the smallest, the
typical (optimized-for) and the largest shape; min <= opt <= max must hold per dimension.
Where one concrete shape is needed (validation, the memory plan), a range stands for its opt.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infercc.errors import InferccError

logger = logging.getLogger(__name__)

_EXPECTED_FORM = (
    "expected NAME=D0xD1x..., e.g. input=1x3x224x224, a range NAME=MIN:OPT:MAX, e.g. "
    "ids=1x128:8x128:32x512, or NAME= for a scalar"
)


@dataclass(frozen=True)
class ShapeProfile:
    """One input's shapes: min <= opt <= max per dimension (all equal for a fixed shape)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The distinct declared shapes, in min, opt, max order (each is tuned)."""
        return list(dict.fromkeys([self.min, self.opt, self.max]))

    @property
    def is_fixed(self) -> bool:
        return self.min == self.opt == self.max

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "min": list(self.min),
            "opt": list(self.opt),
            "max": list(self.max),
        }


def parse_profile(spec: str) -> ShapeProfile:
    """Parse one `NAME=1x3x224x224` or `NAME=MIN:OPT:MAX` spec; trtexec's and onnxsim's
    spellings (`NAME:1x3x224x224`, `NAME:1,3,224,224`, `NAME=1,3,224,224`) are answered with
    infercc's (`did_you_mean`)."""
    suggestion = did_you_mean(spec)
    if suggestion is not None:
        raise InferccError(
            f"bad --shape {spec!r}: did you mean {suggestion}?",
            "infercc's form is NAME=D0xD1x... (trtexec writes NAME:D0xD1x..., onnxsim "
            "NAME:D0,D1,...)",
        )
    name, sep, dims_text = spec.rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise InferccError(f"bad --shape {spec!r}: no input name before '='", _EXPECTED_FORM)
    parts = [_parse_dims(part, spec) for part in dims_text.split(":")]
    if len(parts) == 1:
        return ShapeProfile(name, parts[0], parts[0], parts[0])
    if len(parts) != 3:
        raise InferccError(
            f"bad --shape {spec!r}: a range has three shapes (min:opt:max), not {len(parts)}",
            _EXPECTED_FORM,
        )
    lo, opt, hi = parts
    if not len(lo) == len(opt) == len(hi):
        raise InferccError(
            f"bad --shape {spec!r}: min, opt and max have different ranks", _EXPECTED_FORM
        )
    bad = [i for i in range(len(lo)) if not lo[i] <= opt[i] <= hi[i]]
    if bad:
        i = bad[0]
        raise InferccError(
            f"bad --shape {spec!r}: min <= opt <= max does not hold for dimension {i} "
            f"({lo[i]}, {opt[i]}, {hi[i]})",
            "give the smallest shape first and the largest last",
        )
    return ShapeProfile(name, lo, opt, hi)


_X_DIMS = re.compile(r"\d+(?:x\d+)*")
_COMMA_DIMS = re.compile(r"\d+(?:,\d+)+")


def did_you_mean(spec: str) -> str | None:
    """infercc's spelling of a shape written as trtexec (`x:1x3x48x192`, a list
    `x:1x3,y:1x4`) or onnxsim (`x:1,3,48,192`) write it, or with commas for `x` after `=`
    (`x=1,3,48,192`); None for any other spec (infercc's own, or one nobody writes)."""
    text = spec.strip()
    if "=" in text:
        name, _, dims = text.rpartition("=")
        if name.strip() and _COMMA_DIMS.fullmatch(dims.strip()):
            return f"{name.strip()}={dims.strip().replace(',', 'x')}"
        return None
    specs = [part.strip().rpartition(":") for part in text.split(",")]
    if len(specs) > 1 and all(n.strip() and _X_DIMS.fullmatch(d) for n, _, d in specs):
        return " ".join(f"--shape {n.strip()}={d}" for n, _, d in specs)  # trtexec's list
    name, _, dims = text.rpartition(":")
    if name.strip() and (_X_DIMS.fullmatch(dims) or _COMMA_DIMS.fullmatch(dims)):
        return f"{name.strip()}={dims.replace(',', 'x')}"
    return None


def parse_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """Parse one spec into `(name, dims)`; a range gives its opt shape."""
    profile = parse_profile(spec)
    return profile.name, profile.opt


def _parse_dims(dims_text: str, spec: str) -> tuple[int, ...]:
    dims_text = dims_text.strip()
    if not dims_text:
        return ()
    return tuple(_parse_dim(part, spec) for part in dims_text.lower().split("x"))


def _parse_dim(text: str, spec: str) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise InferccError(
            f"bad --shape {spec!r}: dimension {text!r} is not a non-negative integer",
            _EXPECTED_FORM,
        )
    return int(text)


def parse_profiles(specs: list[str] | None) -> list[ShapeProfile]:
    """Parse repeated `--shape` options; an input named twice is an error."""
    profiles: dict[str, ShapeProfile] = {}
    for spec in specs or []:
        profile = parse_profile(spec)
        if profile.name in profiles:
            raise InferccError(
                f"--shape given twice for input {profile.name!r}",
                "pass one --shape per input",
            )
        profiles[profile.name] = profile
    if profiles:
        logger.debug("input shape profiles: %s", profiles)
    return list(profiles.values())


def parse_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--shape` options into one concrete shape per input (a range: its opt)."""
    return {p.name: p.opt for p in parse_profiles(specs)}


def as_shapes(
    shapes: Mapping[str, str | int | Sequence[int]] | None,
) -> dict[str, tuple[int, ...]] | None:
    """The Python API's `shapes`: each value a tuple or list of ints, one int (a rank-1
    shape), or a `--shape` string (`"1x3x32x32"`, a range `"1x128:8x128:32x512"` giving its
    opt, or `""` for a scalar)."""
    if shapes is None:
        return None
    if not isinstance(shapes, Mapping):
        raise InferccError(
            f"shapes must map input names to shapes, got {type(shapes).__name__}",
            'pass e.g. shapes={"image": (1, 3, 224, 224)} or {"image": "1x3x224x224"}',
        )
    return {name: _as_dims(name, dims) for name, dims in shapes.items()}


def _as_dims(name: str, dims: str | int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(dims, str):
        return parse_shape(f"{name}={dims}")[1]
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = (dims,)
    try:
        out = tuple(operator.index(d) for d in dims)  # type: ignore[union-attr]
    except TypeError:
        out = ()
        bad = True
    else:
        bad = any(d < 0 for d in out)
    if bad:
        raise InferccError(
            f"shape of input {name!r} is {dims!r}, not non-negative integers",
            'pass a tuple such as (1, 3, 224, 224) or a string such as "1x3x224x224"',
        )
    return out
