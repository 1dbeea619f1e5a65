"""int4 weight-only forms against a numpy dequantize-then-matmul reference, under onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.errors import InferccError
from infercc.ir import export_model, import_model
from infercc.passes.quantize_int4 import (
    Int4Options,
    block_view,
    check_block_size,
    pack_nibbles,
    quantize_int4,
    quantize_rtn,
    unpack_nibbles,
    weight_error,
)
from tests.helpers import make_model


def _model(nodes, inputs, outputs, weights, opset=21) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(a, n) for n, a in weights.items()]
    graph = oh.make_graph(nodes, "g", inputs, outputs, inits)
    model = make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def matmul_model(k: int, n: int, seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", n])
    node = oh.make_node("MatMul", ["x", "w"], ["y"], name="proj")
    return _model([node], [x], [y], {"w": w}), w


def gemm_model(k: int, n: int, trans_b: int) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])
    stored = w.T.copy() if trans_b else w
    node = oh.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=trans_b)
    return _model([node], [x], [y], {"w": stored, "b": b}), w, b


def run(proto: onnx.ModelProto, feeds: dict, optimize: bool = False) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def quantized(proto: onnx.ModelProto, **options) -> tuple[onnx.ModelProto, object]:
    ir = import_model(proto)
    report = quantize_int4(ir, Int4Options(**options))
    out = export_model(ir)
    onnx.checker.check_model(out)
    return out, report


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# --------------------------------------------------------------------------- the numbers


@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_codes_and_reconstruction(symmetric):
    w = np.random.default_rng(0).standard_normal((100, 7)).astype(np.float32)
    blocks = quantize_rtn(w, 32, symmetric)
    assert blocks.codes.shape == (7, 4, 32) and blocks.codes.max() <= 15
    assert blocks.scales.shape == blocks.zero_points.shape == (7, 4)
    if symmetric:
        assert (blocks.zero_points == 8).all()
    # every weight within half a step (asymmetric), or a step at the clipped +8 (symmetric)
    step = np.abs(blocks.scales).repeat(32, axis=1)[:, :100].T
    bound = 1.0 if symmetric else 0.5
    assert (np.abs(blocks.dequantize() - w) <= bound * step + 1e-6).all()
    assert 0.0 < weight_error(w, blocks) < 0.15
    # the padding dequantizes to 0
    padded = block_view(w, 32).reshape(7, -1)
    assert (padded[:, 100:] == 0).all()


def test_symmetric_largest_magnitude_is_exact():
    w = np.array([[0.5], [-2.0], [1.0], [0.25]] * 4, np.float32)
    blocks = quantize_rtn(w, 16, True)
    assert blocks.dequantize()[1, 0] == pytest.approx(-2.0)
    assert blocks.codes[0, 0, 1] == 0  # -8 steps


def test_nibble_packing_round_trip():
    codes = np.random.default_rng(3).integers(0, 16, (5, 9), dtype=np.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (5, 5)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 1] << 4)
    assert (unpack_nibbles(packed, 9) == codes).all()


@pytest.mark.parametrize("size", [0, 8, 24, 48, 512])
def test_bad_block_sizes(size):
    with pytest.raises(InferccError, match="power of two"):
        check_block_size(size)


# --------------------------------------------------------------------------- the forms


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("k", [96, 100])
@pytest.mark.parametrize("form", ["nbits", "dq"])
def test_forms_match_numpy_reference(form, k, symmetric, block_size):
    proto, w = matmul_model(k, 24)
    out, report = quantized(proto, form=form, symmetric=symmetric, block_size=block_size)
    assert report.quantized == ["proj"]
    ops = Counter(n.op_type for n in out.graph.node)
    if form == "nbits":
        assert ops == {"MatMulNBits": 1}
        node = out.graph.node[0]
        assert node.domain == "com.microsoft"
        assert len(node.input) == (3 if symmetric else 4)
    else:
        assert ops == {"DequantizeLinear": 1, "MatMul": 1}
        kinds = {t.data_type for t in out.graph.initializer}
        assert (TensorProto.INT4 if symmetric else TensorProto.UINT4) in kinds
    assert "w" not in {t.name for t in out.graph.initializer}
    reference = quantize_rtn(w, block_size, symmetric).dequantize()
    for shape in [(1, 1, k), (2, 5, k)]:  # symbolic batch and sequence at two shapes
        x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
        got = run(out, {"x": x})
        assert got.shape == (*shape[:2], 24)
        assert rel_err(got, x @ reference) < 1e-5
        assert rel_err(got, x @ w) < 0.2  # and near the float model


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("form", ["nbits", "dq"])
def test_gemm(form, trans_b):
    proto, w, b = gemm_model(64, 10, trans_b)
    out, report = quantized(proto, form=form, symmetric=False)
    assert report.quantized == ["fc"]
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops == ({"MatMulNBits": 1} if form == "nbits" else {"DequantizeLinear": 1, "Gemm": 1})
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    reference = x @ quantize_rtn(w, 32, False).dequantize() + b
    assert rel_err(run(out, {"x": x}), reference) < 1e-5


@pytest.mark.parametrize("form", ["nbits", "dq"])
def test_a_matmuls_bias_add_becomes_matmulnbits_bias(form):
    """MatMul then Add of a constant [N] (a q/k/v projection's bias): MatMulNBits takes the bias
    as its input 5 and the Add goes; the standard form keeps the Add. Same result as the int4
    weight and the bias, at two shapes of the symbolic batch and sequence."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 24)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 24])
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["m"], name="proj"),
        oh.make_node("Add", ["b", "m"], ["y"], name="bias"),
    ]
    out, report = quantized(_model(nodes, [x], [y], {"w": w, "b": b}), form=form)
    assert report.quantized == ["proj"]
    ops = Counter(n.op_type for n in out.graph.node)
    if form == "nbits":
        assert ops == {"MatMulNBits": 1}
        (node,) = out.graph.node
        assert len(node.input) == 6 and node.input[4] == "" and node.output[0] == "y"
        assert "b" not in {t.name for t in out.graph.initializer}
    else:
        assert ops == {"DequantizeLinear": 1, "MatMul": 1, "Add": 1}
    reference = quantize_rtn(w, 32, False).dequantize()
    for shape in [(1, 1, 64), (2, 5, 64)]:
        xs = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
        assert rel_err(run(out, {"x": xs}), xs @ reference + b) < 1e-5


def test_onnxruntime_turns_blocked_dq_into_matmulnbits():
    """Optimized, onnxruntime fuses DQ + MatMul into MatMulNBits (int8 compute by default):
    close to the exact result, not equal."""
    proto, w = matmul_model(64, 16)
    out, _ = quantized(proto, form="dq")
    x = np.random.default_rng(7).standard_normal((1, 3, 64)).astype(np.float32)
    exact = x @ quantize_rtn(w, 32, False).dequantize()
    assert 0 < rel_err(run(out, {"x": x}, optimize=True), exact) < 0.05


def test_accuracy_level_attribute_and_effect():
    proto, w = matmul_model(128, 32)
    exact, _ = quantized(proto, accuracy_level=0)
    int8, _ = quantized(proto, accuracy_level=4)
    attrs = {a.name: a.i for a in int8.graph.node[0].attribute}
    assert attrs["accuracy_level"] == 4
    assert "accuracy_level" not in {a.name for a in exact.graph.node[0].attribute}
    x = np.random.default_rng(7).standard_normal((1, 4, 128)).astype(np.float32)
    reference = x @ quantize_rtn(w, 32, False).dequantize()
    assert rel_err(run(exact, {"x": x}), reference) < 1e-5
    assert 1e-5 < rel_err(run(int8, {"x": x}), reference) < 0.05


def embedding_model() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 64)).astype(np.float32)
    w = rng.standard_normal((64, 50)).astype(np.float32)
    ids = oh.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    logits = oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 50])
    nodes = [
        oh.make_node("Gather", ["table", "ids"], ["h"], name="embed"),
        oh.make_node("MatMul", ["h", "w"], ["logits"], name="lm_head"),
    ]
    return _model(nodes, [ids], [logits], {"table": table, "w": w}), table, w


def test_embedding_and_lm_head():
    proto, table, w = embedding_model()
    out, report = quantized(proto, symmetric=False, embeddings=True)
    assert report.embeddings == ["embed"] and report.quantized == ["lm_head"]
    assert Counter(n.op_type for n in out.graph.node) == {
        "GatherBlockQuantized": 1,
        "MatMulNBits": 1,
    }
    ids = np.array([[0, 3, 49, 7]], np.int64)
    t_q = quantize_rtn(table.T, 32, False).dequantize().T
    expected = t_q[ids] @ quantize_rtn(w, 32, False).dequantize()
    assert rel_err(run(out, {"ids": ids}), expected) < 1e-5
    # both configurable
    kept, report = quantized(proto, embeddings=False, lm_head=False)
    assert report.quantized == [] and report.embeddings == []
    assert "LM head" in report.kept_float["lm_head"]
    assert "--embeddings makes it int4" in report.kept_float["embed"]
    assert Counter(n.op_type for n in kept.graph.node) == {"Gather": 1, "MatMul": 1}


def test_portable_keeps_embeddings_float_and_says_why():
    proto, _table, _w = embedding_model()
    out, report = quantized(proto, form="dq")
    assert "no block-quantized Gather" in report.kept_float["embed"]
    assert {n.domain for n in out.graph.node} == {""}


def test_reasons_for_float_nodes():
    rng = np.random.default_rng(0)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 64])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["a"], name="kept"),
        oh.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["a", "at"], ["s"], name="scores"),
        oh.make_node("MatMul", ["s", "w3"], ["y"], name="batched"),
    ]
    weights = {
        "w": rng.standard_normal((64, 64)).astype(np.float32),
        "w3": rng.standard_normal((2, 4, 8)).astype(np.float32),
    }
    proto = _model(nodes, [x], [y], weights)
    _out, report = quantized(proto, exclude=("kept",))
    assert report.kept_float == {
        "kept": "excluded by the user",
        "scores": "its weight is not a constant (a MatMul of two activations)",
        "batched": "its weight has rank 3, not 2 (a batched MatMul)",
    }


def test_shared_weight_quantized_per_reader_and_float_copy_dropped():
    proto, w = matmul_model(64, 16)
    graph = proto.graph
    graph.node.append(oh.make_node("MatMul", ["x", "w"], ["y2"], name="proj2"))
    graph.output.append(oh.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", "seq", 16]))
    out, report = quantized(proto)
    assert sorted(report.quantized) == ["proj", "proj2"]
    assert "w" not in {t.name for t in out.graph.initializer}
    x = np.ones((1, 1, 64), np.float32)
    assert np.allclose(run(out, {"x": x}), x @ quantize_rtn(w, 32, False).dequantize(), atol=1e-4)


# --------------------------------------------------------------------------- the pass


def _three_projections() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    names = ("p0", "p1", "p2")
    nodes = [
        oh.make_node("MatMul", [src, f"w{i}"], [dst], name=names[i])
        for i, (src, dst) in enumerate((("x", "a"), ("a", "b"), ("b", "y")))
    ]
    weights = {f"w{i}": rng.standard_normal((64, 64)).astype(np.float32) for i in range(3)}
    return _model(nodes, [x], [y], weights)


def test_quantize_int4_is_a_pass_whose_float_nodes_are_refusals():
    """quantize-int4 through the pass manager: its counts in the pipeline report, every weight
    kept float a refusal (what --explain lists) with the report's reason."""
    from infercc.passes import Int4Settings, PassContext, run_passes
    from infercc.passes.pipelines import INT4

    ir = import_model(_three_projections())
    ctx = PassContext(options={"int4": Int4Settings(Int4Options(exclude=("p1",)))}, verify=True)
    report = run_passes(ir, ctx, INT4.passes)
    assert report.passes["quantize-int4"].counts == {
        "quantized": 2,
        "embeddings": 0,
        "kept_float": 1,
    }
    assert [(r.pass_name, r.node, r.reason) for r in ctx.refusals] == [
        ("quantize-int4", "p1", "excluded by the user")
    ]
    assert report.details("quantize-int4").quantized == ["p0", "p2"]
    assert Counter(n.op_type for n in ir.graph) == {"MatMulNBits": 2, "MatMul": 1}


def test_quantize_int4_honours_a_rewrite_limit():
    """A bisection's rewrite limit stops the pass after that many weights; the rest stay float
    and say why, and the model still computes the same as the float one at the float nodes."""
    from infercc.passes import Int4Settings, PassContext, run_passes

    ir = import_model(_three_projections())
    settings = Int4Settings(Int4Options())
    ctx = PassContext(options={"int4": settings}, rewrite_limits={"quantize-int4": 1})
    details = run_passes(ir, ctx, ["quantize-int4"]).details("quantize-int4")
    assert details.quantized == ["p0"]
    assert set(details.kept_float) == {"p1", "p2"}
    assert all("rewrite limit" in r for r in details.kept_float.values())
    out = export_model(ir)
    onnx.checker.check_model(out)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)}
    full, _ = quantized(_three_projections())
    assert not np.allclose(run(out, feeds), run(full, feeds))  # two fewer int4 weights


def test_quantize_int4_without_its_options_is_an_error():
    from infercc.passes import PassContext, run_passes

    with pytest.raises(InferccError, match="quantize-int4 needs its options"):
        run_passes(import_model(_three_projections()), PassContext(), ["quantize-int4"])


def test_refusals_name_the_input_where_the_weight_failed():
    """A node kept float is its rule's NoMatch(reason, at=...): the refusal names the input
    that failed (a weight of rank 3, a Gemm's C that is no bias), as --explain shows it."""
    from infercc.passes import Int4Settings, PassContext, run_passes

    rng = np.random.default_rng(0)
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 32])
    nodes = [
        oh.make_node("Gemm", ["x", "w", "c"], ["g"], name="gemm"),
        oh.make_node("MatMul", ["g", "batched"], ["y"], name="bmm"),
    ]
    weights = {
        "w": rng.standard_normal((64, 32)).astype(np.float32),
        "c": rng.standard_normal((4, 32)).astype(np.float32),  # a [M, N] C: no bias of N
        "batched": rng.standard_normal((2, 32, 32)).astype(np.float32),
    }
    ir = import_model(_model(nodes, [x], [y], weights))
    ctx = PassContext(options={"int4": Int4Settings(Int4Options())})
    details = run_passes(ir, ctx, ["quantize-int4"]).details("quantize-int4")
    assert details.quantized == []
    got = {r.node: (r.reason, r.at) for r in ctx.refusals}
    assert got == {
        "gemm": ("Gemm whose C of shape [4, 32] is not a bias of 32", "tensor 'c'"),
        "bmm": ("its weight has rank 3, not 2 (a batched MatMul)", "tensor 'batched'"),
    }
    assert details.kept_float == {name: reason for name, (reason, _) in got.items()}
