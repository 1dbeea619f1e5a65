"""What a TensorRT engine is tied to, read from this machine, and how two readings compare.

A serialized engine (a plan) runs only where it was built, unless it was built for
compatibility: the TensorRT version and the GPU (name, compute capability) must match, and the
CUDA runtime must be of the same major version. The fingerprint is those facts:

```
{"tensorrt": "10.3.0", "cuda": "12.4", "driver": "550.54.15",
 "gpu": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
```

Read from (first that answers): NVML through pynvml (`infercc.backends.trt.nvml`), else
`nvidia-smi --query-gpu=name,compute_cap,driver_version` for the GPU and driver (else
PyTorch's `torch.cuda`, else /proc/driver/nvidia/version for the driver); the CUDA runtime
version from cuda-python (`cudaRuntimeGetVersion`), else
`torch.version.cuda`. A fact nobody answers is "unknown".

`differences(built, here, version_compatible, hardware_compat)` lists what differs, one phrase
per field, and splits them into fatal ones and warnings:

- `tensorrt`: fatal when different; with `version_compatible` only an older runtime is fatal,
  since version-compatible engines run on any later TensorRT, the next major version included
  (TensorRT's "Version Compatibility" docs: engines built with 8.6+ run on 9 and 10; built with
  10, on 11). They need the runtime's `engine_host_code_allowed` (they carry a lean runtime),
  which the runner sets for them.
- `gpu` and `compute_capability`: fatal when different; `ampere+` hardware compatibility
  accepts any GPU of compute capability >= 8.0, `same-cc` any GPU of the same compute
  capability.
- `cuda`: another major version is fatal, another minor version a warning.
- `driver`: a warning only. Engines do not embed the driver; refusing one after every driver
  update would break every deployment for no reason.

The timing cache is keyed by `timing_key()`: (TensorRT, GPU name, compute capability, CUDA), the
things its tactic timings depend on; the driver is left out for the reason above.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infercc.backends.trt import nvml
from infercc.errors import InferccError

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
FIELDS = ("tensorrt", "cuda", "driver", "gpu", "compute_capability")
_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_DRIVER_RE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)")


@dataclass(frozen=True)
class Fingerprint:
    """The versions and device a TensorRT engine is built with (strings; "unknown" if unread)."""

    tensorrt: str
    cuda: str = UNKNOWN
    driver: str = UNKNOWN
    gpu: str = UNKNOWN
    compute_capability: str = UNKNOWN

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls(**{f: str(data.get(f) or UNKNOWN) for f in FIELDS})

    def timing_key(self) -> dict[str, str]:
        """What a timing cache's entries depend on (the driver is not among them)."""
        return {
            "tensorrt": self.tensorrt,
            "gpu": self.gpu,
            "compute_capability": self.compute_capability,
            "cuda": self.cuda,
        }

    def digest(self, fields: tuple[str, ...] = FIELDS) -> str:
        """16 hex digits of sha256 over the chosen fields' canonical JSON."""
        data = {f: getattr(self, f) for f in fields}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def timing_digest(self) -> str:
        return self.digest(("tensorrt", "gpu", "compute_capability", "cuda"))


@dataclass(frozen=True)
class DeviceInfo:
    gpu: str = UNKNOWN
    compute_capability: str = UNKNOWN
    driver: str = UNKNOWN


# --------------------------------------------------------------------------- reading


def parse_smi_query(text: str) -> DeviceInfo | None:
    """The first line of `nvidia-smi --query-gpu=name,compute_cap,driver_version
    --format=csv,noheader` as a DeviceInfo (None when it is not three fields)."""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(parts):
            gpu, cc, driver = parts
            return DeviceInfo(gpu, cc if re.fullmatch(r"\d+\.\d+", cc) else UNKNOWN, driver)
    return None


def parse_driver_file(text: str) -> str:
    """The driver version in /proc/driver/nvidia/version's text, or "unknown"."""
    match = _DRIVER_RE.search(text)
    return match[1].rstrip(".") if match else UNKNOWN


def cuda_version_text(version: int) -> str:
    """CUDA's integer version (12040) as "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _nvml_device() -> DeviceInfo | None:
    facts = nvml.read()
    if facts is None or not facts.gpu:
        return None
    return DeviceInfo(facts.gpu, facts.compute_capability or UNKNOWN, facts.driver or UNKNOWN)


def _smi_device() -> DeviceInfo | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = ["--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader", "-i", "0"]
    try:
        done = subprocess.run([smi, *query], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_smi_query(done.stdout) if done.returncode == 0 else None


def _torch_device() -> DeviceInfo | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return DeviceInfo(torch.cuda.get_device_name(0), f"{major}.{minor}", UNKNOWN)


def _driver_from_file() -> str:
    try:
        return parse_driver_file(_DRIVER_FILE.read_text())
    except OSError:
        return UNKNOWN


def detect_device() -> DeviceInfo:
    """GPU 0's name, compute capability and the driver version (see the module doc)."""
    device = _nvml_device() or _smi_device() or _torch_device() or DeviceInfo()
    if device.driver == UNKNOWN:
        device = DeviceInfo(device.gpu, device.compute_capability, _driver_from_file())
    return device


def detect_cuda() -> str:
    """The CUDA runtime version: cuda-python, else torch.version.cuda, else "unknown"."""
    for reader in (_cuda_python_version, _torch_cuda_version):
        try:
            found = reader()
        except Exception as exc:  # a broken optional package must not break a build
            log.debug("CUDA version via %s failed: %s", reader.__name__, exc)
            continue
        if found:
            return found
    return UNKNOWN


def _cuda_python_version() -> str | None:
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # cuda-python < 12.6
        except ImportError:
            return None
    err, version = runtime.cudaRuntimeGetVersion()
    return cuda_version_text(int(version)) if int(err) == 0 else None


def _torch_cuda_version() -> str | None:
    import torch

    return torch.version.cuda


def detect(
    trt: Any,
    device: Callable[[], DeviceInfo] = detect_device,
    cuda: Callable[[], str] = detect_cuda,
) -> Fingerprint:
    """This machine's fingerprint, with `trt` the imported tensorrt module."""
    info = device()
    return Fingerprint(
        tensorrt=str(getattr(trt, "__version__", UNKNOWN)),
        cuda=cuda(),
        driver=info.driver,
        gpu=info.gpu,
        compute_capability=info.compute_capability,
    )


# --------------------------------------------------------------------------- comparing


@dataclass
class Differences:
    fatal: list[str]
    warnings: list[str]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _cc_value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def differences(
    built: Fingerprint,
    here: Fingerprint,
    version_compatible: bool = False,
    hardware_compat: str = "none",
) -> Differences:
    """What differs between where an engine was built and here (see the module doc)."""
    found = Differences([], [])
    _compare_tensorrt(built, here, version_compatible, found)
    _compare_device(built, here, hardware_compat, found)
    _compare_cuda(built, here, found)
    if built.driver != here.driver:
        found.warnings.append(f"NVIDIA driver {built.driver} at build, {here.driver} here")
    return found


def _compare_tensorrt(built: Fingerprint, here: Fingerprint, vc: bool, found: Differences) -> None:
    if built.tensorrt == here.tensorrt:
        return
    phrase = f"TensorRT {built.tensorrt} at build, {here.tensorrt} here"
    b, h = _version_tuple(built.tensorrt), _version_tuple(here.tensorrt)
    if vc and h >= b:
        found.warnings.append(phrase + " (version-compatible engine)")
    else:
        found.fatal.append(phrase)


def _compare_device(built: Fingerprint, here: Fingerprint, hw: str, found: Differences) -> None:
    same_cc = built.compute_capability == here.compute_capability
    if same_cc and built.gpu == here.gpu:
        return
    phrase = (
        f"GPU {built.gpu} (compute capability {built.compute_capability}) at build, "
        f"{here.gpu} (compute capability {here.compute_capability}) here"
    )
    cc_here = _cc_value(here.compute_capability)
    if hw == "ampere+" and cc_here is not None and cc_here >= 8.0:
        found.warnings.append(phrase + " (ampere+ hardware-compatible engine)")
    elif hw == "same-cc" and same_cc:
        found.warnings.append(phrase + " (same-cc hardware-compatible engine)")
    else:
        found.fatal.append(phrase)


def _compare_cuda(built: Fingerprint, here: Fingerprint, found: Differences) -> None:
    if built.cuda == here.cuda:
        return
    phrase = f"CUDA {built.cuda} at build, {here.cuda} here"
    if _version_tuple(built.cuda)[:1] != _version_tuple(here.cuda)[:1]:
        found.fatal.append(phrase)
    else:
        found.warnings.append(phrase)


def check_loadable(
    built: Fingerprint, here: Fingerprint, version_compatible: bool, hardware_compat: str
) -> list[str]:
    """Raise InferccError naming every fatal difference; return the warnings."""
    diff = differences(built, here, version_compatible, hardware_compat)
    if diff.fatal:
        raise InferccError(
            "this TensorRT engine was built for another setup: " + "; ".join(diff.fatal),
            "rebuild it here with infercc optimize, or build with --version-compatible / "
            "--hw-compat ampere+ to get engines that move between machines",
        )
    for warning in diff.warnings:
        log.warning("TensorRT engine: %s", warning)
    return diff.warnings


# --------------------------------------------------------------------------- targets


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def target_mismatch(target_name: str, target_cc: str | None, here: Fingerprint) -> str | None:
    """Why the GPU here is not the target's GPU, or None when it is (or cannot be told).

    Compute capabilities must be equal, and the target's name (e.g. `a100`) must appear in
    the GPU's name (`NVIDIA A100-SXM4-80GB`): GPUs of one architecture still differ in SM
    count and memory, and TensorRT picks tactics by timing them on the GPU at hand.
    """
    if here.gpu == UNKNOWN and here.compute_capability == UNKNOWN:
        return None
    if target_cc and here.compute_capability not in (UNKNOWN, target_cc):
        return (
            f"the GPU here is {here.gpu} (compute capability {here.compute_capability}), "
            f"target {target_name} has compute capability {target_cc}"
        )
    if here.gpu != UNKNOWN and _normalize(target_name) not in _normalize(here.gpu):
        return f"the GPU here is {here.gpu}, not a {target_name}"
    return None
