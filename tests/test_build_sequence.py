"""One build sequence (infercc.build): optimize, calibrate --int8 and calibrate --int4 run the
same named steps, in order; a failed step ends a build with nothing published; and every
PassContext a build runs passes in is made by BuildConfig.pass_context."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import infercc
from infercc import build
from infercc.build import STEPS, Job, Stage, run_steps, stage_context
from infercc.calib.calibrate import calibrate
from infercc.calib.weight_only import calibrate_int4
from infercc.config import BuildConfig
from infercc.errors import InferccError
from infercc.outputs import Staging
from infercc.passes import manager
from infercc.passes.fuse_gqa import runtime_support
from infercc.passes.pipelines import CALIBRATE_FP32, CALIBRATE_INT4, INT4
from tests.decoders import tiny_decoder
from tests.helpers import mlp_model

SRC = Path(infercc.__file__).resolve().parent
NAMES = ["load", "pipelines", "plan", "write", "validate", "publish"]


@pytest.fixture
def mlp(tmp_path: Path) -> tuple[Path, Path]:
    """The tests' MLP and six samples of it."""
    model = mlp_model(tmp_path / "mlp.onnx")
    data = tmp_path / "samples"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(data / f"{i}.npz", x=rng.standard_normal((2, 64)).astype(np.float32))
    return model, data


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(flow class, step name) for every step any build runs, in order."""
    seen: list[tuple[str, str]] = []

    def recorded(name, step):
        def wrapper(job: Job) -> None:
            seen.append((type(job.flow).__name__, name))
            step(job)

        return wrapper

    monkeypatch.setattr(build, "STEPS", tuple((n, recorded(n, s)) for n, s in STEPS))
    return seen


def test_the_step_list_is_named_and_in_order():
    assert [name for name, _ in STEPS] == NAMES
    assert all(callable(step) for _, step in STEPS)


def test_optimize_int8_and_int4_run_the_same_steps(mlp, tmp_path, ran):
    model, data = mlp
    optimized = infercc.optimize(model, tmp_path / "m.opt.onnx")
    int8 = calibrate(model, data, tmp_path / "int8", speed_check=False)
    int4 = calibrate_int4(model, tmp_path / "int4", speed_check=False)
    assert optimized.written and int8.passed and int4.passed
    flows = {}
    for flow, step in ran:
        flows.setdefault(flow, []).append(step)
    assert flows == {"OptimizeFlow": NAMES, "Int8Flow": NAMES, "Int4Flow": NAMES}
    assert (tmp_path / "int8" / "manifest.json").is_file()
    assert (tmp_path / "int4" / "manifest.json").is_file()


def test_a_search_that_misses_its_target_ends_the_build_at_plan(mlp, tmp_path, ran):
    model, data = mlp
    report = calibrate(model, data, tmp_path / "int8", min_cosine=1.0, max_trials=0)
    assert not report.passed and "max_trials" in report.message
    assert [step for _, step in ran] == ["load", "pipelines", "plan"]
    assert not (tmp_path / "int8").exists() and report.files == []
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.onnx", "samples"]  # no staging left


class _Flow:
    """A flow whose validation fails, recording what ran."""

    def __init__(self, tmp: Path, passes: bool):
        self.tmp, self.passes, self.seen = tmp, passes, []

    def load(self, job):
        from infercc.ir import load_model

        return load_model(mlp_model(self.tmp / "m.onnx"))

    def stages(self, job):
        yield Stage("optimize", ("eliminate-dead-code",), stage_context(job.config))

    def plan(self, job):
        return True

    def staging(self):
        return Staging(self.tmp / "out.onnx")

    def write(self, job):
        (job.stage_dir / "out.onnx").write_text("staged")
        self.staged = job.stage_dir

    def validate(self, job):
        return self.passes

    def publish(self, job):
        self.seen.append("published")


@pytest.mark.parametrize("passes", [True, False])
def test_publish_runs_only_after_validation_passed(tmp_path, passes):
    flow = _Flow(tmp_path, passes)
    job = run_steps(Job(flow, BuildConfig()))
    assert job.ran == (NAMES if passes else NAMES[:-1])
    assert flow.seen == (["published"] if passes else [])
    assert not flow.staged.exists()  # the staging directory is removed however it ends
    assert job.reports["optimize"].passes["eliminate-dead-code"].runs >= 1


def _contexts(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[int, BuildConfig], list]:
    """(id of every PassContext BuildConfig.pass_context made -> its config, [(pass, context)]
    for every pass run)."""
    made: dict[int, BuildConfig] = {}
    used: list = []
    pass_context = BuildConfig.pass_context

    def making(self, profile=None):
        ctx = pass_context(self, profile)
        made[id(ctx)] = self
        return ctx

    run_one = manager._run_one

    def running(name, model, ctx, st):
        used.append((name, ctx))
        return run_one(name, model, ctx, st)

    monkeypatch.setattr(BuildConfig, "pass_context", making)
    monkeypatch.setattr(manager, "_run_one", running)
    return made, used


def test_every_pass_of_the_three_builds_runs_in_a_context_of_the_build_config(
    mlp, tmp_path, monkeypatch
):
    model, data = mlp
    made, used = _contexts(monkeypatch)
    infercc.optimize(model, tmp_path / "m.opt.onnx", precision="fp16")
    calibrate(model, data, tmp_path / "int8", speed_check=False, min_cosine=0.999999)
    calibrate_int4(model, tmp_path / "int4", speed_check=False)
    assert {"convert-fp16", "quantize-qdq", "fold-constants"} <= {name for name, _ in used}
    assert all(id(ctx) in made for _, ctx in used)


def test_int4_runs_its_pipeline_in_a_context_of_its_build_config(tmp_path, monkeypatch):
    """The cpu form runs calibrate-int4 in the build's own context, with the assumption the
    user stated; the portable form runs calibrate-fp32 in a portable one, assuming nothing."""
    import onnx

    path = tmp_path / "decoder.onnx"
    onnx.save(tiny_decoder(hidden=64, kv_heads=2, rotary=True, attention="sdpa", norm="rms"), path)
    made, used = _contexts(monkeypatch)
    # An onnxruntime without GroupQueryAttention's query_seqlens (1.23, the newest for Python
    # 3.10) fuses nothing under the assumption, and stating it is then refused as no effect.
    gqa = runtime_support() is None
    assume = ("nonempty-sequences",) if gqa else ()
    if not gqa:
        with pytest.raises(InferccError, match="has no effect on this model"):
            calibrate_int4(path, tmp_path / "no", assume=["nonempty-sequences"], speed_check=False)
        assert not (tmp_path / "no").exists()
        made.clear()
        used.clear()
    report = calibrate_int4(path, tmp_path / "int4", assume=list(assume), speed_check=False)
    assert report.passed and ("fuse-group-query-attention" in report.fusions) == gqa
    assert bool(report.assumptions) == gqa  # what the build's context recorded
    configs = {made[id(ctx)] for _, ctx in used}
    assert len(configs) == 1 and all(id(ctx) in made for _, ctx in used)
    (config,) = configs
    assert not config.portable and config.assume == assume
    # the fp32 stage, then each int4 build's quantize-int4, all in the build's one context
    assert {name for name, _ in used} <= {*CALIBRATE_INT4.passes, *INT4.passes}
    assert "quantize-int4" in {name for name, _ in used}
    made.clear()
    used.clear()
    calibrate_int4(path, tmp_path / "dq", portable=True, speed_check=False)
    configs = {made[id(ctx)] for _, ctx in used}
    assert len(configs) == 1 and all(id(ctx) in made for _, ctx in used)
    (config,) = configs
    assert config.portable and config.assume == ()
    assert {name for name, _ in used} <= {*CALIBRATE_FP32.passes, *INT4.passes}


def test_no_build_makes_its_own_pass_context():
    """api, the int8 job and the int4 flow make no PassContext(...) themselves: each comes
    from BuildConfig.pass_context (through infercc.build.stage_context)."""
    for module in (
        "api.py",
        "build.py",
        "calib/calibrate.py",
        "calib/job.py",
        "calib/weight_only.py",
    ):
        tree = ast.parse((SRC / module).read_text())
        calls = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "PassContext"
        ]
        assert calls == [], f"{module} makes a PassContext at line(s) {calls}"


def test_stage_context_refuses_an_input_the_context_lacks():
    ctx = stage_context(BuildConfig(portable=True), outlier_channels={"mm": [1]})
    assert ctx.portable and ctx.option("outlier_channels") == {"mm": [1]}
    with pytest.raises(InferccError, match="'outlier_chanels' is no pass context option"):
        stage_context(BuildConfig(), outlier_chanels={})
