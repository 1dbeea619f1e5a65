"""The TensorRT backend: where it can run, and why not.

`available()` checks, in order, what a TensorRT build needs: the `tensorrt` Python package, an
NVIDIA driver, and at least one NVIDIA GPU; the first missing piece is the one-line reason the
CLI prints (exit code 2). Engine building (profiles, timing cache, engine files) is not part of
this version: with everything present, `compile` says so and points at `--backend ort`.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infercc.backends.base import Artifact, CompileOptions, Runner, register_backend
from infercc.errors import InferccError
from infercc.shapes import ShapeProfile
from infercc.targets import Target

INSTALL_HINT = 'pip install "infercc[tensorrt]"'
_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


def package_present() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def driver_present() -> bool:
    return _DRIVER_FILE.exists() or shutil.which("nvidia-smi") is not None


def gpu_count() -> int:
    """NVIDIA GPUs the driver lists (its /proc entries, else `nvidia-smi -L`)."""
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
        raise InferccError(
            "building TensorRT engines is not part of this version of infercc",
            "use --backend ort (onnxruntime) for now",
        )

    def load(self, artifact: Artifact) -> Runner:
        raise InferccError(
            f"artifact {artifact.path} holds no TensorRT engine this version can load",
            "rebuild it with --backend ort",
        )


register_backend(TensorRTBackend())
