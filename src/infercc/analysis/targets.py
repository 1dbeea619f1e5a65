"""The target database: what each machine infercc compiles for can do, as data.

A `Target` holds peak throughput per precision, memory bandwidth and size, compute capability
and the precisions it supports. Its main use is the roofline model: an op whose arithmetic
intensity (FLOP per byte moved) is below the target's *ridge point* `peak / bandwidth` is
memory-bound there, one above it is compute-bound.

GPU figures come from NVIDIA's datasheets, one block per GPU below, each figure citing its
row. Two conventions hold throughout:

- Peaks are *dense* figures. Since Ampere the datasheets print Tensor Core figures "with
  sparsity" (2:4 structured sparsity) and mark them with an asterisk; the dense figure is half
  of that, and it is the one an ordinary model gets.
- Memory sizes and bandwidths are decimal, as the datasheets state them: GB = 10^9 bytes,
  TB/s = 10^12 bytes/s. (A100 "40GB" is physically 40 GiB, but the database keeps what the
  datasheet says.)

The `cpu` target is detected from the host (`infercc.analysis.host`), lazily and once per
process: cores from the CPU affinity mask, features, model and clock from /proc/cpuinfo (or
py-cpuinfo where there is none: macOS, Windows), memory from psutil, and bandwidth measured
with a numpy copy once per host and kept in the cache directory (or
`INFERCC_CPU_BANDWIDTH_GBS` for reproducible figures).
Peak FLOP/s is `cores x GHz x FLOPs/cycle/core`, with FLOPs/cycle from the widest vector FMA
the flags advertise (see `flops_per_cycle`). These are upper bounds, not measurements: they
assume two FMA pipes per core at the reported clock, which Intel server cores have and some
others (Zen 4 runs AVX-512 on 256-bit halves) do not.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from infercc.analysis import cpu_classes, host
from infercc.errors import InferccError
from infercc.precisions import TARGET_PRECISIONS as PRECISIONS

log = logging.getLogger(__name__)

GPU_NAMES = ("t4", "a10", "l4", "a100", "a100-80gb", "h100", "h200")
# `cpu` is this host; each CPU row (`infercc.analysis.cpu_classes`) is a target of its own.
TARGET_NAMES = ("cpu", *cpu_classes.NAMES, *GPU_NAMES)
BANDWIDTH_ENV = "INFERCC_CPU_BANDWIDTH_GBS"
# The host's CPU row, stated instead of detected (a VM that hides flags; a test session that
# must choose one int8 form on every host).
CPU_CLASS_ENV = "INFERCC_CPU_CLASS"

# CPU flags that matter for peak figures, in the order `Target.features` lists them.
CPU_FEATURES = (
    "fma",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "asimddp",
    "i8mm",
    "sve",
)
DEFAULT_GHZ = 2.0

T = 1e12  # tera: datasheets give compute in TFLOPS / TOPS
GB = 10**9  # datasheet GB (decimal), for memory sizes
GBS = 1e9  # GB/s
TBS = 1e12  # TB/s


@dataclass(frozen=True)
class Target:
    """A machine to compile for. `peak_flops` is FLOP/s (OP/s for int8) per precision, dense."""

    name: str
    kind: str  # "cpu" | "gpu"
    description: str
    peak_flops: dict[str, float] = field(hash=False)
    memory_bandwidth: float  # bytes/s
    memory_bytes: int
    compute_capability: str | None
    precisions: tuple[str, ...]
    source: str
    cores: int | None = None
    features: tuple[str, ...] = ()
    cpu_class: str | None = None  # the CPU row (`infercc.analysis.cpu_classes`) it belongs to
    host: bool = False  # a CPU target that is this host (its kernels can be measured here)

    def __post_init__(self) -> None:
        expected = tuple(p for p in PRECISIONS if p in self.peak_flops)
        if self.precisions != expected or len(expected) != len(self.peak_flops):
            raise ValueError(
                f"target {self.name!r}: precisions {self.precisions} do not match "
                f"peak_flops keys {tuple(self.peak_flops)} (order: {', '.join(PRECISIONS)})"
            )

    def peak(self, precision: str) -> float:
        """Peak FLOP/s (OP/s for int8) at `precision`; InferccError if the target lacks it."""
        try:
            return self.peak_flops[precision]
        except KeyError:
            raise InferccError(
                f"target {self.name!r} has no {precision} peak",
                f"{self.name} supports: {', '.join(self.precisions)}",
            ) from None

    def ridge_point(self, precision: str) -> float:
        """FLOP per byte at which an op turns from memory-bound to compute-bound."""
        return self.peak(precision) / self.memory_bandwidth

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth": self.memory_bandwidth,
            "memory_bytes": self.memory_bytes,
            "compute_capability": self.compute_capability,
            "precisions": list(self.precisions),
            "ridge_points": {p: self.ridge_point(p) for p in self.precisions},
            "source": self.source,
            "cores": self.cores,
            "features": list(self.features),
            "cpu_class": None if self.cpu_class is None else self.row.to_dict(),
            "host": self.host,
        }

    @property
    def row(self) -> cpu_classes.CpuClass:
        """The CPU row of a CPU target; InferccError for a GPU (or an unknown CPU)."""
        if self.cpu_class is None:
            raise InferccError(
                f"target {self.name!r} is not a CPU of a known class",
                "CPU rows: " + ", ".join(cpu_classes.NAMES),
            )
        return cpu_classes.get_class(self.cpu_class)


def _gpu(
    name: str,
    description: str,
    peaks: dict[str, float],
    bandwidth: float,
    memory: int,
    cc: str,
    source: str,
) -> Target:
    precisions = tuple(p for p in PRECISIONS if p in peaks)
    return Target(name, "gpu", description, peaks, bandwidth, memory, cc, precisions, source)


# --- GPUs ----------------------------------------------------------------------------------

T4 = _gpu(
    "t4",
    "NVIDIA T4 (Turing, 70 W PCIe)",
    {
        "fp32": 8.1 * T,  # "Single-Precision: 8.1 TFLOPS"
        "fp16": 65 * T,  # "Mixed-Precision (FP16/FP32): 65 TFLOPS"
        "int8": 130 * T,  # "INT8: 130 TOPS"
    },
    bandwidth=320 * GBS,  # "GPU Memory Bandwidth: 320+ GB/s"
    memory=16 * GB,  # "GPU Memory: 16 GB GDDR6"
    cc="7.5",  # Turing, CUDA compute capability 7.5
    source="NVIDIA T4 Tensor Core GPU datasheet (2019), Specifications table",
)

A10 = _gpu(
    "a10",
    "NVIDIA A10 (Ampere, 150 W PCIe)",
    {
        "fp32": 31.2 * T,  # "FP32: 31.2 teraFLOPS"
        "tf32": 62.5 * T,  # "TF32 Tensor Core: 62.5 teraFLOPS | 125 teraFLOPS*"
        "fp16": 125 * T,  # "FP16 Tensor Core: 125 teraFLOPS | 250 teraFLOPS*"
        "bf16": 125 * T,  # "BFLOAT16 Tensor Core: 125 teraFLOPS | 250 teraFLOPS*"
        "int8": 250 * T,  # "INT8 Tensor Core: 250 TOPS | 500 TOPS*"
    },
    bandwidth=600 * GBS,  # "GPU Memory Bandwidth: 600 GB/s"
    memory=24 * GB,  # "GPU Memory: 24 GB GDDR6"
    cc="8.6",  # GA102, compute capability 8.6
    source="NVIDIA A10 Tensor Core GPU datasheet (2021), Specifications table; * = sparsity",
)

L4 = _gpu(
    "l4",
    "NVIDIA L4 (Ada Lovelace, 72 W PCIe)",
    {
        "fp32": 30.3 * T,  # "FP32: 30.3 teraFLOPs"
        "tf32": 60 * T,  # "TF32 Tensor Core: 120 teraFLOPs*" (sparse; dense = half)
        "fp16": 121 * T,  # "FP16 Tensor Core: 242 teraFLOPs*" (sparse; dense = half)
        "bf16": 121 * T,  # "BFLOAT16 Tensor Core: 242 teraFLOPs*" (sparse; dense = half)
        "fp8": 242.5 * T,  # "FP8 Tensor Core: 485 teraFLOPs*" (sparse; dense = half)
        "int8": 242.5 * T,  # "INT8 Tensor Core: 485 TOPs*" (sparse; dense = half)
    },
    bandwidth=300 * GBS,  # "GPU Memory Bandwidth: 300 GB/s"
    memory=24 * GB,  # "GPU Memory: 24 GB"
    cc="8.9",  # AD104, compute capability 8.9
    source="NVIDIA L4 Tensor Core GPU datasheet (2023), Specifications table; * = sparsity",
)

_A100_COMPUTE = {
    "fp32": 19.5 * T,  # "FP32: 19.5 TFLOPS"
    "tf32": 156 * T,  # "Tensor Float 32 (TF32): 156 TFLOPS | 312 TFLOPS*"
    "fp16": 312 * T,  # "FP16 Tensor Core: 312 TFLOPS | 624 TFLOPS*"
    "bf16": 312 * T,  # "BFLOAT16 Tensor Core: 312 TFLOPS | 624 TFLOPS*"
    "int8": 624 * T,  # "INT8 Tensor Core: 624 TOPS | 1248 TOPS*"
}
_A100_SOURCE = "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 {} SXM column; * = sparsity"

A100 = _gpu(
    "a100",
    "NVIDIA A100 40GB SXM (Ampere)",
    dict(_A100_COMPUTE),
    bandwidth=1555 * GBS,  # "GPU Memory Bandwidth: 1,555 GB/s" (40GB SXM)
    memory=40 * GB,  # "GPU Memory: 40GB HBM2"
    cc="8.0",  # GA100, compute capability 8.0
    source=_A100_SOURCE.format("40GB"),
)

A100_80GB = _gpu(
    "a100-80gb",
    "NVIDIA A100 80GB SXM (Ampere)",
    dict(_A100_COMPUTE),  # same compute rows as the 40GB part
    bandwidth=2039 * GBS,  # "GPU Memory Bandwidth: 2,039 GB/s" (80GB SXM; PCIe is 1,935)
    memory=80 * GB,  # "GPU Memory: 80GB HBM2e"
    cc="8.0",
    source=_A100_SOURCE.format("80GB"),
)

# H100 and H200 SXM share the GH100 die at the same clocks, so the compute rows are the same.
# Their datasheets print only the with-sparsity Tensor Core figures; the dense ones are half,
# as the NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022) lists them.
_HOPPER_SXM_COMPUTE = {
    "fp32": 67 * T,  # "FP32: 67 teraFLOPS"
    "tf32": 494.7 * T,  # "TF32 Tensor Core: 989 teraFLOPS*"
    "fp16": 989.4 * T,  # "FP16 Tensor Core: 1,979 teraFLOPS*"
    "bf16": 989.4 * T,  # "BFLOAT16 Tensor Core: 1,979 teraFLOPS*"
    "fp8": 1978.9 * T,  # "FP8 Tensor Core: 3,958 teraFLOPS*"
    "int8": 1978.9 * T,  # "INT8 Tensor Core: 3,958 TOPS*"
}

H100 = _gpu(
    "h100",
    "NVIDIA H100 SXM5 80GB (Hopper)",
    dict(_HOPPER_SXM_COMPUTE),
    bandwidth=3.35 * TBS,  # "GPU Memory Bandwidth: 3.35TB/s" (H100 SXM)
    memory=80 * GB,  # "GPU Memory: 80GB" (HBM3)
    cc="9.0",  # GH100, compute capability 9.0
    source="NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM column; * = sparsity",
)

H200 = _gpu(
    "h200",
    "NVIDIA H200 SXM 141GB (Hopper)",
    dict(_HOPPER_SXM_COMPUTE),
    bandwidth=4.8 * TBS,  # "GPU Memory Bandwidth: 4.8TB/s"
    memory=141 * GB,  # "GPU Memory: 141GB" (HBM3e)
    cc="9.0",
    source="NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM column; * = sparsity",
)

GPUS: dict[str, Target] = {t.name: t for t in (T4, A10, L4, A100, A100_80GB, H100, H200)}


# --- The host CPU ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says: model name, the flags infercc cares about, max clock (MHz),
    and the architecture (`x86_64` or `arm64`)."""

    model: str
    features: tuple[str, ...]
    mhz: float | None
    arch: str = cpu_classes.X86
    row_name: str | None = None  # the CPU row as stated (`CPU_CLASS_ENV`), not detected

    @property
    def row(self) -> cpu_classes.CpuClass | None:
        """The CPU row: as stated, else the one these flags put the CPU in (None: another
        architecture)."""
        if self.row_name is not None:
            return cpu_classes.get_class(self.row_name)
        return self.detected_row

    @property
    def detected_row(self) -> cpu_classes.CpuClass | None:
        """The row these flags put the CPU in, whatever row is stated: the instructions
        onnxruntime's kernels pick (None: another architecture)."""
        return cpu_classes.classify(self.arch, self.features)


def parse_cpuinfo(text: str, arch: str | None = None) -> CpuInfo:
    """Parse /proc/cpuinfo text; features are the `CPU_FEATURES` among the first core's flags.
    The architecture is `arch`, else arm64 when the text has arm64's fields (`Features`,
    `CPU architecture`), else x86_64."""
    model = _first_field(text, ("model name", "Model", "Processor")) or "unknown CPU"
    flags = set((_first_field(text, ("flags", "Features")) or "").split())
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", text, re.MULTILINE)]
    if arch is None:
        arm = _first_field(text, ("CPU architecture",)) is not None or "asimd" in flags
        arch = cpu_classes.ARM64 if arm else cpu_classes.X86
    features = tuple(f for f in CPU_FEATURES if f in flags)
    return CpuInfo(model, features, max(mhz, default=None), arch)


def _first_field(text: str, keys: tuple[str, ...]) -> str | None:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in keys:
            return value.strip()
    return None


def flops_per_cycle(features: tuple[str, ...] | set[str]) -> int:
    """fp32 FLOPs per cycle per core, assuming two FMA pipes (an FMA counts as 2 FLOPs).

    avx512f: 2 pipes x 16 lanes x 2 = 64; avx2 + fma: 2 x 8 x 2 = 32; otherwise 16 (SSE-class,
    2 pipes x 4 lanes x 2 or two separate add/mul pipes).
    """
    if "avx512f" in features:
        return 64
    if "avx2" in features and "fma" in features:
        return 32
    return 16


def cpu_peaks(cores: int, ghz: float, features: tuple[str, ...] | set[str]) -> dict[str, float]:
    """Peak OP/s per precision for `cores` cores at `ghz` with these flags (see module doc).

    - int8: VNNI (avx512_vnni / avx_vnni; arm64's dot product, asimddp) fuses the multiply-add
      of 4 byte pairs into one instruction, 4x fp32. Without it int8 GEMM runs on
      pmaddubsw/pmaddwd, roughly 2x fp32.
    - bf16: amx_bf16 counts 8x fp32 (AMX tiles reach 16x on paper; kept conservative), otherwise
      avx512_bf16 (vdpbf16ps) 2x fp32. fp16 likewise: amx_fp16 8x, avx512_fp16 2x. Without
      these flags the precision is not listed: converting to fp32 to compute gains nothing.
    """
    fp32 = cores * ghz * 1e9 * flops_per_cycle(features)
    peaks = {"fp32": fp32}
    for precision in ("fp16", "bf16"):
        if f"amx_{precision}" in features:
            peaks[precision] = 8 * fp32
        elif f"avx512_{precision}" in features:
            peaks[precision] = 2 * fp32
    vnni = any(f in features for f in ("avx512_vnni", "avx_vnni", "asimddp"))
    peaks["int8"] = (4 if vnni else 2) * fp32
    return {p: peaks[p] for p in PRECISIONS if p in peaks}


def cpu_target(
    info: CpuInfo,
    cores: int,
    memory_bytes: int,
    bandwidth: float,
    notes: tuple[str, ...] = (),
) -> Target:
    """Build the `cpu` Target from detected facts; `notes` are appended to the description."""
    ghz = info.mhz / 1000 if info.mhz else DEFAULT_GHZ
    if not info.mhz:
        notes = (*notes, f"clock unknown, assumed {DEFAULT_GHZ} GHz")
    peaks = cpu_peaks(cores, ghz, info.features)
    description = f"{info.model}, {cores} cores at {ghz:.2f} GHz"
    description += "".join(f"; {note}" for note in notes)
    source = (
        "detected: /proc/cpuinfo (else py-cpuinfo), psutil, affinity mask; "
        f"peak = cores x GHz x {flops_per_cycle(info.features)} FLOPs/cycle; "
        f"bandwidth {_bandwidth_source()}"
    )
    row = info.row
    if row is not None:
        description += f"; CPU class {row.name}"
    if info.row_name is not None:
        detected = info.detected_row
        description += f" (from {CPU_CLASS_ENV}; detected {detected.name if detected else 'none'})"
    return Target(
        "cpu",
        "cpu",
        description,
        peaks,
        bandwidth,
        memory_bytes,
        None,
        tuple(peaks),
        source,
        cores=cores,
        features=info.features,
        cpu_class=None if row is None else row.name,
        host=True,
    )


def row_target(
    row: cpu_classes.CpuClass, info: CpuInfo, cores: int, memory_bytes: int, bandwidth: float
) -> Target:
    """The target of a CPU row, from this host's facts. The host's own row is the host (its
    detected features, `host` True); another row takes its features from the row and its cores,
    clock, memory and bandwidth from this host, as assumptions its description states."""
    here = cpu_target(info, cores, memory_bytes, bandwidth)
    if here.cpu_class == row.name:
        return replace(here, name=row.name, description=f"this host: {here.description}")
    features = tuple(f for f in CPU_FEATURES if f in row.requires)
    ghz = info.mhz / 1000 if info.mhz else DEFAULT_GHZ
    peaks = cpu_peaks(cores, ghz, features)
    flags = " ".join(row.requires) or "the x86-64 baseline"
    return Target(
        row.name,
        "cpu",
        f"{row.summary}; not this host: this host's {cores} cores at {ghz:.2f} GHz and memory "
        "assumed",
        peaks,
        bandwidth,
        memory_bytes,
        None,
        tuple(peaks),
        f"CPU row {row.name} ({flags}); cores, clock, memory and bandwidth from this host",
        cores=cores,
        features=features,
        cpu_class=row.name,
        host=False,
    )


def _bandwidth_source() -> str:
    if os.environ.get(BANDWIDTH_ENV):
        return f"from {BANDWIDTH_ENV}"
    record = _host_bandwidth()
    when = time.strftime("%Y-%m-%d", time.gmtime(record.measured))
    return (
        f"measured on this host on {when} (numpy copy of 64 MiB float32, best of 5, read + "
        f"write bytes), kept in {record.path}; delete it to measure again"
    )


@functools.lru_cache(maxsize=1)
def _host_bandwidth() -> host.HostRecord:
    return host.bandwidth(measure_copy_bandwidth)


@functools.lru_cache(maxsize=1)
def measure_copy_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Host memory bandwidth in bytes/s: best of `repeats` copies, counting read + write."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    bandwidth = 2 * src.nbytes / best
    log.debug("measured host copy bandwidth: %.1f GB/s", bandwidth / 1e9)
    return bandwidth


def cpu_bandwidth() -> float:
    """Bytes/s: `INFERCC_CPU_BANDWIDTH_GBS` (GB/s) when set, else this host's measurement
    (made once per host, kept in the cache directory)."""
    value = os.environ.get(BANDWIDTH_ENV)
    if not value:
        return _host_bandwidth().bandwidth
    try:
        gbs = float(value)
    except ValueError:
        gbs = 0.0
    if not gbs > 0 or gbs == float("inf"):
        raise InferccError(
            f"{BANDWIDTH_ENV}={value!r} is not a bandwidth",
            "give a positive number of GB/s, e.g. 25.6, or unset it to measure",
        )
    return gbs * GBS


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def from_py_cpuinfo(cpu: dict[str, Any]) -> CpuInfo:
    """A `CpuInfo` from `infercc.analysis.host.py_cpuinfo()`'s answer."""
    flags = {str(f).lower() for f in cpu.get("flags") or ()}
    mhz = cpu.get("mhz")
    return CpuInfo(
        str(cpu.get("model") or "unknown CPU"),
        tuple(f for f in CPU_FEATURES if f in flags),
        float(mhz) if mhz else None,
        cpu_classes.machine_arch(),
    )


@functools.lru_cache(maxsize=1)
def _host_facts() -> tuple[CpuInfo, int, int, tuple[str, ...]]:
    """Detect the host once: (cpuinfo, cores, memory bytes, description notes)."""
    cpuinfo = _read("/proc/cpuinfo")
    notes: tuple[str, ...] = ()
    if cpuinfo is not None:
        info = parse_cpuinfo(cpuinfo, cpu_classes.machine_arch())
    else:
        info = from_py_cpuinfo(host.py_cpuinfo())
        if not info.features:
            notes = (f"no CPU flags known on {platform.system() or 'this OS'}: features unknown",)
    return info, host.cores(), host.memory_bytes(), notes


def detect_cpu() -> Target:
    """The host CPU as a Target. Detection is cached; the env overrides are read on every
    call."""
    info, cores, memory, notes = _host_facts()
    return cpu_target(_stated_row(info), cores, memory, cpu_bandwidth(), notes)


def _stated_row(info: CpuInfo) -> CpuInfo:
    """`info` with the row `CPU_CLASS_ENV` states, when it is set (checked)."""
    value = os.environ.get(CPU_CLASS_ENV, "").strip().lower()
    if not value:
        return info
    if value not in cpu_classes.BY_NAME:
        raise InferccError(
            f"{CPU_CLASS_ENV}={value!r} is not a CPU row",
            "CPU rows: " + ", ".join(cpu_classes.NAMES) + "; or unset it to detect the host's",
        )
    return replace(info, row_name=value)


# --- Lookup ------------------------------------------------------------------------------------


def get_target(name: str) -> Target:
    """The target called `name` (case-insensitive); InferccError listing the known ones if none."""
    key = name.strip().lower()
    if key == "cpu":
        return detect_cpu()
    if key in cpu_classes.BY_NAME:
        info, cores, memory, _notes = _host_facts()
        row = cpu_classes.BY_NAME[key]
        return row_target(row, _stated_row(info), cores, memory, cpu_bandwidth())
    if key in GPUS:
        return GPUS[key]
    raise InferccError(f"unknown target {name!r}", "known targets: " + ", ".join(TARGET_NAMES))


def is_cpu(name: str) -> bool:
    """Whether the target called `name` is a CPU: `cpu` (this host) or a CPU row."""
    key = name.strip().lower()
    return key == "cpu" or key in cpu_classes.BY_NAME


def bf16_cpu_targets() -> list[str]:
    """The CPU rows whose ISA has bfloat16 (avx512_bf16 or amx_bf16)."""
    return [c.name for c in cpu_classes.CLASSES if c.has_bf16]


def list_targets() -> list[Target]:
    """Every target in `TARGET_NAMES` order (detects the host CPU on first call)."""
    return [get_target(name) for name in TARGET_NAMES]


def host_cpu_info() -> tuple[CpuInfo, int]:
    """The host's CPU info and cores, without measuring bandwidth (cached)."""
    info, cores, _memory, _notes = _host_facts()
    return _stated_row(info), cores
