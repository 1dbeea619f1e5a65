"""A second optimize of infercc's output changes nothing when a node comes to produce a graph
output: the output keeps its declared dims in the first run as the importer gives them in the
second (found by bench/fuzz.py, seed 0: a Reshape of the output by [1, 1] went only in the
second run)."""

from __future__ import annotations

from pathlib import Path

import onnx

from infercc import api

MODEL = """
<ir_version: 6, opset_import: ["" : 11]>
fuzz (float[N,1] x) => (float[1,1] r0, float[1,1] s1) {
   w = Constant <value: tensor = float[1,1] w {0.125}> ()
   c = Constant <value: tensor = float[1] c {-0.13}> ()
   g = Gemm (x, w, c)
   t0 = Constant <value: tensor = int64[2] t0 {0, -1}> ()
   r0 = Reshape (g, t0)
   t1 = Constant <value: tensor = int64[2] t1 {1, 1}> ()
   r1 = Reshape (g, t1)
   s1 = Softmax <axis: int = 0> (r1)
}
"""


def test_an_output_taken_over_by_a_node_keeps_its_declared_dims(tmp_path: Path) -> None:
    src, first, second = tmp_path / "m.onnx", tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(onnx.parser.parse_model(MODEL), src)
    api.optimize(src, first, run_validation=False, verify=True)
    api.optimize(first, second, run_validation=False, verify=True)
    assert second.read_bytes() == first.read_bytes()
    assert [n.op_type for n in onnx.load(first).graph.node].count("Reshape") == 0
