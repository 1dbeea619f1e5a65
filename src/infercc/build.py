"""One build sequence: every build infercc makes runs `STEPS`, in this order.

    load -> pipelines -> plan -> write -> validate -> publish

Three builds run it, each a `Flow` that says what the steps do for it: `infercc optimize`
(`infercc.api.OptimizeFlow`), `infercc calibrate --int8` (`infercc.calib.job.Int8Flow`) and
`infercc calibrate --int4` (`infercc.calib.weight_only.Int4Flow`). The steps own what every
build shares:

- **load**: the flow reads the model and makes its checks (refusing before any work); the
  step notes whether onnx's strict inference accepts the model's declared types.
- **pipelines**: the flow's stages (`Stage`: named pipeline stages of `infercc.passes.pipelines`),
  each one `run_passes` call in a `PassContext` made by `BuildConfig.pass_context`, without the
  config's disabled passes. The flow yields its stages one at a time, so it can measure the
  graph one stage made before it says what the next runs (int8's outlier split). The stages'
  counts are summed (`PipelineReport.add_stage`), the If/Loop bodies each pass rewrote are
  recorded (`infercc.check.coverage`), the outputs are declared at their fixed shapes under
  `--static-shapes`, and every graph output whose declared type the graph contradicts gets
  the computed type (`infercc.ir.output_types`): every model a build writes passes onnx's
  full checker.
- **plan**: what the flow decides on the optimized graph: optimize's memory plan; int8's
  ranges and sensitivity search (which may fail the build: no candidate met the target); int4's
  method (the blocks AWQ or GPTQ search).
- **write**: the result staged in a locked directory beside the destination
  (`infercc.outputs.Staging`), opened by the first step that writes there.
- **validate**: the staged result checked against the original (optimize: `infercc.check`
  under onnxruntime; int8: raced against fp32; int4: evaluated, its accuracy level chosen, raced).
- **publish**: moved into place (with its manifest).

A step that fails the build (`Job.passed` False) ends it: no later step runs and nothing is
published. The staging directory is removed however the build ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infercc.check.coverage import BodyTracker
from infercc.config import BuildConfig
from infercc.ir import Model
from infercc.ir.output_types import OutputTypeChange, reconcile_output_types, strictly_typed
from infercc.ir.static_shapes import declare_static_outputs
from infercc.outputs import Staging
from infercc.passes.manager import PassContext, PassStats, PipelineReport, run_passes

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Stage:
    """One `run_passes` call of a build: the pipeline stage `name`d in `infercc.passes.pipelines`,
    its passes and the context they run in. `announce`: the progress line said before it;
    `each_pass`: a line per pass ("pass NAME") instead."""

    name: str
    passes: tuple[str, ...]
    context: PassContext
    announce: str | None = None
    each_pass: bool = False


class Flow(Protocol):
    """What one kind of build does at each step (module docstring); `Job` carries the state
    the steps share."""

    def load(self, job: Job) -> Model:
        """Read the model and check it (and what the build needs of it)."""
        ...

    def stages(self, job: Job) -> Iterator[Stage]:
        """The pipeline stages to run, in order (each yielded runs before the next is asked)."""
        ...

    def plan(self, job: Job) -> bool:
        """Decide on the optimized graph; False when no plan meets the build's target."""
        ...

    def staging(self) -> Staging:
        """A fresh staging directory beside the destination."""
        ...

    def write(self, job: Job) -> None: ...

    def validate(self, job: Job) -> bool:
        """Whether the staged result passed."""
        ...

    def publish(self, job: Job) -> None: ...


@dataclass
class Job:
    """One build: its flow, its config (whose `pass_context` every stage runs in) and what the
    steps found. `ir` is the model from `load` on; `reports` holds each stage's own report by
    stage name, `pipe` every stage's counts summed."""

    flow: Flow
    config: BuildConfig
    step: Progress = lambda _text: None
    ir: Model = field(init=False)
    typed: bool = False  # onnx's strict inference accepted the declared types of the input
    reports: dict[str, PipelineReport] = field(default_factory=dict)
    pipe: PipelineReport = field(init=False)
    rewritten: dict[Any, list[str]] = field(default_factory=dict)  # If/Loop body -> passes
    output_types: list[OutputTypeChange] = field(default_factory=list)
    pipelines_seconds: float = 0.0
    passed: bool = True
    ran: list[str] = field(default_factory=list)  # the steps run, in order
    seconds: dict[str, float] = field(default_factory=dict)  # each step's wall time, once done
    _staging: Staging | None = None

    @property
    def stage_dir(self) -> Path:
        """The staging directory (opened on first use, removed when the build ends)."""
        if self._staging is None:
            self._staging = self.flow.staging()
        return self._staging.path

    def close(self) -> None:
        if self._staging is not None:
            self._staging.close()
            self._staging = None


# --------------------------------------------------------------------------- the steps


def load(job: Job) -> None:
    job.step("loading")
    job.ir = job.flow.load(job)
    job.typed = strictly_typed(job.ir)  # declared output types are replaced only if so


def pipelines(job: Job) -> None:
    t0 = time.perf_counter()
    bodies = BodyTracker(job.ir)
    runs = []
    for stage in job.flow.stages(job):
        runs.append(_run_stage(job, stage, bodies))
        job.reports[stage.name] = runs[-1]
    job.rewritten = bodies.finish()
    job.pipelines_seconds = time.perf_counter() - t0
    job.pipe = summed(runs)
    if job.config.static_map:
        declare_static_outputs(job.ir)
    job.output_types = reconcile_output_types(job.ir, job.typed)


def plan(job: Job) -> None:
    job.passed = job.flow.plan(job)


def write(job: Job) -> None:
    job.flow.write(job)


def validate(job: Job) -> None:
    job.passed = job.flow.validate(job)


def publish(job: Job) -> None:
    job.flow.publish(job)


STEPS: tuple[tuple[str, Callable[[Job], None]], ...] = (
    ("load", load),
    ("pipelines", pipelines),
    ("plan", plan),
    ("write", write),
    ("validate", validate),
    ("publish", publish),
)


def run_steps(job: Job) -> Job:
    """Run `STEPS` over `job` until one fails the build; the staging directory is removed
    however it ends (what was published has been moved out of it)."""
    try:
        for name, step in STEPS:
            if not job.passed:
                break
            job.ran.append(name)
            t0 = time.perf_counter()
            step(job)
            job.seconds[name] = time.perf_counter() - t0
    finally:
        job.close()
    return job


# --------------------------------------------------------------------------- stages


def _run_stage(job: Job, stage: Stage, bodies: BodyTracker) -> PipelineReport:
    if stage.announce is not None:
        job.step(stage.announce)

    def on_pass(name: str) -> None:
        bodies.before_pass(name)
        if stage.each_pass:
            job.step(f"pass {name}")

    return run_passes(
        job.ir, stage.context, stage.passes, job.config.disable_passes, on_pass=on_pass
    )


def stage_context(
    config: BuildConfig, profile: Mapping[str, tuple[int, ...]] | None = None, **inputs: Any
) -> PassContext:
    """`config.pass_context(profile)` with a stage's own options set (`quantize` settings,
    `outlier_channels`: registered context options, checked against their types): the one way
    a build makes a PassContext."""
    ctx = config.pass_context(profile)
    for name, value in inputs.items():
        ctx.set_option(name, value)
    return ctx


def summed(runs: list[PipelineReport]) -> PipelineReport:
    """Every stage's counts summed over the stages (`PipelineReport.add_stage`: a pass that ran
    in two stages has both stages' counts), the stages' own reports left as they were; the
    rounds, fixpoint and refusals are the first stage's (whose context later stages share when
    they run in the same one)."""
    first = runs[0]
    total = PipelineReport({}, first.iterations, first.reached_fixpoint, first.refusals)
    for report in runs:
        copies = {name: _copy(st) for name, st in report.passes.items()}
        total.add_stage(PipelineReport(copies, report.iterations, report.reached_fixpoint, []))
    return total


def _copy(st: PassStats) -> PassStats:
    return PassStats(st.runs, st.changed, st.time_s, dict(st.counts), st.details)
