"""`infercc.precisions`: the one tolerance table, and which precisions builds and targets have."""

from __future__ import annotations

import math

from infercc.analysis.targets import get_target
from infercc.backends.ort import tuner
from infercc.backends.trt.precision import compute_precision
from infercc.check.tolerances import default_tolerance
from infercc.precisions import BUILD_PRECISIONS, TARGET_PRECISIONS, TOLERANCES, tolerance
from infercc.runtime.backend import CompileOptions


def test_every_build_precision_has_a_tolerance_and_is_a_target_precision() -> None:
    assert set(BUILD_PRECISIONS) <= set(TOLERANCES)
    assert set(BUILD_PRECISIONS) <= set(TARGET_PRECISIONS)
    assert "tf32" not in BUILD_PRECISIONS and "tf32" in TOLERANCES


def test_the_table_and_overrides() -> None:
    assert TOLERANCES["fp32"].as_tuple() == (1e-4, 1e-3, 0.9999)
    assert TOLERANCES["tf32"].as_tuple() == (1e-3, 1e-2, 0.9999)
    assert math.isinf(TOLERANCES["fp16"].atol) and TOLERANCES["fp16"].min_cosine == 0.999
    assert TOLERANCES["int8"].min_cosine == 0.99
    assert tolerance("int8", atol=0.5).as_tuple() == (0.5, math.inf, 0.99)
    assert tolerance("no-such-precision") == TOLERANCES["fp32"]


def test_validate_and_the_ort_tuner_read_the_same_table() -> None:
    for precision in BUILD_PRECISIONS:
        assert tuner.tolerance(CompileOptions(precision=precision)) == tuple(
            default_tolerance(precision).values()
        )


def test_tensorrt_fp32_engines_compute_in_tf32_from_ampere_on() -> None:
    assert compute_precision("fp32", "8.0") == "tf32"
    assert compute_precision("fp32", "7.5") == "fp32"  # T4: no tf32
    assert compute_precision("fp32", None) == "fp32"
    assert compute_precision("fp16", "9.0") == "fp16"
    assert "tf32" in get_target("a100").precisions and "tf32" not in get_target("t4").precisions
