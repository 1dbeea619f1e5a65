"""The built-in backends (`none`, `ort`: ONNX Runtime, `tensorrt`), each found by name through
`infercc.runtime.registry` as outside packages' backends are. The names a backend is written
against, re-exported here for those packages: the `Backend` protocol and `CompileOptions`
(`infercc.runtime.backend`), `Artifact` and `Runner` (`infercc.runtime.artifact`), and the
registry's functions."""

from __future__ import annotations

from infercc.data.profiles import ShapeProfile
from infercc.runtime.artifact import Artifact, Runner
from infercc.runtime.backend import Backend, CompileOptions
from infercc.runtime.registry import (
    backend_names,
    get_backend,
    load_runner,
    register_backend,
    require_available,
)

__all__ = [
    "Artifact",
    "Backend",
    "CompileOptions",
    "Runner",
    "ShapeProfile",
    "backend_names",
    "get_backend",
    "load_runner",
    "register_backend",
    "require_available",
]
