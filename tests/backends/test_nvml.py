"""GPU facts through NVML (pynvml), with a stand-in module: the count, GPU 0's name and
compute capability, the driver; and the fallback when pynvml is missing or NVML fails."""

from __future__ import annotations

import sys
import types

import pytest

from infercc.backends.trt import backend, fingerprint, nvml


class NVMLError(Exception):
    pass


def fake_pynvml(count: int = 2, fail_init: bool = False) -> types.ModuleType:
    calls: list[str] = []
    m = types.ModuleType("pynvml")

    def init():
        calls.append("init")
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    m.calls = calls
    return m


def test_facts_from_nvml(monkeypatch):
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml.read() == nvml.NvmlFacts(2, "NVIDIA H200", "9.0", "550.54.15")
    assert fake.calls == ["init", "shutdown"]
    assert backend.gpu_count() == 2
    device = fingerprint.detect_device()
    assert (device.gpu, device.compute_capability, device.driver) == (
        "NVIDIA H200",
        "9.0",
        "550.54.15",
    )


def test_nvml_with_no_gpu_counts_zero(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=0))
    assert backend.gpu_count() == 0
    assert fingerprint._nvml_device() is None


@pytest.mark.parametrize("missing", [True, False], ids=["no-pynvml", "nvml-fails"])
def test_falls_back_without_nvml(monkeypatch, tmp_path, missing):
    if missing:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    else:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    assert nvml.read() is None
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(backend, "_GPUS_DIR", gpus)
    assert backend.gpu_count() == 1  # /proc/driver/nvidia/gpus
