"""Bisection judges each rebuild as validation does, onnxruntime's own rounding included: on a
zoo CNN whose Conv+BN folds round past the fp32 table (the logits near 3,000), a real break in
another pass is named, not the folds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc.check.bisection import PipelineConfig, _Bisector, bisect
from infercc.check.compare import run_model
from infercc.data.feeds import make_inputs
from infercc.passes import DEFAULT_PIPELINE, REGISTRY, PassResult
from infercc.passes.manager import register_pass
from infercc.passes.match import const_value
from infercc.precisions import FP32
from tests.zoo import light_path, randomize, with_large_logits

BREAK = "test-double-the-logits-bias"


def _double_bias(graph, ctx):
    """Doubles the bias of the last Gemm (a real change of the logits)."""
    gemms = [n for n in graph.nodes if n.op_type == "Gemm" and ctx.allow_rewrite(n)]
    if not gemms or gemms[-1].name.endswith("-doubled"):
        return PassResult(changed=False, stats={"doubled": 0})
    gemm = gemms[-1]
    bias = const_value(gemm.input(2))
    gemm.set_input(2, graph.make_constant(np.asarray(bias * 2, bias.dtype), "doubled_bias"))
    gemm.name = f"{gemm.name}-doubled"
    return PassResult(changed=True, stats={"doubled": 1})


@pytest.fixture()
def broken_pass():
    register_pass(BREAK)(_double_bias)
    yield
    REGISTRY.pop(BREAK, None)


@pytest.fixture(scope="module")
def shufflenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("zoo") / "shufflenet.onnx"
    onnx.save(with_large_logits(randomize(onnx.load(light_path("shufflenet")), seed=1)), path)
    return path


def test_a_rebuild_that_differs_by_rounding_passes(shufflenet: Path) -> None:
    model = onnx.load(shufflenet)
    feeds = [make_inputs(model, None, 0)]
    config = PipelineConfig()
    bisector = _Bisector(shufflenet, feeds, config, FP32.to_dict(), None)
    built, _, _ = bisector.build()
    report = bisector.judge(run_model(built, feeds))
    assert report.passed and bisector.own is not None
    logits = [m for name, m in report.outputs.items() if "softmax" not in name][0]
    assert logits.decided_by == "runtime-rounding"


def test_bisect_names_the_broken_pass_not_the_folds(shufflenet: Path, broken_pass) -> None:
    model = onnx.load(shufflenet)
    feeds = [make_inputs(model, None, 0)]
    report = bisect(shufflenet, feeds, PipelineConfig(stages=[(*DEFAULT_PIPELINE, BREAK)]))
    assert report.reproduced
    assert report.guilty_pass == BREAK, report.message
    assert report.suspects == [BREAK]
