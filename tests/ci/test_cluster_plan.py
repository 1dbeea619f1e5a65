"""The parts of `infercc ci --ray` that need no cluster: what each target asks Ray for, the
check that refuses a target no node has, the files that travel to workers and back, the path
names in reports, the `--ray [ADDRESS]` option, and that the core package never imports ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from infercc.analysis.targets import GPUS
from infercc.ci import cluster
from infercc.ci.manifest import ModelSpec, RaySettings, load_config
from infercc.cli.app import bare_options
from infercc.config import BuildConfig
from infercc.errors import InferccError
from tests.helpers import make_model

ROOT = Path(__file__).resolve().parents[2]


def spec(name: str, target: str = "cpu") -> ModelSpec:
    return ModelSpec(name, Path(f"{name}.onnx"), Path(name), BuildConfig(target=target))


def node(node_id: str, cpus: float, gpus: float = 0, *types: str, alive: bool = True) -> dict:
    resources = {"CPU": cpus, "GPU": gpus, **{f"accelerator_type:{t}": 1.0 for t in types}}
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "NodeManagerHostname": "h"}


def test_every_gpu_target_asks_for_one_gpu_of_its_accelerator_type() -> None:
    settings = RaySettings(cpus=2)
    assert set(cluster.ACCELERATOR_TYPES) == set(GPUS)
    assert cluster.request_for(spec("m", "a100"), settings).options() == {
        "num_cpus": 2,
        "num_gpus": 1,
        "accelerator_type": "A100",
    }
    assert cluster.request_for(spec("m", "L4"), settings).accelerator == "L4"
    assert cluster.request_for(spec("m", "h100"), settings).accelerator == "H100"
    assert cluster.request_for(spec("m"), settings).options() == {"num_cpus": 2, "num_gpus": 0}
    # a target infercc does not know runs anywhere and fails as it does without Ray
    assert cluster.request_for(spec("m", "tpu9"), settings).gpus == 0


def test_a_target_no_live_node_has_is_refused_naming_the_types_present() -> None:
    specs = [spec("a"), spec("b", "a100"), spec("c", "a100")]
    requests = {s.name: cluster.request_for(s, RaySettings()) for s in specs}
    nodes = [node("n1", 8), node("n2", 8, 1, "L4"), node("n3", 8, 1, "A100", alive=False)]
    with pytest.raises(InferccError) as info:
        cluster.check_placeable(specs, requests, nodes)
    assert "target 'a100' (model b, c) needs one GPU of accelerator type A100" in info.value.message
    assert info.value.message.endswith("(accelerator types present: L4)")
    nodes[2]["Alive"] = True
    cluster.check_placeable(specs, requests, nodes)  # the A100 node is back: nothing raised
    # a node that advertises the type but declares no GPU cannot run it
    with pytest.raises(InferccError, match="present: A100, L4"):
        cluster.check_placeable(specs, requests, [node("x", 4, 0, "A100"), node("y", 4, 1, "L4")])


def test_more_cpus_than_any_node_has_is_refused() -> None:
    specs = [spec("a")]
    requests = {"a": cluster.request_for(specs[0], RaySettings(cpus=16))}
    with pytest.raises(InferccError, match="needs 16 CPU.s., and the largest node .* has 8"):
        cluster.check_placeable(specs, requests, [node("n", 8), node("m", 4)])


def test_the_ray_table_of_the_manifest(tmp_path: Path) -> None:
    path = tmp_path / "infercc.toml"
    path.write_text("[ray]\nshared_storage = true\ncpus = 4\n\n[[models]]\npath = 'a.onnx'\n")
    assert load_config(path).ray == RaySettings(shared_storage=True, cpus=4, max_retries=2)
    assert load_config(write(tmp_path, "[[models]]\npath = 'a.onnx'\n")).ray == RaySettings()
    for text, match in (
        ("[ray]\ncpus = 0\n", "cpus must be 1 or more"),
        ("[ray]\nmax_retries = -1\n", "max_retries must be 0 or more"),
        ("[ray]\nnodes = 3\n", r"\[ray\]: unknown key 'nodes'"),
        ("[ray]\nshared_storage = 'yes'\n", "shared_storage must be a bool"),
    ):
        with pytest.raises(InferccError, match=match):
            load_config(write(tmp_path, text + "[[models]]\npath = 'a.onnx'\n"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def test_an_onnx_input_travels_with_its_external_data(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "weights").mkdir(parents=True)
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])],
        [weight],
    )
    model = make_model(graph)
    onnx.save(model, src / "m.onnx", save_as_external_data=True, location="weights/m.bin")
    (src / "unrelated.bin").write_bytes(b"x")
    assert cluster.input_files(src / "m.onnx") == [src / "m.onnx", src / "weights" / "m.bin"]
    dest = tmp_path / "dest"
    assert cluster.unpack(cluster.pack_input(src / "m.onnx"), dest) == [
        dest / "m.onnx",
        dest / "weights",
    ]
    loaded = onnx.load(dest / "m.onnx")
    assert np.array_equal(
        numpy_helper.to_array(loaded.graph.initializer[0]), numpy_helper.to_array(weight)
    )
    assert not (dest / "unrelated.bin").exists()
    (src / "bad.onnx").write_text("not a model")
    assert cluster.input_files(src / "bad.onnx") == [src / "bad.onnx"]


def test_install_replaces_an_artifact_whole(tmp_path: Path) -> None:
    made = tmp_path / "made"
    (made / "cnn").mkdir(parents=True)
    (made / "cnn" / "model.onnx").write_text("new")
    (made / "cnn.opt.onnx").write_text("file")
    out = tmp_path / "out"
    (out / "cnn").mkdir(parents=True)
    (out / "cnn" / "stale.json").write_text("old")
    cluster.install(cluster.pack(sorted(made.iterdir())), out)
    assert sorted(p.name for p in out.iterdir()) == ["cnn", "cnn.opt.onnx"]
    assert [p.name for p in (out / "cnn").iterdir()] == ["model.onnx"]
    assert (out / "cnn" / "model.onnx").read_text() == "new"


def test_reports_name_paths_as_the_manifest_gives_them(tmp_path: Path) -> None:
    build = BuildConfig(data="samples")
    relative = ModelSpec("m", Path("models/m.onnx"), Path("build/m"), build, golden=Path("/g"))
    absolute, shown = cluster._absolute(relative)
    cwd = Path.cwd()
    assert absolute.path == cwd / "models" / "m.onnx" and absolute.data == cwd / "samples"
    assert absolute.golden == Path("/g") and absolute.build.target == "cpu"
    assert shown == {
        str(cwd / "models/m.onnx"): "models/m.onnx",
        str(cwd / "samples"): "samples",
        str(cwd / "build/m"): "build/m",
    }
    shown["/tmp/w/in/path/m.onnx"] = "models/m.onnx"
    value = {"reason": ["cannot read /tmp/w/in/path/m.onnx: bad"], "n": 3}
    assert cluster._show(value, shown) == {"reason": ["cannot read models/m.onnx: bad"], "n": 3}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["ci", "m.toml", "--ray"], ["ci", "m.toml", "--ray="]),
        (["ci", "m.toml", "--ray", "--json"], ["ci", "m.toml", "--ray=", "--json"]),
        (["ci", "m.toml", "--ray", "auto"], ["ci", "m.toml", "--ray", "auto"]),
        (["ci", "--ray", "10.0.0.1:6379", "m.toml"], ["ci", "--ray", "10.0.0.1:6379", "m.toml"]),
    ],
)
def test_ray_takes_an_optional_address(args: list[str], expected: list[str]) -> None:
    assert bare_options(args, ("--ray",)) == expected


def test_ray_before_the_manifest_is_bare(tmp_path: Path) -> None:
    manifest = tmp_path / "infercc.toml"
    manifest.write_text("")
    assert bare_options(["ci", "--ray", str(manifest)], ("--ray",)) == [
        "ci",
        "--ray=",
        str(manifest),
    ]


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_the_core_package_never_imports_ray() -> None:
    r = run_python(
        "import sys, infercc, infercc.api, infercc.ci.runner, infercc.ci.cluster, "
        "infercc.ci.isolate, infercc.cli\n"
        "print([m for m in sys.modules if m == 'ray' or m.startswith('ray.')])"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_ray_missing_is_a_one_line_error_with_the_install_hint(tmp_path: Path) -> None:
    manifest = tmp_path / "infercc.toml"
    manifest.write_text(
        f"[[models]]\npath = '{(ROOT / 'examples' / 'small_cnn.onnx').as_posix()}'\n"
    )
    code = (
        "import sys; sys.modules['ray'] = None\n"  # what an import of an absent package gives
        "from infercc.cli import main\n"
        f"sys.argv = ['infercc', 'ci', {str(manifest)!r}, '--ray']\n"
        "main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=os.environ
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        'error: --ray needs the ray package, which is not installed — pip install "infercc[ray]"'
    ]
    assert not (tmp_path / "build").exists()


@pytest.mark.skipif(os.name != "posix", reason="the sweep asks for a process with signal 0")
def test_a_task_removes_the_scratch_directories_of_dead_workers_only(tmp_path: Path) -> None:
    """A worker Ray kills (Ctrl-C's cancel, a lost worker) leaves its `infercc-ray-PID-*`
    directory behind; the next task on the node removes it, and nothing of a live process or
    of another name."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = tmp_path / f"{cluster.SCRATCH_PREFIX}{finished.stdout.strip()}-abc"
    live = tmp_path / f"{cluster.SCRATCH_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{cluster.SCRATCH_PREFIX}x1-ghi"
    for d in (dead, live, other):
        (d / "in").mkdir(parents=True)
        (d / "in" / "model.onnx").write_bytes(b"0" * 16)
    assert cluster.sweep_scratch(tmp_path) == [dead]
    assert not dead.exists() and live.is_dir() and other.is_dir()
    with cluster.task_scratch() as scratch:
        assert Path(scratch).name.startswith(f"{cluster.SCRATCH_PREFIX}{os.getpid()}-")
