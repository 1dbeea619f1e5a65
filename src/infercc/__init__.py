"""infercc: an ahead-of-time graph compiler and optimizer for ONNX models.

    import infercc
    report = infercc.optimize("model.onnx", "model.opt.onnx")
    print(report.nodes_before, report.nodes_after, report.validation.passed)
    check = infercc.validate("model.opt.onnx", "model.onnx", shapes={"image": "1x3x224x224"})

The Python API (each function loads its modules on first use, so `import infercc` is cheap):

- `optimize(model, output=None, config=None, **options)`: the `optimize` command.
- `validate(candidate, reference=None, **options)`: the `validate` command (same order).
- `calibrate(...)`, `calibrate_int4(...)`: the `calibrate` command (int8, int4 weights).
- `extract(model, output, inputs, outputs)`: the `extract` command (a subgraph by tensor names).
- `inspect_model(model)`: the `info` command's facts about a model.
- `generate(...)`: greedy generation with a decoder artifact.

`model`, `candidate` and `reference` are paths or in-memory `onnx.ModelProto`s; `shapes` maps
input names to tuples or `--shape` strings. Errors are `infercc.errors.InferccError`.
"""

from __future__ import annotations

import importlib
from typing import Any

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

# public name -> the module that defines it; no submodule may carry one of these names, or
# importing it would replace the function on the package (tests/test_api.py checks)
_LAZY = {
    "optimize": "infercc.api",
    "extract": "infercc.subgraph",
    "inspect_model": "infercc.analysis.model_info",
    "calibrate": "infercc.calib.calibrate",
    "calibrate_int4": "infercc.calib.weight_only",
    "generate": "infercc.runtime.generate",
    "validate": "infercc.validation",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `import infercc` stays cheap (onnxruntime loads only when needed).
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'infercc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
