"""The same input gives byte-identical output; optimizing an optimized model changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercc import api
from tests.zoo import light_path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODELS = {
    "small_cnn": EXAMPLES / "small_cnn.onnx",
    "tiny_encoder": EXAMPLES / "tiny_encoder.onnx",
    "resnet50": light_path("resnet50"),
    "inception_v2": light_path("inception_v2"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deterministic_and_idempotent(name, tmp_path, optimized):
    src = MODELS[name]
    # the session's build (made by whichever test asked first) and one made here
    built = optimized(src)
    first = built.report
    api.optimize(src, tmp_path / "b.onnx", verify=True)
    a = built.output.read_bytes()
    assert a == (tmp_path / "b.onnx").read_bytes()
    again = api.optimize(built.output, tmp_path / "c.onnx", verify=True)
    assert first.nodes_after < first.nodes_before
    assert again.nodes_before == again.nodes_after == first.nodes_after
    assert again.ops_before == again.ops_after
    assert (tmp_path / "c.onnx").read_bytes() == a
    assert first.passed and again.passed


def test_examples_are_optimized_as_documented(tmp_path, optimized):
    cnn = optimized(MODELS["small_cnn"]).report
    assert cnn.ops_before["BatchNormalization"] == 3 and "BatchNormalization" not in cnn.ops_after
    assert cnn.ops_after.get("com.microsoft.FusedConv") == 2  # the third Conv feeds the Add
    assert "Identity" not in cnn.ops_after and "Dropout" not in cnn.ops_after
    # portable: standard ONNX, Q/K/V projections packed into one MatMul and a Split
    enc = api.optimize(MODELS["tiny_encoder"], tmp_path / "enc.onnx", portable=True)
    assert enc.passes["fuse-qkv"]["groups"] == 1
    assert enc.ops_after["MatMul"] == enc.ops_before["MatMul"] - 2
    assert enc.ops_after["Split"] == 1
    # cpu target: the packed projection and the attention block become one Attention op
    enc = optimized(MODELS["tiny_encoder"]).report
    assert enc.passes["emit-attention"]["attention"] == 1
    assert enc.ops_after["com.microsoft.Attention"] == 1
    assert enc.ops_after["MatMul"] == 1 and "Split" not in enc.ops_after  # the output projection


def test_unknown_target_lists_known_ones(tmp_path):
    from infercc.errors import InferccError

    with pytest.raises(InferccError) as e:
        api.optimize(MODELS["small_cnn"], tmp_path / "o.onnx", target="tpu9000")
    assert "unknown target 'tpu9000'" in e.value.message and "a100" in e.value.hint
    assert list(tmp_path.iterdir()) == []
