"""Small helpers shared across infercc's modules."""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block (restored after): while building the IR
    (many linked objects, no garbage) and while timing runs (a collection would land on a
    random run)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def json_float(value: float | None) -> float | str | None:
    """A float for JSON: NaN and infinities as the strings "nan", "inf" and "-inf"."""
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value
