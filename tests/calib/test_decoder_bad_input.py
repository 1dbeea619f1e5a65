"""Bad input around decoders: a cache whose inputs cannot be paired with outputs, and
`--assume` on a model where no pass uses it. One line, exit 2, nothing written, in
`calibrate --int4` and in `optimize`."""

from __future__ import annotations

import onnx
import pytest

from infercc.analysis.decoder import decoder_signature
from infercc.errors import InferccError
from tests.calib.test_weight_only import mlp
from tests.decoders import tiny_decoder
from tests.helpers import run_cli


def decoder() -> onnx.ModelProto:
    return tiny_decoder(layers=2, hidden=64, heads=4)


def without_output(name: str) -> onnx.ModelProto:
    """The decoder with one present left out of its outputs: 4 pasts, 3 presents."""
    model = decoder()
    kept = [vi for vi in model.graph.output if vi.name != name]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    return model


def renamed_presents(heads_of_last: int | None = None) -> onnx.ModelProto:
    """Presents renamed so no name pairs (present_kvN, in order); `heads_of_last`: the last one
    declared with that many heads, so the pairs in order do not match either."""
    model = decoder()
    names = {f"present.{i}.{kind}": f"present_kv{2 * i + j}"
             for i in range(2) for j, kind in enumerate(("key", "value"))}  # fmt: skip
    for node in model.graph.node:
        node.input[:] = [names.get(i, i) for i in node.input]
        node.output[:] = [names.get(o, o) for o in node.output]
    for vi in model.graph.output:
        vi.name = names.get(vi.name, vi.name)
    if heads_of_last is not None:
        model.graph.output[-1].type.tensor_type.shape.dim[1].dim_value = heads_of_last
    return model


def test_renamed_presents_of_the_same_shape_pair_in_order():
    sig = decoder_signature(renamed_presents())
    assert [(c.past, c.present) for c in sig.caches] == [
        ("past_key_values.0.key", "present_kv0"),
        ("past_key_values.0.value", "present_kv1"),
        ("past_key_values.1.key", "present_kv2"),
        ("past_key_values.1.value", "present_kv3"),
    ]


@pytest.mark.parametrize(
    "model, message",
    [
        (lambda: without_output("present.1.value"),
         "cache inputs cannot be paired with its outputs: 'past_key_values.1.value' match no "
         "present output by name, and its 4 past input(s) and 3 present output(s)"),
        (lambda: renamed_presents(heads_of_last=3), "cannot be paired with its outputs"),
    ],
)  # fmt: skip
def test_a_cache_that_cannot_be_paired_is_refused(tmp_path, model, message):
    proto = model()
    with pytest.raises(InferccError, match="cannot be paired"):
        decoder_signature(proto)
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    for command in (("calibrate", str(src), "--int4", "-o", str(tmp_path / "q")),
                    ("optimize", str(src), "-o", str(tmp_path / "o.onnx"))):  # fmt: skip
        done = run_cli(*command)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_present_whose_name_pairs_but_shape_differs_is_refused():
    model = decoder()
    model.graph.output[1].type.tensor_type.shape.dim[3].dim_value = 8  # present.0.key
    with pytest.raises(InferccError, match="'past_key_values.0.key' and the output "
                       "'present.0.key' its name pairs it with differ"):  # fmt: skip
        decoder_signature(model)


@pytest.mark.parametrize("command", ["calibrate", "optimize"])
def test_assume_where_no_pass_uses_it_is_refused(tmp_path, command):
    """The MLP has no attention: nonempty-sequences enables nothing there."""
    src = mlp(tmp_path)
    out = tmp_path / ("q" if command == "calibrate" else "o.onnx")
    extra = ["--int4", "--no-speed-check"] if command == "calibrate" else []
    done = run_cli(command, str(src), "-o", str(out), "--assume", "nonempty-sequences", *extra)
    assert done.returncode == 2, done.stderr
    assert "--assume nonempty-sequences has no effect on this model" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


def test_assume_on_a_decoder_whose_attention_it_cannot_change(tmp_path):
    """GPT-2's attention (masked with Where, no NaN guard) needs no assumption to fuse."""
    src = tmp_path / "gpt.onnx"
    onnx.save(decoder(), src)
    done = run_cli("calibrate", str(src), "--int4", "-o", str(tmp_path / "q"),
                   "--assume", "nonempty-sequences")  # fmt: skip
    assert done.returncode == 2
    assert "fuse-group-query-attention found nothing to rewrite" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt.onnx"]
