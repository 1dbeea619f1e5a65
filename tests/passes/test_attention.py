"""Tests for remove-nan-guard and emit-attention (infercc.passes.attention), in ONNX text."""

from __future__ import annotations

import numpy as np
import pytest

from infercc.assumptions import NONEMPTY_SEQUENCES, check_assumptions, honour
from infercc.errors import InferccError
from infercc.passes import PassContext
from tests.helpers import op_counts, optimize_proto, parse, run_ort

E, H, D = 8, 2, 4
NEG_INF = "-inf"
FINFO_MIN = "-3.4028234663852886e+38"


def _floats(rng: np.random.Generator, n: int, scale: float) -> str:
    return ", ".join(f"{v:.6f}" for v in rng.standard_normal(n) * scale)


def _weights(seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    parts = []
    for name in "qkv":
        parts.append(f"float[{E},{E}] w{name} = {{{_floats(rng, E * E, 0.4)}}}")
        parts.append(f"float[{E}] b{name} = {{{_floats(rng, E, 0.1)}}}")
    return ",\n ".join(parts)


def _block(scores: str, guard: bool, mask_input: str, identity_reshape: bool = True) -> str:
    """A self-attention block as torch.onnx writes it from transformers (SDPA: scale split on
    Q and K^T, the NaN guard, the Reshape of O onto its own shape; eager: scale on the scores,
    no guard). `scores` is the ONNX text that computes `sm` (the Softmax input) from `sc`."""
    probs = "nan = IsNaN(p)\n  pg = Where(nan, zero, p)" if guard else "pg = Identity(p)"
    o_reshape = (
        """osh = Shape(o)
  ob = Gather<axis=0>(osh, i0)
  qsh = Shape(qh)
  os = Gather<axis=0>(qsh, i2)
  vsh = Shape(vh)
  od = Gather<axis=0>(vsh, i3)
  obu = Unsqueeze(ob, ax0)
  osu = Unsqueeze(os, ax0)
  odu = Unsqueeze(od, ax0)
  t2 = Concat<axis=0>(obu, minus1, osu, odu)
  o2 = Reshape(o, t2)"""
        if identity_reshape
        else "o2 = Identity(o)"
    )
    return f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch,seq,{E}] x{mask_input}) => (float[batch,seq,{E}] y)
<{_weights()},
 int64 i0 = {{0}}, int64 i1 = {{1}}, int64 i2 = {{2}}, int64 i3 = {{3}},
 int64[1] ax0 = {{0}}, int64[1] minus1 = {{-1}}, int64[1] hd = {{{D}}},
 float c = {{{(1.0 / np.sqrt(D)) ** 0.5:.9f}}}, float cs = {{{1.0 / np.sqrt(D):.9f}}},
 float[1] zero = {{0.0}}> {{
  q0 = MatMul(x, wq)
  q = Add(q0, bq)
  k0 = MatMul(x, wk)
  k = Add(bk, k0)
  v0 = MatMul(x, wv)
  v = Add(v0, bv)
  sh = Shape(x)
  b = Gather<axis=0>(sh, i0)
  s = Gather<axis=0>(sh, i1)
  bu = Unsqueeze(b, ax0)
  su = Unsqueeze(s, ax0)
  tgt = Concat<axis=0>(bu, su, minus1, hd)
  qr = Reshape(q, tgt)
  qh = Transpose<perm=[0,2,1,3]>(qr)
  kr = Reshape(k, tgt)
  kt = Transpose<perm=[0,2,3,1]>(kr)
  vr = Reshape(v, tgt)
  vh = Transpose<perm=[0,2,1,3]>(vr)
  {scores}
  p = Softmax<axis=-1>(sm)
  {probs}
  o = MatMul(pg, vh)
  {o_reshape}
  ot = Transpose<perm=[0,2,1,3]>(o2)
  t3 = Concat<axis=0>(bu, su, minus1)
  y = Reshape(ot, t3)
}}
"""


SDPA_SCORES = """qs = Mul(qh, c)
  ks = Mul(kt, c)
  sc = MatMul(qs, ks)
  sm = Add(sc, mask)"""
EAGER_SCORES = """sc0 = MatMul(qh, kt)
  sc = Mul(sc0, cs)
  sm = Add(sc, mask)"""
NO_MASK_SCORES = """qs = Mul(qh, c)
  ks = Mul(kt, c)
  sm = MatMul(qs, ks)"""
MASK = ", float[batch,1,seq,seq] mask"


def _causal_scores(seq: int) -> tuple[str, str]:
    """Scores plus a constant causal mask (static sequence length), and the mask's text."""
    values = np.triu(np.full((seq, seq), -np.inf), 1).reshape(-1)
    text = ", ".join("-inf" if np.isinf(v) else "0.0" for v in values)
    return (
        "sc = MatMul(qh, kt)\n  sm = Add(sc, causal)",
        f"float[1,1,{seq},{seq}] causal = {{{text}}}",
    )


def _feeds(batch: int, seq: int, fill: float, empty: bool, seed: int = 0) -> dict:
    """x and an additive mask: sequence 0 padded at its end, the last one fully padded when
    `empty` (a sequence whose attention_mask is all zeros)."""
    rng = np.random.default_rng(seed)
    keep = np.ones((batch, seq), bool)
    keep[0, seq // 2 :] = False
    if empty:
        keep[-1, :] = False
    mask = np.where(keep[:, None, None, :], 0.0, fill).astype(np.float32)
    mask = np.broadcast_to(mask, (batch, 1, seq, seq)).copy()
    return {"x": rng.standard_normal((batch, seq, E)).astype(np.float32), "mask": mask}


def _optimize(text: str, assume: tuple[str, ...] = (), **ctx) -> tuple:
    model = parse(text)
    out, report = optimize_proto(model, ctx=PassContext(assumptions=frozenset(assume), **ctx))
    return model, out, report


def _count(report, name: str, key: str) -> int:
    st = report.passes.get(name)
    return 0 if st is None else st.counts.get(key, 0)


def _reasons(report, name: str) -> list[str]:
    return [r.reason for r in report.refusals if r.pass_name == name]


# --------------------------------------------------------------------------- the NaN guard


def test_guard_kept_when_the_mask_can_empty_a_row() -> None:
    _, out, report = _optimize(_block(SDPA_SCORES, True, MASK), portable=True)
    assert _count(report, "remove-nan-guard", "guards") == 0
    assert op_counts(out)["IsNaN"] == 1
    assert any("--assume nonempty-sequences" in r for r in _reasons(report, "remove-nan-guard"))


def test_guard_removed_without_a_mask() -> None:
    model, out, report = _optimize(_block(NO_MASK_SCORES, True, ""), portable=True)
    assert _count(report, "remove-nan-guard", "guards") == 1
    assert "IsNaN" not in op_counts(out) and "Where" not in op_counts(out)
    for batch, seq in ((1, 5), (3, 11)):
        feeds = {"x": np.random.default_rng(seq).standard_normal((batch, seq, E), np.float32)}
        np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(model, feeds)[0], atol=1e-5)


def test_guard_removed_under_a_constant_causal_mask() -> None:
    scores, causal = _causal_scores(6)
    text = _block(scores, True, "").replace("float[1] zero", f"{causal},\n float[1] zero")
    model, out, report = _optimize(text, portable=True)
    assert _count(report, "remove-nan-guard", "guards") == 1
    assert "IsNaN" not in op_counts(out)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6, E), np.float32)}
    np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(model, feeds)[0], atol=1e-5)


def test_guard_kept_under_a_constant_mask_that_empties_a_row() -> None:
    scores, causal = _causal_scores(4)
    causal = causal.replace("{0.0,", "{-inf,", 1)  # row 0 keeps no position
    text = _block(scores, True, "").replace("float[1] zero", f"{causal},\n float[1] zero")
    _, out, report = _optimize(text, portable=True)
    assert _count(report, "remove-nan-guard", "guards") == 0
    assert "the constant attention mask empties a row" in " ".join(
        _reasons(report, "remove-nan-guard")
    )


def test_guard_removed_by_the_assumption_and_what_changes_on_an_empty_sequence() -> None:
    ctx = PassContext(assumptions=frozenset({NONEMPTY_SEQUENCES}), portable=True)
    model = parse(_block(SDPA_SCORES, True, MASK))
    out, report = optimize_proto(model, ctx=ctx)
    assert _count(report, "remove-nan-guard", "guards") == 1
    assert ctx.assumed == {NONEMPTY_SEQUENCES: {"remove-nan-guard": 1}}
    for batch, seq in ((2, 5), (3, 9)):
        honest = _feeds(batch, seq, -np.inf, empty=False, seed=seq)
        np.testing.assert_allclose(run_ort(out, honest)[0], run_ort(model, honest)[0], atol=1e-5)
    # an input that breaks the assumption: the fully padded sequence was zeros, is now NaN
    broken = _feeds(3, 9, -np.inf, empty=True)
    before, after = run_ort(model, broken)[0], run_ort(out, broken)[0]
    assert np.all(before[-1] == 0.0) and np.all(np.isnan(after[-1]))
    np.testing.assert_allclose(after[:-1], before[:-1], atol=1e-5)


# --------------------------------------------------------------------------- Attention


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_attention_emitted_and_exact_at_two_sequence_lengths(form: str) -> None:
    """SDPA (-inf mask, guard) and eager (finfo.min mask) blocks become one Attention whose
    outputs equal the original's under onnxruntime, fully padded sequences included."""
    scores, fill = (SDPA_SCORES, -np.inf) if form == "sdpa" else (EAGER_SCORES, np.finfo("f4").min)
    model, out, report = _optimize(_block(scores, form == "sdpa", MASK))
    ops = op_counts(out)
    assert _count(report, "emit-attention", "attention") == 1
    assert ops["Attention"] == 1 and "Softmax" not in ops and "MatMul" not in ops
    assert any(n.domain == "com.microsoft" for n in out.graph.node)
    # only the SDPA form needs the filter that keeps fully padded rows at zero: with a mask of
    # one head, a Mul by the rows kept (the mask's -inf raised to float32's lowest), no IsNaN
    assert _count(report, "emit-attention", "nan_filters") == (1 if form == "sdpa" else 0)
    assert "IsNaN" not in ops and ops["Max"] == ops["ReduceMax"] == (form == "sdpa")
    for batch, seq in ((2, 7), (3, 16)):
        feeds = _feeds(batch, seq, fill, empty=True, seed=seq)
        got, want = run_ort(out, feeds)[0], run_ort(model, feeds)[0]
        assert not np.isnan(want).any()
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_a_mask_per_head_keeps_the_isnan_filter_and_is_exact() -> None:
    """A mask with a head axis of H: a row may be empty in one head's slice of the output only,
    so the filter stays Where(IsNaN(Y), 0, Y); fully padded sequences are zeros as before."""
    text = _block(SDPA_SCORES, True, f", float[batch,{H},seq,seq] mask")
    model, out, report = _optimize(text)
    ops = op_counts(out)
    assert ops["Attention"] == 1 and ops["IsNaN"] == 1 and "Max" not in ops
    assert _count(report, "emit-attention", "nan_filters") == 1
    for batch, seq in ((2, 7), (3, 16)):
        feeds = _feeds(batch, seq, -np.inf, empty=True, seed=seq)
        feeds["mask"] = np.repeat(feeds["mask"], H, axis=1)
        feeds["mask"][0, 1, 2, :] = -np.inf  # one head's row of a kept sequence emptied too
        got, want = run_ort(out, feeds)[0], run_ort(model, feeds)[0]
        assert not np.isnan(want).any()
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_attention_under_the_assumption_drops_the_nan_filter() -> None:
    ctx = PassContext(assumptions=frozenset({NONEMPTY_SEQUENCES}))
    model = parse(_block(SDPA_SCORES, True, MASK))
    out, report = optimize_proto(model, ctx=ctx)
    assert _count(report, "emit-attention", "nan_filters") == 0
    assert "IsNaN" not in op_counts(out)
    assert ctx.assumed == {NONEMPTY_SEQUENCES: {"emit-attention": 1}}
    for batch, seq in ((2, 7), (3, 16)):
        honest = _feeds(batch, seq, -np.inf, empty=False, seed=seq)
        np.testing.assert_allclose(run_ort(out, honest)[0], run_ort(model, honest)[0], atol=1e-5)
    broken = _feeds(2, 7, -np.inf, empty=True)
    assert np.all(np.isnan(run_ort(out, broken)[0][-1]))
    assert np.all(run_ort(model, broken)[0][-1] == 0.0)


def test_attention_without_a_mask_and_without_the_sdpa_reshape() -> None:
    model, out, report = _optimize(_block(NO_MASK_SCORES, True, "", identity_reshape=False))
    assert op_counts(out)["Attention"] == 1 and "IsNaN" not in op_counts(out)
    for batch, seq in ((1, 4), (2, 13)):
        feeds = {"x": np.random.default_rng(seq).standard_normal((batch, seq, E), np.float32)}
        np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(model, feeds)[0], atol=1e-5)


def test_no_attention_when_portable_or_not_cpu() -> None:
    text = _block(SDPA_SCORES, True, MASK)
    for ctx in ({"portable": True}, {"target": "a100"}):
        _, out, report = _optimize(text, **ctx)
        assert "Attention" not in op_counts(out)
        assert _count(report, "emit-attention", "attention") == 0


def test_attention_refused_when_the_probabilities_are_a_graph_output() -> None:
    text = _block(EAGER_SCORES, False, MASK).replace(
        f"=> (float[batch,seq,{E}] y)", f"=> (float[batch,seq,{E}] y, float[batch,{H},seq,seq] p)"
    )
    _, out, report = _optimize(text)
    assert "Attention" not in op_counts(out)
    assert any("graph output" in r for r in _reasons(report, "emit-attention"))


def test_attention_refused_when_a_head_split_mixes_batch_and_sequence() -> None:
    """A Reshape whose batch entry is the sequence dim is no head split of this block."""
    text = _block(EAGER_SCORES, False, MASK).replace(
        "tgt = Concat<axis=0>(bu, su, minus1, hd)", "tgt = Concat<axis=0>(su, bu, minus1, hd)"
    )
    _, out, report = _optimize(text)
    assert "Attention" not in op_counts(out)
    assert any("batch and sequence" in r for r in _reasons(report, "emit-attention"))


# --------------------------------------------------------------------------- assumptions


def test_assumption_names_are_checked() -> None:
    assert check_assumptions(["Nonempty-Sequences", NONEMPTY_SEQUENCES]) == (NONEMPTY_SEQUENCES,)
    with pytest.raises(InferccError, match="not an assumption"):
        check_assumptions(["short-sequences"])


def test_generated_masks_honour_nonempty_sequences() -> None:
    mask = np.array([[1, 0, 1], [0, 0, 0]], np.int64)
    flags = np.zeros((2, 3), bool)
    ids = np.zeros((2, 3), np.int64)
    out = honour({"attention_mask": mask, "flags": flags, "input_ids": ids}, [NONEMPTY_SEQUENCES])
    assert out["attention_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]
    assert out["flags"].any(axis=-1).all()
    assert out["input_ids"] is ids  # not a mask: left alone
