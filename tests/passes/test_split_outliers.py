"""split-outlier-channels as a pass: through the manager with lint, its refusals, bisection,
and once per pipeline."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.errors import InferccError
from infercc.ir import export_model, import_model, infer_shapes
from infercc.passes import PassContext, run_passes
from infercc.passes.pipelines import INT8
from infercc.passes.split_outliers import candidates
from tests.calib.test_outliers import OUTLIER, _run, _samples, projection
from tests.helpers import make_model


def _model(tmp_path):
    _, proto = projection(tmp_path)
    model = import_model(proto)
    infer_shapes(model)
    return model, proto


def test_the_split_in_the_int8_pipeline_is_exact_and_lints(tmp_path) -> None:
    model, proto = _model(tmp_path)
    ctx = PassContext(options={"outlier_channels": {"proj": [OUTLIER]}}, verify=True)
    report = run_passes(model, ctx, INT8.stages[0])
    model.graph.lint()
    assert report.passes["split-outlier-channels"].runs == 1
    assert report.passes["split-outlier-channels"].counts == {"split": 1, "channels": 1}
    made = report.details("split-outlier-channels")
    assert list(made.values()) == ["proj"]
    out = export_model(model)
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops == {"Mul": 2, "Gather": 1, "MatMul": 2, "Add": 2}
    feeds = _samples(1, seed=3)[0]
    np.testing.assert_allclose(_run(out, feeds), _run(proto, feeds), rtol=1e-5, atol=1e-5)


def test_without_channels_the_pass_changes_nothing(tmp_path) -> None:
    model, _ = _model(tmp_path)
    report = run_passes(model, PassContext(), ["split-outlier-channels"])
    assert not report.passes["split-outlier-channels"].changed


@pytest.mark.parametrize(
    ("channels", "reason"),
    [([200], "outlier channels [200] are not channels of its 96 inputs"), ([], "are not channels")],
)
def test_channels_outside_the_input_are_refused(tmp_path, channels, reason) -> None:
    model, _ = _model(tmp_path)
    ctx = PassContext(options={"outlier_channels": {"proj": channels}})
    report = run_passes(model, ctx, ["split-outlier-channels"])
    assert not report.passes["split-outlier-channels"].changed
    assert [r.node for r in report.refusals] == ["proj"] and reason in report.refusals[0].reason


def test_a_matmul_that_is_no_candidate_is_refused() -> None:
    w = numpy_helper.from_array(np.ones((96, 8), np.float32), "w")
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 96])],  # rank 2: no projection
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [w],
    )
    model = import_model(make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    ctx = PassContext(options={"outlier_channels": {"mm": [OUTLIER]}})
    report = run_passes(model, ctx, ["split-outlier-channels"])
    assert candidates(model) == {} and not report.passes["split-outlier-channels"].changed
    assert [r.node for r in report.refusals] == ["mm"]
    assert "not a float32 activation of rank >= 3" in report.refusals[0].reason


def test_a_name_not_in_the_graph_is_an_error(tmp_path) -> None:
    model, _ = _model(tmp_path)
    with pytest.raises(InferccError, match="not in the main graph: nope"):
        ctx = PassContext(options={"outlier_channels": {"nope": [1]}})
        run_passes(model, ctx, ["split-outlier-channels"])


def test_a_rewrite_limit_of_zero_splits_nothing(tmp_path) -> None:
    model, _ = _model(tmp_path)
    before = export_model(model).SerializeToString()
    limits = {"split-outlier-channels": 0}
    ctx = PassContext(options={"outlier_channels": {"proj": [OUTLIER]}}, rewrite_limits=limits)
    report = run_passes(model, ctx, ["split-outlier-channels"])
    assert report.details("split-outlier-channels") == {} and report.refusals == []
    assert export_model(model).SerializeToString() == before
