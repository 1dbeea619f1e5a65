"""Random shape arithmetic at an integer width, for the differential fuzzer.

A model reads the lengths of two 1-D inputs (`x: bool[n]`, `y: bool[m]`), casts them to int32
or keeps them int64 (tf2onnx writes int32 shape arithmetic; torch int64), and chains Add, Sub,
Mul, Div, Mod, Neg, Abs, Min and Max over them and constants chosen near the width's limits
(65536, 46341 ~ sqrt(2**31), 2**40, 3037000500 ~ sqrt(2**63), ...). Its outputs are the last
values, their comparisons with the lengths, and a Reshape whose target they compute. The
property: the optimized model gives onnxruntime's outputs of the original at lengths where the
arithmetic wraps (32768, 46341, 65537, 2**23 + 1) as well as at small ones.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import make_model
from tests.integration.test_fuzz import optimize_with_report

LIMITS = {
    TensorProto.INT32: [1, 2, 3, 7, 1000, 32768, 46341, 65536, 2**31 - 1, -(2**31)],
    TensorProto.INT64: [1, 2, 3, 7, 65536, 2**32, 2**40, 3037000500, 2**62, 2**63 - 1, -(2**63)],
}
NUMPY = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}
BINARY = ["Add", "Sub", "Mul", "Mul", "Div", "Mod", "Min", "Max"]
UNARY = ["Neg", "Abs"]
# (n, m): small; int32 products near 2**31; 65536 * n wraps int32 from 32768; 2**40 * n wraps
# int64 from 2**23
LENGTHS = [(3, 5), (32768, 65537), (46341, 46341), (2**23 + 1, 1)]


class _Graph:
    def __init__(self, draw: st.DrawFn, dtype: int):
        self.draw, self.dtype = draw, dtype
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def const(self, value: int) -> str:
        name = self.name("k")
        self.inits.append(numpy_helper.from_array(np.array([value], NUMPY[self.dtype]), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def limit(self) -> int:
        return self.draw(st.sampled_from(LIMITS[self.dtype]))


def _length(g: _Graph, x: str) -> str:
    shape = g.op("Shape", [x])
    return shape if g.dtype == TensorProto.INT64 else g.op("Cast", [shape], to=g.dtype)


def _step(g: _Graph, pool: list[str]) -> str:
    a = g.draw(st.sampled_from(pool))
    if g.draw(st.integers(0, 5)) == 0:
        return g.op(g.draw(st.sampled_from(UNARY)), [a])
    op = g.draw(st.sampled_from(BINARY))
    if op in ("Div", "Mod"):  # by a non-zero constant other than -1 (INT_MIN / -1 traps)
        divisor = g.draw(st.sampled_from([v for v in LIMITS[g.dtype] if v not in (0, -1)]))
        return g.op(op, [a, g.const(divisor)])
    b = g.const(g.limit()) if g.draw(st.booleans()) else g.draw(st.sampled_from(pool))
    return g.op(op, [a, b] if g.draw(st.booleans()) else [b, a])


@st.composite
def width_models(draw: st.DrawFn) -> onnx.ModelProto:
    dtype = draw(st.sampled_from([TensorProto.INT32, TensorProto.INT64]))
    g = _Graph(draw, dtype)
    n, m = _length(g, "x"), _length(g, "y")
    pool = [n, m]
    for _ in range(draw(st.integers(1, 5))):
        pool.append(_step(g, pool))
    last = pool[-1]
    outputs = [last, g.op("Equal", [last, n]), g.op("Less", [last, m])]
    if draw(st.booleans()):  # a Reshape whose target the arithmetic computes: x as [1, n]
        back = last if dtype == TensorProto.INT64 else g.op("Cast", [last], to=TensorProto.INT64)
        # a 1 the arithmetic computes, never a division by a value that may have wrapped to
        # 0 (onnxruntime 1.23, the newest for Python 3.10, dies of SIGFPE on one)
        one = _int64_one(g)
        computed = g.op("Max", [g.op("Min", [back, one]), one]) if draw(st.booleans()) else None
        ones = computed or one
        target = g.op("Concat", [ones, g.op("Shape", ["x"])], axis=0)
        outputs.append(g.op("Reshape", ["x", target]))
    return _model(g, outputs)


def _int64_one(g: _Graph) -> str:
    name = g.name("one")
    g.inits.append(numpy_helper.from_array(np.array([1], np.int64), name))
    return name


def _model(g: _Graph, outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        g.nodes,
        "width",
        [
            helper.make_tensor_value_info("x", TensorProto.BOOL, ["n"]),
            helper.make_tensor_value_info("y", TensorProto.BOOL, ["m"]),
        ],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        g.inits,
    )
    model = make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime without its optimizations; its own errors (a division by a wrapped zero)
    raise without being logged."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), opts, ["CPUExecutionProvider"])
    return session.run(None, feeds)


def _feeds(n: int, m: int) -> dict[str, np.ndarray]:
    return {"x": np.zeros(n, np.bool_), "y": np.zeros(m, np.bool_)}


def check_width_outputs(model: onnx.ModelProto) -> object:
    """The property; returns the optimize report. A length at which the original itself
    fails to run (a Reshape target the wrapped arithmetic made invalid) is skipped there, and
    the optimized model must fail there too or give the same outputs."""
    onnx.checker.check_model(model, full_check=True)
    optimized, report = optimize_with_report(model, portable=False)
    for n, m in LENGTHS:
        feeds = _feeds(n, m)
        try:
            want = run_ort(model, feeds)
        except Exception:
            continue
        got = run_ort(optimized, feeds)
        for i, (w, o) in enumerate(zip(want, got, strict=True)):
            assert w.dtype == o.dtype and w.shape == o.shape, (n, m, i)
            assert np.array_equal(w, o), f"lengths {(n, m)}: output {i}: {w} != {o}"
    return report
