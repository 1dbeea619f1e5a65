"""The ONNX Runtime backend: per-shape autotuning of session settings, cached on disk.

What it tunes. An onnxruntime session is a model plus a configuration:

```
{"provider": "CPUExecutionProvider", "provider_options": {...},
 "session_options": {"graph_optimization_level", "intra_op_num_threads",
                     "inter_op_num_threads", "execution_mode"},
 "disabled_optimizers": [...]}
```

`compile` picks one configuration per shape point. With no ranged profile there is one point,
`opt`; a ranged profile (`NAME=MIN:OPT:MAX`) gives up to three, `min`, `opt` and `max`, point k
taking every input's k-th shape (a fixed profile gives the same shape at every point; inputs
without a profile take `data.signature.resolve_shapes` defaults, sharing symbols with the pinned
ones). Points with equal shapes are tuned once.

How. Coordinate descent, one pass: start from onnxruntime's defaults (ORT_ENABLE_ALL,
intra-op and inter-op threads 0 = onnxruntime decides, sequential), then sweep one knob at a
time, keeping the fastest configuration that validates before moving to the next knob:

1. provider: the target's providers onnxruntime has (`get_available_providers()`): the CPU
   provider for the `cpu` target; TensorRT and CUDA for GPU targets, in onnxruntime's order;
2. CUDA only: `cudnn_conv_algo_search` EXHAUSTIVE (the default) / HEURISTIC / DEFAULT;
3. CUDA only: TunableOp off / on (`tunable_op_enable`, `tunable_op_tuning_enable`); the kernel
   choices it makes (`session.get_tuning_results()`) are stored with the choice and handed back
   with `set_tuning_results` at load time;
4. graph optimization level: ORT_ENABLE_BASIC / EXTENDED / ALL;
5. CPU only: onnxruntime fusions turned off (`InferenceSession(disabled_optimizers=...)`):
   none, or `SkipLayerNormFusion` (onnxruntime 1.32's CPU SkipLayerNormalization kernel is
   slower than the Add + Add + LayerNormalization it replaces, and the session optimizer
   makes it by itself); recorded as the point's `disabled_optimizers` and passed again when
   the artifact is loaded;
6. intra-op threads: 1, half the cores, all cores, 0 (deduplicated);
7. execution mode: sequential, or parallel with one inter-op thread per core (only with more
   than one core: parallel changes nothing with a single inter-op thread).

A pass times 1 + sum over knobs of (values - 1) configurations instead of the product: on the
CPU 1 + 2 + 1 + 3 + 1 = 8 (7 on two cores, where half the cores is one thread) against
3 x 2 x 4 x 2 = 48; with CUDA 1 + 2 + 1 + 2 + 3 + 1 = 10 against 144. `candidate_count`
computes it.

Timing: `options.warmup` untimed runs, then `options.iters` timed runs (`time.perf_counter`);
a configuration's figure is the median, in milliseconds. Validation: the last timed run's
outputs are compared with those of the reference configuration (CPU provider,
ORT_DISABLE_ALL) on the same random feeds, with `infercc.check.compare`'s rule and the
graph precision's tolerance from `infercc.precisions.TOLERANCES` (atol 1e-4 / rtol 1e-3 /
cosine 0.9999 for fp32 graphs; cosine 0.999 for fp16 and bf16, 0.99 for int8, whose fused
integer kernels may round a step apart from Q/DQ emulation; the user's atol, rtol and
min_cosine replace them). A configuration that
fails to load, to run or to validate is skipped and recorded with the reason.

The choice for a point is cached (`infercc.runtime.tuning.TuningCache`) under the model's hash, the
point's shapes, the onnxruntime version, the providers considered and the host fingerprint; a
hit reuses it without creating or timing any session (only saving the optimized model below
creates one). With `cache=None` every point is tuned. `options.tune=False` times nothing: a
point not in the cache takes onnxruntime's defaults (its `cache` field says "untuned").

Precision is a graph property: this backend runs what the graph says. The CPU provider runs
fp32, fp16 and int8 (Q/DQ) graphs, and bf16 ones where the CPU target lists bf16 (that is,
the CPU has bf16 instructions). On GPU targets the precisions are the target's, and only with
onnxruntime-gpu's CUDA provider present.

Files: `ort_config.json` (schema `infercc.ort_config/1`: per point its shapes, the chosen
configuration, median_ms, cache hit/miss and every candidate measured) and, when
`options.ort.optimized_model` is True (`--ort-optimized-model`) and the model's external
data is under 2 GB, `ort_optimized.onnx`: onnxruntime's own optimized graph for the default
point's provider and level (`SessionOptions.optimized_model_filepath`). Such a file is tied
to the machine and provider, so `load` uses it, with optimization off, only when the host
fingerprint and the onnxruntime version match those it was written with; otherwise it loads
`model.onnx`.
"""

from __future__ import annotations

from infercc.backends.ort.backend import OrtBackend, gpu_providers, gpu_reason
from infercc.backends.ort.config import (
    CONFIG_FILE,
    CPU,
    CUDA,
    OPTIMIZED_FILE,
    TENSORRT,
    default_config,
    session_options,
)
from infercc.backends.ort.runner import OrtRunner, default_runner, read_config

__all__ = [
    "CONFIG_FILE",
    "CPU",
    "CUDA",
    "OPTIMIZED_FILE",
    "TENSORRT",
    "OrtBackend",
    "OrtRunner",
    "default_config",
    "default_runner",
    "gpu_providers",
    "gpu_reason",
    "read_config",
    "session_options",
]
