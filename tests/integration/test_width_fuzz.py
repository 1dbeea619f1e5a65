"""Random int32/int64 shape arithmetic near the width's limits keeps onnxruntime's outputs
after optimization (a short run; bench/fuzz.py --int-width runs thousands)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.integration.width_fuzz import check_width_outputs, width_models


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(width_models())
def test_int_width_shape_arithmetic_keeps_the_outputs(model) -> None:
    check_width_outputs(model)
