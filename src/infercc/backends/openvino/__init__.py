"""The OpenVINO backend: the optimized model compiled by OpenVINO's CPU plugin.

What it builds. `--backend openvino` writes an artifact directory: `model.onnx` (the optimized
model, with no onnxruntime contrib ops: its passes run for a backend other than onnxruntime),
`openvino.blob` (`CompiledModel.export_model()`, tied to this host and OpenVINO version like a
TensorRT engine), `openvino_config.json` (schema `infercc.openvino_config/1`) and
`manifest.json`. The config records the OpenVINO version, the device (CPU), this host's CPU
row and OpenVINO's capabilities here, the precision asked for, the inference precision hint
given, and what ran: the precision of each compute layer (convolutions, matrix products) read
from the compiled model's runtime graph, never taken from the hint.

Precisions, as graph facts and hints:

- fp32: the hint f32, stated (on a CPU with bf16 OpenVINO's default is bf16);
- bf16 (`--bf16`, CPU rows with avx512_bf16 or amx_bf16): the hint bf16; the build fails when
  no compute layer ran bfloat16;
- int8 (`--int8` on a Q/DQ model, `infercc calibrate` writes one): the Q/DQ pairs become
  OpenVINO's int8 kernels; what is left runs f32, or bf16 where the target and this host have
  it: both are compiled, checked, timed interleaved, and the faster that validates is kept
  (the choice cached in the tuning cache per model, shape and host).

Each configuration is checked against onnxruntime on the same model before it is kept, with
the build precision's tolerance; the artifact itself is then validated against the original
model under onnxruntime fp32 at every shape profile (`infercc.api`). Loading reuses the blob
when this host and OpenVINO made it, else compiles `model.onnx` with the recorded properties;
either way the precision is read back, and a change from the recorded one is logged.

Facts about OpenVINO this rests on: `infercc.backends.openvino.engine`.
"""

from __future__ import annotations

from infercc.backends.openvino.backend import (
    BLOB_FILE,
    CONFIG_FILE,
    OpenVinoBackend,
    OpenVinoRunner,
    read_config,
)

__all__ = ["BLOB_FILE", "CONFIG_FILE", "OpenVinoBackend", "OpenVinoRunner", "read_config"]
