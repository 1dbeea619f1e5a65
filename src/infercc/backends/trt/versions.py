"""Which TensorRT major versions each part of this package runs on, declared where it matters.

infercc builds with TensorRT 10 and 11 (`SUPPORTED_MAJORS`). Everything in
`infercc.backends.trt` runs on both, except what is marked with one of two marks:

- `@tensorrt_majors(10)` on a function: it runs only on TensorRT 10 (its callers reach it only
  when `precision.decide` says so, e.g. the INT8 calibrator). The function takes the tensorrt
  module as its `trt` argument, and a call with a module of another major raises, so the mark
  cannot go stale without a test noticing.
- `tensorrt_names(table, 10)` around a table of TensorRT names that the code looks up by
  string (`getattr(trt.BuilderFlag, name)`): the names are used on those majors only;
  `since="10.9"` says the names exist from that release on, and that the code looking them up
  says so where they are missing (`build._enum`). It returns the table itself.

tests/backends/test_trt_api_surface.py reads both marks from the source (it walks the syntax
tree of every module here and collects each attribute read on the `trt` module and on objects
derived from it), and checks each name against the name list of every recorded TensorRT
version of the majors it is used on (tests/data/tensorrt_api/, made by
bench/trt_api_surface.py).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

from infercc.errors import InferccError

SUPPORTED_MAJORS = (10, 11)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def major_version(version: str) -> int:
    match = re.match(r"\s*(\d+)", version)
    if match is None:
        raise InferccError(f"cannot read TensorRT version {version!r}", "reinstall tensorrt")
    return int(match[1])


def tensorrt_majors(*majors: int) -> Callable[[F], F]:
    """Mark a function that runs only on these TensorRT majors (see the module doc)."""

    def mark(fn: F) -> F:
        signature = inspect.signature(fn)
        if "trt" not in signature.parameters:
            raise TypeError(f"{fn.__qualname__} is marked @tensorrt_majors but takes no trt")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            trt = signature.bind(*args, **kwargs).arguments["trt"]
            version = str(getattr(trt, "__version__", ""))
            if major_version(version) not in majors:
                raise InferccError(
                    f"internal error: {fn.__qualname__} is for TensorRT "
                    f"{'/'.join(map(str, majors))} only, and was called with TensorRT {version}",
                    "please report this with the command that hit it",
                )
            return fn(*args, **kwargs)

        checked.tensorrt_majors = majors  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return mark


def tensorrt_names(table: T, *majors: int, since: str | None = None) -> T:
    """Declare `table` (a name, names, or a mapping to names) as used on these majors only
    (all supported ones when none is given), and present from release `since` on."""
    return table
