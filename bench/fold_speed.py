"""Time of fold-constants on an exporter-style, BERT-sized graph (and the rest of the pipeline).

    python bench/fold_speed.py [--layers 12] [--hidden 768] [--runs 3] [--json]

Builds in memory what torch.onnx writes for a BERT-base encoder at a static shape (batch 1,
sequence 128): per layer, the shape arithmetic exporters emit around every Reshape
(Shape -> Gather -> Unsqueeze -> Concat with constants -> Reshape, and Shape -> Slice -> Concat
for the head split and merge), the weights stored transposed behind a Transpose node (folding
computes W^T), a scale computed from constants (Sqrt(Cast(Gather(Shape)))), a
ConstantOfShape mask and Q/K/V MatMuls, LayerNormalization and GELU. Then runs
fold-constants alone and the default pipeline, `--runs` times each, and prints the median
time with the counts of what folded. Timing comparisons between two versions of infercc
interleave them (run A, B, A, B) and compare ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infercc.ir import import_model
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes

SEQ, BATCH = 128, 1


class _G:
    def __init__(self, rng: np.random.Generator):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = rng
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(self, array: np.ndarray) -> str:
        name = self.name("c")
        self.nodes.append(
            helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array))
        )
        return name

    def ints(self, values: list[int]) -> str:
        return self.const(np.array(values, np.int64))

    def weight(self, shape: tuple[int, ...]) -> str:
        name = self.name("w")
        w = (self.rng.standard_normal(shape) * 0.02).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, name))
        return name


def _dim(g: _G, x: str, i: int) -> str:
    """Unsqueeze(Gather(Shape(x), i)): one dimension as a 1-element tensor."""
    shape = g.op("Shape", [x])
    d = g.op("Gather", [shape, g.const(np.array(i, np.int64))], axis=0)
    return g.op("Unsqueeze", [d, g.ints([0])])


def _linear(g: _G, x: str, n_in: int, n_out: int) -> str:
    w_t = g.op("Transpose", [g.weight((n_out, n_in))], perm=[1, 0])  # stored as [out, in]
    y = g.op("MatMul", [x, w_t])
    return g.op("Add", [y, g.weight((n_out,))])


def _split_heads(g: _G, x: str, heads: int, head_dim: int) -> str:
    target = g.op(
        "Concat",
        [_dim(g, x, 0), _dim(g, x, 1), g.ints([heads]), g.ints([head_dim])],
        axis=0,
    )
    return g.op("Transpose", [g.op("Reshape", [x, target])], perm=[0, 2, 1, 3])


def _layer(g: _G, x: str, hidden: int, heads: int) -> str:
    head_dim = hidden // heads
    q = _split_heads(g, _linear(g, x, hidden, hidden), heads, head_dim)
    k = _split_heads(g, _linear(g, x, hidden, hidden), heads, head_dim)
    v = _split_heads(g, _linear(g, x, hidden, hidden), heads, head_dim)
    depth = g.op("Cast", [g.op("Slice", [g.op("Shape", [q]), g.ints([-1]), g.ints([2**62])])],
                 to=TensorProto.FLOAT)
    scale = g.op("Div", [g.const(np.array([1.0], np.float32)), g.op("Sqrt", [depth])])
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
    mask = g.op("ConstantOfShape", [g.op("Shape", [scores])],
                value=numpy_helper.from_array(np.array([0.0], np.float32)))
    probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    head = g.op("Slice", [g.op("Shape", [ctx]), g.ints([0]), g.ints([2])])
    merged = g.op("Reshape", [ctx, g.op("Concat", [head, g.ints([hidden])], axis=0)])
    h = g.op("Add", [_linear(g, merged, hidden, hidden), x])
    h = g.op("LayerNormalization", [h, g.weight((hidden,)), g.weight((hidden,))], axis=-1)
    ff = g.op("Gelu", [_linear(g, h, hidden, 4 * hidden)])
    out = g.op("Add", [_linear(g, ff, 4 * hidden, hidden), h])
    return g.op("LayerNormalization", [out, g.weight((hidden,)), g.weight((hidden,))], axis=-1)


def build(layers: int, hidden: int) -> onnx.ModelProto:
    g = _G(np.random.default_rng(0))
    x = "x"
    for _ in range(layers):
        x = _layer(g, x, hidden, max(1, hidden // 64))
    graph = helper.make_graph(
        g.nodes,
        "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, SEQ, hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [BATCH, SEQ, hidden])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def _time(model: onnx.ModelProto, passes: list[str]) -> tuple[float, dict]:
    ir = import_model(model)
    t0 = time.perf_counter()
    report = run_passes(ir, PassContext(target="cpu"), passes)
    seconds = time.perf_counter() - t0
    return seconds, dict(report.passes["fold-constants"].counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = build(args.layers, args.hidden)
    fold, pipeline, counts = [], [], {}
    for _ in range(args.runs):
        seconds, counts = _time(model, ["fold-constants"])
        fold.append(seconds)
        pipeline.append(_time(model, list(DEFAULT_PIPELINE))[0])
    result = {
        "nodes": len(model.graph.node),
        "fold_constants_s": round(statistics.median(fold), 3),
        "pipeline_s": round(statistics.median(pipeline), 3),
        "folded": counts,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
