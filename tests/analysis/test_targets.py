"""The target database: datasheet figures, ridge points, lookup, and host CPU detection."""

from __future__ import annotations

import json

import pytest

from infercc.analysis import targets
from infercc.analysis.targets import (
    TARGET_NAMES,
    CpuInfo,
    cpu_peaks,
    cpu_target,
    flops_per_cycle,
    get_target,
    list_targets,
    parse_cpuinfo,
)
from infercc.errors import InferccError

GPU_NAMES = list(targets.GPU_NAMES)

# (name, fp32 TFLOPS, fp16 TFLOPS dense, bandwidth GB/s, memory GB, compute capability)
DATASHEET = [
    ("t4", 8.1, 65, 320, 16, "7.5"),
    ("a10", 31.2, 125, 600, 24, "8.6"),
    ("l4", 30.3, 121, 300, 24, "8.9"),
    ("a100", 19.5, 312, 1555, 40, "8.0"),
    ("a100-80gb", 19.5, 312, 2039, 80, "8.0"),
    ("h100", 67, 989.4, 3350, 80, "9.0"),
    ("h200", 67, 989.4, 4800, 141, "9.0"),
]


@pytest.fixture(autouse=True)
def fixed_bandwidth(monkeypatch):
    """Keep tests off the bandwidth measurement unless a test removes this."""
    monkeypatch.setenv(targets.BANDWIDTH_ENV, "20")


@pytest.mark.parametrize("name,fp32,fp16,gbs,gb,cc", DATASHEET)
def test_gpu_figures_and_ridge_points(name, fp32, fp16, gbs, gb, cc):
    t = get_target(name)
    assert t.kind == "gpu"
    assert t.peak("fp32") == pytest.approx(fp32 * 1e12)
    assert t.peak("fp16") == pytest.approx(fp16 * 1e12)
    assert t.memory_bandwidth == pytest.approx(gbs * 1e9)
    assert t.memory_bytes == gb * 10**9
    assert t.compute_capability == cc
    assert t.ridge_point("fp16") == pytest.approx(fp16 * 1e12 / (gbs * 1e9))
    assert t.ridge_point("fp32") == pytest.approx(fp32 * 1e12 / (gbs * 1e9))


def test_a100_fp16_ridge_point():
    assert get_target("a100").ridge_point("fp16") == pytest.approx(200.6, abs=0.05)


@pytest.mark.parametrize(
    "name,precision,dense",
    [
        ("h100", "fp16", 989.4e12),
        ("h100", "tf32", 494.7e12),
        ("h100", "fp8", 1978.9e12),
        ("h200", "int8", 1978.9e12),
        ("l4", "fp16", 121e12),
        ("l4", "fp8", 242.5e12),
        ("a100", "int8", 624e12),
        ("a10", "tf32", 62.5e12),
    ],
)
def test_dense_not_sparse_figures(name, precision, dense):
    assert get_target(name).peak(precision) == pytest.approx(dense)


def test_precisions_in_canonical_order():
    assert get_target("t4").precisions == ("fp32", "fp16", "int8")
    assert get_target("a100").precisions == ("fp32", "tf32", "fp16", "bf16", "int8")
    assert get_target("h100").precisions == ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
    assert "fp8" not in get_target("a10").precisions
    assert "fp8" in get_target("l4").precisions


def test_every_gpu_cites_a_datasheet():
    for name in GPU_NAMES:
        assert "datasheet" in get_target(name).source


def test_unsupported_precision_names_the_supported_ones():
    with pytest.raises(InferccError) as err:
        get_target("t4").peak("bf16")
    assert "bf16" in err.value.message and "'t4'" in err.value.message
    assert err.value.hint == "t4 supports: fp32, fp16, int8"
    with pytest.raises(InferccError):
        get_target("t4").ridge_point("bf16")


def test_mismatched_precisions_rejected():
    with pytest.raises(ValueError, match="do not match"):
        targets.Target("x", "gpu", "", {"fp32": 1.0}, 1.0, 1, None, ("fp32", "fp16"), "")


def test_unknown_target():
    with pytest.raises(InferccError) as err:
        get_target("x")
    assert err.value.message == "unknown target 'x'"
    assert err.value.hint == "known targets: " + ", ".join(TARGET_NAMES)
    assert err.value.hint.startswith(
        "known targets: cpu, x86-amx, x86-avx512-bf16, x86-avx512-vnni, "
    )
    assert err.value.hint.endswith(", arm64-neon, t4, a10, l4, a100, a100-80gb, h100, h200")


def test_case_insensitive():
    assert get_target("A100") is get_target("a100")
    assert get_target("H100") is get_target("h100")
    assert get_target("A100-80GB").name == "a100-80gb"
    assert get_target("CPU").name == "cpu"


def test_optimize_accepts_every_target_name():
    from infercc.api import check_target

    assert TARGET_NAMES[0] == "cpu"
    assert [check_target(n.upper()) for n in TARGET_NAMES] == list(TARGET_NAMES)
    assert [t.name for t in list_targets()] == list(TARGET_NAMES)


def test_to_dict_json_serializable():
    for t in list_targets():
        d = json.loads(json.dumps(t.to_dict()))
        assert d["name"] == t.name
        assert d["peak_flops"] == t.peak_flops
        assert d["precisions"] == list(t.precisions)
        assert d["ridge_points"]["fp32"] == pytest.approx(t.ridge_point("fp32"))


def test_targets_are_hashable():
    assert len({get_target(n) for n in GPU_NAMES}) == len(GPU_NAMES)


# --- CPU detection from text ---------------------------------------------------------------

AVX512_HOST = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.000
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512dq avx512_vnni avx512_bf16 amx_bf16 \
amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 3800.000
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512dq avx512_vnni avx512_bf16 amx_bf16 \
amx_tile amx_int8
"""

AVX2_HOST = """\
processor\t: 0
model name\t: Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz
cpu MHz\t\t: 3200.000
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx avx2
"""

NO_MHZ_HOST = """\
processor\t: 0
model name\t: Some ARM core
flags\t\t: fp asimd
"""


def test_parse_avx512_host():
    info = parse_cpuinfo(AVX512_HOST)
    assert info.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert info.mhz == 3800.0  # max over cores
    assert info.features == (
        "fma",
        "avx2",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    )
    assert flops_per_cycle(info.features) == 64


def test_parse_avx2_host():
    info = parse_cpuinfo(AVX2_HOST)
    assert info.features == ("fma", "avx2")
    assert info.mhz == 3200.0
    assert flops_per_cycle(info.features) == 32


def test_flops_per_cycle_fallbacks():
    assert flops_per_cycle(("avx2",)) == 16  # avx2 without fma
    assert flops_per_cycle(()) == 16


def test_cpu_peaks_avx2_no_vnni():
    peaks = cpu_peaks(4, 3.0, ("fma", "avx2"))
    assert peaks["fp32"] == pytest.approx(4 * 3.0e9 * 32)
    assert peaks["int8"] == pytest.approx(2 * peaks["fp32"])
    assert list(peaks) == ["fp32", "int8"]


@pytest.mark.parametrize("vnni", ["avx512_vnni", "avx_vnni"])
def test_cpu_peaks_vnni_int8_is_4x(vnni):
    peaks = cpu_peaks(2, 2.0, ("fma", "avx2", vnni))
    assert peaks["int8"] == pytest.approx(4 * peaks["fp32"])


def test_cpu_peaks_bf16():
    assert cpu_peaks(1, 1.0, ("avx512f", "avx512_bf16"))["bf16"] == pytest.approx(2 * 64e9)
    assert cpu_peaks(1, 1.0, ("avx512f", "avx512_bf16", "amx_bf16"))["bf16"] == pytest.approx(
        8 * 64e9
    )
    assert "bf16" not in cpu_peaks(1, 1.0, ("avx512f",))
    assert "fp16" not in cpu_peaks(1, 1.0, ("avx512f", "avx512_bf16"))


def test_cpu_target_from_text():
    info = parse_cpuinfo(AVX512_HOST)
    t = cpu_target(info, cores=8, memory_bytes=2**30, bandwidth=100e9)
    assert t.kind == "cpu" and t.compute_capability is None and t.cores == 8
    assert t.precisions == ("fp32", "bf16", "int8")
    assert t.peak("fp32") == pytest.approx(8 * 3.8e9 * 64)
    assert t.peak("int8") == pytest.approx(4 * t.peak("fp32"))
    assert t.ridge_point("fp32") == pytest.approx(t.peak("fp32") / 100e9)
    assert "Xeon" in t.description


def test_cpu_clock_fallback_is_stated():
    t = cpu_target(parse_cpuinfo(NO_MHZ_HOST), cores=2, memory_bytes=0, bandwidth=1e9)
    assert t.peak("fp32") == pytest.approx(2 * 2.0e9 * 16)
    assert "assumed 2.0 GHz" in t.description
    assert t.features == ("asimd",)
    assert t.cpu_class == "arm64-neon"


def test_no_cpuinfo_reads_py_cpuinfo(monkeypatch):
    # macOS / Windows: no /proc/cpuinfo, so the model, flags and clock come from py-cpuinfo
    monkeypatch.setattr(targets, "_read", lambda path: None)
    answers = {
        "apple": {"model": "Apple M2", "flags": [], "mhz": None},
        "intel": {"model": "Intel Core i7", "flags": ["fma", "AVX2", "sse4_2"], "mhz": 2600.0},
    }
    for name, answer in answers.items():
        monkeypatch.setattr(targets.host, "py_cpuinfo", lambda a=answer: a)
        targets._host_facts.cache_clear()
        try:
            info, cores = targets.host_cpu_info()
            t = targets.detect_cpu()
        finally:
            targets._host_facts.cache_clear()
        assert info.model == answer["model"] and cores >= 1 and t.memory_bytes > 0
        if name == "apple":
            assert t.features == () and "features unknown" in t.description
        else:
            assert t.features == ("fma", "avx2") and info.mhz == 2600.0


def test_memory_from_psutil():
    import psutil

    assert targets.detect_cpu().memory_bytes == psutil.virtual_memory().total


# --- Host detection and bandwidth --------------------------------------------------------------


def test_bandwidth_env_override(monkeypatch):
    monkeypatch.setenv(targets.BANDWIDTH_ENV, "25.6")
    t = get_target("cpu")
    assert t.memory_bandwidth == pytest.approx(25.6e9)
    assert targets.BANDWIDTH_ENV in t.source
    monkeypatch.setenv(targets.BANDWIDTH_ENV, "51.2")
    assert get_target("cpu").memory_bandwidth == pytest.approx(51.2e9)


@pytest.mark.parametrize("value", ["fast", "0", "-3", "inf", "nan"])
def test_bad_bandwidth_env(monkeypatch, value):
    monkeypatch.setenv(targets.BANDWIDTH_ENV, value)
    with pytest.raises(InferccError, match=targets.BANDWIDTH_ENV):
        get_target("cpu")


def test_measured_bandwidth_is_cached(monkeypatch):
    monkeypatch.delenv(targets.BANDWIDTH_ENV)
    first = targets.cpu_bandwidth()
    assert 1e8 < first < 1e13  # bytes/s: between 0.1 GB/s and 10 TB/s
    assert targets.cpu_bandwidth() == first
    assert "measured" in get_target("cpu").source


def test_host_detection():
    t = get_target("cpu")
    assert t.cores >= 1
    assert t.peak("fp32") > 0
    assert t.precisions[0] == "fp32" and "int8" in t.precisions
    assert set(t.features) <= set(targets.CPU_FEATURES)


def test_cpu_fp16_from_avx512_fp16():
    info = CpuInfo("Sapphire Rapids", ("fma", "avx2", "avx512f", "avx512_fp16"), 2500.0)
    t = cpu_target(info, cores=1, memory_bytes=0, bandwidth=1e9)
    assert t.precisions == ("fp32", "fp16", "int8")
    assert t.peak("fp16") == pytest.approx(2 * 2.5e9 * 64)
