"""`calibrate --int4`'s embedding tables: float by default (as onnxruntime's quantizer and
onnxruntime-genai keep them), int4 with --embeddings, the choice stated in the report."""

from __future__ import annotations

import re
from collections import Counter

import onnx
import pytest

from infercc.calib.weight_only import calibrate_int4
from tests.calib.test_weight_only import mlp
from tests.decoders import tiny_decoder
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The tiny decoder's int4 build without and with --embeddings: (report dict, op counts)."""
    root = tmp_path_factory.mktemp("emb")
    path = root / "decoder.onnx"
    onnx.save(tiny_decoder(hidden=64), path)
    found = {}
    for embeddings in (False, True):
        out = root / f"out_{embeddings}"
        report = calibrate_int4(
            path, out, speed_check=False, accuracy_level=0, embeddings=embeddings
        )
        model = onnx.load(out / "model_int4.onnx")
        found[embeddings] = report.to_dict(), Counter(n.op_type for n in model.graph.node)
    return path, found


def test_tables_stay_float_by_default_and_the_report_says_so(builds):
    _path, found = builds
    d, ops = found[False]
    assert d["embeddings"] == [] and ops["GatherBlockQuantized"] == 0 and ops["Gather"] >= 2
    tables = [k for k in d["kept_float"] if k["cause"] == "default"]
    assert [k["node"] for k in tables] == ["Gather_1", "Gather_2"]  # wte, wpe
    assert all("--embeddings makes it int4" in k["reason"] for k in tables)
    # the bytes each reason says int4 would save add up to what --embeddings saves
    said = sum(int(re.search(r"([\d,]+) bytes smaller", k["reason"])[1].replace(",", ""))
               for k in tables)  # fmt: skip
    saved = d["size"]["after_bytes"] - found[True][0]["size"]["after_bytes"]
    assert saved == pytest.approx(said, rel=0.02)


def test_embeddings_flag_quantizes_them(builds):
    _path, found = builds
    d, ops = found[True]
    assert d["embeddings"] == ["Gather_1", "Gather_2"] and ops["GatherBlockQuantized"] == 2
    assert not [k for k in d["kept_float"] if k["cause"] == "default"]
    assert d["quantized_nodes"] == found[False][0]["quantized_nodes"] == 9


@pytest.mark.parametrize(
    "model, extra, message",
    [
        ("decoder", ["--embeddings", "--portable"], "--embeddings has no effect on the standard"),
        ("decoder", ["--embeddings", "--target", "a100"], "--embeddings has no effect on the"),
        ("mlp", ["--embeddings"], "--embeddings has no effect: the model has no embedding"),
    ],
)
def test_embeddings_without_effect_is_refused(builds, tmp_path, model, extra, message):
    path = builds[0] if model == "decoder" else mlp(tmp_path)
    out = tmp_path / "out"
    done = run_cli("calibrate", str(path), "--int4", "-o", str(out), "--no-speed-check", *extra)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()
