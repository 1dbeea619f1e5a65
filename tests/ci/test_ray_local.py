"""`infercc ci --ray` on a one-node local Ray cluster (`ray.init(num_cpus=2)` with one GPU of
accelerator type A100 declared, one per module): the same verdicts, reports and artifacts as
`--jobs`; a GPU target lands on the node with its accelerator; shared storage; a crashing model
fails alone; a killed worker is rerun; Ctrl-C cancels and still writes the reports; workers'
tuning cache entries come home and make the next run hit; a target the cluster lacks is exit 2
before any work.

These are the default run's proof of the Ray code paths, each on the smallest input; the
multi-node cases (a model on the node of its target among several, a crash retried on another
node, a lost node) are tests/ci/test_ray_cluster.py, marked slow, and the whole eight-model
fleet against `--jobs 2` is `test_reports_and_artifacts_match_jobs_2`, slow too."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import onnx
import pytest

ray = pytest.importorskip("ray", reason="the --ray tests need ray: pip install 'infercc[ray]'")

from infercc.ci import cluster as cluster_mod  # noqa: E402
from infercc.ci import runner  # noqa: E402
from infercc.ci.runner import run_ci  # noqa: E402
from infercc.errors import InferccError  # noqa: E402
from infercc.runtime.tuning import TuningCache, file_sha256  # noqa: E402
from tests.ci import ray_helpers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CNN = (ROOT / "examples" / "small_cnn.onnx").as_posix()
ENCODER = (ROOT / "examples" / "tiny_encoder.onnx").as_posix()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-local")
    (root / "scratch").mkdir()
    env = ray_helpers.runtime_env(root / "scratch", root / "worker-cache")
    ray.init(
        num_cpus=2,
        num_gpus=1,  # declared, not used: a GPU target's build is placed by it, never runs on it
        resources={"accelerator_type:A100": 1},
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=env,
    )
    yield root
    ray.shutdown()


@pytest.fixture(autouse=True)
def driver_cache(tmp_path: Path, monkeypatch) -> Path:
    """The driver tunes into a cache of its own, never the user's (workers have theirs)."""
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "driver-cache"))
    return tmp_path / "driver-cache"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


FLEET = f"""
[ci]
warmup = 1
iters = 3

[[models]]
name = "small_cnn"
path = "{CNN}"
backend = "ort"
shapes = {{ image = "1x3x32x32" }}

[[models]]
name = "encoder"
path = "{ENCODER}"
backend = "none"
tolerances = {{ output = "1e-4:1e-3" }}

[[models]]
name = "encoder_fp16"
path = "{ENCODER}"
backend = "none"
precision = "fp16"

[[models]]
name = "broken"
path = "broken.onnx"

[[models]]
name = "missing"
path = "missing.onnx"

[[models]]
name = "not_qdq"
path = "{CNN}"
backend = "none"
precision = "int8"

[[models]]
name = "too_slow"
path = "{ENCODER}"
backend = "none"
latency_budget_ms = 0.000001

[[models]]
name = "against_baseline"
path = "{CNN}"
backend = "none"
baseline = "{CNN}"
max_slowdown = 100.0
"""


def normalized(report: dict, out_dir: Path) -> dict:
    """The JSON report without what differs between runs: times, placement, the executor,
    measured latencies (their verdicts and keys stay)."""
    text = json.dumps(report).replace(str(out_dir), "OUT")
    data = json.loads(text)
    for key in ("seconds", "jobs", "ray", "out_dir"):
        data.pop(key)
    for m in data["models"]:
        m.pop("seconds")
        m.pop("placement")
        if m["latency"]:
            m["latency"] = sorted(m["latency"])
        m["reason"] = re.sub(r"[\d.]+ ms", "N ms", m["reason"] or "")
    return data


def junit_cases(path: Path, out_dir: Path | None = None) -> dict[str, tuple]:
    """testcase -> (failure or error message, its type, system-out before any placement)."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:  # a model that could not be checked (a crash) is an <error>
            failure = case.find("error")
        out = case.find("system-out").text.split(", built on ")[0]
        out = re.sub(r"[\d.]+ ms", "N ms", out.replace(str(out_dir), "OUT"))
        message = None if failure is None else failure.get("message")
        message = re.sub(r"[\d.]+ ms", "N ms", message or "")
        cases[case.get("name")] = (message, None if failure is None else failure.get("type"), out)
    return cases


def verdict_table(markdown: str) -> list[str]:
    """The Markdown summary's first table, without the p50 column."""
    lines = markdown.split("\n\n")[0].splitlines()
    return [re.sub(r"[\d.]+ ms", "N ms", "|".join(line.split("|")[:7])) for line in lines]


ONE_AND_BROKEN = f"""
[ci]
warmup = 1
iters = 3

[[models]]
name = "small_cnn"
path = "{CNN}"
backend = "ort"
shapes = {{ image = "1x3x32x32" }}

[[models]]
name = "broken"
path = "broken.onnx"
"""


def test_one_model_and_a_broken_one_match_jobs_1(cluster, tmp_path: Path) -> None:
    """The fast sibling of the slow eight-model comparison below: one artifact and one failure,
    the same reports and bytes on Ray as with --jobs 1."""
    write(tmp_path / "broken.onnx", "this is not an ONNX model\n")
    manifest = write(tmp_path / "infercc.toml", ONE_AND_BROKEN)
    reports = {}
    for mode, kwargs in (("jobs", {"jobs": 1}), ("ray", {"ray": True})):
        out = tmp_path / f"out-{mode}"
        reports[mode] = run_ci(
            manifest,
            out_dir=out,
            junit=tmp_path / f"{mode}.xml",
            json_report=tmp_path / f"{mode}.json",
            markdown=tmp_path / f"{mode}.md",
            step_summary=False,
            **kwargs,
        )
        assert normalized(reports[mode].to_dict(), out) == normalized(
            json.loads((tmp_path / f"{mode}.json").read_text()), out
        )
    jobs, on_ray = reports["jobs"], reports["ray"]
    assert [m.name for m in on_ray.failures()] == ["broken"]
    assert normalized(on_ray.to_dict(), tmp_path / "out-ray") == normalized(
        jobs.to_dict(), tmp_path / "out-jobs"
    )
    assert junit_cases(tmp_path / "ray.xml", tmp_path / "out-ray") == junit_cases(
        tmp_path / "jobs.xml", tmp_path / "out-jobs"
    )
    ray_md, jobs_md = (tmp_path / "ray.md").read_text(), (tmp_path / "jobs.md").read_text()
    assert verdict_table(ray_md) == verdict_table(jobs_md)
    assert "Built on the Ray cluster at" in ray_md and "Built on the Ray" not in jobs_md
    assert f"| small_cnn | {socket.gethostname()} | A100 |" in ray_md  # the node's accelerator
    name = "small_cnn/model.onnx"
    assert file_sha256(tmp_path / "out-ray" / name) == file_sha256(tmp_path / "out-jobs" / name)
    assert not list((tmp_path / "out-ray").glob(".incoming-*"))
    placed = on_ray.models[0].placement
    assert placed["node_id"] == ray.get_runtime_context().get_node_id()
    assert placed["attempts"] == 1 and placed["files"] == "the driver's node"
    assert placed["gpus"] == []  # a cpu target is given no GPU, on a node that has one
    assert jobs.models[0].placement is None and on_ray.jobs is None


def test_a_gpu_target_is_placed_on_the_node_of_its_accelerator(cluster, tmp_path: Path) -> None:
    """One model, target a100: built for its target on the node that declares an A100 (the
    fast sibling of test_ray_cluster's placement among several nodes)."""
    manifest = write(
        tmp_path / "m.toml",
        f'[defaults]\nbackend = "none"\n\n[[models]]\nname = "on_a100"\npath = "{CNN}"\n'
        'target = "a100"\n',
    )
    report = run_ci(manifest, ray=True, out_dir=tmp_path / "out", step_summary=False)
    assert report.passed, [m.reason for m in report.failures()]
    model = report.models[0]
    assert model.placement["node_id"] == ray.get_runtime_context().get_node_id()
    assert model.placement["accelerator"] == "A100" and model.placement["gpus"] == [0]
    assert model.nodes_after == 10  # the GPU build: no onnxruntime CPU fusions (cpu: 8)
    onnx.checker.check_model(str(tmp_path / "out" / "on_a100.opt.onnx"))
    assert [n["accelerators"] for n in report.ray["nodes"]] == [["A100"]]


def test_on_shared_storage_the_worker_reads_and_writes_the_paths(cluster, tmp_path) -> None:
    manifest = write(
        tmp_path / "m.toml",
        f'[ray]\nshared_storage = true\n\n[[models]]\nname = "cnn"\npath = "{CNN}"\n'
        'backend = "none"\n',
    )
    report = run_ci(manifest, ray=True, out_dir=tmp_path / "out", step_summary=False)
    assert report.passed and report.models[0].placement["files"] == "shared storage"
    assert report.ray["shared_storage"] is True
    onnx.checker.check_model(str(tmp_path / "out" / "cnn.opt.onnx"))


@pytest.mark.slow
def test_reports_and_artifacts_match_jobs_2(cluster, tmp_path: Path) -> None:
    write(tmp_path / "broken.onnx", "this is not an ONNX model\n")
    manifest = write(tmp_path / "infercc.toml", FLEET)
    reports = {}
    for mode, kwargs in (("jobs", {"jobs": 2}), ("ray", {"ray": True})):
        out = tmp_path / f"out-{mode}"
        report = run_ci(
            manifest,
            out_dir=out,
            junit=tmp_path / f"{mode}.xml",
            json_report=tmp_path / f"{mode}.json",
            markdown=tmp_path / f"{mode}.md",
            step_summary=False,
            **kwargs,
        )
        reports[mode] = report
        assert normalized(report.to_dict(), out) == normalized(
            json.loads((tmp_path / f"{mode}.json").read_text()), out
        )
    jobs, on_ray = reports["jobs"], reports["ray"]
    assert [m.name for m in on_ray.failures()] == ["broken", "missing", "not_qdq", "too_slow"]
    assert normalized(on_ray.to_dict(), tmp_path / "out-ray") == normalized(
        jobs.to_dict(), tmp_path / "out-jobs"
    )
    assert junit_cases(tmp_path / "ray.xml", tmp_path / "out-ray") == junit_cases(
        tmp_path / "jobs.xml", tmp_path / "out-jobs"
    )
    ray_md, jobs_md = (tmp_path / "ray.md").read_text(), (tmp_path / "jobs.md").read_text()
    assert verdict_table(ray_md) == verdict_table(jobs_md)
    # the accelerator column names the node's (it declares an A100), whatever the target
    assert f"| small_cnn | {socket.gethostname()} | A100 |" in ray_md
    # byte for byte what --jobs wrote
    for name in ("small_cnn/model.onnx", "encoder.opt.onnx", "encoder_fp16.opt.onnx"):
        assert file_sha256(tmp_path / "out-ray" / name) == file_sha256(tmp_path / "out-jobs" / name)
    assert (tmp_path / "out-ray" / "small_cnn" / "manifest.json").is_file()
    assert not list((tmp_path / "out-ray").glob(".incoming-*"))
    placed = {m.name: m.placement for m in on_ray.models}
    node = ray.get_runtime_context().get_node_id()
    assert placed["small_cnn"]["node_id"] == node and placed["small_cnn"]["attempts"] == 1
    assert placed["small_cnn"]["files"] == "the driver's node"  # one node: nothing sent
    assert placed["small_cnn"]["queued_s"] >= 0 and placed["small_cnn"]["running_s"] > 0
    assert jobs.models[0].placement is None and on_ray.jobs is None
    assert on_ray.ray["nodes"][0]["cpus"] == 2
    baseline = {m.name: m for m in on_ray.models}["against_baseline"].latency
    assert baseline["baseline"] == CNN and baseline["ratio"] > 0


def test_a_crashing_model_fails_alone_after_one_retry(cluster, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "build_and_validate", ray_helpers.crash_build)
    manifest = write(
        tmp_path / "m.toml",
        f"""
[defaults]
backend = "none"

[[models]]
name = "crash_me"
path = "{CNN}"

[[models]]
name = "fine"
path = "{ENCODER}"
""",
    )
    report = run_ci(manifest, ray=True, junit=tmp_path / "j.xml", step_summary=False)
    crashed, fine = report.models
    assert fine.passed and fine.placement["attempts"] == 1
    assert not crashed.passed
    assert crashed.reason == "the build process died (killed by SIGSEGV (signal 11))"
    # one node: the one retry runs where the first did, and that is all
    assert crashed.placement["attempts"] == 2
    first = crashed.placement["first_attempt"]
    assert first["reason"] == "the build process killed by SIGSEGV (signal 11)"
    cases = junit_cases(tmp_path / "j.xml")
    assert cases["crash_me"][0].startswith("the build process died") and cases["fine"][0] == ""


def test_a_killed_worker_is_rerun_by_ray(cluster, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "build_and_validate", ray_helpers.kill_worker_once_build)
    manifest = write(tmp_path / "m.toml", f'[[models]]\nname = "victim"\npath = "{CNN}"\n')
    before = _scratch_dirs()
    report = run_ci(manifest, ray=True, out_dir=tmp_path / "out", step_summary=False)
    assert (cluster / "scratch" / "victim.killed").is_file()  # the first worker was killed
    assert report.passed, report.models[0].reason
    assert (tmp_path / "out" / "victim" / "model.onnx").is_file()
    # the killed worker's scratch directory was removed by the task that ran after it: what
    # is new belongs to a running worker (another test's task), none to a dead one
    left = [d for d in _scratch_dirs() - before if not _running_owner(d)]
    assert not left, left


def _scratch_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob(f"{cluster_mod.SCRATCH_PREFIX}*"))


def _running_owner(scratch: Path) -> bool:
    pid = scratch.name[len(cluster_mod.SCRATCH_PREFIX) :].split("-", 1)[0]
    return pid.isdigit() and cluster_mod._running(int(pid))


def test_ctrl_c_cancels_and_still_writes_the_reports(cluster, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "build_and_validate", ray_helpers.slow_build)
    manifest = write(
        tmp_path / "m.toml",
        f"""
[defaults]
backend = "none"

[[models]]
name = "slow"
path = "{CNN}"

[[models]]
name = "quick"
path = "{ENCODER}"
""",
    )

    def interrupt_after_quick(name: str, what: str) -> None:
        if (name, what) == ("quick", "built"):
            raise KeyboardInterrupt

    report = run_ci(
        manifest,
        ray=True,
        junit=tmp_path / "j.xml",
        json_report=tmp_path / "r.json",
        step_summary=False,
        on_event=interrupt_after_quick,
    )
    assert report.interrupted
    slow, quick = report.models
    assert quick.passed and not slow.passed
    assert slow.reason == "cancelled: the run was interrupted (Ctrl-C)"
    assert json.loads((tmp_path / "r.json").read_text())["interrupted"] is True
    assert set(junit_cases(tmp_path / "j.xml")) == {"slow", "quick"}
    pid = int((cluster / "scratch" / "slow.pid").read_text())
    assert _gone(pid), "the cancelled build is still running"


def _gone(pid: int, patience_s: float = 30.0) -> bool:
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def tuned_points(artifact: Path) -> list[str]:
    manifest = json.loads((artifact / "manifest.json").read_text())
    return [p["cache"] for p in manifest["backend"]["points"]]


def test_workers_cache_entries_are_merged_so_the_next_run_hits(
    cluster, tmp_path, driver_cache
) -> None:
    manifest = write(
        tmp_path / "m.toml",
        f'[[models]]\nname = "cnn"\npath = "{CNN}"\nshapes = {{ image = "1x3x32x32" }}\n',
    )
    worker_cache = cluster / "worker-cache"
    TuningCache(worker_cache).clear()
    run_ci(manifest, ray=True, out_dir=tmp_path / "one", step_summary=False)
    assert tuned_points(tmp_path / "one" / "cnn") == ["miss"]
    model_hash = file_sha256(tmp_path / "one" / "cnn" / "model.onnx")
    with TuningCache(driver_cache) as cache:
        assert [e["model_hash"] for e in cache.entries()] == [model_hash]
    # the model lands on a host whose cache has never seen it: the driver's entries go along
    assert TuningCache(worker_cache).clear() == 1
    run_ci(manifest, ray=True, out_dir=tmp_path / "two", step_summary=False)
    assert tuned_points(tmp_path / "two" / "cnn") == ["hit"]


def test_a_target_no_node_has_is_exit_2_before_any_work(cluster, tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "m.toml",
        f'[[models]]\nname = "cnn"\npath = "{CNN}"\n\n'
        f'[[models]]\nname = "gpu"\npath = "{CNN}"\ntarget = "h100"\nbackend = "none"\n',
    )
    with pytest.raises(InferccError) as info:
        run_ci(manifest, ray=True, out_dir=tmp_path / "out", step_summary=False)
    assert info.value.message == (
        "target 'h100' (model gpu) needs one GPU of accelerator type H100 and 1 CPU(s), and no "
        "node of the Ray cluster has one (accelerator types present: A100)"
    )
    assert "accelerator_type:H100" in info.value.hint
    address = ray.get_runtime_context().gcs_address
    r = subprocess.run(
        [sys.executable, "-m", "infercc", "ci", str(manifest), "--ray", address],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "target 'h100' (model gpu) needs one GPU of accelerator type H100" in errors[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "build").exists()
