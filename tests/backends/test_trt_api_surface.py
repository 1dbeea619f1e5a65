"""The TensorRT and GPU-provider names infercc's code uses, checked against the real packages.

The name lists in tests/data/tensorrt_api/ and tests/data/onnxruntime_gpu_api/ were read from
the real wheels by bench/trt_api_surface.py (no download or GPU here). The TensorRT names the
code uses come from a walk of its syntax tree (tests/backends/trt_surface.py), each with the
TensorRT versions whose code path uses it (`infercc.backends.trt.versions` marks); the
onnxruntime provider options are the ones the ort backend's tuner hands to
`InferenceSession`. The stand-in `tensorrt` module (test_tensorrt_fake.py) is held to the
same lists.
"""

from __future__ import annotations

import ast
import base64
import re
from pathlib import Path
from typing import Any

import onnx
import pytest

from infercc.backends.ort import config as ort_backend
from infercc.backends.trt import build, calibrator
from infercc.backends.trt.versions import SUPPORTED_MAJORS
from infercc.errors import InferccError
from tests.backends import test_tensorrt_fake as fake
from tests.backends import trt_surface as surface
from tests.helpers import make_model

TRT_LISTS = surface.tensorrt_lists()
ORT_LISTS = surface.onnxruntime_lists()
USES, PROBLEMS = surface.collect()
SOURCES = surface.package_sources()
PRECISION = "infercc.backends.trt.precision"
BUILD = "infercc.backends.trt.build"


def _missing_text(missing: list[surface.Use]) -> str:
    return "; ".join(f"{u.name} ({u.where}, used on {u.span})" for u in missing)


def _collect_with(module: str, old: str, new: str) -> tuple[list, list]:
    """The walk over the package with one edit to one module's source."""
    assert old in SOURCES[module], f"{old!r} is no longer in {module}"
    return surface.collect({**SOURCES, module: SOURCES[module].replace(old, new, 1)})


def _versions(major: int) -> list[str]:
    return [v for v in TRT_LISTS if surface.major_of(v) == major]


# --------------------------------------------------------------------------- the lists


def test_lists_cover_two_releases_of_each_supported_major():
    for major in SUPPORTED_MAJORS:
        assert len(_versions(major)) >= 2, f"fewer than two TensorRT {major}.x name lists"
    for version, names in TRT_LISTS.items():
        assert len(names) > 1000 and {"Builder", "OnnxParser", "ICudaEngine"} <= names, version


def test_lists_show_what_tensorrt_11_removed():
    removed = {
        "FP16",
        "EXPLICIT_BATCH",
        "int8_calibrator",
        "IInt8EntropyCalibrator2",
        "IInt8MinMaxCalibrator",
        "platform_has_fast_fp16",
        "set_calibration_profile",
    }
    kept = {"STRONGLY_TYPED", "BF16", "get_tensor_dtype", "engine_host_code_allowed", "nptype"}
    for version in _versions(10):
        assert removed | kept <= TRT_LISTS[version], version
    for version in _versions(11):
        names = TRT_LISTS[version]
        assert not {n for n in removed if surface.present(n, names)}, version
        assert kept <= names, version


def test_tail_merged_names_are_listed():
    """ "INT8" is stored as the tail of "UINT8" and "name" inside longer strings: the list
    holds them because code points at them (bench/trt_api_surface.py's second way)."""
    for names in TRT_LISTS.values():
        assert {"INT8", "name", "shape", "num_errors"} <= names


# --------------------------------------------------------------------------- the code


def test_the_walk_follows_every_tensorrt_name():
    assert not PROBLEMS, "; ".join(f"{p.where}: {p.what}" for p in PROBLEMS)
    names = {u.name for u in USES}
    # a few from every module that touches TensorRT
    assert {
        "create_builder_config",  # build
        "set_timing_cache",  # caches
        "get_batch",  # calibrator (TensorRT calls it)
        "set_shape_input",  # profiles
        "execute_async_v3",  # runner
        "engine_host_code_allowed",  # runner
        "node_operator",  # build, looked up by string
    } <= names
    assert len(names) > 60


@pytest.mark.parametrize("version", sorted(TRT_LISTS))
def test_every_tensorrt_name_the_code_uses_is_in_that_versions_list(version):
    missing = surface.missing(USES, version, TRT_LISTS[version])
    assert not missing, f"TensorRT {version} lacks {_missing_text(missing)}"


def test_version_marks_reach_the_uses():
    spans = {}
    for use in USES:
        spans.setdefault(use.name, set()).add(use.span)
    ten = surface.Span(frozenset({10}))
    for name in ("FP16", "BF16", "INT8", "int8_calibrator", "set_calibration_profile"):
        assert spans[name] == {ten}, name
    for name in ("IInt8EntropyCalibrator2", "get_batch_size", "read_calibration_cache"):
        assert spans[name] == {ten}, name
    assert spans["SAME_COMPUTE_CAPABILITY"] == {surface.Span(since=(10, 9))}
    assert spans["VERSION_COMPATIBLE"] == {surface.ALL}


def test_since_marks_hold_against_the_lists():
    """A name marked `since=X` is missing from every recorded release before X and present
    in every later one of its majors, so the mark is neither stale nor too late."""
    marked = {u.name: u.span for u in USES if u.span.since}
    assert marked
    for name, span in marked.items():
        for version, names in TRT_LISTS.items():
            if surface.major_of(version) in span.majors:
                assert (name in names) == span.holds(version), (name, version)


def test_a_name_removed_in_11_fails_when_its_mark_is_dropped():
    """Without `tensorrt_names(..., 10)` the builder-flag table is used on every major, and
    TensorRT 11 has no FP16."""
    table = '{"fp16": "FP16", "bf16": "BF16", "int8": "INT8"}'
    uses, problems = _collect_with(PRECISION, f"tensorrt_names({table}, 10)", table)
    assert not problems
    for version in TRT_LISTS:
        missing = {u.name for u in surface.missing(uses, version, TRT_LISTS[version])}
        assert ("FP16" in missing) == (surface.major_of(version) == 11), version


def test_builder_flag_fp16_on_the_11_path_fails():
    line = "    config.set_flag(trt.BuilderFlag.FP16)\n    return config\n"
    uses, _ = _collect_with(BUILD, "    return config\n", line)
    for version in _versions(11):
        missing = surface.missing(uses, version, TRT_LISTS[version])
        assert [(u.name, u.where.split()[-1]) for u in missing] == [("FP16", "configure")]
    for version in _versions(10):
        assert not surface.missing(uses, version, TRT_LISTS[version])


def test_a_10_only_helper_without_its_mark_fails_on_11():
    uses, _ = _collect_with(
        BUILD, "@tensorrt_majors(10)\ndef _use_calibrator", "def _use_calibrator"
    )
    for version in _versions(11):
        missing = {u.name for u in surface.missing(uses, version, TRT_LISTS[version])}
        assert {"int8_calibrator", "set_calibration_profile"} <= missing


def test_an_unknown_attribute_fails_on_every_version():
    uses, _ = _collect_with(
        BUILD,
        "    return config\n",
        "    config.set_flagz(trt.BuilderFlag.TF32)\n    return config\n",
    )
    for version, names in TRT_LISTS.items():
        assert [u.name for u in surface.missing(uses, version, names)] == ["set_flagz"]


def test_a_dropped_since_mark_fails_on_older_10x():
    uses, _ = _collect_with(
        BUILD,
        'tensorrt_names("SAME_COMPUTE_CAPABILITY", since="10.9")',
        '"SAME_COMPUTE_CAPABILITY"',
    )
    failing = {v for v in TRT_LISTS if surface.missing(uses, v, TRT_LISTS[v])}
    assert failing == {v for v in TRT_LISTS if surface.version_key(v) < (10, 9)}
    assert failing


def test_a_name_the_walk_cannot_follow_is_a_problem():
    edit = "    config.set_flag(getattr(trt.BuilderFlag, str(settings)))\n    return config\n"
    _, problems = _collect_with(BUILD, "    return config\n", edit)
    assert [p.where.split()[-1] for p in problems] == ["configure"]
    assert "not followed" in problems[0].what


def test_a_tensorrt_object_handed_outside_the_package_is_a_problem():
    edit = "    from infercc.util import first_line\n    first_line(config)\n    return config\n"
    _, problems = _collect_with(BUILD, "    return config\n", edit)
    assert any("infercc.util.first_line" in p.what for p in problems)


def test_a_marked_helper_refuses_another_major(tmp_path):
    """The marks cannot go stale silently: a 10-only function called on 11 raises."""
    from infercc.backends.trt.calib_cache import write_calibration_cache

    cache = tmp_path / "calib.cache"
    write_calibration_cache(cache, {"x": 1.0}, trt_version="10.3.0.26")
    assert calibrator.make_calibrator(fake.FakeTrt("10.3.0"), cache, "10.3.0")
    with pytest.raises(InferccError, match="internal error: make_calibrator is for TensorRT 10"):
        calibrator.make_calibrator(fake.FakeTrt("11.0.0"), cache, "11.0.0")
    assert build._use_calibrator.tensorrt_majors == (10,)


# --------------------------------------------------------------------------- the stand-in


def _fake_objects(version: str) -> dict[str, Any]:
    """One of each object the stand-in hands out, by class name (enums by their name)."""
    trt = fake.FakeTrt(version)
    builder = trt.Builder(trt.Logger())
    network = builder.create_network(0)
    model = make_model(onnx.helper.make_graph([], "g", [], []))
    header = {"flags": [], "profiles": [], "model": base64.b64encode(model.SerializeToString())}
    engine = fake.FakeEngine(trt, {**header, "model": header["model"].decode()})
    found: dict[str, Any] = {
        "FakeTrt": trt,
        "FakeBuilder": builder,
        "FakeNetwork": network,
        "FakeProfile": builder.create_optimization_profile(),
        "FakeParser": trt.OnnxParser(network, None),
        "FakeRuntime": trt.Runtime(None),
        "FakeEngine": engine,
        "FakeInspector": engine.create_engine_inspector(),
        "FakeContext": engine.create_execution_context(),
        "FakeTensor": fake.FakeTensor("x", (1,)),
        "FakeError": fake.FakeError(0, "n", "Op", "why"),
        "FakeTimingCache": fake.FakeTimingCache(b""),
        "Logger": trt.Logger(),
    }
    config = builder.create_builder_config()
    found[type(config).__name__] = config
    for name in ("IInt8EntropyCalibrator2", "IInt8MinMaxCalibrator"):
        if hasattr(trt, name):
            found[name] = getattr(trt, name)
    found.update({k: v for k, v in vars(trt).items() if isinstance(v, fake._Enum)})
    return found


def _exposed(obj: Any) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_") and hasattr(obj, n)}


@pytest.mark.parametrize("version", sorted(TRT_LISTS))
def test_the_fake_exposes_only_what_that_version_has(version):
    names = TRT_LISTS[version]
    wrong = {}
    for label, obj in _fake_objects(version).items():
        extra = _exposed(obj) - fake.TEST_ONLY.get(label, set())
        bad = sorted(n for n in extra if not surface.present(n, names))
        if bad:
            wrong[label] = bad
    assert not wrong, f"the stand-in for TensorRT {version} exposes names it lacks: {wrong}"


@pytest.mark.parametrize("version", sorted(TRT_LISTS))
def test_the_fake_has_every_name_the_code_uses_on_that_versions_path(version):
    objects = list(_fake_objects(version).values())
    used = {u.name for u in USES if u.span.holds(version)}
    lacking = sorted(n for n in used if not any(hasattr(o, n) for o in objects))
    assert not lacking, f"the stand-in for TensorRT {version} lacks {lacking}"


def test_the_fake_11_has_none_of_the_names_only_10_has():
    used_by_10 = {u.name for u in USES if u.span.majors == {10}}
    objects = _fake_objects("11.4.0.106").values()
    for name in used_by_10 - {"BF16", "INT8"}:  # DataType keeps those in 11: not in the fake
        assert not any(hasattr(o, name) for o in objects), name
    assert not hasattr(fake.FakeTrt("11.0.0").BuilderFlag, "INT8")


def test_test_only_names_are_on_the_fake():
    objects = _fake_objects("10.3.0")
    for label, names in fake.TEST_ONLY.items():
        if label in objects:
            assert names <= _exposed(objects[label]), label


# --------------------------------------------------------------------------- onnxruntime-gpu


def _provider_options(monkeypatch) -> set[tuple[str, str, str]]:
    """(provider, option, value) for everything the ort tuner can hand to InferenceSession:
    every candidate configuration for the GPU providers, through `_create_session`."""
    handed: list[Any] = []

    def record(model, opts, providers, **kwargs):  # disabled_optimizers: CPU configurations
        handed.extend(providers)

    monkeypatch.setattr(ort_backend.ort, "InferenceSession", record)
    gpu = list(ort_backend.GPU_PROVIDERS)
    configs = [ort_backend.default_config(p) for p in gpu]
    for providers in (gpu, gpu[::-1], *[[p] for p in gpu]):
        for cores in (1, 2, 8):
            configs += ort_backend.candidate_configs(providers, cores)
    for config in configs:
        ort_backend._create_session(Path("model.onnx"), config)
    found = set()
    for entry in handed:
        name, options = entry if isinstance(entry, tuple) else (entry, {})
        found.add((name, "", name))
        found.update((name, k, str(v)) for k, v in options.items())
    return found


def _ort_missing(options: set[tuple[str, str, str]], version: str) -> list[str]:
    table = ORT_LISTS[version]
    wrong = []
    for provider, option, value in sorted(options):
        if provider == ort_backend.CPU:
            continue
        names = table.get(provider, set())
        for name in (option, value):
            if name and not re.fullmatch(r"-?\d+", name) and not surface.present(name, names):
                wrong.append(f"{provider} {name}")
    return wrong


def test_onnxruntime_lists_cover_the_gpu_extra():
    text = (surface.ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"onnxruntime-gpu>=([\d.]+)"', text)[1]
    versions = sorted(ORT_LISTS, key=surface.version_key)
    assert len(versions) >= 2
    assert surface.version_key(versions[0])[:2] == surface.version_key(floor)[:2]
    for version, table in ORT_LISTS.items():
        assert set(ort_backend.GPU_PROVIDERS) <= set(table), version


@pytest.mark.parametrize("version", sorted(ORT_LISTS, key=surface.version_key))
def test_every_provider_option_the_tuner_uses_is_in_that_versions_providers(version, monkeypatch):
    options = _provider_options(monkeypatch)
    assert {o for _, o, _ in options} >= {
        "cudnn_conv_algo_search",
        "tunable_op_enable",
        "tunable_op_tuning_enable",
    }
    assert not _ort_missing(options, version), version


def test_a_misspelt_provider_option_fails(monkeypatch):
    options = _provider_options(monkeypatch)
    options.add((ort_backend.CUDA, "cudnn_conv_algo_serach", "HEURISTIC"))
    options.add((ort_backend.TENSORRT, "trt_fp16_enable", "true"))  # a CUDA-only place
    latest = max(ORT_LISTS, key=surface.version_key)
    assert _ort_missing(options, latest) == [
        f"{ort_backend.CUDA} cudnn_conv_algo_serach",
        f"{ort_backend.TENSORRT} true",
    ]


def test_every_onnxruntime_session_is_made_in_one_place():
    """Sessions come from `_create_session` only, so the options checked above are all the
    provider options the backend can pass."""
    paths = [surface.BACKENDS / "ort.py", *sorted((surface.BACKENDS / "ort").glob("*.py"))]
    sites = []
    for path in [p for p in paths if p.exists()]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and surface._callee_name(node.func) == "InferenceSession":
                sites.append(path.name)
    assert len(sites) == 1, sites
