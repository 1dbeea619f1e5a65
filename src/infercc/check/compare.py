"""Check that an optimized model computes what the original does, output by output.

Both models run on onnxruntime's CPU provider with its graph optimizations off, so what is
compared is infercc's rewrites, not onnxruntime's. The reference runs on every sample and its
session is released before the candidate's is created: only one model is in memory at a time.

An output passes when, for every sample:

- floating outputs: every element satisfies `|c - r| <= atol + rtol * |r|` and the cosine
  similarity is at least `min_cosine` (metrics in float64). NaN in the same places in both is
  equal; an inf must be matched by the same inf. Cosine of two all-zero tensors is 1.0, of a
  zero and a non-zero tensor 0.0. Empty tensors pass.
- integer, bool and string outputs: exactly equal.
- names, shapes and dtypes agree; a missing or extra output fails with a `reason`.

`tolerances` overrides atol and rtol for named outputs (`--tol logits=1e-3:1e-2`); the report
lists the overrides it applied.

Metrics over several samples are the worst case: largest `max_abs` and `max_rel`, smallest
`cosine`; `frac_out_of_tol` counts bad elements over all samples. `max_rel` is the largest
`|c - r| / |r|` over finite elements with `r != 0` (zeros show in `max_abs`). An element whose
NaN/inf placement differs makes `max_abs` and `max_rel` inf.

`ValidationReport.to_dict()` gives JSON-safe data: non-finite floats are the strings `"nan"`,
`"inf"` and `"-inf"`; a metric that was not computed (the output is missing or its shape or
dtype differs) is `None`.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from os import PathLike, fspath
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from infercc.data.feeds import make_inputs
from infercc.data.samples import load_samples
from infercc.errors import InferccError
from infercc.ir.wire import read_model
from infercc.runtime.ort_support import check_ir_version, refused_ir_version
from infercc.util import first_line, json_float

logger = logging.getLogger(__name__)

ModelSource = str | PathLike | bytes | onnx.ModelProto
Feeds = Mapping[str, np.ndarray]

# A ModelProto larger than this is saved with external data instead of serialized in memory
# (protobuf refuses messages over 2 GiB).
MAX_INLINE_BYTES = 1_800_000_000
_EXTERNAL_DATA_FILE = "weights.bin"


# --------------------------------------------------------------------------- report


@dataclass
class OutputMetrics:
    """How one output of the candidate compares with the reference's."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    max_abs: float | None = 0.0
    max_rel: float | None = 0.0
    cosine: float | None = 1.0
    frac_out_of_tol: float | None = 0.0
    passed: bool = True
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": None if self.shape is None else [int(d) for d in self.shape],
            "dtype": self.dtype,
            "max_abs": json_float(self.max_abs),
            "max_rel": json_float(self.max_rel),
            "cosine": json_float(self.cosine),
            "frac_out_of_tol": json_float(self.frac_out_of_tol),
            "passed": bool(self.passed),
            "reason": self.reason,
        }


@dataclass
class ValidationReport:
    """The verdict over all outputs and samples."""

    passed: bool
    outputs: dict[str, OutputMetrics]
    samples: int
    atol: float
    rtol: float
    min_cosine: float
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)

    def failures(self) -> list[OutputMetrics]:
        return [m for m in self.outputs.values() if not m.passed]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (see the module docstring for NaN/inf and None)."""
        return {
            "passed": bool(self.passed),
            "samples": int(self.samples),
            "atol": json_float(self.atol),
            "rtol": json_float(self.rtol),
            "min_cosine": json_float(self.min_cosine),
            "tolerances": {
                name: {"atol": json_float(a), "rtol": json_float(r)}
                for name, (a, r) in self.tolerances.items()
            },
            "outputs": {name: m.to_dict() for name, m in self.outputs.items()},
        }


# --------------------------------------------------------------------------- running


def run_model(
    model: ModelSource, feeds_list: Sequence[Feeds], optimize: bool = False
) -> list[dict[str, np.ndarray]]:
    """Run `model` on onnxruntime CPU for each feed; the session is released on return.

    Only the inputs the model declares are fed, so one feed dict serves a model that dropped
    the IR<4 initializer-inputs. `optimize=True` lets onnxruntime optimize the graph.
    """
    with _model_source(model) as source:
        session = _make_session(source, optimize)
        try:
            return [_run_one(session, feeds) for feeds in feeds_list]
        finally:
            del session


@contextmanager
def _model_source(model: ModelSource) -> Iterator[str | bytes]:
    """A path or bytes onnxruntime can load; a large ModelProto goes through a temp dir."""
    if isinstance(model, bytes):
        yield model
    elif isinstance(model, onnx.ModelProto):
        if _proto_size(model) <= MAX_INLINE_BYTES:
            yield model.SerializeToString()
        else:
            with tempfile.TemporaryDirectory(prefix="infercc-") as tmp:
                yield _save_external(model, Path(tmp))
    elif isinstance(model, (str, PathLike)):
        yield _existing_path(model)
    else:
        raise InferccError(
            f"cannot run a model given as {type(model).__name__}",
            "pass a path, bytes or onnx.ModelProto",
        )


def _proto_size(model: onnx.ModelProto) -> int:
    try:
        return model.ByteSize()
    except Exception:  # protobuf may refuse to size a message over 2 GiB
        return MAX_INLINE_BYTES + 1


def _existing_path(model: str | PathLike) -> str:
    path = fspath(model)
    if not Path(path).is_file():
        raise InferccError(f"model file {path!r} does not exist", "check the path")
    return path


def _save_external(model: onnx.ModelProto, directory: Path) -> str:
    """Save with weights in one external file, then restore `model`'s in-memory weights."""
    path = directory / "model.onnx"
    logger.info("model is over %d bytes: saving with external data to %s", MAX_INLINE_BYTES, path)
    untouched = [t for t in _initializers(model.graph) if not t.HasField("data_location")]
    try:
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=_EXTERNAL_DATA_FILE,
            size_threshold=1024,
        )
    finally:
        # save_model moves raw_data out of the caller's proto; put it back.
        onnx.external_data_helper.load_external_data_for_model(model, fspath(directory))
        for tensor in untouched:
            tensor.ClearField("data_location")
    return fspath(path)


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers of `graph` and of every subgraph (If/Loop/Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _initializers(attr.g)
            for sub in attr.graphs:
                yield from _initializers(sub)


def _make_session(source: str | bytes, optimize: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 4  # infercc words the error; no second line from onnxruntime
    # One-shot sessions: no memory arena (it only pays off over many runs; without it a
    # 440 MB BERT-base session peaks at 566 MB instead of 697 MB).
    options.enable_cpu_mem_arena = False
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own non-standard exception types
        refused = refused_ir_version(exc)
        if refused is not None:
            check_ir_version(refused)
        raise InferccError(
            f"onnxruntime cannot load the model: {first_line(exc)}",
            "check the model with onnx.checker.check_model",
        ) from exc


def _run_one(session: ort.InferenceSession, feeds: Feeds) -> dict[str, np.ndarray]:
    declared = [i.name for i in session.get_inputs()]
    missing = [name for name in declared if name not in feeds]
    if missing:
        raise InferccError(
            f"no value for model input(s) {', '.join(map(repr, missing))}",
            "the samples must hold every input the model declares",
        )
    names = [o.name for o in session.get_outputs()]
    given = {i.name: _as_declared(feeds[i.name], i.type) for i in session.get_inputs()}
    try:
        values = session.run(names, given)
    except Exception as exc:  # onnxruntime raises its own non-standard exception types
        raise InferccError(
            f"onnxruntime failed to run the model: {first_line(exc)}",
            "check the input shapes (--shape) and dtypes",
        ) from exc
    return dict(zip(names, values, strict=True))


_FLOAT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}


def _as_declared(array: np.ndarray, ort_type: str) -> np.ndarray:
    """A float feed in the float type the model declares (a --fp16-io candidate takes float16
    where the original takes float32: both are fed the same values)."""
    target = _FLOAT_TYPES.get(ort_type)
    arr = np.asarray(array)
    if target is not None and arr.dtype.kind == "f" and arr.dtype != target:
        return arr.astype(target)
    return arr


# --------------------------------------------------------------------------- comparing


@dataclass
class _Stats:
    """Metrics of one output on one sample."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    bad: int = 0
    total: int = 0


@dataclass
class _Tolerance:
    atol: float
    rtol: float
    min_cosine: float
    # True when the candidate legitimately changed a float output's type (--fp16-io): the
    # values are then compared in float64 instead of failing on the dtype.
    float_dtypes_may_differ: bool = False


@dataclass
class _Accumulator:
    """Worst case over samples for one output; `reason` set on a structural mismatch."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    stats: list[_Stats] = field(default_factory=list)
    reason: str | None = None


def compare_models(
    reference: ModelSource,
    candidate: ModelSource,
    feeds_list: Sequence[Feeds],
    atol: float = 1e-4,
    rtol: float = 1e-3,
    min_cosine: float = 0.9999,
    float_dtypes_may_differ: bool = False,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
) -> ValidationReport:
    """Run both models on the same feeds (one after the other) and compare their outputs."""
    if not feeds_list:
        raise InferccError("no samples to validate with", "pass --data or let infercc make one")
    expected = run_model(reference, feeds_list)
    actual = run_model(candidate, feeds_list)
    report = compare_outputs(
        expected, actual, atol, rtol, min_cosine, float_dtypes_may_differ, tolerances
    )
    _log_report(report)
    return report


def compare_outputs(
    expected: Sequence[Mapping[str, np.ndarray]],
    actual: Sequence[Mapping[str, np.ndarray]],
    atol: float = 1e-4,
    rtol: float = 1e-3,
    min_cosine: float = 0.9999,
    float_dtypes_may_differ: bool = False,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
) -> ValidationReport:
    """Compare outputs already computed (one name -> array dict per sample), by the rules above.

    `tolerances` maps an output name to its own (atol, rtol)."""
    tol = _Tolerance(atol, rtol, min_cosine, float_dtypes_may_differ)
    per_output = {
        name: _Tolerance(float(a), float(r), min_cosine, float_dtypes_may_differ)
        for name, (a, r) in (tolerances or {}).items()
    }
    accumulators: dict[str, _Accumulator] = {}
    for ref_out, cand_out in zip(expected, actual, strict=True):
        _compare_sample(dict(ref_out), dict(cand_out), tol, accumulators, per_output)
    outputs = {name: _finish(acc, per_output.get(name, tol)) for name, acc in accumulators.items()}
    return ValidationReport(
        passed=all(m.passed for m in outputs.values()),
        outputs=outputs,
        samples=len(expected),
        atol=atol,
        rtol=rtol,
        min_cosine=min_cosine,
        tolerances={name: (t.atol, t.rtol) for name, t in per_output.items()},
    )


def _compare_sample(
    ref_out: dict[str, np.ndarray],
    cand_out: dict[str, np.ndarray],
    tol: _Tolerance,
    accumulators: dict[str, _Accumulator],
    per_output: Mapping[str, _Tolerance] | None = None,
) -> None:
    for name in [*ref_out, *(n for n in cand_out if n not in ref_out)]:
        out_tol = (per_output or {}).get(name, tol)
        ref, cand = ref_out.get(name), cand_out.get(name)
        acc = accumulators.get(name)
        if acc is None:
            acc = accumulators[name] = _new_accumulator(name, ref, cand)
        if acc.reason is None:
            acc.reason = _structural_mismatch(ref, cand, tol.float_dtypes_may_differ)
        if acc.reason is None:
            acc.stats.append(_compare_arrays(np.asarray(ref), np.asarray(cand), out_tol))


def _new_accumulator(name: str, ref: Any, cand: Any) -> _Accumulator:
    shown = ref if ref is not None else cand
    if not isinstance(shown, np.ndarray):
        return _Accumulator(name, None, type(shown).__name__)
    return _Accumulator(name, tuple(int(d) for d in shown.shape), str(shown.dtype))


def _structural_mismatch(ref: Any, cand: Any, float_change_ok: bool = False) -> str | None:
    if cand is None:
        return "missing from the candidate"
    if ref is None:
        return "not an output of the reference"
    if not isinstance(ref, np.ndarray) or not isinstance(cand, np.ndarray):
        return "not a tensor (sequence or map outputs are not compared)"
    both_float = ref.dtype.kind == "f" and cand.dtype.kind == "f"
    if ref.dtype != cand.dtype and not (float_change_ok and both_float):
        return f"dtype {cand.dtype} differs from the reference's {ref.dtype}"
    if ref.shape != cand.shape:
        return f"shape {list(cand.shape)} differs from the reference's {list(ref.shape)}"
    return None


def _compare_arrays(ref: np.ndarray, cand: np.ndarray, tol: _Tolerance) -> _Stats:
    if ref.size == 0:
        return _Stats()
    if ref.dtype.kind in "fc":
        return _compare_floats(ref, cand, tol)
    if ref.dtype.kind in "iub":
        return _compare_exact(ref, cand)
    bad = int(np.count_nonzero(ref != cand))  # strings: exact, no distance to report
    unknown = math.nan if bad else 0.0
    return _Stats(max_abs=unknown, max_rel=unknown, cosine=1.0 - bool(bad), bad=bad, total=ref.size)


def _compare_exact(ref: np.ndarray, cand: np.ndarray) -> _Stats:
    """Integers and bools: any difference fails; metrics in float64 for the report."""
    bad = int(np.count_nonzero(ref != cand))
    r, c = ref.astype(np.float64).ravel(), cand.astype(np.float64).ravel()
    diff = np.abs(c - r)
    return _Stats(
        max_abs=float(diff.max()),
        max_rel=_max_rel(diff, r),
        cosine=_cosine(r, c),
        bad=bad,
        total=ref.size,
    )


def _compare_floats(ref: np.ndarray, cand: np.ndarray, tol: _Tolerance) -> _Stats:
    r = ref.astype(np.complex128 if ref.dtype.kind == "c" else np.float64).ravel()
    c = cand.astype(r.dtype).ravel()
    finite = np.isfinite(r) & np.isfinite(c)
    same_nonfinite = (np.isnan(r) & np.isnan(c)) | (np.isinf(r) & (r == c))
    mismatched = int(np.count_nonzero(~(finite | same_nonfinite)))
    r, c = r[finite], c[finite]
    diff = np.abs(c - r)
    with np.errstate(invalid="ignore"):  # rtol inf times |r| = 0 is NaN: not out of tolerance
        out_of_tol = int(np.count_nonzero(diff > tol.atol + tol.rtol * np.abs(r)))
    worst = math.inf if mismatched else 0.0
    return _Stats(
        max_abs=max(float(diff.max(initial=0.0)), worst),
        max_rel=max(_max_rel(diff, r), worst),
        cosine=_cosine(r, c),
        bad=out_of_tol + mismatched,
        total=ref.size,
    )


def _max_rel(diff: np.ndarray, r: np.ndarray) -> float:
    nonzero = r != 0
    if not nonzero.any():
        return 0.0
    return float((diff[nonzero] / np.abs(r[nonzero])).max())


def _cosine(r: np.ndarray, c: np.ndarray) -> float:
    """Cosine similarity; 1.0 for two zero vectors, 0.0 for a zero and a non-zero one."""
    scale = max(float(np.abs(r).max(initial=0.0)), float(np.abs(c).max(initial=0.0)))
    if scale == 0.0:
        return 1.0
    r, c = r / scale, c / scale  # avoid overflow in the norms
    norm_r, norm_c = float(np.linalg.norm(r)), float(np.linalg.norm(c))
    if norm_r == 0.0 or norm_c == 0.0:
        return 0.0
    dot = np.vdot(r, c).real
    return float(np.clip(dot / (norm_r * norm_c), -1.0, 1.0))


def _finish(acc: _Accumulator, tol: _Tolerance) -> OutputMetrics:
    if acc.reason is not None:
        return OutputMetrics(
            acc.name, acc.shape, acc.dtype, None, None, None, None, False, acc.reason
        )
    total = sum(s.total for s in acc.stats)
    bad = sum(s.bad for s in acc.stats)
    metrics = OutputMetrics(
        name=acc.name,
        shape=acc.shape,
        dtype=acc.dtype,
        max_abs=max((s.max_abs for s in acc.stats), default=0.0),
        max_rel=max((s.max_rel for s in acc.stats), default=0.0),
        cosine=min((s.cosine for s in acc.stats), default=1.0),
        frac_out_of_tol=bad / total if total else 0.0,
    )
    metrics.reason = _numeric_failure(metrics, bad, total, tol)
    metrics.passed = metrics.reason is None
    return metrics


def _numeric_failure(m: OutputMetrics, bad: int, total: int, tol: _Tolerance) -> str | None:
    if bad:
        return (
            f"{bad} of {total} elements out of tolerance (atol {tol.atol:g}, rtol {tol.rtol:g}); "
            f"max_abs {m.max_abs:.3g}"
        )
    exact = m.dtype is not None and np.dtype(m.dtype).kind not in "fc"
    if not exact and not (m.cosine >= tol.min_cosine):  # NaN cosine fails too
        return f"cosine {m.cosine:.6f} below {tol.min_cosine}"
    return None


def _log_report(report: ValidationReport) -> None:
    for m in report.failures():
        logger.warning("output %r failed: %s", m.name, m.reason)
    logger.info(
        "validation %s over %d sample(s), %d output(s)",
        "passed" if report.passed else "FAILED",
        report.samples,
        len(report.outputs),
    )


# --------------------------------------------------------------------------- entry point


def validate(
    reference: ModelSource,
    candidate: ModelSource,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: str | PathLike[str] | None = None,
    seed: int = 0,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    min_cosine: float = 0.9999,
    float_dtypes_may_differ: bool = False,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
) -> ValidationReport:
    """Compare `candidate` with `reference` on samples from `data`, or on one random feed.

    Feeds are built against the reference's inputs; each model is fed only what it declares,
    in the float type it declares. `float_dtypes_may_differ` accepts a float output whose type
    the candidate changed on purpose (float16 I/O) and compares its values.
    """
    feeds_list = _build_feeds(_load_reference(reference), shapes, data, seed)
    return compare_models(
        reference,
        candidate,
        feeds_list,
        atol,
        rtol,
        min_cosine,
        float_dtypes_may_differ,
        tolerances,
    )


def _load_reference(reference: ModelSource) -> onnx.ModelProto:
    """The reference's graph for building feeds; weights in external files are not read."""
    if isinstance(reference, onnx.ModelProto):
        return reference
    if isinstance(reference, bytes):
        return onnx.load_model_from_string(reference)
    path = _existing_path(reference)
    try:
        # Inputs, shapes and initializer dims are all the feeds need: leave the weights on disk.
        return read_model(Path(path))[0]
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InferccError(
            f"cannot read ONNX model {path!r}: {exc}", "is it an .onnx file?"
        ) from exc


def _build_feeds(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None,
    data: str | PathLike[str] | None,
    seed: int,
) -> list[dict[str, np.ndarray]]:
    if data is None:
        return [make_inputs(model, shapes, seed)]
    if shapes:
        logger.warning("--shape is ignored when --data gives the samples")
    return load_samples(data, model)
