"""The Python API under the `optimize` command: load, run passes, write atomically, validate."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc import passes as _passes
from infercc.errors import InferccError
from infercc.ir import Model, export_model, load_model, save_model
from infercc.ir.tensor import external_info
from infercc.memory import MemoryPlan, plan_memory
from infercc.passes.manager import DEFAULT_FOLD_LIMIT, PassContext, check_pass_names, run_passes
from infercc.targets import get_target
from infercc.validate import ValidationReport, validate

log = logging.getLogger(__name__)

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
DEFAULT_MIN_COSINE = 0.9999


@dataclass
class OptimizeReport:
    """What `optimize` did, as data (`to_dict()` is the `--json` form)."""

    input: str
    output: str
    target: str
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    size_before: int
    size_after: int
    passes: dict[str, dict[str, Any]]
    iterations: int
    reached_fixpoint: bool
    refusals: list[dict[str, str]]
    validation: ValidationReport | None
    seconds: float
    files: list[str] = field(default_factory=list)
    memory: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return self.validation is None or self.validation.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "files": self.files,
            "target": self.target,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "size_before": self.size_before,
            "size_after": self.size_after,
            "passes": self.passes,
            "iterations": self.iterations,
            "reached_fixpoint": self.reached_fixpoint,
            "refusals": self.refusals,
            "validation": self.validation.to_dict() if self.validation else None,
            "memory": self.memory,
            "seconds": round(self.seconds, 4),
        }


def op_histogram(model: Model) -> dict[str, int]:
    """Op type -> count over the main graph and its subgraphs (custom domains as domain.Op)."""
    counts = Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        for n in model.graph.all_nodes()
    )
    return dict(sorted(counts.items()))


def model_files_size(path: Path, model: Model | None = None) -> int:
    """Bytes on disk: the model file plus the external data files it references."""
    size = path.stat().st_size
    if model is None:
        return size
    locations = {
        external_info(v.const.proto).get("location")
        for v in model.graph.initializers.values()
        if v.const is not None and v.const.is_external
    }
    for loc in locations:
        if loc and (path.parent / loc).is_file():
            size += (path.parent / loc).stat().st_size
    return size


def default_output(path: Path) -> Path:
    return path.with_name(f"{path.stem}.opt.onnx")


def check_target(target: str) -> str:
    """The canonical name of a known target (unknown names raise with the list)."""
    return get_target(target).name if target.lower() != "cpu" else "cpu"


def _check_output(src: Path, out: Path) -> None:
    if out.resolve() == src.resolve():
        raise InferccError(f"refusing to overwrite the input model {src}", "choose another -o path")
    if out.suffix != ".onnx":
        raise InferccError(
            f"output path {out} does not end in .onnx",
            "name an .onnx file with -o (artifact directories come with backends)",
        )
    if not out.parent.is_dir():
        raise InferccError(
            f"output directory {out.parent} does not exist", "create it first, or pick another -o"
        )
    if out.is_dir():
        raise InferccError(f"output path {out} is a directory", "name an .onnx file with -o")


def optimize(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    target: str = "cpu",
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: str | os.PathLike[str] | None = None,
    disable_passes: Iterable[str] = (),
    portable: bool = False,
    run_validation: bool = True,
    fold_limit: int = DEFAULT_FOLD_LIMIT,
    verify: bool = False,
    external_data: bool | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    min_cosine: float = DEFAULT_MIN_COSINE,
    alignment: int = 64,
    on_step: Callable[[str], None] | None = None,
) -> OptimizeReport:
    """Optimize an ONNX model file and write the result; returns the report.

    The input is never modified. The output is written atomically and only after validation
    passes (a failed validation leaves nothing behind; the report says why). The memory plan
    (`<output stem>.memory_plan.json`) is written beside it, for the shape profile that
    validation uses: `shapes` pins inputs, other symbolic dims take the defaults of
    `infercc.inputs.resolve_shapes`.
    """
    t0 = time.perf_counter()
    src = Path(model)
    out = Path(output) if output is not None else default_output(src)
    disabled = list(disable_passes)
    check_pass_names(disabled)
    target = check_target(target)
    _check_output(src, out)
    step = on_step or (lambda _s: None)
    step("loading")
    ir = load_model(src)
    check_shape_names(ir, shapes)
    size_before = model_files_size(src, ir)
    nodes_before, ops_before = sum(1 for _ in ir.graph.all_nodes()), op_histogram(ir)
    profile = _shape_profile(ir, shapes)
    ctx = PassContext(target=target, portable=portable, fold_limit=fold_limit, verify=verify)
    if profile is not None:
        ctx.options["shapes"] = profile
    pipe = run_passes(
        ir, ctx, _passes.DEFAULT_PIPELINE, disabled, on_pass=lambda n: step(f"pass {n}")
    )
    nodes_after, ops_after = sum(1 for _ in ir.graph.all_nodes()), op_histogram(ir)
    step("planning memory")
    plan = _plan(ir, profile, alignment, ctx.options.get("schedule", {}))
    step("writing")
    with tempfile.TemporaryDirectory(prefix=".infercc-", dir=out.parent) as tmp:
        staged = save_model(ir, Path(tmp) / out.name, external_data=external_data)
        if plan is not None:
            staged.append(_write_json(Path(tmp) / memory_plan_name(out), plan.to_dict()))
        del ir
        gc.collect()  # the IR is a web of cycles: free its arrays before onnxruntime loads
        report_validation = None
        if run_validation:
            step("validating")
            report_validation = validate(
                src,
                staged[0],
                shapes=shapes,
                data=data,
                atol=atol,
                rtol=rtol,
                min_cosine=min_cosine,
            )
        size_after = sum(p.stat().st_size for p in staged if p.suffix != ".json")
        files: list[str] = []
        if report_validation is None or report_validation.passed:
            for p in staged:
                os.replace(p, out.parent / p.name)
                files.append(str(out.parent / p.name))
        shutil.rmtree(tmp, ignore_errors=True)
    return OptimizeReport(
        input=str(src),
        output=str(out),
        target=target,
        nodes_before=nodes_before,
        nodes_after=nodes_after,
        ops_before=ops_before,
        ops_after=ops_after,
        size_before=size_before,
        size_after=size_after,
        passes={name: st.to_dict() for name, st in pipe.passes.items()},
        iterations=pipe.iterations,
        reached_fixpoint=pipe.reached_fixpoint,
        refusals=[r.to_dict() for r in pipe.refusals],
        validation=report_validation,
        seconds=time.perf_counter() - t0,
        files=files,
        memory=_memory_summary(plan, profile, out),
    )


def check_shape_names(model: Model, shapes: Mapping[str, tuple[int, ...]] | None) -> None:
    names = [v.name for v in model.graph.inputs]
    for name, dims in (shapes or {}).items():
        if name not in names:
            raise InferccError(
                f"--shape names {name!r}, which is not an input of the model",
                "model inputs: " + ", ".join(names),
            )
        v = model.graph.inputs[names.index(name)]
        if v.shape is not None and len(v.shape) != len(dims):
            raise InferccError(
                f"--shape {name} has rank {len(dims)} but the input has rank {len(v.shape)}",
                "give one size per dimension, e.g. NAME=1x3x224x224",
            )


def memory_plan_name(out: Path) -> str:
    return f"{out.stem}.memory_plan.json"


def _shape_profile(
    model: Model, shapes: Mapping[str, tuple[int, ...]] | None
) -> dict[str, tuple[int, ...]] | None:
    """Concrete input shapes for planning (the ones validation uses), or None if unresolvable."""
    from infercc.inputs import resolve_shapes

    try:
        return resolve_shapes(export_model(model, with_weights=False), dict(shapes or {}))
    except InferccError as e:
        log.info("no shape profile for memory planning: %s", e)
        return None


def _plan(
    model: Model, profile: dict[str, tuple[int, ...]] | None, alignment: int, schedule: dict
) -> MemoryPlan | None:
    if profile is None:
        return None
    plan = plan_memory(model, profile, alignment=alignment)
    plan.peak_before_schedule = schedule.get("peak_before")
    plan.peak_after_schedule = schedule.get("peak_after")
    return plan


def _memory_summary(
    plan: MemoryPlan | None, profile: dict[str, tuple[int, ...]] | None, out: Path
) -> dict[str, Any] | None:
    if plan is None:
        return None
    return {
        "naive_bytes": plan.naive_bytes,
        "arena_bytes": plan.arena_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes,
        "weights_bytes": plan.weights_bytes,
        "arena_over_bound": round(plan.ratio, 4),
        "heuristic": plan.heuristic,
        "alignment": plan.alignment,
        "peak_before_schedule": plan.peak_before_schedule,
        "peak_after_schedule": plan.peak_after_schedule,
        "unplanned": len(plan.unknown),
        "shape_profile": {k: list(v) for k, v in (profile or {}).items()},
        "plan": str(out.parent / memory_plan_name(out)),
    }


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path
