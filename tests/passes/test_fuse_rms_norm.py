"""fuse-rms-norm: RMSNorm (+ its residual Add) into one normalization op, exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.ir import export_model, import_model
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes
from tests.decoders import greedy_reference, tiny_decoder
from tests.helpers import make_model, op_counts, run_ort

D = 64
EPS = 1e-6
# (batch, sequence): a prefill shape and a decode shape.
SHAPES = [(1, 7), (2, 1)]


def _c(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def rms_model(
    form: str = "torchscript",
    residual: bool = False,
    cast: bool = False,
    opset: int = 17,
    dtype: int = TensorProto.FLOAT,
    eps: float = EPS,
    weight_shape=(D,),
    mean_is_output: bool = False,
    weight: bool = True,
) -> onnx.ModelProto:
    """One RMSNorm over [batch, seq, D] (ReduceMean's axes an attribute below opset 18, an
    input from 18): `form` "torchscript" writes torch.rsqrt as TorchScript does: Pow(x, 2),
    ReduceMean, Add(m, eps), Sqrt, Div(1, s), Mul(x, r), Mul(n, w); "dynamo" as the dynamo
    exporter does: Reciprocal(s), Mul(r, x); "div" the Div form: Mul(x, x), ReduceMean,
    Add(eps, m), Sqrt, Div(x, s), Mul(w, n). `residual`: x is
    Add(a, b), and the sum is also read by the output `h` (the residual stream). `cast`:
    transformers' Cast to float32 and back around the normalization."""
    np_dtype = np.float32 if dtype == TensorProto.FLOAT else np.float16
    rng = np.random.default_rng(0)
    inits = [
        _c("w", (1.0 + 0.1 * rng.standard_normal(weight_shape)).astype(np_dtype)),
        _c("eps", np.array(eps, np.float32)),
        _c("two", np.array(2.0, np.float32)),
        _c("one", np.array(1.0, np.float32)),
        _c("axes", np.array([-1], np.int64)),
    ]
    nodes = []
    x = "a"
    if residual:
        nodes.append(oh.make_node("Add", ["a", "b"], ["x0"]))
        x = "x0"
    if cast:
        nodes.append(oh.make_node("Cast", [x], ["xf"], to=TensorProto.FLOAT))
        x = "xf"
    if form != "div":
        nodes.append(oh.make_node("Pow", [x, "two"], ["sq"]))
    else:
        nodes.append(oh.make_node("Mul", [x, x], ["sq"]))
    if opset < 18:
        nodes.append(oh.make_node("ReduceMean", ["sq"], ["m"], axes=[-1], keepdims=1))
    else:
        nodes.append(oh.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=1))
    add_in = ["eps", "m"] if form == "div" else ["m", "eps"]
    nodes += [oh.make_node("Add", add_in, ["me"]), oh.make_node("Sqrt", ["me"], ["s"])]
    if form == "torchscript":
        nodes += [oh.make_node("Div", ["one", "s"], ["r"]), oh.make_node("Mul", [x, "r"], ["n"])]
    elif form == "dynamo":
        nodes += [oh.make_node("Reciprocal", ["s"], ["r"]), oh.make_node("Mul", ["r", x], ["n"])]
    else:
        nodes.append(oh.make_node("Div", [x, "s"], ["n"]))
    if cast:
        nodes.append(oh.make_node("Cast", ["n"], ["nc"], to=dtype))
    n = "nc" if cast else "n"
    mul_in = ["w", n] if form == "div" else [n, "w"]
    if weight:
        nodes.append(oh.make_node("Mul", mul_in, ["y"]))
    else:
        nodes.append(oh.make_node("Relu", [n], ["y"]))
    shape = ["batch", "seq", D]
    inputs = [oh.make_tensor_value_info("a", dtype, shape)]
    outputs = [oh.make_tensor_value_info("y", dtype, shape)]
    if residual:
        inputs.append(oh.make_tensor_value_info("b", dtype, shape))
        nodes.append(oh.make_node("Neg", ["x0"], ["h"]))
        outputs.append(oh.make_tensor_value_info("h", dtype, shape))
    if mean_is_output:
        outputs.append(oh.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", "seq", 1]))
    graph = oh.make_graph(nodes, "rms", inputs, outputs, inits)
    model = make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def fused(proto, **ctx):
    model = import_model(proto)
    context = PassContext(verify=True, **ctx)
    report = run_passes(model, context, ("fold-constants", "fuse-rms-norm", "eliminate-dead-code"))
    model.graph.lint()
    return export_model(model), report.passes["fuse-rms-norm"].counts, context


def feeds(proto, batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for vi in proto.graph.input:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        out[vi.name] = (2.0 * rng.standard_normal((batch, seq, D))).astype(dtype)
    return out


def assert_equal_at_two_shapes(a, b, atol=1e-5, rtol=1e-5):
    for batch, seq in SHAPES:
        f = feeds(a, batch, seq)
        want, got = run_ort(a, f), run_ort(b, f)
        assert len(want) == len(got)
        for x, y in zip(want, got, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_allclose(
                y.astype(np.float32), x.astype(np.float32), atol=atol, rtol=rtol
            )


def refusals(ctx):
    return [r.reason for r in ctx.refusals if r.pass_name == "fuse-rms-norm"]


@pytest.mark.parametrize(
    "form,opset", [("torchscript", 17), ("torchscript", 18), ("dynamo", 18), ("div", 17)]
)
def test_both_exporter_forms_into_simplified_layer_norm(form, opset):
    proto = rms_model(form, opset=opset)
    out, counts, _ = fused(proto)
    assert counts == {"simplified": 1}
    ops = op_counts(out)
    assert ops == {"SimplifiedLayerNormalization": 1}
    node = out.graph.node[0]
    attrs = {a.name: oh.get_attribute_value(a) for a in node.attribute}
    assert attrs["epsilon"] == pytest.approx(EPS) and attrs["axis"] == -1
    assert_equal_at_two_shapes(proto, out)


def test_without_a_weight_mul_the_weight_is_ones():
    proto = rms_model("torchscript", weight=False)
    out, counts, _ = fused(proto)
    assert counts == {"simplified": 1}
    assert op_counts(out) == {"SimplifiedLayerNormalization": 1, "Relu": 1}
    scale = next(t for t in out.graph.initializer if t.name == out.graph.node[0].input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(scale), np.ones(D, np.float32))
    assert_equal_at_two_shapes(proto, out)


def test_residual_add_into_skip_simplified_layer_norm():
    proto = rms_model("torchscript", residual=True)
    out, counts, _ = fused(proto)
    assert counts == {"skip": 1}
    ops = op_counts(out)
    assert ops == {"SkipSimplifiedLayerNormalization": 1, "Neg": 1}
    skip = next(n for n in out.graph.node if n.op_type == "SkipSimplifiedLayerNormalization")
    assert skip.domain == "com.microsoft" and list(skip.input) == ["a", "b", "w"]
    # the sum, for the residual stream (Neg reads it); the mean and deviation left out
    assert skip.output[1] == skip.output[2] == "" and skip.output[3]
    assert [o.name for o in out.graph.output] == ["y", "h"]
    onnx.checker.check_model(out)
    assert_equal_at_two_shapes(proto, out)


def _norm(x: str, out: str, tag: str) -> list[onnx.NodeProto]:
    """TorchScript's RMSNorm of x into out (reads the initializers of rms_model)."""
    return [
        oh.make_node("Pow", [x, "two"], [f"sq{tag}"]),
        oh.make_node("ReduceMean", [f"sq{tag}"], [f"m{tag}"], axes=[-1], keepdims=1),
        oh.make_node("Add", [f"m{tag}", "eps"], [f"me{tag}"]),
        oh.make_node("Sqrt", [f"me{tag}"], [f"s{tag}"]),
        oh.make_node("Div", ["one", f"s{tag}"], [f"r{tag}"]),
        oh.make_node("Mul", [x, f"r{tag}"], [f"n{tag}"]),
        oh.make_node("Mul", [f"n{tag}", "w"], [out]),
    ]


def test_residual_shapes_are_proven_not_read_off_the_exporters_names():
    """TorchScript's value_info names the residual sums' dimensions afresh (unk__N) at every
    layer; two layers' norms with their residual Adds both become the skip form, the second
    reading the first's sum output."""
    base = rms_model("torchscript", residual=True)
    nodes = [oh.make_node("Add", ["a", "b"], ["x0"]), *_norm("x0", "y1", "1")]
    nodes += [oh.make_node("Relu", ["y1"], ["f"]), oh.make_node("Add", ["x0", "f"], ["x1"])]
    nodes += _norm("x1", "y", "2")
    f = TensorProto.FLOAT
    shape = ["batch", "seq", D]
    graph = oh.make_graph(
        nodes,
        "two_norms",
        [oh.make_tensor_value_info(n, f, shape) for n in ("a", "b")],
        [oh.make_tensor_value_info("y", f, shape)],
        list(base.graph.initializer),
        value_info=[
            oh.make_tensor_value_info("x0", f, ["unk__1", "unk__2", D]),
            oh.make_tensor_value_info("f", f, ["unk__3", "unk__4", D]),
            oh.make_tensor_value_info("x1", f, ["unk__5", "unk__6", D]),
        ],
    )
    proto = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    out, counts, _ = fused(proto)
    assert counts == {"skip": 2}
    assert op_counts(out) == {"SkipSimplifiedLayerNormalization": 2, "Relu": 1}
    assert_equal_at_two_shapes(proto, out)


def test_a_broadcasting_residual_add_stays_a_plain_add():
    """Add(a [B, S, D], b [1, S, D]): the skip form wants two inputs of one shape."""
    proto = rms_model("torchscript", residual=True)
    for vi in proto.graph.input:
        if vi.name == "b":
            vi.type.tensor_type.shape.dim[0].Clear()
            vi.type.tensor_type.shape.dim[0].dim_value = 1
    out, counts, _ = fused(proto)
    assert counts == {"simplified": 1}
    assert op_counts(out)["Add"] == 1


@pytest.mark.parametrize("residual", [False, True])
def test_cast_to_float32_and_back_float16(residual):
    proto = rms_model("torchscript", cast=True, dtype=TensorProto.FLOAT16, residual=residual)
    out, counts, _ = fused(proto)
    if residual:
        assert counts == {"skip": 1}
        assert op_counts(out) == {"SkipSimplifiedLayerNormalization": 1, "Neg": 1}
    else:
        assert counts == {"simplified": 1}
        assert op_counts(out) == {"SimplifiedLayerNormalization": 1}
    assert_equal_at_two_shapes(proto, out, atol=1e-2, rtol=1e-2)


def test_cast_form_float32():
    proto = rms_model("div", cast=True, opset=18)
    out, counts, _ = fused(proto)
    assert counts == {"simplified": 1}
    assert_equal_at_two_shapes(proto, out)


def test_portable_at_opset_23_is_standard_rms_normalization():
    proto = rms_model("div", residual=True, opset=23)
    out, counts, _ = fused(proto, portable=True)
    assert counts == {"rms": 1}
    ops = op_counts(out)
    assert ops == {"Add": 1, "RMSNormalization": 1, "Neg": 1}
    assert {n.domain for n in out.graph.node} == {""}
    onnx.checker.check_model(out, full_check=True)
    assert_equal_at_two_shapes(proto, out)


@pytest.mark.parametrize("ctx", [{"portable": True}, {"target": "a100"}])
def test_below_opset_23_standard_targets_keep_the_pattern(ctx):
    proto = rms_model("torchscript", opset=17)
    out, counts, context = fused(proto, **ctx)
    assert counts == {}
    assert op_counts(out)["ReduceMean"] == 1
    assert any("RMSNormalization needs opset 23 (the model has 17)" in r for r in refusals(context))


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"weight_shape": (1, D)}, "is not [D]"),
        ({"mean_is_output": True}, "the mean is not read by one Add"),
        ({"eps": float("nan")}, "is not finite"),
    ],
)
def test_refusals_say_why(kwargs, reason):
    proto = rms_model("torchscript", **kwargs)
    out, counts, context = fused(proto)
    assert counts == {}
    assert op_counts(out)["ReduceMean"] == 1
    assert any(reason in r for r in refusals(context)), refusals(context)


def test_a_mean_of_no_square_is_none_of_its_business():
    graph = oh.make_graph(
        [oh.make_node("ReduceMean", ["a"], ["y"], axes=[-1], keepdims=1)],
        "mean",
        [oh.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq", D])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 1])],
    )
    out, counts, context = fused(make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert counts == {} and refusals(context) == []


def test_fusing_again_changes_nothing():
    once, _, _ = fused(rms_model("torchscript", residual=True))
    twice, counts, _ = fused(once)
    assert counts == {}
    assert twice.SerializeToString() == once.SerializeToString()


def test_a_decoder_with_rms_norms_generates_the_same(tmp_path):
    proto = tiny_decoder(layers=2, norm="rms", attention="bias")
    model = import_model(proto)
    report = run_passes(model, PassContext(verify=True), (*DEFAULT_PIPELINE, "fuse-rms-norm"))
    out = export_model(model)
    # Each norm reads a residual sum (the first the embedding's wte + wpe). Two of the sums
    # add an attention output whose sequence dimension onnx's shape inference cannot tie to
    # the input's (the causal bias is broadcast from Range outputs of unknown length); the
    # symbolic shapes prove it [batch, seq, 64], so every one takes the skip form.
    assert report.passes["fuse-rms-norm"].counts == {"skip": 5}
    ops = op_counts(out)
    assert ops["SkipSimplifiedLayerNormalization"] == 5
    assert ops["SimplifiedLayerNormalization"] == 0
    assert ops["ReduceMean"] == ops["Pow"] == ops["Sqrt"] == 0
    rng = np.random.default_rng(1)
    for batch, past, new in [(1, 0, 6), (2, 5, 1)]:
        f = {
            "input_ids": rng.integers(0, 50, (batch, new)),
            "attention_mask": np.ones((batch, past + new), np.int64),
            "position_ids": np.tile(np.arange(past, past + new), (batch, 1)),
        }
        for i in range(2):
            for kv in ("key", "value"):
                f[f"past_key_values.{i}.{kv}"] = rng.standard_normal((batch, 4, past, 16)).astype(
                    np.float32
                )
        for want, got in zip(run_ort(proto, f), run_ort(out, f), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(proto, a)
    onnx.save(out, b)
    prompt = rng.integers(0, 50, (1, 7))
    np.testing.assert_array_equal(greedy_reference(b, prompt, 8), greedy_reference(a, prompt, 8))
