"""fuse-rotary-embedding: RoPE into RotaryEmbedding, exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.ir import export_model, import_model
from infercc.passes import PassContext, run_passes
from tests.helpers import make_model, op_counts, run_ort

H, D = 4, 16
# (batch, sequence, first position): a prefill and a decode shape.
SHAPES = [(1, 7, 0), (2, 1, 9)]


def rope_model(
    opset: int = 17,
    layers: int = 2,
    neg_first: bool = True,
    sin_reader=False,
    shared=False,
    split=False,
    outer=False,
    rotary_dim=D,
    pass_reader=False,
):
    """q, k [batch, H, seq, D] rotated as Llama's export does: angles f = positions x inverse
    frequencies [batch, seq, D/2], e = Unsqueeze(Concat(f, f), [1]), y = x cos(e) +
    rotate_half(x) sin(e), for q and k of `layers` layers (one shared f). `neg_first=False`
    writes a wrong rotate_half (Concat(x[h:], Neg(x[:h]))); `shared`: position ids [1, seq],
    one row of angles broadcast over the batch; `split`: the halves as the dynamo exporter
    writes x.chunk(2, dim=-1), one Split (opset 18's num_outputs); `outer`: cos and sin as
    transformers' Llama writes them, Unsqueeze(Cos(Concat(f, f)), [1]); `rotary_dim` < D:
    Phi-3's partial rotation, the first rotary_dim channels rotated and the rest concatenated
    back (`pass_reader`: the passed-on channels are also an output)."""
    r = rotary_dim
    h = r // 2
    inv = (1.0 / 10000 ** (np.arange(0, r, 2) / r)).astype(np.float32)
    inits = [
        numpy_helper.from_array(inv, "inv_freq"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([h], np.int64), "half"),
        numpy_helper.from_array(np.array([2**62], np.int64), "end"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array([r], np.int64), "rdim"),
    ]
    nodes = [
        oh.make_node("Unsqueeze", ["position_ids", "ax2"], ["p3"]),
        oh.make_node("Cast", ["p3"], ["pf"], to=TensorProto.FLOAT),
        oh.make_node("Mul", ["pf", "inv_freq"], ["f"]),
        oh.make_node("Concat", ["f", "f"], ["ff"], axis=-1),
    ]
    if outer:  # transformers' Llama: the head axis added after Cos and Sin
        nodes += [
            oh.make_node("Cos", ["ff"], ["cos3"]),
            oh.make_node("Sin", ["ff"], ["sin3"]),
            oh.make_node("Unsqueeze", ["cos3", "ax1"], ["cos"]),
            oh.make_node("Unsqueeze", ["sin3", "ax1"], ["sin"]),
        ]
    else:
        nodes += [
            oh.make_node("Unsqueeze", ["ff", "ax1"], ["e"]),
            oh.make_node("Cos", ["e"], ["cos"]),
            oh.make_node("Sin", ["e"], ["sin"]),
        ]
    pos_batch = 1 if shared else "batch"
    inputs = [oh.make_tensor_value_info("position_ids", TensorProto.INT64, [pos_batch, "seq"])]
    outputs = []
    for i in range(layers):
        for name in (f"q{i}", f"k{i}"):
            inputs.append(
                oh.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", H, "seq", D])
            )
            x = name
            if r < D:  # rotate x[..., :r], pass x[..., r:] on
                x = f"{name}_r"
                nodes += [
                    oh.make_node("Slice", [name, "zero", "rdim", "last"], [x]),
                    oh.make_node("Slice", [name, "rdim", "end", "last"], [f"{name}_pass"]),
                ]
            if split:
                nodes.append(
                    oh.make_node("Split", [x], [f"{x}_lo", f"{x}_hi"], axis=3, num_outputs=2)
                )
            else:
                nodes += [
                    oh.make_node("Slice", [x, "zero", "half", "last"], [f"{x}_lo"]),
                    oh.make_node("Slice", [x, "half", "end", "last"], [f"{x}_hi"]),
                ]
            if neg_first:
                nodes += [
                    oh.make_node("Neg", [f"{x}_hi"], [f"{x}_neg"]),
                    oh.make_node("Concat", [f"{x}_neg", f"{x}_lo"], [f"{x}_rot"], axis=-1),
                ]
            else:
                nodes += [
                    oh.make_node("Neg", [f"{x}_lo"], [f"{x}_neg"]),
                    oh.make_node("Concat", [f"{x}_hi", f"{x}_neg"], [f"{x}_rot"], axis=-1),
                ]
            nodes += [
                oh.make_node("Mul", [x, "cos"], [f"{x}_c"]),
                oh.make_node("Mul", ["sin", f"{x}_rot"], [f"{x}_s"]),
                oh.make_node("Add", [f"{x}_c", f"{x}_s"], [f"{x}_out"]),
            ]
            if r < D:
                nodes.append(
                    oh.make_node("Concat", [f"{x}_out", f"{name}_pass"], [f"{name}_out"], axis=-1)
                )
            outputs.append(
                oh.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, ["batch", H, "seq", D])
            )
    if pass_reader:
        outputs.append(
            oh.make_tensor_value_info("q0_pass", TensorProto.FLOAT, ["batch", H, "seq", D - r])
        )
    if sin_reader:
        outputs.append(oh.make_tensor_value_info("q0_s", TensorProto.FLOAT, ["batch", H, "seq", D]))
    graph = oh.make_graph(nodes, "rope", inputs, outputs, inits)
    model = make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def fused(proto, **ctx):
    model = import_model(proto)
    context = PassContext(verify=True, **ctx)
    passes = ("fold-constants", "fuse-rotary-embedding", "eliminate-dead-code")
    report = run_passes(model, context, passes)
    model.graph.lint()
    return export_model(model), report.passes["fuse-rotary-embedding"].counts, context


def feeds(proto, batch, seq, start, seed=0):
    rng = np.random.default_rng(seed)
    shared = proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    out = {"position_ids": np.tile(np.arange(start, start + seq), (1 if shared else batch, 1))}
    for vi in proto.graph.input[1:]:
        out[vi.name] = rng.standard_normal((batch, H, seq, D)).astype(np.float32)
    return out


def assert_equal_at_two_shapes(a, b):
    for batch, seq, start in SHAPES:
        f = feeds(a, batch, seq, start)
        for want, got in zip(run_ort(a, f), run_ort(b, f), strict=True):
            assert want.shape == got.shape
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def refusals(ctx):
    return [r.reason for r in ctx.refusals if r.pass_name == "fuse-rotary-embedding"]


def test_q_and_k_of_every_layer_into_rotary_embedding():
    proto = rope_model(layers=2)
    out, counts, _ = fused(proto)
    assert counts == {"contrib": 4}
    ops = op_counts(out)
    assert ops["RotaryEmbedding"] == 4
    assert ops["Neg"] == ops["Slice"] == ops["Concat"] == 0
    assert ops["Cos"] == ops["Sin"] == 1  # one cache, shared
    rope = [n for n in out.graph.node if n.op_type == "RotaryEmbedding"]
    assert {n.domain for n in rope} == {"com.microsoft"}
    assert_equal_at_two_shapes(proto, out)


def test_the_dynamo_exporters_split_halves():
    proto = rope_model(opset=18, layers=1, split=True)
    out, counts, _ = fused(proto)
    assert counts == {"contrib": 2}
    ops = op_counts(out)
    assert ops["RotaryEmbedding"] == 2 and ops["Split"] == ops["Neg"] == 0
    assert_equal_at_two_shapes(proto, out)


def test_portable_at_opset_23_is_the_standard_op():
    proto = rope_model(opset=23, layers=1)
    out, counts, _ = fused(proto, portable=True)
    assert counts == {"standard": 2}
    assert {n.domain for n in out.graph.node} == {""}
    assert op_counts(out)["RotaryEmbedding"] == 2
    onnx.checker.check_model(out, full_check=True)
    assert_equal_at_two_shapes(proto, out)


@pytest.mark.parametrize("ctx", [{"portable": True}, {"target": "a100"}])
def test_below_opset_23_standard_targets_keep_the_pattern(ctx):
    out, counts, context = fused(rope_model(layers=1), **ctx)
    assert counts == {}
    assert op_counts(out)["Neg"] == 2
    assert any("RotaryEmbedding needs opset 23 (the model has 17)" in r for r in refusals(context))


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        ({"neg_first": False}, "the sine term is not rotate_half(x)"),
        ({"sin_reader": True}, "a product of the rotation has readers outside it"),
    ],
)
def test_refusals_say_why(kwargs, reason):
    proto = rope_model(layers=1, **kwargs)
    out, counts, context = fused(proto)
    assert op_counts(out)["Add"] >= 1
    assert any(reason in r for r in refusals(context)), refusals(context)
    assert_equal_at_two_shapes(proto, out)


def test_fusing_again_changes_nothing():
    once, _, _ = fused(rope_model(layers=1))
    twice, counts, _ = fused(once)
    assert counts == {}
    assert twice.SerializeToString() == once.SerializeToString()


def test_angles_of_one_batch_row_broadcast_over_the_batch():
    """Position ids [1, seq] and the head axis added after Cos and Sin, as transformers' Llama
    computes them: one cache row per position, position s in every batch row."""
    proto = rope_model(layers=2, shared=True, outer=True)
    out, counts, _ = fused(proto)
    assert counts == {"contrib": 4}
    assert op_counts(out)["Neg"] == 0 and op_counts(out)["Range"] == 0
    assert_equal_at_two_shapes(proto, out)


@pytest.mark.parametrize("opset", [17, 23])
def test_a_partial_rotation_is_one_rotary_embedding_over_whole_heads(opset):
    """Phi-3 at partial_rotary_factor 0.5: Concat(rotation of x[..., :8], x[..., 8:]) becomes
    one RotaryEmbedding of x with rotary_embedding_dim 8 (num_heads 4), the contrib op on cpu
    and the standard op under --portable at opset 23; the same numbers under onnxruntime."""
    proto = rope_model(opset=opset, layers=2, rotary_dim=8)
    ctx = {"portable": True} if opset == 23 else {}
    out, counts, _ = fused(proto, **ctx)
    key = "standard" if opset == 23 else "contrib"
    assert counts == {key: 4, "partial": 4}
    ops = op_counts(out)
    assert ops["RotaryEmbedding"] == 4 and ops["Concat"] == ops["Slice"] == ops["Neg"] == 0
    rope = [n for n in out.graph.node if n.op_type == "RotaryEmbedding"]
    attrs = {(a.name, a.i) for n in rope for a in n.attribute}
    assert {("rotary_embedding_dim", 8), ("num_heads", H)} <= attrs
    assert all(n.input[0] in {"q0", "k0", "q1", "k1"} for n in rope)
    onnx.checker.check_model(out, full_check=True)
    assert_equal_at_two_shapes(proto, out)
    again, counts, _ = fused(out, **ctx)
    assert counts == {} and again.SerializeToString() == out.SerializeToString()


def test_a_partial_rotation_whose_passed_channels_are_read_elsewhere_stays_split():
    proto = rope_model(layers=1, rotary_dim=8, pass_reader=True)
    out, counts, context = fused(proto)
    assert counts == {"contrib": 2, "partial": 1}  # k's; q's passed-on Slice is an output
    assert any("readers outside it" in r for r in refusals(context)), refusals(context)
    assert_equal_at_two_shapes(proto, out)
