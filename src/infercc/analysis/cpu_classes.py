"""The CPU rows of the target database: CPUs grouped by the instruction-set features that
decide what infercc builds for them.

Two CPUs of one row run onnxruntime's int8 and int4 kernels alike, so one choice of int8 and
int4 form holds for the whole row. A row names the flags it requires (Linux /proc/cpuinfo
spelling; py-cpuinfo uses the same names), and `classify` gives a host the first row of its
architecture whose flags it has, from the most capable down. `--target cpu` is the host and
says which row it is; `--target x86-avx2` (any row name) builds for that row from any host.

What a row decides, and why:

- **int8 weight bits.** onnxruntime's u8 x s8 GEMM (MLAS, under QLinearConv, QLinearMatMul,
  QGemm and MatMulIntegerToFloat) takes one of two paths on x86. With VNNI (`vpdpbusd`,
  AVX-512 VNNI or AVX-VNNI) and with AMX, four u8 x s8 products are summed straight into int32:
  exact for any 8-bit weights. Without VNNI (AVX2, and AVX-512 BW on Skylake-class parts) it
  uses `vpmaddubsw`, which sums *pairs* of u8 x s8 products into int16 **with saturation**:
  255 x 127 x 2 = 64,770 overflows 32,767, so large activations times large weights come out
  wrong (onnxruntime documents it; measured here under an emulated AVX2 CPU: a QLinearMatMul
  with activations at 255 and same-sign weights off by 3 output steps with 8-bit weights,
  exact with 7-bit). Weights kept within +-64 (`INT7_MAX`) bound a pair by 255 x 64 x 2 =
  32,640 < 2**15, so the int16 path is exact and keeps its speed (twice the multiply-adds per
  instruction of fp32 FMA); this is onnxruntime's `reduce_range`. Rows without VNNI take
  7-bit weights; the others 8-bit. Arm64's MLAS kernels widen to 16 bits and accumulate in
  int32 (`sdot`/`udot` where the row has the dot product), exact for 8-bit weights.
- **int8 activations**: uint8 (asymmetric) on every CPU row: the u8 x s8 form the kernels
  above take; a one-sided tensor (after ReLU, GELU) gets twice the resolution of int8.
- **Format**: QDQ (QuantizeLinear/DequantizeLinear pairs, standard ONNX). onnxruntime's CPU
  provider fuses them into the same integer kernels QOperator models call, so nothing is
  gained by writing QOperator ops, and QDQ stays readable by TensorRT and other runtimes.
- **bf16**: rows with avx512_bf16 (Cooper Lake, Zen 4+) or amx_bf16 (Sapphire Rapids+) run
  OpenVINO's bfloat16 kernels (`--bf16`, `--backend openvino`); onnxruntime's CPU provider has
  none on x86. `x86-avx512-bf16` is its own row for that alone: its int8 and int4 forms are
  those of AVX-512 VNNI.
- **The fastest build** (`fastest`): the (backend, precision) pairs a "fastest that
  validates" build races on a host of the row, the row's default first. Where the ISA has
  bf16 that is OpenVINO: int8 from the Q/DQ model, then bf16, then onnxruntime's int8; with
  VNNI but no bf16 onnxruntime's int8 first and OpenVINO's beside it; on AVX2 and older
  onnxruntime's int8 path (its kernels were measured first there), then the rest.
- **int4 (MatMulNBits)**: `accuracy_level` 4 (int8 compute on the activations) where the row
  has int8 dot products or the int16 pair path: a 4-bit weight (|w| <= 8) times a u8 pair sums
  to at most 4,080, so there is no saturation even on AVX2; level 0 (fp32 compute) where MLAS
  has no int8 kernel for the row. Block size 32 on every row, the size onnxruntime-genai's
  builder writes and MLAS's int4 kernels are tuned for.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infercc.errors import InferccError

INT8_MAX = 127
INT7_MAX = 64  # 2 x 255 x 64 = 32,640 < 2**15: a u8 x s7 pair never saturates int16

X86, ARM64 = "x86_64", "arm64"
_MACHINES = {"x86_64": X86, "amd64": X86, "x64": X86, "aarch64": ARM64, "arm64": ARM64}
_VNNI_WHY = "VNNI sums four u8 x s8 products into int32: exact for 8-bit weights"
_PAIRS_WHY = (
    "no VNNI: u8 x s8 pairs are summed into int16 with saturation (vpmaddubsw); weights "
    f"within +-{INT7_MAX} keep every pair below 2**15, so the int8 kernels stay exact"
)
_ARM_WHY = "products widened and accumulated in int32: exact for 8-bit weights"
_LEVEL4_WHY = "int8 compute on the activations (4-bit weights cannot saturate a pair sum)"
_LEVEL0_WHY = "no int8 kernel for MatMulNBits on this row: fp32 compute"


@dataclass(frozen=True)
class Int8Form:
    """What `calibrate --int8` writes for a row."""

    weight_bits: int  # 8, or 7 (|q| <= INT7_MAX) where the kernels saturate int16 pairs
    activations: str  # "uint8" (asymmetric)
    format: str  # "qdq"
    reason: str

    @property
    def weight_max(self) -> int:
        return INT8_MAX if self.weight_bits == 8 else INT7_MAX

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_bits": self.weight_bits,
            "weight_max": self.weight_max,
            "activations": self.activations,
            "format": self.format,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Int4Form:
    """What `calibrate --int4` writes for a row (MatMulNBits)."""

    accuracy_level: int
    block_size: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy_level": self.accuracy_level,
            "block_size": self.block_size,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class CpuClass:
    """One row: the flags it requires and what infercc builds for it."""

    name: str
    arch: str
    requires: tuple[str, ...]
    summary: str
    int8: Int8Form
    int4: Int4Form
    fastest: tuple[tuple[str, str], ...] = ()  # (backend, precision), the default first

    @property
    def default_backend(self) -> str:
        return self.fastest[0][0] if self.fastest else "ort"

    @property
    def default_precision(self) -> str:
        return self.fastest[0][1] if self.fastest else "fp32"

    @property
    def has_bf16(self) -> bool:
        return any(f in self.requires for f in ("avx512_bf16", "amx_bf16"))

    def matches(self, arch: str, flags: Iterable[str]) -> bool:
        have = set(flags)
        return arch == self.arch and all(f in have for f in self.requires)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arch": self.arch,
            "requires": list(self.requires),
            "summary": self.summary,
            "int8": self.int8.to_dict(),
            "int4": self.int4.to_dict(),
            "default_backend": self.default_backend,
            "default_precision": self.default_precision,
            "fastest": [{"backend": b, "precision": p} for b, p in self.fastest],
        }


_OV, _ORT = "openvino", "ort"
# The races of a "fastest that validates" build, by what the ISA has (module doc).
Race = tuple[tuple[str, str], ...]
_BF16_RACE: Race = ((_OV, "int8"), (_OV, "bf16"), (_ORT, "int8"), (_OV, "fp32"), (_ORT, "fp32"))
_VNNI_RACE: Race = ((_ORT, "int8"), (_OV, "int8"), (_ORT, "fp32"), (_OV, "fp32"))
_ORT_RACE: Race = ((_ORT, "int8"), (_ORT, "fp32"))


def _row(name: str, arch: str, requires: str, summary: str, bits: int, level: int) -> CpuClass:
    why8 = {8: _ARM_WHY if arch == ARM64 else _VNNI_WHY, 7: _PAIRS_WHY}[bits]
    flags = tuple(requires.split())
    if any(f in flags for f in ("avx512_bf16", "amx_bf16")):
        race = _BF16_RACE
    elif arch == X86 and "avx2" in flags:
        race = _VNNI_RACE
    else:
        race = _ORT_RACE
    return CpuClass(
        name,
        arch,
        flags,
        summary,
        Int8Form(bits, "uint8", "qdq", why8),
        Int4Form(level, 32, _LEVEL4_WHY if level == 4 else _LEVEL0_WHY),
        race,
    )


_AVX512 = "avx2 fma avx512f avx512bw avx512vl"
# (name, arch, flags required, summary, int8 weight bits, int4 accuracy level), most capable
# first: `classify` takes the first row whose flags the host has.
_ROWS = (
    (
        "x86-amx",
        X86,
        f"{_AVX512} avx512_vnni amx_int8 amx_bf16",
        "AMX-INT8 and AMX-BF16 (Sapphire Rapids+)",
        8,
        4,
    ),
    (
        "x86-avx512-bf16",
        X86,
        f"{_AVX512} avx512_vnni avx512_bf16",
        "AVX-512 VNNI and BF16, no AMX (Cooper Lake, Zen 4+)",
        8,
        4,
    ),
    ("x86-avx512-vnni", X86, f"{_AVX512} avx512_vnni", "AVX-512 VNNI, no BF16 (Ice Lake)", 8, 4),
    ("x86-avx-vnni", X86, "avx2 fma avx_vnni", "AVX2 + AVX-VNNI, no AVX-512 (Alder Lake+)", 8, 4),
    ("x86-avx512", X86, _AVX512, "AVX-512 without VNNI (Skylake-SP)", 7, 4),
    ("x86-avx2", X86, "avx2 fma", "AVX2 + FMA, no AVX-512, no VNNI (Haswell, Zen 1-3)", 7, 4),
    ("x86-sse", X86, "", "x86-64 without AVX2", 7, 0),
    ("arm64-sve", ARM64, "asimd asimddp sve", "SVE + dot product (Graviton 3+, Neoverse V)", 8, 4),
    ("arm64-neon-dot", ARM64, "asimd asimddp", "NEON + dot product (Graviton 2, Apple M)", 8, 4),
    ("arm64-neon", ARM64, "asimd", "NEON without dot product (Cortex-A72)", 8, 0),
)
CLASSES: tuple[CpuClass, ...] = tuple(_row(*row) for row in _ROWS)
BY_NAME: dict[str, CpuClass] = {c.name: c for c in CLASSES}
NAMES = tuple(BY_NAME)


def machine_arch(machine: str | None = None) -> str:
    """`x86_64` or `arm64` for `platform.machine()` (or `machine`); other names as they are."""
    name = (machine if machine is not None else platform.machine()).lower()
    return _MACHINES.get(name, name)


def classify(arch: str, flags: Iterable[str]) -> CpuClass | None:
    """The first row of `arch` whose required flags are all in `flags`; None for another
    architecture (or an arm64 CPU without NEON)."""
    have = set(flags)
    return next((c for c in CLASSES if c.matches(arch, have)), None)


def get_class(name: str) -> CpuClass:
    """The row called `name`; InferccError listing the rows if none."""
    try:
        return BY_NAME[name.strip().lower()]
    except KeyError:
        hint = "CPU rows: " + ", ".join(NAMES)
        raise InferccError(f"unknown CPU class {name!r}", hint) from None
