"""Backends: the ONNX Runtime backend, and the registry outside packages plug into."""

from __future__ import annotations

from infercc.backends.base import (
    MANIFEST,
    MODEL_FILE,
    Artifact,
    Backend,
    CompileOptions,
    Runner,
    ShapeProfile,
)
from infercc.backends.registry import (
    backend_names,
    get_backend,
    register_backend,
    require_available,
)

__all__ = [
    "MANIFEST",
    "MODEL_FILE",
    "Artifact",
    "Backend",
    "CompileOptions",
    "Runner",
    "ShapeProfile",
    "backend_names",
    "get_backend",
    "register_backend",
    "require_available",
]
