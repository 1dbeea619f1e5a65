"""Tests for fuse-qkv: Q/K/V projections sharing an input become one MatMul (+ Add) and a Split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.ir import import_model
from infercc.passes import DEFAULT_PIPELINE, REGISTRY, PassContext
from infercc.passes.fuse_qkv import fuse_qkv
from tests.helpers import assert_same_outputs, make_model, op_counts, optimize_proto, random_feeds

PASSES = ["fuse-qkv", "eliminate-dead-code"]
HIDDEN, HEADS = 64, 4
CACHE = Path(__file__).resolve().parents[2] / "bench" / ".cache"


class _Builder:
    """Builds BERT-like self-attention layers with random weights (fixed seed)."""

    def __init__(self, dtype: int = TensorProto.FLOAT, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
        self.dtype = dtype
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.extra_outputs: list[onnx.ValueInfoProto] = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, array: np.ndarray, base: str) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, *shape: int) -> str:
        w = (self.rng.standard_normal(shape) / np.sqrt(shape[-2])).astype(self.np_dtype)
        return self.const(w, "w")

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def projection(self, x: str, bias: bool = True, bias_first: bool = False, w=None) -> str:
        y = self.node("MatMul", [x, w or self.weight(HIDDEN, HIDDEN)])
        if not bias:
            return y
        b = self.const(self.rng.standard_normal(HIDDEN).astype(self.np_dtype), "b")
        return self.node("Add", [b, y] if bias_first else [y, b])

    def heads(self, y: str, perm: list[int]) -> str:
        shape = self.const(np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64), "shape")
        return self.node("Transpose", [self.node("Reshape", [y, shape])], perm=perm)

    def layer(self, x: str, bias=(True, True, True), bias_first=False, weights=(None,) * 3):
        q, k, v = (self.projection(x, b, bias_first, w) for b, w in zip(bias, weights, strict=True))
        qh, kh = self.heads(q, [0, 2, 1, 3]), self.heads(k, [0, 2, 3, 1])
        vh = self.heads(v, [0, 2, 1, 3])
        scale = self.const(np.array(0.25, self.np_dtype), "scale")
        scores = self.node("Mul", [self.node("MatMul", [qh, kh]), scale])
        probs = self.node("Softmax", [scores], axis=-1)
        ctx = self.node("Transpose", [self.node("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
        shape = self.const(np.array([0, 0, HIDDEN], np.int64), "shape")
        merged = self.node("Reshape", [ctx, shape])
        return self.node("Add", [self.projection(merged), x])

    def expose(self, name: str) -> None:
        dims = ["batch", "seq", HIDDEN]
        self.extra_outputs.append(helper.make_tensor_value_info(name, self.dtype, dims))

    def model(self, out: str, opset: int = 17, inputs=(), width: int = HIDDEN) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", self.dtype, ["batch", "seq", HIDDEN])
        y = helper.make_tensor_value_info(out, self.dtype, ["batch", "seq", width])
        graph = helper.make_graph(
            self.nodes, "attn", [x, *inputs], [y, *self.extra_outputs], self.inits
        )
        model = make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model


def _bert(layers: int = 1, opset: int = 17, **kw) -> onnx.ModelProto:
    b = _Builder()
    x = "x"
    for _ in range(layers):
        x = b.layer(x, **kw)
    return b.model(x, opset)


def _reasons(ctx: PassContext) -> list[str]:
    return [r.reason for r in ctx.refusals if r.pass_name == "fuse-qkv"]


def _split(proto: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in proto.graph.node if n.op_type == "Split"]
    return node


def test_one_layer_becomes_one_matmul_add_and_split():
    proto = _bert()
    before = op_counts(proto)
    out, report = optimize_proto(proto, PASSES)
    after = op_counts(out)
    assert before["MatMul"] == 6 and after["MatMul"] == 4
    assert after["Split"] == 1
    assert after["Add"] == before["Add"] - 2
    assert report.passes["fuse-qkv"].counts == {
        "groups": 1,
        "matmuls": 3,
        "biases": 3,
        "groups_of_3": 1,
    }
    split = _split(out)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert inits[split.input[1]].tolist() == [HIDDEN] * 3
    fused = [n for n in out.graph.node if n.op_type == "MatMul" and n.input[0] == "x"]
    assert inits[fused[0].input[1]].shape == (HIDDEN, 3 * HIDDEN)
    assert_same_outputs(proto, out)


def test_output_shapes_and_dtype_preserved():
    proto = _bert()
    out, _ = optimize_proto(proto, PASSES)
    inferred = onnx.shape_inference.infer_shapes(out, strict_mode=True)
    split = _split(out)
    types = {vi.name: vi.type.tensor_type for vi in inferred.graph.value_info}
    for name in split.output:
        dims = [d.dim_param or d.dim_value for d in types[name].shape.dim]
        assert dims == ["batch", "seq", HIDDEN]
        assert types[name].elem_type == TensorProto.FLOAT


def test_opset11_uses_split_attribute():
    proto = _bert(opset=11)
    out, report = optimize_proto(proto, PASSES)
    split = _split(out)
    assert len(split.input) == 1
    attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
    assert attrs["split"] == [HIDDEN] * 3 and attrs["axis"] == -1
    assert report.passes["fuse-qkv"].counts["groups"] == 1
    assert_same_outputs(proto, out)


def test_opset17_uses_split_input():
    out, _ = optimize_proto(_bert(opset=17), PASSES)
    split = _split(out)
    assert len(split.input) == 2
    assert "split" not in {a.name for a in split.attribute}


def test_two_layers_make_two_groups():
    proto = _bert(layers=2)
    out, report = optimize_proto(proto, PASSES)
    counts = report.passes["fuse-qkv"].counts
    assert counts["groups"] == 2 and counts["matmuls"] == 6
    assert op_counts(out)["MatMul"] == 8 and op_counts(out)["Split"] == 2
    assert_same_outputs(proto, out)


def test_bias_first_add_form():
    proto = _bert(bias_first=True)
    out, report = optimize_proto(proto, PASSES)
    assert report.passes["fuse-qkv"].counts["biases"] == 3
    assert op_counts(out)["Add"] == op_counts(proto)["Add"] - 2
    assert_same_outputs(proto, out)


def test_no_bias_fuses_matmuls_only():
    proto = _bert(bias=(False, False, False))
    out, report = optimize_proto(proto, PASSES)
    counts = report.passes["fuse-qkv"].counts
    assert counts["groups"] == 1 and counts["biases"] == 0
    assert op_counts(out)["Add"] == op_counts(proto)["Add"]
    assert op_counts(out)["MatMul"] == 4
    assert_same_outputs(proto, out)


def test_mixed_bias_keeps_the_adds_after_the_split():
    proto = _bert(bias=(True, False, True))
    out, report = optimize_proto(proto, PASSES)
    counts = report.passes["fuse-qkv"].counts
    assert counts["groups"] == 1 and counts["matmuls"] == 3 and counts["biases"] == 0
    assert op_counts(out)["Add"] == op_counts(proto)["Add"]
    split_outs = set(_split(out).output)
    adds = [n for n in out.graph.node if n.op_type == "Add" and split_outs & set(n.input)]
    assert len(adds) == 2
    assert_same_outputs(proto, out)


def test_three_d_weight_is_refused_and_the_rest_fuse():
    b = _Builder()
    w3 = b.weight(1, HIDDEN, HIDDEN)
    proto = b.model(b.layer("x", weights=(None, w3, None)))
    ctx = PassContext()
    out, report = optimize_proto(proto, PASSES, ctx=ctx)
    counts = report.passes["fuse-qkv"].counts
    assert counts["groups"] == 1 and counts["groups_of_2"] == 1 and counts["matmuls"] == 2
    assert "weight is not 2-D (rank 3)" in _reasons(ctx)
    assert any(n.op_type == "MatMul" and w3 in n.input for n in out.graph.node)
    assert_same_outputs(proto, out)


def test_non_constant_weight_is_refused():
    b = _Builder()
    wq = helper.make_tensor_value_info("wq", TensorProto.FLOAT, [HIDDEN, HIDDEN])
    proto = b.model(b.layer("x", weights=("wq", None, None)), inputs=[wq])
    ctx = PassContext()
    out, report = optimize_proto(proto, PASSES, ctx=ctx)
    assert report.passes["fuse-qkv"].counts["matmuls"] == 2
    assert "weight (input B) is not a constant" in _reasons(ctx)
    assert_same_outputs(proto, out)


def test_mixed_weight_dtype_is_refused():
    b = _Builder()
    proto = b.model(b.layer("x", bias=(False, False, False)))
    model = import_model(proto)
    graph = model.graph
    k = [n for n in graph if n.op_type == "MatMul"][1]
    w64 = graph.make_constant(k.input(1).numpy().astype(np.float64), "w64")
    k.set_input(1, w64)
    graph.inputs[0].dtype = None  # only the group's own dtypes can tell them apart
    ctx = PassContext(current_pass="fuse-qkv")
    result = fuse_qkv(graph, ctx)
    assert result.stats["groups"] == 1 and result.stats["matmuls"] == 2
    assert k.outputs[0].uses(), "the float64 MatMul must stay in use"
    reasons = _reasons(ctx)
    assert reasons == ["weight dtype differs from the other projections of 'x'"]
    graph.lint()


def test_weight_dtype_must_match_activation():
    b = _Builder()
    proto = b.model(b.layer("x", bias=(False, False, False)))
    graph = import_model(proto).graph
    for mm in [n for n in graph if n.op_type == "MatMul"][:3]:
        mm.set_input(1, graph.make_constant(mm.input(1).numpy().astype(np.float64), "w64"))
    ctx = PassContext(current_pass="fuse-qkv")
    assert not fuse_qkv(graph, ctx).changed
    assert "weight dtype differs from the activation dtype" in _reasons(ctx)


def test_matmul_reading_the_input_twice_is_not_a_member():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 8, 8] x) => (float[2, 8, 4] a, float[2, 8, 4] b, float[2, 8, 8] c) {
        a = MatMul(x, w1)
        b = MatMul(x, w2)
        c = MatMul(x, x)
    }
    """
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(1)
    for name in ("w1", "w2"):
        w = rng.standard_normal((8, 4)).astype(np.float32)
        proto.graph.initializer.append(numpy_helper.from_array(w, name))
    onnx.checker.check_model(proto, full_check=True)
    ctx = PassContext()
    out, report = optimize_proto(proto, PASSES, ctx=ctx)
    assert report.passes["fuse-qkv"].counts["matmuls"] == 2
    assert "reads 'x' as both operands" in _reasons(ctx)
    assert [o.name for o in out.graph.output] == ["a", "b", "c"]
    assert_same_outputs(proto, out)


def test_graph_output_names_are_kept():
    b = _Builder()
    x = "x"
    q = b.projection(x)
    k = b.projection(x)
    b.expose(q)
    proto = b.model(k)
    out, report = optimize_proto(proto, PASSES)
    assert report.passes["fuse-qkv"].counts["groups"] == 1
    assert [o.name for o in out.graph.output] == [k, q]
    assert op_counts(out)["MatMul"] == 1
    assert_same_outputs(proto, out)


def test_constant_node_weights_fuse():
    b = _Builder()
    names = []
    for _ in range(3):
        w = (b.rng.standard_normal((HIDDEN, 16)) / 8).astype(np.float32)
        names.append(b.name("cw"))
        b.nodes.append(
            helper.make_node("Constant", [], [names[-1]], value=numpy_helper.from_array(w))
        )
    outs = [b.node("MatMul", ["x", w]) for w in names]
    proto = b.model(b.node("Concat", outs, axis=-1), width=48)
    out, report = optimize_proto(proto, PASSES)
    assert report.passes["fuse-qkv"].counts["groups"] == 1
    assert op_counts(out)["Constant"] == 0 and op_counts(out)["MatMul"] == 1
    assert_same_outputs(proto, out)


def test_transposed_weights_and_identity_biases_fuse_without_folding():
    # dynamo's optimize=False export: MatMul(X, Transpose(W[out, in])), biases via Identity
    b = _Builder()
    torch_w = [b.weight(HIDDEN, HIDDEN) for _ in range(3)]
    weights = tuple(b.node("Transpose", [w], perm=[1, 0]) for w in torch_w)
    proto = b.model(b.layer("x", weights=weights))
    adds = [n for n in proto.graph.node if n.op_type == "Add"][:3]
    for i, add in enumerate(adds):
        ident = helper.make_node("Identity", [add.input[1]], [f"bias_{i}"])
        proto.graph.node.insert(0, ident)
        add.input[1] = f"bias_{i}"
    onnx.checker.check_model(proto, full_check=True)
    out, report = optimize_proto(proto, PASSES)
    counts = report.passes["fuse-qkv"].counts
    assert counts["groups"] == 1 and counts["biases"] == 3
    assert op_counts(out)["Transpose"] == op_counts(proto)["Transpose"] - 3
    assert op_counts(out)["Identity"] == 0
    assert_same_outputs(proto, out)


def test_tied_weights_stay_for_their_other_readers():
    # K and V share one initializer (exporters de-duplicate equal tensors); it is also read
    # by a MatMul on another input: the pass must build new constants and leave it intact.
    b = _Builder()
    w = b.weight(HIDDEN, HIDDEN)
    y = b.layer("x", weights=(None, w, w))
    other = b.node("MatMul", [y, w])
    proto = b.model(other)
    before = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == w))
    out, report = optimize_proto(proto, PASSES)
    assert report.passes["fuse-qkv"].counts["groups"] == 1
    kept = next(t for t in out.graph.initializer if t.name == w)
    np.testing.assert_array_equal(numpy_helper.to_array(kept), before)
    assert any(n.op_type == "MatMul" and n.input[1] == w for n in out.graph.node)
    assert_same_outputs(proto, out)


def test_fp16_group_keeps_dtype():
    b = _Builder(dtype=TensorProto.FLOAT16)
    proto = b.model(b.layer("x"))
    out, report = optimize_proto(proto, PASSES)
    assert report.passes["fuse-qkv"].counts["groups"] == 1
    fused = [n for n in out.graph.node if n.op_type == "MatMul" and n.input[0] == "x"][0]
    w = {t.name: t for t in out.graph.initializer}[fused.input[1]]
    assert w.data_type == TensorProto.FLOAT16
    assert_same_outputs(proto, out, atol=2e-2, rtol=2e-2)


def test_fixpoint_without_dce():
    proto = _bert()
    out, report = optimize_proto(proto, ["fuse-qkv"])
    assert report.reached_fixpoint
    assert report.passes["fuse-qkv"].counts["groups"] == 1
    assert_same_outputs(proto, out)


def test_single_projection_is_left_alone():
    b = _Builder()
    proto = b.model(b.projection("x"))
    ctx = PassContext()
    out, report = optimize_proto(proto, PASSES, ctx=ctx)
    assert report.passes["fuse-qkv"].changed == 0
    assert op_counts(out) == op_counts(proto)
    assert _reasons(ctx) == []


# -- BERT exported by torch.onnx (TorchScript and dynamo) from transformers with SDPA ----------

BERT_EXPORTS = {
    "bert_L2_sdpa_ts.onnx": 2,
    "bert_L2_sdpa_dynamo.onnx": 2,
    "bert_L2_eager_ts.onnx": 2,
    "bert_base_sdpa_ts.onnx": 12,
    "bert_base_sdpa_dynamo.onnx": 12,
    "bert_base_eager_ts.onnx": 12,
}


def _export(file: str, layers: int):
    path = CACHE / file
    missing = pytest.mark.skipif(not path.exists(), reason=f"{path} not exported")
    return pytest.param(path, layers, id=file, marks=missing)


@pytest.mark.slow
@pytest.mark.parametrize("path,layers", [_export(f, n) for f, n in BERT_EXPORTS.items()])
def test_bert_exports_fuse_every_layer(path: Path, layers: int):
    proto = onnx.load(str(path))
    passes = [p for p in DEFAULT_PIPELINE if p in REGISTRY]
    out, report = optimize_proto(proto, passes)
    counts = report.passes["fuse-qkv"].counts
    assert counts["groups"] == layers and counts["matmuls"] == 3 * layers
    assert counts["biases"] == 3 * layers
    # each packed projection is split again, or read whole by emit-attention's Attention op
    ops = op_counts(out)
    assert ops["Split"] + ops["Attention"] == op_counts(proto)["Split"] + layers
    feeds = _bert_feeds(proto)
    assert_same_outputs(proto, out, feeds, atol=1e-4, rtol=1e-3)


def _bert_feeds(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = random_feeds(proto, dims=4)
    rng = np.random.default_rng(0)
    for name, arr in feeds.items():
        if name == "input_ids":
            feeds[name] = rng.integers(0, 1000, arr.shape).astype(arr.dtype)
        elif name == "attention_mask":
            feeds[name] = np.ones_like(arr)
    return feeds
