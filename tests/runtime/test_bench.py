"""infercc.runtime.bench: latency reports per batch size, and interleaved A/B comparison.

Nothing here asserts on time: structure, counts, shapes, order of calls and equalities only.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from infercc.backends.ort import default_runner
from infercc.errors import InferccError
from infercc.runtime import bench as bench_module
from infercc.runtime import registry
from infercc.runtime.artifact import MANIFEST, MODEL_FILE, Artifact, Feeds, Runner
from infercc.runtime.bench import LatencyStats, bench, compare, open_runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CNN = EXAMPLES / "small_cnn.onnx"
ENCODER = EXAMPLES / "tiny_encoder.onnx"
FAST = {"warmup": 1, "iters": 5}


def save(tmp_path: Path, text: str, name: str = "model.onnx") -> Path:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def fixed_batch_model(tmp_path: Path) -> Path:
    return save(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 17]>
        fixed (float[1, 4] x) => (float[1, 4] y) { y = Relu(x) }""",
    )


# --------------------------------------------------------------------------- bench


def test_report_fields_types_and_json() -> None:
    report = bench(CNN, **FAST)
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"path", "backend", "duration_s", "results", "host"}
    assert data["path"] == str(CNN) and data["backend"] == "onnxruntime"
    assert data["duration_s"] is None and data["results"][0]["profile"] is None  # not asked
    assert data["host"]["onnxruntime"] == ort.__version__ and data["host"]["cores"] >= 1
    [stats] = report.results
    assert isinstance(stats, LatencyStats)
    assert (stats.batch, stats.iters, stats.warmup) == (1, 5, 1)
    assert stats.shapes == {"image": (1, 3, 32, 32)}
    assert 0 < stats.min_ms <= stats.p50_ms <= stats.p90_ms <= stats.p99_ms <= stats.max_ms
    assert stats.min_ms <= stats.mean_ms <= stats.max_ms and stats.stdev_ms >= 0
    assert math.isclose(stats.throughput, stats.batch / (stats.mean_ms / 1e3), rel_tol=1e-9)
    row = data["results"][0]
    assert row["shapes"] == {"image": [1, 3, 32, 32]}
    for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "stdev_ms"):
        assert isinstance(row[key], float)


def test_batches_give_one_result_each() -> None:
    report = bench(CNN, batches=(1, 4), **FAST)
    assert [r.batch for r in report.results] == [1, 4]
    assert [r.shapes["image"] for r in report.results] == [(1, 3, 32, 32), (4, 3, 32, 32)]
    for r in report.results:
        assert math.isclose(r.throughput, r.batch * 1e3 / r.mean_ms, rel_tol=1e-9)


def test_fixed_batch_refuses_another_batch(tmp_path: Path) -> None:
    path = fixed_batch_model(tmp_path)
    with pytest.raises(InferccError) as info:
        bench(path, batches=(2,), **FAST)
    assert info.value.message == "input 'x' has a fixed batch of 1; --batch 2 cannot apply"
    assert info.value.hint and "--batch 1" in info.value.hint


def test_fixed_batch_runs_at_its_own_batch(tmp_path: Path) -> None:
    path = fixed_batch_model(tmp_path)
    assert [r.shapes["x"] for r in bench(path, batches=(1,), **FAST).results] == [(1, 4)]
    assert [r.batch for r in bench(path, batches=None, **FAST).results] == [1]


def test_pinned_sequence_kept_and_batch_wins_with_a_note() -> None:
    report = bench(ENCODER, shapes={"hidden_states": (1, 16, 64)}, batches=(2,), **FAST)
    [stats] = report.results
    assert stats.shapes == {"hidden_states": (2, 16, 64)}
    assert len(stats.notes) == 1 and "batch 2 wins" in stats.notes[0]
    assert report.to_dict()["results"][0]["notes"] == stats.notes


def test_unpinned_symbols_take_defaults_and_agreeing_pin_has_no_note() -> None:
    assert bench(ENCODER, batches=(3,), **FAST).results[0].shapes == {"hidden_states": (3, 8, 64)}
    pinned = bench(ENCODER, shapes={"hidden_states": (2, 5, 64)}, batches=(2,), **FAST)
    assert pinned.results[0].shapes == {"hidden_states": (2, 5, 64)}
    assert pinned.results[0].notes == []


def test_batch_symbol_shared_across_inputs_and_fixed_inputs_left_alone(tmp_path: Path) -> None:
    path = save(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 17]>
        shared (float[N, 4] x, float[4, N] t, float[4] s) => (float[N, 4] y) {
            tt = Transpose(t)
            xs = Add(x, s)
            y = Add(xs, tt)
        }""",
    )
    [stats] = bench(path, batches=(3,), **FAST).results
    assert stats.shapes == {"x": (3, 4), "t": (4, 3), "s": (4,)}


def test_on_progress_counts_every_run() -> None:
    calls: list[tuple[int, int]] = []
    bench(CNN, batches=(1, 2), warmup=2, iters=3, on_progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 10) for i in range(1, 11)]


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"iters": 0}, "--iters"), ({"warmup": -1}, "--warmup"), ({"batches": (0,)}, "--batch")],
)
def test_bad_counts_are_refused(kwargs: dict, word: str) -> None:
    with pytest.raises(InferccError, match=word):
        bench(CNN, **{**FAST, **kwargs})


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InferccError, match="does not exist"):
        bench(tmp_path / "nope.onnx", **FAST)


# --------------------------------------------------------------------------- artifacts


class _FakeBackend:
    """Loads an artifact's model.onnx on onnxruntime and counts the loads."""

    name = "fake"

    def __init__(self, ok: bool = True):
        self.ok, self.loads = ok, 0

    def available(self) -> tuple[bool, str]:
        return (True, "") if self.ok else (False, "needs the fake accelerator")

    def version(self) -> str:
        return "0"

    def precisions(self, target: object) -> tuple[str, ...]:
        return ("fp32",)

    def compile(self, *args: object, **kwargs: object) -> dict:
        raise NotImplementedError

    def load(self, artifact: Artifact) -> Runner:
        self.loads += 1
        return default_runner(artifact.model_path)


def make_artifact(tmp_path: Path, backend: str) -> Path:
    directory = tmp_path / "artifact"
    directory.mkdir()
    shutil.copy(CNN, directory / MODEL_FILE)
    manifest = {"schema": "infercc.manifest/1", "backend": {"name": backend}}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory


def test_artifact_runs_on_the_backend_its_manifest_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeBackend()
    monkeypatch.setitem(registry._REGISTRY, "fake", fake)
    report = bench(make_artifact(tmp_path, "fake"), batches=(2,), **FAST)
    assert fake.loads == 1 and report.backend == "fake"
    assert report.results[0].shapes == {"image": (2, 3, 32, 32)}


def test_artifact_with_unknown_backend_names_it(tmp_path: Path) -> None:
    with pytest.raises(InferccError, match="no-such-backend"):
        open_runner(make_artifact(tmp_path, "no-such-backend"))


def test_artifact_with_unavailable_backend_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry._REGISTRY, "fake", _FakeBackend(ok=False))
    with pytest.raises(InferccError, match="'fake'.*fake accelerator"):
        open_runner(make_artifact(tmp_path, "fake"))


def test_directory_without_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InferccError, match="manifest.json"):
        open_runner(tmp_path)


# --------------------------------------------------------------------------- compare


def test_compare_a_model_with_itself() -> None:
    report = compare(CNN, CNN, batches=(1, 2), **FAST)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["a"] == data["b"] == {"path": str(CNN), "backend": "onnxruntime"}
    assert [r.batch for r in report.results] == [1, 2]
    for pair in report.results:
        assert pair.a.iters == pair.b.iters == 5
        assert pair.a.shapes == pair.b.shapes == {"image": (pair.batch, 3, 32, 32)}
        assert 0 < pair.ratio_p10 <= pair.ratio_median <= pair.ratio_p90 and pair.ratio_mean > 0
        assert pair.faster in {"a", "b", "same"}
    assert [(o.name, o.max_abs) for o in report.outputs] == [("logits", 0.0)]
    assert report.max_abs_diff == 0.0 and data["max_abs_diff"] == 0.0


class _Recording:
    def __init__(self, runner: Runner, label: str, log: list[str]):
        self.runner, self.label, self.log = runner, label, log
        self.input_names, self.output_names = runner.input_names, runner.output_names

    def run(self, feeds: Feeds) -> list[np.ndarray]:
        self.log.append(self.label)
        return self.runner.run(feeds)


def test_compare_interleaves_a_and_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    shutil.copy(CNN, a)
    shutil.copy(CNN, b)
    calls: list[str] = []
    real_open = bench_module.open_runner

    def recording_open(path: Path, **kwargs: bool) -> tuple[_Recording, onnx.ModelProto]:
        runner, skeleton = real_open(path, **kwargs)
        return _Recording(runner, Path(path).stem, calls), skeleton

    monkeypatch.setattr(bench_module, "open_runner", recording_open)
    progress: list[tuple[int, int]] = []
    compare(a, b, batches=(1, 2), warmup=2, iters=3, on_progress=lambda *p: progress.append(p))
    assert calls == ["a", "b"] * 10
    assert progress == [(i, 20) for i in range(1, 21)]


def test_compare_of_models_with_different_inputs_is_refused() -> None:
    with pytest.raises(InferccError) as info:
        compare(CNN, ENCODER, **FAST)
    assert "image" in info.value.message and "hidden_states" in info.value.message


def test_compare_feeds_b_in_its_own_dtype(tmp_path: Path) -> None:
    a = save(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 17]>
        f32 (float[N, 64] x) => (float[N, 64] y) { y = Relu(x) }""",
        "a.onnx",
    )
    b = save(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 17]>
        f16 (float16[N, 64] x) => (float[N, 64] y) {
            r = Relu(x)
            y = Cast<to = 1>(r)
        }""",
        "b.onnx",
    )
    report = compare(a, b, batches=(4,), **FAST)
    [diff] = report.outputs
    assert diff.reason is None and 0.0 < diff.max_abs < 1e-2  # fp16 rounding, not a failure


def test_output_diff_edge_cases() -> None:
    nan_inf = np.array([np.nan, np.inf, 1.0], np.float32)
    assert bench_module._diff("y", nan_inf, nan_inf.copy()).max_abs == 0.0
    other = bench_module._diff("y", np.zeros((2, 3)), np.zeros((3, 2)))
    assert other.max_abs is None and "shape" in other.reason
    assert bench_module._diff("y", np.array([1, 2]), np.array([1, 5])).max_abs == 3.0


@pytest.mark.parametrize(
    ("ratios", "faster"),
    [([0.98, 1.0, 1.02, 0.99, 1.01], "same"), ([1.5, 1.6, 1.7, 1.8], "a"), ([0.5, 0.6], "b")],
)
def test_faster_side_from_the_ratio_interval(ratios: list[float], faster: str) -> None:
    stats = bench_module._stats(np.ones(3), 1, {}, 0)
    assert bench_module._pair_stats(stats, stats, np.array(ratios)).faster == faster


def test_pinned_batch_is_kept_without_batch_option():
    from infercc.runtime.bench import bench

    report = bench(ENCODER, shapes={"hidden_states": (4, 16, 64)}, batches=None, warmup=1, iters=2)
    assert [r.batch for r in report.results] == [4]
    assert report.results[0].shapes["hidden_states"] == (4, 16, 64)
    assert report.results[0].notes == []


def test_onnxruntime_errors_become_one_line_errors(tmp_path: Path) -> None:
    runner, _ = open_runner(CNN)
    with pytest.raises(InferccError, match="onnxruntime failed to run the model"):
        runner.run({"image": np.zeros((1, 5, 32, 32), np.float32)})  # 5 channels, not 3
    bad = tmp_path / "bad.onnx"
    model = onnx.load(CNN)
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, bad)
    runner, _ = open_runner(bad)
    with pytest.raises(InferccError, match="onnxruntime cannot load"):
        runner.run({"image": np.zeros((1, 3, 32, 32), np.float32)})
