"""`validate`: a candidate against the original, at every shape profile, in every body.

1. The original runs on the inputs of `infercc.check.profiles`: the first profile (samples,
   or generated inputs; other sizes and values when the default ones fail on the original),
   and a second shape profile whenever an input has a symbolic dimension.
2. The candidate runs on the same inputs, instrumented to say which If/Loop/Scan bodies ran
   (`infercc.check.coverage`). A candidate onnxruntime cannot load or run fails validation
   (`ValidationReport.error`): for `optimize` that model is infercc's own output, so it is
   infercc's failure, never bad input.
3. Outputs are compared by `infercc.check.compare`, over all samples and per profile; a
   rewritten body the inputs never ran is reported, and fails under `strict_coverage`.
4. For an fp32 candidate with elements outside the table's tolerance, the original runs
   once more, with onnxruntime's optimizations at their default level, and the outputs are
   compared again with what onnxruntime itself does to the model as the rounding floor
   (`infercc.check.compare`). A passing build never pays for that second run.
5. A near-constant output (`OutputMetrics.near_constant`) shows its cosine as n/a (None) unless
   the cosine decided its failure, and its note says that validation is weak for it: on
   generated inputs, "give --data".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from infercc.check import coverage as cov
from infercc.check.compare import (
    ModelRunError,
    ModelSource,
    ValidationReport,
    _log_report,
    compare_outputs,
    ort_cpu,
    run_model,
)
from infercc.check.profiles import ORIGINAL, FeedPlan, plan_feeds, reference_graph
from infercc.check.tolerances import model_precision
from infercc.data.samples import SampleData
from infercc.errors import InferccError
from infercc.precisions import FP32, MOVEMENT_K

logger = logging.getLogger(__name__)

Outputs = list[dict[str, Any]]
Rewritten = Mapping[cov.Key, Sequence[str]]
Floor = Callable[[], Outputs | None]


def validate(
    reference: ModelSource,
    candidate: ModelSource,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: SampleData | None = None,
    seed: int = 0,
    atol: float = FP32.atol,
    rtol: float = FP32.rtol,
    min_cosine: float = FP32.min_cosine,
    float_dtypes_may_differ: bool = False,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    *,
    second_shapes: Mapping[str, tuple[int, ...]] | None = None,
    rewritten: Rewritten | None = None,
    strict_coverage: bool = False,
    skip_hint: str | None = "--no-validate",
    role: str = "the optimized model",
    assumptions: Sequence[str] = (),
    fixed_shapes: Mapping[str, tuple[int, ...]] | None = None,
    movement_k: float | None = MOVEMENT_K,
) -> ValidationReport:
    """Compare `candidate` with `reference` (module docstring).

    Samples come from `data`, else are generated at the shapes `shapes` pins (and, for the
    second profile, `second_shapes`). Each model is fed only what it declares, in the float
    type it declares; `float_dtypes_may_differ` accepts a float output whose type the
    candidate changed on purpose (float16 I/O). `rewritten` names the bodies the build
    rewrote (`infercc.check.coverage.BodyTracker.finish`); None compares the bodies with the
    reference's. `skip_hint` is the flag that skips validation (named when the original fails
    on the generated inputs); `role` names the candidate in messages; `movement_k` is the
    movement rule's multiple (`infercc.check.compare`; None where the user set atol or rtol).
    """
    model, constants = reference_graph(reference)
    plan = plan_feeds(
        reference,
        model,
        shapes,
        data,
        seed,
        second_shapes,
        constants,
        skip_hint,
        assumptions,
        fixed_shapes,
    )
    skeleton = _skeleton(candidate)
    if rewritten is None:
        rewritten = cov.rewritten_against(model, skeleton)
    tol = {"atol": atol, "rtol": rtol, "min_cosine": min_cosine}
    try:
        actual, coverage = run_with_coverage(candidate, plan.feeds, role, rewritten)
    except ModelRunError as exc:
        return failed_run(plan, exc, tol)
    coverage.strict = strict_coverage
    precision = model_precision(skeleton)
    floor = runtime_floor(reference, plan) if precision == "fp32" else None
    return judge(
        plan,
        actual,
        tol,
        float_dtypes_may_differ,
        tolerances,
        coverage,
        floor,
        precision,
        movement_k,
        ort_cpu(),
    )


def runtime_floor(reference: ModelSource, plan: FeedPlan) -> Floor:
    """What the reference computes on `plan.feeds` with onnxruntime's optimizations at their
    default level, when asked (None where onnxruntime cannot optimize or run it so)."""

    def own() -> Outputs | None:
        role = f"{ORIGINAL} with onnxruntime's optimizations on"
        try:
            return run_model(reference, plan.feeds, optimize=True, role=role)
        except ModelRunError as exc:
            logger.warning("no rounding floor: %s", exc.message)
            return None

    return own


def run_with_coverage(
    candidate: ModelSource,
    feeds: Sequence[Mapping[str, Any]],
    role: str,
    rewritten: Rewritten | None,
    run: Callable[[Sequence[Mapping[str, Any]]], Outputs] | None = None,
) -> tuple[Outputs, cov.CoverageReport]:
    """The candidate's outputs on `feeds` and which of its bodies ran.

    `candidate` is a model onnxruntime runs; `run`, when given, computes the outputs instead
    (an artifact's own runner), and the model then runs instrumented only for the coverage."""
    skeleton = _skeleton(candidate)
    bodies = cov.proto_bodies(skeleton)
    if not bodies:
        outputs = run(feeds) if run is not None else run_model(candidate, feeds, role=role)
        return outputs, cov.report(bodies, {}, rewritten, False)
    instrumented, flags = cov.instrument(_full(candidate, skeleton))
    try:
        flagged = run_model(instrumented, feeds, role=role)
    except ModelRunError as exc:
        outputs = run(feeds) if run is not None else run_model(candidate, feeds, role=role)
        error = f"the instrumented copy of {role} did not run: {exc.detail}"
        logger.warning("%s", error)
        return outputs, cov.report(bodies, None, rewritten, False, error)
    ran = cov.executed(flags, flagged)
    outputs = run(feeds) if run is not None else cov.strip(flags, flagged)
    return outputs, cov.report(bodies, ran, rewritten, False)


def judge(
    plan: FeedPlan,
    actual: Outputs,
    tol: Mapping[str, float],
    float_dtypes_may_differ: bool = False,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    coverage: cov.CoverageReport | None = None,
    floor: Floor | None = None,
    precision: str | None = None,
    movement_k: float | None = MOVEMENT_K,
    ran_on: str | None = None,
) -> ValidationReport:
    """The verdict on `actual` (the candidate's outputs on `plan.feeds`), overall and per
    profile, with the coverage; `floor` gives the reference's outputs with onnxruntime's
    optimizations on, asked for only when an element is outside the tolerance; `precision`
    is the candidate's (`infercc.check.compare.compare_outputs`); `ran_on` names what ran
    the candidate."""
    expected = plan.expected
    options: dict[str, Any] = dict(
        float_dtypes_may_differ=float_dtypes_may_differ,
        tolerances=tolerances,
        precision=precision,
        movement_k=movement_k,
        **tol,
    )
    # fp32: onnxruntime's own move is the floor of the tolerance and the scale of the
    # movement rule (infercc.check.compare), so it is measured whenever a floor is offered
    own = floor() if floor is not None else None
    report = compare_outputs(expected, actual, own=own, **options)
    start = 0
    for profile in plan.profiles:
        end = start + len(profile.feeds)
        part = compare_outputs(
            expected[start:end],
            actual[start:end],
            own=own[start:end] if own is not None else None,
            **options,
        )
        report.profiles.append(profile.to_dict(part.passed))
        start = end
    _say_weak(report, plan)
    report.notes = list(plan.notes)
    report.coverage = coverage
    report.feeds = plan.feeds
    report.ran_on = ran_on
    if coverage is not None:
        if coverage.message() is not None:
            logger.info("%s", coverage.message())
        report.passed = report.passed and coverage.passed
    _log_report(report)
    return report


WEAK_GENERATED = "validation is weak on generated inputs for this output: give --data"
WEAK_DATA = "validation is weak for this output: it is near-constant on the samples given"


def _say_weak(report: ValidationReport, plan: FeedPlan) -> None:
    """Near-constant outputs: cosine n/a (unless it decided a failure) and the note."""
    given = any(p.source in ("data", "golden") for p in plan.profiles)
    for m in report.outputs.values():
        if not m.near_constant:
            continue
        if m.decided_by != "cosine":
            m.cosine = None
        weak = WEAK_DATA if given else WEAK_GENERATED
        m.note = f"{m.note}; {weak}" if m.note else weak


def failed_run(plan: FeedPlan, exc: ModelRunError, tol: Mapping[str, float]) -> ValidationReport:
    """The report of a candidate onnxruntime could not load or run: failed, with the error."""
    return ValidationReport(
        passed=False,
        outputs={},
        samples=len(plan.feeds),
        atol=tol["atol"],
        rtol=tol["rtol"],
        min_cosine=tol["min_cosine"],
        profiles=[p.to_dict(False) for p in plan.profiles],
        notes=list(plan.notes),
        error=exc.message,
        feeds=plan.feeds,
    )


def _skeleton(candidate: ModelSource) -> onnx.ModelProto:
    """The candidate's graph without main-graph weights (enough to find its bodies)."""
    if isinstance(candidate, onnx.ModelProto):
        return candidate
    if isinstance(candidate, bytes):
        return onnx.load_model_from_string(candidate)
    return reference_graph(candidate)[0]


def _full(candidate: ModelSource, skeleton: onnx.ModelProto) -> onnx.ModelProto:
    """The whole candidate, weights included (to run an instrumented copy of it)."""
    if isinstance(candidate, (onnx.ModelProto, bytes)):
        return skeleton
    try:
        return onnx.load(str(Path(candidate)))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InferccError(f"cannot read ONNX model {str(candidate)!r}: {exc}") from exc
