"""fuse-group-query-attention: a decoder's attention into GroupQueryAttention, equal under
onnxruntime at prefill, decode and chunk shapes, only under --assume nonempty-sequences."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.ir import export_model, import_model
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes
from infercc.passes.fuse_gqa import runtime_support
from tests.decoders import tiny_decoder
from tests.helpers import op_counts, run_ort

PASS = "fuse-group-query-attention"
# optimize's passes with this one before the memory schedule, which comes last
PIPELINE = (
    *(p for p in DEFAULT_PIPELINE if p != "schedule-memory"),
    PASS,
    "eliminate-dead-code",
    "schedule-memory",
)
ASSUMED = frozenset({NONEMPTY_SEQUENCES})
HEADS, SIZE = 4, 16
# (batch, past, new, right padding of the last row): prefill, decode, a chunk after a past
# at batch 3 (onnxruntime's kernel needs query_seqlens for it), padded prefill and decode.
SHAPES = [(1, 0, 7, 0), (2, 9, 1, 0), (3, 5, 4, 0), (2, 0, 6, 2), (2, 6, 1, 3)]

pytestmark = pytest.mark.skipif(runtime_support() is not None, reason=str(runtime_support()))


def fused(proto, assumptions=ASSUMED, **ctx):
    model = import_model(proto)
    context = PassContext(verify=True, assumptions=assumptions, **ctx)
    report = run_passes(model, context, PIPELINE)
    out = export_model(model)
    onnx.checker.check_model(out)
    return out, report.passes[PASS].counts.get("fused", 0), context


def feeds(proto, batch, past, new, pad, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + new), np.int64)
    if pad:
        mask[-1, past + new - pad :] = 0
    f = {
        "input_ids": rng.integers(0, 50, (batch, new)),
        "attention_mask": mask,
        "position_ids": np.tile(np.arange(past, past + new), (batch, 1)),
    }
    for vi in proto.graph.input[3:]:
        kv = vi.type.tensor_type.shape.dim[1].dim_value
        f[vi.name] = rng.standard_normal((batch, kv, past, SIZE)).astype(np.float32)
    return f


def assert_equal_everywhere(a, b):
    names = [o.name for o in a.graph.output]
    assert names == [o.name for o in b.graph.output]
    for shape in SHAPES:
        f = feeds(a, *shape)
        for name, want, got in zip(names, run_ort(a, f), run_ort(b, f), strict=True):
            assert want.shape == got.shape, (shape, name)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{shape} {name}")


def reasons(ctx):
    return {r.reason for r in ctx.refusals if r.pass_name == PASS}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kv_heads": 2, "rotary": True, "attention": "sdpa"},  # Llama: GQA, RoPE, SDPA scale
        {"kv_heads": 2, "attention": "bias"},  # grouped, eager scale, no rotation
        {"attention": "sdpa"},  # as many cache heads as query heads: no repeat
        {"kv_heads": 2, "rotary": True, "attention": "sdpa", "dynamo_kt": True},
        {"attention": "bias", "rows": True},  # GPT-2's dynamo export: Conv1D rows
        {"attention": "bias", "rows": "both"},  # GPT-2's TorchScript export
    ],
    ids=["llama", "grouped-eager", "no-repeat", "dynamo-transpose", "gpt2-rows", "gpt2-both"],
)
def test_every_layer_becomes_one_op_and_computes_the_same(kwargs):
    proto = tiny_decoder(layers=2, heads=HEADS, hidden=HEADS * SIZE, **kwargs)
    out, count, ctx = fused(proto)
    assert count == 2
    ops = op_counts(out)
    assert ops["GroupQueryAttention"] == 2
    assert ops["Softmax"] == ops["Tile"] == ops["Transpose"] == 0
    assert ops["RotaryEmbedding"] == (4 if kwargs.get("rotary") else 0)
    attrs = {
        a.name: onnx.helper.get_attribute_value(a)
        for n in out.graph.node
        if n.op_type == "GroupQueryAttention"
        for a in n.attribute
    }
    assert attrs["num_heads"] == HEADS and attrs["kv_num_heads"] == kwargs.get("kv_heads", HEADS)
    assert attrs["causal"] == 1 and attrs["scale"] == pytest.approx(SIZE**-0.5)
    assert ctx.assumed[NONEMPTY_SEQUENCES][PASS] == 2
    assert_equal_everywhere(proto, out)


def test_the_lengths_are_built_once_for_every_layer():
    out, count, _ = fused(tiny_decoder(layers=3, kv_heads=2, rotary=True, attention="sdpa"))
    assert count == 3
    gqa = [n for n in out.graph.node if n.op_type == "GroupQueryAttention"]
    assert len({tuple(n.input[5:7]) + (n.input[16],) for n in gqa}) == 1


def test_without_the_assumption_nothing_changes_and_the_refusal_says_why():
    proto = tiny_decoder(layers=1, kv_heads=2, rotary=True, attention="sdpa")
    out, count, ctx = fused(proto, assumptions=frozenset())
    assert count == 0 and op_counts(out)["GroupQueryAttention"] == 0
    assert any("needs --assume nonempty-sequences" in r for r in reasons(ctx))


def test_a_bias_without_a_causal_term_is_refused():
    proto = tiny_decoder(layers=1, kv_heads=2, rotary=True, attention="sdpa", causal=False)
    _out, count, ctx = fused(proto)
    assert count == 0
    assert any("not provably causal" in r for r in reasons(ctx))


def test_heads_merged_to_another_shape_are_refused():
    """Merged heads viewed as [B * S * 2, 32]: neither GroupQueryAttention's [B, S, 64] output
    nor its rows [B * S, 64] (what GPT-2's Conv1D reads, fused) can stand in for it."""
    proto = tiny_decoder(layers=1, kv_heads=2, rotary=True, attention="sdpa")
    target = next(t for t in proto.graph.initializer if t.name == "shape_bsc")
    target.CopyFrom(onnx.numpy_helper.from_array(np.array([-1, 32], np.int64), "shape_bsc"))
    out, count, ctx = fused(proto)  # (only the passes run: the projection's width is moot)
    assert count == 0 and op_counts(out)["GroupQueryAttention"] == 0
    assert any("not reshaped to (batch, new, 64) or its rows" in r for r in reasons(ctx))


def test_a_left_padded_prompt_is_what_the_assumption_rules_out():
    """The first row of a left-padded prompt keeps no key: the fused model differs there (and
    only there), which is why the fusion needs the assumption."""
    proto = tiny_decoder(layers=1, kv_heads=2, rotary=True, attention="sdpa")
    out, count, _ = fused(proto)
    assert count == 1
    f = feeds(proto, 2, 0, 5, 0)
    f["attention_mask"][1, :2] = 0  # row 1 padded on the left
    (want, *_), (got, *_) = run_ort(proto, f), run_ort(out, f)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1, 2:], want[1, 2:], rtol=1e-4, atol=1e-4)
    assert not np.allclose(got[1, :2], want[1, :2], atol=1e-3)


@pytest.mark.parametrize("ctx", [{"portable": True}, {"target": "a100"}])
def test_portable_and_gpu_targets_keep_standard_attention(ctx):
    out, count, context = fused(tiny_decoder(layers=1, kv_heads=2, attention="sdpa"), **ctx)
    assert count == 0 and op_counts(out)["GroupQueryAttention"] == 0
    assert any("keeps standard ops" in r for r in reasons(context))


def test_fusing_again_changes_nothing():
    out, _, _ = fused(tiny_decoder(layers=2, kv_heads=2, rotary=True, attention="sdpa"))
    again, count, _ = fused(out)
    assert count == 0
    assert op_counts(again) == op_counts(out)
    assert_equal_everywhere(out, again)


@pytest.mark.parametrize("rotary", [False, "standard"], ids=["unrotated", "rotated"])
def test_portable_at_opset_23_is_the_standard_attention(rotary):
    """The opset-23 Attention: grouped heads, past and present, the bias as attn_mask; the
    standard RotaryEmbedding moved onto the [B, S, N * D] form."""
    proto = tiny_decoder(layers=2, kv_heads=2, rotary=rotary, attention="sdpa", opset=23)
    out, count, ctx = fused(proto, portable=True)
    assert count == 2
    ops = op_counts(out)
    assert ops["Attention"] == 2 and ops["Softmax"] == ops["Tile"] == 0
    assert {n.domain for n in out.graph.node} == {""}
    assert ops["RotaryEmbedding"] == (4 if rotary else 0)
    assert ctx.assumed[NONEMPTY_SEQUENCES][PASS] == 2
    assert_equal_everywhere(proto, out)


def test_a_pattern_value_read_outside_the_attention_is_refused():
    """The heads of Q also read by a Shape that outlives the attention: the layer keeps its
    form (the graph stays valid), the other layer fuses."""
    proto = tiny_decoder(layers=2, kv_heads=2, rotary=True, attention="sdpa")
    heads = next(n for n in proto.graph.node if n.op_type == "RotaryEmbedding").input[0]
    proto.graph.node.append(onnx.helper.make_node("Shape", [heads], ["heads_shape"]))
    proto.graph.output.append(
        onnx.helper.make_tensor_value_info("heads_shape", onnx.TensorProto.INT64, [4])
    )
    out, count, ctx = fused(proto)
    assert count == 1
    assert any("has readers outside the attention" in r for r in reasons(ctx))
    assert_equal_everywhere(proto, out)


LOWEST = float(np.finfo(np.float32).min)
# (batch, past, new, rows padded on the left, rows all padding): a left-padded prefill, a
# chunk after a padded past, decode steps after them, a sequence of padding only
PADDED = [(2, 0, 6, 1, 0), (3, 0, 5, 1, 1), (2, 6, 1, 1, 0), (3, 4, 3, 1, 1), (3, 7, 1, 0, 1)]


def padded_feeds(proto, batch, past, new, left, empty, seed=3):
    f = feeds(proto, batch, past, new, 0, seed)
    for row in range(left):
        f["attention_mask"][row, : (past + new) // 2] = 0
    for row in range(batch - empty, batch):
        f["attention_mask"][row] = 0
    return f


def largest_difference(a, b, shapes=PADDED):
    worst = 0.0
    for shape in shapes:
        f = padded_feeds(a, *shape)
        for want, got in zip(run_ort(a, f), run_ort(b, f), strict=True):
            assert want.shape == got.shape
            worst = max(worst, float(np.max(np.abs(want.astype(np.float64) - got))))
    return worst


@pytest.mark.parametrize(
    "kwargs, form",
    [
        ({"kv_heads": 2, "rotary": True, "attention": "sdpa", "mask_value": LOWEST}, "mean"),
        ({"attention": "bias", "mask_value": LOWEST}, "mean"),  # no repeat of the heads
        ({"kv_heads": 2, "attention": "bias", "mask_value": -np.inf, "guard": True}, "zero"),
    ],
    ids=["llama-lowest", "no-repeat-lowest", "sdpa-inf-guard"],
)
def test_without_the_assumption_the_fusion_is_exact_on_rows_that_keep_no_key(kwargs, form):
    """torch's masks (float32's lowest; -inf with SDPA's NaN guard): every layer fuses with
    no assumption, and the rows that keep no key (left padding, an all-padding sequence) are
    fixed up from one flag per step: equal to the original at prefill, chunk and decode."""
    proto = tiny_decoder(layers=3, heads=HEADS, hidden=HEADS * SIZE, **kwargs)
    out, count, ctx = fused(proto, assumptions=frozenset())
    assert count == 3
    ops = op_counts(out)
    assert ops["GroupQueryAttention"] == 3 and ops["Softmax"] == 0
    assert ops["ReduceMax"] == 1  # the flag: once for every layer
    assert ops["ReduceMean"] == (3 if form == "mean" else 0)
    assert not ctx.assumed and not ctx.wanted  # nothing assumed, no hint
    assert largest_difference(proto, out) < 1e-4
    assert_equal_everywhere(proto, out)
    # the assumption's form is leaner; with a finite mask it differs on exactly those rows
    # (with -inf, this onnxruntime's kernel gives such a row 0 itself: measured, not proven)
    lean, lean_count, _ = fused(proto)
    assert lean_count == 3 and op_counts(lean)["ReduceMax"] == op_counts(lean)["ReduceMean"] == 0
    if form == "mean":
        assert largest_difference(proto, lean, shapes=PADDED[:2]) > 1e-2
    assert largest_difference(proto, lean, shapes=[(2, 0, 6, 0, 0), (2, 6, 1, 0, 0)]) < 1e-4


@pytest.mark.parametrize(
    "kwargs",
    [{"mask_value": -1e9}, {"mask_value": -np.inf}],
    ids=["minus-1e9", "inf-no-guard"],
)
def test_a_mask_value_with_no_exact_fix_up_still_needs_the_assumption(kwargs):
    """-1e9 leaves the scores' rounding in an empty row's softmax; -inf with no guard gives
    NaN there: neither has a cheap exact form, so the fusion waits for the assumption."""
    proto = tiny_decoder(layers=1, kv_heads=2, attention="bias", **kwargs)
    _out, count, ctx = fused(proto, assumptions=frozenset())
    assert count == 0
    assert any("gives no exact fix-up" in r for r in reasons(ctx))
    assert ctx.wanted[NONEMPTY_SEQUENCES][PASS] == 1


@pytest.mark.parametrize(
    "name, mask_is_finite",
    [("qwen2-dynamo-eager", True), ("llama-torchscript-sdpa", False)],
)
def test_users_exports_fuse_without_the_assumption_and_stay_exact(name, mask_is_finite):
    """transformers' exports (tests/data/decoder_exports): the eager mask is float32's
    lowest, the TorchScript SDPA one -inf with the NaN guard. Every layer fuses with nothing
    assumed, equal to the export on left-padded and all-padding rows at prefill, a chunk after
    a past and decode, at two batch sizes; the assumed form differs there on the finite mask."""
    from tests.decoders import cache_feeds
    from tests.exports import exports

    export = next(e for e in exports() if e.name == name)
    proto = onnx.load(export.path)
    out, count, ctx = fused(proto, assumptions=frozenset())
    assert count == export.layers and op_counts(out)["GroupQueryAttention"] == export.layers
    assert not ctx.wanted
    lean, _, _ = fused(proto)
    worst = {"default": 0.0, "assumed": 0.0}
    for batch, past, new in [(2, 0, 6), (3, 5, 3), (3, 7, 1), (2, 4, 1)]:
        f = cache_feeds(proto, batch, past, new, seed=batch + past)
        f["attention_mask"][0, : (past + new) // 2] = 0  # left padding
        f["attention_mask"][-1] = 0  # a sequence of padding only
        want = run_ort(proto, f)
        for label, model in (("default", out), ("assumed", lean)):
            for a, b in zip(want, run_ort(model, f), strict=True):
                worst[label] = max(worst[label], float(np.max(np.abs(a - b))))
    assert worst["default"] < 1e-4
    assert (worst["assumed"] > 1e-2) == mask_is_finite
