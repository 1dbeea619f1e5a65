from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infercc.data.profiles import parse_shape, parse_shapes
from infercc.errors import InferccError


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("input=1x3x224x224", ("input", (1, 3, 224, 224))),
        ("encoder/input_ids:0=2x128", ("encoder/input_ids:0", (2, 128))),
        ("x=7", ("x", (7,))),
        ("x=", ("x", ())),
        ("x=0x4", ("x", (0, 4))),
        ("x=1X3", ("x", (1, 3))),
        (" x = 1 x 3 ", ("x", (1, 3))),
        ("a=b=2x2", ("a=b", (2, 2))),
    ],
)
def test_parse_shape(spec: str, expected: tuple[str, tuple[int, ...]]) -> None:
    assert parse_shape(spec) == expected


@pytest.mark.parametrize("spec", ["x", "=1x3", "x=1xx3", "x=-1x3", "x=1x3.5", "x=abc", "x=1x²"])
def test_parse_shape_rejects_bad_spec(spec: str) -> None:
    with pytest.raises(InferccError, match="bad --shape") as info:
        parse_shape(spec)
    assert repr(spec) in info.value.message
    assert "NAME=D0xD1" in (info.value.hint or "")


def test_parse_shapes_collects_by_name() -> None:
    assert parse_shapes(["a=1x2", "b="]) == {"a": (1, 2), "b": ()}
    assert parse_shapes(None) == {}
    assert parse_shapes([]) == {}


def test_parse_shapes_rejects_duplicate() -> None:
    with pytest.raises(InferccError, match="given twice for input 'a'"):
        parse_shapes(["a=1x2", "b=3", "a=1x2"])


_names = st.text(alphabet="abcXYZ019_/:.-", min_size=1, max_size=12)


@given(_names, st.lists(st.integers(0, 10_000), max_size=6))
def test_parse_shape_round_trip(name: str, dims: list[int]) -> None:
    assert parse_shape(f"{name}={'x'.join(map(str, dims))}") == (name, tuple(dims))


def test_range_profile():
    from infercc.data.profiles import parse_profile, parse_profiles

    p = parse_profile("input_ids=1x128:8x128:32x512")
    assert (p.name, p.min, p.opt, p.max) == ("input_ids", (1, 128), (8, 128), (32, 512))
    assert p.shapes == [(1, 128), (8, 128), (32, 512)] and not p.is_fixed
    fixed = parse_profile("x=1x3")
    assert fixed.is_fixed and fixed.shapes == [(1, 3)]
    assert parse_shapes(["ids=1x128:8x128:32x512"]) == {"ids": (8, 128)}
    assert [q.name for q in parse_profiles(["a=1:2:3", "b=4"])] == ["a", "b"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ids=8x128:1x128:32x512", "min <= opt <= max does not hold for dimension 0 (8, 1, 32)"),
        ("ids=1x128:8x128", "a range has three shapes"),
        ("ids=1x128:8:32x512", "different ranks"),
        ("ids=1x128:8x12a:32x512", "'12a' is not a non-negative integer"),
    ],
)
def test_bad_range_profiles(spec, message):
    from infercc.data.profiles import parse_profile

    with pytest.raises(InferccError) as e:
        parse_profile(spec)
    assert message in e.value.message
