"""`--fp16` on the default cpu target gives a float16 CNN: the Conv/activation fusion (whose
FusedConv runs float32 only) waits for the precision decision instead of pinning every Conv
to float32."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import infercc
from tests.helpers import make_model


def resnet_like(blocks: int = 6, width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """A ResNet-style CNN: a Conv-BN-Relu stem, `blocks` basic residual blocks (Conv-BN-Relu,
    Conv-BN, Add, Relu), global average pooling and a Gemm head; symbolic batch."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def conv_bn(x: str, name: str, cin: int, cout: int, relu: bool) -> str:
        w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * (2 / (9 * cin)) ** 0.5
        inits.append(numpy_helper.from_array(w, f"{name}_w"))
        for p, v in (
            ("g", rng.uniform(0.5, 1.5, cout)),
            ("b", rng.normal(0, 0.1, cout)),
            ("m", rng.normal(0, 0.1, cout)),
            ("v", rng.uniform(0.5, 1.5, cout)),
        ):
            inits.append(numpy_helper.from_array(v.astype(np.float32), f"{name}_{p}"))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], pads=[1] * 4))
        bn_in = [f"{name}_c", f"{name}_g", f"{name}_b", f"{name}_m", f"{name}_v"]
        nodes.append(helper.make_node("BatchNormalization", bn_in, [f"{name}_n"]))
        if not relu:
            return f"{name}_n"
        nodes.append(helper.make_node("Relu", [f"{name}_n"], [f"{name}_r"]))
        return f"{name}_r"

    h = conv_bn("image", "stem", 3, width, relu=True)
    for i in range(blocks):
        a = conv_bn(h, f"b{i}a", width, width, relu=True)
        b = conv_bn(a, f"b{i}b", width, width, relu=False)
        nodes.append(helper.make_node("Add", [b, h], [f"b{i}_sum"]))
        nodes.append(helper.make_node("Relu", [f"b{i}_sum"], [f"b{i}_out"]))
        h = f"b{i}_out"
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"]))
    fc = rng.standard_normal((10, width)).astype(np.float32) * 0.1
    inits += [
        numpy_helper.from_array(fc, "fc_w"),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
    ]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes,
        "resnet_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _build(tmp_path, name: str, **options):
    src = tmp_path / "resnet_like.onnx"
    if not src.exists():
        onnx.save(resnet_like(), src)
    out = tmp_path / f"{name}.onnx"
    report = infercc.optimize(src, out, shapes={"image": "2x3x16x16"}, **options)
    model = onnx.load(out)
    conv_inputs = [n.input[1] for n in model.graph.node if n.op_type in ("Conv", "FusedConv")]
    types = {t.name: t.data_type for t in model.graph.initializer}
    return report, model, Counter(types[w] for w in conv_inputs)


def test_fp16_on_the_cpu_target_converts_every_conv(tmp_path):
    fp32, m32, _ = _build(tmp_path, "fp32")
    assert m32.graph.node and Counter(n.op_type for n in m32.graph.node)["FusedConv"] == 7
    report, model, conv_weights = _build(tmp_path, "fp16", fp16=True)
    portable, _, _ = _build(tmp_path, "portable", fp16=True, portable=True)
    ops = Counter(n.op_type for n in model.graph.node)
    assert report.validation is not None and report.validation.passed
    assert conv_weights == {TensorProto.FLOAT16: 13}  # all 13 Convs in float16
    assert ops["FusedConv"] == 0 and ops["Conv"] == 13
    assert ops["Cast"] == 2  # the image in, the logits out: nothing in between
    assert not report.kept_fp32
    # as small as the portable fp16 build, about half the fp32 one
    assert report.size_after <= portable.size_after * 1.01
    assert report.size_after < 0.55 * fp32.size_after


@pytest.mark.slow
def test_fp16_resnet50_on_the_cpu_target_is_half_the_size(tmp_path):
    # onnx's light ResNet-50 with seeded weights: 97.7 MiB; before the reordering --fp16 kept
    # 33 FusedConv in float32 with 34 Casts (78.6 MiB), now 48.7 MiB as with --portable.
    from tests.passes.test_fuse_conv_bn_relu import _light_model

    src = tmp_path / "r50.onnx"
    onnx.save(_light_model("light_resnet50"), src)
    report = infercc.optimize(src, tmp_path / "r50.fp16.onnx", fp16=True)
    ops = Counter(n.op_type for n in onnx.load(tmp_path / "r50.fp16.onnx").graph.node)
    assert report.validation is not None and report.validation.passed
    assert ops["FusedConv"] == 0 and ops["Conv"] == 53 and ops["Cast"] == 2
    assert report.size_after < 0.51 * report.size_before
