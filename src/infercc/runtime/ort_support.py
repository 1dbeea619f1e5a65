"""What the installed onnxruntime reads: the highest model IR version it loads.

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
import re
import sys

import onnx
import onnxruntime as ort

from infercc.errors import InferccError

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
        ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
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
        f"{what} has IR version {ir_version}, but onnxruntime {ort.__version__} reads IR "
        f"<= {limit}"
    )


def _hint(limit: int) -> str:
    upgrade = (
        "use Python 3.11 or newer for a newer onnxruntime (1.23 is the last for Python 3.10)"
        if sys.version_info < (3, 11)
        else "upgrade onnxruntime (pip install -U onnxruntime)"
    )
    return f"{upgrade}, or save the model at IR {limit} if it uses nothing newer"
