"""The TensorRT builder settings infercc exposes, read from `CompileOptions.extra`.

Keys of `extra` (the CLI's `optimize` options in brackets):

- `plugins` [--plugin LIB, repeatable]: shared libraries with TensorRT plugins, loaded before
  parsing (and again before loading the engine).
- `workspace` [--workspace]: the builder's workspace pool limit, bytes or a size such as
  `512MiB` / `4GiB` / `2GB`. Default: the target's memory budget, that is its memory less the
  weights and activation arena of the memory plan (`memory_plan.json` in the artifact) and
  512 MiB for the CUDA context, and never below `infercc.analysis.roofline.default_workspace`.
- `opt_level` [--opt-level 0-5]: `builder_optimization_level` (TensorRT's default is 3; higher
  builds slower and may run faster).
- `hw_compat` [--hw-compat none|ampere+|same-cc]: `HardwareCompatibilityLevel`.
- `version_compatible` [--version-compatible]: `BuilderFlag.VERSION_COMPATIBLE`.
- `timing_cache_strict` [--timing-cache-strict], `strict_target` [--strict-target].
- `precision` [--bf16, --int8]: asks for a precision beyond what `optimize` rewrote the graph
  to (`CompileOptions.precision`, fp32 or fp16); `calib_cache` [--calib-cache FILE].
- `profiles` [--profile, repeatable], `shape_inputs` [--shape-input]: see `profiles`.
- `cache_dir`: where timing caches live when no tuning cache is passed (`--no-tune`).
- `validate`: compare the engine's outputs with onnxruntime on the CPU (default True).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.backends.trt.fingerprint import HW_COMPAT
from infercc.backends.trt.precision import PRECISIONS
from infercc.errors import InferccError

MIB = 2**20
CONTEXT_RESERVE = 512 * MIB
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | int) -> int:
    """'4GiB' -> 4294967296, '512MB' -> 512000000, '1048576' -> 1048576."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.fullmatch(str(text))
        unit = match[2].lower() if match else ""
        if match is None or unit not in _UNITS:
            raise InferccError(
                f"--workspace {text!r} is not a size",
                "give bytes or a size with a unit, e.g. 512MiB, 4GiB, 2GB",
            )
        value = int(float(match[1]) * _UNITS[unit])
    if value <= 0:
        raise InferccError(f"--workspace {text!r} must be positive", "e.g. --workspace 4GiB")
    return value


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


def _int_option(extra: Mapping[str, Any], key: str, lo: int, hi: int, flag: str) -> int | None:
    value = extra.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InferccError(f"{flag} {value!r} is out of range", f"give an integer {lo}-{hi}")
    return value


def _files(paths: Any, flag: str) -> tuple[str, ...]:
    found = tuple(str(Path(p).resolve()) for p in (paths or ()))
    for path in found:
        if not Path(path).is_file():
            raise InferccError(f"{flag} {path} does not exist", "check the path")
    return found


def read_settings(
    extra: Mapping[str, Any],
    precision: str,
    target_memory: int,
    out_dir: Path,
    model: Path,
) -> BuildSettings:
    """BuildSettings from `CompileOptions.extra` (see the module doc); InferccError when bad."""
    wanted = str(extra.get("precision") or precision)
    if wanted not in PRECISIONS:
        raise InferccError(f"unknown precision {wanted!r}", f"use one of {', '.join(PRECISIONS)}")
    hw = str(extra.get("hw_compat") or "none")
    if hw not in HW_COMPAT:
        raise InferccError(f"--hw-compat {hw!r} is unknown", f"use one of {', '.join(HW_COMPAT)}")
    settings = BuildSettings(
        precision=wanted,
        opt_level=_int_option(extra, "opt_level", 0, 5, "--opt-level"),
        hw_compat=hw,
        version_compatible=bool(extra.get("version_compatible", False)),
        plugins=_files(extra.get("plugins"), "--plugin"),
        timing_cache_strict=bool(extra.get("timing_cache_strict", False)),
        strict_target=bool(extra.get("strict_target", False)),
        calib_cache=(
            _files([extra["calib_cache"]], "--calib-cache")[0] if extra.get("calib_cache") else None
        ),
        profiles=list(extra.get("profiles") or []),
        shape_inputs=extra.get("shape_inputs"),
        cache_dir=str(extra["cache_dir"]) if extra.get("cache_dir") else None,
        validate=bool(extra.get("validate", True)),
    )
    if extra.get("workspace") is not None:
        settings.workspace_bytes = parse_size(extra["workspace"])
    else:
        weights, arena = plan_sizes(out_dir, model)
        settings.workspace_bytes = default_workspace(target_memory, weights, arena)
        settings.workspace_rule = "target memory - weights - arena - 512 MiB"
    return settings
