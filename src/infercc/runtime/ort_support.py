"""What the installed onnxruntime reads: the highest model IR version it loads, and the
custom-op libraries a run registers in every session (`custom_op_libraries`, `session_options`;
a model whose custom op no library implements is refused naming the op: `custom_op_refusal`).

onnxruntime publishes no such constant; each release refuses models stamped with a newer IR
("Unsupported model IR version: 14, max supported IR version: 11" on 1.23). Python 3.10 users
cannot have onnxruntime newer than 1.23, while onnx 1.23 writes IR 14 by default. `optimize`
(when it validates) and `calibrate` run the model under onnxruntime, so they refuse such a
model before any work, naming both versions; without validation `optimize` writes it with a
warning. infercc never raises a model's IR version (only IR < 4 is written as IR 4, which every
onnxruntime reads).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import onnx
import onnxruntime as ort

from infercc.errors import InferccError
from infercc.util import first_line

logger = logging.getLogger(__name__)

_PROBE_OPSET = 13  # read by every onnxruntime infercc supports


@functools.cache
def max_ir_version() -> int:
    """The highest IR version both the installed onnx writes and onnxruntime loads."""
    for ir_version in range(onnx.IR_VERSION, 3, -1):
        if _loads(ir_version):
            return ir_version
    return 3  # every IR since 3 was refused: nothing newer is safe to write


def _loads(ir_version: int) -> bool:
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    graph = onnx.helper.make_graph(
        [node],
        "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", _PROBE_OPSET)], ir_version=ir_version
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own non-standard exception types
        logger.debug("onnxruntime %s refuses IR %d: %s", ort.__version__, ir_version, exc)
        return False
    return True


def check_ir_version(ir_version: int, what: str = "the model") -> None:
    """Refuse a model this onnxruntime cannot load, naming both versions and the way out."""
    limit = max_ir_version()
    if ir_version > limit:
        raise InferccError(_too_new(ir_version, what, limit), _hint(limit))


def warn_ir_version(ir_version: int, what: str = "the model") -> bool:
    """Log that this onnxruntime cannot load the model (where nothing here needs to run it);
    True when it cannot."""
    limit = max_ir_version()
    if ir_version <= limit:
        return False
    logger.warning("%s; %s", _too_new(ir_version, what, limit), _hint(limit))
    return True


def refused_ir_version(exc: BaseException) -> int | None:
    """The IR version in onnxruntime's "Unsupported model IR version" refusal, else None."""
    match = re.search(r"Unsupported model IR version: (\d+)", str(exc))
    return int(match.group(1)) if match else None


def _too_new(ir_version: int, what: str, limit: int) -> str:
    return (
        f"{what} has IR version {ir_version}, but onnxruntime {ort.__version__} reads IR <= {limit}"
    )


def _hint(limit: int) -> str:
    upgrade = (
        "use Python 3.11 or newer for a newer onnxruntime (1.23 is the last for Python 3.10)"
        if sys.version_info < (3, 11)
        else "upgrade onnxruntime (pip install -U onnxruntime)"
    )
    return f"{upgrade}, or save the model at IR {limit} if it uses nothing newer"


# --------------------------------------------------------------------------- custom ops

# The custom-op libraries this run registers in every session it makes on the user's model
# (`custom_op_libraries`); a plain global, not a context variable, so worker threads see it.
_custom_op_libs: tuple[str, ...] = ()

CUSTOM_OP_FLAG = "--ort-custom-op-lib"
_STANDARD = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
_UNREGISTERED = re.compile(
    r"(?P<domain>[A-Za-z0-9_.\-]+):(?P<op>[A-Za-z0-9_.\-]+)\(-?\d+\) is not a registered "
    r"function/op"
)


def session_options() -> ort.SessionOptions:
    """New onnxruntime SessionOptions with this run's custom-op libraries registered: every
    session infercc makes on the user's model starts from these."""
    return register_custom_ops(ort.SessionOptions())


def register_custom_ops(options: Any) -> Any:
    """`options` (onnxruntime SessionOptions) with this run's custom-op libraries registered."""
    for lib in _custom_op_libs:
        options.register_custom_ops_library(lib)
    return options


@contextmanager
def custom_op_libraries(libs: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[str, ...]]:
    """Register `libs` (onnxruntime's `SessionOptions.register_custom_ops_library`) in every
    session made inside the block, each checked first: InferccError, one line naming the
    library, for one that is missing or that onnxruntime cannot load."""
    global _custom_op_libs
    checked = tuple(check_custom_op_library(lib) for lib in libs)
    saved = _custom_op_libs
    _custom_op_libs = tuple(dict.fromkeys((*saved, *checked)))
    try:
        yield _custom_op_libs
    finally:
        _custom_op_libs = saved


def check_custom_op_library(lib: str | os.PathLike[str]) -> str:
    path = os.fspath(lib)
    if not os.path.isfile(path):
        raise InferccError(
            f"{CUSTOM_OP_FLAG} {path}: no such file",
            "give the path of the shared library that implements the model's custom ops",
        )
    try:
        ort.SessionOptions().register_custom_ops_library(path)
    except Exception as exc:  # onnxruntime raises its own non-standard exception types
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InferccError(
            f"{CUSTOM_OP_FLAG} {path}: onnxruntime {ort.__version__} cannot load it "
            f"({detail.split(' with error: ')[-1]})",
            "give a custom-op library built for this onnxruntime",
        ) from None
    return path


def unregistered_op(detail: str) -> tuple[str, str] | None:
    """(domain, op type) where onnxruntime's load error says it has no kernel for an op of a
    domain it does not know (a custom op), else None."""
    match = _UNREGISTERED.search(detail)
    if match is None or match["domain"] in _STANDARD or match["domain"].startswith("com.microsoft"):
        return None
    return match["domain"], match["op"]


def custom_op_refusal(detail: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a load error naming a custom op (`unregistered_op`)."""
    found = unregistered_op(detail)
    if found is None:
        return None
    domain, op = found
    what = f"it has no kernel for op {op} of domain {domain}, a custom op"
    if _custom_op_libs:
        return what, (
            f"none of the {CUSTOM_OP_FLAG} libraries registers {domain}:{op}; give the one "
            "that implements it"
        )
    return what, f"give the library that implements it with {CUSTOM_OP_FLAG} LIB"


def load_refusal(what: str, exc: BaseException) -> InferccError:
    """The error for onnxruntime refusing to load `what` ("the model for calibration"): the
    custom op it lacks a kernel for, named with the flag that registers one, or its own first
    line with the checker as the hint."""
    detail = first_line(exc)
    found = custom_op_refusal(detail)
    if found is not None:
        return InferccError(f"onnxruntime cannot load {what}: {found[0]}", found[1])
    return InferccError(
        f"onnxruntime cannot load {what}: {detail}", "check the model with onnx.checker.check_model"
    )
