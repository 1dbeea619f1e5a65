"""CPU rows: which row a host is, what each row decides, and row names as targets."""

from __future__ import annotations

import json

import pytest

from infercc.analysis import cpu_classes, targets
from infercc.analysis.cpu_classes import INT7_MAX, classify, get_class
from infercc.analysis.targets import cpu_target, get_target, parse_cpuinfo, row_target
from infercc.errors import InferccError

ZEN3 = "avx avx2 fma sse4_2 bmi2"  # AMD EPYC 7003: no AVX-512, no VNNI
ZEN4 = ZEN3 + " avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16"
SAPPHIRE = ZEN4 + " amx_tile amx_int8 amx_bf16"
SKYLAKE = ZEN3 + " avx512f avx512bw avx512vl avx512dq"
ICELAKE = SKYLAKE + " avx512_vnni"  # VNNI without BF16
ALDER = ZEN3 + " avx_vnni"
GRAVITON2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimdrdm lrcpc dcpop asimddp"
GRAVITON3 = GRAVITON2 + " sha3 sve i8mm bf16"
A72 = "fp asimd evtstrm crc32 cpuid"


@pytest.mark.parametrize(
    "arch, flags, row",
    [
        ("x86_64", SAPPHIRE, "x86-amx"),
        ("x86_64", ZEN4, "x86-avx512-bf16"),
        ("x86_64", ICELAKE, "x86-avx512-vnni"),
        ("x86_64", ALDER, "x86-avx-vnni"),
        ("x86_64", SKYLAKE, "x86-avx512"),
        ("x86_64", ZEN3, "x86-avx2"),
        ("x86_64", "sse sse2 sse4_2", "x86-sse"),
        ("arm64", GRAVITON3, "arm64-sve"),
        ("arm64", GRAVITON2, "arm64-neon-dot"),
        ("arm64", A72, "arm64-neon"),
    ],
)
def test_a_host_is_the_first_row_whose_flags_it_has(arch, flags, row):
    assert classify(arch, flags.split()).name == row


def test_another_architecture_has_no_row():
    assert classify("riscv64", ["rv64imafdc"]) is None
    assert classify("arm64", []) is None  # no NEON: no row


@pytest.mark.parametrize("machine, arch", [("x86_64", "x86_64"), ("AMD64", "x86_64"),
                                           ("aarch64", "arm64"), ("arm64", "arm64")])  # fmt: skip
def test_machine_names(machine, arch):
    assert cpu_classes.machine_arch(machine) == arch


def test_rows_without_vnni_take_seven_bit_weights():
    for row in cpu_classes.CLASSES:
        vnni = {"avx512_vnni", "avx_vnni", "amx_int8"} & set(row.requires)
        expected = 8 if row.arch == "arm64" or vnni else 7
        assert row.int8.weight_bits == expected, row.name
        assert row.int8.activations == "uint8" and row.int8.format == "qdq"
    assert get_class("x86-avx2").int8.weight_max == INT7_MAX == 64
    assert 2 * 255 * INT7_MAX < 2**15 <= 2 * 255 * 127  # a u8 x s7 pair never saturates int16


def test_int4_level_four_only_where_there_is_an_int8_kernel():
    levels = {row.name: row.int4.accuracy_level for row in cpu_classes.CLASSES}
    assert levels["x86-sse"] == 0 and levels["arm64-neon"] == 0
    assert {n for n, level in levels.items() if level == 4} == set(cpu_classes.NAMES) - {
        "x86-sse",
        "arm64-neon",
    }
    assert {row.int4.block_size for row in cpu_classes.CLASSES} == {32}


def test_unknown_row_names_the_rows():
    with pytest.raises(InferccError) as err:
        get_class("x86-avx3")
    assert err.value.message == "unknown CPU class 'x86-avx3'"
    assert "x86-avx2" in err.value.hint and "arm64-sve" in err.value.hint


def _zen3_text() -> str:
    return (
        f"processor\t: 0\nmodel name\t: AMD EPYC 7763\ncpu MHz\t\t: 2450.000\nflags\t\t: {ZEN3}\n"
    )


def test_the_cpu_target_names_its_row():
    t = cpu_target(parse_cpuinfo(_zen3_text()), cores=2, memory_bytes=2**30, bandwidth=20e9)
    assert t.cpu_class == "x86-avx2" and t.host
    assert t.description.endswith("; CPU class x86-avx2")
    d = json.loads(json.dumps(t.to_dict()))
    assert d["cpu_class"]["name"] == "x86-avx2" and d["cpu_class"]["int8"]["weight_bits"] == 7
    assert d["host"] is True


def test_a_row_that_is_not_the_host_says_so():
    info = parse_cpuinfo(_zen3_text())
    t = row_target(get_class("x86-avx512-vnni"), info, cores=2, memory_bytes=2**30, bandwidth=2e10)
    assert not t.host and t.cpu_class == "x86-avx512-vnni" and t.kind == "cpu"
    assert "not this host" in t.description and "2 cores" in t.description
    assert "avx512_vnni" in t.features
    assert t.peak("int8") == pytest.approx(4 * t.peak("fp32"))  # VNNI: 4x fp32
    assert t.memory_bandwidth == 2e10 and t.cores == 2


def test_the_hosts_own_row_is_the_host():
    info = parse_cpuinfo(_zen3_text())
    t = row_target(get_class("x86-avx2"), info, cores=2, memory_bytes=2**30, bandwidth=2e10)
    assert t.host and t.name == "x86-avx2" and t.description.startswith("this host: AMD EPYC")
    assert t.features == info.features


def test_every_row_is_a_target():
    for name in cpu_classes.NAMES:
        t = get_target(name.upper())
        assert t.name == name and t.kind == "cpu" and t.cpu_class == name
        assert t.host == (get_target("cpu").cpu_class == name)
        assert targets.is_cpu(name)
    assert targets.is_cpu("CPU") and not targets.is_cpu("a100")


def test_a_gpu_has_no_row():
    with pytest.raises(InferccError, match="not a CPU of a known class"):
        _ = get_target("a100").row


def test_arm64_cpuinfo_is_read_as_arm64():
    text = f"processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: {GRAVITON2}\nCPU architecture: 8\n"
    info = parse_cpuinfo(text)
    assert info.arch == "arm64" and info.row.name == "arm64-neon-dot"
    assert "asimddp" in info.features
