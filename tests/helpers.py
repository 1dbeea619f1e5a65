"""Shared helpers for tests: parse ONNX text, run passes, compare under onnxruntime, run the
CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable

import numpy as np
import onnx
import onnxruntime as ort

from infercc.ir import export_model, import_model
from infercc.passes import PassContext, PipelineReport, run_passes
from infercc.runtime.ort_support import max_ir_version

# The IR version test models are written at: the newest that both the installed onnx writes and
# the installed onnxruntime reads (onnx 1.23 writes IR 14 by default; onnxruntime 1.23, the
# newest for Python 3.10, reads IR <= 11).
IR_VERSION = max_ir_version()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m infercc ARGS` in a subprocess, output captured as text, 200 columns wide
    (tables are not wrapped)."""
    return subprocess.run(
        [sys.executable, "-m", "infercc", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def make_model(graph: onnx.GraphProto, **kwargs) -> onnx.ModelProto:
    """onnx.helper.make_model at IR_VERSION unless `ir_version` is given: every model a test
    builds loads in the installed onnxruntime."""
    kwargs.setdefault("ir_version", IR_VERSION)
    return onnx.helper.make_model(graph, **kwargs)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def optimize_proto(
    proto: onnx.ModelProto,
    passes: Iterable[str] | None = None,
    ctx: PassContext | None = None,
    check: bool = True,
) -> tuple[onnx.ModelProto, PipelineReport]:
    """Import, run passes with lint after each, export; checks the result with onnx.checker."""
    model = import_model(proto)
    ctx = ctx or PassContext()
    ctx.verify = True
    kwargs = {"pipeline": list(passes)} if passes is not None else {}
    report = run_passes(model, ctx, **kwargs)
    out = export_model(model)
    if check:
        onnx.checker.check_model(out, full_check=True)
    return out, report


def op_counts(proto: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in proto.graph.node)


def run_ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def random_feeds(proto: onnx.ModelProto, seed: int = 0, dims: int = 3) -> dict[str, np.ndarray]:
    """Standard-normal float inputs; symbolic dims get `dims`."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in proto.graph.initializer}
    feeds = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def assert_same_outputs(
    a: onnx.ModelProto,
    b: onnx.ModelProto,
    feeds: dict[str, np.ndarray] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    feeds = feeds if feeds is not None else random_feeds(a)
    ra, rb = run_ort(a, feeds), run_ort(b, feeds)
    assert len(ra) == len(rb)
    for x, y in zip(ra, rb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(x, y, atol=atol, rtol=rtol)
