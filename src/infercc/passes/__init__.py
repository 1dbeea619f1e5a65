"""The pass library. Importing this package registers every pass; `infercc.passes.pipelines`
names every pipeline, `infercc.passes.rules` is the rewrite-rule contract and
`infercc.passes.match` the helpers rules match with."""

from __future__ import annotations

from typing import Any

from infercc.passes import (  # noqa: F401  (importing registers the passes)
    attention,
    cse,
    dce,
    fold_constants,
    fp16,
    fuse_attention,
    fuse_conv_bn_relu,
    fuse_gemm,
    fuse_gqa,
    fuse_qkv,
    fuse_rms_norm,
    fuse_rotary,
    no_ops,
    quantize_qdq,
    schedule,
    shape_fold,
    split_outliers,
)
from infercc.passes.manager import (
    DEFAULT_PIPELINE,
    REGISTRY,
    PassContext,
    PassResult,
    PipelineReport,
    QuantizeSettings,
    register_pass,
    run_passes,
)
from infercc.passes.pipelines import PIPELINES, Pipeline, pipelines_of

__all__ = [
    "DEFAULT_PIPELINE",
    "PIPELINES",
    "REGISTRY",
    "PassContext",
    "PassResult",
    "Pipeline",
    "PipelineReport",
    "QuantizeSettings",
    "catalog",
    "register_pass",
    "run_passes",
]


def catalog() -> dict[str, list[dict[str, Any]]]:
    """Every pipeline (its stages of pass names) and every registered pass (its one-line
    description and the pipelines it runs in), pipelines' passes first, in their order: what
    `infercc passes` lists."""
    names = [n for p in PIPELINES.values() for n in p.passes if n in REGISTRY]
    names = list(dict.fromkeys([*names, *sorted(REGISTRY)]))
    return {
        "pipelines": [
            {"name": p.name, "stages": [list(s) for s in p.stages], "doc": p.doc}
            for p in PIPELINES.values()
        ],
        "passes": [
            {
                "name": n,
                "doc": REGISTRY[n].doc,
                "pipelines": pipelines_of(n),
                "final": REGISTRY[n].final,
                "once": REGISTRY[n].once,
            }
            for n in names
        ],
    }
