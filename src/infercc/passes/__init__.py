"""The pass library. Importing this package registers every pass."""

from __future__ import annotations

from infercc.passes import (  # noqa: F401  (importing registers the passes)
    cse,
    dce,
    fold_constants,
    fp16,
    fuse_conv_bn_relu,
    fuse_qkv,
    no_ops,
    schedule,
)
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
