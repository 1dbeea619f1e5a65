"""TensorRT backend pieces that need no GPU: profiles, fingerprints, precision rules, settings,
caches, the calibrator and parser messages."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from infercc.backends.trt import build, caches, precision, profiles, settings
from infercc.backends.trt.calib_cache import write_calibration_cache
from infercc.backends.trt.calibrator import make_calibrator
from infercc.backends.trt.fingerprint import (
    Fingerprint,
    check_loadable,
    cuda_version_text,
    differences,
    parse_driver_file,
    parse_smi_query,
    target_mismatch,
)
from infercc.config import TrtOptions
from infercc.data.profiles import ShapeProfile, parse_profile
from infercc.errors import InferccError
from infercc.runtime.backend import CompileOptions
from infercc.runtime.tuning import TuningCache
from tests.backends.test_tensorrt_fake import A100, FakeTrt
from tests.helpers import parse

SEQ = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq] ids, float[batch, seq] mask) => (float[batch, seq] out) {
    out = Add(ids, mask)
}
"""
H100 = Fingerprint("10.3.0", "12.4", "550.54.15", "NVIDIA H100 80GB HBM3", "9.0")


# --------------------------------------------------------------------------- profiles


def test_profile_set_parses_several_inputs():
    found = profiles.parse_profile_set("ids=1x16:1x64:1x128, mask=1x16:1x64:1x128")
    assert [p.name for p in found] == ["ids", "mask"]
    assert found[0].max == (1, 128)


def test_min_opt_max_order_checked_with_dimension_named():
    bad = ShapeProfile("ids", (1, 64), (1, 16), (1, 128))
    with pytest.raises(InferccError, match=r"'ids' breaks min <= opt <= max at dimension 1"):
        profiles.check_profiles([bad])
    with pytest.raises(InferccError, match="different ranks"):
        profiles.check_range("x", (1,), (1, 2), (1, 2), "--profile 1")


def test_resolve_shares_symbols_and_keeps_several_profiles():
    proto = parse(SEQ)
    first = [parse_profile("ids=1x16:4x64:8x128")]
    second = [parse_profile("ids=1x256:1x256:1x512")]
    resolved = profiles.resolve_all(proto, first, [second, first])
    assert len(resolved) == 2  # the repeated first profile is dropped
    assert resolved[0]["mask"] == ((1, 16), (4, 64), (8, 128))
    assert resolved[1]["mask"][2] == (1, 512)


def test_select_profile_prefers_opt_then_range_and_explains_misses():
    proto = parse(SEQ)
    resolved = profiles.resolve_all(
        proto, [parse_profile("ids=1x16:4x64:8x128")], [[parse_profile("ids=1x64:1x64:1x512")]]
    )
    assert profiles.select_profile(resolved, {"ids": (1, 64), "mask": (1, 64)}) == 1
    assert profiles.select_profile(resolved, {"ids": (2, 32), "mask": (2, 32)}) == 0
    assert profiles.select_profile(resolved, {"ids": (1, 300), "mask": (1, 300)}) == 1
    with pytest.raises(InferccError, match="outside every optimization profile"):
        profiles.select_profile(resolved, {"ids": (9, 9), "mask": (9, 9)})


class _Net:
    def __init__(self, *tensors):
        self.tensors = tensors
        self.num_inputs = len(tensors)

    def get_input(self, i):
        return self.tensors[i]


class _Tensor:
    def __init__(self, name, shape, shape_tensor=False):
        self.name, self.shape, self.is_shape_tensor = name, shape, shape_tensor


def test_add_profiles_uses_set_shape_input_for_shape_tensors():
    trt = FakeTrt()
    builder = trt.Builder(None)
    config = builder.create_builder_config()
    net = _Net(_Tensor("x", (-1, 4)), _Tensor("new_shape", (2,), shape_tensor=True))
    resolved = [{"x": ((1, 4), (2, 4), (8, 4))}]
    values = profiles.shape_input_values(["new_shape=1x4:2x4:8x4"])
    assert profiles.add_profiles(builder, config, net, resolved, values) == [config.profiles[0]]
    assert trt.names("set_shape") == [("x", (1, 4), (2, 4), (8, 4))]
    assert trt.names("set_shape_input") == [("new_shape", (1, 4), (2, 4), (8, 4))]
    with pytest.raises(InferccError, match="--shape-input new_shape=MIN:OPT:MAX"):
        profiles.add_profiles(builder, config, net, resolved, {})


def test_add_profiles_refuses_ranges_over_fixed_dimensions():
    trt = FakeTrt()
    builder = trt.Builder(None)
    net = _Net(_Tensor("x", (-1, 4)))
    with pytest.raises(InferccError, match="fixed dimension 1 = 4"):
        profiles.add_profiles(
            builder, builder.create_builder_config(), net, [{"x": ((1, 4), (1, 5), (1, 5))}], {}
        )


# --------------------------------------------------------------------------- fingerprints


def test_device_readers():
    info = parse_smi_query("NVIDIA A100-SXM4-80GB, 8.0, 550.54.15\n")
    assert (info.gpu, info.compute_capability, info.driver) == (
        "NVIDIA A100-SXM4-80GB",
        "8.0",
        "550.54.15",
    )
    assert parse_smi_query("garbage") is None
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC"
    assert parse_driver_file(text) == "550.54.15"
    assert cuda_version_text(12040) == "12.4"


def test_differences_fatal_and_relaxed():
    newer = Fingerprint("10.4.0", "12.4", "560.1", "NVIDIA A100-SXM4-80GB", "8.0")
    diff = differences(A100, newer)
    assert diff.fatal == ["TensorRT 10.3.0 at build, 10.4.0 here"]
    assert diff.warnings == ["NVIDIA driver 550.54.15 at build, 560.1 here"]
    assert differences(A100, newer, version_compatible=True).fatal == []
    older = Fingerprint("10.2.0", "12.4", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
    assert differences(A100, older, version_compatible=True).fatal  # older runtime: no
    # Version-compatible engines also run on the next major version (10 -> 11), not back.
    trt11 = Fingerprint("11.0.0.1", "12.4", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
    assert differences(A100, trt11).fatal
    assert differences(A100, trt11, version_compatible=True).fatal == []
    assert differences(trt11, A100, version_compatible=True).fatal
    assert differences(A100, H100).fatal and not differences(A100, H100, False, "ampere+").fatal
    assert differences(A100, H100, False, "same-cc").fatal
    a100_40 = Fingerprint("10.3.0", "12.4", "550.54.15", "NVIDIA A100-PCIE-40GB", "8.0")
    assert not differences(A100, a100_40, False, "same-cc").fatal
    cuda11 = Fingerprint("10.3.0", "11.8", "550.54.15", "NVIDIA A100-SXM4-80GB", "8.0")
    assert differences(A100, cuda11).fatal == ["CUDA 12.4 at build, 11.8 here"]


def test_check_loadable_names_every_difference():
    other = Fingerprint("10.4.0", "12.4", "550.54.15", "NVIDIA H100 80GB HBM3", "9.0")
    with pytest.raises(InferccError) as err:
        check_loadable(A100, other, False, "none")
    message = str(err.value)
    assert "TensorRT 10.3.0 at build, 10.4.0 here" in message
    assert "NVIDIA A100-SXM4-80GB (compute capability 8.0)" in message
    assert "--version-compatible" in message


def test_target_mismatch():
    assert target_mismatch("a100", "8.0", A100) is None
    assert "compute capability 9.0" in target_mismatch("a100", "8.0", H100)
    a10 = Fingerprint("10.3.0", gpu="NVIDIA A10", compute_capability="8.6")
    assert target_mismatch("a10", "8.6", a10) is None
    a40 = Fingerprint("10.3.0", gpu="NVIDIA A40", compute_capability="8.6")
    assert target_mismatch("a10", "8.6", a40) == "the GPU here is NVIDIA A40, not a a10"


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    ("requested", "flags"),
    [("fp32", ()), ("fp16", ("FP16",)), ("bf16", ("BF16",)), ("int8", ("INT8",))],
)
def test_tensorrt_10_sets_builder_flags(requested, flags):
    graph = {"int8"} if requested == "int8" else set()
    plan = precision.decide("10.3.0", requested, graph)
    assert plan.network_flags == () and plan.builder_flags == flags and not plan.calibrator


@pytest.mark.parametrize("requested", ["fp16", "bf16", "int8"])
def test_tensorrt_11_takes_precision_from_the_graph_only(requested):
    plan = precision.decide("11.0.0", requested, {requested})
    assert plan.builder_flags == () and plan.network_flags == ()
    with pytest.raises(InferccError, match="takes precision from the graph only"):
        precision.decide("11.0.0", requested, set())


def test_int8_needs_qdq_or_a_calibration_cache():
    with pytest.raises(InferccError, match="no Q/DQ pairs and no calibration cache"):
        precision.decide("10.3.0", "int8", set())
    plan = precision.decide("10.3.0", "int8", set(), calibration_cache=True)
    assert plan.calibrator and plan.builder_flags == ("INT8",)
    with pytest.raises(InferccError, match="no INT8 calibrators"):
        precision.decide("11.1.0", "int8", {"int8"}, calibration_cache=True)


def test_tensorrt_older_than_10_is_refused():
    """The tensorrt extra needs 10 or later, and no name list exists for 8.x (PyPI has no
    bindings wheel before 10.0.1), so an 8.x build is refused before it starts."""
    with pytest.raises(InferccError, match="TensorRT 8.6.1 is older than 10"):
        precision.decide("8.6.1", "fp32")


def test_graph_precisions():
    fp16 = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
        h = Cast<to = 10>(x)
        y = Cast<to = 1>(h)
    }
    """)
    assert precision.graph_precisions(fp16) == {"fp16"}
    qdq = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) <float s = {0.1}, int8 z = {0}> {
        q = QuantizeLinear(x, s, z)
        y = DequantizeLinear(q, s, z)
    }
    """)
    assert precision.graph_precisions(qdq) == {"int8"}
    assert precision.graph_precisions(parse(SEQ)) == set()


def test_layer_precisions_from_inspector_json():
    assert precision.tensor_precision("Row major linear FP16 format") == "fp16"
    assert precision.tensor_precision("Half") == "fp16"
    assert precision.tensor_precision("Float") == "fp32"
    assert precision.tensor_precision("BFloat16") == "bf16"
    assert precision.tensor_precision("Thirty-two wide channel vectorized row major Int8") == (
        "int8"
    )
    assert precision.tensor_precision("N/A due to dynamic shapes") is None
    info = {
        "Layers": [
            {"Inputs": [{"Format/Datatype": "Int8"}], "Outputs": [{"Format/Datatype": "Float"}]},
            {"Inputs": [{"Format/Datatype": "Half"}], "Outputs": [{"Format/Datatype": "Half"}]},
            {"Inputs": [{"Format/Datatype": "Float"}], "Outputs": [{"Format/Datatype": "Float"}]},
            {"Inputs": [], "Outputs": []},
        ]
    }
    assert precision.layer_precisions(info) == {"fp16": 1, "fp32": 1, "int8": 1, "unknown": 1}
    # TensorRT 11 split "Format/Datatype" into "Format" and "DataType"; DataType decides.
    split = {"Format": "Row major linear format (kLINEAR)", "DataType": "Half"}
    int32 = {"Format": "Row major linear FP32 format (kLINEAR)", "DataType": "Int32"}
    trt11 = {"Layers": [{"Inputs": [split, int32], "Outputs": [int32]}, {"Inputs": [int32]}]}
    assert precision.layer_precisions(trt11) == {"fp16": 1, "unknown": 1}


def test_check_layers_refuses_an_engine_without_the_requested_precision():
    precision.check_layers({"fp16": 3, "fp32": 1}, "fp16")
    precision.check_layers({"unknown": 4}, "fp16")  # nothing read: cannot tell
    with pytest.raises(InferccError, match=r"no layer of the built engine runs in fp16 \(layers"):
        precision.check_layers({"fp32": 12}, "fp16")


# --------------------------------------------------------------------------- settings


def test_parse_size():
    assert settings.parse_size("4GiB") == 4 * 2**30
    assert settings.parse_size("512MB") == 512 * 10**6
    assert settings.parse_size("1048576") == 2**20
    with pytest.raises(InferccError, match="is not a size"):
        settings.parse_size("lots")


def trt_options(**kw) -> CompileOptions:
    return CompileOptions(tensorrt=TrtOptions(**kw))


def test_default_workspace_is_the_target_budget(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"x" * 100)
    gib = 2**30
    (tmp_path / "memory_plan.json").write_text(
        json.dumps({"weights_bytes": 2 * gib, "arena_bytes": gib})
    )
    got = settings.read_settings(CompileOptions(), 40 * gib, tmp_path, model)
    assert got.workspace_bytes == 40 * gib - 3 * gib - settings.CONTEXT_RESERVE
    assert got.workspace_rule.startswith("target memory")
    small = settings.read_settings(CompileOptions(), gib, tmp_path, model)
    assert small.workspace_bytes == int(0.1 * 3 * gib)  # roofline's floor: 10% of w + arena
    given = settings.read_settings(trt_options(workspace="1GiB"), 40 * gib, tmp_path, model)
    assert given.workspace_bytes == gib and given.workspace_rule == "given"
    with pytest.raises(InferccError, match="--opt-level 7"):
        settings.read_settings(trt_options(opt_level=7), gib, tmp_path, model)
    with pytest.raises(InferccError, match="--hw-compat"):
        settings.read_settings(trt_options(hw_compat="turing+"), gib, tmp_path, model)
    with pytest.raises(InferccError, match="--plugin"):
        settings.read_settings(trt_options(plugins=["/nope.so"]), gib, tmp_path, model)


# --------------------------------------------------------------------------- caches


def test_timing_cache_per_fingerprint_strict_and_saved(tmp_path):
    trt = FakeTrt()
    config = trt.Builder(None).create_builder_config()
    a100 = caches.TimingCacheFile(tmp_path, A100)
    h100 = caches.TimingCacheFile(tmp_path, H100)
    assert a100.path != h100.path
    driver_only = Fingerprint("10.3.0", "12.4", "999.1", "NVIDIA A100-SXM4-80GB", "8.0")
    assert caches.TimingCacheFile(tmp_path, driver_only).path == a100.path
    with pytest.raises(InferccError, match="--timing-cache-strict: no timing cache for TensorRT"):
        a100.load_into(config, strict=True)
    assert a100.load_into(config) == "miss"
    config.timing_cache.entries = 5
    assert a100.save_from(config) == len(b"TIMING5")
    assert a100.load_into(config, strict=True) == "hit"
    assert trt.names("create_timing_cache")[-1] == b"TIMING5"
    assert trt.names("set_timing_cache") == [False, False]  # never ignore a mismatch
    assert json.loads(a100.info_path.read_text())["gpu"] == "NVIDIA A100-SXM4-80GB"
    assert not h100.path.exists()
    a100.path.write_bytes(b"corrupt")
    assert a100.load_into(config) == "unreadable"
    with pytest.raises(InferccError, match="cannot read the timing cache"):
        a100.load_into(config, strict=True)
    # set_timing_cache returning False (TensorRT refuses the cache) is no hit either.
    a100.path.write_bytes(b"TIMING3")
    trt.refuse_timing_cache = True
    assert a100.load_into(config) == "unreadable"
    assert config.get_timing_cache().entries == 0  # an empty cache is in place
    with pytest.raises(InferccError, match="TensorRT refused it"):
        a100.load_into(config, strict=True)


def test_engine_key_covers_every_field():
    base = ("m" * 64, [{"x": {}}], "fp32", {"opt_level": 3}, A100)
    keys = {caches.engine_key(*base).digest()}
    keys.add(caches.engine_key("n" * 64, *base[1:]).digest())
    keys.add(caches.engine_key(base[0], [{"y": {}}], *base[2:]).digest())
    keys.add(caches.engine_key(*base[:2], "fp16", *base[3:]).digest())
    keys.add(caches.engine_key(*base[:3], {"opt_level": 5}, A100).digest())
    keys.add(caches.engine_key(*base[:4], H100).digest())
    assert len(keys) == 6
    assert caches.engine_key(*base).digest() == caches.engine_key(*base).digest()


def test_engine_cache_hit_and_tampered_plan(tmp_path):
    with TuningCache(tmp_path) as index:
        engines = caches.EngineCache(index)
        key = caches.engine_key("m" * 64, [], "fp32", {}, A100)
        assert engines.get(key) is None
        path = engines.put(key, b"PLAN", {"layers": {"fp32": 3}}, 1.5)
        assert path == tmp_path / "trt" / "engines" / f"{key.digest()}.plan"
        assert engines.get(key) == (b"PLAN", {"layers": {"fp32": 3}})
        path.write_bytes(b"EVIL")
        assert engines.get(key) is None


# --------------------------------------------------------------------------- calibrator


def test_calibrator_serves_an_existing_cache(tmp_path, caplog):
    path = tmp_path / "calib.cache"
    write_calibration_cache(path, {"input": 0.05, "conv": 0.1}, "entropy", "10.3.0")
    trt = FakeTrt()
    calibrator = make_calibrator(trt, path, "10.3.0")
    assert isinstance(calibrator, trt.IInt8EntropyCalibrator2)
    assert calibrator.read_calibration_cache() == path.read_bytes()
    assert calibrator.get_batch(["input"]) is None
    assert trt.names("calibrator_init") == ["IInt8EntropyCalibrator2"]
    write_calibration_cache(path, {"input": 0.05}, "minmax", "10.0.0")
    minmax = make_calibrator(trt, path, "10.3.0")
    assert isinstance(minmax, trt.IInt8MinMaxCalibrator)
    assert "written for TensorRT tag 100000" in caplog.text
    path.write_text("not a cache\n")
    with pytest.raises(InferccError, match="not a TensorRT calibration cache header"):
        make_calibrator(trt, path, "10.3.0")


# --------------------------------------------------------------------------- parser errors


class _Bare:
    """An older parser error: node() and desc() only."""

    def __init__(self, node: int, desc: str):
        self._node, self._desc = node, desc

    def node(self):
        return self._node

    def desc(self):
        return self._desc


class _Parser:
    def __init__(self, errors):
        self.errors = errors
        self.num_errors = len(errors)

    def get_error(self, i):
        return self.errors[i]


def test_parser_errors_name_nodes_and_ops():
    nodes = [
        onnx.helper.make_node("Relu", ["x"], ["y"], name="act"),
        onnx.helper.make_node("MyOp", ["y"], ["z"], name="custom", domain="acme"),
    ]
    parser = _Parser([_Bare(1, "No importer registered for op: MyOp"), _Bare(-1, "graph bad")])
    problems = build.parse_problems(parser, nodes)
    assert problems[0] == build.ParseProblem(
        1, "custom", "MyOp", "No importer registered for op: MyOp"
    )
    err = build.parse_error(problems)
    assert "TensorRT cannot parse the model: 2 error(s) at op(s) MyOp" in err.message
    assert "node 'custom' (MyOp): No importer registered" in err.message
    assert "graph bad" in err.message
    assert "--backend ort" in err.hint and "--plugin" in err.hint


def test_plugins_loaded_then_registered():
    trt = FakeTrt()
    loaded = []
    build.load_plugins(trt, None, ["/a.so", "/b.so"], loaded.append)
    assert loaded == ["/a.so", "/b.so"] and trt.names("init_libnvinfer_plugins") == [""]

    def broken(path):
        raise OSError("undefined symbol: getPluginRegistry")

    with pytest.raises(InferccError, match="cannot load TensorRT plugin library /a.so"):
        build.load_plugins(trt, None, ["/a.so"], broken)


def test_model_digest_covers_external_data(tmp_path: Path):
    proto = parse(SEQ)
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    assert build.model_digest(path, proto) == build.model_digest(path, proto)
