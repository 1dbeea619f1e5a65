"""Hostile inputs through the command line: exit 2, one line naming the problem, nothing left.

For every case `infercc optimize` runs as a user runs it (`python -m infercc`) and must: exit
with status 2; print exactly one non-empty line on stderr, starting with "error:" and naming
the problem, never a traceback; write nothing in the output directory; and leave every input
file byte-identical (hashes before and after).

tests/test_cli.py already covers a text file, a file truncated in half, an empty file, a
two-node cycle, a node reading a missing initializer, two nodes writing one name, a future
opset and a missing file. Here: other forms of those (binary garbage, truncation inside a
tensor's bytes, a self-loop, a cycle beside valid nodes, a graph output nobody produces, a
dangling name inside an If branch, duplicate initializers, an output shadowing an
initializer), external data (absolute location, `../` out of the model's folder, shorter
than declared, missing file), and sample files given with --data (pickled object arrays,
wrong dtype, wrong shape, a missing input, an unknown input).

Absurd sizes during folding (ConstantOfShape / Expand / Tile to 10^12 elements) are decided
this way: folding refuses them by the fold limit *before* evaluating, so optimize succeeds
with them left unfolded (`--no-validate`: validation would have onnxruntime run the original,
which cannot allocate them either, and that is exit 2 with onnxruntime's message); a Shape of
such a tensor still folds, from the static shape, without allocating it. Peak memory of the
process stays far below the tensor's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import make_model, run_cli

FLOAT = TensorProto.FLOAT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infercc", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


# Runs many `infercc` command lines in one process (one interpreter start instead of one per
# case), each with file descriptors 1 and 2 pointed at its own files, so that what native code
# (onnxruntime's logger) writes is caught too.
DRIVER = """
import json, os, sys
from infercc import cli
for job in json.load(open(sys.argv[1])):
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        target = os.open(job[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["infercc", *job["args"]]
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    with open(job["code"], "w") as f:
        f.write(str(code))
"""


def run_many(jobs: dict[str, list[str]], work: Path) -> dict[str, subprocess.CompletedProcess]:
    """Each named command line's exit status, stdout and stderr."""
    spec = []
    for i, (name, args) in enumerate(jobs.items()):
        files = {k: str(work / f"job{i}.{k}") for k in ("stdout", "stderr", "code")}
        spec.append({"name": name, "args": args, **files})
    (work / "jobs.json").write_text(json.dumps(spec))
    driver = subprocess.run(
        [sys.executable, "-c", DRIVER, str(work / "jobs.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert driver.returncode == 0, driver.stderr
    return {
        job["name"]: subprocess.CompletedProcess(
            job["args"],
            int(Path(job["code"]).read_text()),
            Path(job["stdout"]).read_text(),
            Path(job["stderr"]).read_text(),
        )
        for job in spec
    }


def snapshot(d: Path) -> dict[str, str]:
    """Every file under `d` by relative path, with its SHA-256."""
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def make(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def vi(name: str, shape=(1, 4)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, FLOAT, list(shape))


def weight(name: str = "w", n: int = 4096) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(n, dtype=np.float32).reshape(-1, 4), name)


def good_model() -> onnx.ModelProto:
    """y = Relu(x) + w[0:1]: a model whose weight is read by a node (so it must be loaded)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Slice", ["w", "zero", "one"], ["w0"]),
        helper.make_node("Add", ["r", "w0"], ["y"]),
    ]
    inits = [
        weight(),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    return make(nodes, [vi("x")], [vi("y")], inits)


# --------------------------------------------------------------------------- the cases


def _bytes_cases(d: Path) -> dict[str, tuple[Path, str]]:
    good = good_model().SerializeToString()
    raw = numpy_helper.from_array(np.arange(4096, dtype=np.float32)).raw_data
    cut = good.find(raw[:64]) + 100  # inside the weight's raw bytes
    files = {
        "binary garbage": (b"\x00" * 64 + bytes(range(256)) * 4, "not a valid ONNX model"),
        "truncated inside a tensor": (good[:cut], "not a valid ONNX model"),
        "truncated by one byte": (good[:-1], "not a valid ONNX model"),
    }
    cases = {}
    for i, (name, (data, message)) in enumerate(files.items()):
        p = d / f"bytes{i}.onnx"
        p.write_bytes(data)
        cases[name] = (p, message)
    return cases


def _graph_cases(d: Path) -> dict[str, tuple[Path, str]]:
    relu = helper.make_node
    models = {
        "self loop": (
            make([relu("Add", ["x", "a"], ["a"])], [vi("x")], [vi("a")]),
            "cycle",
        ),
        "cycle beside valid nodes": (
            make(
                [
                    relu("Relu", ["x"], ["r"]),
                    relu("Add", ["r", "c"], ["a"]),
                    relu("Neg", ["a"], ["b"]),
                    relu("Abs", ["b"], ["c"]),
                ],
                [vi("x")],
                [vi("c")],
            ),
            "cycle",
        ),
        "output nobody produces": (
            make([relu("Relu", ["x"], ["r"])], [vi("x")], [vi("r"), vi("ghost")]),
            "'ghost'",
        ),
        "dangling name in an If branch": (_dangling_branch(), "'nowhere'"),
        "duplicate initializers": (
            make(
                [relu("Add", ["x", "w"], ["y"])],
                [vi("x")],
                [vi("y")],
                [weight("w", 4), weight("w", 4)],
            ),
            "duplicate value name 'w'",
        ),
        "node output shadows an initializer": (
            make(
                [relu("Relu", ["x"], ["w"]), relu("Add", ["x", "w"], ["y"])],
                [vi("x")],
                [vi("y")],
                [weight("w", 4)],
            ),
            "duplicate value name 'w'",
        ),
        "duplicate graph inputs": (
            make([relu("Add", ["x", "x"], ["y"])], [vi("x"), vi("x")], [vi("y")]),
            "duplicate value name 'x'",
        ),
    }
    cases = {}
    for i, (name, (model, message)) in enumerate(models.items()):
        p = d / f"graph{i}.onnx"
        p.write_bytes(model.SerializeToString())
        cases[name] = (p, message)
    return cases


def _dangling_branch() -> onnx.ModelProto:
    branch = helper.make_graph(
        [helper.make_node("Add", ["x", "nowhere"], ["t"])], "then", [], [vi("t")]
    )
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)
    return make([node], [cond, vi("x")], [vi("y")])


def _external(d: Path, edit) -> Path:
    """good_model() saved with external data, then edited by `edit(model_dir, tensor)`."""
    sub = d / "model"
    sub.mkdir(exist_ok=True)
    path = sub / "ext.onnx"
    onnx.save(good_model(), path, save_as_external_data=True, location="ext.data")
    model = onnx.load(path, load_external_data=False)
    (w,) = [t for t in model.graph.initializer if t.name == "w"]
    edit(sub, w)
    onnx.save(model, path)
    return path


def _set_location(tensor: onnx.TensorProto, location: str) -> None:
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def _absolute(sub: Path, w: onnx.TensorProto) -> None:
    _set_location(w, str((sub / "ext.data").resolve()))  # the file exists: still refused


def _escaping(sub: Path, w: onnx.TensorProto) -> None:
    (sub / "ext.data").rename(sub.parent / "outside.data")  # exists, but outside the folder
    _set_location(w, "../outside.data")


def _short(sub: Path, w: onnx.TensorProto) -> None:
    data = (sub / "ext.data").read_bytes()
    (sub / "ext.data").write_bytes(data[: len(data) // 2])


def _missing(sub: Path, w: onnx.TensorProto) -> None:
    (sub / "ext.data").unlink()


EXTERNAL = {
    "external data at an absolute path": (_absolute, "outside the model's folder"),
    "external data escaping with ../": (_escaping, "outside the model's folder"),
    "external data shorter than declared": (_short, "shorter than its shape needs"),
    "external data file missing": (_missing, "not found"),
}


def all_cases(d: Path) -> dict[str, tuple[Path, str]]:
    cases = {**_bytes_cases(d), **_graph_cases(d)}
    for name, (edit, message) in EXTERNAL.items():
        sub = d / name.replace(" ", "_").replace("/", "")
        sub.mkdir()
        cases[name] = (_external(sub, edit), message)
    return cases


CASE_NAMES = [
    "binary garbage",
    "truncated inside a tensor",
    "truncated by one byte",
    "self loop",
    "cycle beside valid nodes",
    "output nobody produces",
    "dangling name in an If branch",
    "duplicate initializers",
    "node output shadows an initializer",
    "duplicate graph inputs",
    *EXTERNAL,
]


def assert_refused(r: subprocess.CompletedProcess, message: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory) -> dict[str, tuple]:
    """Every case (models and --data samples) run once; name -> (result, message, dirs)."""
    root = tmp_path_factory.mktemp("hostile")
    cases: dict[str, tuple[list[str], str, Path, Path]] = {}
    for i, name in enumerate(CASE_NAMES):
        inputs, out = root / f"case{i}" / "in", root / f"case{i}" / "out"
        inputs.mkdir(parents=True)
        out.mkdir()
        path, message = all_cases(inputs)[name]
        cases[name] = (["optimize", str(path), "-o", str(out / "o.onnx")], message, inputs, out)
    # the same short data file, through the writer's external-data path (copied file to file)
    name = "external data shorter than declared"
    args, message, inputs, out = cases[name]
    cases[name + ", --external-data"] = ([*args, "--external-data"], message, inputs, out)
    for i, name in enumerate(SAMPLE_CASES):
        inputs, out = root / f"sample{i}" / "in", root / f"sample{i}" / "out"
        inputs.mkdir(parents=True)
        out.mkdir()
        src = inputs / "m.onnx"
        onnx.save(good_model(), src)
        data, message = _sample_cases(inputs)[name]
        args = ["optimize", str(src), "-o", str(out / "o.onnx"), "--data", str(data)]
        cases[name] = (args, message, inputs, out)
    before = {name: snapshot(c[2]) for name, c in cases.items()}
    work = root / "driver"
    work.mkdir()
    results = run_many({name: c[0] for name, c in cases.items()}, work)
    return {name: (results[name], c[1], before[name], c[2], c[3]) for name, c in cases.items()}


def _check(hostile_runs: dict[str, tuple], case: str) -> None:
    result, message, before, inputs, out = hostile_runs[case]
    assert_refused(result, message)
    assert snapshot(inputs) == before
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "case", [*CASE_NAMES, "external data shorter than declared, --external-data"]
)
def test_hostile_model(hostile_runs, case):
    _check(hostile_runs, case)


def test_external_weights_are_copied_not_mapped(tmp_path):
    # regression: writing external data decoded each external weight through a memory map
    # that the IR then kept, so a 2.2 GB model's optimize peaked at 2.2 GB of resident memory
    from infercc.ir import load_model, save_model

    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    onnx.save(good_model(), src, save_as_external_data=True, location="m.data")
    model = load_model(src)
    files = save_model(model, tmp_path / "o.onnx", external_data=True)
    assert [p.name for p in files] == ["o.onnx", "o.onnx.data"]
    assert model.graph.initializers["w"].const._array is None  # never decoded
    out = onnx.load(tmp_path / "o.onnx")
    (w,) = [t for t in out.graph.initializer if t.name == "w"]
    np.testing.assert_array_equal(numpy_helper.to_array(w), numpy_helper.to_array(weight()))


def test_cycle_names_only_the_nodes_on_it(hostile_runs):
    # regression: the message listed the first nodes of the graph, on the cycle or not
    line = hostile_runs["cycle beside valid nodes"][0].stderr
    assert "Relu" not in line
    assert all(op in line for op in ("Add", "Neg", "Abs")), line


def test_all_cases_are_listed(tmp_path):
    assert sorted(all_cases(tmp_path)) == sorted(CASE_NAMES)


def test_the_base_models_are_valid(tmp_path):
    """The cases break a model that optimizes fine, so each failure is the break's doing."""
    onnx.checker.check_model(good_model(), full_check=True)
    src = tmp_path / "m" / "ext.onnx"
    src.parent.mkdir()
    onnx.save(good_model(), src, save_as_external_data=True, location="ext.data")
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["validation"]["passed"] is True


# --------------------------------------------------------------------------- --data samples


def _sample_cases(d: Path) -> dict[str, tuple[Path, str]]:
    cases = {}
    pickled = d / "pickled"
    pickled.mkdir()
    np.save(pickled / "x.npy", np.array([[{"evil": 1}, 2, 3, 4]], dtype=object), allow_pickle=True)
    cases["pickled object array"] = (pickled, "pickle")
    for name, arrays, message in [
        ("wrong dtype", {"x": np.zeros((1, 4), np.float64)}, "is float64, the model expects"),
        ("wrong shape", {"x": np.zeros((1, 5), np.float32)}, "has shape [1, 5]"),
        ("missing input", {}, "lacks input 'x'"),
        (
            "unknown input",
            {"x": np.zeros((1, 4), np.float32), "z": np.zeros(1, np.float32)},
            "'z', which is not a model input",
        ),
    ]:
        p = d / f"{name.replace(' ', '_')}.npz"
        np.savez(p, **arrays)
        cases[name] = (p, message)
    return cases


SAMPLE_CASES = [
    "pickled object array",
    "wrong dtype",
    "wrong shape",
    "missing input",
    "unknown input",
]


@pytest.mark.parametrize("case", SAMPLE_CASES)
def test_hostile_samples(hostile_runs, case):
    _check(hostile_runs, case)


def test_driver_sees_what_a_process_sees(hostile_runs, tmp_path):
    """The one-process driver reports what `python -m infercc` does, for one case."""
    path, message = _graph_cases(tmp_path)["self loop"]
    alone = run("optimize", str(path), "-o", str(tmp_path / "o.onnx"))
    batched = hostile_runs["self loop"][0]
    assert (alone.returncode, alone.stderr.split(":")[0]) == (2, "error")
    assert batched.returncode == alone.returncode
    assert batched.stderr.replace(str(tmp_path), "").count("\n") == alone.stderr.count("\n")


# --------------------------------------------------------------------------- absurd sizes


def _absurd_model() -> onnx.ModelProto:
    """Expand to 10^12 floats (sliced back to one), ConstantOfShape of 10^12 read only by
    Shape, Tile to 10^12: 4 TB each if anything evaluated them."""
    huge = numpy_helper.from_array(np.array([10**6, 10**6], np.int64), "huge")
    reps = numpy_helper.from_array(np.array([10**6, 10**6], np.int64), "reps")
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
    zero = numpy_helper.from_array(np.array([0, 0], np.int64), "z2")
    ones = numpy_helper.from_array(np.array([1, 1], np.int64), "o2")
    n = helper.make_node
    nodes = [
        n("Expand", ["one", "huge"], ["big"]),
        n("Slice", ["big", "z2", "o2"], ["corner"]),
        n("ConstantOfShape", ["huge"], ["zeros"]),
        n("Shape", ["zeros"], ["zshape"]),
        n("Cast", ["zshape"], ["zf"], to=FLOAT),
        n("ReduceSum", ["zf"], ["total"], keepdims=0),
        n("Tile", ["one", "reps"], ["tiled"]),
        n("Slice", ["tiled", "z2", "o2"], ["tcorner"]),
        n("Add", ["x", "corner"], ["a"]),
        n("Add", ["a", "tcorner"], ["b"]),
        n("Add", ["b", "total"], ["y"]),
    ]
    return make(nodes, [vi("x", (1, 1))], [vi("y", (1, 1))], [huge, reps, one, zero, ones])


def test_absurd_sizes_stay_unfolded_without_allocating(tmp_path):
    src = tmp_path / "absurd.onnx"
    onnx.save(_absurd_model(), src)
    before = snapshot(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    rss_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = run("optimize", str(src), "-o", str(out / "o.onnx"), "--no-validate", "--json")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert r.returncode == 0, r.stderr
    assert peak_kb < 2 * 2**20 or peak_kb == rss_before  # far below 4 TB (KiB on Linux)
    report = json.loads(r.stdout)
    assert report["ops_after"].get("Expand") == 1 and report["ops_after"].get("Tile") == 1
    assert "ConstantOfShape" not in report["ops_after"]  # its Shape folded from the shape
    limit = [x for x in report["refusals"] if "over the fold limit" in x["reason"]]
    assert {x["op"] for x in limit} >= {"Expand", "Tile"}
    assert snapshot(tmp_path / "out") and all(v == snapshot(tmp_path)[k] for k, v in before.items())
    optimized = onnx.load(out / "o.onnx")
    consts = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    assert float(consts["total"]) == 2e6  # Shape(ConstantOfShape) folded to [1e6, 1e6]


def test_absurd_sizes_with_validation_exit_2(tmp_path):
    """Validation runs the original under onnxruntime, which cannot allocate 4 TB either."""
    src = tmp_path / "absurd.onnx"
    onnx.save(_absurd_model(), src)
    out = tmp_path / "out"
    out.mkdir()
    r = run("optimize", str(src), "-o", str(out / "o.onnx"))
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "onnxruntime" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert list(out.iterdir()) == []
