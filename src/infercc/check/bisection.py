"""Find the pass, the rewrite and the node that broke an optimized model.

When a candidate built by infercc fails validation, `bisect` rebuilds it from the reference
with the same pipeline and options (an artifact's `manifest["build"]`, the `BuildConfig` it was
built with; a plain .onnx file records none, so it is rebuilt with the default build at its
precision), and narrows the failure down in three steps:

1. **Which pass.** The full pipeline is rebuilt and validated first (if it passes, the failure
   does not reproduce: the candidate was built with other options or another version). Then
   each pass is disabled alone; a pass whose absence makes validation pass is a suspect. With
   one suspect that is the guilty pass. With several (a pass that sets up a pattern and the
   pass that rewrites it both qualify) the last in pipeline order is named, since enabling
   passes come first. With none (two faults that each break the model), the pipeline is
   enabled one pass at a time in order, and the pass whose addition first fails is named.
2. **Which rewrite.** A pass that asks `ctx.allow_rewrite(node)` before each rewrite (see
   `infercc.passes.manager`) has its rewrites counted; a binary search over
   `ctx.rewrite_limits[pass]` finds the smallest number of rewrites that fails, and the last
   of those names the guilty rewrite and its node. A pass without that hook is bisected over
   its runs in the fixpoint loop (`ctx.run_limits`) instead, which is coarser.
3. **Where outputs first diverge.** Intermediate tensors are compared by name between a
   reference and a candidate: every tensor whose name exists in both becomes an extra output,
   both run on the first sample, and the candidate's nodes are walked in topological order;
   the first node with an output outside tolerance is where outputs diverge, and the
   reference's producer of that tensor is named too (a Relu turned into a Sigmoid shows as
   Sigmoid in the candidate, Relu in the reference). When the failure reproduced, the
   candidate is the smallest failing rebuild and the reference the largest passing one (one
   rewrite, or one run, fewer): the two differ by the guilty rewrite only, so a name means the
   same tensor in both. (Against the original model a name can mislead: Conv+BN fused into
   one Conv keeps the Conv's output name for what was the BatchNormalization's value.) When
   it did not reproduce, the original model and the candidate itself are compared.

Every rebuild is validated with the tolerance of the original check, on the first sample only,
with onnxruntime's own rounding as the floor of an fp32 build as validation has it
(`infercc.check.compare`): a rebuild that differs from the reference by rounding alone passes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.check.compare import compare_outputs, run_model
from infercc.config import BuildConfig
from infercc.errors import InferccError
from infercc.ir import export_model, load_model
from infercc.passes.manager import PassContext, run_passes
from infercc.passes.pipelines import optimize_stages
from infercc.util import first_line

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]


# --------------------------------------------------------------------------- configuration


@dataclass
class PipelineConfig:
    """How a candidate was built, enough to rebuild it from the reference: its `BuildConfig`
    (an artifact's `manifest["build"]`), and where that came from."""

    build: BuildConfig = field(default_factory=BuildConfig)
    stages: list[tuple[str, ...]] | None = None  # default: the build's pipelines
    source: str = "defaults"  # "manifest": the artifact recorded its build; "build": optimize's

    @property
    def precision(self) -> str:
        return self.build.precision

    def pipeline(self) -> list[tuple[str, ...]]:
        if self.stages is not None:
            return [tuple(s) for s in self.stages]
        return optimize_stages(self.build.precision)

    def pass_names(self) -> list[str]:
        """Every pass that runs, in pipeline order, once each."""
        names = dict.fromkeys(n for stage in self.pipeline() for n in stage)
        return [n for n in names if n not in self.build.disable_passes]


def config_for_candidate(
    candidate: str | os.PathLike[str], target: str | None = None
) -> PipelineConfig:
    """How a candidate was built: an artifact's recorded `manifest["build"]`; for a plain model
    (which records nothing) or an artifact of an older infercc, the default build for `target`
    at the candidate's precision (nothing else is guessed)."""
    from infercc.check.tolerances import detect_precision

    path = Path(candidate)
    recorded = _recorded_build(path)
    if recorded is not None:
        if target is not None:
            raise InferccError(
                f"--target has no effect: the artifact records its build (target "
                f"{recorded.target})",
                "drop --target",
            )
        return PipelineConfig(recorded, source="manifest")
    build = BuildConfig(target=target or "cpu", precision=detect_precision(path))
    return PipelineConfig(build.resolve(artifact=not path.is_file()))


def _recorded_build(path: Path) -> BuildConfig | None:
    if not path.is_dir():
        return None
    from infercc.runtime.artifact import open_source

    data = (open_source(path).manifest or {}).get("build")
    return BuildConfig.from_dict(data) if isinstance(data, dict) else None


# --------------------------------------------------------------------------- report


@dataclass
class Divergence:
    """The first node of the candidate (in topological order) whose output is off."""

    node: str
    op_type: str
    tensor: str
    reference_node: str | None
    reference_op: str | None
    max_abs: float | None
    cosine: float | None
    reason: str | None
    position: int  # index of the node in the candidate's topological order

    def to_dict(self) -> dict[str, Any]:
        from infercc.util import json_float

        return {
            "node": self.node,
            "op_type": self.op_type,
            "tensor": self.tensor,
            "reference_node": self.reference_node,
            "reference_op": self.reference_op,
            "max_abs": json_float(self.max_abs),
            "cosine": json_float(self.cosine),
            "reason": self.reason,
            "position": self.position,
        }


@dataclass
class BisectReport:
    """The verdict of `bisect`; `message` says it in one line."""

    reproduced: bool
    guilty_pass: str | None = None
    suspects: list[str] = field(default_factory=list)
    granularity: str | None = None  # "rewrite" or "run": how the guilty pass was cut
    total: int | None = None  # rewrites (or runs) of the guilty pass in the full rebuild
    first_bad: int | None = None  # 1-based: the rewrite (or run) that breaks the outputs
    rewrite_node: str | None = None
    rewrite_op: str | None = None
    divergence: Divergence | None = None
    trials: int = 0
    message: str = ""
    build: dict[str, Any] | None = None  # the BuildConfig every rebuild used
    # "manifest": read from the artifact; "build": the optimize run's own; "defaults": nothing
    # recorded
    settings: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        return {
            "reproduced": self.reproduced,
            "guilty_pass": self.guilty_pass,
            "suspects": list(self.suspects),
            "granularity": self.granularity,
            "total": self.total,
            "first_bad": self.first_bad,
            "rewrite_node": self.rewrite_node,
            "rewrite_op": self.rewrite_op,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "trials": self.trials,
            "message": self.message,
            "build": self.build,
            "settings": self.settings,
        }


# --------------------------------------------------------------------------- rebuilding


@dataclass
class _Trial:
    """One rebuild: its model (None when the build failed) and whether it validated."""

    passed: bool
    model: onnx.ModelProto | None
    ctx: PassContext
    runs: dict[str, int]
    error: str | None = None


class _Bisector:
    """Rebuilds the reference under limits and judges each rebuild against `expected`."""

    def __init__(
        self,
        reference: Path,
        feeds: Sequence[Feeds],
        config: PipelineConfig,
        tolerance: Mapping[str, float],
        tolerances: Mapping[str, tuple[float, float]] | None,
    ):
        self.reference, self.feeds, self.config = reference, list(feeds), config
        self.tolerance, self.tolerances = dict(tolerance), dict(tolerances or {})
        self.expected = run_model(reference, self.feeds)
        self.own: list[dict[str, Any]] | None = None  # with onnxruntime's optimizations on
        self.trials = 0

    def build(
        self,
        disabled: Sequence[str] = (),
        rewrite_limits: Mapping[str, int] | None = None,
        run_limits: Mapping[str, int] | None = None,
    ) -> tuple[onnx.ModelProto, PassContext, dict[str, int]]:
        """The reference through the pipeline, with extra passes disabled and limits set."""
        from infercc.data.signature import shape_profile

        build = self.config.build
        ir = load_model(self.reference, freeze_initializers=build.freeze_initializers)
        if build.static_map:  # the model was built with these inputs fixed (--static-shapes)
            from infercc.ir.static_shapes import fix_input_shapes

            fix_input_shapes(ir, build.static_map)
        ctx = build.pass_context(shape_profile(ir, build.shape_pins))
        ctx.rewrite_limits = dict(rewrite_limits or {})
        ctx.run_limits = dict(run_limits or {})
        off = {*build.disable_passes, *disabled}
        runs: dict[str, int] = {}
        for stage in self.config.pipeline():
            report = run_passes(ir, ctx, stage, [n for n in stage if n in off])
            for name, st in report.passes.items():
                runs[name] = runs.get(name, 0) + st.runs
        return export_model(ir), ctx, runs

    def trial(self, **limits: Any) -> _Trial:
        self.trials += 1
        try:
            model, ctx, runs = self.build(**limits)
        except InferccError as exc:  # a pass that crashes under limits counts as broken
            log.info("bisect: rebuild failed: %s", exc.message)
            return _Trial(False, None, PassContext(), {}, exc.message)
        try:
            actual = run_model(model, self.feeds)
        except InferccError as exc:
            return _Trial(False, model, ctx, runs, exc.message)
        report = self.judge(actual)
        log.debug("bisect trial %d %s: %s", self.trials, limits, report.passed)
        return _Trial(report.passed, model, ctx, runs)

    def judge(self, actual: list[dict[str, Any]]) -> Any:
        """The verdict on a rebuild's outputs, as validation gives it (module docstring)."""
        options: dict[str, Any] = dict(
            float_dtypes_may_differ=True, tolerances=self.tolerances, **self.tolerance
        )
        report = compare_outputs(self.expected, actual, **options)
        elementwise = any(m.decided_by == "elementwise" for m in report.failures())
        if not elementwise or self.config.precision != "fp32":
            return report
        if self.own is None:
            self.own = run_model(self.reference, self.feeds, optimize=True)
        return compare_outputs(self.expected, actual, own=self.own, **options)


# --------------------------------------------------------------------------- bisecting


def bisect(
    reference: str | os.PathLike[str],
    feeds: Sequence[Feeds],
    config: PipelineConfig | None = None,
    *,
    tolerance: Mapping[str, float] | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    candidate: str | os.PathLike[str] | onnx.ModelProto | None = None,
) -> BisectReport:
    """Name the pass, rewrite and node that make the rebuilt candidate fail (module docstring).

    `feeds`: samples to judge with (the first is used for the intermediate comparison);
    `tolerance`: atol, rtol and min_cosine; `candidate`: the failing model, examined for the
    divergence when the failure does not reproduce.
    """
    from infercc.precisions import tolerance as default_tolerance

    config = config or PipelineConfig()
    tol = dict(tolerance or default_tolerance(config.precision).to_dict())
    if not feeds:
        raise InferccError(
            "bisect needs at least one sample", "pass --data or let infercc make one"
        )
    b = _Bisector(Path(reference), feeds, config, tol, tolerances)
    report = _narrow(b, candidate)
    report.build, report.settings = config.build.to_dict(), config.source
    return report


def _narrow(
    b: _Bisector, candidate: str | os.PathLike[str] | onnx.ModelProto | None
) -> BisectReport:
    """The three steps of the module docstring."""
    config = b.config
    full = b.trial()
    if full.passed:
        return _not_reproduced(b, candidate)
    report = BisectReport(reproduced=True)
    report.suspects = _suspects(b, config.pass_names())
    report.guilty_pass = _guilty(b, report.suspects, config.pass_names())
    if report.guilty_pass is None:
        report.message = "no pass alone explains the failure"
        report.trials = b.trials
        return report
    good, bad = _within_pass(b, report, full)
    if bad.model is not None:
        before = good.model if good is not None and good.model is not None else b.reference
        report.divergence = _try_divergence(b, before, bad.model)
    report.trials = b.trials
    report.message = _message(report)
    return report


def _try_divergence(
    b: _Bisector,
    before: Path | onnx.ModelProto,
    after: str | os.PathLike[str] | onnx.ModelProto,
) -> Divergence | None:
    """`first_divergence`, or None (with a warning) when the models cannot run with their
    intermediate tensors as outputs."""
    try:
        return first_divergence(before, after, b.feeds[0], b.tolerance, b.tolerances)
    except InferccError as exc:
        log.warning("cannot compare intermediate tensors: %s", exc.message)
        return None


def _not_reproduced(
    b: _Bisector, candidate: str | os.PathLike[str] | onnx.ModelProto | None
) -> BisectReport:
    report = BisectReport(reproduced=False, trials=b.trials)
    report.message = (
        "the pipeline rebuilt from the reference passes validation: the candidate was built "
        "with other options or another infercc version"
    )
    if b.config.source == "defaults":
        report.message += " (a plain model records no build options: rebuilt with the defaults)"
    if candidate is not None:
        report.divergence = _try_divergence(b, b.reference, candidate)
    return report


def _suspects(b: _Bisector, names: Sequence[str]) -> list[str]:
    """Passes whose absence alone makes the rebuild pass."""
    return [name for name in names if b.trial(disabled=[name]).passed]


def _guilty(b: _Bisector, suspects: Sequence[str], names: Sequence[str]) -> str | None:
    if suspects:
        return suspects[-1]
    for i, name in enumerate(names):  # enable passes one at a time, in order
        if not b.trial(disabled=list(names[i + 1 :])).passed:
            return name
    return None


def _within_pass(b: _Bisector, report: BisectReport, full: _Trial) -> tuple[_Trial | None, _Trial]:
    """Binary search over the guilty pass's rewrites (or runs); fills in the report and returns
    the largest passing rebuild (None if none passed) and the smallest failing one."""
    name = report.guilty_pass
    rewrites = len(full.ctx.rewrites.get(name, []))
    if rewrites:
        report.granularity, report.total = "rewrite", rewrites
        first, good, bad = _search(lambda k: b.trial(rewrite_limits={name: k}), rewrites, full)
        report.first_bad = first
        logged = bad.ctx.rewrites.get(name, [])
        if len(logged) >= first:
            report.rewrite_node, report.rewrite_op = logged[first - 1]
        return good, bad
    runs = full.runs.get(name, 0)
    report.granularity, report.total = "run", runs
    if runs == 0:
        return None, full
    report.first_bad, good, bad = _search(lambda k: b.trial(run_limits={name: k}), runs, full)
    return good, bad


def _search(judge: Any, total: int, full: _Trial) -> tuple[int, _Trial | None, _Trial]:
    """Smallest k in 1..total whose trial fails (k = total fails: that is `full`), with the
    trials at k - 1 (passing, or None) and at k."""
    lo, hi, good, bad = 0, total, None, full
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = judge(mid)
        if trial.passed:
            lo, good = mid, trial
        else:
            hi, bad = mid, trial
    if good is None:
        good = judge(0)
    return hi, good if good.passed else None, bad


def _message(r: BisectReport) -> str:
    text = f"pass {r.guilty_pass!r}"
    if r.granularity == "rewrite" and r.first_bad is not None:
        text += f", rewrite {r.first_bad} of {r.total} (node {r.rewrite_node!r}, {r.rewrite_op})"
    elif r.granularity == "run" and r.first_bad is not None:
        text += f", run {r.first_bad} of {r.total}"
    if r.divergence is not None:
        d = r.divergence
        text += f"; outputs first diverge at node {d.node!r} ({d.op_type}), tensor {d.tensor!r}"
    return text


# --------------------------------------------------------------------------- divergence


def first_divergence(
    reference: str | os.PathLike[str] | onnx.ModelProto,
    candidate: str | os.PathLike[str] | onnx.ModelProto,
    feeds: Feeds,
    tolerance: Mapping[str, float],
    tolerances: Mapping[str, tuple[float, float]] | None = None,
) -> Divergence | None:
    """The first candidate node, in topological order, with an output (shared by name with the
    reference) outside tolerance; None when every shared tensor agrees."""
    ref, cand = _load(reference), _load(candidate)
    ref_producers = _producers(ref)
    shared = [o for n in cand.graph.node for o in n.output if o and o in ref_producers]
    ref_values = run_model(_with_outputs(ref, shared), [feeds])[0]
    cand_values = run_model(_with_outputs(cand, shared), [feeds])[0]
    final = {o.name for o in cand.graph.output}
    for position, node in enumerate(cand.graph.node):
        for name in node.output:
            if name not in ref_values or name not in cand_values:
                continue
            atol_rtol = (tolerances or {}).get(name)
            tol: dict[str, Any] = dict(tolerance)
            if atol_rtol is not None and name in final:
                tol.update(atol=atol_rtol[0], rtol=atol_rtol[1])
            expected, got = [{name: ref_values[name]}], [{name: cand_values[name]}]
            check = compare_outputs(expected, got, float_dtypes_may_differ=True, **tol)
            if not check.passed:
                ref_node = ref_producers.get(name)
                return _divergence(node, name, ref_node, check.outputs[name], position)
    return None


def _divergence(
    node: onnx.NodeProto, tensor: str, ref_node: onnx.NodeProto | None, m: Any, position: int
) -> Divergence:
    return Divergence(
        node=node.name,
        op_type=node.op_type,
        tensor=tensor,
        reference_node=ref_node.name if ref_node is not None else None,
        reference_op=ref_node.op_type if ref_node is not None else None,
        max_abs=m.max_abs,
        cosine=m.cosine,
        reason=m.reason,
        position=position,
    )


def _load(model: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(os.fspath(model))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InferccError(
            f"cannot read ONNX model {os.fspath(model)!r}: {first_line(exc)}",
            "is it an .onnx file?",
        ) from exc


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: node for node in model.graph.node for o in node.output if o}


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` with `names` added as graph outputs (onnxruntime infers their types)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for name in names:
        if name not in present:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return copy
