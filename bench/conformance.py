"""Conformance: infercc's passes on onnx's ~1,900 operator test cases must never break one.

    python bench/conformance.py [--every N] [--offset K] [--filter SUBSTR] [--portable]
                                [--files] [--jobs J] [--json]

Every case of `onnx.backend.test.case.node.collect_testcases` (one node, or a small graph,
with its inputs and expected outputs) is checked twice:

(a) as-is: the case runs under onnxruntime (CPU, its own graph optimizations off) before and
    after infercc's default pipeline (import -> passes with lint after each -> export). A case
    onnxruntime passes unoptimized must still pass optimized; anything else is a regression.
(b) folded: the case's inputs become initializers, so constant folding has to compute the
    whole graph ahead of time (and the inputs, now initializers of every dtype onnx has, go
    through infercc's tensor reader and writer). When every graph output of the optimized
    model is a constant (an initializer or a Constant node), those constants must equal what
    onnxruntime computes for the folded form (the runtime is the ground truth: exactly, same
    dtype, same shape, NaN equal to NaN; outputs of types its Python binding cannot return,
    such as bfloat16 or int4, come out through an exact Cast); where onnxruntime cannot run
    the case at all, they are compared with the case's expected outputs. float16 chains that
    onnxruntime runs in float32 without the intermediate roundings (B_MATCH_HALF) are
    compared within the case's tolerance and listed. A mismatch is a
    failure. When folding refused (fold limit, random ops such as RandomNormal or Bernoulli,
    a node onnxruntime fails on), the case counts as "not folded", and the partly folded
    model is still run under onnxruntime: if onnxruntime passes the unoptimized folded form,
    the optimized one must pass too.

Comparison with expected outputs follows onnx's backend test runner: the case's rtol/atol
(1e-3 / 1e-7 for node cases) through `numpy.testing.assert_allclose` (NaN equal to NaN), exact
equality for strings, and here also equal shapes and dtypes. Cases whose inputs or outputs
are sequences or optionals are skipped with that category (infercc never folds those types,
and onnxruntime's Python API feeds them differently).

`--files` goes through `load_model` and `save_model` (the wire-format reader and the
streaming writer the CLI uses) instead of in-memory import/export. `--portable` keeps
standard ONNX only. Prints a table of counts and the failures; `--json` prints one JSON
object instead. Exit status 1 when any regression or wrong fold was found. `--every 10` is
the fixed sample `tests/test_conformance.py` runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from infercc.errors import InferccError
from infercc.ir import export_model, import_model, load_model, save_model
from infercc.passes import DEFAULT_PIPELINE, PassContext, run_passes
from infercc.runtime.ort_support import max_ir_version

# (a) outcomes
A_PASS = "pass"
A_REGRESSION = "regression"
A_ORT_FAILS = "ort-fails-unoptimized"
A_NEWER_IR = "ir-newer-than-onnxruntime"  # stamped with an IR this onnxruntime cannot read
# (b) outcomes
B_MATCH = "folded-match"  # equal to onnxruntime's result
B_MATCH_EXPECTED = "folded-match-expected"  # onnxruntime cannot run it: the expected outputs
# A float16 chain: each folded node is onnxruntime's float16 result, but onnxruntime running
# the whole graph computes float16 ops without a CPU kernel in float32 and drops the
# float32 -> float16 -> float32 casts between them (its InsertCast / RemoveDuplicateCast
# transformers), so its end result skips roundings the node types call for: equal within the
# case's tolerance, not bit for bit.
B_MATCH_HALF = "folded-match-float16-rounding"
B_MISMATCH = "folded-mismatch"
B_NOT_FOLDED = "not-folded"
B_PARTIAL_REGRESSION = "partial-regression"
B_ERROR = "optimize-error"
B_NOT_APPLICABLE = "not-applicable"


@dataclass
class CaseResult:
    """What happened to one test case under (a) and (b)."""

    name: str
    skipped: str | None = None
    a: str = ""
    b: str = ""
    a_detail: str = ""
    b_detail: str = ""
    a_rewritten: bool = False
    refusals: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- cases


def load_cases(
    every: int = 1, offset: int = 0, name_filter: str | None = None
) -> list[onnx.backend.test.case.test_case.TestCase]:
    """The node test cases, sorted by name, every `every`-th from `offset` (deterministic)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = sorted(node.collect_testcases(None), key=lambda c: c.name)
    if name_filter:
        cases = [c for c in cases if name_filter in c.name]
    return cases[offset::every]


def as_array(x: Any) -> np.ndarray | None:
    """A case's tensor as a numpy array; None for sequences, optionals and maps."""
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    return None


def case_arrays(case) -> tuple[list[np.ndarray], list[np.ndarray]] | str:
    """(inputs, expected outputs) of the case's first data set, or a skip category."""
    if not case.data_sets:
        return "no data set"
    inputs, outputs = case.data_sets[0]
    ins = [as_array(x) for x in inputs]
    outs = [as_array(x) for x in outputs]
    if any(x is None for x in ins + outs):
        return "sequence/optional"
    return ins, outs  # type: ignore[return-value]


# --------------------------------------------------------------------------- running


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs under onnxruntime CPU, graph optimizations off."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, ["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


_WIDE = {
    onnx.TensorProto.BFLOAT16: onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT8E4M3FN: onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT8E4M3FNUZ: onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT8E5M2: onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT8E5M2FNUZ: onnx.TensorProto.FLOAT,
    onnx.TensorProto.INT4: onnx.TensorProto.INT8,
    onnx.TensorProto.UINT4: onnx.TensorProto.UINT8,
    **{
        getattr(onnx.TensorProto, k): v
        for k, v in (
            ("FLOAT4E2M1", onnx.TensorProto.FLOAT),
            ("FLOAT8E8M0", onnx.TensorProto.FLOAT),
            ("INT2", onnx.TensorProto.INT8),
            ("UINT2", onnx.TensorProto.UINT8),
        )
        if hasattr(onnx.TensorProto, k)
    },
}


def ort_truth(model: onnx.ModelProto) -> list[np.ndarray]:
    """onnxruntime's outputs of a model without inputs; outputs of a type the Python binding
    cannot return (bfloat16, float8, int4, ...) leave through an exact Cast and come back."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    dtypes = _output_dtypes(model)
    graph = wide.graph
    for vi, dtype in zip(graph.output, dtypes, strict=True):
        if dtype in _WIDE:
            name = vi.name
            vi.name = name + "__wide"
            vi.type.tensor_type.elem_type = _WIDE[dtype]
            graph.node.append(onnx.helper.make_node("Cast", [name], [vi.name], to=_WIDE[dtype]))
    outs = run_ort(wide, {})
    return [
        o.astype(onnx.helper.tensor_dtype_to_np_dtype(d)) if d in _WIDE else o
        for o, d in zip(outs, dtypes, strict=True)
    ]


def _output_dtypes(model: onnx.ModelProto) -> list[int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    return [vi.type.tensor_type.elem_type for vi in inferred.graph.output]


VIA_FILES = {"on": False}  # --files: through load_model / save_model, as the CLI reads and writes


def optimize(model: onnx.ModelProto, portable: bool = False) -> tuple[onnx.ModelProto, list[str]]:
    """infercc's default pipeline (as `infercc.api.optimize` chains it), linted; in memory, or
    with --files through the file reader and the streaming writer."""
    if VIA_FILES["on"]:
        return _optimize_files(model, portable)
    ir = import_model(model)
    ctx = PassContext(target="cpu", portable=portable, verify=True)
    report = run_passes(ir, ctx, DEFAULT_PIPELINE)
    refusals = [f"{r.pass_name}: {r.op_type}: {r.reason}" for r in report.refusals]
    return export_model(ir), refusals


def _optimize_files(model: onnx.ModelProto, portable: bool) -> tuple[onnx.ModelProto, list[str]]:
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "in.onnx", Path(d) / "out.onnx"
        src.write_bytes(model.SerializeToString())
        ir = load_model(src)
        ctx = PassContext(target="cpu", portable=portable, verify=True)
        report = run_passes(ir, ctx, DEFAULT_PIPELINE)
        save_model(ir, out)
        del ir
        refusals = [f"{r.pass_name}: {r.op_type}: {r.reason}" for r in report.refusals]
        return onnx.load(out), refusals


def mismatch(expected: np.ndarray, got: Any, rtol: float, atol: float) -> str | None:
    """Why `got` is not `expected` under onnx's backend-test rules, or None when it is."""
    got = as_array(got) if not isinstance(got, np.ndarray) else got
    if got is None:
        return f"got a {type(got).__name__}, expected a tensor"
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {list(got.shape)} != expected {list(expected.shape)}"
    if expected.dtype.kind in "OSU" or got.dtype.kind in "OSU":
        equal = np.array_equal(expected.astype(object), got.astype(object))
        return None if equal else "strings differ"
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype} != expected {expected.dtype}"
    try:
        e, g = _comparable(expected), _comparable(got)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    except AssertionError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if "Max" in ln]
        return "values differ: " + "; ".join(lines)[:200]
    return None


def _comparable(a: np.ndarray) -> np.ndarray:
    """ml_dtypes arrays (bfloat16, float8, int4) as float64 so numpy can compare them."""
    if a.dtype.kind in "biufc":
        return a
    return a.astype(np.float64)


def outputs_mismatch(
    expected: Sequence[np.ndarray], got: Sequence[Any], rtol: float, atol: float
) -> str | None:
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        why = mismatch(e, g, rtol, atol)
        if why is not None:
            return f"output {i}: {why}"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


# --------------------------------------------------------------------------- (a) as-is


def check_as_is(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    expected: list[np.ndarray],
    tol: tuple[float, float],
    portable: bool,
) -> tuple[str, str, list[str], bool]:
    """(outcome, detail, refusals, whether optimize changed the nodes) for the case as-is."""
    limit = max_ir_version()
    if model.ir_version > limit:
        detail = f"IR {model.ir_version}; onnxruntime {ort.__version__} reads IR <= {limit}"
        return A_NEWER_IR, detail, [], False
    try:
        why = outputs_mismatch(expected, run_ort(model, feeds), *tol)
    except Exception as e:  # onnxruntime refuses the case itself
        why = _first_line(e)
    if why is not None:
        return A_ORT_FAILS, why, [], False
    try:
        optimized, refusals = optimize(model, portable)
    except Exception as e:
        return A_REGRESSION, "optimize failed: " + _first_line(e), [], False
    rewritten = _node_list(optimized) != _node_list(model)
    try:
        why = outputs_mismatch(expected, run_ort(optimized, feeds), *tol)
    except Exception as e:
        why = "onnxruntime refused the optimized model: " + _first_line(e)
    outcome = A_PASS if why is None else A_REGRESSION
    return outcome, why or "", refusals, rewritten


def _node_list(model: onnx.ModelProto) -> list[tuple]:
    return [
        (
            n.op_type,
            n.domain,
            list(n.input),
            list(n.output),
            [a.SerializeToString() for a in n.attribute],
        )
        for n in model.graph.node
    ]


# --------------------------------------------------------------------------- (b) folded


def with_constant_inputs(model: onnx.ModelProto, inputs: list[np.ndarray]) -> onnx.ModelProto:
    """A copy whose graph inputs are initializers holding the case's input values."""
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    graph = folded.graph
    present = {t.name for t in graph.initializer}
    real = [vi for vi in graph.input if vi.name not in present]
    for vi, arr in zip(real, inputs, strict=False):
        tensor = numpy_helper.from_array(arr, vi.name)
        tensor.data_type = vi.type.tensor_type.elem_type or tensor.data_type
        graph.initializer.append(tensor)
    if folded.ir_version >= 4:  # IR < 4 lists every initializer as an input as well
        keep = [vi for vi in graph.input if vi.name in present]
        del graph.input[:]
        graph.input.extend(keep)
    return folded


def constant_outputs(model: onnx.ModelProto) -> list[np.ndarray] | None:
    """The graph outputs' values when every one is a constant, else None."""
    inits = {t.name: t for t in model.graph.initializer}
    consts = {
        n.output[0]: n
        for n in model.graph.node
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
    }
    values = []
    for vi in model.graph.output:
        if vi.name in inits:
            values.append(numpy_helper.to_array(inits[vi.name]))
        elif vi.name in consts:
            values.append(_constant_value(consts[vi.name]))
        else:
            return None
    return values


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    graph = onnx.helper.make_graph([node], "c", [], [onnx.ValueInfoProto(name=node.output[0])])
    return np.asarray(ReferenceEvaluator(onnx.helper.make_model(graph)).run(None, {})[0])


def check_folded(
    model: onnx.ModelProto,
    inputs: list[np.ndarray],
    expected: list[np.ndarray],
    tol: tuple[float, float],
    portable: bool,
) -> tuple[str, str, list[str]]:
    """(outcome, detail, refusals) for the case with its inputs turned into constants."""
    try:
        folded = with_constant_inputs(model, inputs)
    except Exception as e:
        return B_NOT_APPLICABLE, "inputs not representable: " + _first_line(e), []
    try:
        optimized, refusals = optimize(folded, portable)
    except InferccError as e:
        return B_ERROR, _first_line(e), []
    except Exception as e:
        return B_ERROR, "optimize crashed: " + _first_line(e), []
    values = constant_outputs(optimized)
    if values is not None:
        truth, exact = _truth(folded, expected, tol)
        why = outputs_mismatch(truth, values, *exact)
        if why is not None and exact == (0.0, 0.0) and _half(truth):
            if outputs_mismatch(truth, values, *tol) is None:
                return B_MATCH_HALF, why, refusals
        if why is not None:
            source = "onnxruntime" if exact == (0.0, 0.0) else "the expected outputs"
            return B_MISMATCH, f"vs {source}: {why}", refusals
        return (B_MATCH if exact == (0.0, 0.0) else B_MATCH_EXPECTED), "", refusals
    return _check_partial(folded, optimized, expected, tol, refusals)


def _half(arrays: list[np.ndarray]) -> bool:
    return any(a.dtype == np.float16 or a.dtype.name == "bfloat16" for a in arrays)


def _truth(
    folded: onnx.ModelProto, expected: list[np.ndarray], tol: tuple[float, float]
) -> tuple[list[np.ndarray], tuple[float, float]]:
    """What the folded values must equal: onnxruntime's outputs of the folded form, exactly;
    the expected outputs within the case's tolerance where onnxruntime cannot run it."""
    try:
        return ort_truth(folded), (0.0, 0.0)
    except Exception:
        return expected, tol


def _check_partial(
    folded: onnx.ModelProto,
    optimized: onnx.ModelProto,
    expected: list[np.ndarray],
    tol: tuple[float, float],
    refusals: list[str],
) -> tuple[str, str, list[str]]:
    """Not fully folded: if onnxruntime passes the folded form, the optimized form must give
    exactly onnxruntime's outputs of the folded form (what was folded is what it computes)."""
    reason = refusals[0] if refusals else "no refusal recorded"
    try:
        truth = ort_truth(folded)
        if outputs_mismatch(expected, truth, *tol) is not None:
            return B_NOT_FOLDED, reason, refusals
    except Exception:
        return B_NOT_FOLDED, reason, refusals
    try:
        why = outputs_mismatch(truth, ort_truth(optimized), 0.0, 0.0)
    except Exception as e:
        why = "onnxruntime refused the optimized model: " + _first_line(e)
    if why is not None:
        return B_PARTIAL_REGRESSION, why, refusals
    return B_NOT_FOLDED, reason, refusals


# --------------------------------------------------------------------------- one case


def check_case(case, portable: bool = False) -> CaseResult:
    """Both checks on one test case."""
    result = CaseResult(case.name)
    arrays = case_arrays(case)
    if isinstance(arrays, str):
        result.skipped = arrays
        return result
    inputs, expected = arrays
    tol = (case.rtol, case.atol)
    present = {t.name for t in case.model.graph.initializer}
    names = [vi.name for vi in case.model.graph.input if vi.name not in present]
    feeds = dict(zip(names, inputs, strict=False))
    result.a, result.a_detail, ref_a, result.a_rewritten = check_as_is(
        case.model, feeds, expected, tol, portable
    )
    result.b, result.b_detail, ref_b = check_folded(case.model, inputs, expected, tol, portable)
    result.refusals = sorted(set(ref_a) | set(ref_b))
    return result


def run_cases(cases: Iterable, portable: bool = False, jobs: int = 1) -> list[CaseResult]:
    """Check every case, in order; `jobs` > 1 spreads them over processes."""
    cases = list(cases)
    if jobs <= 1:
        return [_quiet(check_case, c, portable) for c in cases]
    names = [c.name for c in cases]
    chunks = [names[i::jobs] for i in range(jobs)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs) as pool:
        parts = pool.starmap(_run_names, [(c, portable, VIA_FILES["on"]) for c in chunks])
    by_name = {r.name: r for part in parts for r in part}
    return [by_name[n] for n in names]


def _run_names(names: list[str], portable: bool, files: bool = False) -> list[CaseResult]:
    VIA_FILES["on"] = files
    wanted = set(names)
    return [_quiet(check_case, c, portable) for c in load_cases() if c.name in wanted]


def _quiet(fn, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


# --------------------------------------------------------------------------- summary


def summarize(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The counts the issue asks for, and the failures by name."""
    ran = [r for r in results if r.skipped is None]
    newer = [r for r in ran if r.a == A_NEWER_IR]
    ort_ok = [r for r in ran if r.a not in (A_ORT_FAILS, A_NEWER_IR)]
    b_counts = Counter(r.b for r in ran)
    return {
        "total": len(results),
        "skipped": dict(Counter(r.skipped for r in results if r.skipped)),
        "ran": len(ran),
        "ir_newer_than_onnxruntime": len(newer),
        "ort_passes_unoptimized": len(ort_ok),
        "still_pass_after": sum(r.a == A_PASS for r in ran),
        "rewritten_and_pass": sum(r.a == A_PASS and r.a_rewritten for r in ran),
        "regressions": {r.name: r.a_detail for r in ran if r.a == A_REGRESSION},
        "folded_fully": sum(
            b_counts[k] for k in (B_MATCH, B_MATCH_EXPECTED, B_MATCH_HALF, B_MISMATCH)
        ),
        "folded_matches": b_counts[B_MATCH] + b_counts[B_MATCH_EXPECTED] + b_counts[B_MATCH_HALF],
        "folded_float16_rounding": {r.name: r.b_detail for r in ran if r.b == B_MATCH_HALF},
        "folded_equal_onnxruntime": b_counts[B_MATCH],
        "folded_match_expected": b_counts[B_MATCH_EXPECTED],
        "not_folded": b_counts[B_NOT_FOLDED],
        "fold_not_applicable": b_counts[B_NOT_APPLICABLE],
        "fold_mismatches": {r.name: r.b_detail for r in ran if r.b == B_MISMATCH},
        "partial_regressions": {r.name: r.b_detail for r in ran if r.b == B_PARTIAL_REGRESSION},
        "fold_errors": {r.name: r.b_detail for r in ran if r.b == B_ERROR},
    }


def failed(summary: dict[str, Any]) -> bool:
    keys = ("regressions", "fold_mismatches", "partial_regressions", "fold_errors")
    return any(summary[k] for k in keys)


def render(summary: dict[str, Any], seconds: float) -> str:
    rows = [
        ("cases", summary["total"]),
        ("skipped", sum(summary["skipped"].values())),
        ("ran", summary["ran"]),
        ("(a) IR newer than onnxruntime reads", summary["ir_newer_than_onnxruntime"]),
        ("(a) onnxruntime passes unoptimized", summary["ort_passes_unoptimized"]),
        ("(a) still pass after optimize", summary["still_pass_after"]),
        ("(a)   of which optimize rewrote", summary["rewritten_and_pass"]),
        ("(a) regressions", len(summary["regressions"])),
        ("(b) folded fully", summary["folded_fully"]),
        ("(b) folded values match", summary["folded_matches"]),
        ("(b)   equal to onnxruntime's", summary["folded_equal_onnxruntime"]),
        ("(b)   ORT cannot run: match expected", summary["folded_match_expected"]),
        ("(b)   float16 chains, within tolerance", len(summary["folded_float16_rounding"])),
        ("(b) folded values wrong", len(summary["fold_mismatches"])),
        ("(b) not folded", summary["not_folded"]),
        ("(b) not applicable", summary["fold_not_applicable"]),
        ("(b) partly folded, wrong under ORT", len(summary["partial_regressions"])),
        ("(b) optimize errors", len(summary["fold_errors"])),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v:>6}" for k, v in rows]
    for cat, n in sorted(summary["skipped"].items()):
        lines.append(f"  skipped: {cat}: {n}")
    for key in ("regressions", "fold_mismatches", "partial_regressions", "fold_errors"):
        for name, why in summary[key].items():
            lines.append(f"{key[:-1]}: {name}: {why}")
    lines.append(f"{seconds:.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="check every N-th case")
    parser.add_argument("--offset", type=int, default=0, help="first case of the sample")
    parser.add_argument("--filter", default=None, help="only cases whose name contains this")
    parser.add_argument("--portable", action="store_true", help="standard ONNX only")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--files", action="store_true", help="read and write model files as the CLI does"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--details", action="store_true", help="with --json: every case")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    VIA_FILES["on"] = args.files
    t0 = time.perf_counter()
    cases = load_cases(args.every, args.offset, args.filter)
    results = run_cases(cases, args.portable, args.jobs)
    summary = summarize(results)
    seconds = time.perf_counter() - t0
    if args.json:
        summary["seconds"] = round(seconds, 1)
        if args.details:
            summary["cases"] = [asdict(r) for r in results]
        print(json.dumps(summary, indent=1))
    else:
        print(render(summary, seconds))
    return 1 if failed(summary) else 0


if __name__ == "__main__":
    sys.exit(main())
