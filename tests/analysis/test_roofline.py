"""Roofline costs, classification, precision and the memory budget, on made-up targets."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from infercc.analysis.roofline import (
    analyze,
    default_workspace,
    largest_batch,
    memory_budget,
    node_cost,
    plot_roofline,
)
from infercc.errors import InferccError
from infercc.ir import import_model, load_model
from infercc.ir.shapes import concrete_types
from tests.helpers import make_model, parse
from tests.zoo import light_path

targets = pytest.importorskip("infercc.analysis.targets")
Target = targets.Target

F = 4  # bytes per float32


def make_target(peaks: dict[str, float], bandwidth: float = 1e10, memory: int = 10**6):
    order = [p for p in ("fp32", "tf32", "fp16", "bf16", "fp8", "int8") if p in peaks]
    return Target(
        name="made-up",
        kind="gpu",
        description="test target",
        peak_flops={p: peaks[p] for p in order},
        memory_bandwidth=bandwidth,
        memory_bytes=memory,
        compute_capability=None,
        precisions=tuple(order),
        source="tests",
    )


# fp32 ridge point: 1e12 / 1e10 = 100 FLOP/byte; fp16 peak 10x.
TARGET = make_target({"fp32": 1e12, "fp16": 1e13})


def model_of(text: str, **weights: np.ndarray):
    proto = parse(text) if not weights else onnx.parser.parse_model(text)
    for name, arr in weights.items():
        proto.graph.initializer.append(numpy_helper.from_array(arr, name))
    if weights:
        onnx.checker.check_model(proto, full_check=True)
    return import_model(proto)


def costs(model, shapes=None):
    types = concrete_types(model, shapes or {})
    return {n.op_type: node_cost(n, types) for n in model.graph.nodes}


HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


# -- FLOPs and bytes --------------------------------------------------------------------------


def test_matmul_batched():
    m = model_of(
        HEAD + "g (float[2, 4, 8] x) => (float[2, 4, 16] y) { y = MatMul(x, w) }",
        w=np.ones((8, 16), np.float32),
    )
    c = costs(m)["MatMul"]
    assert c.flops == 2 * (2 * 4 * 16) * 8
    assert c.bytes_read == (2 * 4 * 8 + 8 * 16) * F and c.bytes_written == 2 * 4 * 16 * F
    assert c.precision == "fp32"


def test_gather_reads_the_rows_it_selects_not_the_table():
    m = model_of(
        HEAD + "g (int64[3] ids) => (float[3, 64] y) { y = Gather(table, ids) }",
        table=np.ones((1000, 64), np.float32),
    )
    c = costs(m)["Gather"]
    assert c.bytes_written == 3 * 64 * F
    assert c.bytes_read == 3 * 64 * F + 3 * 8  # three rows and the int64 indices
    assert c.flops == 0


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("with_c", [False, True])
def test_gemm_transposes(trans_a, trans_b, with_c):
    m_, k, n = 4, 8, 16
    a = (k, m_) if trans_a else (m_, k)
    b = (n, k) if trans_b else (k, n)
    inputs = ["a", "b", "c"] if with_c else ["a", "b"]
    node = helper.make_node("Gemm", inputs, ["y"], transA=trans_a, transB=trans_b)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, a)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (m_, n))],
        [numpy_helper.from_array(np.ones(b, np.float32), "b")]
        + ([numpy_helper.from_array(np.ones(n, np.float32), "c")] if with_c else []),
    )
    model = import_model(make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    c = costs(model)["Gemm"]
    assert c.flops == 2 * m_ * n * k + (m_ * n if with_c else 0)
    assert c.bytes_read == (m_ * k + k * n + (n if with_c else 0)) * F
    assert c.bytes_written == m_ * n * F


@pytest.mark.parametrize("bias", [False, True])
def test_conv_groups_strides(bias):
    # 8 -> 16 channels in 2 groups, 3x3, stride 2, pad 1: 10x10 -> 5x5
    ins = "x, w, b" if bias else "x, w"
    weights = {"w": np.ones((16, 4, 3, 3), np.float32)}
    if bias:
        weights["b"] = np.ones(16, np.float32)
    m = model_of(
        HEAD + "g (float[1, 8, 10, 10] x) => (float[1, 16, 5, 5] y) {"
        f" y = Conv <group = 2, strides = [2, 2], pads = [1, 1, 1, 1]> ({ins}) }}",
        **weights,
    )
    c = costs(m)["Conv"]
    out = 16 * 5 * 5
    assert c.flops == 2 * out * (4 * 3 * 3) + (out if bias else 0)
    assert c.bytes_read == (8 * 10 * 10 + 16 * 4 * 9 + (16 if bias else 0)) * F
    assert c.bytes_written == out * F


def test_fused_conv_adds_the_activation():
    text = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
  y = com.microsoft.FusedConv <activation = "Relu", pads = [1, 1, 1, 1]> (x, w, b)
}
"""
    m = model_of(text, w=np.ones((4, 3, 3, 3), np.float32), b=np.ones(4, np.float32))
    c = costs(m)["FusedConv"]
    out = 4 * 8 * 8
    assert c.flops == 2 * out * 27 + out + out  # multiply-adds, bias, activation
    assert c.bytes_written == out * F


def test_conv_transpose():
    m = model_of(
        HEAD + "g (float[1, 4, 5, 5] x) => (float[1, 2, 10, 10] y) {"
        " y = ConvTranspose <strides = [2, 2]> (x, w) }",
        w=np.ones((4, 2, 2, 2), np.float32),
    )
    assert costs(m)["ConvTranspose"].flops == 2 * (4 * 5 * 5) * (2 * 2 * 2)


def test_elementwise_softmax_layernorm_reshape():
    text = (
        HEAD
        + """
g (float[2, 3, 4] x, float[4] s) => (float[2, 3, 4] a, float[2, 3, 4] sm, float[2, 3, 4] ln,
                                     float[6, 4] r, float[2, 3, 4] sq) {
  a = Add(x, s)
  sm = Softmax <axis = -1> (x)
  ln = LayerNormalization <axis = -1> (x, s, s)
  shape = Constant <value = int64[2] {6, 4}> ()
  r = Reshape(x, shape)
  sq = Mul(x, x)
}
"""
    )
    c = costs(model_of(text))
    n = 2 * 3 * 4
    assert c["Add"].flops == n
    assert c["Add"].bytes_read == (n + 4) * F and c["Add"].bytes_written == n * F
    assert c["Softmax"].flops == 5 * n
    assert c["LayerNormalization"].flops == 8 * n
    assert c["Reshape"].flops == 0
    assert c["Reshape"].bytes_read == n * F + 2 * 8 and c["Reshape"].bytes_written == n * F
    assert c["Mul"].bytes_read == n * F  # x read once, although it is both operands


def test_reduce_and_pool():
    text = (
        HEAD
        + """
g (float[1, 2, 8, 8] x) => (float[1, 2, 1, 1] r, float[1, 2, 4, 4] p) {
  r = ReduceMean <axes = [2, 3]> (x)
  p = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (x)
}
"""
    )
    c = costs(model_of(text))
    assert c["ReduceMean"].flops == 2 * 8 * 8
    assert c["MaxPool"].flops == (2 * 4 * 4) * 9


def test_unknown_shapes_are_listed():
    m = model_of(
        HEAD + "g (float[N, 8] x) => (float[N, 16] y) { y = MatMul(x, w) }",
        w=np.ones((8, 16), np.float32),
    )
    report = analyze(m, TARGET, {})  # N not pinned
    assert report.unknown == ["MatMul#0"] and report.nodes == []
    report = analyze(m, TARGET, {"x": (3, 8)})
    assert not report.unknown and report.nodes[0].flops == 2 * 3 * 16 * 8


# -- the roofline -----------------------------------------------------------------------------

MIXED = (
    HEAD
    + """
g (float[64, 256] x) => (float[64, 256] z) {
  y = MatMul(x, w)
  z = Add(y, y)
}
"""
)


def mixed_report(target=TARGET):
    m = model_of(MIXED, w=np.ones((256, 256), np.float32))
    return analyze(m, target, {"x": (64, 256)})


def test_intensity_bound_and_time():
    report = mixed_report()
    mm, add = report.nodes
    mm_bytes = (64 * 256 + 256 * 256 + 64 * 256) * F
    assert mm.flops == 2 * 64 * 256 * 256 and mm.bytes == mm_bytes
    assert mm.intensity == pytest.approx(mm.flops / mm_bytes)  # 2^23 / 393216 = 21.3
    assert mm.ridge_point == pytest.approx(100.0)
    assert mm.bound == "memory"  # 21.3 < 100
    assert mm.time == pytest.approx(mm_bytes / 1e10)
    assert add.intensity == pytest.approx(64 * 256 / (2 * 64 * 256 * F))
    assert add.bound == "memory"
    # a slow-memory target moves the ridge below the MatMul's intensity
    slow = analyze(
        model_of(MIXED, w=np.ones((256, 256), np.float32)),
        make_target({"fp32": 1e12}, bandwidth=1e11),
        {"x": (64, 256)},
    )
    assert slow.nodes[0].ridge_point == pytest.approx(10.0)
    assert slow.nodes[0].bound == "compute"
    assert slow.nodes[0].time == pytest.approx(mm.flops / 1e12)


def test_total_top_and_json():
    report = mixed_report()
    assert report.total_time == pytest.approx(sum(n.time for n in report.nodes))
    assert [n.op_type for n in report.top(2)] == ["MatMul", "Add"]
    assert [n.op_type for n in report.top(1)] == ["MatMul"]
    times = [n.time for n in report.top()]
    assert times == sorted(times, reverse=True)
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["total_flops"] == 2 * 64 * 256 * 256 + 64 * 256
    assert [n["bound"] for n in d["nodes"]] == ["memory", "memory"]
    assert d["main_precision"] == "fp32" and d["fallbacks"] == {} and d["unknown_nodes"] == []


def _matmul_at(dtype: str):
    text = HEAD + f"g ({dtype}[512, 512] x, {dtype}[512, 512] w) => ({dtype}[512, 512] y)"
    return model_of(text + " { y = MatMul(x, w) }")


def test_fp16_matmul_uses_the_fp16_peak():
    shapes = {"x": (512, 512), "w": (512, 512)}
    fp32 = analyze(_matmul_at("float"), TARGET, shapes).nodes[0]
    fp16 = analyze(_matmul_at("float16"), TARGET, shapes).nodes[0]
    assert (fp32.precision, fp16.precision) == ("fp32", "fp16")
    assert fp32.compute_time == pytest.approx(10 * fp16.compute_time)
    assert fp16.bytes * 2 == fp32.bytes
    assert fp16.ridge_point == pytest.approx(10 * fp32.ridge_point)


def test_missing_precision_falls_back_to_fp32():
    shapes = {"x": (512, 512), "w": (512, 512)}
    report = analyze(_matmul_at("bfloat16"), TARGET, shapes)  # TARGET has no bf16
    node = report.nodes[0]
    assert node.cost.precision == "bf16"
    assert node.precision == "fp32" and node.fell_back_from == "bf16"
    assert node.compute_time == pytest.approx(node.flops / 1e12)
    assert report.fallbacks == {"MatMul#0": "bf16"} and report.main_precision == "bf16"
    with_bf16 = analyze(_matmul_at("bfloat16"), make_target({"fp32": 1e12, "bf16": 4e12}), shapes)
    assert with_bf16.nodes[0].precision == "bf16" and not with_bf16.fallbacks


def test_int8_precision():
    text = """
<ir_version: 8, opset_import: ["" : 17]>
g (uint8[4, 8] a, int8[8, 16] b, int8[4, 8] qa, float s) => (int32[4, 16] y, float[4, 16] z) {
  y = MatMulInteger(a, b)
  da = DequantizeLinear(qa, s)
  db = DequantizeLinear(b, s)
  z = MatMul(da, db)
}
"""
    c = costs(model_of(text), {"a": (4, 8), "b": (8, 16), "qa": (4, 8), "s": ()})
    assert c["MatMulInteger"].precision == "int8" and c["MatMulInteger"].flops == 2 * 4 * 16 * 8
    assert c["MatMul"].precision == "int8"  # a Q/DQ MatMul runs in int8 on a backend


def test_main_precision_is_the_one_with_most_flops():
    text = (
        HEAD
        + """
g (float16[64, 64] x, float16[64, 64] w, float[8] v) => (float16[64, 64] y, float[8] u) {
  y = MatMul(x, w)
  u = Relu(v)
}
"""
    )
    report = analyze(model_of(text), TARGET, {"x": (64, 64), "w": (64, 64), "v": (8,)})
    assert report.flops_by_precision == {"fp16": 2 * 64**3, "fp32": 8}
    assert report.main_precision == "fp16"


def test_resnet50_at_shipped_shape():
    model = load_model(light_path("resnet50"))
    report = analyze(model, TARGET, {"gpu_0/data_0": (1, 3, 224, 224)})
    assert report.unknown == [] and len(report.nodes) == len(model.graph.nodes)
    conv = sum(n.flops for n in report.nodes if n.op_type == "Conv")
    assert 8.0e9 < conv < 8.4e9
    assert report.total_flops > conv and report.uncounted_ops == []


def test_a100_smoke():
    model = load_model(light_path("resnet50"))
    a100 = targets.get_target("a100")
    report = analyze(model, a100, {"gpu_0/data_0": (1, 3, 224, 224)})
    assert 0 < report.total_time < 0.1
    assert {n.bound for n in report.nodes} == {"compute", "memory"}
    bound = report.time_by_bound()
    assert bound["compute"] + bound["memory"] == pytest.approx(report.total_time)


# -- memory budget ----------------------------------------------------------------------------


def test_memory_budget_fits_and_headroom():
    target = make_target({"fp32": 1e12}, memory=10_000)
    b = memory_budget(3_000, 4_000, target, workspace_bytes=1_000)
    assert b["total_bytes"] == 8_000 and b["fits"] and b["headroom_bytes"] == 2_000
    b = memory_budget(3_000, 4_000, target, workspace_bytes=3_001)
    assert not b["fits"] and b["headroom_bytes"] == -1
    assert json.loads(json.dumps(b)) == b


def test_default_workspace_rule():
    mib = 2**20
    assert default_workspace(10 * mib, 10 * mib) == 64 * mib
    assert default_workspace(1000 * mib, 1000 * mib) == 200 * mib
    b = memory_budget(1000 * mib, 1000 * mib, make_target({"fp32": 1.0}, memory=2**40))
    assert b["workspace_bytes"] == 200 * mib and b["total_bytes"] == 2200 * mib


class Counting:
    def __init__(self, f):
        self.f, self.calls = f, []

    def __call__(self, batch: int) -> int:
        self.calls.append(batch)
        return self.f(batch)


def test_largest_batch_linear_arena_is_exact():
    target = make_target({"fp32": 1e12}, memory=10**6)
    arena = Counting(lambda b: 1000 + 500 * b)
    # 2000 + 100 + 1000 + 500 b <= 10^6  ->  b <= 1993.8
    assert largest_batch(arena, 2000, target, workspace_bytes=100) == 1993
    assert len(set(arena.calls)) <= 4


@pytest.mark.parametrize("power", [1, 2])
@pytest.mark.parametrize("weights", [0, 50_000, 900_000])
def test_largest_batch_matches_brute_force(power, weights):
    target = make_target({"fp32": 1e12}, memory=10**6)
    arena = Counting(lambda b: 300 + 7 * b**power)
    got = largest_batch(arena, weights, target, workspace_bytes=1234, batch_limit=5000)
    fits = [b for b in range(1, 5001) if weights + 1234 + 300 + 7 * b**power <= 10**6]
    assert got == max(fits)
    assert len(set(arena.calls)) < 40


def test_largest_batch_default_workspace_and_limits():
    mib = 2**20
    target = make_target({"fp32": 1e12}, memory=1000 * mib)
    got = largest_batch(lambda b: b * mib, 100 * mib, target)
    # 1.1 x (100 + b) MiB <= 1000 MiB, the 10% rule being above 64 MiB there
    assert got == 809
    assert largest_batch(lambda b: 10, 0, target, batch_limit=77) == 77  # flat arena: the limit
    assert largest_batch(lambda b: b * mib, 0, target, batch_limit=1) == 1


def test_largest_batch_none_when_nothing_fits():
    target = make_target({"fp32": 1e12}, memory=10**6)
    assert largest_batch(lambda b: 10 * b, 2 * 10**6, target, workspace_bytes=0) is None
    assert largest_batch(lambda b: 10**6 * b, 0, target, workspace_bytes=0) == 1


# -- plot -------------------------------------------------------------------------------------


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    report = mixed_report()
    out = plot_roofline(report, TARGET, tmp_path / "roof.png")
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(InferccError, match="matplotlib is needed") as err:
        plot_roofline(mixed_report(), TARGET, tmp_path / "roof.png")
    assert "infercc[plot]" in err.value.hint
    assert not (tmp_path / "roof.png").exists()
