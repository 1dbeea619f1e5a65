"""A QDQ MatMul built to saturate int16 pair sums: every activation quantizes to 255 and every
pair of weights has one sign, so u8 x s8 pairs reach 2 x 255 x 127 = 64,770 with 8-bit weights
(over 2**15) and 2 x 255 x 64 = 32,640 with 7-bit ones (under it).

`steps_off(bits)` runs it under onnxruntime fused (the int8 kernel) and unfused (the Q/DQ graph
in float) and gives the largest difference of their uint8 outputs. Run as a script (`python
tests/calib/saturation.py 8`) it prints that figure, so that it can run under an emulated CPU
(`qemu-x86_64 -cpu EPYC-Milan`, an AVX2 CPU without VNNI) as well as on this one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

if __name__ == "__main__":  # run as a script: the repository root, for tests.helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers import make_model  # noqa: E402

K, N, M = 64, 32, 16
X = 10.0  # every activation; its scale makes it 255


def model(bits: int) -> onnx.ModelProto:
    qmax = 127 if bits == 8 else 64
    w = np.abs(np.random.default_rng(0).standard_normal((K, N))).astype(np.float32)
    scale = (w.max(axis=0) / qmax).astype(np.float32)
    q = np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)
    inits = {
        "xs": np.array(X / 255, np.float32),
        "xz": np.array(0, np.uint8),
        "wq": q,
        "ws": scale,
        "wz": np.zeros(N, np.int8),
        "ys": np.array(20.0, np.float32),  # outputs (about 512) stay inside uint8's range
        "yz": np.array(0, np.uint8),
    }
    nodes = [
        oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        oh.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=1),
        oh.make_node("MatMul", ["xd", "wd"], ["y"]),
        oh.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
    ]
    graph = oh.make_graph(
        nodes,
        "saturation",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [oh.make_tensor_value_info("yq", TensorProto.UINT8, [M, N])],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    return make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def steps_off(bits: int) -> int:
    data = model(bits).SerializeToString()
    x = np.full((M, K), X, np.float32)
    outs = []
    for level in (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    ):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        outs.append(sess.run(None, {"x": x})[0].astype(np.int64))
    return int(np.abs(outs[0] - outs[1]).max())


if __name__ == "__main__":
    print(steps_off(int(sys.argv[1])))
