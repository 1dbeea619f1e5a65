"""The inputs validation runs on (`infercc.check.profiles`): a second shape profile whenever an
input has a symbolic dimension, so that a wrongly baked dimension cannot pass; and, when the
original model fails on the default inputs, a ladder of sizes and values before giving up."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc import api
from infercc.check.profiles import plan_feeds, second_values
from infercc.check.validation import validate
from infercc.data.hints import compared_sizes, compared_values
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.passes.fuse_gqa import runtime_support
from infercc.passes.manager import REGISTRY, PassResult, register_pass
from tests.decoders import tiny_decoder
from tests.helpers import run_cli

BAKE = "test-bake-batch"

# y = x / batch: the batch size is computed from the shape, as exporters do.
PER_BATCH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 4] x) => (float[batch, 4] y) {
  shape = Shape(x)
  zero = Constant<value = int64[1] {0}>()
  b = Gather<axis = 0>(shape, zero)
  bf = Cast<to = 1>(b)
  y = Div(x, bf)
}
"""

# A reflect Pad of 32 on each side: the padded axis must be longer than 32 (silero VAD's STFT).
# onnxruntime >= 1.24 refuses a shorter input, 1.23 (the newest for Python 3.10) pads it with
# zeros, so the Reshape of x[:, 32:33] to [batch, 1] (empty below 33 samples) makes every
# version fail there; `rz` (zeros of [batch, 1]) is added to the output.
NEEDS_33_SAMPLES = """
  st = Constant<value = int64[1] {32}>()
  en = Constant<value = int64[1] {33}>()
  ax = Constant<value = int64[1] {1}>()
  t = Slice(x, st, en, ax)
  one = Constant<value = int64[2] {0, 1}>()
  r = Reshape(t, one)
  z = Constant<value = float {0}>()
  rz = Mul(r, z)
"""

REFLECT = (
    """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, samples] x) => (float[batch, padded] y) {
  pads = Constant<value = int64[4] {0, 32, 0, 32}>()
  p = Pad<mode = "reflect">(x, pads)
"""
    + NEEDS_33_SAMPLES
    + """
  y = Add(p, rz)
}
"""
)

# sr must be 16000 or 8000: any other value gathers row 7 of a 2-row table (out of bounds).
SAMPLE_RATE = (
    """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, samples] x, int64 sr) => (float[batch, padded] y) {
  k16 = Constant<value = int64 {16000}>()
  k8 = Constant<value = int64 {8000}>()
  is16 = Equal(sr, k16)
  is8 = Equal(sr, k8)
  i0 = Constant<value = int64 {0}>()
  i1 = Constant<value = int64 {1}>()
  bad = Constant<value = int64 {7}>()
  j = Where(is8, i1, bad)
  row = Where(is16, i0, j)
  table = Constant<value = float[2] {1, 2}>()
  scale = Gather(table, row)
  pads = Constant<value = int64[4] {0, 32, 0, 32}>()
  p = Pad<mode = "reflect">(x, pads)
"""
    + NEEDS_33_SAMPLES
    + """
  ps = Mul(p, scale)
  y = Add(ps, rz)
}
"""
)

# Only a length of exactly 300 takes the branch that runs; the model says so by comparing.
EXACT_LENGTH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[n] x) => (float[n] y) {
  shape = Shape(x)
  want = Constant<value = int64[1] {300}>()
  same = Equal(shape, want)
  ok = Squeeze(same)
  y = If(ok) <then_branch = t () => (float[n] a) { a = Neg(x) },
              else_branch = e () => (float[n] b) {
                  table = Constant<value = float[2] {1, 2}>()
                  far = Constant<value = int64 {9}>()
                  k = Gather(table, far)
                  b = Mul(x, k)
              }>
}
"""


def save(tmp_path: Path, text: str, name: str = "m.onnx") -> Path:
    proto = onnx.parser.parse_model(text)
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path / name
    onnx.save(proto, path)
    return path


def _bake_batch(graph, ctx):
    """A deliberately wrong pass: replaces Shape(x) by the shape of the profile it was given,
    baking the symbolic batch into a constant."""
    n = 0
    for node in list(graph.nodes):
        shapes = ctx.option("shapes")
        if node.op_type == "Shape" and shapes and ctx.allow_rewrite(node):
            dims = shapes[node.input(0).name]
            const = graph.make_constant(np.array(dims, np.int64), "baked_shape")
            graph.replace_all_uses_with(node.output, const)
            graph.remove(node)
            n += 1
    return PassResult(changed=n > 0, stats={"baked": n})


@pytest.fixture
def baking_pipeline(monkeypatch):
    register_pass(BAKE, reads=("shapes",))(_bake_batch)
    stages = api.pipelines
    monkeypatch.setattr(api, "pipelines", lambda cfg: [(BAKE, *s) for s in stages(cfg)])
    yield
    REGISTRY.pop(BAKE, None)


# --------------------------------------------------------------------------- the second profile


def test_a_baked_batch_passes_at_one_shape_and_fails_at_two(tmp_path, baking_pipeline) -> None:
    src = save(tmp_path, PER_BATCH)
    report = api.optimize(src, tmp_path / "out.onnx")
    v = report.validation
    assert report.passes[BAKE]["baked"] == 1
    assert [p["shapes"]["x"] for p in v.profiles] == [[1, 4], [3, 4]]
    assert [p["passed"] for p in v.profiles] == [True, False]  # one shape would have passed
    assert not v.passed and not report.passed
    assert not (tmp_path / "out.onnx").exists()
    assert report.bisect["guilty_pass"] == BAKE  # cheap: bisected by itself


def test_a_correct_build_passes_at_both_shapes(tmp_path) -> None:
    src = save(tmp_path, PER_BATCH)
    report = api.optimize(src, tmp_path / "out.onnx")
    assert report.passed
    assert [p["source"] for p in report.validation.profiles] == ["default", "derived"]
    assert report.validation.samples == 2


def test_second_values_are_other_sizes() -> None:
    assert second_values(1) == [3, 2]
    assert second_values(8) == [37, 40, 4, 16]
    assert second_values(224) == [253, 256, 112, 448]


def test_a_range_pins_the_second_profile(tmp_path) -> None:
    src = save(tmp_path, PER_BATCH)
    report = validate(src, src, shapes={"x": (2, 4)}, second_shapes={"x": (5, 4)})
    assert [(p["source"], p["shapes"]["x"]) for p in report.profiles] == [
        ("pinned", [2, 4]),
        ("pinned range", [5, 4]),
    ]
    config = api.build_config(profiles=[ShapeProfile("x", (1, 4), (2, 4), (6, 4))])
    assert config.shape_pins == {"x": (2, 4)} and config.second_pins == {"x": (6, 4)}


def test_no_second_profile_without_symbolic_dims(tmp_path) -> None:
    src = save(tmp_path, PER_BATCH.replace("batch", "2"))
    report = validate(src, src)
    assert len(report.profiles) == 1 and report.notes == []


def test_a_dim_the_original_cannot_change_stays_and_the_report_says_so(tmp_path) -> None:
    # A weight of 8 rows: batch varies, `n` must stay 8.
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, n] x) => (float[batch, 2] y) {
      w = Constant<value = float[8, 2] {1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8}>()
      y = MatMul(x, w)
    }
    """
    src = save(tmp_path, text)
    report = validate(src, src)
    assert [p["shapes"]["x"] for p in report.profiles] == [[1, 8], [3, 8]]
    assert any("varies batch only" in n and "n at 37, 40, 4, 16" in n for n in report.notes)


def test_a_model_that_runs_at_one_shape_only_is_noted(tmp_path) -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[n] x) => (float[8] y) {
      s = Constant<value = int64[1] {8}>()
      y = Reshape(x, s)
    }
    """
    report = validate(save(tmp_path, text), save(tmp_path, text, "c.onnx"))
    assert report.passed and len(report.profiles) == 1
    assert any("one shape profile only" in n for n in report.notes)


def test_samples_with_two_shapes_need_no_derived_profile(tmp_path) -> None:
    src = save(tmp_path, PER_BATCH)
    for i in (1, 2):
        np.savez(tmp_path / f"s{i}.npz", x=np.ones((i, 4), np.float32))
    report = validate(src, src, data=tmp_path)
    assert [p["source"] for p in report.profiles] == ["data"]
    np.savez(tmp_path / "s2.npz", x=np.ones((1, 4), np.float32))
    report = validate(src, src, data=tmp_path)
    assert [p["source"] for p in report.profiles] == ["data", "derived"]


# --------------------------------------------------------------------------- the ladder


def test_a_reflect_pad_longer_than_the_default_is_validated_at_a_larger_size(tmp_path) -> None:
    src = save(tmp_path, REFLECT)
    report = api.optimize(src, tmp_path / "out.onnx")
    v = report.validation
    assert report.passed and (tmp_path / "out.onnx").exists()
    assert v.profiles[0]["source"] == "ladder" and v.profiles[0]["shapes"]["x"] == [1, 64]
    (note,) = v.notes
    assert "fails on the default inputs (x float32[1, 8]" in note
    assert "Pad" in note or "Reshape" in note
    assert "validated at x float32[1, 64]" in note
    # the memory plan is at that shape too, not at the default [1, 8] the original fails at
    assert report.memory["shape_profile"] == {"x": [1, 64]}
    plan = json.loads((tmp_path / "out.memory_plan.json").read_text())
    assert plan["shape_profile"] == {"x": [1, 64]}


def test_cli_shows_the_profiles_and_why_the_default_failed(tmp_path, monkeypatch, capsys):
    import json
    import sys

    from infercc.cli.app import main

    src = save(tmp_path, REFLECT)
    monkeypatch.setattr(sys, "argv", ["infercc", "optimize", str(src), "--json"])
    main()
    data = json.loads(capsys.readouterr().out)["validation"]
    assert [p["source"] for p in data["profiles"]] == ["ladder", "derived"]
    assert data["profiles"][0]["shapes"] == {"x": [1, 64]} and len(data["notes"]) == 1
    monkeypatch.setattr(sys, "argv", ["infercc", "optimize", str(src)])
    main()
    text = " ".join(capsys.readouterr().out.split())
    assert "profile 1 (ladder): x=[1, 64]: passed" in text
    assert "profile 2 (derived): x=[3, 93]: passed" in text
    assert "note: the original model fails on the default inputs" in text


def test_an_input_compared_with_constants_gets_those_values(tmp_path) -> None:
    src = save(tmp_path, SAMPLE_RATE)
    assert compared_values(onnx.load(src)) == {"sr": [16000, 8000]}
    report = validate(src, src)
    first, second = report.profiles
    assert first["values"] == {"sr": 16000} and first["shapes"]["x"] == [1, 64]
    assert second["shapes"]["sr"] == [] and report.passed  # sr keeps its value at batch 3
    assert report.feeds[1]["sr"] == 16000


def test_sizes_come_from_constants_the_model_compares_shapes_with(tmp_path) -> None:
    src = save(tmp_path, EXACT_LENGTH)
    assert compared_sizes(onnx.load(src)) == [300]
    report = validate(src, src)
    assert report.profiles[0]["shapes"]["x"] == [300]


def test_when_the_original_fails_everywhere_the_error_says_so(tmp_path) -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[n] x) => (float[7] y) {
      s = Constant<value = int64[1] {7}>()
      y = Reshape(x, s)
    }
    """
    src = save(tmp_path, text)
    with pytest.raises(InferccError) as exc:
        api.optimize(src, tmp_path / "out.onnx")
    message, hint = exc.value.message, exc.value.hint
    expected = "the original model fails in onnxruntime on the generated inputs (x float32[1])"
    assert message.startswith(expected)
    assert "requested shape:{7}" in message and "\n" not in message
    assert message.endswith("it fails with n at 8, 16, 32, 64, 128, 224, 256, 512, 640 too")
    assert "--shape" in hint and "--data" in hint and "--no-validate" in hint
    assert not (tmp_path / "out.onnx").exists()


def test_the_plan_runs_the_original_once_per_attempt(tmp_path) -> None:
    src = save(tmp_path, REFLECT)
    plan = plan_feeds(src, onnx.load(src))
    assert [p.shapes["x"] for p in plan.profiles] == [(1, 64), (3, 93)]
    pairs = zip(plan.expected, plan.feeds, strict=True)
    assert all(e["y"].shape[1] == f["x"].shape[1] + 64 for e, f in pairs)


def test_a_decoder_is_validated_at_a_prefill_and_a_chunk_after_a_past(tmp_path) -> None:
    """Random dims never make the mask as long as cache + new tokens: a KV-cache decoder gets
    its own two profiles, and `optimize --assume nonempty-sequences` validates its
    GroupQueryAttention build at both (batch 3 after a past: the kernel's chunk path)."""
    proto = tiny_decoder(layers=2, kv_heads=2, rotary=True, attention="sdpa")
    plan = plan_feeds(proto, proto)
    assert [p.source for p in plan.profiles] == ["decoder prefill", "decoder chunk after a past"]
    chunk = plan.profiles[1].shapes
    assert chunk["input_ids"] == (3, 5) and chunk["attention_mask"] == (3, 12)
    assert chunk["past_key_values.0.key"] == (3, 2, 7, 16)
    assert any("a decoder" in n for n in plan.notes)
    if runtime_support() is not None:
        pytest.skip(runtime_support())
    src = tmp_path / "decoder.onnx"
    onnx.save(proto, src)
    out = tmp_path / "out.onnx"
    done = run_cli("optimize", str(src), "-o", str(out), "--assume", "nonempty-sequences", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passes"]["fuse-group-query-attention"]["fused"] == 2
    sources = [p["source"] for p in report["validation"]["profiles"]]
    assert sources == ["decoder prefill", "decoder chunk after a past"]
    assert report["validation"]["passed"] is True
