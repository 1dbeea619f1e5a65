"""Models with residual and branching structure, built with onnx.helper (random weights, fixed
seed), for the memory scheduler's tests and `bench/schedule_candidates.py`.

- `resnet_tower`: a stem, then residual blocks (two 3x3 convs, the shortcut added back), every
  other block downsampling with a strided 1x1 conv on the shortcut.
- `inception`: blocks of four branches of different sizes (a 1x1 conv; a 1x1 reduce then a 3x3;
  a wide 1x1 expansion then a 3x3 back down; a max pool then a 1x1), concatenated.
- `unet`: an encoder of three levels, a bottleneck, and a decoder that concatenates each
  upsampled level with the encoder's output of the same size (the long skips).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import make_model


class _Builder:
    def __init__(self, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
        w = self.name("w")
        scale = np.sqrt(2.0 / (cin * k * k))
        arr = (self.rng.standard_normal((cout, cin, k, k)) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(arr, w))
        pad = k // 2
        return self.node("Conv", [x, w], pads=[pad] * 4, strides=[stride] * 2)

    def model(self, name: str, x_shape: list[int], y: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
            self.inits,
        )
        model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return onnx.shape_inference.infer_shapes(model)


def resnet_tower(blocks: int = 4, channels: int = 8, size: int = 32) -> onnx.ModelProto:
    b = _Builder(1)
    x = b.node("Relu", [b.conv("x", 3, channels)])
    c = channels
    for i in range(blocks):
        down = i % 2 == 1
        cout = 2 * c if down else c
        h = b.node("Relu", [b.conv(x, c, cout, 3, 2 if down else 1)])
        h = b.conv(h, cout, cout)
        short = b.conv(x, c, cout, 1, 2) if down else x
        x = b.node("Relu", [b.node("Add", [h, short])])
        c = cout
    return b.model("resnet_tower", [1, 3, size, size], x)


def inception(blocks: int = 2, channels: int = 16, size: int = 16) -> onnx.ModelProto:
    b = _Builder(2)
    x = b.node("Relu", [b.conv("x", 3, channels)])
    c = channels
    for _ in range(blocks):
        b1 = b.node("Relu", [b.conv(x, c, c // 2, 1)])
        b2 = b.node("Relu", [b.conv(b.node("Relu", [b.conv(x, c, c // 4, 1)]), c // 4, c // 2)])
        wide = b.node("Relu", [b.conv(x, c, 8 * c, 1)])
        b3 = b.node("Relu", [b.conv(wide, 8 * c, c // 2)])
        pooled = b.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        b4 = b.node("Relu", [b.conv(pooled, c, c // 2, 1)])
        x = b.node("Concat", [b1, b2, b3, b4], axis=1)
        c = 2 * c
    return b.model("inception", [1, 3, size, size], x)


def unet(levels: int = 3, channels: int = 8, size: int = 32) -> onnx.ModelProto:
    b = _Builder(3)
    x, c, skips = "x", 3, []
    for i in range(levels):
        cout = channels * 2**i
        x = b.node("Relu", [b.conv(b.node("Relu", [b.conv(x, c, cout)]), cout, cout)])
        skips.append((x, cout))
        x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        c = cout
    x = b.node("Relu", [b.conv(x, c, 2 * c)])
    c = 2 * c
    scales = b.name("scales")
    b.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), scales))
    for skip, cs in reversed(skips):
        up = b.node("Resize", [x, "", scales], mode="nearest")
        x = b.node("Concat", [up, skip], axis=1)
        x = b.node("Relu", [b.conv(x, c + cs, cs)])
        c = cs
    return b.model("unet", [1, 3, size, size], x)
