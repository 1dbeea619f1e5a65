"""onnx's operator test cases still pass after infercc (a fixed sample of bench/conformance.py).

Every 10th case of `onnx.backend.test.case.node.collect_testcases`, sorted by name: (a) a case
onnxruntime passes unoptimized passes optimized too; (b) with its inputs turned into
initializers, what folding computes equals onnxruntime's own result for the folded form,
exactly (the expected outputs where onnxruntime cannot run the case). The full run (all
~1,900 cases) is `python bench/conformance.py`. Also here: the regression tests of the folding bugs
that run found, and checks that the harness itself reports a broken optimizer.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc.ir import export_model, import_model
from infercc.passes import PassContext, run_passes
from tests.helpers import make_model

BENCH = Path(__file__).resolve().parents[2] / "bench" / "conformance.py"
EVERY = 10


def _load_bench():
    spec = importlib.util.spec_from_file_location("infercc_bench_conformance", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


conformance = _load_bench()


@pytest.fixture(scope="module")
def sample():
    cases = conformance.load_cases(every=EVERY)
    return cases, conformance.run_cases(cases)


def test_sample_has_no_regression(sample):
    cases, results = sample
    summary = conformance.summarize(results)
    assert summary["total"] == len(cases) >= 180
    assert summary["regressions"] == {}
    assert summary["fold_mismatches"] == {}
    assert summary["partial_regressions"] == {}
    assert summary["fold_errors"] == {}
    assert summary["still_pass_after"] == summary["ort_passes_unoptimized"]


def test_sample_is_not_vacuous(sample):
    """Most cases run under onnxruntime and fold completely, so the equalities mean much.

    Cases stamped with an IR newer than the installed onnxruntime reads (onnx 1.23's cases of
    opsets 24 to 28 are IR 12 to 14; onnxruntime 1.23, the newest for Python 3.10, reads IR
    <= 11, 1.21 IR <= 10) cannot run under it; they still count in (b), which needs no
    onnxruntime.
    """
    _, results = sample
    summary = conformance.summarize(results)
    readable = summary["ran"] - summary["ir_newer_than_onnxruntime"]
    assert readable >= 0.6 * summary["ran"]  # 115 of 186 on onnxruntime 1.21, 186 on 1.32
    assert summary["ort_passes_unoptimized"] >= 0.75 * readable
    assert summary["folded_matches"] >= 0.85 * summary["ran"]
    # (a) compares models optimize did change: 16 of 106 on onnxruntime 1.21, 38 of 158 on 1.32
    assert summary["rewritten_and_pass"] >= 0.12 * summary["ort_passes_unoptimized"]
    assert set(summary["skipped"]) <= {"sequence/optional", "no data set"}


def test_sample_is_deterministic():
    first = [c.name for c in conformance.load_cases(every=EVERY)]
    assert first == [c.name for c in conformance.load_cases(every=EVERY)]
    assert first == sorted(first)


# --------------------------------------------------------------------------- the harness


def _case(name: str):
    (case,) = [c for c in conformance.load_cases(name_filter=name) if c.name == name]
    return case


def test_harness_reports_a_broken_optimizer(monkeypatch):
    """An optimizer that changes a value is caught by (a), and by (b) when it folds."""
    case = _case("test_relu")
    real = conformance.optimize

    def broken(model, portable=False):
        out, refusals = real(model, portable)
        negate = helper.make_node("Neg", [out.graph.output[0].name], ["negated"])
        out.graph.node.append(negate)
        out.graph.output[0].name = "negated"
        return out, refusals

    monkeypatch.setattr(conformance, "optimize", broken)
    result = conformance.check_case(case)
    assert result.a == conformance.A_REGRESSION and "values differ" in result.a_detail
    assert result.b == conformance.B_PARTIAL_REGRESSION


def test_harness_holds_folded_values_to_onnxruntimes_result(monkeypatch):
    """(b) compares with what onnxruntime computes, bit for bit: one ulp off is a mismatch."""
    case = _case("test_sqrt_example")
    assert conformance.check_case(case).b == conformance.B_MATCH
    truth = conformance.ort_truth

    def off_by_one_ulp(model):
        return [np.nextafter(a, np.inf).astype(a.dtype) for a in truth(model)]

    monkeypatch.setattr(conformance, "ort_truth", off_by_one_ulp)
    result = conformance.check_case(case)
    assert result.b == conformance.B_MISMATCH and "vs onnxruntime" in result.b_detail


def test_harness_compares_like_onnx_backend_tests():
    e = np.array([1.0, 2.0], np.float32)
    assert conformance.mismatch(e, e + 1e-4, 1e-3, 1e-7) is None
    assert "values differ" in conformance.mismatch(e, e + 1e-2, 1e-3, 1e-7)
    assert "dtype" in conformance.mismatch(e, e.astype(np.float64), 1e-3, 1e-7)
    assert "shape" in conformance.mismatch(e, e[:1], 1e-3, 1e-7)
    nan = np.array([np.nan], np.float32)
    assert conformance.mismatch(nan, nan.copy(), 1e-3, 1e-7) is None
    s = np.array(["a", "b"], dtype=object)
    assert conformance.mismatch(s, s.copy(), 0, 0) is None
    assert conformance.mismatch(s, np.array(["a", "c"], dtype=object), 0, 0) is not None


# --------------------------------------------------------------------------- bugs found


def _fold(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
    ir = import_model(model)
    report = run_passes(ir, PassContext(verify=True), ["fold-constants"])
    return export_model(ir), report.refusals


def _dropout_model(training: bool, ratio: float) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.arange(1, 9, dtype=np.float32), "x"),
        numpy_helper.from_array(np.array(ratio, np.float32), "r"),
        numpy_helper.from_array(np.array(training), "t"),
    ]
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=0)],
        "g",
        [],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [8]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [8]),
        ],
        initializer=inits,
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_training_dropout_is_not_folded():
    # regression: a training-mode Dropout of constants was folded, freezing one random mask
    folded, refusals = _fold(_dropout_model(training=True, ratio=0.5))
    assert [n.op_type for n in folded.graph.node] == ["Dropout"]
    assert any("training mode is random" in r.reason for r in refusals)


@pytest.mark.parametrize("training, ratio", [(True, 0.0), (False, 0.5)])
def test_deterministic_dropout_still_folds(training, ratio):
    folded, _ = _fold(_dropout_model(training, ratio))
    assert list(folded.graph.node) == []
    values = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    np.testing.assert_array_equal(values["y"], np.arange(1, 9, dtype=np.float32))
    assert values["mask"].all()


def test_function_defined_op_folds():
    # regression: ops whose reference implementation expands a context-dependent function
    # (GroupNormalization-21) failed to evaluate, because the one-node model had untyped inputs
    case = _case("test_group_normalization_example")
    inputs, expected = conformance.case_arrays(case)
    model = conformance.with_constant_inputs(case.model, inputs)
    folded, refusals = _fold(model)
    assert list(folded.graph.node) == [], refusals
    (value,) = conformance.constant_outputs(folded)
    np.testing.assert_allclose(value, expected[0], rtol=1e-3, atol=1e-7)
