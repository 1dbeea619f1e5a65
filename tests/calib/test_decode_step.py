"""Decoders whose calls are fixed: a decode-step export (`input_ids` [batch, 1]), a static
batch, and `--shape` pins. Validation's profiles and calibration's samples keep every static
dim; calibrate takes `--shape` as optimize does (the same parsing and refusals)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from infercc.analysis.decoder import StepDims, decoder_signature
from infercc.calib.decoder_samples import prompt_calls, random_prompts
from infercc.check.profiles import plan_feeds
from tests.decoders import tiny_decoder
from tests.helpers import run_cli

CACHE = "past_key_values.0.key"


def with_static(model: onnx.ModelProto, dims: dict[tuple[str, int], int]) -> onnx.ModelProto:
    """`model` with the (input or output name, axis) dims in `dims` declared static."""
    for vi in [*model.graph.input, *model.graph.output]:
        for (name, axis), size in dims.items():
            if vi.name == name:
                dim = vi.type.tensor_type.shape.dim[axis]
                dim.Clear()
                dim.dim_value = size
    onnx.checker.check_model(model, full_check=True)
    return model


def step_model() -> onnx.ModelProto:
    """The tiny Llama-style decoder exported for one new token per call."""
    model = tiny_decoder(layers=1, hidden=64, heads=4, kv_heads=2, norm="rms", rotary=True)
    return with_static(model, {("input_ids", 1): 1, ("position_ids", 1): 1, ("logits", 1): 1})


def batch2_model() -> onnx.ModelProto:
    """The tiny decoder exported at batch 2: every input's and output's axis 0 is 2."""
    model = tiny_decoder(layers=1, hidden=64, heads=4)
    names = [vi.name for vi in [*model.graph.input, *model.graph.output]]
    return with_static(model, {(n, 0): 2 for n in names})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("step")
    paths = {}
    for name, proto in (("step", step_model()), ("batch2", batch2_model())):
        paths[name] = root / f"{name}.onnx"
        onnx.save(proto, paths[name])
    full = tiny_decoder(layers=1, hidden=64, heads=4, kv_heads=2, norm="rms", rotary=True)
    paths["full"] = root / "full.onnx"  # the same weights, any number of tokens per call
    onnx.save(full, paths["full"])
    ids = np.random.default_rng(1).integers(0, 50, (10, 1, 12)).astype(np.int64)
    np.savez(root / "prompts.npz", input_ids=ids)
    paths["prompts"] = root / "prompts.npz"
    return paths


# --------------------------------------------------------------------------- the signature


def test_the_signature_reads_the_static_dims(models):
    step = decoder_signature(onnx.load(models["step"]))
    assert step.fixed == StepDims(new=1) and not step.fixed.prefill
    assert step.fixed.fit(1, 0, 8) == (1, 0, 1)
    batch2 = decoder_signature(onnx.load(models["batch2"]))
    assert batch2.fixed == StepDims(batch=2)
    assert [c.batch_axis for c in batch2.caches] == [0, 0]  # a static batch axis
    pinned = decoder_signature(onnx.load(models["full"])).pinned({CACHE: (1, 2, 5, 16)})
    assert pinned.fixed == StepDims(batch=1, past=5) and pinned.fixed.fit(3, 0, 8) == (1, 5, 8)
    masked = step.pinned({"attention_mask": (1, 6)}).fixed
    assert masked == StepDims(batch=1, new=1, total=6) and masked.fit(3, 0, 8) == (1, 5, 1)


# --------------------------------------------------------------------------- validation


def test_a_decode_step_model_is_validated_at_one_token_after_two_pasts(models):
    proto = onnx.load(models["step"])
    plan = plan_feeds(models["step"], proto)
    assert [p.source for p in plan.profiles] == [
        "decoder step after a past",
        "decoder step after a longer past",
    ]
    first, second = (p.feeds[0] for p in plan.profiles)
    assert first["input_ids"].shape == (1, 1) and second["input_ids"].shape == (3, 1)
    assert first[CACHE].shape == (1, 2, 8, 16) and second[CACHE].shape == (3, 2, 37, 16)
    assert first["attention_mask"].shape == (1, 9) and second["attention_mask"].shape == (3, 38)
    assert first["position_ids"].tolist() == [[8]] and second["position_ids"].tolist() == [[37]] * 3
    assert plan.profiles[1].expected[0]["present.0.key"].shape == (3, 2, 38, 16)
    assert any("8 cached + 1 new" in n and "37 cached + 1 new" in n for n in plan.notes)


def test_a_static_batch_stays_in_both_profiles(models):
    plan = plan_feeds(models["batch2"], onnx.load(models["batch2"]))
    shapes = [p.shapes for p in plan.profiles]
    assert [s["input_ids"] for s in shapes] == [(2, 8), (2, 5)]
    assert [s[CACHE] for s in shapes] == [(2, 4, 0, 16), (2, 4, 7, 16)]


def test_shape_pins_a_call_of_the_first_profile(models):
    proto = onnx.load(models["full"])
    plan = plan_feeds(models["full"], proto, shapes={"input_ids": (2, 1)})
    assert [p.source for p in plan.profiles] == [
        "decoder step after a past",
        "decoder chunk after a past",  # the second profile is free: a range would pin it
    ]
    assert plan.profiles[0].shapes[CACHE] == (2, 2, 8, 16)
    ranged = plan_feeds(models["full"], proto, {"input_ids": (1, 4)}, second_shapes={
        "input_ids": (2, 4)})  # fmt: skip
    assert [p.shapes["input_ids"] for p in ranged.profiles] == [(1, 4), (2, 4)]


def test_optimize_validates_a_decode_step_export(models, tmp_path):
    out = tmp_path / "out.onnx"
    done = run_cli("optimize", str(models["step"]), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    validation = json.loads(done.stdout)["validation"]
    assert validation["passed"] is True
    assert [p["shapes"]["input_ids"] for p in validation["profiles"]] == [[1, 1], [3, 1]]


# --------------------------------------------------------------------------- calibration


def test_prompt_calls_chain_the_original_cache(models):
    """A prompt fed one token a call, each call on the presents of the one before, gives the
    logits the same decoder computes for the whole prompt in one prefill."""
    sig = decoder_signature(onnx.load(models["step"]))
    (prompt,) = random_prompts(sig, 1)
    assert prompt["input_ids"].shape == (1, 32)
    calls = prompt_calls(models["step"], sig, [prompt])
    assert len(calls) == 32
    assert [c[CACHE].shape[2] for c in calls] == list(range(32))
    step = ort.InferenceSession(str(models["step"]), providers=["CPUExecutionProvider"])
    logits = np.concatenate([step.run(["logits"], c)[0] for c in calls], axis=1)
    full = ort.InferenceSession(str(models["full"]), providers=["CPUExecutionProvider"])
    prefill = {k: v for k, v in prompt_calls(models["full"], decoder_signature(
        onnx.load(models["full"])), [prompt])[0].items()}  # fmt: skip
    expected = full.run(["logits"], prefill)[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def test_prompts_fill_a_static_batch(models):
    sig = decoder_signature(onnx.load(models["batch2"]))
    prompts = [{"input_ids": np.arange(6)[None]}]
    (call,) = prompt_calls(models["batch2"], sig, prompts)
    assert call["input_ids"].tolist() == [list(range(6))] * 2
    assert call[CACHE].shape == (2, 4, 0, 16)


def calibrate(path, out, *extra):
    return run_cli(
        "calibrate", str(path), "--int4", "-o", str(out), "--no-speed-check",
        "--accuracy-level", "0", "--json", *extra,
    )  # fmt: skip


def test_calibrate_int4_takes_a_decode_step_export(models, tmp_path):
    done = calibrate(models["step"], tmp_path / "random")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["samples"]["evaluation"] == 8 * 32  # 8 random prompts, 32 calls each
    assert report["quantized_nodes"] == 5 and 0.0 < report["top1_agreement"] <= 1.0
    model = onnx.load(tmp_path / "random" / "model_int4.onnx")
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    assert dims == [1]  # still a decode-step model


def test_calibrate_int4_feeds_a_decode_step_export_its_prompts_a_token_a_call(models, tmp_path):
    done = calibrate(models["step"], tmp_path / "data", "--data", str(models["prompts"]))
    assert done.returncode == 0, done.stderr
    # 10 prompts of 12 tokens: 8 calibrate, 2 are held out, each 12 calls of one token
    assert json.loads(done.stdout)["samples"]["evaluation"] == 2 * 12


def test_calibrate_shape_pins_the_batch(models, tmp_path):
    sig = decoder_signature(onnx.load(models["step"])).pinned({"input_ids": (2, 1)})
    assert {p["input_ids"].shape for p in random_prompts(sig)} == {(2, 32)}
    done = calibrate(models["step"], tmp_path / "b2", "--shape", "input_ids=2x1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["samples"]["evaluation"] == 8 * 32


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--shape", "input_ids=1x4"], "sets axis 1 to 4, the model fixes it to 1"),
        (["--shape", "nope=1x1"], "--shape names 'nope', which is not an input of the model"),
        (["--shape", "input_ids=1x1x1"], "--shape input_ids has rank 3 but the input has rank 2"),
        (["--shape", "input_ids=1x1:1x1:2x1"], "gives a range: calibrate's random inputs"),
        (["--shape", "input_ids=1"], "has rank 1"),
        (["--shape", "input_idsx1"], "bad --shape"),
        (["--shape", "input_ids=2x1", "--shape", "attention_mask=3x9"],
         "sets the decoder's batch to 3, where --shape input_ids sets it to 2"),
        (["--shape", "attention_mask=1x4", "--shape", f"{CACHE}=1x2x8x16"],
         "attention mask 4 long"),
    ],
)  # fmt: skip
def test_bad_shapes_exit_2_nothing_written(models, tmp_path, extra, message):
    out = tmp_path / "out"
    done = calibrate(models["step"], out, *extra)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_optimize_and_validate_refuse_the_same_shapes(models, tmp_path):
    step = str(models["step"])
    for spec in ("input_ids=1x4", "input_ids=2x1"):
        extra = ["--shape", spec] + (["--shape", "attention_mask=3x9"] if "2x1" in spec else [])
        out = tmp_path / "out.onnx"
        commands = (("optimize", step, "-o", str(out)), ("validate", step, "--reference", step))
        for command in commands:
            done = run_cli(*command, *extra)
            assert done.returncode == 2, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not out.exists()


def test_shape_where_it_has_no_effect_is_refused(models, tmp_path):
    with_data = calibrate(models["step"], tmp_path / "d", "--data", str(models["prompts"]),
                          "--shape", "input_ids=1x1")  # fmt: skip
    assert with_data.returncode == 2 and "--shape has no effect with --data" in with_data.stderr
    int8 = run_cli("calibrate", str(models["step"]), "--data", str(models["prompts"]),
                   "-o", str(tmp_path / "i"), "--shape", "input_ids=1x1")  # fmt: skip
    assert int8.returncode == 2 and "--shape applies to --int4 only" in int8.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
