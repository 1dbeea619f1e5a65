"""Check that an optimized model computes what the original does, output by output.

Both models run on onnxruntime's CPU provider with its graph optimizations off, so what is
compared is infercc's rewrites, not onnxruntime's. The reference runs on every sample and its
session is released before the candidate's is created: only one model is in memory at a time.

An output passes when, for every sample:

- floating outputs: every element satisfies `|c - r| <= atol + rtol * |r|` and the cosine
  similarity is at least `min_cosine` (metrics in float64), except that an output within
  `atol` everywhere passes whatever its cosine (the cosine of tiny values, such as a
  probability map whose maximum is 3.6e-6, is dominated by rounding). NaN in the same places
  in both is equal; an inf must be matched by the same inf. Cosine of two all-zero tensors is
  1.0, of a zero and a non-zero tensor 0.0. Empty tensors pass.
- integer, bool and string outputs: exactly equal.
- sequence, map and optional outputs (ZipMap's sequence of maps): the same structure (lengths,
  keys, each element's dtype and shape, `infercc.check.structured`), then their elements
  compared by the rules above.
- names, shapes and dtypes agree; a missing or extra output fails with a `reason`.

**onnxruntime's own rounding is the floor** of an fp32 comparison. Every user of the original
runs it with onnxruntime's graph optimizations at their default level, which fold
BatchNormalization into Conv, change the Conv kernels' layout and accumulation order, and so
move deep networks' large outputs by ~1e-5 of their scale; a fixed atol/rtol would refuse a
correct build for rounding of that order. So when `own` is given (the reference's outputs with
onnxruntime's optimizations at their default level, `ORT_ENABLE_ALL`; the reference itself runs
with them off), a float element outside atol + rtol * |r| still passes when
`|c - r| <= RUNTIME_ROUNDING_MULTIPLE * own_max`, own_max being the largest `|own - r|` of that
output on that sample: the candidate is no further from the reference than a small multiple of
what onnxruntime itself does to it. That only counts as rounding where own_max is at most
`RUNTIME_ROUNDING_SHARE` of the output's largest magnitude (an optimizer that changes an output
by more than that has changed what it computes, and gives no floor). The cosine is checked as
always. The output's `runtime_rounding` is own_max (the worst over samples; None when not
measured) and its `note` says when it decided. Validation measures `own` for every fp32
candidate (`infercc.check.validation`).

**The runtime's own movement also tightens the tolerance.** A real bug of relative size 1e-4
(a weight scaled by 1.0001) passes atol 1e-4 + rtol 1e-3, while a correct build moves an
output by about what onnxruntime's own optimizer does. So an fp32 output whose largest error
is more than `movement_k` (`infercc.precisions.MOVEMENT_K`) times onnxruntime's own move
(at least `movement_floor`: 16 ulps of fp32 at the output's largest magnitude, for outputs the
optimizer leaves bit-identical) fails, decided_by `runtime-movement`, however small the error
is against the table; `movement_ratio` reports that ratio for every output where `own` was
given and its move is rounding. bench/mutants.py measures the ratio on correct builds and on
real bugs; docs/validate.md gives both and the k chosen.

**Only rounding differs** when every failed output failed on elements alone, each of them
outside the bound by at most `ROUNDING_ULPS` units in the last place of the output's largest
magnitude (a sum of thousands of terms rounds in those units), with a cosine that prints as
1.000000 (`COSINE_ONE`): no rewrite is to blame and bisecting the pipeline would name one
anyway. The output's `rounding_only` and `ValidationReport.rounding_only()` (the message,
naming `--rtol` and `--tol`) say so; `optimize` and `validate --bisect` do not bisect then.

**A near-constant output** (`near_constant`: a float output of more than one element whose
reference values, over all samples, span no more than the fp32 table's bound at their largest
magnitude, atol + rtol * max|r|, as a sigmoid map saturated everywhere) says little: any
build that returns about that constant passes, and the cosine of values near zero is rounding.
The verdict is reached as for any output, except in a reduced-precision build (`precision`
fp16 or bf16), where one whose error stays within that type's resolution at the output's
magnitude passes (`infercc.precisions.resolution`; decided_by `resolution`, the note gives
the bound); where it passed, validation shows the cosine as n/a and says that validation is
weak for that output (`infercc.check.validation`).

Each output's `decided_by` says which criterion gave the verdict: `exact` (integers, bools,
strings), `elementwise` (failed: elements outside atol + rtol * |r|, or NaN/inf misplaced),
`atol` (passed: every element within atol, the cosine not consulted), `cosine` (failed on
the cosine, or passed where no elementwise bound applies, as in fp16), `elementwise+cosine`
(passed both), `resolution` (passed: a near-constant output within its type's resolution),
`runtime-rounding` (passed: elements outside atol + rtol * |r| were within
onnxruntime's own rounding, and the cosine passed; `excused_max_abs` is the largest error of
those excused elements and `within_tol_max_abs` that of the elements the tolerance itself
accepted, the note gives both), `structure` (failed: missing, or another
shape, dtype or structure).

`tolerances` overrides atol and rtol for named outputs (`--tol logits=1e-3:1e-2`); the report
lists the overrides it applied.

Metrics over several samples are the worst case: largest `max_abs` and `max_rel`, smallest
`cosine`; `frac_out_of_tol` counts bad elements over all samples. `max_rel` is the largest
`|c - r| / |r|` over finite elements with `r != 0` (zeros show in `max_abs`). An element whose
NaN/inf placement differs makes `max_abs` and `max_rel` inf.

`validate` (the entry point) also runs the models at a second shape profile when an input has
a symbolic dimension, tries other sizes and values when the original fails on the default
ones (`infercc.check.profiles`), reports whether the inputs executed each rewritten If/Loop
body (`infercc.check.coverage`), and reports a candidate onnxruntime cannot load or run as a
failed validation (`error`), not as bad input.

`ValidationReport.to_dict()` gives JSON-safe data: a metric is a number or `None`, which
stands for a non-finite value (`infercc.util.json_float`; the reason says what happened), for a
metric not computed (the output is missing or its shape or dtype differs) and for the cosine of
a near-constant output.
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

from infercc.check import structured
from infercc.errors import InferccError
from infercc.ir import dtypes
from infercc.precisions import (
    FP32,
    MOVEMENT_FLOOR_ULPS,
    MOVEMENT_K,
    RUNTIME_ROUNDING_MULTIPLE,
    RUNTIME_ROUNDING_SHARE,
    resolution,
)
from infercc.runtime.ort_support import (
    check_ir_version,
    custom_op_refusal,
    refused_ir_version,
    session_options,
)
from infercc.util import first_line, format_below, json_float

logger = logging.getLogger(__name__)

ModelSource = str | PathLike | bytes | onnx.ModelProto
Feeds = Mapping[str, np.ndarray]

# A ModelProto larger than this is saved with external data instead of serialized in memory
# (protobuf refuses messages over 2 GiB).
MAX_INLINE_BYTES = 1_800_000_000

# Only rounding differs (module docstring): the failing elements are outside the bound by at
# most this many ulps of the output's largest magnitude (measured: 12.5 on a ShuffleNet logit of
# 0.20 among logits of 3,447 that onnxruntime's own rounding let through), at a cosine that
# prints as 1.000000.
ROUNDING_ULPS = 16
COSINE_ONE = 0.9999995
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
    decided_by: str | None = None  # the criterion that gave the verdict (module docstring)
    # onnxruntime's own largest move of this output (its default optimizations against none),
    # when validation measured it; `note` says when that rounding decided the verdict
    runtime_rounding: float | None = None
    note: str | None = None
    # failed, and only rounding differs (module docstring)
    rounding_only: bool = False
    excess_ulps: float | None = None  # how far the worst element is past the bound, in ulps
    near_constant: bool = False  # the reference's values hardly vary (module docstring)
    # where runtime-rounding decided: the largest error of the elements inside atol + rtol *
    # |r| (what the tolerance accepted) and of those only onnxruntime's rounding excused
    within_tol_max_abs: float | None = None
    excused_max_abs: float | None = None
    # max_abs over onnxruntime's own move of this output (at least its floor), when measured
    movement_ratio: float | None = None

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
            "decided_by": self.decided_by,
            "runtime_rounding": json_float(self.runtime_rounding),
            "note": self.note,
            "rounding_only": bool(self.rounding_only),
            "excess_ulps": json_float(self.excess_ulps),
            "near_constant": bool(self.near_constant),
            "within_tol_max_abs": json_float(self.within_tol_max_abs),
            "excused_max_abs": json_float(self.excused_max_abs),
            "movement_ratio": json_float(self.movement_ratio),
        }


@dataclass
class ValidationReport:
    """The verdict over all outputs and samples.

    `profiles`: the shape profiles the samples came from (`Profile.to_dict()` of
    `infercc.check.profiles`, each with its own `passed`); `notes`: what validation had to
    decide on the way (another size than the default, a second profile the original does not
    run at); `coverage`: whether the inputs executed each If/Loop body; `error`: why the
    candidate could not be run at all (a failure, not bad input).
    """

    passed: bool
    outputs: dict[str, OutputMetrics]
    samples: int
    atol: float
    rtol: float
    min_cosine: float
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    coverage: Any = None  # infercc.check.coverage.CoverageReport
    error: str | None = None
    ran_on: str | None = None  # the runtime that ran the candidate ("onnxruntime ... CPU")
    # The samples it ran on (for a bisection that follows); not part of the report.
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False, compare=False)

    def failures(self) -> list[OutputMetrics]:
        return [m for m in self.outputs.values() if not m.passed]

    def failure_reason(self) -> str:
        """Why it failed, in one line: the error, the failed outputs, or the coverage."""
        if self.error is not None:
            return self.error
        failed = "; ".join(f"{m.name}: {m.reason}" for m in self.failures())
        if failed:
            return failed
        message = self.coverage.message() if self.coverage is not None else None
        return message or ""

    def rounding_only(self) -> str | None:
        """When only rounding differs (module docstring): the message, naming the --tol that
        passes each failed output; else None."""
        failed = self.failures()
        if self.error is not None or not failed or not all(m.rounding_only for m in failed):
            return None
        if self.coverage is not None and not self.coverage.passed:
            return None
        worst = max(m.excess_ulps or 0.0 for m in failed)
        tols = " ".join(self._accepting_tol(m) for m in failed)
        return (
            f"only rounding differs: {', '.join(m.name for m in failed)} past the bound by at "
            f"most {worst:.1f} ulp(s) of the output's largest value, cosine "
            f"{min(m.cosine or 0.0 for m in failed):.6f}; no rewrite is to blame (not bisected): "
            f"accept it with {tols} (or a larger --rtol)"
        )

    def _accepting_tol(self, m: OutputMetrics) -> str:
        """`--tol NAME=ATOL:RTOL` that `m` passes: its max_abs rounded up as atol."""
        rtol = self.tolerances.get(m.name, (self.atol, self.rtol))[1]
        return f"--tol {m.name}={_round_up(m.max_abs or 0.0):g}:{rtol:g}"

    @property
    def outputs_passed(self) -> bool:
        """The outputs agree (coverage aside) and the candidate ran."""
        return self.error is None and all(m.passed for m in self.outputs.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (see the module docstring for NaN/inf and None)."""
        return {
            "passed": bool(self.passed),
            "error": self.error,
            "samples": int(self.samples),
            "atol": json_float(self.atol),
            "rtol": json_float(self.rtol),
            "min_cosine": json_float(self.min_cosine),
            "tolerances": {
                name: {"atol": json_float(a), "rtol": json_float(r)}
                for name, (a, r) in self.tolerances.items()
            },
            "outputs": {name: m.to_dict() for name, m in self.outputs.items()},
            "profiles": list(self.profiles),
            "notes": list(self.notes),
            "coverage": self.coverage.to_dict() if self.coverage is not None else None,
            "rounding_only": self.rounding_only(),
            "ran_on": self.ran_on,
        }


def ort_cpu() -> str:
    """How a report names where validation ran a plain model: this onnxruntime's CPU
    provider, graph optimizations off (never a GPU, whatever the target)."""
    return f"onnxruntime {ort.__version__}, CPUExecutionProvider"


def _round_up(x: float) -> float:
    """`x` rounded up to two significant digits (a tolerance that holds it)."""
    if not x > 0 or not math.isfinite(x):
        return x
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    up = math.ceil(x / step) * step
    return up if up >= x else up + step


# --------------------------------------------------------------------------- running


class ModelRunError(InferccError):
    """onnxruntime could not load (`stage` "load") or run (`stage` "run") a model; `detail` is
    onnxruntime's first line."""

    def __init__(self, stage: str, detail: str, role: str = "the model", hint: str | None = None):
        verb = "cannot load" if stage == "load" else "failed to run"
        default_hint = (
            "check the model with onnx.checker.check_model"
            if stage == "load"
            else "check the input shapes (--shape) and dtypes"
        )
        super().__init__(f"onnxruntime {verb} {role}: {detail}", hint or default_hint)
        self.stage, self.detail, self.role = stage, detail, role


class Runner:
    """One onnxruntime CPU session for several runs, released on exit:

        with Runner(model, role="the original model") as runner:
            outputs = runner.run(feeds)

    Errors are `ModelRunError`s naming `role`. Only the inputs the model declares are fed, in
    the float type it declares."""

    def __init__(self, model: ModelSource, optimize: bool = False, role: str = "the model"):
        self.model, self.optimize, self.role = model, optimize, role
        self._source: Any = None
        self.session: ort.InferenceSession | None = None

    def __enter__(self) -> Runner:
        self._source = _model_source(self.model)
        source = self._source.__enter__()
        try:
            self.session = _make_session(source, self.optimize, self.role)
        except BaseException:
            self._source.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.session = None
        if self._source is not None:
            self._source.__exit__(*exc)
            self._source = None

    def run(self, feeds: Feeds) -> dict[str, Any]:
        assert self.session is not None, "use Runner as a context manager"
        return _run_one(self.session, feeds, self.role)


def run_model(
    model: ModelSource,
    feeds_list: Sequence[Feeds],
    optimize: bool = False,
    role: str = "the model",
) -> list[dict[str, Any]]:
    """Run `model` on onnxruntime CPU for each feed; the session is released on return.

    Only the inputs the model declares are fed, so one feed dict serves a model that dropped
    the IR<4 initializer-inputs. `optimize=True` lets onnxruntime optimize the graph. Outputs
    are arrays, or lists, dicts and None for sequence, map and optional outputs.
    """
    with Runner(model, optimize, role) as runner:
        return [runner.run(feeds) for feeds in feeds_list]


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


def _make_session(source: str | bytes, optimize: bool, role: str) -> ort.InferenceSession:
    options = session_options()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 4  # infercc words the error; no second line from onnxruntime
    # One-shot sessions: no memory arena (it only pays off over many runs; without it a
    # 440 MB BERT-base session peaks at 566 MB instead of 697 MB).
    options.enable_cpu_mem_arena = False
    # Priority-based order runs the Cast(float16 weight -> float32) that onnxruntime's CPU
    # provider inserts before each float16 MatMul just before that MatMul, so that one float32
    # copy is alive at a time; the default order runs every such Cast (source nodes) first and
    # holds a float32 copy of every weight at once (2x the float16 weights). Same kernels, same
    # values: only the order of independent nodes changes.
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own non-standard exception types
        refused = refused_ir_version(exc)
        if refused is not None:
            check_ir_version(refused)
        custom = custom_op_refusal(first_line(exc))
        if custom is not None:
            raise ModelRunError("load", custom[0], role, custom[1]) from exc
        raise ModelRunError("load", first_line(exc), role) from exc


def _run_one(session: ort.InferenceSession, feeds: Feeds, role: str) -> dict[str, Any]:
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
        raise ModelRunError("run", first_line(exc), role) from exc
    return dict(zip(names, values, strict=True))


def _as_declared(array: np.ndarray, ort_type: str) -> np.ndarray:
    """A float feed in the float type the model declares (a --fp16-io candidate takes float16
    where the original takes float32: both are fed the same values)."""
    row = dtypes.by_name(ort_type)
    target = row.numpy if row is not None else None
    arr = np.asarray(array)
    if target is not None and target.kind == arr.dtype.kind == "f" and arr.dtype != target:
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
    rescued: int = 0  # outside atol + rtol * |r|, within onnxruntime's own rounding
    own_max: float | None = None  # onnxruntime's own largest move (None: not measured)
    excess_ulps: float = 0.0  # the worst bad element past its bound, in ulps of the scale
    movement: float | None = None  # max_abs / onnxruntime's own move (None: not measured)
    within_max: float = 0.0  # the largest error of the elements inside atol + rtol * |r|
    excused_max: float = 0.0  # the largest error of those onnxruntime's rounding excused
    low: float = math.inf  # the reference's smallest and largest finite values
    high: float = -math.inf


@dataclass
class _Tolerance:
    atol: float
    rtol: float
    min_cosine: float
    # True when the candidate legitimately changed a float output's type (--fp16-io): the
    # values are then compared in float64 instead of failing on the dtype.
    float_dtypes_may_differ: bool = False
    precision: str | None = None  # the candidate's: near-constant outputs at its resolution
    movement_k: float | None = None  # the movement rule's multiple (None: not applied)


@dataclass
class _Accumulator:
    """Worst case over samples for one output; `reason` set on a structural mismatch."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    kind: str = "f"  # numpy kind of the compared elements: exact unless "f" or "c"
    stats: list[_Stats] = field(default_factory=list)
    reason: str | None = None


_MISSING = object()


def compare_models(
    reference: ModelSource,
    candidate: ModelSource,
    feeds_list: Sequence[Feeds],
    atol: float = FP32.atol,
    rtol: float = FP32.rtol,
    min_cosine: float = FP32.min_cosine,
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
    expected: Sequence[Mapping[str, Any]],
    actual: Sequence[Mapping[str, Any]],
    atol: float = FP32.atol,
    rtol: float = FP32.rtol,
    min_cosine: float = FP32.min_cosine,
    float_dtypes_may_differ: bool = False,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    own: Sequence[Mapping[str, Any]] | None = None,
    precision: str | None = None,
    movement_k: float | None = MOVEMENT_K,
) -> ValidationReport:
    """Compare outputs already computed (one name -> value dict per sample), by the rules above.

    `tolerances` maps an output name to its own (atol, rtol); `own` holds, per sample, the
    reference's outputs with onnxruntime's optimizations on (the rounding floor);
    `precision` is the candidate's (its type's resolution judges near-constant outputs);
    `movement_k` the movement rule's multiple where `own` is given (None: not applied; nor to
    the outputs `tolerances` names: a tolerance the user states is the user's)."""
    tol = _Tolerance(atol, rtol, min_cosine, float_dtypes_may_differ, precision, movement_k)
    per_output = {
        name: _Tolerance(float(a), float(r), min_cosine, float_dtypes_may_differ, precision)
        for name, (a, r) in (tolerances or {}).items()
    }
    accumulators: dict[str, _Accumulator] = {}
    owns = list(own) if own is not None else [{} for _ in expected]
    for ref_out, cand_out, own_out in zip(expected, actual, owns, strict=True):
        _compare_sample(dict(ref_out), dict(cand_out), tol, accumulators, per_output, own_out)
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
    ref_out: dict[str, Any],
    cand_out: dict[str, Any],
    tol: _Tolerance,
    accumulators: dict[str, _Accumulator],
    per_output: Mapping[str, _Tolerance] | None = None,
    own_out: Mapping[str, Any] | None = None,
) -> None:
    for name in [*ref_out, *(n for n in cand_out if n not in ref_out)]:
        out_tol = (per_output or {}).get(name, tol)
        ref, cand = ref_out.get(name, _MISSING), cand_out.get(name, _MISSING)
        acc = accumulators.get(name)
        if acc is None:
            acc = accumulators[name] = _new_accumulator(name, ref, cand)
        if acc.reason is None:
            acc.reason = _structural_mismatch(ref, cand, tol.float_dtypes_may_differ)
        if acc.reason is None:
            r, c = _elements(ref, cand)
            acc.stats.append(_compare_arrays(r, c, out_tol, _own_array(own_out, name, r)))


def _own_array(own_out: Mapping[str, Any] | None, name: str, ref: np.ndarray) -> np.ndarray | None:
    """The reference's output `name` with onnxruntime's optimizations on, when it is a float
    tensor of the reference's shape."""
    own = (own_out or {}).get(name)
    if not isinstance(own, np.ndarray) or own.shape != ref.shape or own.dtype.kind != "f":
        return None
    return own


def _elements(ref: Any, cand: Any) -> tuple[np.ndarray, np.ndarray]:
    """The arrays to compare: the tensors, or a structured value's leaves joined."""
    if structured.is_tensor(ref) and structured.is_tensor(cand):
        return ref, cand
    return (
        structured.joined(structured.split(ref)[1]),
        structured.joined(structured.split(cand)[1]),
    )


def _new_accumulator(name: str, ref: Any, cand: Any) -> _Accumulator:
    shown = ref if ref is not _MISSING else cand
    if isinstance(shown, np.ndarray):
        shape = tuple(int(d) for d in shown.shape)
        return _Accumulator(name, shape, str(shown.dtype), shown.dtype.kind)
    kind = structured.leaf_kind(structured.split(shown)[1])
    return _Accumulator(name, None, structured.describe(shown), kind)


def _structural_mismatch(ref: Any, cand: Any, float_change_ok: bool = False) -> str | None:
    if cand is _MISSING:
        return "missing from the candidate"
    if ref is _MISSING:
        return "not an output of the reference"
    if not structured.is_tensor(ref) or not structured.is_tensor(cand):
        return structured.difference(
            structured.split(ref, float_change_ok)[0], structured.split(cand, float_change_ok)[0]
        )
    both_float = ref.dtype.kind == "f" and cand.dtype.kind == "f"
    if ref.dtype != cand.dtype and not (float_change_ok and both_float):
        return f"dtype {cand.dtype} differs from the reference's {ref.dtype}"
    if ref.shape != cand.shape:
        return f"shape {list(cand.shape)} differs from the reference's {list(ref.shape)}"
    return None


def _compare_arrays(
    ref: np.ndarray, cand: np.ndarray, tol: _Tolerance, own: np.ndarray | None = None
) -> _Stats:
    if ref.size == 0:
        return _Stats()
    if ref.dtype.kind in "fc":
        return _compare_floats(ref, cand, tol, own)
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


def _compare_floats(
    ref: np.ndarray, cand: np.ndarray, tol: _Tolerance, own: np.ndarray | None = None
) -> _Stats:
    r = ref.astype(np.complex128 if ref.dtype.kind == "c" else np.float64).ravel()
    c = cand.astype(r.dtype).ravel()
    finite = np.isfinite(r) & np.isfinite(c)
    same_nonfinite = (np.isnan(r) & np.isnan(c)) | (np.isinf(r) & (r == c))
    mismatched = int(np.count_nonzero(~(finite | same_nonfinite)))
    own_max = _own_max(r, own)
    r, c = r[finite], c[finite]
    diff = np.abs(c - r)
    with np.errstate(invalid="ignore"):  # rtol inf times |r| = 0 is NaN: not out of tolerance
        outside = diff > tol.atol + tol.rtol * np.abs(r)
    floor = _rounding_floor(own_max, r)
    rescued = int(np.count_nonzero(outside & (diff <= floor))) if floor else 0
    excess = _excess_ulps(diff, r, outside & (diff > floor), tol, ref.dtype)
    excused = outside & (diff <= floor) if floor else None
    worst = math.inf if mismatched else 0.0
    moved = _movement(float(diff.max(initial=0.0)), own_max, r)
    return _Stats(
        max_abs=max(float(diff.max(initial=0.0)), worst),
        max_rel=max(_max_rel(diff, r), worst),
        cosine=_cosine(r, c),
        bad=int(np.count_nonzero(outside)) - rescued + mismatched,
        total=ref.size,
        rescued=rescued,
        own_max=own_max,
        excess_ulps=excess,
        movement=moved,
        within_max=float(diff[~outside].max(initial=0.0)),
        excused_max=float(diff[excused].max(initial=0.0)) if excused is not None else 0.0,
        low=float(r.real.min(initial=math.inf)),
        high=float(r.real.max(initial=-math.inf)),
    )


def _excess_ulps(
    diff: np.ndarray, r: np.ndarray, bad: np.ndarray, tol: _Tolerance, dtype: np.dtype
) -> float:
    """How far the worst `bad` element is past atol + rtol * |r|, in units in the last place
    (of `dtype`) of the output's largest magnitude."""
    if not bad.any() or dtype.kind != "f":
        return 0.0 if not bad.any() else math.inf
    past = float((diff[bad] - (tol.atol + tol.rtol * np.abs(r[bad]))).max())
    scale = float(np.abs(r).max())
    ulp = float(np.spacing(dtype.type(scale))) if math.isfinite(scale) else math.inf
    return past / ulp if ulp > 0 else math.inf


def _own_max(r: np.ndarray, own: np.ndarray | None) -> float | None:
    """The largest |own - r| over the elements finite in both (None without `own`)."""
    if own is None or r.dtype.kind != "f":
        return None
    o = own.astype(np.float64).ravel()
    both = np.isfinite(r) & np.isfinite(o)
    return float(np.abs(o[both] - r[both]).max(initial=0.0))


def movement_floor(magnitude: float) -> float:
    """The least movement the rule divides by: MOVEMENT_FLOOR_ULPS ulps of fp32 at the
    output's largest magnitude (an output onnxruntime does not move at all still rounds)."""
    if not math.isfinite(magnitude):
        return math.inf
    return MOVEMENT_FLOOR_ULPS * float(np.spacing(np.float32(magnitude)))


def _movement(err: float, own_max: float | None, r: np.ndarray) -> float | None:
    """err / onnxruntime's own move (at least the floor); None where the move was not measured
    or is more than rounding (module docstring)."""
    if own_max is None:
        return None
    magnitude = float(np.abs(r).max(initial=0.0)) if r.size else 0.0
    if own_max > RUNTIME_ROUNDING_SHARE * magnitude and own_max > 0:
        return None
    bound = max(own_max, movement_floor(magnitude))
    return err / bound if bound > 0 else (0.0 if err == 0 else math.inf)


def _rounding_floor(own_max: float | None, r: np.ndarray) -> float:
    """How far the candidate may stray on onnxruntime's own rounding (module docstring): 0 where
    it was not measured or onnxruntime's move is more than rounding."""
    if not own_max:
        return 0.0
    if own_max > RUNTIME_ROUNDING_SHARE * float(np.abs(r).max(initial=0.0)):
        return 0.0
    return RUNTIME_ROUNDING_MULTIPLE * own_max


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
            acc.name, acc.shape, acc.dtype, None, None, None, None, False, acc.reason, "structure"
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
        runtime_rounding=max((s.own_max for s in acc.stats if s.own_max is not None), default=None),
    )
    metrics.near_constant = acc.kind == "f" and total > 1 and _near_constant(acc.stats)
    metrics.reason, metrics.decided_by = _verdict(metrics, bad, total, tol, acc.kind)
    if metrics.reason is not None and metrics.near_constant:
        _within_resolution(metrics, acc.stats, tol)
    _judge_movement(metrics, acc.stats, tol)
    _say_rounding(metrics, sum(s.rescued for s in acc.stats), total, tol)
    if metrics.decided_by == "runtime-rounding":
        metrics.within_tol_max_abs = max(s.within_max for s in acc.stats)
        metrics.excused_max_abs = max(s.excused_max for s in acc.stats)
        metrics.note = (
            f"{metrics.note}: max abs {metrics.excused_max_abs:.3g} on the excused elements, "
            f"{metrics.within_tol_max_abs:.3g} on those within tolerance"
        )
    if metrics.decided_by == "elementwise" and acc.kind == "f":
        metrics.excess_ulps = max(s.excess_ulps for s in acc.stats)
        metrics.rounding_only = _only_rounding(metrics)
    metrics.passed = metrics.reason is None
    return metrics


def _judge_movement(m: OutputMetrics, stats: list[_Stats], tol: _Tolerance) -> None:
    """The movement rule (module docstring): an fp32 output that passed the table fails when
    its error is more than `movement_k` times onnxruntime's own move."""
    moves = [s.movement for s in stats if s.movement is not None]
    if not moves or not math.isfinite(tol.atol):  # reduced precisions: not rounding-bound
        return
    m.movement_ratio = max(moves)
    k = tol.movement_k
    if k is None or m.reason is not None or not m.movement_ratio > k:
        return
    m.reason = (
        f"max abs {m.max_abs:.3g} is {m.movement_ratio:.3g}x what onnxruntime's own optimizer "
        f"moves this output by ({m.runtime_rounding:.2g}; more than {k:g}x is not rounding): "
        "within the fixed tolerance, but a real change"
    )
    m.decided_by = "runtime-movement"


def _within_resolution(m: OutputMetrics, stats: list[_Stats], tol: _Tolerance) -> None:
    """A near-constant output of a reduced-precision build passes within its type's
    resolution at the output's magnitude (module docstring)."""
    magnitude = max(max(abs(s.low), abs(s.high)) for s in stats)
    bound = resolution(tol.precision, magnitude) if math.isfinite(magnitude) else None
    if bound is None or m.max_abs is None or not m.max_abs <= bound:
        return
    m.reason, m.decided_by = None, "resolution"
    m.note = (
        f"near-constant (values up to {magnitude:.3g}): judged at {tol.precision}'s resolution, "
        f"max abs {m.max_abs:.3g} within {bound:.3g}, not by the cosine ({m.cosine:.3g})"
    )


def degenerate(values: np.ndarray) -> bool:
    """A float output of more than one element that is near-constant (module docstring)."""
    arr = np.asarray(values)
    if arr.dtype.kind != "f" or arr.size <= 1:
        return False
    finite = arr[np.isfinite(arr)].astype(np.float64)
    if finite.size == 0:
        return False
    low, high = float(finite.min()), float(finite.max())
    return high - low <= FP32.atol + FP32.rtol * max(abs(low), abs(high))


def _near_constant(stats: list[_Stats]) -> bool:
    """The reference's values over all samples span no more than the fp32 bound at their
    largest magnitude."""
    low, high = min(s.low for s in stats), max(s.high for s in stats)
    if not low <= high:
        return False
    return high - low <= FP32.atol + FP32.rtol * max(abs(low), abs(high))


def _only_rounding(m: OutputMetrics) -> bool:
    """A failure on elements just past the bound at a cosine of 1 (module docstring)."""
    assert m.excess_ulps is not None
    finite = m.max_abs is not None and math.isfinite(m.max_abs)
    return finite and m.excess_ulps <= ROUNDING_ULPS and (m.cosine or 0.0) >= COSINE_ONE


def _say_rounding(m: OutputMetrics, rescued: int, total: int, tol: _Tolerance) -> None:
    """Where onnxruntime's own rounding was measured: the note when it decided, the figure in
    the reason of a failure."""
    if m.runtime_rounding is None:
        return
    moves = f"optimizer moves this output by {m.runtime_rounding:.2g}"
    if m.reason is not None and m.runtime_rounding == 0.0:
        m.reason += "; onnxruntime's own optimizer does not move this output"
    elif m.reason is not None:
        m.reason += f"; onnxruntime's own {moves}"
    elif rescued:
        m.decided_by = "runtime-rounding"
        m.note = (
            f"within onnxruntime's own rounding: its {moves} ({rescued} of {total} elements "
            f"outside atol {tol.atol:g}, rtol {tol.rtol:g}; none beyond "
            f"{RUNTIME_ROUNDING_MULTIPLE:g}x that)"
        )


def _verdict(
    m: OutputMetrics, bad: int, total: int, tol: _Tolerance, kind: str
) -> tuple[str | None, str]:
    """(the failure, or None) and the criterion that decided (module docstring)."""
    exact = kind not in "fc"
    if bad:
        reason = (
            f"{bad} of {total} elements out of tolerance (atol {tol.atol:g}, rtol {tol.rtol:g}); "
            f"max_abs {m.max_abs:.3g}"
        )
        return reason, "exact" if exact else "elementwise"
    if exact:
        return None, "exact"
    assert m.max_abs is not None and m.cosine is not None
    if math.isfinite(tol.atol) and m.max_abs <= tol.atol:
        return None, "atol"  # within atol everywhere: the cosine of tiny values is noise
    if not (m.cosine >= tol.min_cosine):  # NaN cosine fails too
        return f"cosine {format_below(m.cosine, tol.min_cosine)} below {tol.min_cosine}", "cosine"
    bounded = math.isfinite(tol.atol) or math.isfinite(tol.rtol)
    return None, "elementwise+cosine" if bounded else "cosine"


def _log_report(report: ValidationReport) -> None:
    for m in report.failures():
        logger.warning("output %r failed: %s", m.name, m.reason)
    logger.info(
        "validation %s over %d sample(s), %d output(s)",
        "passed" if report.passed else "FAILED",
        report.samples,
        len(report.outputs),
    )
