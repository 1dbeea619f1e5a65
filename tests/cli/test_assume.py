"""--assume: unknown names and assumptions without effect are refused (exit 2, nothing written);
a stated assumption is listed in the report and the manifest with the rewrites it enabled,
and validation's random inputs satisfy it."""

from __future__ import annotations

import json

import onnx

from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.check.profiles import plan_feeds
from tests.cli.test_cli import listing, run
from tests.passes.test_attention import MASK, SDPA_SCORES, _block


def _attention_model(tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(onnx.parser.parse_model(_block(SDPA_SCORES, True, MASK)), path)
    return path


def test_unknown_assumption_is_exit_2_and_writes_nothing(tmp_path):
    src = _attention_model(tmp_path)
    r = run("optimize", str(src), "--assume", "short-sequences")
    assert r.returncode == 2
    assert "not an assumption infercc knows" in r.stderr and NONEMPTY_SEQUENCES in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert listing(tmp_path) == ["attn.onnx"]


def test_assumption_without_effect_is_exit_2(tmp_path):
    src = _attention_model(tmp_path)
    r = run(
        "optimize",
        str(src),
        "--assume",
        NONEMPTY_SEQUENCES,
        "--disable-pass",
        "emit-attention",
        "--disable-pass",
        "remove-nan-guard",
        "--disable-pass",
        "fuse-group-query-attention",  # it reads the assumption too
    )
    assert r.returncode == 2 and "has no effect" in r.stderr
    assert listing(tmp_path) == ["attn.onnx"]


def test_assumption_in_the_report_and_the_manifest(tmp_path):
    src = _attention_model(tmp_path)
    r = run("optimize", str(src), "--assume", NONEMPTY_SEQUENCES, "--json")
    assert r.returncode == 0, r.stderr
    (stated,) = json.loads(r.stdout)["assumptions"]
    assert stated["name"] == NONEMPTY_SEQUENCES and stated["rewrites"] == {"emit-attention": 1}
    exact = json.loads(run("optimize", str(src), "--json").stdout)
    assert exact["assumptions"] == [] and exact["passes"]["emit-attention"]["nan_filters"] == 1
    out = tmp_path / "art"
    r = run("optimize", str(src), "-o", str(out), "--assume", NONEMPTY_SEQUENCES, "--no-tune")
    assert r.returncode == 0, r.stderr
    assert "assumed nonempty-sequences" in r.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert [a["name"] for a in manifest["assumptions"]] == [NONEMPTY_SEQUENCES]


def test_random_inputs_honour_the_assumption():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool[64, 2] keep, float[64, 2] x) => (float[64, 2] y) {
      y = Where(keep, x, x)
    }
    """
    model = onnx.parser.parse_model(text)
    plain = plan_feeds(model, model).feeds[0]["keep"]
    assert not plain.any(axis=-1).all()  # coin flips leave some row all False
    honoured = plan_feeds(model, model, assumptions=(NONEMPTY_SEQUENCES,)).feeds[0]["keep"]
    assert honoured.any(axis=-1).all()
