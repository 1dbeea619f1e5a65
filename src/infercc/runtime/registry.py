"""Backends by name: the built-in ones resolved lazily, like entry points, and outside
packages' through the `infercc.backends` entry-point group (each entry point names a Backend
class or instance). Nothing is imported until a backend is asked for, so this module imports
no backend: the runtime and validation open and run any artifact (`load_runner`) while the
backends, which import the runtime and validation's comparisons, stay above both.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from typing import Any

from infercc.errors import InferccError
from infercc.runtime.artifact import Runner, Source, open_source
from infercc.runtime.backend import Backend

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "infercc.backends"

# name -> "module:attribute" of the Backend class, imported on first use.
BUILTIN = {
    "none": "infercc.backends.none:NoneBackend",
    "ort": "infercc.backends.ort.backend:OrtBackend",
    "tensorrt": "infercc.backends.trt.backend:TensorRTBackend",
    "openvino": "infercc.backends.openvino.backend:OpenVinoBackend",
}
# what runs a plain .onnx file: onnxruntime with its default session options
PLAIN_RUNNER = "infercc.backends.ort.runner:default_runner"

_REGISTRY: dict[str, Backend] = {}
_ENTRY_POINTS_LOADED = False


def register_backend(backend: Backend) -> Backend:
    """Register a backend instance under its name (a later registration replaces it)."""
    _REGISTRY[backend.name] = backend
    return backend


def _load_builtin(name: str) -> Backend | None:
    spec = BUILTIN.get(name)
    if spec is None:
        return None
    backend = _resolve(spec)()
    _REGISTRY.setdefault(name, backend)
    return _REGISTRY[name]


def _resolve(spec: str) -> Any:
    """The attribute a "module:attribute" spec names, its module imported now."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


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
    """Every backend name: built-in, registered and from entry points (nothing imported)."""
    _load_entry_points()
    return sorted({*BUILTIN, *_REGISTRY})


def get_backend(name: str) -> Backend:
    """The backend called `name`; InferccError naming the known ones otherwise."""
    backend = _REGISTRY.get(name) or _load_builtin(name)
    if backend is None:
        _load_entry_points()
        backend = _REGISTRY.get(name)
    if backend is None:
        raise InferccError(
            f"unknown backend {name!r}", "known backends: " + ", ".join(backend_names())
        )
    return backend


def require_available(backend: Backend) -> None:
    ok, reason = backend.available()
    if not ok:
        raise InferccError(f"backend {backend.name!r} cannot run here: {reason}")


def load_runner(source: Source | str | os.PathLike[str], spinning: bool = True) -> Runner:
    """A model's or an artifact's runner: an artifact through the backend that built it, a
    plain file through onnxruntime with its default session options. `spinning=False` stops
    onnxruntime's idle intra-op threads from spinning after a run (where the runner has that
    switch), so that two runners raced against each other do not take the CPU from one
    another."""
    if not isinstance(source, Source):
        source = open_source(source)
    if source.artifact is None:
        runner = _resolve(PLAIN_RUNNER)(source.path)
        runner.spinning = spinning
        return runner
    backend = get_backend(source.artifact.backend)
    require_available(backend)
    runner = backend.load(source.artifact)
    if not spinning and hasattr(runner, "spinning"):
        runner.spinning = False
    return runner
