"""The NVIDIA driver's own answer about its GPUs, through NVML (the `nvidia-ml-py` package,
imported as `pynvml`, in the tensorrt extra): how many GPUs, GPU 0's name and compute
capability, and the driver version. It replaces reading `nvidia-smi`'s text where the
package is installed; without it (or when NVML cannot start: no driver) `read()` is None and
callers fall back to /proc and `nvidia-smi`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlFacts:
    count: int
    gpu: str | None  # GPU 0's name (None when there is no GPU)
    compute_capability: str | None  # "8.0"
    driver: str | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read() -> NvmlFacts | None:
    """What NVML says, or None when pynvml is missing or NVML does not start."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError: no driver, no library
        log.debug("NVML did not start: %s", exc)
        return None
    try:
        return _facts(pynvml)
    except Exception as exc:
        log.debug("NVML query failed: %s", exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # shutting down a library that answered: nothing to do
            pass


def _facts(pynvml: Any) -> NvmlFacts:
    count = int(pynvml.nvmlDeviceGetCount())
    driver = _text(pynvml.nvmlSystemGetDriverVersion())
    if count == 0:
        return NvmlFacts(0, None, None, driver)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    return NvmlFacts(count, name, f"{int(major)}.{int(minor)}", driver)
