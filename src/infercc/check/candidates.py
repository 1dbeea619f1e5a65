"""The engine of `infercc validate`: check a candidate against a reference model or goldens.

The candidate is an optimized `.onnx` file (run on onnxruntime's CPU provider with its graph
optimizations off, as `infercc.check.compare` does) or an artifact directory (run through the
runner of the backend that built it, so what is checked is what will be deployed).

What it is compared with:

- `reference`: the original model, run on the same feeds (random, `--shape`, or `--data`);
- `golden`: a directory written earlier by `save_golden` (`--save-golden DIR`): the inputs
  and the reference's outputs, so later runs need no reference model. Layout:
  `golden.json` (schema `infercc.golden/1`: input and output names, sample count, the
  reference's path and sha256), `inputs/sample_NNN.npz` (keyed by input name, so the
  directory is also a valid `--data`) and `outputs/sample_NNN.npz` (keyed by output name).

Default tolerances follow the candidate's precision: the artifact manifest's `precision`, or,
for a plain model, int8 when it holds QuantizeLinear/DequantizeLinear (or QLinear*) nodes,
fp16 when it holds float16 initializers or Casts to float16, else fp32. fp32: atol 1e-4,
rtol 1e-3, cosine >= 0.9999; fp16: cosine >= 0.999 only; int8: cosine >= 0.99 only. Options
given by the user win, and `tolerances` sets atol/rtol for named outputs. An artifact whose
manifest records the criterion it was accepted at (`calibrate --int4`,
`infercc.check.tolerances`) is judged by it unless `min_cosine` is given. An fp32 candidate
checked against a reference also passes elements within onnxruntime's own rounding of the
reference (`infercc.check.compare`); goldens carry no reference to measure that on.

Against a reference, the samples are those of `infercc.check.profiles`: a second shape
profile whenever an input has a symbolic dimension, and other sizes and values when the
reference fails on the default ones. The report says whether the samples executed each
If/Loop body of the candidate (`infercc.check.coverage`; a body is rewritten when the
reference has no identical one), and `strict_coverage` fails a rewritten body that never ran.
A candidate onnxruntime (or its backend) cannot load or run fails validation (exit 1), with
the error in the report; except a plain model the user handed in (`given_by_user`, as
`infercc validate` does): one that cannot be read, whose external data leaves its folder, or
that onnxruntime refuses to load is bad input (exit 2, one line). One that loads and then fails
stays a failure.

With `bisect=True` a failing candidate is handed to `infercc.check.bisection`, which rebuilds
it from the reference and names the pass, the rewrite and the node where outputs first diverge;
not when only rounding differs (`ValidationReport.rounding_only`), which the report says.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.check import coverage as cov
from infercc.check.compare import ModelRunError, ValidationReport, ort_cpu, run_model
from infercc.check.goldens import Feeds, Outputs, load_golden, save_golden
from infercc.check.profiles import FeedPlan, Profile, plan_feeds, reference_graph
from infercc.check.tolerances import (
    artifact_criterion,
    default_tolerance,
    describe_criterion,
    detect_precision,
)
from infercc.check.validation import Floor, failed_run, judge, run_with_coverage, runtime_floor
from infercc.data.feeds import make_inputs
from infercc.data.samples import SampleData, load_samples
from infercc.data.signature import (
    declared_dims,
    input_dims,
    input_dtype,
    real_inputs,
    warn_shape_conflicts,
)
from infercc.errors import InferccError
from infercc.precisions import MOVEMENT_K
from infercc.runtime.artifact import candidate_model_path, open_source, read_skeleton
from infercc.runtime.ort_support import custom_op_libraries
from infercc.runtime.registry import load_runner
from infercc.util import first_line

# --------------------------------------------------------------------------- report


@dataclass
class CandidateReport:
    """What `validate_candidate` found (`to_dict()` is the `--json` form)."""

    candidate: str | None
    reference: str | None
    golden: str | None
    precision: str
    validation: ValidationReport | None
    saved_golden: str | None = None
    bisect: Any = None  # infercc.check.bisection.BisectReport
    criterion: str | None = None  # the manifest's criterion applied, in words

    @property
    def passed(self) -> bool:
        return self.validation is None or self.validation.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "reference": self.reference,
            "golden": self.golden,
            "precision": self.precision,
            "passed": bool(self.passed),
            "validation": self.validation.to_dict() if self.validation else None,
            "saved_golden": self.saved_golden,
            "bisect": self.bisect.to_dict() if self.bisect is not None else None,
            "criterion": self.criterion,
        }


# --------------------------------------------------------------------------- running


def run_candidate(candidate: str | os.PathLike[str], feeds_list: Feeds) -> Outputs:
    """Outputs of the candidate per feed: an artifact through its backend's runner, a plain
    model on onnxruntime's CPU provider without graph optimizations."""
    path = Path(candidate)
    if not path.is_dir():
        return run_model(path, feeds_list, role=CANDIDATE)
    source = open_source(path)
    runner, skeleton = load_runner(source), source.skeleton()
    dtypes = {vi.name: input_dtype(vi) for vi in real_inputs(skeleton)}
    outputs = []
    for feeds in feeds_list:
        given = {n: _as_dtype(feeds[n], dtypes.get(n)) for n in runner.input_names if n in feeds}
        values = _run_runner(runner, given)
        outputs.append(dict(zip(runner.output_names, values, strict=True)))
    return outputs


def _run_runner(runner: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return runner.run(feeds)
    except InferccError:
        raise
    except Exception as exc:  # backends raise their own exception types
        raise ModelRunError("run", first_line(exc), "the artifact's runner") from exc


def _as_dtype(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """A float feed in the float type the model declares (fp16 I/O takes the same values)."""
    arr = np.asarray(array)
    if dtype is not None and dtype.kind == "f" and arr.dtype.kind == "f" and arr.dtype != dtype:
        return arr.astype(dtype)
    return arr


# --------------------------------------------------------------------------- entry point

CANDIDATE = "the candidate"


def reference_feeds(
    reference: str | os.PathLike[str],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: SampleData | None = None,
    seed: int = 0,
) -> Feeds:
    """Feeds for the reference: the samples in `data`, else one random feed at the first
    profile's default shapes (no run; `reference_feeds_plan` runs it and finds profiles)."""
    model = read_skeleton(Path(reference))
    if data is not None:
        return load_samples(data, model)
    return [make_inputs(model, shapes, seed)]


def validate_candidate(
    candidate: str | os.PathLike[str] | None,
    reference: str | os.PathLike[str] | None = None,
    *,
    golden: str | os.PathLike[str] | None = None,
    save_golden_to: str | os.PathLike[str] | None = None,
    data: SampleData | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    bisect: bool = False,
    target: str | None = None,
    on_step: Callable[[str], None] | None = None,
    strict_coverage: bool = False,
    second_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ort_custom_op_libs: Sequence[str | os.PathLike[str]] = (),
    given_by_user: bool = False,
) -> CandidateReport:
    """Validate `candidate` against `reference` or `golden` (see the module docstring).

    `candidate=None` with `save_golden_to` only writes the goldens of `reference`; `target`
    is the target the candidate was built for (for `bisect`); `on_step(what)` is told each
    step; `strict_coverage` fails a rewritten If/Loop body the samples never ran;
    `second_shapes` pins inputs of the second shape profile (a `--shape` range's MAX);
    `ort_custom_op_libs` are registered in every onnxruntime session (`--ort-custom-op-lib`);
    `given_by_user`: a plain-model candidate that cannot be read or loaded is bad input (see
    the module docstring), not a failed validation.
    """
    with custom_op_libraries(ort_custom_op_libs):
        step = on_step or (lambda _what: None)
        _check_sources(candidate, reference, golden, save_golden_to, data, bisect, target)
        if bisect and target is not None and candidate is not None:
            from infercc.check.bisection import config_for_candidate

            config_for_candidate(candidate, target)  # refuses a --target the artifact records
        skeleton = _candidate_skeleton(candidate) if candidate is not None else None
        if given_by_user and skeleton is not None and candidate is not None:
            if not Path(candidate).is_dir():
                check_external_locations(skeleton, Path(candidate))
        step("running the reference")
        if golden is not None:
            feeds_list, expected, _meta = load_golden(golden)
            plan = FeedPlan([Profile("golden", list(feeds_list), list(expected))])
        else:
            plan = reference_feeds_plan(reference, shapes, data, seed, second_shapes, skeleton)
        saved = None
        if save_golden_to is not None:
            saved = str(save_golden(save_golden_to, plan.feeds, plan.expected, reference))
        if candidate is None:
            return CandidateReport(None, _str(reference), _str(golden), "fp32", None, saved)
        if skeleton is not None:
            _check_same_inputs(skeleton, plan.feeds[0] if plan.feeds else {})
        precision = detect_precision(candidate, skeleton)
        criterion = artifact_criterion(candidate) if min_cosine is None else None
        if criterion is not None:
            min_cosine = float(criterion["min_cosine"])
        tol = default_tolerance(precision, atol, rtol, min_cosine)
        step("running the candidate")
        fp32 = precision == "fp32"
        floor = runtime_floor(reference, plan) if fp32 and reference is not None else None
        report = _judge_candidate(
            candidate,
            reference,
            skeleton,
            plan,
            tol,
            not fp32,
            tolerances,
            strict_coverage,
            floor,
            given_by_user,
            precision,
            None if atol is not None or rtol is not None else MOVEMENT_K,
        )
        result = CandidateReport(
            _str(candidate), _str(reference), _str(golden), precision, report, saved
        )
        result.criterion = describe_criterion(criterion) if criterion is not None else None
        if bisect and not report.outputs_passed and report.rounding_only() is None:
            step("bisecting the pipeline")
            result.bisect = _bisect(candidate, reference, plan.feeds, tol, tolerances, target)
        return result


def reference_feeds_plan(
    reference: str | os.PathLike[str],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: SampleData | None = None,
    seed: int = 0,
    second_shapes: Mapping[str, tuple[int, ...]] | None = None,
    candidate: onnx.ModelProto | None = None,
) -> FeedPlan:
    """The profiles and the reference's outputs (`infercc.check.profiles.plan_feeds`); inputs
    the `candidate` skeleton fixes (it accepts no other shape) are validated at that shape."""
    model, constants = reference_graph(Path(reference))
    fixed = _fixed_inputs(candidate, model)
    plan = plan_feeds(
        reference,
        model,
        {**fixed, **dict(shapes or {})},
        data,
        seed,
        second_shapes,
        constants,
        skip_hint=None,
        fixed_shapes=fixed,
    )
    warn_shape_conflicts(input_dims(model), shapes, reference)  # pins the plan took
    return plan


def _judge_candidate(
    candidate: str | os.PathLike[str],
    reference: str | os.PathLike[str] | None,
    skeleton: onnx.ModelProto | None,
    plan: FeedPlan,
    tol: dict[str, float],
    float_dtypes_may_differ: bool,
    tolerances: Mapping[str, tuple[float, float]] | None,
    strict_coverage: bool,
    floor: Floor | None = None,
    given_by_user: bool = False,
    precision: str | None = None,
    movement_k: float | None = MOVEMENT_K,
) -> ValidationReport:
    model_path = candidate_model_path(candidate)
    rewritten = None
    if reference is not None and skeleton is not None:
        rewritten = cov.rewritten_against(read_skeleton(Path(reference)), skeleton)
    path = Path(candidate)
    runner = (lambda feeds: run_candidate(path, feeds)) if path.is_dir() else None
    try:
        if not model_path.is_file():  # an artifact without its model: the runner says why
            actual, coverage = run_candidate(path, plan.feeds), None
        else:
            actual, coverage = run_with_coverage(
                model_path, plan.feeds, CANDIDATE, rewritten, runner
            )
    except ModelRunError as exc:
        if given_by_user and exc.stage == "load" and not path.is_dir():
            raise InferccError(
                f"onnxruntime cannot load the candidate {str(path)!r}: {exc.detail}",
                "check it with onnx.checker.check_model(path, full_check=True): validate "
                "judges a model that loads",
            ) from exc
        return failed_run(plan, exc, tol)
    if coverage is not None:
        coverage.strict = strict_coverage
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
        f"its {open_source(path).backend} runner" if path.is_dir() else ort_cpu(),
    )


def check_external_locations(skeleton: onnx.ModelProto, model_path: Path) -> None:
    """Refuse (exit 2) external data that leaves the model's folder or is missing: the check
    `optimize` runs on its input, before any runtime opens the file."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    from infercc.ir.tensor import resolve_external_path

    for tensor in _get_all_tensors(skeleton):
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            resolve_external_path(model_path.parent, location, tensor.name)


def _candidate_skeleton(candidate: str | os.PathLike[str]) -> onnx.ModelProto | None:
    """The candidate model's skeleton; None when its file is missing (run_candidate then
    names what is missing)."""
    model_path = candidate_model_path(candidate)
    return read_skeleton(model_path) if model_path.is_file() else None


def _fixed_inputs(
    skeleton: onnx.ModelProto | None, reference: onnx.ModelProto
) -> dict[str, tuple[int, ...]]:
    """Inputs the candidate declares with every dimension fixed where the reference's has a
    symbolic one (`optimize --static-shapes`): validated at that shape only."""
    if skeleton is None:
        return {}
    symbolic = {
        vi.name
        for vi in real_inputs(reference)
        if any(not isinstance(d, int) for d in declared_dims(vi) or [])
    }
    fixed = {}
    for vi in real_inputs(skeleton):
        dims = declared_dims(vi)
        if vi.name in symbolic and dims and all(isinstance(d, int) and d > 0 for d in dims):
            fixed[vi.name] = tuple(int(d) for d in dims)
    return fixed


def _check_same_inputs(skeleton: onnx.ModelProto, feeds: Mapping[str, Any]) -> None:
    """The candidate must take the inputs the reference (or the goldens) provide."""
    names = [vi.name for vi in real_inputs(skeleton)]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InferccError(
            f"the candidate takes input(s) {', '.join(map(repr, missing))} that the reference "
            f"does not provide (it has {', '.join(map(repr, feeds)) or 'none'})",
            "validate a model against the original it was built from",
        )


def _check_sources(
    candidate: Any,
    reference: Any,
    golden: Any,
    save_to: Any,
    data: Any,
    bisect: bool,
    target: str | None,
) -> None:
    if golden is not None and save_to is not None:
        raise InferccError("--golden and --save-golden exclude each other", "give one of them")
    if golden is not None and data is not None:
        raise InferccError(
            "--golden and --data exclude each other", "the golden directory holds the inputs"
        )
    if golden is None and reference is None:
        raise InferccError(
            "nothing to compare the candidate with",
            "give --reference ORIGINAL.onnx or --golden DIR",
        )
    if candidate is None and save_to is None:
        raise InferccError("no candidate to validate", "give CANDIDATE, or --save-golden DIR")
    if bisect and reference is None:
        raise InferccError(
            "--bisect rebuilds the candidate from the reference", "give --reference ORIGINAL.onnx"
        )
    if target is not None and not bisect:
        raise InferccError("--target has no effect without --bisect", "add --bisect, or drop it")


def _bisect(
    candidate: str | os.PathLike[str],
    reference: str | os.PathLike[str],
    feeds_list: Feeds,
    tol: dict[str, float],
    tolerances: Mapping[str, tuple[float, float]] | None,
    target: str | None,
) -> Any:
    from infercc.check.bisection import bisect, config_for_candidate

    config = config_for_candidate(candidate, target)
    return bisect(
        reference,
        feeds_list[:1],
        config,
        tolerance=tol,
        tolerances=tolerances,
        candidate=candidate_model_path(candidate),
    )


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
