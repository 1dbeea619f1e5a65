"""The TensorRT backend: where it can run, and building and loading engines where it can.

`available()` checks, in order, what a TensorRT build needs: the `tensorrt` Python package, an
NVIDIA driver, and at least one NVIDIA GPU; the first missing piece is the one-line reason the
CLI prints (exit code 2).

`compile` builds a serialized engine (`engine.plan`) for the optimized model with the
optimization profiles, precision and builder settings asked for, through the engine and timing
caches in infercc's cache directory, and validates it against onnxruntime on the CPU; the
pieces live in `infercc.backends.trt` (`build`, `profiles`, `precision`, `fingerprint`,
`caches`, `calibrator`, `runner`, `settings`), whose docstrings give the method. `load`
refuses an engine built for another TensorRT, GPU or CUDA (saying what differs) unless it
was built version- or hardware-compatible.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infercc.analysis.targets import Target
from infercc.backends.trt import nvml
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.runtime.artifact import Artifact, Runner
from infercc.runtime.backend import CompileOptions

INSTALL_HINT = 'pip install "infercc[tensorrt]"'
_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def package_present() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def driver_present() -> bool:
    if _DRIVER_FILE.exists() or shutil.which("nvidia-smi") is not None:
        return True
    return nvml.read() is not None  # NVML started: a driver answered (Windows has no /proc)


def gpu_count() -> int:
    """NVIDIA GPUs the driver lists: NVML's count (pynvml), else its /proc entries, else
    `nvidia-smi -L`."""
    facts = nvml.read()
    if facts is not None:
        return facts.count
    if _GPUS_DIR.is_dir():
        return sum(1 for _ in _GPUS_DIR.iterdir())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class TensorRTBackend:
    name = "tensorrt"

    def available(self) -> tuple[bool, str]:
        if not package_present():
            return False, f"the tensorrt package is not installed ({INSTALL_HINT})"
        if not driver_present():
            return False, (
                "no NVIDIA driver found (no /proc/driver/nvidia/version, no nvidia-smi); "
                "TensorRT needs an NVIDIA GPU with its driver, or use --backend ort"
            )
        if gpu_count() == 0:
            return False, "the NVIDIA driver lists no GPU; use --backend ort on this machine"
        return True, ""

    def version(self) -> str:
        if not package_present():
            return ""
        import tensorrt  # type: ignore[import-not-found]

        return str(tensorrt.__version__)

    def precisions(self, target: Target) -> tuple[str, ...]:
        return tuple(p for p in target.precisions if p != "tf32") if target.kind == "gpu" else ()

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        """Build engine.plan and tensorrt.json into `out_dir` (see `trt.build`)."""
        from infercc.backends.trt.build import compile_artifact

        return compile_artifact(_tensorrt(), model, target, shapes, options, cache, out_dir)

    def load(self, artifact: Artifact) -> Runner:
        from infercc.backends.trt.build import open_engine

        return open_engine(_tensorrt(), artifact.path)


def _tensorrt() -> Any:
    try:
        import tensorrt  # type: ignore[import-not-found]
    except ImportError as exc:
        raise InferccError(f"the tensorrt package cannot be imported: {exc}", INSTALL_HINT) from exc
    return tensorrt
