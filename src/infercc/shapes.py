"""Parse `--shape NAME=1x3x224x224` options into concrete input shapes.

A spec is split on its *last* `=`, so input names holding `/` or `:` (common in exported
models) work; the part after it is `x`-separated non-negative integers, or nothing for a
scalar (`NAME=` means shape `()`).
"""

from __future__ import annotations

import logging

from infercc.errors import InferccError

logger = logging.getLogger(__name__)

_EXPECTED_FORM = "expected NAME=D0xD1x..., e.g. input=1x3x224x224, or NAME= for a scalar"


def parse_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """Parse one `NAME=1x3x224x224` spec into `(name, dims)`."""
    name, sep, dims_text = spec.rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise InferccError(f"bad --shape {spec!r}: no input name before '='", _EXPECTED_FORM)
    dims_text = dims_text.strip()
    if not dims_text:
        return name, ()
    return name, tuple(_parse_dim(part, spec) for part in dims_text.lower().split("x"))


def _parse_dim(text: str, spec: str) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise InferccError(
            f"bad --shape {spec!r}: dimension {text!r} is not a non-negative integer",
            _EXPECTED_FORM,
        )
    return int(text)


def parse_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--shape` options; an input named twice is an error."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, dims = parse_shape(spec)
        if name in shapes:
            raise InferccError(
                f"--shape given twice for input {name!r}",
                "pass one --shape per input",
            )
        shapes[name] = dims
    if shapes:
        logger.debug("pinned input shapes: %s", shapes)
    return shapes
