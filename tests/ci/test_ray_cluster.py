"""`infercc ci --ray` on a simulated cluster (`ray.cluster_utils.Cluster`, one per module): a
CPU head node and two nodes that declare one GPU each, of different accelerator types (A100 and
L4). A model lands on the node of its target; a crash is retried once on another node; a node
lost mid-build has its task rerun elsewhere by Ray; a target no node has is refused up front.

Slow (a cluster of three nodes takes seconds to start): run with `-m slow`. The default run
proves the same code paths on one node in tests/ci/test_ray_local.py: a GPU target placed on
the node of its accelerator, shared storage, a crash retried once, a killed worker rerun by
Ray, a target no node has refused with the types present."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import onnx
import pytest

ray = pytest.importorskip("ray", reason="the --ray tests need ray: pip install 'infercc[ray]'")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow

from ray._private import ray_constants  # noqa: E402

from infercc.ci import runner  # noqa: E402
from infercc.ci.runner import run_ci  # noqa: E402
from infercc.errors import InferccError  # noqa: E402
from tests.ci import ray_helpers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CNN = (ROOT / "examples" / "small_cnn.onnx").as_posix()
GPU_NODE = {"num_cpus": 1, "num_gpus": 1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-cluster")
    (root / "scratch").mkdir()
    c = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    nodes = {
        "A100": c.add_node(**GPU_NODE, resources={"accelerator_type:A100": 1}),
        "L4": c.add_node(**GPU_NODE, resources={"accelerator_type:L4": 1}),
    }
    env = ray_helpers.runtime_env(root / "scratch", root / "worker-cache")
    ray.init(address=c.address, log_to_driver=False, runtime_env=env)
    c.infercc_nodes = {kind: n.node_id for kind, n in nodes.items()}
    c.infercc_root = root
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(autouse=True)
def driver_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "driver-cache"))


def manifest(tmp_path: Path, *models: tuple[str, str], extra: str = "") -> Path:
    """A manifest of small_cnn under several (name, target) pairs, as optimized .onnx files;
    `extra` goes into the first model's table."""
    text = "[ci]\nwarmup = 1\niters = 3\n\n[defaults]\nbackend = 'none'\n"
    for i, (name, target) in enumerate(models):
        text += f'\n[[models]]\nname = "{name}"\npath = "{CNN}"\ntarget = "{target}"\n'
        text += extra if i == 0 else ""
    path = tmp_path / "infercc.toml"
    path.write_text(text)
    return path


def test_each_model_is_built_on_the_node_of_its_target(cluster, tmp_path: Path) -> None:
    fleet = manifest(
        tmp_path,
        ("on_a100", "a100"),
        ("on_l4", "l4"),
        ("on_cpu", "cpu"),
        extra=f'baseline = "{CNN}"\nmax_slowdown = 100.0\n',
    )
    report = run_ci(fleet, ray=True, out_dir=tmp_path / "out", step_summary=False)
    assert report.passed, [m.reason for m in report.failures()]
    placed = {m.name: m.placement for m in report.models}
    assert placed["on_a100"]["node_id"] == cluster.infercc_nodes["A100"]
    assert placed["on_a100"]["accelerator"] == "A100" and placed["on_a100"]["gpus"] == [0]
    assert placed["on_l4"]["node_id"] == cluster.infercc_nodes["L4"]
    assert placed["on_l4"]["accelerator"] == "L4"
    assert placed["on_cpu"]["gpus"] == []
    # built for its target there: no onnxruntime CPU fusions in the GPU builds
    nodes = {m.name: m.nodes_after for m in report.models}
    assert nodes["on_a100"] == nodes["on_l4"] == 10 and nodes["on_cpu"] == 8
    # away from the driver's node, inputs and artifacts went through the object store
    assert placed["on_a100"]["files"] == placed["on_l4"]["files"] == "object store"
    for name in ("on_a100", "on_l4", "on_cpu"):
        onnx.checker.check_model(str(tmp_path / "out" / f"{name}.opt.onnx"))
    # the artifact (and its baseline) went back to an A100 node to be timed there
    latency = report.models[0].latency
    assert latency["baseline"] == CNN and latency["ratio"] > 0
    kinds = sorted(tuple(n["accelerators"]) for n in report.ray["nodes"])
    assert kinds == [(), ("A100",), ("L4",)]


def test_on_shared_storage_workers_read_and_write_the_paths(cluster, tmp_path: Path) -> None:
    fleet = manifest(tmp_path, ("on_l4", "l4"))
    fleet.write_text("[ray]\nshared_storage = true\n\n" + fleet.read_text())
    report = run_ci(fleet, ray=True, out_dir=tmp_path / "out", step_summary=False)
    placed = report.models[0].placement
    assert report.passed and placed["node_id"] == cluster.infercc_nodes["L4"]
    assert placed["files"] == "shared storage"
    onnx.checker.check_model(str(tmp_path / "out" / "on_l4.opt.onnx"))
    assert report.ray["shared_storage"] is True


def test_a_crash_is_retried_once_on_another_node(cluster, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "build_and_validate", ray_helpers.crash_build)
    report = run_ci(
        manifest(tmp_path, ("crash_cpu", "cpu"), ("fine", "cpu")),
        ray=True,
        out_dir=tmp_path / "out",
        step_summary=False,
    )
    crashed, fine = report.models
    assert fine.passed and not crashed.passed
    assert "killed by SIGSEGV" in crashed.reason
    first = crashed.placement["first_attempt"]
    assert crashed.placement["attempts"] == 2
    assert first["node_id"] != crashed.placement["node_id"]


def test_a_target_no_node_has_names_the_types_present(cluster, tmp_path: Path) -> None:
    fleet = manifest(tmp_path, ("fine", "cpu"), ("hopper", "h100"), ("hopper2", "h100"))
    with pytest.raises(InferccError) as info:
        run_ci(fleet, ray=True, out_dir=tmp_path / "out", step_summary=False)
    assert info.value.message == (
        "target 'h100' (model hopper, hopper2) needs one GPU of accelerator type H100 and "
        "1 CPU(s), and no node of the Ray cluster has one (accelerator types present: A100, L4)"
    )
    assert "accelerator_type:H100" in info.value.hint
    assert not (tmp_path / "out").exists()


def _raylet_pid(node) -> int:
    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def test_a_node_lost_mid_build_has_its_task_rerun_elsewhere(cluster, tmp_path, monkeypatch):
    """Runs last: it removes one of the two A100 nodes it leaves behind."""
    monkeypatch.setattr(runner, "build_and_validate", ray_helpers.wait_for_node_then_build)
    spare = cluster.add_node(**GPU_NODE, resources={"accelerator_type:A100": 1})
    marker = cluster.infercc_root / "scratch" / "lost_a100.raylet"
    removed: list[str] = []

    def remove_the_node_it_runs_on() -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = int(marker.read_text())
        node = next(n for n in [spare, *cluster.worker_nodes] if _raylet_pid(n) == pid)
        removed.append(node.node_id)
        cluster.remove_node(node)

    remover = threading.Thread(target=remove_the_node_it_runs_on, daemon=True)
    remover.start()
    report = run_ci(
        manifest(tmp_path, ("lost_a100", "a100")),
        ray=True,
        out_dir=tmp_path / "out",
        step_summary=False,
    )
    remover.join(timeout=60)
    lost = report.models[0]
    assert removed, "the build never started"
    assert lost.passed, lost.reason
    assert lost.placement["node_id"] != removed[0]
    assert lost.placement["accelerator"] == "A100"
