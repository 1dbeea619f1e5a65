"""The `ort` backend: compile tunes each shape point, load returns a runner."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infercc.analysis.targets import Target
from infercc.backends.ort.config import (
    CONFIG_FILE,
    CUDA,
    GPU_INSTALL_HINT,
    GPU_PROVIDERS,
    OPTIMIZED_FILE,
    SCHEMA,
    _require_ort,
    _version,
    candidate_providers,
)
from infercc.backends.ort.runner import OrtRunner, _usable_optimized, read_config
from infercc.backends.ort.tuner import (
    _Context,
    _fingerprint,
    _model_hash,
    _save_optimized,
    shape_points,
    tune_point,
)
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.ir.wire import read_model
from infercc.precisions import BUILD_PRECISIONS
from infercc.runtime.artifact import Artifact, Runner
from infercc.runtime.backend import CompileOptions

try:
    import onnxruntime as ort
except ImportError:  # the core dependency, but a broken install must give a reason
    ort = None


# --------------------------------------------------------------------------- the backend


def gpu_providers() -> list[str]:
    """GPU execution providers this onnxruntime build has (empty on the CPU package)."""
    if ort is None:
        return []
    return [p for p in ort.get_available_providers() if p in GPU_PROVIDERS]


def gpu_reason() -> str:
    """Why GPU targets cannot run here ("" when they can)."""
    if ort is None:
        return "onnxruntime is not installed (pip install onnxruntime)"
    if CUDA not in ort.get_available_providers():
        return f"onnxruntime-gpu is not installed ({GPU_INSTALL_HINT})"
    return ""


def _host_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class OrtBackend:
    """ONNX Runtime: sessions tuned per shape point (see the module docstring)."""

    name = "ort"

    def available(self) -> tuple[bool, str]:
        if ort is None:
            return False, "onnxruntime is not installed (pip install onnxruntime)"
        return True, ""

    def version(self) -> str:
        return _version()

    def precisions(self, target: Target) -> tuple[str, ...]:
        """fp32, fp16, int8 (+ bf16 where the CPU has it) on the CPU; the GPU target's own
        precisions when onnxruntime has the CUDA provider, else none (see `gpu_reason`)."""
        if ort is None:
            return ()
        if target.kind == "gpu":
            if gpu_reason():
                return ()
            return tuple(p for p in BUILD_PRECISIONS if p in target.precisions)
        # the CPU provider runs fp16 and int8 graphs everywhere, bf16 where the CPU has it
        return tuple(p for p in BUILD_PRECISIONS if p != "bf16" or "bf16" in target.precisions)

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        """Tune each shape point, write ort_config.json (and ort_optimized.onnx); returns the
        manifest's backend section."""
        _require_ort()
        ctx = _context(Path(model), target, options, cache)
        points = [tune_point(ctx, n, s) for n, s in shape_points(ctx.proto, shapes)]
        default = next(i for i, p in enumerate(points) if p["name"] == "opt")
        optimized = None
        if options.ort.optimized_model:
            optimized = _save_optimized(ctx, points[default], Path(out_dir))
        config = _ort_config(ctx, points, default, optimized)
        (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return _manifest_section(ctx, points, default, optimized)

    def load(self, artifact: Artifact) -> Runner:
        _require_ort()
        config = read_config(artifact.path)
        optimized = _usable_optimized(artifact.path, config)
        return OrtRunner(artifact.model_path, config["points"], config["default"], optimized)


def _context(model: Path, target: Target, options: CompileOptions, cache: Any) -> _Context:
    providers = candidate_providers(target.kind, ort.get_available_providers())
    if not providers:
        raise InferccError(
            f"onnxruntime cannot run on the {target.name} target here: {gpu_reason()}",
            "compile for --target cpu, or install onnxruntime-gpu",
        )
    if not model.is_file():
        raise InferccError(f"model file {str(model)!r} does not exist", "check the path")
    ctx = _Context(model, read_model(model)[0], providers, _host_cores(), options, cache)
    ctx.fingerprint = _fingerprint()
    ctx.model_hash = _model_hash(model) if cache is not None else None
    return ctx


def _ort_config(
    ctx: _Context, points: list[dict[str, Any]], default: int, optimized: dict | None
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "onnxruntime": _version(),
        "fingerprint": ctx.fingerprint,
        "points": points,
        "default": default,
        "optimized_model": optimized,
    }


def _manifest_section(
    ctx: _Context, points: list[dict[str, Any]], default: int, optimized: dict | None
) -> dict[str, Any]:
    summary_keys = (
        "name",
        "shapes",
        "provider",
        "session_options",
        "disabled_optimizers",
        "median_ms",
        "cache",
    )
    return {
        "name": "ort",
        "version": _version(),
        "files": [CONFIG_FILE] + ([OPTIMIZED_FILE] if optimized else []),
        "providers": list(ctx.providers),
        "default": default,
        "points": [{k: p[k] for k in summary_keys} for p in points],
    }
