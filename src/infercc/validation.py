"""The Python API under `infercc validate`: a candidate checked against its reference.

`validate(candidate, reference)` takes its arguments in the CLI's order (`infercc validate
CANDIDATE --reference ORIGINAL`). Either may be a path or an in-memory `onnx.ModelProto`; the
candidate may also be an artifact directory (run through its backend). `shapes` maps input
names to tuples or `--shape` strings (`{"image": "1x3x32x32"}`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack

from infercc.check.candidates import CandidateReport, validate_candidate
from infercc.config import input_ranges as parse_input_ranges
from infercc.data.feeds import input_ranges as generated_ranges
from infercc.data.profiles import as_shapes
from infercc.data.samples import SampleData
from infercc.ir.sources import IN_MEMORY, ModelInput, is_proto, model_file

__all__ = ["validate"]


def validate(
    candidate: ModelInput | None,
    reference: ModelInput | None = None,
    *,
    golden: str | os.PathLike[str] | None = None,
    data: SampleData | None = None,
    shapes: Mapping[str, str | int | Sequence[int]] | None = None,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    input_ranges: Mapping[str, tuple[float, float] | str] | Sequence[str] = (),
    save_golden_to: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
    ort_custom_op_libs: Sequence[str | os.PathLike[str]] = (),
) -> CandidateReport:
    """Compare `candidate` with `reference` (or with goldens) under onnxruntime, per output.

    Tolerances follow the candidate's precision unless `atol`, `rtol`, `min_cosine` or
    per-output `tolerances` are given. `data` is samples (a directory, an .npz), a data
    loader `script.py:fn`, or samples in memory (a `{input name: array}` dict, an array for a
    model of one input, or a list or generator of those: `infercc.data.samples.iter_samples`);
    without it inputs are generated, from `input_ranges` ({name: (low, high)} or
    `NAME=LOW:HIGH` specs) where given. `report.passed` says whether every output agreed;
    `report.to_dict()` is the `--json` form of `infercc validate`. `ort_custom_op_libs`:
    onnxruntime custom-op libraries registered in every session (a model with custom ops).
    """
    pinned = as_shapes(shapes)
    ranges = {name: (lo, hi) for name, lo, hi in parse_input_ranges(input_ranges)}
    with ExitStack() as stack:
        stack.enter_context(generated_ranges(ranges))
        paths = [
            stack.enter_context(model_file(m, f"{role}.onnx")) if is_proto(m) else m
            for m, role in ((candidate, "candidate"), (reference, "reference"))
        ]
        report = validate_candidate(
            paths[0],  # type: ignore[arg-type]
            paths[1],  # type: ignore[arg-type]
            golden=golden,
            save_golden_to=save_golden_to,
            data=data,
            shapes=pinned,
            seed=seed,
            atol=atol,
            rtol=rtol,
            min_cosine=min_cosine,
            tolerances=tolerances,
            on_step=on_step,
            ort_custom_op_libs=ort_custom_op_libs,
        )
    if is_proto(candidate):
        report.candidate = IN_MEMORY
    if is_proto(reference):
        report.reference = IN_MEMORY
    return report
