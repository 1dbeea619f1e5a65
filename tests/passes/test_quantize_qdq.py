"""QDQ quantization: structure, numerics under onnxruntime, and what onnxruntime fuses to int8."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.calib.observers import TensorRange, collect_ranges
from infercc.errors import InferccError
from infercc.ir import export_model, import_model
from infercc.passes import PassContext, QuantizeSettings, run_passes
from infercc.passes.pipelines import INT8
from infercc.passes.quantize_qdq import (
    MIN_SCALE,
    activation_params,
    calibration_tensors,
    dequantize_weight,
    quantize_qdq,
    quantize_weight,
    weight_sqnr,
)
from tests.helpers import make_model

RNG_SEED = 0


def _model(nodes, inputs, outputs, weights, opset: int = 17) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(a, n) for n, a in weights.items()]
    graph = oh.make_graph(nodes, "g", inputs, outputs, inits)
    model = make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _normal(rng, shape, std=1.0):
    return (std * rng.standard_normal(shape)).astype(np.float32)


def conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(RNG_SEED)
    weights = {
        "w1": _normal(rng, (8, 3, 3, 3), 0.3),
        "b1": _normal(rng, (8,), 0.1),
        "w2": _normal(rng, (16, 8, 3, 3), 0.15),
        "b2": _normal(rng, (16,), 0.1),
        "w3": _normal(rng, (10, 16), 0.3),
        "b3": _normal(rng, (10,), 0.1),
    }
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        oh.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        oh.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flatten"),
        oh.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])
    y = oh.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10])
    return _model(nodes, [x], [y], weights)


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(RNG_SEED + 1)
    weights = {
        "w1": _normal(rng, (32, 64), 0.2),
        "b1": _normal(rng, (64,), 0.1),
        "w2": _normal(rng, (64, 10), 0.2),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        oh.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
        oh.make_node("Relu", ["hb"], ["r"], name="relu"),
        oh.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2"),
        oh.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = oh.make_tensor_value_info("probs", TensorProto.FLOAT, [4, 10])
    return _model(nodes, [x], [y], weights)


def _samples(proto: onnx.ModelProto, n: int = 6, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    vi = proto.graph.input[0]
    shape = [
        d.dim_value or (1 if i == 0 else 8) for i, d in enumerate(vi.type.tensor_type.shape.dim)
    ]
    return [{vi.name: _normal(rng, shape)} for _ in range(n)]


def _calibrate(proto: onnx.ModelProto, tmp_path) -> dict[str, TensorRange]:
    path = tmp_path / "fp32.onnx"
    onnx.save(proto, path)
    tensors = calibration_tensors(import_model(proto))
    return collect_ranges(path, _samples(proto), tensors=tensors)


def _quantized(proto, ranges, **kwargs):
    model = import_model(proto)
    report = quantize_qdq(model, ranges, **kwargs)
    model.graph.lint()
    out = export_model(model)
    onnx.checker.check_model(out, full_check=True)
    return out, report


def _session(proto: onnx.ModelProto, level, optimized_path=None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    if optimized_path is not None:
        opts.optimized_model_filepath = str(optimized_path)
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run(proto, feeds, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL) -> np.ndarray:
    return _session(proto, level).run(None, feeds)[0]


def _ort_optimized_ops(proto: onnx.ModelProto, tmp_path) -> Counter:
    path = tmp_path / "ort_optimized.onnx"
    _session(proto, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, path)
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ops(proto: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in proto.graph.node)


def _int8_inits(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {
        t.name: numpy_helper.to_array(t)
        for t in proto.graph.initializer
        if t.data_type == TensorProto.INT8 and len(t.dims) >= 2  # not the zero points
    }


def _weight_dqs(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """DequantizeLinear nodes reading an int8 weight (rank >= 2), by that initializer's name."""
    weights = _int8_inits(proto)
    return {
        n.input[0]: n
        for n in proto.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in weights
    }


def _axis(node: onnx.NodeProto) -> int | None:
    for a in node.attribute:
        if a.name == "axis":
            return a.i
    return None


# --------------------------------------------------------------------------- conv net


@pytest.fixture(scope="module")
def conv_case(tmp_path_factory):
    proto = conv_net()
    ranges = _calibrate(proto, tmp_path_factory.mktemp("conv"))
    out, report = _quantized(proto, ranges)
    return proto, ranges, out, report


def test_conv_net_structure(conv_case):
    proto, _, out, report = conv_case
    assert report.quantized == ["conv1", "conv2", "fc"]
    assert report.kept_float == {}
    # inputs x, r1, f and outputs c1, c2, logits; three weights
    assert report.qdq_pairs == 6 and report.weights_quantized == 3
    ops = _ops(out)
    assert ops["QuantizeLinear"] == 6 and ops["DequantizeLinear"] == 9
    dqs = _weight_dqs(out)
    assert len(dqs) == 3
    axes = sorted(
        (numpy_helper.to_array(_init(out, n.input[1])).shape, _axis(n)) for n in dqs.values()
    )
    assert axes == [((8,), 0), ((10,), 0), ((16,), 0)]  # conv M axis; Gemm transB=1 -> axis 0
    names = {t.name for t in out.graph.initializer}
    assert not {"w1", "w2", "w3"} & names  # float weights nobody reads are gone
    assert {"b1", "b2", "b3"} <= names  # biases stay float32
    assert all(_init(out, b).data_type == TensorProto.FLOAT for b in ("b1", "b2", "b3"))
    assert [o.name for o in out.graph.output] == ["logits"]
    json.dumps(report.to_dict())


def _init(proto: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in proto.graph.initializer if t.name == name)


def test_conv_net_close_to_fp32(conv_case):
    proto, _, out, _ = conv_case
    feeds = _samples(proto, n=1, seed=99)[0]
    ref, got = _run(proto, feeds), _run(out, feeds)
    assert got.shape == ref.shape
    assert _cosine(ref, got) >= 0.99
    optimized = _run(out, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert _cosine(ref, optimized) >= 0.99


def test_conv_net_runs_int8_in_onnxruntime(conv_case, tmp_path):
    _, _, out, _ = conv_case
    ops = _ort_optimized_ops(out, tmp_path)
    assert ops["QLinearConv"] == 2 and ops["Conv"] == 0
    assert ops["QGemm"] == 1 and ops["Gemm"] == 0


def test_without_output_qdq_onnxruntime_keeps_conv_float(conv_case, tmp_path):
    proto, ranges, _, _ = conv_case
    out, report = _quantized(proto, ranges, output_qdq=False)
    assert report.qdq_pairs == 3 and _ops(out)["QuantizeLinear"] == 3
    ops = _ort_optimized_ops(out, tmp_path)
    assert ops["QLinearConv"] == 0  # what onnxruntime 1.32 needs the output Q for


def test_exclude_keeps_node_float(conv_case, tmp_path):
    proto, ranges, _, _ = conv_case
    out, report = _quantized(proto, ranges, exclude=["conv2"])
    assert report.kept_float == {"conv2": "excluded by name"}
    assert report.quantized == ["conv1", "fc"]
    conv2 = next(n for n in out.graph.node if n.name == "conv2")
    assert conv2.input[1] == "w2" and _init(out, "w2").data_type == TensorProto.FLOAT
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    assert producers[conv2.input[0]] == "Relu"
    assert all(n.op_type != "QuantizeLinear" for n in out.graph.node if "c2" in n.input)
    assert _ort_optimized_ops(out, tmp_path)["QLinearConv"] == 1


def test_unknown_exclude_name_raises(conv_case):
    proto, ranges, _, _ = conv_case
    model = import_model(proto)
    with pytest.raises(InferccError, match="node names"):
        quantize_qdq(model, ranges, exclude=["r1"])


def test_per_tensor_weights(conv_case):
    proto, ranges, _, _ = conv_case
    out, _ = _quantized(proto, ranges, per_channel=False)
    for dq in _weight_dqs(out).values():
        assert _axis(dq) is None
        assert numpy_helper.to_array(_init(out, dq.input[1])).shape == ()


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda r: r.pop("r1"), "no calibrated range for input 'r1'"),
        (lambda r: r.update(r1=TensorRange("r1", 0, 0, 0.0, "minmax")), "degenerate range"),
        (lambda r: r.update(r1=TensorRange("r1", 0, 1, float("nan"), "minmax")), "degenerate"),
    ],
)
def test_missing_or_degenerate_range_keeps_node_float(conv_case, edit, reason):
    proto, ranges, _, _ = conv_case
    ranges = dict(ranges)
    edit(ranges)
    out, report = _quantized(proto, ranges)
    assert set(report.kept_float) == {"conv2"} and reason in report.kept_float["conv2"]
    conv2 = next(n for n in out.graph.node if n.name == "conv2")
    assert conv2.input[:2] == ["r1", "w2"]  # untouched, no partial quantization


def test_missing_output_range_is_noted(conv_case):
    proto, ranges, _, _ = conv_case
    ranges = {k: v for k, v in ranges.items() if k != "c2"}
    out, report = _quantized(proto, ranges)
    assert "conv2" in report.quantized and "no calibrated range" in report.notes["conv2"]
    assert report.qdq_pairs == 5


# --------------------------------------------------------------------------- MLP


@pytest.fixture(scope="module")
def mlp_case(tmp_path_factory):
    proto = mlp()
    ranges = _calibrate(proto, tmp_path_factory.mktemp("mlp"))
    out, report = _quantized(proto, ranges)
    return proto, ranges, out, report


def test_mlp_structure_and_softmax_untouched(mlp_case):
    _, _, out, report = mlp_case
    assert report.quantized == ["mm1", "mm2"]
    # inputs x and r; mm1's output h (its Add would otherwise make onnxruntime fuse a float Gemm)
    assert report.qdq_pairs == 3 and report.weights_quantized == 2
    ops = _ops(out)
    assert ops["QuantizeLinear"] == 3 and ops["DequantizeLinear"] == 5
    assert sorted(_axis(n) for n in _weight_dqs(out).values()) == [1, 1]  # MatMul [K, N]
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    softmax = next(n for n in out.graph.node if n.op_type == "Softmax")
    assert producers[softmax.input[0]] == "MatMul"
    assert not any(softmax.output[0] in n.input for n in out.graph.node)  # a graph output only
    add = next(n for n in out.graph.node if n.op_type == "Add")
    assert producers[add.input[0]] == "DequantizeLinear" and add.input[1] == "b1"


def test_mlp_close_to_fp32_and_int8_in_onnxruntime(mlp_case, tmp_path):
    proto, _, out, _ = mlp_case
    feeds = _samples(proto, n=1, seed=42)[0]
    assert _cosine(_run(proto, feeds), _run(out, feeds)) >= 0.99
    ops = _ort_optimized_ops(out, tmp_path)
    # mm1 (output quantized) -> QLinearMatMul; mm2 (float output) -> MatMulIntegerToFloat
    assert ops["QLinearMatMul"] == 1 and ops["MatMulIntegerToFloat"] == 1
    assert ops["MatMul"] == 0 and ops["Gemm"] == 0 and ops["FusedGemm"] == 0
    assert ops["Softmax"] == 1


def test_shared_activation_gets_one_pair_and_shared_weight_separate_copies(tmp_path):
    rng = np.random.default_rng(3)
    w = _normal(rng, (16, 16), 0.3)
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["a"], name="mm_a"),
        oh.make_node("MatMul", ["x", "w"], ["b"], name="mm_b"),
        oh.make_node("Add", ["a", "b"], ["s"], name="add"),
        oh.make_node("MatMul", ["s", "w"], ["y"], name="mm_float"),
    ]
    proto = _model(
        nodes,
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        {"w": w},
    )
    ranges = _calibrate(proto, tmp_path)
    out, report = _quantized(proto, ranges, exclude=["mm_float"])
    assert report.quantized == ["mm_a", "mm_b"] and report.qdq_pairs == 1
    assert _ops(out)["QuantizeLinear"] == 1
    copies = _int8_inits(out)
    assert len(copies) == 2 and report.weights_quantized == 2
    assert np.array_equal(*copies.values())
    np.testing.assert_array_equal(numpy_helper.to_array(_init(out, "w")), w)  # never rewritten
    mm_float = next(n for n in out.graph.node if n.name == "mm_float")
    assert mm_float.input[1] == "w"
    feeds = _samples(proto, n=1, seed=5)[0]
    assert _cosine(_run(proto, feeds), _run(out, feeds)) >= 0.99


def test_opset_11_is_refused():
    proto = _model(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        {"w": np.eye(4, dtype=np.float32)},
        opset=11,
    )
    model = import_model(proto)
    with pytest.raises(InferccError, match="opset") as info:
        quantize_qdq(model, {"x": TensorRange("x", -1, 1, 1 / 127, "minmax")})
    assert "version_converter" in str(info.value.hint)
    assert [n.op_type for n in model.graph] == ["MatMul"]


def test_fp16_weight_keeps_node_float():
    w = np.eye(4, dtype=np.float16)
    proto = _model(
        [
            oh.make_node("Cast", ["x"], ["xh"], name="cast", to=TensorProto.FLOAT16),
            oh.make_node("MatMul", ["xh", "w"], ["y"], name="mm"),
        ],
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])],
        {"w": w},
    )
    ranges = {"xh": TensorRange("xh", -1, 1, 1 / 127, "minmax")}
    _, report = _quantized(proto, ranges)
    assert report.quantized == [] and "not float32" in report.kept_float["mm"]


# --------------------------------------------------------------------------- weights


def test_quantize_weight_per_channel_round_trip():
    rng = np.random.default_rng(7)
    w = _normal(rng, (8, 3, 3, 3)) * rng.uniform(0.01, 5, (8, 1, 1, 1)).astype(np.float32)
    w[3] = 0.0
    q, scales = quantize_weight(w, 0)
    assert q.dtype == np.int8 and scales.dtype == np.float32 and scales.shape == (8,)
    assert np.abs(q.astype(np.int32)).max() <= 127
    assert scales[3] == np.float32(MIN_SCALE) and not q[3].any()
    err = np.abs(w - dequantize_weight(q, scales, 0))
    assert (err <= scales.reshape(-1, 1, 1, 1) / 2 * (1 + 1e-5)).all()
    np.testing.assert_allclose(scales[:3], np.abs(w[:3]).max(axis=(1, 2, 3)) / 127, rtol=1e-6)


def test_quantize_weight_per_tensor_and_errors():
    w = np.array([[0.5, -1.0], [0.25, 0.0]], np.float32)
    q, scale = quantize_weight(w, None)
    assert scale.shape == () and q.tolist() == [[64, -127], [32, 0]]
    with pytest.raises(InferccError):
        quantize_weight(np.array([1.0, np.nan], np.float32), None)
    with pytest.raises(InferccError):
        quantize_weight(w, 2)


def test_weight_sqnr():
    rng = np.random.default_rng(11)
    w = _normal(rng, (64, 128))
    assert weight_sqnr(w, 1) > 30.0
    skewed = w * np.logspace(-2, 1, 128, dtype=np.float32)  # columns of very different size
    assert weight_sqnr(skewed, 1) > weight_sqnr(skewed, None) + 6.0
    assert weight_sqnr(np.zeros((4, 4), np.float32), 0) == float("inf")


# --------------------------------------------------------------------------- activation forms


def test_activation_params_uint8_covers_the_range_with_zero_exact():
    r = TensorRange("t", -0.5, 12.25, 12.25 / 127, "minmax")
    assert activation_params(r, "int8") == (pytest.approx(12.25 / 127), 0)
    scale, zero = activation_params(r, "uint8")
    assert scale == pytest.approx(12.75 / 255)
    assert zero == 10  # round(0.5 / 0.05)
    # a one-sided range: zero point 0, the whole code range on the positive side
    assert activation_params(TensorRange("r", 0.0, 2.55, 2.55 / 127, "minmax"), "uint8") == (
        pytest.approx(0.01),
        0,
    )
    with pytest.raises(InferccError, match="unknown activation type"):
        quantize_qdq(import_model(mlp()), {}, activations="u4")


def transformer_block(batch: int | str = "batch", seq: int | str = "seq") -> onnx.ModelProto:
    """[batch, seq, 16] tokens: a rank-3 projection with a bias, attention, a ReLU-fed MatMul."""
    rng = np.random.default_rng(3)
    weights = {
        "wq": _normal(rng, (16, 16), 0.3),
        "bq": _normal(rng, (16,), 0.1),
        "wo": _normal(rng, (16, 16), 0.3),
        "bo": _normal(rng, (16,), 0.1),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "wq"], ["q0"], name="proj"),
        oh.make_node("Add", ["q0", "bq"], ["q"], name="proj_bias"),
        oh.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["q", "qt"], ["scores"], name="scores"),
        oh.make_node("Softmax", ["scores"], ["p"], axis=-1),
        oh.make_node("MatMul", ["p", "q"], ["ctx"], name="context"),
        oh.make_node("Relu", ["ctx"], ["r"]),
        oh.make_node("MatMul", ["r", "wo"], ["o0"], name="out"),
        oh.make_node("Add", ["o0", "bo"], ["y"], name="out_bias"),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, 16])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, 16])
    return _model(nodes, [x], [y], weights)


def test_uint8_activations_rank3_projections_and_attention(tmp_path):
    proto = transformer_block()
    ranges = _calibrate(proto, tmp_path)
    q, report = _quantized(proto, ranges, activations="uint8", activation_matmuls=False)
    # attention MatMuls of two activations stay float, with the reason
    assert sorted(report.quantized) == ["out", "proj"]
    assert set(report.kept_float) == {"scores", "context"}
    assert all("both operands are activations" in r for r in report.kept_float.values())
    # activations are uint8 (asymmetric); the ReLU output's zero point is 0, x's is not
    qs = [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    assert len(qs) == 2  # no output pair on a MatMul + bias with a symbolic shape
    zero_points = {n.input[0]: numpy_helper.to_array(_init(q, n.input[2])) for n in qs}
    assert {z.dtype for z in zero_points.values()} == {np.dtype(np.uint8)}
    assert int(zero_points["r"]) == 0 and int(zero_points["x"]) > 0
    # onnxruntime runs both projections as MatMulIntegerToFloat
    ops = _ort_optimized_ops(q, tmp_path)
    assert ops["MatMulIntegerToFloat"] == 2 and ops["QLinearMatMul"] == 0
    feeds = _samples(proto, 1, seed=9)[0]
    assert _cosine(_run(proto, feeds), _run(q, feeds)) > 0.999


def test_activation_matmuls_on_request_and_symmetric_default(tmp_path):
    proto = transformer_block()
    ranges = _calibrate(proto, tmp_path)
    q, report = _quantized(proto, ranges)
    assert sorted(report.quantized) == ["context", "out", "proj", "scores"]
    zero_types = {
        numpy_helper.to_array(_init(q, n.input[2])).dtype
        for n in q.graph.node
        if n.op_type == "QuantizeLinear"
    }
    assert zero_types == {np.dtype(np.int8)}


def test_static_rank3_matmul_with_bias_gets_its_output_pair(tmp_path):
    # with a static shape onnxruntime fuses MatMul + bias into a Gemm (via Reshapes), which
    # runs in float unless an output Q follows the MatMul
    proto = transformer_block(1, 8)
    q, report = _quantized(proto, _calibrate(proto, tmp_path), activation_matmuls=False)
    assert sorted(report.quantized) == ["out", "proj"]
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert {"q0", "o0"} <= quantized
    ops = _ort_optimized_ops(q, tmp_path)
    assert ops["QLinearMatMul"] == 2 and ops["Gemm"] == 0


def test_2d_matmul_with_bias_keeps_its_output_pair(mlp_case):
    # rank-2 MatMul + bias Add is fused into a Gemm by onnxruntime: it needs the output pair
    proto, ranges, _, _ = mlp_case
    q, _ = _quantized(proto, ranges, activations="uint8")
    outputs_quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul"]
    assert any(n.output[0] in outputs_quantized for n in matmuls)


# --------------------------------------------------------------------------- the pass


def _fixed_ranges(model) -> dict[str, TensorRange]:
    """Ranges without data: [-2, 2] for every tensor calibration would observe."""
    return {t: TensorRange(t, -2.0, 2.0, 2.0 / 127, "minmax") for t in calibration_tensors(model)}


def _settings(model, **kwargs) -> QuantizeSettings:
    return QuantizeSettings(_fixed_ranges(model), **kwargs)


def test_the_pass_runs_in_the_int8_pipeline_with_lint_after_each_pass() -> None:
    model = import_model(conv_net())
    ctx = PassContext(options={"quantize": _settings(model)}, verify=True)
    report = run_passes(model, ctx, INT8.stages[1])
    model.graph.lint()
    details = report.details("quantize-qdq")
    assert details.quantized == ["conv1", "conv2", "fc"]
    assert report.passes["quantize-qdq"].runs == 1  # once: not in the fixpoint's 2nd round
    assert report.passes["quantize-qdq"].counts["quantized"] == 3
    assert report.reached_fixpoint
    onnx.checker.check_model(export_model(model), full_check=True)


def test_kept_float_nodes_are_refusals_that_explain_shows() -> None:
    model = import_model(mlp())
    ranges = _fixed_ranges(model)
    del ranges["r"]  # mm2's input has no range
    ctx = PassContext(options={"quantize": QuantizeSettings(ranges, exclude=("mm1",))})
    report = run_passes(model, ctx, ["quantize-qdq"])
    kept = report.details("quantize-qdq").kept_float
    assert kept == {"mm1": "excluded by name", "mm2": "no calibrated range for input 'r'"}
    refusals = [(r.pass_name, r.node, r.reason) for r in report.refusals]
    assert refusals == [("quantize-qdq", n, reason) for n, reason in kept.items()]


def test_a_rewrite_limit_quantizes_exactly_the_first_nodes() -> None:
    """Bisection over quantize-qdq: with a limit of k the first k targets are quantized."""
    for k in range(4):
        model = import_model(conv_net())
        limits = {"quantize-qdq": k}
        ctx = PassContext(options={"quantize": _settings(model)}, rewrite_limits=limits)
        report = run_passes(model, ctx, ["quantize-qdq"], max_iterations=1)
        model.graph.lint()
        assert report.details("quantize-qdq").quantized == ["conv1", "conv2", "fc"][:k]
        assert [name for name, _ in ctx.rewrites["quantize-qdq"]] == ["conv1", "conv2", "fc"][:k]
        assert report.details("quantize-qdq").kept_float == {}  # a cut is no refusal


def test_a_second_run_changes_nothing() -> None:
    model = import_model(mlp())
    quantize_qdq(model, _fixed_ranges(import_model(mlp())))
    before = export_model(model).SerializeToString()
    again = run_passes(model, PassContext(options={"quantize": _settings(model)}), ["quantize-qdq"])
    assert not again.passes["quantize-qdq"].changed
    assert set(again.details("quantize-qdq").kept_float.values()) == {
        "already quantized (its inputs come from DQ nodes)"
    }
    assert export_model(model).SerializeToString() == before


def test_the_pass_without_settings_says_what_it_needs() -> None:
    with pytest.raises(InferccError, match="quantize-qdq needs calibrated ranges"):
        run_passes(import_model(mlp()), PassContext(), ["quantize-qdq"])


# --------------------------------------------------------------------------- residual blocks


def residual_net() -> onnx.ModelProto:
    """A ResNet's shape: conv1 -> Relu, three blocks [conv -> Relu -> conv] + shortcut -> Relu,
    then pooling and a Gemm. A block's shortcut after the first is the Relu output of the block
    before, which only its Conv reader quantizes; no target reads the last block's sum (the
    pooling does)."""
    rng = np.random.default_rng(RNG_SEED + 2)
    weights = {f"w{i}": _normal(rng, (8, 8 if i > 1 else 3, 3, 3), 0.25) for i in range(1, 8)}
    weights |= {f"b{i}": _normal(rng, (8,), 0.1) for i in range(1, 8)}
    weights |= {"wf": _normal(rng, (10, 8), 0.3), "bf": _normal(rng, (10,), 0.1)}
    pads = [1, 1, 1, 1]
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=pads),
        oh.make_node("Relu", ["c1"], ["r1"], name="relu1"),
    ]
    block_in = "r1"
    for k, (a, b) in enumerate([(2, 3), (4, 5), (6, 7)], start=1):
        nodes += [
            oh.make_node(
                "Conv", [block_in, f"w{a}", f"b{a}"], [f"c{a}"], name=f"conv{a}", pads=pads
            ),
            oh.make_node("Relu", [f"c{a}"], [f"r{a}"], name=f"relu{a}"),
            oh.make_node(
                "Conv", [f"r{a}", f"w{b}", f"b{b}"], [f"c{b}"], name=f"conv{b}", pads=pads
            ),
            oh.make_node("Add", [f"c{b}", block_in], [f"s{k}"], name=f"residual{k}"),
            oh.make_node("Relu", [f"s{k}"], [f"r{b}"], name=f"relu{b}"),
        ]
        block_in = f"r{b}"
    nodes += [
        oh.make_node("GlobalAveragePool", ["r7"], ["p"], name="pool"),
        oh.make_node("Flatten", ["p"], ["f"], name="flatten"),
        oh.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    y = oh.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])
    return _model(nodes, [x], [y], weights)


@pytest.fixture(scope="module")
def residual_case(tmp_path_factory):
    proto = residual_net()
    ranges = _calibrate(proto, tmp_path_factory.mktemp("residual"))
    return proto, ranges


def _reader_ops(proto: onnx.ModelProto, tensor: str) -> list[str]:
    return [n.op_type for n in proto.graph.node if tensor in n.input]


def test_uint8_output_pairs_go_after_a_sole_relu_and_the_residual_add_reads_dqs(
    residual_case, tmp_path
):
    """uint8 (onnxruntime's form): a Conv whose only reader is a Relu gets its output pair on
    the Relu's output (zero point 0: Q(Relu(y)) = Q(y)), and the residual Add reads the DQs of
    its inputs; the last block's sum, which no Conv quantizes, gets a pair after its Relu as
    a Conv's would: onnxruntime then runs every Conv as QLinearConv and every Add as
    QLinearAdd, with no Relu, no float Conv and no float Add left."""
    proto, ranges = residual_case
    out, report = _quantized(proto, ranges, activations="uint8")
    assert report.quantized == [f"conv{i}" for i in range(1, 8)] + ["fc"]
    # block 1's shortcut r1 is read through the pair put after relu1 already; blocks 2 and 3
    # move theirs (r3, r5) to their DQs; block 3's sum gets its own pair, after relu7
    assert report.adds == ["residual2", "residual3"]
    relus = ("r1", "r2", "r3", "r4", "r5", "r6", "r7")
    for relu in relus:  # each Relu's output is quantized, read by its Q alone
        assert _reader_ops(out, relu) == ["QuantizeLinear"]
    for conv in ("c1", "c2", "c4", "c6"):  # the Conv before a sole Relu: no pair of its own
        assert _reader_ops(out, conv) == ["Relu"]
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    for name in ("residual1", "residual2", "residual3"):
        add = next(n for n in out.graph.node if n.name == name)
        assert [producers[i] for i in add.input] == ["DequantizeLinear"] * 2
    zero_points = {
        n.input[0]: numpy_helper.to_array(_init(out, n.input[2]))
        for n in out.graph.node
        if n.op_type == "QuantizeLinear"
    }
    assert all(zero_points[r] == 0 for r in relus)
    fused = _ort_optimized_ops(out, tmp_path)
    assert fused["QLinearConv"] == 7 and fused["QLinearAdd"] == 3
    assert fused["Conv"] == 0 and fused["Add"] == 0 and fused["Relu"] == 0
    feeds = _samples(proto, 3, seed=5)
    for feed in feeds:  # the fused kernels compute what the Q/DQ graph means, and near fp32
        unfused = _run(out, feed)
        fused_out = _run(out, feed, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        assert np.abs(fused_out - unfused).max() <= 0.02 * np.abs(unfused).max()
        assert _cosine(unfused, _run(proto, feed)) > 0.99


def test_an_integer_add_of_two_activations_is_not_observed(tmp_path):
    """Position ids (int64 + int64, both computed) beside the residual Adds: calibration
    observes float Adds only (the int64 sum was asked for and refused by the observer, and
    calibrate with it, on the BERT-style exports that compute their position ids)."""
    proto = transformer_block(batch=1, seq=8)
    proto.graph.node.append(oh.make_node("Add", ["ids", "ids"], ["ids2"], name="positions"))
    proto.graph.input.append(oh.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]))
    proto.graph.output.append(oh.make_tensor_value_info("ids2", TensorProto.INT64, [1, 8]))
    tensors = calibration_tensors(import_model(proto))
    assert "ids2" not in tensors and "ids" not in tensors
    path = tmp_path / "fp32.onnx"
    onnx.save(proto, path)
    feeds = [{**feed, "ids": np.arange(8, dtype=np.int64)[None]} for feed in _samples(proto, 2)]
    ranges = collect_ranges(path, feeds, tensors=tensors)
    assert set(ranges) == set(tensors)


def test_int8_activations_keep_the_pair_on_the_conv_and_the_add_float(residual_case):
    """The symmetric form (TensorRT's) is unchanged: Q(Relu(y)) != Q(y) with an int8 zero
    point of 0, so the pair stays on the Conv's output, and no Add is touched."""
    proto, ranges = residual_case
    out, report = _quantized(proto, ranges, activations="int8")
    assert report.adds == []
    assert _reader_ops(out, "c1") == ["QuantizeLinear"]
    residual = next(n for n in out.graph.node if n.name == "residual2")
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    assert producers[residual.input[1]] == "Relu"  # the shortcut stays float


def test_an_add_whose_input_has_no_pair_before_it_is_refused(residual_case):
    """conv5 kept float: its output has no pair, so the second residual Add cannot read int8
    values for it and keeps reading float, with the reason --explain shows (an Add with no
    int8 input at all, a transformer's residual, is not explained)."""
    proto, ranges = residual_case
    model = import_model(proto)
    settings = QuantizeSettings(ranges, exclude=("conv5",), activations="uint8")
    ctx = PassContext(options={"quantize": settings})
    report = run_passes(model, ctx, ["quantize-qdq"]).details("quantize-qdq")
    assert report.adds == ["residual3"]
    refused = [(r.node, r.reason, r.at) for r in ctx.refusals if r.op_type == "Add"]
    assert refused == [("residual2", "input 'c5' has no Q/DQ pair before the Add", "tensor 'c5'")]
    block = import_model(transformer_block())  # residual Adds of float projections: no word
    ctx = PassContext(options={"quantize": _settings(block, activations="uint8")})
    assert run_passes(block, ctx, ["quantize-qdq"]).details("quantize-qdq").adds == []
    assert not [r for r in ctx.refusals if r.op_type == "Add"]


@pytest.mark.parametrize("rows_zero", [True, False])
def test_a_mask_is_dropped_only_where_the_weight_rows_it_zeroes_are_zero(rows_zero) -> None:
    """Mul(X, m) by a 0/1 mask read by one MatMul: its Q reads X when the weight rows where m
    is 0 are zero (the outlier split's form: the masked channels meet zero weights), never
    otherwise (they would meet real weights)."""
    rng = np.random.default_rng(7)
    mask = np.ones(16, np.float32)
    mask[[2, 9]] = 0.0
    w = _normal(rng, (16, 8), 0.3)
    if rows_zero:
        w[[2, 9]] = 0.0
    nodes = [
        oh.make_node("Mul", ["x", "m"], ["xm"], name="mask"),
        oh.make_node("MatMul", ["xm", "w"], ["y"], name="proj"),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    proto = _model(nodes, [x], [y], {"m": mask, "w": w})
    model = import_model(proto)
    ranges = {"xm": TensorRange("xm", -2.0, 2.0, 2.0 / 127, "minmax")}
    ctx = PassContext(options={"quantize": QuantizeSettings(ranges, activations="uint8")})
    run_passes(model, ctx, INT8.stages[1])  # quantize-qdq, then DCE
    out = export_model(model)
    (q,) = [n for n in out.graph.node if n.op_type == "QuantizeLinear"]
    assert q.input[0] == ("x" if rows_zero else "xm")
    assert ("Mul" in _ops(out)) is not rows_zero
    x_in = rng.uniform(-1.9, 1.9, (2, 3, 16)).astype(np.float32)  # inside the range
    x_in[..., [2, 9]] = [40.0, -40.0]  # the masked channels saturate where Q reads x
    reference = (x_in * mask) @ w
    assert np.abs(_run(out, {"x": x_in}) - reference).max() < 0.05
