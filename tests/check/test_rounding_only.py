"""A failure that is rounding alone is said, not bisected: elements past the bound by at most
ROUNDING_ULPS ulps of the output's scale at a cosine of 1.000000 make the report say "only
rounding differs" and name --tol and --rtol; optimize and validate --bisect bisect nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infercc import api
from infercc.check.candidates import validate_candidate
from infercc.check.compare import ROUNDING_ULPS, compare_outputs
from infercc.check.tolerances import parse_tolerances
from infercc.precisions import FP32
from tests.helpers import make_model, run_cli

ULP_3000 = float(np.spacing(np.float32(3000.0)))


def _compare(moved_by_ulps: float, **tolerance: float):
    """Logits up to 3,000 and one of 0.5, moved past its fp32 bound by `moved_by_ulps` ulps of
    3,000."""
    ref = np.linspace(-3000.0, 3000.0, 1000, dtype=np.float32)
    ref[500] = 0.5
    cand = ref.astype(np.float64)
    bound = FP32.atol + FP32.rtol * 0.5
    cand[500] += bound + moved_by_ulps * ULP_3000
    tol = {**FP32.to_dict(), **tolerance}
    return compare_outputs([{"logits": ref}], [{"logits": cand.astype(np.float32)}], **tol)


def test_a_few_ulps_past_the_bound_is_only_rounding() -> None:
    report = _compare(5)
    m = report.outputs["logits"]
    assert not report.passed and m.decided_by == "elementwise"
    assert m.rounding_only and m.excess_ulps == pytest.approx(5, abs=1.0)
    message = report.rounding_only()
    assert message.startswith("only rounding differs: logits past the bound by at most")
    assert "no rewrite is to blame (not bisected)" in message
    assert "--rtol" in message
    assert report.to_dict()["rounding_only"] == message
    assert report.to_dict()["outputs"]["logits"]["rounding_only"] is True
    # the --tol the message names passes the output
    spec = re.search(r"--tol (\S+)", message).group(1)
    atol, rtol = parse_tolerances([spec])["logits"]
    assert _compare(5, atol=atol, rtol=rtol).passed


def test_more_than_rounding_ulps_is_a_failure_to_bisect() -> None:
    report = _compare(4 * ROUNDING_ULPS)
    m = report.outputs["logits"]
    assert not report.passed and not m.rounding_only
    assert m.excess_ulps > ROUNDING_ULPS
    assert report.rounding_only() is None
    assert report.to_dict()["rounding_only"] is None


def test_misplaced_nan_is_never_rounding() -> None:
    ref = np.ones(8, np.float32)
    cand = ref.copy()
    cand[3] = np.nan
    report = compare_outputs([{"y": ref}], [{"y": cand}], **FP32.to_dict())
    assert not report.passed and report.rounding_only() is None


# --------------------------------------------------------------------------- optimize


def _gemm_bn() -> onnx.ModelProto:
    """Gemm + BatchNormalization: infercc folds the BN into the Gemm (in float64), onnxruntime
    does not, so the build rounds otherwise than the original while onnxruntime's own
    optimizations leave the output where it was."""
    rng = np.random.default_rng(0)
    inits = {
        "W": rng.normal(0, 0.3, (16, 8)).astype(np.float32),
        "C": rng.normal(0, 0.3, 8).astype(np.float32),
        "s": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "b": rng.normal(0, 0.3, 8).astype(np.float32),
        "m": rng.normal(0, 0.3, 8).astype(np.float32),
        "v": rng.uniform(0.5, 1.5, 8).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "W", "C"], ["g"]),
            helper.make_node("BatchNormalization", ["g", "s", "b", "m", "v"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def deconv(tmp_path: Path) -> Path:
    path = tmp_path / "deconv.onnx"
    onnx.save(_gemm_bn(), path)
    return path


def test_optimize_says_only_rounding_differs_and_bisects_nothing(deconv: Path) -> None:
    out = deconv.with_name("out.onnx")
    report = api.optimize(deconv, out, atol=0.0, rtol=0.0, bisect=True)
    assert not report.passed and not report.written
    assert report.passes["fuse-conv-bn-relu"]["bn_into_gemm"] == 1
    assert report.bisect is None and report.bisect_hint is None
    y = report.validation.outputs["y"]
    assert y.runtime_rounding == 0.0  # onnxruntime's own optimizations do not move it
    assert y.reason.endswith("; onnxruntime's own optimizer does not move this output")
    message = report.validation.rounding_only()
    assert message is not None and "--tol y=" in message
    spec = re.search(r"--tol (\S+)", message).group(1)
    again = api.optimize(deconv, out, atol=0.0, rtol=0.0, tolerances=parse_tolerances([spec]))
    assert again.passed and again.written


def test_validate_bisect_bisects_nothing_on_rounding(deconv: Path, tmp_path: Path) -> None:
    out = tmp_path / "built.onnx"
    assert api.optimize(deconv, out).passed
    result = validate_candidate(out, deconv, atol=0.0, rtol=0.0, bisect=True)
    assert not result.passed and result.bisect is None
    assert result.validation.rounding_only().startswith("only rounding differs: y")


def test_the_cli_names_the_flags(deconv: Path) -> None:
    out = deconv.with_name("out.onnx")
    shown = run_cli("optimize", str(deconv), "-o", str(out), "--atol", "0", "--rtol", "0")
    assert shown.returncode == 1
    text = " ".join(shown.stdout.split())
    assert "only rounding differs: y past the bound" in text and "--rtol" in text
    assert "--bisect" not in text
    as_json = run_cli(
        "optimize", str(deconv), "-o", str(out), "--atol", "0", "--rtol", "0", "--json"
    )
    data = json.loads(as_json.stdout)
    assert data["validation"]["rounding_only"].startswith("only rounding differs")
    assert data["bisect"] is None
