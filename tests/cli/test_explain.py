"""`optimize --explain` names, for every refused rewrite, the anchor node and the node or value
where matching failed (the rule contract's `NoMatch(reason, at=...)`), in the table and in the
JSON report."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import parse, run_cli

# A cos/sin multiply-add whose sine term multiplies another input, not rotate_half(x):
# fuse-rotary-embedding anchors on the Add and fails at the sine product.
ALMOST_ROPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4,8,16] x, float[2,4,8,16] r, float[1,1,8,16] e) => (float[2,4,8,16] y) {
  [cos] c = Cos(e)
  [sin] s = Sin(e)
  [mul_cos] a = Mul(x, c)
  [mul_sin] b = Mul(r, s)
  [rope_add] y = Add(a, b)
}"""
REASON = "the sine term is not rotate_half(x): Concat(Neg(x[..., h:]), x[..., :h])"


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(parse(ALMOST_ROPE).SerializeToString())
    return path


def test_explain_names_the_node_where_matching_failed(tmp_path: Path) -> None:
    src = _model(tmp_path)
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--explain")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if "rope_add" in line]
    assert len(rows) == 1, r.stdout
    row = rows[0]
    assert "fuse-rotary-embedding" in row and "the sine term is not" in row
    assert "'mul_sin' (Mul)" in row
    assert "failed at" in r.stdout


def test_json_refusals_carry_where_matching_failed(tmp_path: Path) -> None:
    src = _model(tmp_path)
    r = run_cli("optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json")
    assert r.returncode == 0, r.stderr
    refusals = json.loads(r.stdout)["refusals"]
    rope = {"pass": "fuse-rotary-embedding", "node": "rope_add", "op": "Add", "reason": REASON}
    assert [x for x in refusals if x["node"] == "rope_add"] == [{**rope, "at": "'mul_sin' (Mul)"}]
