"""TensorRT optimization profiles: from `--shape` ranges to `IOptimizationProfile`s, and back.

An engine with dynamic dimensions needs, per profile, a (min, opt, max) shape for every input;
TensorRT picks tactics for `opt` and accepts any shape in [min, max] per dimension.

Where profiles come from:

- The first profile is the `--shape` options (`NAME=1x3x224x224` fixed, `NAME=MIN:OPT:MAX` a
  range). Inputs not named take `infercc.data.signature.resolve_shapes` defaults at each of min, opt
  and max, sharing symbols with the pinned ones (as the ort backend does): so `--shape
  ids=1x128:8x128:32x128` also sizes an `attention_mask[batch, seq]` input.
- Each `--trt-profile` option adds one more profile: a comma-separated list of specs in the
  same form, `--trt-profile "ids=1x16:1x64:1x128,mask=1x16:1x64:1x128"`.
- Shape-tensor inputs (inputs whose *values* are shapes, e.g. the target shape of a Reshape)
  take values, not shapes: `--shape-input NAME=MIN:OPT:MAX` gives the tensor's values at each
  end, `x`-separated (`--shape-input new_shape=1x64:8x64:32x64`); they go through
  `IOptimizationProfile.set_shape_input`. Which inputs are shape tensors the parsed network
  says (`ITensor.is_shape_tensor`).

Checks: min <= opt <= max per dimension and equal ranks in every profile (a clear error names
the input, the profile and the dimension); every dynamic network input has a range.

At run time `select_profile` picks the first profile whose ranges hold the feeds' shapes,
preferring one whose opt equals them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from infercc.data.profiles import ShapeProfile, parse_profiles
from infercc.data.signature import resolve_shapes
from infercc.errors import InferccError

Shape = tuple[int, ...]
Range = tuple[Shape, Shape, Shape]
# One TensorRT profile: input name -> (min, opt, max).
Profile = dict[str, Range]


def check_range(name: str, lo: Sequence[int], opt: Sequence[int], hi: Sequence[int], where: str):
    """InferccError unless ranks are equal and lo <= opt <= hi per dimension."""
    if not len(lo) == len(opt) == len(hi):
        raise InferccError(
            f"{where}: input {name!r} has min, opt and max of different ranks "
            f"({len(lo)}, {len(opt)}, {len(hi)})",
            "give each input's three shapes with the same number of dimensions",
        )
    for i, (a, b, c) in enumerate(zip(lo, opt, hi, strict=True)):
        if not a <= b <= c:
            raise InferccError(
                f"{where}: input {name!r} breaks min <= opt <= max at dimension {i} "
                f"({a}, {b}, {c})",
                "give the smallest shape first and the largest last, e.g. ids=1x16:8x64:32x128",
            )


def check_profiles(profiles: Sequence[ShapeProfile], where: str = "--shape") -> None:
    for p in profiles:
        check_range(p.name, p.min, p.opt, p.max, where)


def parse_profile_set(spec: str) -> list[ShapeProfile]:
    """One `--trt-profile` value: comma-separated `NAME=MIN:OPT:MAX` (or fixed) specs."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise InferccError(
            f"--trt-profile {spec!r} names no input",
            'give NAME=MIN:OPT:MAX specs separated by commas, e.g. "ids=1x16:1x64:1x128"',
        )
    return parse_profiles(parts)


def as_profiles(value: Any, where: str) -> list[ShapeProfile]:
    """A profile set given as a spec string, a list of specs, or ShapeProfile objects."""
    if isinstance(value, str):
        return parse_profile_set(value)
    found = [parse_profiles([v])[0] if isinstance(v, str) else v for v in value]
    if not all(isinstance(p, ShapeProfile) for p in found):
        raise InferccError(f"{where}: not a list of shape profiles", "pass NAME=MIN:OPT:MAX specs")
    return found


def resolve_profile(
    proto: onnx.ModelProto, profiles: Sequence[ShapeProfile], where: str
) -> Profile:
    """(min, opt, max) for every real input: the profiles given, defaults for the rest."""
    check_profiles(profiles, where)
    ends = [
        resolve_shapes(proto, {p.name: getattr(p, end) for p in profiles})
        for end in ("min", "opt", "max")
    ]
    resolved = {name: (ends[0][name], ends[1][name], ends[2][name]) for name in ends[1]}
    for name, (lo, opt, hi) in resolved.items():
        check_range(name, lo, opt, hi, where)
    return resolved


def resolve_all(
    proto: onnx.ModelProto,
    first: Sequence[ShapeProfile],
    more: Sequence[Sequence[ShapeProfile]] = (),
) -> list[Profile]:
    """The `--shape` profile, then each `--trt-profile`, resolved; duplicates dropped."""
    found = [resolve_profile(proto, first, "--shape")]
    for index, extra in enumerate(more, start=1):
        profile = resolve_profile(proto, extra, f"--trt-profile {index}")
        if profile not in found:
            found.append(profile)
    return found


def shape_input_values(specs: Mapping[str, Any] | Sequence[Any] | None) -> dict[str, Range]:
    """`--shape-input` values by input name: NAME=MIN:OPT:MAX of the tensor's values."""
    if not specs:
        return {}
    items = specs.values() if isinstance(specs, Mapping) else specs
    profiles = [parse_profiles([v])[0] if isinstance(v, str) else v for v in items]
    check_profiles(profiles, "--shape-input")
    return {p.name: (p.min, p.opt, p.max) for p in profiles}


def to_jsonable(profiles: Sequence[Profile]) -> list[dict[str, dict[str, list[int]]]]:
    return [
        {
            name: {"min": list(r[0]), "opt": list(r[1]), "max": list(r[2])}
            for name, r in sorted(profile.items())
        }
        for profile in profiles
    ]


def from_jsonable(data: Sequence[Mapping[str, Mapping[str, Sequence[int]]]]) -> list[Profile]:
    return [
        {name: (tuple(r["min"]), tuple(r["opt"]), tuple(r["max"])) for name, r in profile.items()}
        for profile in data
    ]


# --------------------------------------------------------------------------- TensorRT side


def network_inputs(network: Any) -> list[Any]:
    return [network.get_input(i) for i in range(network.num_inputs)]


def add_profiles(
    builder: Any,
    config: Any,
    network: Any,
    profiles: Sequence[Profile],
    shape_values: Mapping[str, Range],
) -> list[Any]:
    """Add one IOptimizationProfile per profile to `config`; returns them in order."""
    added = []
    for index, profile in enumerate(profiles):
        trt_profile = builder.create_optimization_profile()
        for tensor in network_inputs(network):
            _set_input(trt_profile, tensor, profile, shape_values, index)
        if config.add_optimization_profile(trt_profile) < 0:
            raise InferccError(
                f"TensorRT rejected optimization profile {index}",
                "check the --shape ranges against the model's fixed dimensions",
            )
        added.append(trt_profile)
    return added


def _set_input(
    trt_profile: Any,
    tensor: Any,
    profile: Profile,
    shape_values: Mapping[str, Range],
    index: int,
) -> None:
    name = tensor.name
    if getattr(tensor, "is_shape_tensor", False):
        if name not in shape_values:
            raise InferccError(
                f"input {name!r} is a shape tensor: TensorRT needs the range of its values",
                f"give them with --shape-input {name}=MIN:OPT:MAX (values, x-separated)",
            )
        trt_profile.set_shape_input(name, *shape_values[name])
        return
    if name not in profile:
        raise InferccError(
            f"profile {index} gives no shape for network input {name!r}",
            f"pin it with --shape {name}=MIN:OPT:MAX",
        )
    _check_fixed_dims(name, tuple(tensor.shape), profile[name])
    trt_profile.set_shape(name, *profile[name])


def _check_fixed_dims(name: str, declared: Shape, shapes: Range) -> None:
    for end, dims in zip(("min", "opt", "max"), shapes, strict=True):
        if len(dims) != len(declared):
            raise InferccError(
                f"input {name!r} has rank {len(declared)}, its {end} shape {list(dims)} has "
                f"rank {len(dims)}",
                "give one size per dimension",
            )
        for i, (d, given) in enumerate(zip(declared, dims, strict=True)):
            if d >= 0 and d != given:
                raise InferccError(
                    f"input {name!r} has fixed dimension {i} = {d}, its {end} shape says {given}",
                    "ranges may only vary the model's dynamic dimensions",
                )


# --------------------------------------------------------------------------- run time


def fits(shape: Sequence[int], r: Range) -> bool:
    lo, _, hi = r
    return len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True))


def select_profile(profiles: Sequence[Profile], shapes: Mapping[str, Sequence[int]]) -> int:
    """The profile whose opt equals `shapes`, else the first whose ranges hold them."""

    def holds(p: Profile) -> bool:
        return all(name not in p or fits(tuple(s), p[name]) for name, s in shapes.items())

    for index, p in enumerate(profiles):
        if holds(p) and all(name not in p or tuple(s) == p[name][1] for name, s in shapes.items()):
            return index
    for index, p in enumerate(profiles):
        if holds(p):
            return index
    given = ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in shapes.items())
    ranges = "; ".join(", ".join(f"{n}={_fmt(r)}" for n, r in sorted(p.items())) for p in profiles)
    raise InferccError(
        f"input shapes {given} are outside every optimization profile of this engine ({ranges})",
        "rebuild with a --shape range (or another --trt-profile) that covers them",
    )


def _fmt(r: Range) -> str:
    return ":".join("x".join(map(str, dims)) for dims in r)
