"""infercc: an ahead-of-time graph compiler and optimizer for ONNX models.

    import infercc
    report = infercc.optimize("model.onnx", "model.opt.onnx")
    print(report.nodes_before, report.nodes_after, report.validation.passed)
    check = infercc.validate("model.opt.onnx", "model.onnx", shapes={"image": "1x3x224x224"})
    model, report = infercc.optimize(onnx.load("model.onnx"))  # no output: back in memory

The Python API (each function loads its modules on first use, so `import infercc` is cheap):

- `optimize(model, output=None, config=None, **options)`: the `optimize` command (without
  `output`: the optimized model and its report, `(model, report)`, nothing written).
- `validate(candidate, reference=None, **options)`: the `validate` command (same order).
- `calibrate(...)`, `calibrate_int4(...)`: the `calibrate` command (int8, int4 weights).
- `extract(model, output, inputs, outputs)`: the `extract` command (a subgraph by tensor names).
- `inspect_model(model)`: the `info` command's facts about a model.
- `generate(...)`: greedy generation with a decoder artifact.

`model`, `candidate` and `reference` are paths or in-memory `onnx.ModelProto`s; `shapes` maps
input names to tuples or `--shape` strings; `data` is a path as `--data` takes, or samples in
memory (`{input name: array}` dicts, arrays, or a list or generator of them). Errors are
`infercc.errors.InferccError`.
"""

from importlib import import_module as _import_module

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


def __getattr__(name: str) -> object:
    # Lazy, so `import infercc` stays cheap (onnxruntime loads only when needed).
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'infercc' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    """The API (`__all__`), not the module's machinery nor the submodules imports bind."""
    return sorted(__all__)
