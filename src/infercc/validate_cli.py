"""The engine of `infercc validate`: check a candidate against a reference model or goldens.

The candidate is an optimized `.onnx` file (run on onnxruntime's CPU provider with its graph
optimizations off, as `infercc.check.compare` does) or an artifact directory (run through the
runner of the backend that built it, so what is checked is what will be deployed).

What it is compared with:

- `reference`: the original model, run on the same feeds (random, `--shape`, or `--data`);
- `golden`: a directory written earlier by `save_golden` (`--save-golden DIR`): the inputs
  and the reference's outputs, so later runs need no reference model. Layout:
  `golden.json` (schema `infercc.golden/1`: input and output names, sample count, the
  reference's path and sha256), `inputs/sample_NNN.npz` (keyed by input name, so the
  directory is also a valid `--data`) and `outputs/sample_NNN.npz` (keyed by output name).

Default tolerances follow the candidate's precision: the artifact manifest's `precision`, or,
for a plain model, int8 when it holds QuantizeLinear/DequantizeLinear (or QLinear*) nodes,
fp16 when it holds float16 initializers or Casts to float16, else fp32. fp32: atol 1e-4,
rtol 1e-3, cosine >= 0.9999; fp16: cosine >= 0.999 only; int8: cosine >= 0.99 only. Options
given by the user win, and `tolerances` sets atol/rtol for named outputs.

With `bisect=True` a failing candidate is handed to `infercc.check.bisection`, which rebuilds
it from the reference and names the pass, the rewrite and the node where outputs first diverge.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infercc.backends.base import MANIFEST
from infercc.check.compare import ValidationReport, compare_outputs, run_model
from infercc.errors import InferccError
from infercc.inputs import input_dtype, load_samples, make_inputs, real_inputs
from infercc.runtime.bench import read_skeleton
from infercc.util import first_line, read_schema_json

log = logging.getLogger(__name__)

GOLDEN_SCHEMA = "infercc.golden/1"
GOLDEN_FILE = "golden.json"
INT8_MIN_COSINE = 0.99
PRECISIONS = ("fp32", "fp16", "int8")
_QUANT_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul"}
)

Outputs = list[dict[str, np.ndarray]]
Feeds = list[dict[str, np.ndarray]]


# --------------------------------------------------------------------------- report


@dataclass
class CandidateReport:
    """What `validate_candidate` found (`to_dict()` is the `--json` form)."""

    candidate: str | None
    reference: str | None
    golden: str | None
    precision: str
    validation: ValidationReport | None
    saved_golden: str | None = None
    bisect: Any = None  # infercc.check.bisection.BisectReport

    @property
    def passed(self) -> bool:
        return self.validation is None or self.validation.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "reference": self.reference,
            "golden": self.golden,
            "precision": self.precision,
            "passed": bool(self.passed),
            "validation": self.validation.to_dict() if self.validation else None,
            "saved_golden": self.saved_golden,
            "bisect": self.bisect.to_dict() if self.bisect is not None else None,
        }


# --------------------------------------------------------------------------- precision


def detect_precision(
    candidate: str | os.PathLike[str], skeleton: onnx.ModelProto | None = None
) -> str:
    """fp32, fp16 or int8: the artifact manifest's precision, or read from the model (its
    `skeleton` when the caller has read it already)."""
    path = Path(candidate)
    if path.is_dir():
        precision = str(_manifest(path).get("precision") or "fp32")
        return precision if precision in PRECISIONS else "fp32"
    return model_precision(skeleton if skeleton is not None else read_skeleton(path))


def model_precision(model: onnx.ModelProto) -> str:
    """int8 with quantize ops, fp16 with float16 weights or Casts to float16, else fp32."""
    nodes = list(model.graph.node)
    if any(n.op_type in _QUANT_OPS for n in nodes):
        return "int8"
    fp16 = onnx.TensorProto.FLOAT16
    if any(t.data_type == fp16 for t in model.graph.initializer):
        return "fp16"
    casts = (n for n in nodes if n.op_type == "Cast")
    if any(a.name == "to" and a.i == fp16 for n in casts for a in n.attribute):
        return "fp16"
    return "fp32"


def default_tolerance(
    precision: str,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
) -> dict[str, float]:
    """atol, rtol and min_cosine for `precision`, where the user gave none."""
    from infercc.api import validation_tolerance

    tol = validation_tolerance("fp32" if precision == "fp32" else "fp16", atol, rtol, min_cosine)
    if precision == "int8" and min_cosine is None:
        tol["min_cosine"] = INT8_MIN_COSINE
    return tol


def parse_tolerances(specs: Sequence[str] | None) -> dict[str, tuple[float, float]]:
    """`["logits=1e-3:1e-2"]` -> `{"logits": (1e-3, 1e-2)}` (OUTPUT=ATOL:RTOL, repeatable)."""
    result: dict[str, tuple[float, float]] = {}
    for spec in specs or []:
        name, sep, values = spec.rpartition("=")
        parts = values.split(":")
        try:
            atol, rtol = (float(p) for p in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            atol = rtol = None
        if not sep or not name or atol is None or rtol is None or min(atol, rtol) < 0:
            raise InferccError(
                f"bad --tol {spec!r}", "write OUTPUT=ATOL:RTOL, e.g. --tol logits=1e-3:1e-2"
            )
        result[name] = (atol, rtol)
    return result


# --------------------------------------------------------------------------- running


def run_candidate(candidate: str | os.PathLike[str], feeds_list: Feeds) -> Outputs:
    """Outputs of the candidate per feed: an artifact through its backend's runner, a plain
    model on onnxruntime's CPU provider without graph optimizations."""
    path = Path(candidate)
    if not path.is_dir():
        return run_model(path, feeds_list)
    from infercc.runtime.bench import open_runner

    runner, skeleton = open_runner(path)
    dtypes = {vi.name: input_dtype(vi) for vi in real_inputs(skeleton)}
    outputs = []
    for feeds in feeds_list:
        given = {n: _as_dtype(feeds[n], dtypes.get(n)) for n in runner.input_names if n in feeds}
        values = _run_runner(runner, given)
        outputs.append(dict(zip(runner.output_names, values, strict=True)))
    return outputs


def _run_runner(runner: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return runner.run(feeds)
    except InferccError:
        raise
    except Exception as exc:  # backends raise their own exception types
        raise InferccError(
            f"the artifact's runner failed: {first_line(exc)}", "check the input shapes"
        ) from exc


def _as_dtype(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """A float feed in the float type the model declares (fp16 I/O takes the same values)."""
    arr = np.asarray(array)
    if dtype is not None and dtype.kind == "f" and arr.dtype.kind == "f" and arr.dtype != dtype:
        return arr.astype(dtype)
    return arr


def candidate_model_path(candidate: str | os.PathLike[str]) -> Path:
    """The .onnx file of a candidate (an artifact's model.onnx)."""
    path = Path(candidate)
    if path.is_dir():
        return path / str(_manifest(path).get("model") or "model.onnx")
    return path


def _manifest(directory: Path) -> dict[str, Any]:
    from infercc.runtime.artifact import read_manifest

    if not (directory / MANIFEST).is_file():
        raise InferccError(
            f"{str(directory)!r} is a directory without {MANIFEST}",
            "pass an .onnx file or an artifact directory built by infercc",
        )
    return read_manifest(directory)


# --------------------------------------------------------------------------- goldens


def save_golden(
    directory: str | os.PathLike[str],
    feeds_list: Feeds,
    outputs: Outputs,
    reference: str | os.PathLike[str] | None = None,
) -> Path:
    """Write inputs and expected outputs (see the module docstring); replaces an older golden
    directory, refuses any other non-empty directory."""
    out = Path(directory)
    _check_golden_destination(out)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.infercc-", dir=out.parent))
    try:
        _write_golden(stage, feeds_list, outputs, reference)
        if out.exists():
            shutil.rmtree(out)
        os.replace(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    log.info("saved %d golden sample(s) to %s", len(feeds_list), out)
    return out


def _check_golden_destination(out: Path) -> None:
    if not out.parent.is_dir():
        raise InferccError(f"directory {str(out.parent)!r} does not exist", "create it first")
    if out.exists() and not out.is_dir():
        raise InferccError(f"{str(out)!r} exists and is not a directory", "pick another path")
    if out.is_dir() and any(out.iterdir()) and not (out / GOLDEN_FILE).is_file():
        raise InferccError(
            f"{str(out)!r} is a non-empty directory that holds no goldens",
            "give a new or empty directory (or an older golden directory to replace)",
        )


def _write_golden(
    stage: Path, feeds_list: Feeds, outputs: Outputs, reference: str | os.PathLike[str] | None
) -> None:
    (stage / "inputs").mkdir()
    (stage / "outputs").mkdir()
    for i, (feeds, outs) in enumerate(zip(feeds_list, outputs, strict=True)):
        np.savez(stage / "inputs" / f"sample_{i:03d}.npz", **_plain(feeds))
        np.savez(stage / "outputs" / f"sample_{i:03d}.npz", **_plain(outs))
    meta = {
        "schema": GOLDEN_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reference": None if reference is None else str(reference),
        "reference_sha256": _sha256(reference),
        "samples": len(feeds_list),
        "inputs": list(feeds_list[0]) if feeds_list else [],
        "outputs": list(outputs[0]) if outputs else [],
    }
    (stage / GOLDEN_FILE).write_text(json.dumps(meta, indent=1) + "\n")


def _plain(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Arrays numpy can save without pickling (string tensors as unicode arrays)."""
    result = {}
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise InferccError(
                f"output {name!r} is not a tensor ({type(value).__name__})",
                "goldens hold tensors only",
            )
        result[name] = value.astype(str) if value.dtype == np.dtype(object) else value
    return result


def _sha256(path: str | os.PathLike[str] | None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_golden(directory: str | os.PathLike[str]) -> tuple[Feeds, Outputs, dict[str, Any]]:
    """Inputs, expected outputs and metadata of a golden directory."""
    root = Path(directory)
    meta = _golden_meta(root)
    inputs = _load_npz_dir(root / "inputs")
    outputs = _load_npz_dir(root / "outputs")
    if len(inputs) != len(outputs) or len(inputs) != meta.get("samples", len(inputs)):
        raise InferccError(
            f"golden directory {str(root)!r} is incomplete "
            f"({len(inputs)} input and {len(outputs)} output files)",
            "write it again with --save-golden",
        )
    return inputs, outputs, meta


def _golden_meta(root: Path) -> dict[str, Any]:
    missing = (
        f"{str(root)!r} has no {GOLDEN_FILE}: it is not a golden directory",
        "write one with infercc validate --reference MODEL --save-golden DIR",
    )
    return read_schema_json(root / GOLDEN_FILE, GOLDEN_SCHEMA, missing, "write it again")


def _load_npz_dir(directory: Path) -> list[dict[str, np.ndarray]]:
    files = sorted(directory.glob("sample_*.npz")) if directory.is_dir() else []
    result = []
    for file in files:
        try:
            with np.load(file, allow_pickle=False) as archive:
                result.append({key: archive[key] for key in archive.files})
        except (OSError, ValueError) as exc:
            raise InferccError(f"cannot read {str(file)!r}: {exc}", "write it again") from exc
    return result


# --------------------------------------------------------------------------- entry point


def reference_feeds(
    reference: str | os.PathLike[str],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> Feeds:
    """Feeds for the reference: the samples in `data`, else one random feed."""
    model = read_skeleton(Path(reference))
    if data is not None:
        return load_samples(data, model)
    return [make_inputs(model, shapes, seed)]


def validate_candidate(
    candidate: str | os.PathLike[str] | None,
    reference: str | os.PathLike[str] | None = None,
    *,
    golden: str | os.PathLike[str] | None = None,
    save_golden_to: str | os.PathLike[str] | None = None,
    data: str | os.PathLike[str] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    bisect: bool = False,
    target: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> CandidateReport:
    """Validate `candidate` against `reference` or `golden` (see the module docstring).

    `candidate=None` with `save_golden_to` only writes the goldens of `reference`; `target`
    is the target the candidate was built for (for `bisect`); `on_step(what)` is told each
    step.
    """
    step = on_step or (lambda _what: None)
    _check_sources(candidate, reference, golden, save_golden_to, data, bisect)
    step("running the reference")
    if golden is not None:
        feeds_list, expected, _meta = load_golden(golden)
    else:
        feeds_list = reference_feeds(reference, shapes, data, seed)
        expected = run_model(reference, feeds_list)
    saved = None
    if save_golden_to is not None:
        saved = str(save_golden(save_golden_to, feeds_list, expected, reference))
    if candidate is None:
        return CandidateReport(None, _str(reference), _str(golden), "fp32", None, saved)
    skeleton = _candidate_skeleton(candidate)
    if skeleton is not None:
        _check_same_inputs(skeleton, feeds_list[0] if feeds_list else {})
    precision = detect_precision(candidate, skeleton)
    tol = default_tolerance(precision, atol, rtol, min_cosine)
    step("running the candidate")
    actual = run_candidate(candidate, feeds_list)
    report = compare_outputs(
        expected, actual, float_dtypes_may_differ=precision != "fp32", tolerances=tolerances, **tol
    )
    result = CandidateReport(
        _str(candidate), _str(reference), _str(golden), precision, report, saved
    )
    if bisect and not report.passed:
        step("bisecting the pipeline")
        result.bisect = _bisect(candidate, reference, feeds_list, tol, tolerances, target)
    return result


def _candidate_skeleton(candidate: str | os.PathLike[str]) -> onnx.ModelProto | None:
    """The candidate model's skeleton; None when its file is missing (run_candidate then
    names what is missing)."""
    model_path = candidate_model_path(candidate)
    return read_skeleton(model_path) if model_path.is_file() else None


def _check_same_inputs(skeleton: onnx.ModelProto, feeds: Mapping[str, Any]) -> None:
    """The candidate must take the inputs the reference (or the goldens) provide."""
    names = [vi.name for vi in real_inputs(skeleton)]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InferccError(
            f"the candidate takes input(s) {', '.join(map(repr, missing))} that the reference "
            f"does not provide (it has {', '.join(map(repr, feeds)) or 'none'})",
            "validate a model against the original it was built from",
        )


def _check_sources(
    candidate: Any, reference: Any, golden: Any, save_to: Any, data: Any, bisect: bool
) -> None:
    if golden is not None and save_to is not None:
        raise InferccError("--golden and --save-golden exclude each other", "give one of them")
    if golden is not None and data is not None:
        raise InferccError(
            "--golden and --data exclude each other", "the golden directory holds the inputs"
        )
    if golden is None and reference is None:
        raise InferccError(
            "nothing to compare the candidate with",
            "give --reference ORIGINAL.onnx or --golden DIR",
        )
    if candidate is None and save_to is None:
        raise InferccError("no candidate to validate", "give CANDIDATE, or --save-golden DIR")
    if bisect and reference is None:
        raise InferccError(
            "--bisect rebuilds the candidate from the reference", "give --reference ORIGINAL.onnx"
        )


def _bisect(
    candidate: str | os.PathLike[str],
    reference: str | os.PathLike[str],
    feeds_list: Feeds,
    tol: dict[str, float],
    tolerances: Mapping[str, tuple[float, float]] | None,
    target: str | None,
) -> Any:
    from infercc.check.bisection import bisect, config_for_candidate

    config = config_for_candidate(candidate, reference, target)
    return bisect(
        reference,
        feeds_list[:1],
        config,
        tolerance=tol,
        tolerances=tolerances,
        candidate=candidate_model_path(candidate),
    )


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
