"""fuse-decoder-attention: attention with a KV cache into MultiHeadAttention, exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from infercc.ir import export_model, import_model
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes
from infercc.passes.pipelines import CALIBRATE_INT4
from tests.decoders import tiny_decoder

PIPELINE = (*DEFAULT_PIPELINE, "fuse-decoder-attention")


def fused(proto, pipeline=PIPELINE, **ctx):
    model = import_model(proto)
    context = PassContext(verify=True, **ctx)
    report = run_passes(model, context, pipeline)
    out = export_model(model)
    onnx.checker.check_model(out)
    return out, report, context


def feeds(batch, past, new, layers=2, heads=4, size=16, seed=0):
    rng = np.random.default_rng(seed)
    f = {
        "input_ids": rng.integers(0, 50, (batch, new)),
        "attention_mask": np.ones((batch, past + new), np.int64),
        "position_ids": np.tile(np.arange(past, past + new), (batch, 1)),
    }
    for i in range(layers):
        for kv in ("key", "value"):
            f[f"past_key_values.{i}.{kv}"] = rng.standard_normal((batch, heads, past, size)).astype(
                np.float32
            )
    return f


def run(proto, f):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, f), strict=True))


def assert_same(proto, out, all_feeds):
    """Every output of `out` equals `proto`'s under onnxruntime, at each of the feeds."""
    for f in all_feeds:
        want, got = run(proto, f), run(out, f)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4, err_msg=name)


def test_fuses_every_layer_and_matches():
    proto = tiny_decoder(layers=2, attention="bias")
    out, report, _ = fused(proto)
    assert report.passes["fuse-decoder-attention"].counts.get("fused", 0) == 2
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == 0
    assert [o.name for o in out.graph.output] == [o.name for o in proto.graph.output]
    assert_same(proto, out, [feeds(*shape) for shape in [(1, 0, 5), (2, 7, 1), (1, 3, 4)]])


def test_refuses_with_reasons():
    proto = tiny_decoder(layers=1, attention="where")
    _out, report, ctx = fused(proto)
    assert report.passes["fuse-decoder-attention"].counts.get("fused", 0) == 0
    reasons = {r.reason for r in ctx.refusals if r.pass_name == "fuse-decoder-attention"}
    assert any("does not read MatMul(Q, K^T)" in r for r in reasons)


@pytest.mark.parametrize("ctx", [{"portable": True}, {"target": "a100"}])
def test_portable_and_gpu_keep_standard_ops(ctx):
    out, report, context = fused(tiny_decoder(layers=1, attention="bias"), **ctx)
    assert report.passes["fuse-decoder-attention"].counts.get("fused", 0) == 0
    assert {n.domain for n in out.graph.node} == {""}


@pytest.mark.parametrize("rows", [True, "both"])
def test_gpt2s_conv1d_rows_read_the_fused_output(rows):
    """GPT-2's attention output viewed as rows [-1, hidden] for its Conv1D (the dynamo export),
    and beside a [B, S, hidden] Reshape whose Shape gives the view back (TorchScript): the rows
    read MultiHeadAttention's output, every Transpose gone, the same numbers."""
    proto = tiny_decoder(layers=2, attention="bias", rows=rows)
    out, report, _ = fused(proto)
    assert report.passes["fuse-decoder-attention"].counts.get("fused", 0) == 2
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["MultiHeadAttention"] == 2 and ops["Softmax"] == ops["Transpose"] == 0
    assert_same(proto, out, [feeds(*shape) for shape in [(1, 0, 5), (2, 7, 1), (3, 3, 4)]])


def test_rows_of_another_width_are_refused():
    """A view of the merged heads as rows of some other width is not the fused output's."""
    proto = tiny_decoder(layers=1, attention="bias", rows=True)
    for t in proto.graph.initializer:
        if t.name == "rows0":
            t.CopyFrom(onnx.numpy_helper.from_array(np.array([-1, 32], np.int64), "rows0"))
    # the Gemm then reads [B*S*2, 32]: give it a weight of that width
    for t in proto.graph.initializer:
        if t.name == "wo0":
            w = onnx.numpy_helper.to_array(t)[:32]
            t.CopyFrom(onnx.numpy_helper.from_array(w, "wo0"))
    _out, report, ctx = fused(proto)
    assert report.passes["fuse-decoder-attention"].counts.get("fused", 0) == 0
    reasons = {r.reason for r in ctx.refusals if r.pass_name == "fuse-decoder-attention"}
    assert any("or its rows" in r for r in reasons), reasons


@pytest.mark.parametrize("name", ["gpt2-torchscript-sdpa", "gpt2-dynamo-sdpa"])
def test_sdpa_exports_split_scale_and_dynamo_keys_fuse_exactly(name):
    """transformers' SDPA as both exporters write it: the scale split as Mul(Q, a) and
    Mul(K^T, b), the cache Concat on axis -2, present_key also read by Shape, and (dynamo) K^T
    as Reshape(Transpose(Reshape(K))). Fused with the NaN guard removed under the assumption,
    equal under onnxruntime to the export at the five decoder shapes."""
    from tests.decoders import DECODER_SHAPES, cache_feeds
    from tests.exports import exports

    export = {e.name: e for e in exports()}[name]
    proto = onnx.load(export.path)
    stated = frozenset({"nonempty-sequences"})  # calibrate --int4's passes: MHA before GQA
    out, report, _ = fused(proto, CALIBRATE_INT4.passes, assumptions=stated)
    assert report.passes["fuse-decoder-attention"].counts.get("fused", 0) == export.layers
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops["MultiHeadAttention"] == export.layers and ops["Softmax"] == 0
    assert_same(proto, out, [cache_feeds(proto, *shape) for shape in DECODER_SHAPES])
