"""The TensorRT builder settings of a build, from the typed `CompileOptions.tensorrt`
(`infercc.config.TrtOptions`; the CLI's `optimize` options in brackets):

- `plugins` [--plugin LIB, repeatable]: shared libraries with TensorRT plugins, loaded before
  parsing (and again before loading the engine); each must exist.
- `workspace` [--workspace]: the builder's workspace pool limit in bytes. Default: the target's
  memory budget, that is its memory less the weights and activation arena of the memory plan
  (`memory_plan.json` in the artifact) and 512 MiB for the CUDA context, and never below
  `infercc.analysis.roofline.default_workspace`.
- `opt_level` [--opt-level 0-5]: `builder_optimization_level` (TensorRT's default is 3; higher
  builds slower and may run faster).
- `hw_compat` [--hw-compat none|ampere+|same-cc]: `HardwareCompatibilityLevel`.
- `version_compatible` [--version-compatible]: `BuilderFlag.VERSION_COMPATIBLE`.
- `timing_cache_strict` [--timing-cache-strict], `strict_target` [--strict-target].
- `calib_cache` [--calib-cache FILE], with precision int8 on TensorRT 10.
- `profiles` [--trt-profile, repeatable], `shape_inputs` [--shape-input]: see `profiles`.

From the rest of `CompileOptions`: `precision` (the build's: fp32, fp16, bf16 or int8),
`cache_dir` (where timing caches live when no tuning cache is passed: `--no-tune`) and
`validate` (compare the engine's outputs with onnxruntime on the CPU).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.backends.trt.precision import PRECISIONS
from infercc.errors import InferccError
from infercc.runtime.backend import CompileOptions
from infercc.util import parse_size  # noqa: F401  (the size parser; tests and callers use it here)

MIB = 2**20
CONTEXT_RESERVE = 512 * MIB


def default_workspace(target_memory: int, weights: int, arena: int) -> int:
    """The target's memory budget for scratch: memory - weights - arena - CUDA context."""
    from infercc.analysis.roofline import default_workspace as floor

    return max(floor(weights, arena), target_memory - weights - arena - CONTEXT_RESERVE)


def plan_sizes(out_dir: Path, model: Path) -> tuple[int, int]:
    """(weights, arena) bytes from the artifact's memory plan, else (model file size, 0)."""
    try:
        plan = json.loads((Path(out_dir) / "memory_plan.json").read_text())
        return int(plan["weights_bytes"]), int(plan["arena_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return (model.stat().st_size if model.is_file() else 0), 0


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class BuildSettings:
    precision: str = "fp32"
    workspace_bytes: int = 0
    workspace_rule: str = "given"
    opt_level: int | None = None
    hw_compat: str = "none"
    version_compatible: bool = False
    plugins: tuple[str, ...] = ()
    timing_cache_strict: bool = False
    strict_target: bool = False
    calib_cache: str | None = None
    profiles: list[Any] = field(default_factory=list)
    shape_inputs: Any = None
    cache_dir: str | None = None
    validate: bool = True

    def builder_options(self) -> dict[str, Any]:
        """What changes the engine, as JSON (plugin and calibration files by content hash)."""
        return {
            "workspace_bytes": self.workspace_bytes,
            "opt_level": self.opt_level,
            "hw_compat": self.hw_compat,
            "version_compatible": self.version_compatible,
            "plugins": [{"path": p, "sha256": file_digest(p)} for p in self.plugins],
            "calib_cache": (
                {"path": self.calib_cache, "sha256": file_digest(self.calib_cache)}
                if self.calib_cache
                else None
            ),
        }


def _files(paths: Any, flag: str) -> tuple[str, ...]:
    found = tuple(str(Path(p).resolve()) for p in (paths or ()))
    for path in found:
        if not Path(path).is_file():
            raise InferccError(f"{flag} {path} does not exist", "check the path")
    return found


def read_settings(
    options: CompileOptions, target_memory: int, out_dir: Path, model: Path
) -> BuildSettings:
    """BuildSettings from the build's options (see the module doc); InferccError when bad."""
    trt = options.tensorrt
    if options.precision not in PRECISIONS:
        raise InferccError(
            f"unknown precision {options.precision!r}", f"use one of {', '.join(PRECISIONS)}"
        )
    settings = BuildSettings(
        precision=options.precision,
        opt_level=trt.opt_level,
        hw_compat=trt.hw_compat,
        version_compatible=trt.version_compatible,
        plugins=_files(trt.plugins, "--plugin"),
        timing_cache_strict=trt.timing_cache_strict,
        strict_target=trt.strict_target,
        calib_cache=_files([trt.calib_cache], "--calib-cache")[0] if trt.calib_cache else None,
        profiles=[list(p) for p in trt.profiles],
        shape_inputs=list(trt.shape_inputs),
        cache_dir=options.cache_dir,
        validate=options.validate,
    )
    if trt.workspace is not None:
        settings.workspace_bytes = trt.workspace
    else:
        weights, arena = plan_sizes(out_dir, model)
        settings.workspace_bytes = default_workspace(target_memory, weights, arena)
        settings.workspace_rule = "target memory - weights - arena - 512 MiB"
    return settings
