"""The pass library. Importing this package registers every pass."""

from __future__ import annotations

from infercc.passes import dce  # noqa: F401
from infercc.passes.manager import (
    DEFAULT_PIPELINE,
    REGISTRY,
    PassContext,
    PassResult,
    PipelineReport,
    register_pass,
    run_passes,
)

__all__ = [
    "DEFAULT_PIPELINE",
    "REGISTRY",
    "PassContext",
    "PassResult",
    "PipelineReport",
    "register_pass",
    "run_passes",
]
