"""Build the example models shipped in examples/ (run once; the .onnx files are committed).

- `small_cnn.onnx`: Conv -> BatchNormalization -> Relu blocks with a residual Add, a Dropout and
  an Identity the exporter left behind, a Flatten and a Gemm head; symbolic batch dimension.
- `tiny_encoder.onnx`: one BERT-style self-attention layer as exporters write it (separate Q, K,
  V MatMul+Add projections, Reshape/Transpose to heads, Softmax, output projection, residual,
  LayerNormalization), with a shape computed at run time through Shape/Gather/Concat.
- `images/`: eight small synthetic RGB pictures (colour gradients, a disc, noise; 40x48 PNG),
  calibration samples for `infercc calibrate examples/small_cnn.onnx --data examples/images
  --preprocess imagenet` (needs Pillow).

    python examples/make_examples.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent
RNG = np.random.default_rng(2026)
# IR 8 (onnx 1.10+) holds opset 17 and loads in every onnxruntime infercc supports (the
# newest one on Python 3.10 reads IR <= 11).
IR_VERSION = 8


def const(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def conv_bn_relu(nodes, inits, x: str, cin: int, cout: int, name: str, relu: bool = True) -> str:
    w = (RNG.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
    inits += [
        const(f"{name}.w", w),
        const(f"{name}.b", RNG.standard_normal(cout).astype(np.float32) * 0.1),
        const(f"{name}.gamma", RNG.uniform(0.5, 1.5, cout).astype(np.float32)),
        const(f"{name}.beta", RNG.standard_normal(cout).astype(np.float32) * 0.1),
        const(f"{name}.mean", RNG.standard_normal(cout).astype(np.float32) * 0.1),
        const(f"{name}.var", RNG.uniform(0.5, 1.5, cout).astype(np.float32)),
    ]
    nodes.append(
        helper.make_node(
            "Conv",
            [x, f"{name}.w", f"{name}.b"],
            [f"{name}.conv"],
            pads=[1, 1, 1, 1],
            name=f"{name}/Conv",
        )
    )
    nodes.append(
        helper.make_node(
            "BatchNormalization",
            [f"{name}.conv", f"{name}.gamma", f"{name}.beta", f"{name}.mean", f"{name}.var"],
            [f"{name}.bn"],
            epsilon=1e-5,
            name=f"{name}/BatchNormalization",
        )
    )
    if not relu:
        return f"{name}.bn"
    nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.out"], name=f"{name}/Relu"))
    return f"{name}.out"


def small_cnn() -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    h = conv_bn_relu(nodes, inits, "image", 3, 16, "stem")
    nodes.append(helper.make_node("Identity", [h], ["stem.copy"], name="stem/Identity"))
    a = conv_bn_relu(nodes, inits, "stem.copy", 16, 16, "block1.a")
    b = conv_bn_relu(nodes, inits, a, 16, 16, "block1.b", relu=False)
    nodes.append(helper.make_node("Add", [b, "stem.copy"], ["block1.sum"], name="block1/Add"))
    nodes.append(helper.make_node("Relu", ["block1.sum"], ["block1.out"], name="block1/Relu"))
    nodes.append(helper.make_node("GlobalAveragePool", ["block1.out"], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1, name="flatten"))
    nodes.append(helper.make_node("Dropout", ["flat"], ["drop"], name="dropout"))
    inits += [
        const("head.w", RNG.standard_normal((10, 16)).astype(np.float32) * 0.25),
        const("head.b", np.zeros(10, np.float32)),
    ]
    nodes.append(
        helper.make_node(
            "Gemm", ["drop", "head.w", "head.b"], ["logits"], transB=1, name="head/Gemm"
        )
    )
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="infercc-examples",
        ir_version=IR_VERSION,
    )


def tiny_encoder(hidden: int = 64, heads: int = 4) -> onnx.ModelProto:
    d = hidden // heads
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    scale = float(1.0 / np.sqrt(hidden))

    def linear(x: str, name: str, n_out: int) -> str:
        inits.append(
            const(
                f"{name}.weight", (RNG.standard_normal((hidden, n_out)) * scale).astype(np.float32)
            )
        )
        inits.append(const(f"{name}.bias", RNG.standard_normal(n_out).astype(np.float32) * 0.02))
        nodes.append(
            helper.make_node("MatMul", [x, f"{name}.weight"], [f"{name}.mm"], name=f"{name}/MatMul")
        )
        nodes.append(
            helper.make_node(
                "Add", [f"{name}.mm", f"{name}.bias"], [f"{name}.out"], name=f"{name}/Add"
            )
        )
        return f"{name}.out"

    # the head shape [batch, seq, heads, d] computed at run time, as exporters do
    nodes += [
        helper.make_node("Shape", ["hidden_states"], ["shape"], name="Shape"),
        helper.make_node("Gather", ["shape", "idx0"], ["batch"], axis=0, name="Gather_batch"),
        helper.make_node("Gather", ["shape", "idx1"], ["seq"], axis=0, name="Gather_seq"),
        helper.make_node(
            "Concat", ["batch", "seq", "heads_d"], ["head_shape"], axis=0, name="Concat_heads"
        ),
        helper.make_node(
            "Concat", ["batch", "seq", "hidden_1"], ["merged_shape"], axis=0, name="Concat_merged"
        ),
    ]
    inits += [
        const("idx0", np.array([0], np.int64)),
        const("idx1", np.array([1], np.int64)),
        const("heads_d", np.array([heads, d], np.int64)),
        const("hidden_1", np.array([hidden], np.int64)),
    ]
    proj = {}
    for name in ("query", "key", "value"):
        out = linear("hidden_states", f"attention.{name}", hidden)
        nodes.append(
            helper.make_node(
                "Reshape", [out, "head_shape"], [f"{name}.heads"], name=f"{name}/Reshape"
            )
        )
        perm = [0, 2, 3, 1] if name == "key" else [0, 2, 1, 3]
        nodes.append(
            helper.make_node(
                "Transpose", [f"{name}.heads"], [f"{name}.t"], perm=perm, name=f"{name}/Transpose"
            )
        )
        proj[name] = f"{name}.t"
    inits.append(const("attn_scale", np.array(1.0 / np.sqrt(d), np.float32)))
    nodes += [
        helper.make_node("MatMul", [proj["query"], proj["key"]], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "attn_scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", proj["value"]], ["context"], name="context"),
        helper.make_node(
            "Transpose", ["context"], ["context.t"], perm=[0, 2, 1, 3], name="context/Transpose"
        ),
        helper.make_node(
            "Reshape", ["context.t", "merged_shape"], ["context.merged"], name="context/Reshape"
        ),
    ]
    out = linear("context.merged", "attention.output", hidden)
    inits += [
        const("ln.gamma", RNG.uniform(0.8, 1.2, hidden).astype(np.float32)),
        const("ln.beta", RNG.standard_normal(hidden).astype(np.float32) * 0.02),
    ]
    nodes += [
        helper.make_node("Add", [out, "hidden_states"], ["residual"], name="residual"),
        helper.make_node(
            "LayerNormalization",
            ["residual", "ln.gamma", "ln.beta"],
            ["output"],
            axis=-1,
            epsilon=1e-12,
            name="LayerNorm",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_encoder",
        [
            helper.make_tensor_value_info(
                "hidden_states", TensorProto.FLOAT, ["batch", "sequence", hidden]
            )
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        inits,
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="infercc-examples",
        ir_version=IR_VERSION,
    )


def images(count: int = 8, height: int = 40, width: int = 48) -> list[Path]:
    """Synthetic RGB pictures for the image-calibration example: a colour gradient, a disc
    and noise each, so the activations have the spread of real images."""
    from PIL import Image

    rng = np.random.default_rng(7)  # its own generator: the models' bytes do not depend on it
    out = HERE / "images"
    out.mkdir(exist_ok=True)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    paths = []
    for i in range(count):
        angle = rng.uniform(0, 2 * np.pi)
        ramp = (np.cos(angle) * x / width + np.sin(angle) * y / height + 1) / 2
        colour = rng.uniform(0, 255, 3)
        img = ramp[..., None] * colour + (1 - ramp[..., None]) * rng.uniform(0, 255, 3)
        cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(6, 16)
        img[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
        img += rng.normal(0, 12, img.shape)
        path = out / f"picture_{i}.png"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(path)
        paths.append(path)
    return paths


def main() -> None:
    for name, model in (("small_cnn", small_cnn()), ("tiny_encoder", tiny_encoder())):
        onnx.checker.check_model(model, full_check=True)
        path = HERE / f"{name}.onnx"
        onnx.save(model, path)
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(model.graph.node)} nodes)")
    paths = images()
    print(f"wrote {len(paths)} images in {HERE / 'images'}")


if __name__ == "__main__":
    main()
