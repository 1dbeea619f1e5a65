"""Assumption hints: a rewrite refused only because an assumption was not stated is counted
(`PassContext.wants`) and offered in the report (`assumption_hints`) and the text output of
`optimize` and `calibrate --int4`; fuse-group-query-attention matches a layer through the SDPA
export's NaN guard, so that its count does not wait for remove-nan-guard, and fuses through
the guard under the assumption when remove-nan-guard is disabled."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc import api
from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.calib.weight_only import calibrate_int4
from infercc.passes.fuse_gqa import runtime_support
from tests.cli.test_cli import run
from tests.decoders import DECODER_SHAPES, cache_feeds, tiny_decoder
from tests.helpers import run_ort

pytestmark = pytest.mark.skipif(runtime_support() is not None, reason=str(runtime_support()))

GUARDED = dict(norm="rms", rotary=True, kv_heads=2, attention="sdpa", guard=True)
WANTED = {"fuse-group-query-attention": 2, "remove-nan-guard": 2}


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hints") / "model.onnx"
    onnx.save(tiny_decoder(layers=2, hidden=64, heads=4, vocab=50, **GUARDED), path)
    return path


def ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def test_optimize_offers_the_assumption_it_was_not_given(export, tmp_path) -> None:
    report = api.optimize(export, tmp_path / "exact.onnx", run_validation=False)
    (hint,) = report.to_dict()["assumption_hints"]
    assert hint["name"] == NONEMPTY_SEQUENCES and hint["rewrites"] == WANTED
    assert hint["flag"] == f"--assume {NONEMPTY_SEQUENCES}"
    assert ops(tmp_path / "exact.onnx")["GroupQueryAttention"] == 0

    stated = api.optimize(
        export, tmp_path / "assumed.onnx", assume=[NONEMPTY_SEQUENCES], run_validation=False
    )
    assert stated.assumption_hints == []
    assert ops(tmp_path / "assumed.onnx")["GroupQueryAttention"] == 2


def test_the_hint_is_one_line_of_the_cli_and_in_its_json(export, tmp_path) -> None:
    r = run("optimize", str(export), "-o", str(tmp_path / "m.onnx"), "--no-validate")
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("not assumed:")]
    assert f"--assume {NONEMPTY_SEQUENCES} would allow fuse-group-query-attention 2" in line
    assert "remove-nan-guard 2" in line
    j = run("optimize", str(export), "-o", str(tmp_path / "j.onnx"), "--no-validate", "--json")
    assert j.returncode == 0, j.stderr
    assert '"assumption_hints"' in j.stdout and '"fuse-group-query-attention": 2' in j.stdout


def test_calibrate_int4_offers_it_too(export, tmp_path) -> None:
    """And its table lists the nodes kept float for one reason on one line when they are many."""
    report = calibrate_int4(export, tmp_path / "int4", speed_check=False, accuracy_level=0)
    (hint,) = report.to_dict()["assumption_hints"]
    assert hint["rewrites"] == WANTED
    assert ops(tmp_path / "int4" / "model_int4.onnx")["GroupQueryAttention"] == 0
    r = run("calibrate", str(export), "--int4", "-o", str(tmp_path / "cli"), "--no-speed-check")
    assert r.returncode == 0, r.stderr
    assert "would allow fuse-group-query-attention 2" in r.stdout
    # the attention's 4 MatMuls of two activations (2 per layer) are one line, not four
    lines = [x for x in r.stdout.splitlines() if "a MatMul of two activations" in x]
    assert len(lines) == 1 and lines[0].startswith("kept float: 4 nodes (")
    assert lines[0].endswith("(--json lists them)")
    assert len([k for k in report.to_dict()["kept_float"] if "two activations" in k["reason"]]) == 4


def test_no_hint_where_nothing_waits_for_an_assumption(tmp_path) -> None:
    """The shipped CNN: nothing is refused for want of an assumption, no hint, no line."""
    cnn = Path(__file__).resolve().parents[2] / "examples" / "small_cnn.onnx"
    report = api.optimize(cnn, tmp_path / "out.onnx", run_validation=False)
    assert report.assumption_hints == []
    r = run("optimize", str(cnn), "-o", str(tmp_path / "cli.onnx"), "--no-validate")
    assert r.returncode == 0 and "not assumed" not in r.stdout


def test_gqa_fuses_through_the_guard_when_remove_nan_guard_is_disabled(export, tmp_path) -> None:
    out = tmp_path / "through.onnx"
    report = api.optimize(
        export,
        out,
        assume=[NONEMPTY_SEQUENCES],
        disable_passes=["remove-nan-guard"],
        run_validation=False,
    )
    got = ops(out)
    assert got["GroupQueryAttention"] == 2 and got["IsNaN"] == got["Softmax"] == 0
    (assumed,) = report.assumptions
    assert assumed["rewrites"] == {"fuse-group-query-attention": 2}
    original, fused = onnx.load(export), onnx.load(out)
    for shape in DECODER_SHAPES:
        feeds = cache_feeds(original, *shape)
        for want, have in zip(run_ort(original, feeds), run_ort(fused, feeds), strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4, err_msg=str(shape))
