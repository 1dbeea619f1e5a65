"""The onnx-shipped model zoo subset (`light_*`), with random weights for numerical checks.

The shipped files build every weight with ConstantOfShape(0.02), so every output is a uniform
0.001 and a comparison proves little. `randomize()` replaces each ConstantOfShape weight by
random values of the same shape (fixed seed, He-scaled for Conv/Gemm weights), then sets every
BatchNormalization's mean and variance from the activations a random input actually produces
(one onnxruntime run of a copy that normalizes with batch statistics), so nothing explodes or
vanishes. It also exposes the logits (the final Softmax's input) as a second output.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SMALL = ["resnet50", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet"]
LARGE = ["bvlc_alexnet", "vgg19", "zfnet512"]  # 244-575 MB of weights once randomized
# Node counts onnxslim 0.1.98 reaches on the shipped files (measured on this kind of machine).
ONNXSLIM_NODES = {"resnet50": 123, "densenet121": 491, "inception_v2": 154, "shufflenet": 154}
# BatchNormalization nodes that follow a Conv (densenet121's other 62 follow Concat or pooling).
BN_AFTER_CONV = {"resnet50": 53, "inception_v2": 69, "shufflenet": 49, "densenet121": 59}


def light_path(name: str) -> Path:
    return LIGHT / f"light_{name}.onnx"


def data_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    inits = {t.name for t in model.graph.initializer}
    return next(i for i in model.graph.input if i.name not in inits)


def image(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    vi = data_input(model)
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return {vi.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _weight(shape: tuple[int, ...], role: str, rng: np.random.Generator) -> np.ndarray:
    if role == "weight" and len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    if role == "bn_scale":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role == "bn_var":
        return np.ones(shape, np.float32)
    if role == "bn_mean":
        return np.zeros(shape, np.float32)
    return (rng.standard_normal(shape) * 0.1).astype(np.float32)


def _roles(graph: onnx.GraphProto) -> dict[str, str]:
    roles: dict[str, str] = {}
    for n in graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1:
            roles[n.input[1]] = "weight"
        if (
            n.op_type == "Gemm"
            and n.input[1] in roles
            and any(a.name == "transB" and a.i == 0 for a in n.attribute)
        ):
            roles[n.input[1]] = "weight_t"
        if n.op_type == "BatchNormalization":
            for name, role in zip(
                n.input[1:], ("bn_scale", "bias", "bn_mean", "bn_var"), strict=False
            ):
                roles[name] = role
    return roles


def randomize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy with random weights and BatchNorm statistics calibrated on a random image."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    roles = _roles(g)
    keep = []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in shapes:
            keep.append(n)
            continue
        shape = tuple(int(s) for s in shapes[n.input[0]])
        role = roles.get(n.output[0], "bias")
        if role == "weight_t":  # Gemm with transB=0: [K, N], fan-in is K
            arr = (rng.standard_normal(shape) * np.sqrt(2.0 / shape[0])).astype(np.float32)
        else:
            arr = _weight(shape, role, rng)
        g.initializer.append(numpy_helper.from_array(arr, n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    used = {x for n in g.node for x in n.input}
    live = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(live)
    del g.input[:]
    g.input.append(data_input(model))
    out.ir_version = max(out.ir_version, 4)
    _expose_logits(out)
    _calibrate_batchnorm(out)
    onnx.checker.check_model(out, full_check=True)
    return out


def _expose_logits(model: onnx.ModelProto) -> None:
    g = model.graph
    softmax = [
        n for n in g.node if n.op_type == "Softmax" and n.output[0] in {o.name for o in g.output}
    ]
    if softmax:
        inferred = onnx.shape_inference.infer_shapes(model)
        logits = softmax[0].input[0]
        g.output.append(next(vi for vi in inferred.graph.value_info if vi.name == logits))


def _calibrate_batchnorm(model: onnx.ModelProto) -> None:
    """Set BN mean/var to the batch statistics of a random image, all layers in one run."""
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    if not bns:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    nodes = []
    stats = []
    for n in g.node:
        if n.op_type != "BatchNormalization":
            nodes.append(n)
            continue
        x, scale, bias = n.input[0], n.input[1], n.input[2]
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        p = n.output[0] + "__probe"
        nodes += [
            helper.make_node("ReduceMean", [x], [p + "m"], axes=[0, 2, 3], keepdims=1),
            helper.make_node("Sub", [x, p + "m"], [p + "c"]),
            helper.make_node("Mul", [p + "c", p + "c"], [p + "sq"]),
            helper.make_node("ReduceMean", [p + "sq"], [p + "v"], axes=[0, 2, 3], keepdims=1),
            helper.make_node("Add", [p + "v", p + "eps"], [p + "ve"]),
            helper.make_node("Sqrt", [p + "ve"], [p + "sd"]),
            helper.make_node("Div", [p + "c", p + "sd"], [p + "n"]),
            helper.make_node("Unsqueeze", [scale], [p + "s"], axes=[1, 2]),
            helper.make_node("Unsqueeze", [bias], [p + "b"], axes=[1, 2]),
            helper.make_node("Mul", [p + "n", p + "s"], [p + "ns"]),
            helper.make_node("Add", [p + "ns", p + "b"], [n.output[0]]),
        ]
        g.initializer.append(numpy_helper.from_array(np.array(eps, np.float32), p + "eps"))
        stats.append((n, p + "m", p + "v"))
    del g.node[:]
    g.node.extend(nodes)
    for _, m, v in stats:
        g.output.extend(
            [helper.make_tensor_value_info(m, 1, None), helper.make_tensor_value_info(v, 1, None)]
        )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [m for _, m, _ in stats] + [v for _, _, v in stats]
    values = dict(zip(names, sess.run(names, image(model)), strict=True))
    inits = {t.name: t for t in model.graph.initializer}
    for n, m, v in stats:
        for name, arr in ((n.input[3], values[m]), (n.input[4], values[v])):
            inits[name].CopyFrom(numpy_helper.from_array(arr.reshape(-1).astype(np.float32), name))


def save(model: onnx.ModelProto, path: os.PathLike[str]) -> Path:
    onnx.save(model, path)
    return Path(path)


def with_large_logits(model: onnx.ModelProto, target: float = 3000.0) -> onnx.ModelProto:
    """`model` (randomized) with its last Conv/Gemm/MatMul weight and bias scaled so the logits'
    largest magnitude on `image(model)` is `target`: the ~3,000 a zoo CNN with re-drawn weights
    reaches, where fp32 rounding of a Conv+BN fold moves small logits past a fixed rtol."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = sess.run(None, image(out))[-1]
    factor = np.float32(target / float(np.abs(logits).max()))
    last = [n for n in out.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")][-1]
    inits = {t.name: t for t in out.graph.initializer}
    for name in last.input[1:]:
        scaled = numpy_helper.to_array(inits[name]) * factor
        inits[name].CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), name))
    return out
