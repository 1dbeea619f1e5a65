"""Backends by name: the built-in ones resolved lazily, like entry points, and outside
packages' through the `infercc.backends` entry-point group (each entry point names a Backend
class or instance). Nothing is imported until a backend is asked for, so this module imports
no backend and no backend imports it back.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging

from infercc.backends.base import Backend
from infercc.errors import InferccError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "infercc.backends"

# name -> "module:attribute" of the Backend class, imported on first use.
BUILTIN = {
    "none": "infercc.backends.none:NoneBackend",
    "ort": "infercc.backends.ort.backend:OrtBackend",
    "tensorrt": "infercc.backends.trt.backend:TensorRTBackend",
}

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
    module, _, attr = spec.partition(":")
    backend = getattr(importlib.import_module(module), attr)()
    _REGISTRY.setdefault(name, backend)
    return _REGISTRY[name]


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
