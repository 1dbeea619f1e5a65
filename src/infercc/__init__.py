"""infercc: an ahead-of-time graph compiler and optimizer for ONNX models.

import infercc
report = infercc.optimize("model.onnx", "model.opt.onnx")
print(report.nodes_before, report.nodes_after, report.validation.passed)
"""

from __future__ import annotations

from infercc.version import __version__

__all__ = [
    "__version__",
    "calibrate",
    "calibrate_int4",
    "extract",
    "generate",
    "inspect_model",
    "optimize",
    "validate",
]


def __getattr__(name: str):
    # Lazy, so `import infercc` stays cheap (onnxruntime loads only when needed).
    if name == "optimize":
        from infercc.api import optimize

        return optimize
    if name == "extract":
        from infercc.subgraph import extract

        return extract
    if name == "inspect_model":
        from infercc.analysis.model_info import inspect_model

        return inspect_model
    if name == "calibrate":
        from infercc.calib.calibrate import calibrate

        return calibrate
    if name == "calibrate_int4":
        from infercc.calib.weight_only import calibrate_int4

        return calibrate_int4
    if name == "generate":
        from infercc.runtime.generate import generate

        return generate
    if name == "validate":
        from infercc.check.validation import validate

        return validate
    raise AttributeError(name)
