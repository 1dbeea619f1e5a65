"""What a benchmark's figures were measured on, printed before them: the CPU, its row in the
target database (`infercc targets`: x86-avx2, x86-avx512-vnni, ...), its cores, onnxruntime's
fp32 GEMM rate on it and its memory bandwidth. Ratios measured on one host do not carry over to
another of another row: print this line with every figure.

    python bench/hostinfo.py            # the line alone
    from hostinfo import host_line      # in a bench script (bench/ on sys.path)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

GEMM = (1024, 768, 3072)  # m, k, n of the GEMM whose rate is printed


def gemm_rate(m: int = GEMM[0], k: int = GEMM[1], n: int = GEMM[2], runs: int = 20) -> float:
    """This machine's fp32 GEMM rate under onnxruntime (GFLOP/s, median of `runs`): one MatMul
    by a constant [k, n] weight, the session's default threads, idle threads not spinning."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["c"])],
        "gemm",
        [helper.make_tensor_value_info("a", 1, [m, k])],
        [helper.make_tensor_value_info("c", 1, [m, n])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemm.onnx"
        onnx.save(model, path)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    a = rng.standard_normal((m, k), dtype=np.float32)
    for _ in range(3):
        s.run(None, {"a": a})
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        s.run(None, {"a": a})
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / statistics.median(times) / 1e9


def host_facts() -> dict:
    """The host's CPU, row, cores, GEMM rate (GFLOP/s) and copy bandwidth (GB/s), as data."""
    import onnxruntime as ort

    from infercc.analysis.targets import CPU_CLASS_ENV, host_cpu_info, measure_copy_bandwidth

    info, cores = host_cpu_info()
    detected = info.detected_row
    return {
        "cpu": info.model,
        "cpu_class": None if detected is None else detected.name,  # detected, never stated
        "stated_cpu_class": os.environ.get(CPU_CLASS_ENV) or None,
        "cores": cores,
        "onnxruntime": ort.__version__,
        "fp32_gemm_gflops": round(gemm_rate(), 1),
        "copy_bandwidth_gbs": round(measure_copy_bandwidth() / 1e9, 1),
        "load_average": round(os.getloadavg()[0], 2),
    }


def host_line(facts: dict | None = None) -> str:
    f = facts or host_facts()
    m, k, n = GEMM
    return (
        f"host: {f['cpu']} ({f['cpu_class'] or 'no CPU class'}"
        + (f", stated as {f['stated_cpu_class']}" if f.get("stated_cpu_class") else "")
        + f"), {f['cores']} cores, "
        f"onnxruntime {f['onnxruntime']}: fp32 GEMM {f['fp32_gemm_gflops']:.0f} GFLOP/s "
        f"([{m}, {k}] x [{k}, {n}]), copy bandwidth {f['copy_bandwidth_gbs']:.1f} GB/s, "
        f"load average {f['load_average']:.1f}"
    )


if __name__ == "__main__":
    print(host_line())
