"""Which precision a TensorRT engine runs in: asked for, set up, and read back.

Precision is a graph property in infercc (`--fp16` rewrites the graph; `infercc calibrate`
inserts Q/DQ pairs). TensorRT's two lines treat that differently:

- TensorRT 10.x (and older) builds *weakly typed* networks by default: the builder may pick
  fp16/bf16/int8 kernels only where a builder flag allows them. So a request for fp16, bf16
  or int8 sets `BuilderFlag.FP16` / `BF16` / `INT8` in addition to the graph rewrite, and the
  graph's own casts and Q/DQ stay honoured. int8 without Q/DQ in the graph needs calibration
  scales: a calibration cache (`--calib-cache`, the file `infercc calibrate --trt-cache`
  writes) is fed through an `IInt8EntropyCalibrator2` that only reads the cache.
- TensorRT 11.x builds *strongly typed* networks only and removed those flags and the
  calibrators: precision comes from the graph alone (and `NetworkDefinitionCreationFlag.
  STRONGLY_TYPED` is deprecated there: strongly typed is the only mode, so no network flag
  is set on either line; EXPLICIT_BATCH, which TensorRT 8 needed, is ignored by 10 and gone
  from 11, and TensorRT older than 10 is refused). A request the graph does not carry
  (fp16 asked, no float16 tensor in the graph) is an error before building, not an fp32
  engine (the rf-detr#1453 trap).

`decide(trt_version, requested, graph)` is that rule as a pure function: version text,
requested precision and the precisions the graph holds in, network and builder flag names out.

After the build, `layer_precisions` reads the engine inspector's JSON (needs
`ProfilingVerbosity.DETAILED`) and counts layers per precision: a layer's precision is the
lowest of its input and output tensor types, so a convolution reading int8 and writing fp32
counts as int8. TensorRT 10 writes a tensor's type in one field, `"Format/Datatype"` ("Row major
linear FP16 format", "Half", "Thirty-two wide channel vectorized row major Int8 format",
"Float"...); TensorRT 11 split it into `"Format"` and `"DataType"` (its migration guide,
"Migrating IEngineInspector Usage from TensorRT 10.x to 11.x"), so `"DataType"` is read when
present. `check_layers` errors when none of the layers run in the requested precision.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from infercc.backends.trt.versions import SUPPORTED_MAJORS, major_version, tensorrt_names
from infercc.errors import InferccError
from infercc.ir import dtypes
from infercc.ir.ops import QDQ_OPS
from infercc.precisions import BUILD_PRECISIONS as PRECISIONS

# TensorRT turns BuilderFlag.TF32 on by default: fp32 convolutions and matrix products of an
# engine run on TF32 tensor cores on GPUs that have them (compute capability 8.0, Ampere, on).
TF32_MIN_CC = 8
# Lowest first: a layer counts at the lowest precision among its tensors.
_ORDER = ("int8", "fp8", "fp16", "bf16", "fp32")
# TensorRT 10's weak-typing builder flags (TensorRT 11 has none of them).
_FLAG = tensorrt_names({"fp16": "FP16", "bf16": "BF16", "int8": "INT8"}, 10)
_REDUCED = ("fp16", "bf16", "int8")  # precisions a graph's tensor types can carry for TensorRT


@dataclass(frozen=True)
class PrecisionPlan:
    """What to set for a precision request: flag names on `trt.NetworkDefinitionCreationFlag`
    and `trt.BuilderFlag`, whether an INT8 calibrator reads the calibration cache, and why."""

    network_flags: tuple[str, ...]
    builder_flags: tuple[str, ...]
    calibrator: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


def strongly_typed_only(version: str) -> bool:
    """TensorRT 11 and later: strongly typed networks only, no precision flags."""
    return major_version(version) >= 11


def decide(
    version: str,
    requested: str,
    graph: Iterable[str] = (),
    calibration_cache: bool = False,
) -> PrecisionPlan:
    """Network and builder flags for `requested` on TensorRT `version` (see the module doc).

    `graph` is the set of reduced precisions the model already carries (`graph_precisions`).
    """
    if requested not in PRECISIONS:
        raise InferccError(
            f"TensorRT has no precision {requested!r} here", f"use one of {', '.join(PRECISIONS)}"
        )
    graph = set(graph)
    if major_version(version) < min(SUPPORTED_MAJORS):
        raise InferccError(
            f"TensorRT {version} is older than {min(SUPPORTED_MAJORS)}, the oldest infercc "
            "builds engines with",
            'pip install "infercc[tensorrt]" (tensorrt>=10), or use --backend ort',
        )
    network: tuple[str, ...] = ()  # no network creation flag on 10 or 11 (module doc)
    if strongly_typed_only(version):
        return _strongly_typed(version, requested, graph, calibration_cache)
    if requested == "fp32":
        return PrecisionPlan(network, ())
    builder = (_FLAG[requested],)
    if requested != "int8" or "int8" in graph:
        return PrecisionPlan(network, builder, notes=_graph_note(requested, graph))
    if not calibration_cache:
        raise InferccError(
            "int8 was asked for, but the graph has no Q/DQ pairs and no calibration cache "
            "was given",
            "run infercc calibrate to add Q/DQ, or pass --calib-cache FILE (TensorRT 10)",
        )
    note = "int8 scales from the calibration cache (IInt8EntropyCalibrator2, cache only)"
    return PrecisionPlan(network, builder, calibrator=True, notes=(note,))


def compute_precision(requested: str, compute_capability: str | None) -> str:
    """The precision an engine built for `requested` computes in on a GPU of this compute
    capability: tf32 for fp32 from Ampere on (TensorRT's default), else `requested`."""
    if requested != "fp32" or not compute_capability:
        return requested
    major = re.match(r"\s*(\d+)", str(compute_capability))
    return "tf32" if major is not None and int(major[1]) >= TF32_MIN_CC else requested


def _graph_note(requested: str, graph: set[str]) -> tuple[str, ...]:
    if requested in graph:
        return (f"graph carries {requested}; BuilderFlag.{_FLAG[requested]} set as well",)
    return (
        f"graph has no {requested} tensors: BuilderFlag.{_FLAG[requested]} lets TensorRT "
        f"choose {requested} kernels",
    )


def _strongly_typed(
    version: str, requested: str, graph: set[str], calibration_cache: bool
) -> PrecisionPlan:
    if calibration_cache:
        raise InferccError(
            f"TensorRT {version} has no INT8 calibrators: a calibration cache cannot be used",
            "run infercc calibrate to put Q/DQ pairs into the graph instead",
        )
    if requested != "fp32" and requested not in graph:
        how = "infercc calibrate (Q/DQ pairs)" if requested == "int8" else f"--{requested}"
        raise InferccError(
            f"{requested} was asked for, but TensorRT {version} takes precision from the graph "
            f"only and the graph has no {requested} tensors",
            f"rewrite the graph with {how}; building it as is would give an fp32 engine",
        )
    note = f"TensorRT {version}: strongly typed network, precision from the graph"
    return PrecisionPlan((), (), notes=(note,))


# --------------------------------------------------------------------------- the graph


def graph_precisions(proto: onnx.ModelProto) -> set[str]:
    """Reduced precisions the graph carries: fp16/bf16 tensors (initializers, values, Cast
    targets) and int8 when it has Q/DQ pairs or 8-bit tensors."""
    graph = proto.graph
    found: set[str] = set()
    types = [t.data_type for t in graph.initializer]
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type"):
            types.append(vi.type.tensor_type.elem_type)
    for node in graph.node:
        if node.op_type in QDQ_OPS:
            found.add("int8")
        if node.op_type == "Cast":
            types += [a.i for a in node.attribute if a.name == "to"]
    found.update(p for p in map(dtypes.precision, types) if p in _REDUCED)
    return found


# --------------------------------------------------------------------------- the engine


def tensor_precision(text: str) -> str | None:
    """'Row major linear FP16 format' -> 'fp16'; 'Float' -> 'fp32'; None when not a float or
    int8 type (int32, bool, "N/A due to dynamic shapes")."""
    low = text.lower()
    patterns = (
        ("int8", r"\bint8\b"),
        ("fp8", r"\bfp8\b|\bfloat8"),
        ("bf16", r"\bbf16\b|bfloat16|\bbfloat\b"),
        ("fp16", r"\bfp16\b|\bhalf\b|\bfloat16\b"),
        ("fp32", r"\bfp32\b|\bfloat32\b|\bfloat\b"),
    )
    for name, pattern in patterns:
        if re.search(pattern, low):
            return name
    return None


def tensor_type_text(tensor: Mapping[str, Any]) -> str:
    """A tensor's type as the inspector writes it: TensorRT 11's `"DataType"` when present,
    else TensorRT 10's combined `"Format/Datatype"` (or a lone `"Format"`)."""
    if "DataType" in tensor:
        return str(tensor["DataType"])
    for key in ("Format/Datatype", "Format/DataType", "Format"):
        if key in tensor:
            return str(tensor[key])
    return ""


def layer_precision(layer: Mapping[str, Any]) -> str | None:
    """The lowest precision among a layer's input and output tensors (None if none known)."""
    tensors = [*(layer.get("Inputs") or []), *(layer.get("Outputs") or [])]
    found = {tensor_precision(tensor_type_text(t)) for t in tensors if isinstance(t, Mapping)}
    found.discard(None)
    return min(found, key=_ORDER.index) if found else None


def layer_precisions(info: Mapping[str, Any]) -> dict[str, int]:
    """Layers per precision in the inspector's engine information ("unknown" for layers whose
    tensors say nothing, e.g. with dynamic shapes and no execution context)."""
    counts: Counter[str] = Counter()
    for layer in info.get("Layers", []) or []:
        if isinstance(layer, Mapping):
            counts[layer_precision(layer) or "unknown"] += 1
    return dict(sorted(counts.items()))


def check_layers(counts: Mapping[str, int], requested: str) -> None:
    """InferccError when layers were read and none runs in the requested precision."""
    if requested == "fp32":
        return
    known = {k: v for k, v in counts.items() if k != "unknown"}
    if known and not known.get(requested):
        found = ", ".join(f"{v} {k}" for k, v in known.items())
        raise InferccError(
            f"{requested} was asked for, but no layer of the built engine runs in {requested} "
            f"(layers: {found})",
            f"the GPU or TensorRT may lack {requested} kernels for these layers; check the "
            "target's precisions with infercc targets, or build without the precision flag",
        )
