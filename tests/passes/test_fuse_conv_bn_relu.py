"""fuse-conv-bn-relu: BN / per-channel Mul, Add folding; fuse-conv-activation: onnxruntime
FusedConv."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.passes import DEFAULT_PIPELINE, REGISTRY, PassContext
from tests.helpers import (
    assert_same_outputs,
    make_model,
    op_counts,
    optimize_proto,
    parse,
    random_feeds,
)

PASSES = ["fuse-conv-bn-relu", "fuse-conv-activation", "eliminate-dead-code"]
F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, list[int]]],
    outputs: list[str],
    inits: dict[str, np.ndarray],
    opset: int = 17,
) -> onnx.ModelProto:
    """A checked model; output types come from onnx shape inference."""
    vis = [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()]
    tensors = [numpy_helper.from_array(a, n) for n, a in inits.items()]
    g = helper.make_graph(nodes, "g", vis, [], tensors)
    m = make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(m)
    known = {vi.name: vi for vi in inferred.graph.value_info}
    m.graph.output.extend(known[o] for o in outputs)
    del m.graph.value_info[:]
    onnx.checker.check_model(m, full_check=True)
    return m


def _bn_params(prefix: str, m: int, seed: int = 1, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = _rng(seed)
    return {
        f"{prefix}_s": rng.uniform(0.5, 1.5, m).astype(dtype),
        f"{prefix}_b": rng.normal(0, 0.3, m).astype(dtype),
        f"{prefix}_m": rng.normal(0, 0.3, m).astype(dtype),
        f"{prefix}_v": rng.uniform(0.5, 1.5, m).astype(dtype),
    }


def _bn(x: str, y: str, prefix: str, **attrs) -> onnx.NodeProto:
    ins = [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"]
    return helper.make_node("BatchNormalization", ins, [y], epsilon=1e-3, **attrs)


def _conv_bn(
    op: str = "Conv",
    spatial: int = 2,
    c: int = 4,
    m: int = 6,
    group: int = 1,
    bias: bool = True,
    dtype=np.float32,
    **attrs,
) -> onnx.ModelProto:
    rng = _rng()
    k = (3,) * spatial
    wshape = (m, c // group, *k) if op == "Conv" else (c, m // group, *k)
    inits = {"W": rng.normal(0, 0.3, wshape).astype(dtype), **_bn_params("bn", m, dtype=dtype)}
    ins = ["X", "W"]
    if bias:
        inits["B"] = rng.normal(0, 0.3, m).astype(dtype)
        ins.append("B")
    conv = helper.make_node(op, ins, ["y"], group=group, **attrs)
    elem = F16 if dtype == np.float16 else F32
    return _model(
        [conv, _bn("y", "Z", "bn")], {"X": (elem, [2, c, *((7,) * spatial)])}, ["Z"], inits
    )


def _fold(proto: onnx.ModelProto, ctx: PassContext | None = None, passes=PASSES):
    out, report = optimize_proto(proto, passes=passes, ctx=ctx)
    counts = dict(report.passes["fuse-conv-bn-relu"].counts)
    if "fuse-conv-activation" in report.passes:
        counts.update(report.passes["fuse-conv-activation"].counts)
    return out, counts, report


# -- BatchNormalization into Conv / ConvTranspose -----------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"bias": False},
        {"group": 2, "c": 4, "m": 6},
        {"group": 4, "c": 4, "m": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"spatial": 1},
        {"spatial": 3, "bias": False},
    ],
    ids=["bias", "no-bias", "group2", "depthwise", "conv1d", "conv3d"],
)
def test_bn_folds_into_conv(kwargs):
    proto = _conv_bn(**kwargs)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1
    assert op_counts(out) == {"Conv": 1}
    assert len(out.graph.node[0].input) == 3  # a missing bias became one
    assert [o.name for o in out.graph.output] == ["Z"]
    assert_same_outputs(proto, out, atol=1e-4)


@pytest.mark.parametrize("group,bias", [(1, True), (2, False), (2, True)])
def test_bn_folds_into_conv_transpose(group, bias):
    # C=4, M=6: weight [4, 3, 3, 3]; a layout bug (axis 0, or ignoring groups) mismatches.
    proto = _conv_bn("ConvTranspose", c=4, m=6, group=group, bias=bias, strides=[2, 2])
    out, counts, _ = _fold(proto)
    assert counts["bn_into_convtranspose"] == 1
    assert op_counts(out) == {"ConvTranspose": 1}
    assert_same_outputs(proto, out, atol=1e-4)


def test_fp16_conv_bn_folds_and_keeps_dtype():
    proto = _conv_bn(dtype=np.float16)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1 and op_counts(out) == {"Conv": 1}
    assert {t.data_type for t in out.graph.initializer} == {F16}
    assert_same_outputs(proto, out, atol=2e-2, rtol=2e-2)


def test_shared_weight_two_convs_each_folds():
    rng = _rng(3)
    inits = {
        "W": rng.normal(0, 0.3, (5, 3, 3, 3)).astype(np.float32),
        **_bn_params("p", 5, seed=4),
        **_bn_params("q", 5, seed=5),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["a"]),
        _bn("a", "A", "p"),
        helper.make_node("Conv", ["X", "W"], ["b"], pads=[1, 1, 1, 1]),
        _bn("b", "B", "q"),
    ]
    proto = _model(nodes, {"X": (F32, [1, 3, 6, 6])}, ["A", "B"], inits)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 2
    assert op_counts(out) == {"Conv": 2}
    w0, w1 = (n.input[1] for n in out.graph.node)
    assert w0 != w1  # each conv got its own weight; the shared one was never rewritten
    assert_same_outputs(proto, out, atol=1e-4)


def test_conv_output_with_second_reader_refuses():
    proto = _conv_bn()
    proto.graph.output.extend([helper.make_tensor_value_info("y", F32, [2, 6, 5, 5])])
    out, counts, report = _fold(proto)
    assert counts["bn_into_conv"] == 0
    assert op_counts(out)["BatchNormalization"] == 1
    assert any(r.reason == "conv output has other readers" for r in report.refusals)
    assert_same_outputs(proto, out)


def test_training_mode_bn_refuses():
    proto = _conv_bn()
    proto.graph.node[1].attribute.append(helper.make_attribute("training_mode", 1))
    proto.graph.node[1].output.extend(["running_mean", "running_var"])
    out, counts, report = _fold(proto)
    assert counts["bn_into_conv"] == 0 and op_counts(out)["BatchNormalization"] == 1
    assert [r.reason for r in report.refusals] == ["BatchNormalization is in training mode"]


def test_non_constant_bn_params_refuse():
    proto = _conv_bn()
    scale = next(t for t in proto.graph.initializer if t.name == "bn_s")
    proto.graph.initializer.remove(scale)
    proto.graph.input.append(helper.make_tensor_value_info("bn_s", F32, [6]))
    out, counts, report = _fold(proto)
    assert counts["bn_into_conv"] == 0 and op_counts(out)["BatchNormalization"] == 1
    assert any(
        r.reason == "BatchNormalization parameters are not constant" for r in report.refusals
    )


def test_bn_params_from_constant_nodes_fold():
    proto = _conv_bn()
    consts = []
    for t in list(proto.graph.initializer):
        if t.name.startswith("bn_"):
            proto.graph.initializer.remove(t)
            consts.append(helper.make_node("Constant", [], [t.name], value=t))
    nodes = consts + list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1 and op_counts(out) == {"Conv": 1}
    assert_same_outputs(proto, out, atol=1e-4)


def test_bn_in_subgraph_folds_but_never_across_scopes():
    v = "{0.5, 1.0, 1.5, 0.8}"
    proto = parse(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (bool cond, float[1, 3, 5, 5] X) => (float[1, 4, 3, 3] Y)
        <float[4, 3, 3, 3] W = {_floats(108)}, float[4] s = {v}, float[4] b = {_floats(4, 2)},
         float[4] m = {_floats(4, 3)}, float[4] v = {v}>
        {{
            y = Conv (X, W)
            Y = If (cond) <
                then_branch = g1 () => (float[1, 4, 3, 3] t) {{
                    c = Conv (X, W)
                    t = BatchNormalization (c, s, b, m, v)
                }},
                else_branch = g2 () => (float[1, 4, 3, 3] e) {{
                    e = BatchNormalization (y, s, b, m, v)
                }}
            >
        }}
    """)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1  # inside then_branch; y's Conv is in the outer graph
    branches = {a.name: a.g for a in out.graph.node[-1].attribute}
    assert op_counts(onnx.ModelProto(graph=branches["then_branch"])) == {"Conv": 1}
    assert op_counts(onnx.ModelProto(graph=branches["else_branch"])) == {"BatchNormalization": 1}
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "X": _rng(5).standard_normal((1, 3, 5, 5), np.float32)}
        assert_same_outputs(proto, out, feeds, atol=1e-4)


# -- BatchNormalization into Gemm / MatMul ------------------------------------------------------


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (6,), (1, 6), (4, 1)])
def test_bn_folds_into_gemm(trans_b, c_shape):
    rng = _rng(7)
    inits = {"B": rng.normal(0, 0.5, (6, 5) if trans_b else (5, 6)).astype(np.float32)}
    ins = ["X", "B"]
    if c_shape is not None:
        inits["C"] = rng.normal(0, 0.5, c_shape).astype(np.float32)
        ins.append("C")
    inits.update(_bn_params("bn", 6))
    gemm = helper.make_node("Gemm", ins, ["y"], transB=trans_b, alpha=0.7, beta=1.3)
    proto = _model([gemm, _bn("y", "Z", "bn")], {"X": (F32, [4, 5])}, ["Z"], inits)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_gemm"] == 1 and op_counts(out) == {"Gemm": 1}
    assert_same_outputs(proto, out, atol=1e-4)


@pytest.mark.parametrize("with_add", [True, False])
def test_bn_folds_into_matmul(with_add):
    rng = _rng(8)
    inits = {"W": rng.normal(0, 0.5, (5, 6)).astype(np.float32), **_bn_params("bn", 6)}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["y"])]
    if with_add:
        inits["b"] = rng.normal(0, 0.5, (6,)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["b", "y"], ["y2"]))
    nodes.append(_bn(nodes[-1].output[0], "Z", "bn"))
    proto = _model(nodes, {"X": (F32, [4, 5])}, ["Z"], inits)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_matmul"] == 1
    assert op_counts(out) == {"MatMul": 1, "Add": 1}
    assert_same_outputs(proto, out, atol=1e-4)


def test_bn_after_3d_matmul_refuses():
    # BN's channel axis is 1 (the sequence axis here), not the MatMul's output columns.
    rng = _rng(9)
    inits = {"W": rng.normal(0, 0.5, (5, 3)).astype(np.float32), **_bn_params("bn", 3)}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["y"]), _bn("y", "Z", "bn")]
    proto = _model(nodes, {"X": (F32, [2, 3, 5])}, ["Z"], inits)
    out, counts, report = _fold(proto)
    assert counts["bn_into_matmul"] == 0 and op_counts(out)["BatchNormalization"] == 1
    assert report.refusals and "not 2-D" in report.refusals[0].reason


# -- per-channel Mul / Add ----------------------------------------------------------------------


def _conv_then(ops: list[tuple[str, np.ndarray]], bn: bool = False) -> onnx.ModelProto:
    rng = _rng(11)
    inits = {"W": rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["X", "W"], ["t0"])]
    if bn:
        inits.update(_bn_params("bn", 6))
        nodes.append(_bn("t0", "t1", "bn"))
    for i, (op, c) in enumerate(ops):
        inits[f"c{i}"] = c.astype(np.float32)
        prev = nodes[-1].output[0]
        nodes.append(helper.make_node(op, [prev, f"c{i}"], [f"t{len(nodes)}"]))
    return _model(nodes, {"X": (F32, [2, 3, 8, 8])}, [nodes[-1].output[0]], inits)


@pytest.mark.parametrize(
    "mul_shape,add_shape", [((6, 1, 1), (1, 6, 1, 1)), ((), (6, 1, 1)), ((1, 6, 1, 1), (1,))]
)
def test_conv_mul_add_fold(mul_shape, add_shape):
    rng = _rng(12)
    ops = [("Mul", rng.uniform(0.5, 2, mul_shape)), ("Add", rng.normal(0, 1, add_shape))]
    proto = _conv_then(ops)
    out, counts, _ = _fold(proto)
    assert counts["mul_into_conv"] == 1 and counts["add_into_conv"] == 1
    assert op_counts(out) == {"Conv": 1}
    assert_same_outputs(proto, out, atol=1e-4)


def test_conv_bn_mul_add_chain_folds_into_conv():
    rng = _rng(13)
    ops = [("Mul", rng.uniform(0.5, 2, (6, 1, 1))), ("Add", rng.normal(0, 1, (6, 1, 1)))]
    proto = _conv_then(ops, bn=True)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1 and counts["mul_into_conv"] == 1
    assert op_counts(out) == {"Conv": 1}
    assert_same_outputs(proto, out, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1, 1, 6), (6,), (1, 1, 6, 6), (1, 1, 1, 1, 1)])
def test_mul_not_per_channel_refuses(shape):
    proto = _conv_then([("Mul", _rng(14).uniform(0.5, 2, shape))])
    out, counts, report = _fold(proto)
    assert counts["mul_into_conv"] == 0 and op_counts(out)["Mul"] == 1
    assert [r.reason for r in report.refusals] == [
        "Mul constant does not broadcast per output channel"
    ]


def test_bn_mul_add_without_conv_becomes_one_bn():
    rng = _rng(15)
    inits = {
        **_bn_params("bn", 4),
        "m": rng.uniform(-2, 2, (4, 1, 1)).astype(np.float32),
        "a": rng.normal(0, 1, (1, 4, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Relu", ["X"], ["r"]),
        _bn("r", "y", "bn"),
        helper.make_node("Mul", ["m", "y"], ["z"]),
        helper.make_node("Add", ["z", "a"], ["Z"]),
    ]
    proto = _model(nodes, {"X": (F32, [2, 4, 5, 5])}, ["Z"], inits)
    out, counts, _ = _fold(proto, ctx=PassContext(portable=True))
    assert counts["affine_into_bn"] == 2
    assert op_counts(out) == {"Relu": 1, "BatchNormalization": 1}
    assert [o.name for o in out.graph.output] == ["Z"]
    assert_same_outputs(proto, out, atol=1e-4)


# -- activation fusion into com.microsoft FusedConv ---------------------------------------------

ACTIVATIONS = [
    ("Relu", "", {}),
    ("LeakyRelu", "", {"alpha": 0.2}),
    ("Sigmoid", "", {}),
    ("HardSigmoid", "", {"alpha": 0.3, "beta": 0.4}),
    ("Tanh", "", {}),
    ("Clip", "lo, hi", {}),
    ("Clip", "lo", {}),
    ("Clip", ", hi", {}),
]


@pytest.mark.parametrize("op,bounds,attrs", ACTIVATIONS, ids=lambda a: str(a) or "-")
def test_activation_fuses_into_fused_conv(op, bounds, attrs):
    text_attrs = ", ".join(f"{k} = {v}" for k, v in attrs.items())
    args = "t" + (", " + bounds if bounds else "")
    proto = parse(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 3, 9, 9] X) => (float[1, 4, 5, 5] Y)
        <float[4, 3, 3, 3] W = {_floats(108)}, float[4] B = {_floats(4, 1)},
         float lo = {{0.0}}, float hi = {{6.0}}>
        {{
            t = Conv <strides = [2, 2], pads = [1, 1, 1, 1]> (X, W, B)
            Y = {op} {"<" + text_attrs + ">" if text_attrs else ""} ({args})
        }}
    """)
    out, counts, _ = _fold(proto)
    assert counts["activation_fused"] == 1
    assert op_counts(out) == {"FusedConv": 1}
    node = out.graph.node[0]
    assert node.domain == "com.microsoft"
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "activation"))
    assert {o.domain: o.version for o in out.opset_import}["com.microsoft"] == 1
    assert_same_outputs(proto, out, atol=1e-4)
    again, report = optimize_proto(out, passes=PASSES)
    assert report.passes["fuse-conv-bn-relu"].changed == 0 and op_counts(again) == op_counts(out)
    assert report.passes["fuse-conv-activation"].changed == 0


def _floats(n: int, seed: int = 0) -> str:
    vals = _rng(seed).normal(0, 0.5, n)
    return "{" + ", ".join(f"{v:.6f}" for v in vals) + "}"


def test_conv_bn_relu_becomes_fused_conv():
    rng = _rng(16)
    inits = {"W": rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32), **_bn_params("bn", 6)}
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["t"]),
        _bn("t", "u", "bn"),
        helper.make_node("Relu", ["u"], ["Y"]),
    ]
    proto = _model(nodes, {"X": (F32, [1, 3, 8, 8])}, ["Y"], inits)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1 and counts["activation_fused"] == 1
    assert op_counts(out) == {"FusedConv": 1}
    assert [o.name for o in out.graph.output] == ["Y"]
    assert_same_outputs(proto, out, atol=1e-4)


@pytest.mark.parametrize(
    "ctx",
    [PassContext(portable=True), PassContext(backend="tensorrt"), PassContext(target="a100")],
    ids=["portable", "tensorrt", "gpu-target"],
)
def test_no_fused_conv_unless_ort_cpu(ctx):
    proto = _conv_then([])
    proto = _model(
        [*proto.graph.node, helper.make_node("Relu", ["t0"], ["Y"])],
        {"X": (F32, [2, 3, 8, 8])},
        ["Y"],
        {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer},
    )
    out, counts, report = _fold(proto, ctx=ctx)
    assert counts["activation_fused"] == 0
    assert op_counts(out) == {"Conv": 1, "Relu": 1}
    assert all(o.domain != "com.microsoft" for o in out.opset_import)
    assert report.passes["fuse-conv-activation"].changed == 0


def test_activation_with_second_conv_reader_refuses():
    proto = parse(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 3, 5, 5] X) => (float[1, 2, 3, 3] Y, float[1, 2, 3, 3] T)
        <float[2, 3, 3, 3] W = {_floats(54)}>
        {{
            T = Conv (X, W)
            Y = Relu (T)
        }}
    """)
    out, counts, report = _fold(proto)
    assert counts["activation_fused"] == 0 and op_counts(out) == {"Conv": 1, "Relu": 1}
    assert [r.reason for r in report.refusals] == ["conv output has other readers"]


def test_fp16_conv_relu_is_not_fused():
    proto = _conv_bn(dtype=np.float16)
    nodes = [*proto.graph.node, helper.make_node("Relu", ["Z"], ["Y"])]
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    proto = _model(nodes, {"X": (F16, [2, 4, 7, 7])}, ["Y"], inits)
    out, counts, _ = _fold(proto)
    assert counts["bn_into_conv"] == 1 and counts["activation_fused"] == 0
    assert op_counts(out) == {"Conv": 1, "Relu": 1}


# -- real models --------------------------------------------------------------------------------


def _light_model(name: str) -> onnx.ModelProto:
    """An onnx light model with its ConstantOfShape weights replaced by seeded random data."""
    path = os.path.join(os.path.dirname(onnx.__file__), f"backend/test/data/light/{name}.onnx")
    src = onnx.load(path)
    rng = _rng(42)
    roles = _weight_roles(src.graph)
    shapes = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    inits = {t.name: t for t in src.graph.initializer if t.name not in roles}
    nodes = []
    for n in src.graph.node:
        if n.op_type != "ConstantOfShape":
            nodes.append(n)
            continue
        out, shape = n.output[0], tuple(int(d) for d in shapes[n.input[0]])
        weight = _random_weight(rng, roles.get(out, "weight"), shape)
        inits[out] = numpy_helper.from_array(weight, out)
    for t in src.graph.initializer:  # weights stored as real initializers get random data too
        if t.name in roles and not t.name.endswith("__SHAPE"):
            inits[t.name] = numpy_helper.from_array(
                _random_weight(rng, roles[t.name], tuple(t.dims)), t.name
            )
    data = [i for i in src.graph.input if i.name not in shapes]
    g = helper.make_graph(nodes, name, data, list(src.graph.output), list(inits.values()))
    m = make_model(g, opset_imports=list(src.opset_import))
    m.ir_version = 7
    onnx.checker.check_model(m)
    return m


def _weight_roles(graph: onnx.GraphProto) -> dict[str, str]:
    """'positive' for BN scale/var and Mul constants, 'small' for BN mean/bias, else 'weight'."""
    roles: dict[str, str] = {}
    unsqueezed = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Unsqueeze"}
    for n in graph.node:
        if n.op_type == "ConstantOfShape":
            roles.setdefault(n.output[0], "weight")
            roles[n.input[0]] = "shape"
        elif n.op_type == "BatchNormalization":
            roles.update(
                dict(zip(n.input[1:5], ["positive", "small", "small", "positive"], strict=True))
            )
        elif n.op_type in ("Mul", "Add"):
            for i in n.input:
                if i in unsqueezed:
                    roles[unsqueezed[i]] = "positive" if n.op_type == "Mul" else "small"
        elif n.op_type in ("Conv", "Gemm"):
            roles.update({i: "weight" for i in n.input[1:2]})
            roles.update({i: "small" for i in n.input[2:3]})
    return roles


def _random_weight(rng: np.random.Generator, role: str, shape: tuple[int, ...]) -> np.ndarray:
    if role == "positive":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role == "small" or len(shape) < 2:
        return (0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    scale = np.float32(np.sqrt(1.0 / np.prod(shape[1:])))
    return rng.standard_normal(shape, dtype=np.float32) * scale


def _pipeline() -> list[str] | None:
    """The default pipeline when every pass in it exists, else this pass and DCE."""
    return None if all(name in REGISTRY for name in DEFAULT_PIPELINE) else PASSES


def test_light_resnet50_folds_every_bn():
    proto = _light_model("light_resnet50")
    assert op_counts(proto)["BatchNormalization"] == 53
    out, report = optimize_proto(proto, passes=_pipeline())
    counts = {
        **report.passes["fuse-conv-bn-relu"].counts,
        **report.passes["fuse-conv-activation"].counts,
    }
    assert counts["bn_into_conv"] == 53 and op_counts(out)["BatchNormalization"] == 0
    assert counts["activation_fused"] == 33 and op_counts(out)["FusedConv"] == 33
    assert op_counts(out)["Relu"] == 16  # the Relus after the residual Sum stay
    assert_same_outputs(proto, out, random_feeds(proto), atol=1e-4, rtol=1e-3)


@pytest.mark.skipif(_pipeline() is not None, reason="needs fold-constants for Unsqueeze(const)")
def test_light_inception_v2_bn_mul_add_chains_fold():
    # Conv -> BatchNormalization -> Mul(Unsqueeze(c)) -> Add(Unsqueeze(c)) -> Relu, 69 times.
    proto = _light_model("light_inception_v2")
    out, report = optimize_proto(proto)
    counts = report.passes["fuse-conv-bn-relu"].counts
    assert counts["bn_into_conv"] == counts["mul_into_conv"] == counts["add_into_conv"] == 69
    assert op_counts(out)["FusedConv"] == 69
    assert not {"BatchNormalization", "Mul", "Add", "Relu", "Conv"} & set(op_counts(out))
    assert_same_outputs(proto, out, random_feeds(proto), atol=1e-4, rtol=1e-3)
