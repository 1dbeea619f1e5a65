"""Sequence, map, sequence-of-map and optional outputs are compared element by element
(`infercc.check.structured`): skl2onnx classifiers end in ZipMap, and onnxruntime ships such a
model (`logreg_iris.onnx`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from infercc import api
from infercc.check.compare import compare_outputs
from infercc.check.validation import validate

IRIS = Path(onnxruntime.__file__).parent / "datasets" / "logreg_iris.onnx"


def probabilities(*rows: dict[int, float]) -> list[dict[int, float]]:
    return [dict(r) for r in rows]


def compare(ref, cand, **tol):
    return compare_outputs([{"p": ref}], [{"p": cand}], **tol).outputs["p"]


def test_a_sequence_of_maps_is_compared_key_by_key() -> None:
    ref = probabilities({0: 0.7, 1: 0.2, 2: 0.1}, {0: 0.1, 1: 0.1, 2: 0.8})
    same = compare(ref, probabilities({0: 0.7, 1: 0.2, 2: 0.1}, {0: 0.1, 1: 0.1, 2: 0.8 + 1e-6}))
    assert same.passed and same.dtype == "seq(map(int64,float))" and same.shape is None
    assert same.max_abs == pytest.approx(1e-6) and same.decided_by == "atol"
    off = compare(ref, probabilities({0: 0.7, 1: 0.2, 2: 0.1}, {0: 0.1, 1: 0.2, 2: 0.7}))
    assert not off.passed and off.decided_by == "elementwise"
    assert "2 of 6 elements out of tolerance" in off.reason


@pytest.mark.parametrize(
    ("cand", "reason"),
    [
        (probabilities({0: 0.7, 1: 0.3}), "sequence length 1 differs from the reference's 2"),
        (
            probabilities({0: 0.7, 1: 0.3}, {0: 0.5, 3: 0.5}),
            "element 1: map keys [0, 3] differ from the reference's [0, 1]",
        ),
        (np.array([0.7, 0.3]), "a tensor where the reference has a sequence"),
    ],
)
def test_a_different_structure_names_the_difference(cand, reason: str) -> None:
    ref = probabilities({0: 0.7, 1: 0.3}, {0: 0.5, 1: 0.5})
    m = compare(ref, cand)
    assert not m.passed and m.reason == reason and m.decided_by == "structure"


def test_sequences_of_tensors_maps_of_strings_and_optionals() -> None:
    seq = [np.ones((2, 3), np.float32), np.zeros(4, np.float32)]
    assert compare(seq, [a.copy() for a in seq]).passed
    shorter = compare(seq, [np.ones((2, 2), np.float32), np.zeros(4, np.float32)])
    assert shorter.reason == "element 0: shape [2, 2] differs from the reference's [2, 3]"
    labels = {"cat": 0.9, "dog": 0.1}
    assert compare(labels, {"cat": 0.9, "dog": 0.1}).passed
    assert not compare(labels, {"cat": 0.1, "dog": 0.9}).passed
    assert compare(None, None).passed  # an empty optional on both sides
    assert compare(None, np.ones(2)).reason == "a tensor where the reference has an empty optional"
    assert compare([], []).passed


def iris_with(coefficient_scale: float = 1.0, labels: list[int] | None = None) -> onnx.ModelProto:
    model = onnx.load(IRIS)
    node = next(n for n in model.graph.node if n.op_type == "LinearClassifier")
    for attr in node.attribute:
        if attr.name == "coefficients":
            attr.floats[:] = [c * coefficient_scale for c in attr.floats]
        if attr.name == "classlabels_ints" and labels is not None:
            attr.ints[:] = labels
    zipmap = next(n for n in model.graph.node if n.op_type == "ZipMap")
    for attr in zipmap.attribute:
        if attr.name == "classlabels_int64s" and labels is not None:
            attr.ints[:] = labels
    return model


def test_onnxruntimes_logreg_iris_optimizes_and_validates(tmp_path: Path) -> None:
    report = api.optimize(IRIS, tmp_path / "iris.opt.onnx")
    assert report.passed, report.validation.to_dict()
    out = report.validation.outputs["probabilities"]
    assert out.dtype == "seq(map(int64,float))" and out.decided_by == "atol"
    assert report.validation.outputs["label"].decided_by == "exact"
    json.dumps(report.to_dict(), allow_nan=False)


def test_a_changed_classifier_fails_on_its_probabilities(tmp_path: Path) -> None:
    report = validate(IRIS, iris_with(coefficient_scale=1.5), seed=3)
    assert not report.passed
    probs = report.outputs["probabilities"]
    assert not probs.passed and "out of tolerance" in probs.reason
    relabeled = validate(IRIS, iris_with(labels=[0, 1, 5]))
    reason = relabeled.outputs["probabilities"].reason
    assert reason == "element 0: map keys [0, 1, 5] differ from the reference's [0, 1, 2]"
