"""OpenVINO's CPU plugin, as the backend uses it: compiling, reading back, refusals.

Facts this module is built on (OpenVINO 2026.4, CPU plugin, checked on an AVX-512 BF16 host):

- `Core().compile_model(model, "CPU", properties)` reads ONNX directly, Q/DQ pairs included.
- `INFERENCE_PRECISION_HINT` is bf16 **by default** on a CPU with bf16 instructions, and falls
  back to f32 without an error on one without. So infercc always states the hint (f32 for an
  fp32 build), and reads back what ran: each compute layer of the compiled model's runtime
  graph carries its `runtimePrecision` (`used_precisions`).
- `compiled.export_model()` is a blob that `core.import_model` reloads, but the import
  compiles for the properties given *at import*, not those the blob was exported with: an f32
  blob imported with no properties ran bf16 on that host. The runner therefore passes the
  recorded properties again, and reads the precision back after loading.
- An op the ONNX frontend cannot convert fails `read_model` with "No conversion rule found for
  operations: DOMAIN.OP, ..." or "Failed operations detailed log: -- DOMAIN.OP with a
  message" (`unreadable_ops`).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infercc.errors import InferccError
from infercc.util import first_line

log = logging.getLogger(__name__)

DEVICE = "CPU"
INSTALL_HINT = 'pip install "infercc[openvino]"'
# What a build precision asks OpenVINO for; int8's Q/DQ pairs are in the graph, the hint is
# the precision of what is left (the race keeps the faster that validates).
HINTS = {"fp32": "f32", "bf16": "bf16"}
# The layers whose precision is the build's: matrix products and convolutions.
COMPUTE_LAYERS = frozenset(
    {
        "Convolution",
        "GroupConvolution",
        "Deconvolution",
        "FullyConnected",
        "MatMul",
        "ScaledDotProductAttention",
        "RNNSeq",
        "RNNCell",
    }
)
_PRECISION_NAMES = {
    "f32": "fp32",
    "bf16": "bf16",
    "f16": "fp16",
    "u8": "int8",
    "i8": "int8",
}

try:  # an optional extra: every use goes through require()
    import openvino as ov
except ImportError:  # pragma: no cover - exercised where the extra is missing
    ov = None


def missing_reason() -> str:
    """Why OpenVINO cannot run here ("" when it can)."""
    if ov is None:
        return f"the openvino package is not installed ({INSTALL_HINT})"
    return ""


def require() -> Any:
    """The openvino module; InferccError with the pip command when it is missing."""
    if ov is None:
        raise InferccError(
            "--backend openvino needs the openvino package, which is not installed",
            INSTALL_HINT,
        )
    return ov


def version() -> str:
    return "" if ov is None else str(ov.get_version()).split("-")[0]


def full_version() -> str:
    return "" if ov is None else str(ov.get_version())


def host_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def properties(hint: str, threads: int) -> dict[str, Any]:
    """The compile properties of one configuration: the precision hint always stated."""
    return {
        "INFERENCE_PRECISION_HINT": hint,
        "INFERENCE_NUM_THREADS": int(threads),
        "PERFORMANCE_HINT": "LATENCY",
    }


def capabilities() -> tuple[str, ...]:
    """What the CPU plugin says this host can compute in (BF16, INT8, FP32, ...)."""
    core = _core()
    return tuple(str(c) for c in core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))


_CORE: Any = None


def _core() -> Any:
    global _CORE
    if _CORE is None:
        _CORE = require().Core()
    return _CORE


_NO_RULE = re.compile(r"No conversion rule found for operations?:\s*([^\n]+)")
_FAILED_OP = re.compile(r"^--\s*([A-Za-z0-9_.]+?)(?:-\d+)? with a message", re.MULTILINE)


def unreadable_ops(message: str) -> list[str]:
    """The ops OpenVINO's ONNX frontend names as not converted in `message`."""
    found: list[str] = []
    for line in _NO_RULE.findall(message):
        found += [op.strip() for op in line.split(",") if op.strip()]
    found += _FAILED_OP.findall(message)
    return list(dict.fromkeys(found))


def read(model: Path | str, what: str) -> Any:
    """`core.read_model`; an op OpenVINO cannot read is named in the InferccError (exit 2)."""
    try:
        return _core().read_model(str(model))
    except Exception as exc:  # openvino raises RuntimeError with its whole log
        raise read_refusal(what, exc) from exc


def read_refusal(what: str, exc: BaseException) -> InferccError:
    ops = unreadable_ops(str(exc))
    if ops:
        hint = "build with --backend ort, which runs every op onnxruntime has"
        if any(op.endswith("MatMulIntegerToFloat") for op in ops):
            hint = (
                "that is onnxruntime's fused int8 MatMul: calibrate with --disable-pass "
                "fuse-int8-matmul for a Q/DQ model OpenVINO reads, or build with --backend ort"
            )
        return InferccError(
            f"OpenVINO {version()} cannot read {what}: no conversion for op {', '.join(ops)}",
            hint,
        )
    return InferccError(
        f"OpenVINO {version()} cannot read {what}: {first_line(exc, 300)}",
        "build with --backend ort, or check the model with onnx.checker.check_model",
    )


def compile_model(model: Any, props: Mapping[str, Any]) -> Any:
    return _core().compile_model(model, DEVICE, dict(props))


def export_blob(compiled: Any) -> bytes:
    blob = compiled.export_model()
    return blob.getvalue() if hasattr(blob, "getvalue") else bytes(blob)


def import_blob(data: bytes, props: Mapping[str, Any]) -> Any:
    import io

    return _core().import_model(io.BytesIO(data), DEVICE, dict(props))


def hint_used(compiled: Any) -> str:
    """The inference precision the compiled model reports (f32, bf16, f16)."""
    value = compiled.get_property("INFERENCE_PRECISION_HINT")
    name = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(str(name), str(name))


def used_precisions(compiled: Any) -> dict[str, int]:
    """How many compute layers of the compiled model run in each precision (fp32, bf16,
    int8...), read from its runtime graph: what ran, never the hint."""
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" not in info or "runtimePrecision" not in info:
            continue
        if info["layerType"].astype(str) not in COMPUTE_LAYERS:
            continue
        precision = info["runtimePrecision"].astype(str)
        counts[_PRECISION_NAMES.get(precision, precision)] += 1
    return dict(sorted(counts.items()))


def dominant(used: Mapping[str, int]) -> str | None:
    """The build precision the compute layers say ran: int8 when any layer is integer, else
    bf16 when any is, else fp32 (None: no compute layer at all)."""
    for precision in ("int8", "bf16", "fp16", "fp32"):
        if used.get(precision):
            return precision
    return None


class Session:
    """One compiled model and its infer request: feeds by input name, outputs in graph order."""

    def __init__(self, compiled: Any, output_names: Sequence[str]):
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self._ports = {p.get_any_name(): p for p in compiled.outputs}
        names = list(output_names)
        self._order = [self._port(name, i) for i, name in enumerate(names)]
        self._inputs = {i.get_any_name(): i for i in compiled.inputs}

    def _port(self, name: str, index: int) -> Any:
        if name in self._ports:
            return self._ports[name]
        for port in self.compiled.outputs:
            if name in port.get_names():
                return port
        return self.compiled.outputs[index]

    def run(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        inputs = {name: np.ascontiguousarray(feeds[name]) for name in self._inputs}
        results = self.request.infer(inputs)
        return [np.array(results[port], copy=True) for port in self._order]
