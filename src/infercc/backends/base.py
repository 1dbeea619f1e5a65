"""The backend layer: what turns an optimized ONNX model into something that runs.

A backend answers `available()` with a reason when it cannot run here, says which precisions it
supports on a target, compiles an optimized model into an artifact directory for a target and
shape profiles (tuning where it can, with choices cached on disk), and loads an artifact into a
runner. Backends register by name here, and outside packages add theirs through the
`infercc.backends` entry-point group (each entry point names a Backend class or instance).

An artifact directory holds `model.onnx` (the optimized model), `manifest.json` (what was
built, from what, for what, and how it validated) and the backend's own files.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from infercc.errors import InferccError
from infercc.shapes import ShapeProfile
from infercc.targets import Target

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "infercc.backends"
MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"

Feeds = Mapping[str, np.ndarray]
Shape = tuple[int, ...]


@dataclass
class CompileOptions:
    """What a backend may need beyond the model, target and shapes."""

    precision: str = "fp32"
    tune: bool = True
    warmup: int = 3
    iters: int = 10
    workspace_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    on_step: Callable[[str], None] | None = None


@dataclass
class Artifact:
    """A built artifact: its directory and the parsed manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def backend(self) -> str:
        return str(self.manifest.get("backend", {}).get("name", ""))


@runtime_checkable
class Runner(Protocol):
    """Runs a loaded artifact (or model): feeds by input name -> outputs in graph order."""

    input_names: Sequence[str]
    output_names: Sequence[str]

    def run(self, feeds: Feeds) -> list[np.ndarray]: ...


@runtime_checkable
class Backend(Protocol):
    name: str

    def available(self) -> tuple[bool, str]:
        """(True, "") when it can run here; else (False, one line: why, and how to fix it)."""
        ...

    def version(self) -> str: ...

    def precisions(self, target: Target) -> tuple[str, ...]:
        """The precisions this backend can run on `target`."""
        ...

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        """Build backend files for the optimized `model` into `out_dir`; returns the manifest's
        `backend` section (name, version, files, tuning choices...). `cache` is the tuning
        cache (`infercc.tuning.TuningCache`) or None to tune without one."""
        ...

    def load(self, artifact: Artifact) -> Runner: ...


_REGISTRY: dict[str, Backend] = {}
_ENTRY_POINTS_LOADED = False


def register_backend(backend: Backend) -> Backend:
    """Register a backend instance under its name (a later registration replaces it)."""
    _REGISTRY[backend.name] = backend
    return backend


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            backend = obj() if isinstance(obj, type) else obj
            if not isinstance(backend, Backend):
                raise TypeError(f"{obj!r} is not a Backend")
            _REGISTRY.setdefault(backend.name, backend)
        except Exception as e:  # a broken plug-in must not break infercc
            log.warning("backend entry point %r failed to load: %s", ep.name, e)


def backend_names() -> list[str]:
    _builtin()
    _load_entry_points()
    return sorted(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The backend called `name`; InferccError naming the known ones otherwise."""
    _builtin()
    _load_entry_points()
    backend = _REGISTRY.get(name)
    if backend is None:
        raise InferccError(
            f"unknown backend {name!r}", "known backends: " + ", ".join(sorted(_REGISTRY))
        )
    return backend


def require_available(backend: Backend) -> None:
    ok, reason = backend.available()
    if not ok:
        raise InferccError(f"backend {backend.name!r} cannot run here: {reason}")


def _builtin() -> None:
    # Imported here so that the registry module stays free of import cycles.
    from infercc.backends import none, ort, tensorrt  # noqa: F401
