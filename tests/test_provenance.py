"""What an optimized file records of its build (metadata_props): infercc's version, the target,
the precision and the options that shaped it; the input's own entries kept, an earlier
build's replaced, so the same build of the same input writes the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from infercc import api
from infercc.version import __version__

SMALL_CNN = Path(__file__).resolve().parents[1] / "examples" / "small_cnn.onnx"


def props(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(path).metadata_props}


def test_the_file_records_its_build_and_a_rebuild_is_byte_identical(tmp_path):
    src = tmp_path / "in.onnx"
    model = onnx.load(SMALL_CNN)
    model.metadata_props.add(key="author", value="someone")
    onnx.save(model, src)
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    api.optimize(src, first, target="a100", precision="fp16", disable_passes=["eliminate-no-ops"])
    got = props(first)
    assert got["author"] == "someone" and got["infercc.version"] == __version__
    assert got["infercc.target"] == "a100" and got["infercc.precision"] == "fp16"
    assert json.loads(got["infercc.options"]) == {"disable_passes": ["eliminate-no-ops"]}
    api.optimize(
        first,
        second,
        target="a100",
        precision="fp16",
        disable_passes=["eliminate-no-ops"],
        validate=False,
    )
    assert second.read_bytes() == first.read_bytes()
    third = tmp_path / "c.onnx"
    api.optimize(first, third, validate=False)  # another build: its own record, once
    again = props(third)
    assert again["infercc.target"] == "cpu" and json.loads(again["infercc.options"]) == {}
    assert len([p for p in onnx.load(third).metadata_props if p.key == "infercc.target"]) == 1


def test_an_assumption_stays_recorded_through_a_rebuild(tmp_path):
    """A model built under --assume is exact only under it: a rebuild that states nothing
    keeps the record (and writes the same bytes). SDPA's NaN guard: removed under the
    assumption by any onnxruntime (GroupQueryAttention needs a newer one than Python 3.10's)."""
    from tests.decoders import tiny_decoder

    src, first, second = tmp_path / "d.onnx", tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(tiny_decoder(layers=1, kv_heads=2, attention="sdpa", guard=True), src)
    api.optimize(src, first, assume=["nonempty-sequences"], validate=False)
    assert props(first)["infercc.assume"] == "nonempty-sequences"
    api.optimize(first, second, validate=False)
    assert props(second)["infercc.assume"] == "nonempty-sequences"
    assert second.read_bytes() == first.read_bytes()
