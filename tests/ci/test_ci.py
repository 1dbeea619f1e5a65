"""`infercc ci`: the example manifest passes; a broken model fails alone, named, with one JUnit
failure; bad manifests are one-line errors (exit 2); reports and budgets."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc.ci.manifest import load_config
from infercc.ci.reports import junit_xml
from infercc.ci.runner import run_ci
from infercc.errors import InferccError
from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CNN = (EXAMPLES / "small_cnn.onnx").as_posix()
ENCODER = (EXAMPLES / "tiny_encoder.onnx").as_posix()


@pytest.fixture(autouse=True)
def private_tuning_cache(tmp_path: Path, monkeypatch) -> None:
    """Artifacts built here tune into a cache of their own, never the user's."""
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "tuning-cache"))


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`infercc ARGS` in this process (`tests.helpers.run_cli`), outside GitHub Actions."""
    return helpers.run_cli(*args, cwd=cwd, env={"GITHUB_STEP_SUMMARY": None})


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def junit_failures(path: Path, kind: str = "failure") -> dict[str, str]:
    """testcase name -> message, for the testcases with a <failure> (or `kind`: <error>)."""
    root = ET.parse(path).getroot()
    return {
        case.get("name"): case.find(kind).get("message")
        for case in root.iter("testcase")
        if case.find(kind) is not None
    }


# --------------------------------------------------------------------------- acceptance


def test_example_manifest_passes(tmp_path: Path) -> None:
    r = run_cli(
        "ci",
        str(EXAMPLES / "ci" / "infercc.toml"),
        "--out-dir",
        str(tmp_path / "out"),
        "--junit",
        str(tmp_path / "junit.xml"),
        "--json-report",
        str(tmp_path / "report.json"),
        "--json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["passed"] and data["failed"] == 0
    # the report file says what ran, as the printed one does
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["run"] == data["run"] and saved["run"]["command"] == "ci"
    assert saved["run"]["options"]["out_dir"] == str(tmp_path / "out")
    assert all(m["build"]["target"] == "cpu" for m in saved["models"])
    names = [m["name"] for m in data["models"]]
    assert names == ["small_cnn", "tiny_encoder", "tiny_encoder_fp16"]
    assert all(m["validation"]["passed"] for m in data["models"])
    assert data["models"][0]["latency"]["budget_ms"] == 250.0
    assert (tmp_path / "out" / "small_cnn" / "manifest.json").is_file()
    assert (tmp_path / "out" / "tiny_encoder_fp16.opt.onnx").is_file()
    assert junit_failures(tmp_path / "junit.xml") == {}
    assert len(list(ET.parse(tmp_path / "junit.xml").getroot().iter("testcase"))) == 3


def test_one_broken_model_fails_alone_in_parallel(tmp_path: Path) -> None:
    write(tmp_path / "broken.onnx", "this is not an ONNX model\n")
    manifest = write(
        tmp_path / "infercc.toml",
        f"""
[[models]]
path = "{CNN}"
shapes = {{ image = "1x3x32x32" }}

[[models]]
name = "broken"
path = "broken.onnx"
""",
    )
    junit = tmp_path / "junit.xml"
    r = run_cli("ci", str(manifest), "--jobs", "2", "--junit", str(junit))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "broken" in r.stdout and "not a valid ONNX model" in r.stdout
    # a model that cannot be read is an error (no verdict on its numbers), not a failure
    assert junit_failures(junit) == {}
    errors = junit_failures(junit, "error")
    assert list(errors) == ["broken"]
    assert "not a valid ONNX model" in errors["broken"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "0", "1")


def test_latency_over_budget_fails_that_model(tmp_path: Path, monkeypatch) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    manifest = write(
        tmp_path / "m.toml",
        f"""
[ci]
warmup = 1
iters = 3

[[models]]
name = "fast_enough"
path = "{ENCODER}"
backend = "none"

[[models]]
name = "too_slow"
path = "{ENCODER}"
backend = "none"
latency_budget_ms = 0.000001
""",
    )
    report = run_ci(manifest, out_dir=tmp_path / "out", json_report=tmp_path / "r.json")
    assert not report.passed
    assert [m.name for m in report.failures()] == ["too_slow"]
    slow = report.failures()[0]
    assert slow.stage == "bench" and "over the budget" in slow.reason
    assert slow.latency["p50_ms"] > slow.latency["budget_ms"]
    assert report.models[0].passed and report.models[0].latency is None
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved == json.loads(json.dumps(report.to_dict()))
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "| too_slow | **FAILED**" in text
    assert junit_failures_from_text(junit_xml(report)) == ["too_slow"]


def junit_failures_from_text(text: str) -> list[str]:
    root = ET.fromstring(text.split("\n", 1)[1])
    return [c.get("name") for c in root.iter("testcase") if c.find("failure") is not None]


def test_int8_needs_a_qdq_model(tmp_path: Path) -> None:
    qdq = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4] x) => (float[1, 4] y) <float s = {0.05}, int8 zp = {0}> {
          q = QuantizeLinear(x, s, zp)
          d = DequantizeLinear(q, s, zp)
          y = Relu(d)
        }
        """
    )
    onnx.save(qdq, tmp_path / "qdq.onnx")
    manifest = write(
        tmp_path / "m.toml",
        f"""
[defaults]
precision = "int8"
backend = "none"

[[models]]
path = "qdq.onnx"

[[models]]
name = "float"
path = "{CNN}"
""",
    )
    report = run_ci(manifest, out_dir=tmp_path / "out", step_summary=False)
    by_name = {m.name: m for m in report.models}
    assert by_name["qdq"].passed, by_name["qdq"].reason
    assert by_name["qdq"].precision == "int8"
    assert not by_name["float"].passed and "QDQ" in by_name["float"].reason


def test_pyproject_tool_table_and_only(tmp_path: Path) -> None:
    pyproject = write(
        tmp_path / "pyproject.toml",
        f"""
[project]
name = "demo"

[[tool.infercc.models]]
name = "a"
path = "{ENCODER}"
backend = "none"
tolerances = {{ output = {{ atol = 1e-3, rtol = 1e-2 }} }}

[[tool.infercc.models]]
name = "b"
path = "missing.onnx"
""",
    )
    config = load_config(pyproject)
    assert [m.name for m in config.models] == ["a", "b"]
    assert config.models[0].tolerances == {"output": (1e-3, 1e-2)}
    assert config.out_dir == tmp_path / "build" / "infercc-ci"
    report = run_ci(pyproject, out_dir=tmp_path / "out", only=["a"], step_summary=False)
    assert [m.name for m in report.models] == ["a"] and report.passed
    tols = report.models[0].validation["tolerances"]
    assert tols == {"output": {"atol": 1e-3, "rtol": 1e-2}}
    missing = run_ci(pyproject, out_dir=tmp_path / "out", only=["b"], step_summary=False)
    assert not missing.passed and "missing.onnx" in missing.models[0].reason


# --------------------------------------------------------------------------- bad manifests


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[[models]]\npath = \n", "not valid TOML"),
        ("[ci]\nout_dir = 'x'\n", "no models"),
        ("[[models]]\npath = 'a.onnx'\nbudget = 3\n", "unknown key 'budget'"),
        ("[[models]]\npath = 'a.onnx'\natol = 'big'\n", "atol must be a float"),
        ("[[models]]\npath = 'a.onnx'\nprecision = 'int4'\n", "precision 'int4'"),
        ("[[models]]\nname = 'x'\n", "has no path"),
        ("[[models]]\npath = 'a.onnx'\n[[models]]\npath = 'b/a.onnx'\n", "two models"),
        ("[[models]]\npath = 'a.onnx'\nshapes = { x = '1xq' }\n", "shapes.x"),
        ("[[models]]\npath = 'a.onnx'\nlatency_budget_ms = 0\n", "positive"),
        ("[modelz]\n", "unknown table"),
    ],
)
def test_bad_manifest_is_an_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(InferccError, match=match):
        load_config(write(tmp_path / "infercc.toml", text))


def test_bad_manifest_exits_2_on_one_line(tmp_path: Path) -> None:
    manifest = write(tmp_path / "infercc.toml", "[[models]]\npathh = 'a.onnx'\n")
    r = run_cli("ci", str(manifest))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "unknown key 'pathh'" in r.stderr
    assert not (tmp_path / "build").exists()


def test_manifest_paths_are_relative_to_the_manifest(tmp_path: Path) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    np.save(tmp_path / "x.npy", np.zeros(1))
    manifest = write(sub / "infercc.toml", "[[models]]\npath = '../m.onnx'\ndata = 'd'\n")
    config = load_config(manifest)
    assert config.models[0].path == tmp_path / "m.onnx"
    assert config.models[0].data == sub / "d"
    assert config.models[0].output == sub / "build" / "infercc-ci" / "m"


# --------------------------------------------------------------------------- build configs


def test_a_model_entry_is_a_build_config(tmp_path: Path) -> None:
    from infercc.config import BuildConfig, TrtOptions
    from infercc.data.profiles import parse_profile

    ranges = write(tmp_path / "ranges.json", json.dumps({"h": {"min": -1.0, "max": 2.0}}))
    manifest = write(
        tmp_path / "infercc.toml",
        f"""
[defaults]
tensorrt = {{ opt_level = 2 }}

[[models]]
name = "gpu"
path = "{CNN}"
target = "a100"
precision = "fp16"
keep_fp32 = ["Softmax"]
ranges = "{ranges.name}"
fold_limit = "1MiB"
shapes = {{ image = "1x3x32x32:4x3x32x32:8x3x32x32" }}
tensorrt = {{ workspace = "1GiB", hw_compat = "ampere+" }}
""",
    )
    build = load_config(manifest).models[0].build
    assert build == BuildConfig(
        target="a100",
        backend="tensorrt",
        precision="fp16",
        keep_fp32=("Softmax",),
        ranges={"h": (-1.0, 2.0)},
        fold_limit=2**20,
        shapes=(parse_profile("image=1x3x32x32:4x3x32x32:8x3x32x32"),),
        tensorrt=TrtOptions(workspace=2**30, hw_compat="ampere+", opt_level=2),
    )


def test_an_option_without_effect_is_a_bad_manifest(tmp_path: Path) -> None:
    manifest = write(
        tmp_path / "infercc.toml",
        f'[[models]]\npath = "{CNN}"\ntensorrt = {{ workspace = "1GiB" }}\n',
    )
    with pytest.raises(InferccError, match=r"models\[0\]: --workspace has no effect"):
        load_config(manifest)
    r = run_cli("ci", str(manifest))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_junit_counts_errors_apart_from_failures(tmp_path: Path) -> None:
    from infercc.ci.manifest import ModelSpec
    from infercc.ci.results import CiReport, ModelResult
    from infercc.ci.runner import build_and_validate

    missing = build_and_validate(
        ModelSpec("missing", tmp_path / "nope.onnx", tmp_path / "missing.opt.onnx")
    )
    assert not missing.passed and missing.error and "not found" in missing.reason
    failed = ModelResult("wrong", "w.onnx", False, "validation failed: y: cosine 0.5 below 0.9999")
    ok = ModelResult("fine", "f.onnx", True, stage="done")
    report = CiReport("infercc.toml", "out", 1, [missing, failed, ok], 1.0)
    root = ET.fromstring(junit_xml(report).split("?>", 1)[1])
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["missing"].find("error") is not None and cases["missing"].find("failure") is None
    assert cases["wrong"].find("failure").get("message").startswith("validation failed")
    assert report.to_dict()["errors"] == 1 and report.to_dict()["failed"] == 2


def test_a_near_constant_outputs_cosine_is_not_the_worst():
    """A near-constant output's cosine is n/a (null): the table's worst cosine is the other
    outputs'; a null cosine of an ordinary output still ranks worst (NaN)."""
    from infercc.ci.reports import worst_metrics

    outputs = {
        "map": {"cosine": None, "max_abs": 0.0, "near_constant": True},
        "logits": {"cosine": 0.99991, "max_abs": 1e-5},
    }
    assert worst_metrics({"outputs": outputs})["cosine"] == 0.99991
    outputs["broken"] = {"cosine": None, "max_abs": None}
    assert worst_metrics({"outputs": outputs})["cosine"] is None  # NaN, as JSON null
    assert worst_metrics({"outputs": {"map": outputs["map"]}})["cosine"] is None
