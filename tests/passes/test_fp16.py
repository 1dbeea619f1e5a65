"""convert-fp16: float16 weights and compute, float32 where it is unsafe, Casts at the boundary."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import infercc.passes.fp16  # noqa: F401  (registers convert-fp16)
from infercc.passes import DEFAULT_PIPELINE, Fp16Settings, PassContext
from tests.helpers import op_counts, optimize_proto, parse, random_feeds, run_ort
from tests.zoo import image, light_path, randomize

PASSES = ["convert-fp16", "eliminate-dead-code"]
F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _with_weights(text: str, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Parse ONNX text whose graph inputs named in `weights` become initializers."""
    model = onnx.parser.parse_model(text)
    inputs = [vi for vi in model.graph.input if vi.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in weights.items())
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type.lower()}_{i}"
    onnx.checker.check_model(model, full_check=True)
    return model


def _w(*shape: int, seed: int = 0, scale: float | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = scale if scale is not None else 1.0 / np.sqrt(shape[0])
    return (rng.standard_normal(shape) * s).astype(np.float32)


def _convert(proto: onnx.ModelProto, **options) -> tuple[onnx.ModelProto, object, PassContext]:
    """convert-fp16 with its options (`fp16_io` is Fp16Settings.io)."""
    if "fp16_io" in options:
        options["io"] = options.pop("fp16_io")
    ctx = PassContext(options={"fp16": Fp16Settings(**options)})
    out, report = optimize_proto(proto, PASSES, ctx)
    return out, report, ctx


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _assert_close(original, converted, feeds=None, max_abs: float = 1e-2) -> None:
    feeds = feeds if feeds is not None else random_feeds(original)
    ref = run_ort(original, feeds)
    got = run_ort(converted, {k: v.astype(_input_dtype(converted, k)) for k, v in feeds.items()})
    assert len(ref) == len(got)
    for r, g in zip(ref, got, strict=True):
        assert r.shape == g.shape
        assert _cosine(r, g.astype(np.float32)) >= 0.999
        assert np.max(np.abs(r - g.astype(np.float32))) <= max_abs


def _input_dtype(proto: onnx.ModelProto, name: str) -> np.dtype:
    vi = next(i for i in proto.graph.input if i.name == name)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))


def _dtypes(proto: onnx.ModelProto) -> dict[str, int]:
    """Value name -> elem type, from onnx shape inference (and initializers, inputs)."""
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    g = inferred.graph
    out = {t.name: t.data_type for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        out[vi.name] = vi.type.tensor_type.elem_type
    return out


def _node(proto: onnx.ModelProto, op: str, index: int = 0) -> onnx.NodeProto:
    return [n for n in proto.graph.node if n.op_type == op][index]


def _output_dtype(proto: onnx.ModelProto, op: str, index: int = 0) -> int:
    return _dtypes(proto)[_node(proto, op, index).output[0]]


def _reasons(ctx: PassContext) -> dict[str, str]:
    return {r.node: r.reason for r in ctx.refusals if r.pass_name == "convert-fp16"}


MLP = """
<ir_version: 8, opset_import: ["" : 17]>
mlp (float[N, 16] X, float[16, 32] W1, float[32] B1, float[32, 24] W2, float[24] B2,
     float[24, 8] W3) => (float[N, 8] Y) {
    h = MatMul (X, W1)
    hb = Add (h, B1)
    r = Relu (hb)
    g = Gemm <transB = 0> (r, W2, B2)
    p = Softmax <axis = 1> (g)
    Y = MatMul (p, W3)
}
"""


def _mlp() -> onnx.ModelProto:
    weights = {
        "W1": _w(16, 32, seed=1),
        "B1": _w(32, seed=2, scale=0.1),
        "W2": _w(32, 24, seed=3),
        "B2": _w(24, seed=4, scale=0.1),
        "W3": _w(24, 8, seed=5),
    }
    return _with_weights(MLP, weights)


def test_mlp_converts_with_casts_only_at_the_boundary():
    original = _mlp()
    out, report, ctx = _convert(original)
    counts = op_counts(out)
    # X -> fp16, Gemm -> fp32 before Softmax, Softmax -> fp16, MatMul -> fp32 for Y.
    assert counts == {"MatMul": 2, "Add": 1, "Relu": 1, "Gemm": 1, "Softmax": 1, "Cast": 4}
    stats = report.passes["convert-fp16"].counts
    assert stats == {"nodes_fp16": 5, "nodes_fp32_kept": 1, "casts": 4, "weights_converted": 5}
    assert {t.data_type for t in out.graph.initializer} == {F16}
    assert len(out.graph.initializer) == 5
    softmax = _node(out, "Softmax")
    casts = {n.output[0]: n for n in out.graph.node if n.op_type == "Cast"}
    assert softmax.input[0] in casts and casts[softmax.input[0]].attribute[0].i == F32
    assert _dtypes(out)[softmax.output[0]] == F32
    assert _output_dtype(out, "Gemm") == F16 and _output_dtype(out, "Relu") == F16
    assert [o.name for o in out.graph.output] == ["Y"]
    assert out.graph.output[0].type.tensor_type.elem_type == F32
    assert out.graph.input[0].type.tensor_type.elem_type == F32
    assert "Softmax stays fp32 (numerically risky" in _reasons(ctx)[softmax.name]
    summary = report.details("convert-fp16")
    assert summary.converted == 5
    assert [k["op"] for k in summary.kept_fp32] == ["Softmax"]
    _assert_close(original, out, random_feeds(original, dims=5))


CONVNET = """
<ir_version: 8, opset_import: ["" : 17]>
convnet (float[N, 3, 16, 16] X, float[8, 3, 3, 3] W, float[8] B, float[8, 8, 3, 3] W2,
         float[10, 8] G, float[10] C) => (float[N, 10] Y) {
    c = Conv <pads = [1, 1, 1, 1]> (X, W, B)
    r = Relu (c)
    m = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r)
    c2 = Conv <pads = [1, 1, 1, 1]> (m, W2)
    r2 = Relu (c2)
    p = GlobalAveragePool (r2)
    f = Flatten (p)
    Y = Gemm <transB = 1> (f, G, C)
}
"""


def _convnet() -> onnx.ModelProto:
    weights = {
        "W": _w(8, 3, 3, 3, seed=1, scale=0.3),
        "B": _w(8, seed=2, scale=0.1),
        "W2": _w(8, 8, 3, 3, seed=3, scale=0.2),
        "G": _w(10, 8, seed=4, scale=0.5),
        "C": _w(10, seed=5, scale=0.1),
    }
    return _with_weights(CONVNET, weights)


def test_conv_net_converts():
    original = _convnet()
    out, report, ctx = _convert(original)
    counts = op_counts(out)
    assert counts["Cast"] == 2 and counts["Conv"] == 2 and counts["Gemm"] == 1
    assert report.passes["convert-fp16"].counts["nodes_fp16"] == 8
    assert report.passes["convert-fp16"].counts["nodes_fp32_kept"] == 0
    assert {t.data_type for t in out.graph.initializer} == {F16}
    assert all(_dtypes(out)[n.output[0]] == F16 for n in out.graph.node if n.op_type != "Cast")
    assert out.graph.output[0].type.tensor_type.elem_type == F32
    assert not _reasons(ctx)
    _assert_close(original, out)


def test_fp16_io_gives_fp16_inputs_and_outputs():
    original = _convnet()
    out, report, _ = _convert(original, fp16_io=True)
    assert "Cast" not in op_counts(out)
    assert out.graph.input[0].type.tensor_type.elem_type == F16
    assert out.graph.output[0].type.tensor_type.elem_type == F16
    # Dimension names survive the retyping.
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    feeds = random_feeds(original)
    assert run_ort(out, {"X": feeds["X"].astype(np.float16)})[0].dtype == np.float16
    _assert_close(original, out, feeds)


def test_fp16_io_with_a_float32_output_casts_it():
    original = _mlp()
    model = onnx.ModelProto()
    model.CopyFrom(original)
    model.graph.output.append(onnx.helper.make_tensor_value_info("p", F32, ["N", 24]))
    out, _, _ = _convert(model, fp16_io=True)
    assert [o.name for o in out.graph.output] == ["Y", "p"]
    assert all(o.type.tensor_type.elem_type == F16 for o in out.graph.output)
    assert _dtypes(out)[_node(out, "Softmax").output[0]] == F32
    _assert_close(model, out)


def test_keep_list_by_op_type_and_by_node_name():
    original = _mlp()
    original.graph.node[3].name = "the_gemm"
    out, report, ctx = _convert(original, keep_fp32=["Relu", "the_gemm"])
    assert _output_dtype(out, "Relu") == F32
    assert _output_dtype(out, "Gemm") == F32
    assert _output_dtype(out, "Add") == F16
    reasons = _reasons(ctx)
    assert reasons["the_gemm"] == "in the keep list"
    assert sum(r == "in the keep list" for r in reasons.values()) == 2
    stats = report.passes["convert-fp16"].counts
    assert stats["nodes_fp32_kept"] == 3 and stats["nodes_fp16"] == 3
    # The kept Gemm reads its float32 weights as they were.
    gemm = _node(out, "Gemm")
    inits = {t.name: t.data_type for t in out.graph.initializer}
    assert inits[gemm.input[1]] == F32 and inits[gemm.input[2]] == F32
    _assert_close(original, out)


def test_overflowing_weight_keeps_its_reader_fp32():
    w1 = _w(16, 32, seed=1)
    w1[3, 5] = 1.0e5
    weights = {"W1": w1, "B1": _w(32, seed=2), "W2": _w(32, 24, seed=3)}
    weights |= {"B2": _w(24, seed=4), "W3": _w(24, 8, seed=5)}
    original = _with_weights(MLP, weights)
    out, report, ctx = _convert(original)
    mm = _node(out, "MatMul", 0)
    assert _dtypes(out)[mm.output[0]] == F32
    assert {t.name: t.data_type for t in out.graph.initializer}["W1"] == F32
    reason = _reasons(ctx)[mm.name]
    assert reason == "weight 'W1' overflows fp16 (max 100000)"
    assert _output_dtype(out, "Add") == F16
    feeds = random_feeds(original, seed=3)
    ref, got = run_ort(original, feeds)[0], run_ort(out, feeds)[0]
    assert np.all(np.isfinite(got)) and _cosine(ref, got) >= 0.999


def test_calibrated_range_overflow_keeps_producer_and_readers_fp32():
    original = _mlp()
    out, _, ctx = _convert(original, ranges={"hb": (-1.0, 7.0e4), "r": (0.0, 3.0)})
    assert _output_dtype(out, "Add") == F32  # produces hb
    assert _output_dtype(out, "Relu") == F32  # reads hb
    assert _output_dtype(out, "MatMul", 0) == F16
    assert _output_dtype(out, "Gemm") == F16
    reasons = _reasons(ctx)
    add, relu = _node(out, "Add"), _node(out, "Relu")
    assert reasons[add.name] == "tensor 'hb' overflows fp16 (calibrated range [-1, 70000])"
    assert reasons[relu.name].startswith("tensor 'hb' overflows fp16")
    _assert_close(original, out)


SHARED = """
<ir_version: 8, opset_import: ["" : 17]>
shared (float[4, 16] X, float[16, 16] W) => (float[4, 16] Y) {
    a = MatMul (X, W)
    r = Relu (a)
    b = MatMul (r, W)
    Y = Add (b, a)
}
"""


def test_weight_shared_by_fp16_and_fp32_readers_gets_two_constants():
    original = _with_weights(SHARED, {"W": _w(16, 16, seed=7)})
    original.graph.node[2].name = "kept_matmul"
    out, report, ctx = _convert(original, keep_fp32=["kept_matmul"])
    inits = {t.name: t.data_type for t in out.graph.initializer}
    assert inits == {"W": F32, "W_fp16": F16}
    first, second = _node(out, "MatMul", 0), _node(out, "MatMul", 1)
    assert first.input[1] == "W_fp16" and second.input[1] == "W"
    assert report.passes["convert-fp16"].counts["weights_converted"] == 1
    # `a` is read by the fp16 Add and the fp16 Relu: no cast; `r` is cast back once.
    assert op_counts(out)["Cast"] == 4  # X->16, r->32, b->16, Y->32
    _assert_close(original, out)


INTEGER = """
<ir_version: 8, opset_import: ["" : 17]>
ints (float[N, 4, 6] X, float[24, 5] W) => (float[N, 5] Y, int64[2] S) {
    shape = Shape (X)
    zero = Constant <value = int64[1] {0}> ()
    n = Gather <axis = 0> (shape, zero)
    k = Constant <value = int64[1] {24}> ()
    S = Concat <axis = 0> (n, k)
    flat = Reshape (X, S)
    Y = MatMul (flat, W)
}
"""


def test_integer_ops_are_untouched():
    original = _with_weights(INTEGER, {"W": _w(24, 5, seed=3)})
    out, report, ctx = _convert(original)
    types = _dtypes(out)
    assert types["shape"] == TensorProto.INT64 and types["S"] == TensorProto.INT64
    assert types[_node(out, "Reshape").output[0]] == F16
    assert out.graph.output[1].type.tensor_type.elem_type == TensorProto.INT64
    reasons = _reasons(ctx)
    # integer nodes are not "kept in float32": they have nothing to convert and no reason
    assert _node(out, "Gather").name not in reasons and _node(out, "Concat").name not in reasons
    # Shape reads X as it is; only Reshape's data input is cast; MatMul's output is cast back.
    assert op_counts(out)["Cast"] == 2
    stats = report.passes["convert-fp16"].counts
    assert stats["nodes_fp16"] == 2 and stats["nodes_fp32_kept"] == 0
    feeds = random_feeds(original)
    ref, got = run_ort(original, feeds), run_ort(out, feeds)
    np.testing.assert_array_equal(ref[1], got[1])
    assert _cosine(ref[0], got[0]) >= 0.999


LAYERNORM = """
<ir_version: 8, opset_import: ["" : 17]>
ln (float[N, 16] X, float[16, 16] W, float[16] G, float[16] B) => (float[N, 16] Y) {
    h = MatMul (X, W)
    n = LayerNormalization <axis = -1> (h, G, B)
    Y = Relu (n)
}
"""


def test_layer_normalization_stays_fp32():
    weights = {"W": _w(16, 16, seed=1), "G": _w(16, seed=2), "B": _w(16, seed=3)}
    original = _with_weights(LAYERNORM, weights)
    out, _, ctx = _convert(original)
    ln = _node(out, "LayerNormalization")
    types = _dtypes(out)
    assert types[ln.output[0]] == F32 and types[ln.input[0]] == F32
    assert types["G"] == F32 and types["B"] == F32
    assert _output_dtype(out, "MatMul") == F16 and _output_dtype(out, "Relu") == F16
    assert _reasons(ctx)[ln.name].startswith("LayerNormalization stays fp32 (accumulates")
    _assert_close(original, out)


def test_second_run_changes_nothing():
    once, _, _ = _convert(_mlp())
    twice, report, _ = _convert(once)
    stats = report.passes["convert-fp16"]
    assert stats.changed == 0 and not any(stats.counts.values())
    assert twice.SerializeToString() == once.SerializeToString()
    io_once, _, _ = _convert(_convnet(), fp16_io=True)
    io_twice, report, _ = _convert(io_once, fp16_io=True)
    assert report.passes["convert-fp16"].changed == 0
    assert io_twice.SerializeToString() == io_once.SerializeToString()


FUSABLE = """
<ir_version: 8, opset_import: ["" : 17]>
fused (float[1, 3, 12, 12] X, float[8, 3, 3, 3] W, float[8, 8, 3, 3] W2) => (float[1, 8, 8, 8] Y) {
    c = Conv (X, W)
    r = Relu (c)
    Y = Conv (r, W2)
}
"""


def test_fused_conv_of_com_microsoft_stays_fp32():
    weights = {"W": _w(8, 3, 3, 3, seed=1, scale=0.3), "W2": _w(8, 8, 3, 3, seed=2, scale=0.2)}
    original = _with_weights(FUSABLE, weights)
    ctx = PassContext(target="cpu")
    passes = ["fuse-conv-activation", *PASSES]
    out, report = optimize_proto(original, passes, ctx)
    fused = next(n for n in out.graph.node if n.op_type == "FusedConv")
    assert fused.domain == "com.microsoft"
    assert fused.input[0] == "X"  # graph input read as float32, no Cast
    assert {t.name: t.data_type for t in out.graph.initializer}["W"] == F32
    reason = _reasons(ctx)[fused.name]
    assert reason.startswith("non-standard domain 'com.microsoft'")
    conv = _node(out, "Conv")
    casts = {n.output[0]: n for n in out.graph.node if n.op_type == "Cast"}
    assert conv.input[0] in casts and casts[conv.input[0]].input[0] == fused.output[0]
    assert conv.input[1] == "W2_fp16"
    assert op_counts(out)["Cast"] == 2
    _assert_close(original, out)


CONTROL = """
<ir_version: 8, opset_import: ["" : 17]>
ctrl (float[4, 8] X, bool cond, float[8, 8] W) => (float[4, 8] Y) {
    h = MatMul (X, W)
    r = Relu (h)
    Y = If (cond) <
        then_branch = t () => (float[4, 8] o1) { o1 = Neg (r) },
        else_branch = e () => (float[4, 8] o2) { o2 = Identity (r) }
    >
}
"""


def test_control_flow_and_its_subgraphs_stay_fp32():
    original = _with_weights(CONTROL, {"W": _w(8, 8, seed=4)})
    out, _, ctx = _convert(original)
    if_node = _node(out, "If")
    reads = {n.input[0] for a in if_node.attribute for n in a.g.node}
    assert len(reads) == 1
    cast = next(n for n in out.graph.node if n.op_type == "Cast" and n.output[0] in reads)
    assert cast.input[0] == "r" and cast.attribute[0].i == F32
    assert _reasons(ctx)[if_node.name].startswith("control flow (If)")
    assert all(n.op_type != "Cast" for a in if_node.attribute for n in a.g.node)
    for cond in (True, False):
        feeds = random_feeds(original)
        feeds["cond"] = np.array(cond)
        _assert_close(original, out, feeds)


REGION_CAST = """
<ir_version: 8, opset_import: ["" : 17]>
rc (float[4, 8] X, float[8] B) => (float[4, 8] Y) {
    r = Relu (X)
    s = Shape (r)
    c = ConstantOfShape <value = float[1] {0.5}> (s)
    f = Cast <to = 1> (r)
    a = Add (f, c)
    Y = Add (a, B)
}
"""


def test_cast_to_float_and_constant_of_shape_inside_the_region():
    original = _with_weights(REGION_CAST, {"B": _w(8, seed=3)})
    out, _, _ = _convert(original)
    types = _dtypes(out)
    cos = _node(out, "ConstantOfShape")
    assert types[cos.output[0]] == F16
    value = next(a for a in cos.attribute if a.name == "value").t
    assert value.data_type == F16
    assert _node(out, "Shape").input[0] == "r"  # Shape reads float16 as it is
    own_cast = next(n for n in out.graph.node if n.op_type == "Cast" and n.output[0] == "f")
    assert own_cast.input[0] == "r"  # the model's Cast is the boundary back to float32
    assert types["f"] == F32 and types[_node(out, "Add").output[0]] == F16
    _assert_close(original, out)


RESIZE = """
<ir_version: 8, opset_import: ["" : 17]>
rs (float[1, 2, 4, 4] X, float[8] R, float[4] S) => (float[1, 2, 8, 8] Y) {
    r = Relu (X)
    Y = Resize <mode = "linear"> (r, R, S)
}
"""


def test_resize_roi_and_scales_stay_fp32():
    scales = np.array([1, 1, 2, 2], np.float32)
    roi = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32)
    original = _with_weights(RESIZE, {"R": roi, "S": scales})
    out, _, _ = _convert(original)
    resize = _node(out, "Resize")
    types = _dtypes(out)
    assert resize.input[1] == "R" and types["R"] == F32
    assert resize.input[2] == "S" and types["S"] == F32
    assert types[resize.input[0]] == F16
    _assert_close(original, out)


GELU = """
<ir_version: 8, opset_import: ["" : 17]>
gelu (float[N, 16] X, float[16, 16] W, float S, float One, float Half, float Lo, float Hi)
    => (float[N, 16] Y) {
    h = MatMul (X, W)
    d = Div (h, S)
    e = Erf (d)
    a = Add (e, One)
    m = Mul (h, a)
    g = Mul (m, Half)
    Y = Clip (g, Lo, Hi)
}
"""


def test_erf_converts_and_clip_bounds_saturate():
    f32 = np.float32
    weights = {"W": _w(16, 16, seed=2), "S": np.array(np.sqrt(2), f32), "One": f32(1.0)}
    weights |= {"Half": f32(0.5), "Lo": np.array(-3.0e38, f32), "Hi": np.array(6.0, f32)}
    original = _with_weights(GELU, weights)
    out, report, ctx = _convert(original)
    assert _output_dtype(out, "Erf") == F16 and _output_dtype(out, "Clip") == F16
    stats = report.passes["convert-fp16"].counts
    assert stats["nodes_fp16"] == 7 and stats["nodes_fp32_kept"] == 0
    assert op_counts(out)["Cast"] == 2
    lo = next(t for t in out.graph.initializer if t.name == _node(out, "Clip").input[1])
    assert numpy_helper.to_array(lo) == -np.inf  # -inf clips float16 exactly like -3e38
    assert not _reasons(ctx)
    _assert_close(original, out)


def _after_default_pipeline(name: str, convs: int, initializer_types: set[int]) -> None:
    """A randomized zoo model through the default pipeline and convert-fp16: every Conv kept
    (BatchNormalization folded), only the final Softmax in float32, float32 at the edges, and
    outputs as close to the original's as rounding the weights alone makes them."""
    original = randomize(onnx.load(light_path(name)))
    ctx = PassContext(portable=True)
    ctx.verify = True
    out, report = optimize_proto(original, [*DEFAULT_PIPELINE, "convert-fp16"], ctx)
    counts = op_counts(out)
    stats = report.passes["convert-fp16"].counts
    assert counts["Conv"] == convs and counts["BatchNormalization"] == 0
    assert stats["nodes_fp32_kept"] == 1  # the final Softmax
    # The input to float16, the logits back to float32 (one Cast, read by the Softmax and
    # carrying the logits output's name).
    assert counts["Cast"] == 2
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    assert stats["weights_converted"] >= convs
    assert {t.data_type for t in out.graph.initializer} == initializer_types
    feeds = image(original)
    (ref_p, ref_l), (got_p, got_l) = run_ort(original, feeds), run_ort(out, feeds)
    assert got_p.dtype == np.float32 and got_l.dtype == np.float32
    assert _cosine(ref_l, got_l) >= 0.999
    assert np.argmax(ref_p) == np.argmax(got_p)
    # The probabilities of this random network are nearly uniform, so the softmax magnifies
    # the logits' error: cosine 0.9986 here. That is the error of rounding the weights alone:
    # the float32 model with its weights rounded to float16 gives the same outputs.
    assert _cosine(ref_p, got_p) >= 0.998
    rounded, _ = optimize_proto(original, list(DEFAULT_PIPELINE), PassContext(portable=True))
    for t in rounded.graph.initializer:
        if t.data_type == F32:
            a = numpy_helper.to_array(t).astype(np.float16).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    for r, g in zip(run_ort(rounded, feeds), (got_p, got_l), strict=True):
        assert _cosine(r, g) >= 0.99999


def test_shufflenet_after_default_pipeline():
    """The fast sibling of the ResNet-50 case below: the same path on ShuffleNet (49 Convs,
    grouped, with their BatchNormalizations; 0.7 s here against ResNet-50's 5 s)."""
    _after_default_pipeline("shufflenet", 49, {F16, TensorProto.INT64})


@pytest.mark.slow
def test_resnet50_after_default_pipeline():
    _after_default_pipeline("resnet50", 53, {F16, TensorProto.INT64})


@pytest.mark.parametrize("option", [{}, {"fp16_io": True}])
def test_converted_models_pass_the_full_checker(option):
    out, _, _ = _convert(_mlp(), **option)
    onnx.checker.check_model(out, full_check=True)
    assert parse(onnx.printer.to_text(out)) is not None
