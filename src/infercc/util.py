"""Small helpers shared across infercc's modules."""

from __future__ import annotations

import ctypes
import gc
import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from infercc.errors import InferccError


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


_TRIM: list[Any] = []  # glibc's malloc_trim once looked up ([None] where there is none)


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system (glibc's malloc_trim;
    a no-op elsewhere): called between the steps that hold a model's weights (IR, onnxruntime
    sessions), so that the next step's peak does not sit on the last one's freed but still
    resident heap (on a 0.62 GB float16 decoder, 0.3 to 0.5 GB after each step)."""
    gc.collect()
    if not _TRIM:
        try:
            _TRIM.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    if _TRIM[0] is not None:
        _TRIM[0](0)


def json_float(value: float | None) -> float | None:
    """A float for JSON: a number or null. NaN and infinities (a metric of no data, or of
    non-finite outputs) are null, never a string a reader would have to special-case; the
    report's reason or message says what happened."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def json_safe(data: Any) -> Any:
    """`data` with every non-finite float (numpy's too) replaced by None, recursively through
    dicts, lists and tuples: what `json.dumps(..., allow_nan=False)` accepts."""
    if isinstance(data, bool | int | str) or data is None:
        return data
    if isinstance(data, float | np.floating):
        return json_float(float(data))
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(v) for v in data]
    return data


def json_text(data: Any, **kwargs: Any) -> str:
    """`json.dumps` of `json_safe(data)`: numbers or null, never NaN or Infinity tokens."""
    return json.dumps(json_safe(data), allow_nan=False, **kwargs)


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message for a one-line error: its first line (cut at `limit`), or the
    exception's type name when it has no message."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    return line if limit is None else line[:limit]


def read_schema_json(path: Path, schema: str, missing: tuple[str, str], rebuild: str) -> dict:
    """A JSON object tagged `"schema": schema`, or one clear InferccError.

    `missing` is the (message, hint) for a file that does not exist; `rebuild` is the hint for
    one that cannot be read or is of another schema.
    """
    try:
        data: Any = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InferccError(*missing) from None
    except (OSError, ValueError) as exc:
        raise InferccError(f"cannot read {path}: {first_line(exc)}", rebuild) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise InferccError(f"{path} is not of schema {schema}", rebuild)
    return data


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | int, flag: str = "--workspace") -> int:
    """'4GiB' -> 4294967296, '512MB' -> 512000000, '1048576' -> 1048576; `flag` names the
    option in errors."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.fullmatch(str(text))
        unit = match[2].lower() if match else ""
        if match is None or unit not in _UNITS:
            raise InferccError(
                f"{flag} {text!r} is not a size",
                "give bytes or a size with a unit, e.g. 512MiB, 4GiB, 2GB",
            )
        value = int(float(match[1]) * _UNITS[unit])
    if value <= 0:
        raise InferccError(f"{flag} {text!r} must be positive", f"e.g. {flag} 4GiB")
    return value


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|min|h)?\s*")
_SECONDS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str | float, flag: str = "--duration") -> float:
    """'10s' -> 10.0, '500ms' -> 0.5, '2m' -> 120.0, '3' -> 3.0 (seconds); positive only."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _DURATION.fullmatch(str(text).lower())
        if match is None:
            raise InferccError(
                f"{flag} {text!r} is not a duration", f"e.g. {flag} 10s, 500ms or 2m"
            )
        value = float(match[1]) * _SECONDS[match[2]]
    if not value > 0:
        raise InferccError(f"{flag} {text!r} must be positive", f"e.g. {flag} 10s")
    return value


def format_below(value: float, limit: float, digits: int = 6) -> str:
    """`value` with enough decimals to show it below `limit` (0.99999998 against 0.99999999,
    not a rounded 1.000000); NaN prints as nan."""
    if value != value:
        return "nan"
    for places in range(digits, 18):
        text = f"{value:.{places}f}"
        if float(text) < limit:
            return text
    return repr(float(value))


def num(x: Any, fmt: str = ".3g") -> str:
    """A figure for a table or a line: `-` for a missing one (None), `nan`, `inf` or `-inf`
    for a non-finite one (whatever `fmt` says: a percentage of NaN is no percentage), else
    `format(x, fmt)`. A string (an older report's "inf") prints as it is: no renderer fails
    on a value it did not expect."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    try:
        value = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(x, fmt)


CACHE_DIR_ENV = "INFERCC_CACHE_DIR"


def cache_root() -> Path:
    """Where infercc keeps what it learns about a host (tuning cache, host facts):
    `$INFERCC_CACHE_DIR`, else `$XDG_CACHE_HOME/infercc`, else the platform's user cache
    directory (platformdirs: ~/.cache/infercc on Linux, ~/Library/Caches/infercc on macOS,
    %LOCALAPPDATA%\\infercc\\Cache on Windows)."""
    import os

    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "infercc"
    import platformdirs

    return platformdirs.user_cache_path("infercc", appauthor=False)
