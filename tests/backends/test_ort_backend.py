"""The ONNX Runtime backend: per-shape tuning, the cache, ort_config.json, loading and running."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

from infercc.analysis.targets import get_target
from infercc.backends.ort import backend as obk
from infercc.backends.ort import config as oc
from infercc.backends.ort import runner as orn
from infercc.backends.ort import tuner as ot
from infercc.config import OrtOptions
from infercc.data.feeds import make_inputs
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.runtime.artifact import Artifact
from infercc.runtime.backend import CompileOptions
from infercc.runtime.registry import get_backend
from infercc.runtime.tuning import TuningCache
from tests.helpers import parse

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"

# Two inputs sharing the symbol `n`: a profile on `x` decides `y`'s shape too.
TWO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[n, 4] x, float[n, 4] y) => (float[n, 3] z) <float[4, 3] w = {
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2}> {
    s = Add(x, y)
    z = MatMul(s, w)
}
"""

FIXED = ShapeProfile("image", (2, 3, 32, 32), (2, 3, 32, 32), (2, 3, 32, 32))
RANGE = ShapeProfile("image", (1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))


def options(save_optimized: bool = True, **kw: Any) -> CompileOptions:
    return CompileOptions(iters=3, warmup=1, ort=OrtOptions(optimized_model=save_optimized), **kw)


@pytest.fixture
def cnn_dir(tmp_path: Path) -> Path:
    out = tmp_path / "artifact"
    out.mkdir()
    shutil.copy(SMALL_CNN, out / "model.onnx")
    return out


@pytest.fixture
def cache(tmp_path: Path):
    with TuningCache(tmp_path / "cache") as c:
        yield c


@pytest.fixture
def counts(monkeypatch) -> dict[str, list]:
    """Records every session created (its config) and every timing call."""
    seen: dict[str, list] = {"sessions": [], "timed": []}
    create, time_runs = oc._create_session, oc._time_runs

    def counting_create(model, config, save_to=None):
        seen["sessions"].append(json.loads(oc.config_key(config)))
        return create(model, config, save_to)

    def counting_time(session, feeds, warmup, iters):
        seen["timed"].append(iters)
        return time_runs(session, feeds, warmup, iters)

    monkeypatch.setattr(ot, "_create_session", counting_create)

    monkeypatch.setattr(orn, "_create_session", counting_create)
    monkeypatch.setattr(ot, "_time_runs", counting_time)
    return seen


def compile_cnn(out: Path, cache, profiles=(FIXED,), **extra: Any) -> dict[str, Any]:
    return obk.OrtBackend().compile(
        out / "model.onnx", get_target("cpu"), list(profiles), options(**extra), cache, out
    )


def ort_config(out: Path) -> dict[str, Any]:
    return json.loads((out / oc.CONFIG_FILE).read_text())


def default_session_outputs(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 3
    sess = onnxruntime.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# --------------------------------------------------------------------------- registry, precisions


def test_registered_and_available() -> None:
    backend = get_backend("ort")
    assert isinstance(backend, obk.OrtBackend)
    assert backend.available() == (True, "")
    assert backend.version() == onnxruntime.__version__


def test_precisions_on_the_cpu() -> None:
    cpu = get_target("cpu")
    got = obk.OrtBackend().precisions(cpu)
    assert got[0] == "fp32" and "fp16" in got and "int8" in got
    assert ("bf16" in got) == ("bf16" in cpu.precisions)


def test_precisions_on_a100_without_onnxruntime_gpu(monkeypatch) -> None:
    monkeypatch.setattr(oc.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert obk.OrtBackend().precisions(get_target("a100")) == ()
    assert obk.gpu_reason() == 'onnxruntime-gpu is not installed (pip install "infercc[gpu]")'


def test_precisions_on_a100_with_the_cuda_provider(monkeypatch) -> None:
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(oc.ort, "get_available_providers", lambda: providers)
    assert obk.gpu_reason() == ""
    assert obk.OrtBackend().precisions(get_target("a100")) == ("fp32", "fp16", "bf16", "int8")


def test_compile_for_a_gpu_without_onnxruntime_gpu_says_why(cnn_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(oc.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(InferccError, match="onnxruntime-gpu is not installed"):
        obk.OrtBackend().compile(
            cnn_dir / "model.onnx", get_target("a100"), [FIXED], options(), None, cnn_dir
        )


# --------------------------------------------------------------------------- candidates


def test_candidates_dedupe_and_cover_every_knob() -> None:
    configs = oc.candidate_configs([oc.CPU], cores=2)
    keys = [oc.config_key(c) for c in configs]
    assert len(keys) == len(set(keys))
    assert configs[0] == oc.default_config(oc.CPU)
    sessions = [c["session_options"] for c in configs]
    assert {s["graph_optimization_level"] for s in sessions} == set(oc.LEVELS)
    # 1, half of 2 cores (= 1), 2 cores, 0: deduplicated to three values
    assert sorted({s["intra_op_num_threads"] for s in sessions}) == [0, 1, 2]
    assert {(s["execution_mode"], s["inter_op_num_threads"]) for s in sessions} == {
        ("ORT_SEQUENTIAL", 0),
        ("ORT_PARALLEL", 2),
    }
    assert {tuple(c["disabled_optimizers"]) for c in configs} == {(), ("SkipLayerNormFusion",)}
    assert len(configs) == oc.candidate_count([oc.CPU], cores=2) == 7


def test_thread_counts_and_single_core() -> None:
    assert oc.thread_counts(8) == [1, 4, 8, 0]
    assert oc.thread_counts(1) == [1, 0]
    single = oc.candidate_configs([oc.CPU], cores=1)
    assert all(c["session_options"]["execution_mode"] == "ORT_SEQUENTIAL" for c in single)
    assert oc.candidate_count([oc.CPU], cores=8) == 8


def test_providers_by_target_kind() -> None:
    present = [oc.TENSORRT, oc.CUDA, oc.CPU]
    assert oc.candidate_providers("cpu", present) == [oc.CPU]
    assert oc.candidate_providers("gpu", present) == [oc.TENSORRT, oc.CUDA]
    assert oc.candidate_providers("gpu", [oc.CPU]) == []


def test_gpu_candidates_from_a_fake_provider_list() -> None:
    configs = oc.candidate_configs([oc.CUDA, oc.TENSORRT], cores=4)
    cuda = [c for c in configs if c["provider"] == oc.CUDA]
    searches = {c["provider_options"]["cudnn_conv_algo_search"] for c in cuda}
    assert searches == {"EXHAUSTIVE", "HEURISTIC", "DEFAULT"}
    tunable = [c for c in cuda if c["provider_options"]["tunable_op_enable"] == "1"]
    assert tunable and tunable[0]["provider_options"]["tunable_op_tuning_enable"] == "1"
    assert any(c["provider"] == oc.TENSORRT for c in configs)
    # CUDA options never leak onto TensorRT configurations
    assert all(not c["provider_options"] for c in configs if c["provider"] == oc.TENSORRT)
    assert oc.candidate_count([oc.CUDA], cores=8) == 10


def test_session_options_from_a_config() -> None:
    config = oc.apply_patch(
        oc.default_config(oc.CUDA),
        {
            "provider_options.cudnn_conv_algo_search": "HEURISTIC",
            "session_options.graph_optimization_level": "ORT_ENABLE_BASIC",
            "session_options.intra_op_num_threads": 3,
        },
    )
    so, providers = oc.session_options(config)
    assert so.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.intra_op_num_threads == 3
    assert so.execution_mode == onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    name, provider_options = providers[0]
    assert name == oc.CUDA and provider_options["cudnn_conv_algo_search"] == "HEURISTIC"
    assert providers[1:] == [oc.CPU]
    assert oc.session_options(oc.default_config())[1] == [oc.CPU]


def test_coordinate_descent_sweeps_one_knob_at_a_time() -> None:
    """A made-up latency: BASIC and 1 thread are best; descent finds both in one pass."""
    evaluated = []

    def evaluate(config: dict, knob: str) -> dict:
        evaluated.append(config)
        so = config["session_options"]
        ms = 10.0 - 3 * (so["graph_optimization_level"] == "ORT_ENABLE_BASIC")
        ms -= 2 * (so["intra_op_num_threads"] == 1) - 5 * (so["execution_mode"] == "ORT_PARALLEL")
        return {"config": config, "knob": knob, "median_ms": ms}

    start = oc.default_config(oc.CPU)
    best, records = ot.coordinate_descent(start, oc.knobs([oc.CPU], 8), evaluate)
    assert best is not None and best["median_ms"] == 5.0
    assert best["config"]["session_options"]["graph_optimization_level"] == "ORT_ENABLE_BASIC"
    assert best["config"]["session_options"]["intra_op_num_threads"] == 1
    assert len(evaluated) == len(records) == oc.candidate_count([oc.CPU], 8) == 8  # not 3x2x4x2


def test_coordinate_descent_keeps_defaults_for_gains_within_noise() -> None:
    """A candidate 2% faster than the defaults is noise; one 10% faster is adopted."""

    def evaluate(config: dict, knob: str) -> dict:
        so = config["session_options"]
        ms = 10.0
        ms -= 0.2 * (so["graph_optimization_level"] == "ORT_ENABLE_BASIC")
        ms -= 1.0 * (so["intra_op_num_threads"] == 1)
        return {"config": config, "knob": knob, "median_ms": ms}

    start = oc.default_config(oc.CPU)
    best, _ = ot.coordinate_descent(start, oc.knobs([oc.CPU], 8), evaluate)
    so = best["config"]["session_options"]
    assert so["graph_optimization_level"] == start["session_options"]["graph_optimization_level"]
    assert so["intra_op_num_threads"] == 1 and best["median_ms"] == 9.0


def test_coordinate_descent_skips_failures_and_reports_none_when_all_fail() -> None:
    def fail(config: dict, knob: str) -> dict:
        return {"config": config, "knob": knob, "skipped": "session failed: no"}

    best, records = ot.coordinate_descent(oc.default_config(), oc.knobs([oc.CPU], 2), fail)
    assert best is None and len(records) == 7
    assert all(r["skipped"] == "session failed: no" for r in records)


# --------------------------------------------------------------------------- compile


def test_compile_writes_ort_config(cnn_dir: Path, cache) -> None:
    steps: list[str] = []
    opts = options()
    opts.on_step = steps.append
    section = obk.OrtBackend().compile(
        cnn_dir / "model.onnx", get_target("cpu"), [FIXED], opts, cache, cnn_dir
    )
    config = ort_config(cnn_dir)
    assert config["schema"] == "infercc.ort_config/1"
    assert config["onnxruntime"] == onnxruntime.__version__
    assert config["default"] == 0 and len(config["points"]) == 1
    point = config["points"][0]
    assert point["name"] == "opt" and point["shapes"] == {"image": [2, 3, 32, 32]}
    assert point["provider"] == oc.CPU and point["cache"] == "miss"
    assert set(point["session_options"]) == {
        "graph_optimization_level",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "execution_mode",
    }
    assert point["median_ms"] > 0
    total = oc.candidate_count([oc.CPU], obk._host_cores())
    assert len(point["candidates"]) == total
    assert all(("median_ms" in c) != ("skipped" in c) for c in point["candidates"])
    assert {c["knob"] for c in point["candidates"]} >= {"default", "graph_optimization_level"}
    best = min(c["median_ms"] for c in point["candidates"] if "median_ms" in c)
    confirmation = point.get("confirmation")
    if confirmation is not None and not confirmation["kept"]:
        # the sweep's winner lost the head-to-head: the defaults stay
        assert point["session_options"] == oc.DEFAULT_SESSION_OPTIONS
    else:
        # no candidate beats the choice by more than the gain needed to move off the defaults
        assert best >= point["median_ms"] * (1 - ot.MIN_GAIN)
    assert f"tuning opt shape: 3/{total} candidates" in steps
    assert (cnn_dir / oc.OPTIMIZED_FILE).is_file()
    assert (
        config["optimized_model"]["graph_optimization_level"]
        == (point["session_options"]["graph_optimization_level"])
    )
    assert section["name"] == "ort" and section["version"] == onnxruntime.__version__
    assert section["files"] == [oc.CONFIG_FILE, oc.OPTIMIZED_FILE]
    assert section["providers"] == [oc.CPU]
    keys = ("name", "shapes", "provider", "session_options", "disabled_optimizers")
    assert section["points"][0] == {k: point[k] for k in (*keys, "median_ms", "cache")}


def test_second_compile_hits_the_cache_and_times_nothing(cnn_dir: Path, cache, counts) -> None:
    compile_cnn(cnn_dir, cache, (RANGE,), save_optimized=False)
    first = ort_config(cnn_dir)
    assert [p["cache"] for p in first["points"]] == ["miss"] * 3
    assert counts["timed"] and counts["sessions"]
    counts["timed"].clear()
    counts["sessions"].clear()
    compile_cnn(cnn_dir, cache, (RANGE,), save_optimized=False)
    second = ort_config(cnn_dir)
    assert [p["cache"] for p in second["points"]] == ["hit"] * 3
    assert counts["timed"] == [] and counts["sessions"] == []
    for a, b in zip(first["points"], second["points"], strict=True):
        assert (a["provider"], a["session_options"]) == (b["provider"], b["session_options"])
        assert a["candidates"] == b["candidates"]


def test_a_different_shape_is_a_miss(cnn_dir: Path, cache, counts) -> None:
    compile_cnn(cnn_dir, cache, (FIXED,), save_optimized=False)
    other = ShapeProfile("image", (3, 3, 32, 32), (3, 3, 32, 32), (3, 3, 32, 32))
    counts["timed"].clear()
    compile_cnn(cnn_dir, cache, (other,), save_optimized=False)
    assert ort_config(cnn_dir)["points"][0]["cache"] == "miss"
    assert counts["timed"]


def test_without_a_cache_every_point_is_tuned(cnn_dir: Path, counts) -> None:
    compile_cnn(cnn_dir, None, (FIXED,), save_optimized=False)
    compile_cnn(cnn_dir, None, (FIXED,), save_optimized=False)
    assert ort_config(cnn_dir)["points"][0]["cache"] == "miss"
    total = oc.candidate_count([oc.CPU], obk._host_cores())
    assert len(counts["timed"]) == 2 * total


@pytest.mark.parametrize("head_to_head, kept", [((1.00, 0.99), False), ((1.00, 0.80), True)])
def test_winner_must_beat_the_defaults_head_to_head(
    cnn_dir: Path, monkeypatch, head_to_head, kept
) -> None:
    """The sweep's winner is timed against the defaults again; noise does not get it chosen."""

    def fake_time(session, feeds, warmup, iters):  # the sweep: 1 thread looks 20% faster
        threads = session.get_session_options().intra_op_num_threads
        return (8.0 if threads == 1 else 10.0), session.run(None, feeds)

    monkeypatch.setattr(ot, "_time_runs", fake_time)
    monkeypatch.setattr(ot, "_interleaved_medians", lambda *a: head_to_head)
    compile_cnn(cnn_dir, None, (FIXED,), save_optimized=False)
    point = ort_config(cnn_dir)["points"][0]
    assert point["confirmation"]["kept"] is kept
    threads = point["session_options"]["intra_op_num_threads"]
    assert threads == (1 if kept else oc.DEFAULT_SESSION_OPTIONS["intra_op_num_threads"])


def test_tune_false_takes_the_defaults_untimed(cnn_dir: Path, counts) -> None:
    opts = options(save_optimized=False)
    opts.tune = False
    backend = obk.OrtBackend()
    backend.compile(cnn_dir / "model.onnx", get_target("cpu"), [FIXED], opts, None, cnn_dir)
    point = ort_config(cnn_dir)["points"][0]
    assert point["cache"] == "untuned" and point["median_ms"] is None
    assert point["session_options"] == oc.DEFAULT_SESSION_OPTIONS
    assert counts["timed"] == [] and counts["sessions"] == []


def test_range_profile_gives_three_points(cnn_dir: Path, cache) -> None:
    section = compile_cnn(cnn_dir, cache, (RANGE,))
    config = ort_config(cnn_dir)
    assert [p["name"] for p in config["points"]] == ["min", "opt", "max"]
    assert [p["shapes"]["image"][0] for p in config["points"]] == [1, 4, 8]
    assert config["default"] == 1 and section["default"] == 1
    assert [p["name"] for p in section["points"]] == ["min", "opt", "max"]


def test_points_with_equal_shapes_are_tuned_once(cnn_dir: Path) -> None:
    profile = ShapeProfile("image", (4, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))
    compile_cnn(cnn_dir, None, (profile,), save_optimized=False)
    assert [p["name"] for p in ort_config(cnn_dir)["points"]] == ["opt", "max"]


def test_unprofiled_inputs_follow_shared_symbols(tmp_path: Path) -> None:
    onnx.save(parse(TWO_INPUTS), tmp_path / "model.onnx")
    profile = ShapeProfile("x", (2, 4), (5, 4), (9, 4))
    obk.OrtBackend().compile(
        tmp_path / "model.onnx", get_target("cpu"), [profile], options(), None, tmp_path
    )
    points = ort_config(tmp_path)["points"]
    assert [p["shapes"] for p in points] == [
        {"x": [2, 4], "y": [2, 4]},
        {"x": [5, 4], "y": [5, 4]},
        {"x": [9, 4], "y": [9, 4]},
    ]


def test_no_profile_uses_default_shapes(tmp_path: Path) -> None:
    onnx.save(parse(TWO_INPUTS), tmp_path / "model.onnx")
    obk.OrtBackend().compile(
        tmp_path / "model.onnx", get_target("cpu"), [], options(), None, tmp_path
    )
    points = ort_config(tmp_path)["points"]
    assert [p["shapes"] for p in points] == [{"x": [1, 4], "y": [1, 4]}]


class Perturbed:
    """A session whose outputs are off by 0.5: what a broken configuration would give."""

    def __init__(self, session: Any):
        self.session = session

    def run(self, names, feeds):
        return [o + np.float32(0.5) for o in self.session.run(names, feeds)]


def test_a_candidate_with_wrong_outputs_is_rejected(cnn_dir: Path, monkeypatch) -> None:
    create = oc._create_session

    def perturb_one_thread(model, config, save_to=None):
        session = create(model, config, save_to)
        one = config["session_options"]["intra_op_num_threads"] == 1
        return Perturbed(session) if one else session

    monkeypatch.setattr(ot, "_create_session", perturb_one_thread)

    monkeypatch.setattr(orn, "_create_session", perturb_one_thread)
    compile_cnn(cnn_dir, None, (FIXED,), save_optimized=False)
    point = ort_config(cnn_dir)["points"][0]
    rejected = [c for c in point["candidates"] if "skipped" in c]
    assert len(rejected) == 1
    assert rejected[0]["config"]["session_options"]["intra_op_num_threads"] == 1
    assert rejected[0]["skipped"].startswith("outputs differ from the reference: output 'logits'")
    assert "out of tolerance" in rejected[0]["skipped"]
    assert point["session_options"]["intra_op_num_threads"] != 1


def test_a_candidate_that_fails_to_load_is_skipped_with_the_reason(
    cnn_dir: Path, monkeypatch
) -> None:
    create = oc._create_session

    def refuse_basic(model, config, save_to=None):
        if config["session_options"]["graph_optimization_level"] == "ORT_ENABLE_BASIC":
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : no\nsecond line")
        return create(model, config, save_to)

    monkeypatch.setattr(ot, "_create_session", refuse_basic)

    monkeypatch.setattr(orn, "_create_session", refuse_basic)
    compile_cnn(cnn_dir, None, (FIXED,), save_optimized=False)
    point = ort_config(cnn_dir)["points"][0]
    skipped = [c["skipped"] for c in point["candidates"] if "skipped" in c]
    assert skipped == ["session failed: [ONNXRuntimeError] : 1 : FAIL : no"]


def test_tolerance_follows_the_graph_precision() -> None:
    assert ot.tolerance(CompileOptions()) == (1e-4, 1e-3, 0.9999)
    assert ot.tolerance(CompileOptions(precision="fp16"))[:2] == (float("inf"), float("inf"))
    assert ot.tolerance(CompileOptions(atol=0.5))[0] == 0.5


# --------------------------------------------------------------------------- GPU branch, faked


class FakeGpuSession:
    """A CPU session standing in for a CUDA one: it remembers its config and TunableOp results."""

    tuning = [{"ep": "CUDAExecutionProvider", "results": {"op": {"k": 1}}, "validators": {}}]

    def __init__(self, session: Any, config: dict):
        self.session, self.config = session, config
        self.applied: list = []

    def run(self, names, feeds):
        return self.session.run(names, feeds)

    def get_tuning_results(self):
        return self.tuning

    def set_tuning_results(self, results, error_on_invalid=False):
        self.applied.append(results)


def test_gpu_branch_with_a_fake_cuda_provider(cnn_dir: Path, monkeypatch) -> None:
    """The CUDA knobs are swept, TunableOp's results are kept and handed back at load."""
    providers = [oc.CUDA, oc.CPU]
    monkeypatch.setattr(oc.ort, "get_available_providers", lambda: providers)
    create = oc._create_session
    made: list[FakeGpuSession] = []

    def fake_create(model, config, save_to=None):
        cpu = {**config, "provider": oc.CPU, "provider_options": {}}
        made.append(FakeGpuSession(create(model, cpu, save_to), config))
        return made[-1]

    def fake_time(session, feeds, warmup, iters):
        options = session.config["provider_options"]
        ms = 5.0 - (options["cudnn_conv_algo_search"] == "HEURISTIC")
        ms -= 2 * (options["tunable_op_enable"] == "1")
        return ms, session.run(None, feeds)

    monkeypatch.setattr(ot, "_create_session", fake_create)

    monkeypatch.setattr(orn, "_create_session", fake_create)
    monkeypatch.setattr(ot, "_time_runs", fake_time)
    monkeypatch.setattr(
        ot,
        "_interleaved_medians",
        lambda sessions, feeds, *_: tuple(fake_time(s, feeds, 0, 1)[0] for s in sessions),
    )
    obk.OrtBackend().compile(
        cnn_dir / "model.onnx", get_target("a100"), [FIXED], options(), None, cnn_dir
    )
    point = ort_config(cnn_dir)["points"][0]
    assert point["provider"] == oc.CUDA
    assert point["provider_options"] == {
        "cudnn_conv_algo_search": "HEURISTIC",
        "tunable_op_enable": "1",
        "tunable_op_tuning_enable": "1",
    }
    assert point["median_ms"] == 2.0
    assert point["tuning_results"] == FakeGpuSession.tuning
    searched = {
        c["config"]["provider_options"]["cudnn_conv_algo_search"] for c in point["candidates"]
    }
    assert searched == {"EXHAUSTIVE", "HEURISTIC", "DEFAULT"}

    made.clear()
    runner = obk.OrtBackend().load(Artifact(cnn_dir, {}))
    runner.run(make_inputs(onnx.load(SMALL_CNN), {"image": FIXED.opt}))
    assert len(made) == 1 and made[0].applied == [FakeGpuSession.tuning]


# --------------------------------------------------------------------------- load and run


def test_load_runs_like_onnxruntime_on_model_onnx(cnn_dir: Path, cache) -> None:
    compile_cnn(cnn_dir, cache, (FIXED,))
    runner = obk.OrtBackend().load(Artifact(cnn_dir, {}))
    assert list(runner.input_names) == ["image"] and list(runner.output_names) == ["logits"]
    feeds = make_inputs(onnx.load(SMALL_CNN), {"image": FIXED.opt}, seed=3)
    got = runner.run(feeds)
    want = default_session_outputs(cnn_dir / "model.onnx", feeds)
    assert len(got) == len(want) == 1
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    # it ran from onnxruntime's saved optimized model, made on this host
    assert runner._source(runner.points[0])[0].name == oc.OPTIMIZED_FILE


def test_optimized_model_from_another_host_is_not_used(cnn_dir: Path) -> None:
    compile_cnn(cnn_dir, None, (FIXED,))
    config = ort_config(cnn_dir)
    config["optimized_model"]["fingerprint"] = "another-host"
    (cnn_dir / oc.CONFIG_FILE).write_text(json.dumps(config))
    runner = obk.OrtBackend().load(Artifact(cnn_dir, {}))
    model, session_config = runner._source(runner.points[0])
    assert model.name == "model.onnx"
    assert session_config["session_options"] == config["points"][0]["session_options"]
    feeds = make_inputs(onnx.load(SMALL_CNN), {"image": FIXED.opt})
    want = default_session_outputs(cnn_dir / "model.onnx", feeds)
    np.testing.assert_allclose(runner.run(feeds)[0], want[0], rtol=1e-5, atol=1e-5)


def test_no_optimized_model_by_default(cnn_dir: Path) -> None:
    obk.OrtBackend().compile(
        cnn_dir / "model.onnx",
        get_target("cpu"),
        [FIXED],
        CompileOptions(iters=2, warmup=1),
        None,
        cnn_dir,
    )
    assert not (cnn_dir / oc.OPTIMIZED_FILE).exists()
    assert ort_config(cnn_dir)["optimized_model"] is None


def test_no_optimized_model_when_asked_not_to(cnn_dir: Path) -> None:
    section = compile_cnn(cnn_dir, None, (FIXED,), save_optimized=False)
    assert not (cnn_dir / oc.OPTIMIZED_FILE).exists()
    assert section["files"] == [oc.CONFIG_FILE]
    assert ort_config(cnn_dir)["optimized_model"] is None


def test_no_optimized_model_when_external_data_is_too_large(tmp_path: Path, monkeypatch) -> None:
    model = parse(TWO_INPUTS)
    weight = onnx.numpy_helper.to_array(model.graph.initializer[0])
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(weight, "w"))  # raw_data
    onnx.save(
        model,
        tmp_path / "model.onnx",
        save_as_external_data=True,
        location="model.data",
        size_threshold=0,
    )
    assert (tmp_path / "model.data").stat().st_size == 48
    monkeypatch.setattr(ot, "EXTERNAL_DATA_LIMIT", 47)
    obk.OrtBackend().compile(
        tmp_path / "model.onnx", get_target("cpu"), [], options(), None, tmp_path
    )
    assert not (tmp_path / oc.OPTIMIZED_FILE).exists()
    monkeypatch.setattr(ot, "EXTERNAL_DATA_LIMIT", 48)
    obk.OrtBackend().compile(
        tmp_path / "model.onnx", get_target("cpu"), [], options(), None, tmp_path
    )
    assert (tmp_path / oc.OPTIMIZED_FILE).is_file()


def test_runner_picks_the_point_by_feed_shape(cnn_dir: Path, monkeypatch) -> None:
    compile_cnn(cnn_dir, None, (RANGE,), save_optimized=False)
    config = ort_config(cnn_dir)
    # give each point its own thread count so that each has its own session
    for point, threads in zip(config["points"], (1, 2, 3), strict=True):
        point["session_options"]["intra_op_num_threads"] = threads
    (cnn_dir / oc.CONFIG_FILE).write_text(json.dumps(config))
    runner = obk.OrtBackend().load(Artifact(cnn_dir, {}))
    created: list[int] = []
    create = oc._create_session

    def recording(model, cfg, save_to=None):
        created.append(cfg["session_options"]["intra_op_num_threads"])
        return create(model, cfg, save_to)

    monkeypatch.setattr(ot, "_create_session", recording)

    monkeypatch.setattr(orn, "_create_session", recording)
    proto = onnx.load(SMALL_CNN)
    for batch, threads in ((8, 3), (1, 1), (4, 2), (8, 3), (5, 2)):
        feeds = make_inputs(proto, {"image": (batch, 3, 32, 32)})
        assert runner.select(feeds) == threads - 1
        assert runner.run(feeds)[0].shape == (batch, 10)
        assert threads in created
    assert created == [3, 1, 2]  # one session per configuration, created on first use


def test_default_runner_matches_onnxruntime(tmp_path: Path) -> None:
    onnx.save(parse(TWO_INPUTS), tmp_path / "m.onnx")
    runner = orn.default_runner(tmp_path / "m.onnx")
    assert list(runner.input_names) == ["x", "y"] and list(runner.output_names) == ["z"]
    feeds = make_inputs(parse(TWO_INPUTS), {"x": (3, 4)})
    want = default_session_outputs(tmp_path / "m.onnx", feeds)
    np.testing.assert_array_equal(runner.run(feeds)[0], want[0])
    with pytest.raises(InferccError, match="no value for model input"):
        runner.run({"x": feeds["x"]})


def test_missing_ort_config_is_a_clear_error(tmp_path: Path) -> None:
    shutil.copy(SMALL_CNN, tmp_path / "model.onnx")
    with pytest.raises(InferccError) as info:
        obk.OrtBackend().load(Artifact(tmp_path, {}))
    assert str(info.value.message) == f"{tmp_path} has no ort_config.json: " + (
        "it was not built by the ort backend"
    )
    assert "--backend ort" in info.value.hint


def test_another_schema_is_a_clear_error(tmp_path: Path) -> None:
    shutil.copy(SMALL_CNN, tmp_path / "model.onnx")
    (tmp_path / oc.CONFIG_FILE).write_text(json.dumps({"schema": "infercc.ort_config/9"}))
    with pytest.raises(InferccError, match="schema 'infercc.ort_config/9'"):
        obk.OrtBackend().load(Artifact(tmp_path, {}))


# --------------------------------------------------------------------------- disabled fusions

SKIP_LN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4,8] x, float[2,4,8] skip) => (float[2,4,8] y)
<float[8] gamma = {1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.05, 0.95},
 float[8] beta = {0.1, -0.1, 0.2, 0.0, 0.3, -0.2, 0.05, 0.0}> {
  s = Add(x, skip)
  y = LayerNormalization<axis=-1, epsilon=1e-5>(s, gamma, beta)
}
"""


def _skip_ln_model(tmp_path: Path) -> Path:
    model = parse(SKIP_LN)
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        init.CopyFrom(
            onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), init.name)
        )
    path = tmp_path / "skip_ln.onnx"
    onnx.save(model, path)
    return path


def _ops_after_session(model: Path, config: dict, tmp_path: Path) -> set[str]:
    saved = tmp_path / "ort_opt.onnx"
    oc._create_session(model, config, save_to=saved)
    return {n.op_type for n in onnx.load(saved).graph.node}


def test_disabled_optimizers_keep_skip_layer_norm_out(tmp_path: Path) -> None:
    """The knob's value reaches onnxruntime: with SkipLayerNormFusion disabled the session's
    graph keeps Add + LayerNormalization, by default onnxruntime fuses them."""
    path = _skip_ln_model(tmp_path)
    default = oc.default_config(oc.CPU)
    assert "SkipLayerNormalization" in _ops_after_session(path, default, tmp_path)
    off = oc.apply_patch(default, {"disabled_optimizers": ["SkipLayerNormFusion"]})
    ops = _ops_after_session(path, off, tmp_path)
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops


def test_disabled_optimizers_recorded_and_honoured_at_load(tmp_path: Path) -> None:
    """A point's disabled_optimizers is written in ort_config.json and the runner builds its
    session with it (an ort_config.json from before the knob reads as none disabled)."""
    chosen = oc.apply_patch(
        oc.default_config(oc.CPU), {"disabled_optimizers": ["SkipLayerNormFusion"]}
    )
    point = ot._point("opt", {"x": (2, 4, 8)}, {"config": chosen, "median_ms": 1.0}, "miss")
    assert point["disabled_optimizers"] == ["SkipLayerNormFusion"]
    path = _skip_ln_model(tmp_path)
    runner = orn.OrtRunner(path, [point])
    model, config = runner._source(point)
    assert model == path and config["disabled_optimizers"] == ["SkipLayerNormFusion"]
    feeds = {"x": np.ones((2, 4, 8), np.float32), "skip": np.zeros((2, 4, 8), np.float32)}
    assert runner.run(feeds)[0].shape == (2, 4, 8)
    old = {k: v for k, v in point.items() if k != "disabled_optimizers"}
    assert orn.OrtRunner(path, [old])._source(old)[1]["disabled_optimizers"] == []
