"""Real bugs against the validator: how far infercc's correct builds and small bugs move each
output, in units of what onnxruntime's own optimizer moves it by.

For each model: the original runs under onnxruntime with its graph optimizations off (the
reference) and at their default level (`own`: what every user of the original gets); infercc's
fp32 build runs with them off. Per output, the *movement ratio* is

    max |candidate - reference|  /  max(max |own - reference|, floor)

(`floor`: 16 ulps of fp32 at the output's largest magnitude, for outputs onnxruntime does not
move at all; `infercc.check.compare.movement_floor`). The control row is infercc's own build.
Mutants of that build each carry one real bug of relative size eps:

* ``weight``: the largest float initializer scaled by (1 + eps);
* ``weight-near-output``: the float initializer read closest to an output, scaled;
* ``output``: the first float output multiplied by (1 + eps) (a Mul before it);
* ``bias``: one element of the largest 1-D initializer moved by eps x its largest magnitude;
* ``swap``: two rows of the largest 2-D+ initializer swapped (eps not used);
* ``epsilon``: a normalization's epsilon multiplied by 1 + 1e3 * eps.

A mutant is *caught* by the fixed tolerance when the fp32 table (atol, rtol, cosine, with the
runtime-rounding floor) fails it, and *caught at k* when its ratio exceeds k. The table prints
per row: max abs error, the movement, the ratio, and the two verdicts; the summary gives the
largest control ratio (no correct build may exceed k), the smallest ratio among mutants of
ratio >= 20 (each must be caught), and the k chosen between them.

    python bench/mutants.py                              # the examples, onnx's zoo, MiniLM
    python bench/mutants.py --models small_cnn,densenet121 --eps 1e-5,1e-4,1e-3 --json

Models: ``examples/*.onnx``; onnx's shipped zoo subset with random weights (tests/zoo.py);
``minilm`` (trained, ``bench/export_minilm.py``, when its cache exists); the exports of
``bench/zoo_models.py`` with ``--zoo`` (needs torch, transformers, timm).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

Feeds = dict[str, np.ndarray]
KINDS = ("weight", "weight-near-output", "output", "bias", "swap", "epsilon")
NORMS = {"LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization"}


# --------------------------------------------------------------------------- models


def _examples() -> Iterator[tuple[str, Callable[[Path], Path]]]:
    for path in sorted((ROOT / "examples").glob("*.onnx")):
        yield path.stem, lambda _w, p=path: p


def _onnx_zoo() -> Iterator[tuple[str, Callable[[Path], Path]]]:
    from tests.zoo import SMALL, light_path, randomize, save

    for name in SMALL:
        if light_path(name).exists():

            def make(work: Path, n: str = name) -> Path:
                out = work / f"{n}.onnx"
                if not out.exists():
                    save(randomize(onnx.load(light_path(n))), out)
                return out

            yield name, make


def _minilm() -> Iterator[tuple[str, Callable[[Path], Path]]]:
    path = HERE / ".cache" / "minilm" / "minilm.onnx"
    if path.exists():
        yield "minilm", lambda _w: path


def _zoo() -> Iterator[tuple[str, Callable[[Path], Path]]]:
    from shape_zoo import exported
    from zoo_models import ZOO

    for model in ZOO:
        yield model.name, lambda _w, m=model: exported(m)


def models(zoo: bool) -> dict[str, Callable[[Path], Path]]:
    found = dict(_examples())
    found.update(_onnx_zoo())
    found.update(_minilm())
    if zoo:
        found.update(_zoo())
    return found


# --------------------------------------------------------------------------- running


def session_outputs(model: Path | onnx.ModelProto, feeds: list[Feeds], opt: bool) -> list[dict]:
    """Each feed's outputs under onnxruntime's CPU provider, its optimizations on (`opt`) or
    off: the runner validation itself uses (`infercc.check.compare.run_model`)."""
    from infercc.check.compare import run_model

    return run_model(model, feeds, optimize=opt)


def make_feeds(path: Path) -> list[Feeds]:
    from infercc.check.profiles import plan_feeds, reference_graph

    model, constants = reference_graph(path)
    plan = plan_feeds(path, model, None, None, 0, None, constants, skip_hint=None)
    return plan.feeds


def movement(ref: list[dict], other: list[dict]) -> dict[str, float]:
    """Per float output: the largest |other - ref| over samples and elements."""
    out: dict[str, float] = {}
    for r, o in zip(ref, other, strict=True):
        for name, a in r.items():
            a = np.asarray(a)
            if a.dtype.kind != "f":
                continue
            b = np.asarray(o[name]).astype(np.float64)
            a64 = a.astype(np.float64)
            if a64.shape != b.shape:
                out[name] = float("inf")
                continue
            finite = np.isfinite(a64) & np.isfinite(b)
            err = float(np.abs(a64[finite] - b[finite]).max(initial=0.0))
            out[name] = max(out.get(name, 0.0), err)
    return out


def scale(ref: list[dict]) -> dict[str, float]:
    return {
        n: max(float(np.abs(np.asarray(r[n], np.float64)).max(initial=0.0)) for r in ref)
        for n, a in ref[0].items()
        if np.asarray(a).dtype.kind == "f"
    }


def ratios(
    err: dict[str, float], own: dict[str, float], mag: dict[str, float]
) -> dict[str, float]:
    from infercc.check.compare import movement_floor

    return {n: e / max(own.get(n, 0.0), movement_floor(mag[n])) for n, e in err.items()}


def fixed_verdict(ref: list[dict], cand: list[dict], own: list[dict]) -> bool:
    """Whether the fp32 table (with the runtime-rounding floor) passes the candidate, the
    movement rule left out."""
    from infercc.check.compare import compare_outputs
    from infercc.precisions import FP32

    report = compare_outputs(ref, cand, own=own, movement_k=None, **FP32.to_dict())
    return report.passed


# --------------------------------------------------------------------------- mutants


def _floats(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT]


def _largest(tensors: list[onnx.TensorProto], rank: int | None = None) -> onnx.TensorProto | None:
    pool = [
        t
        for t in tensors
        if rank is None or len(t.dims) == rank or (rank == 2 and len(t.dims) >= 2)
    ]
    return max(pool, key=lambda t: int(np.prod(t.dims)), default=None)


def _replace(model: onnx.ModelProto, t: onnx.TensorProto, arr: np.ndarray) -> None:
    t.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t.name))


def _near_output(model: onnx.ModelProto) -> onnx.TensorProto | None:
    inits = {t.name: t for t in _floats(model)}
    producers = {o: n for n in model.graph.node for o in n.output}
    frontier = [o.name for o in model.graph.output]
    seen: set[str] = set()
    while frontier:
        nxt = []
        for name in frontier:
            node = producers.get(name)
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for i in node.input:
                if i in inits and int(np.prod(inits[i].dims)) > 1:
                    return inits[i]
                nxt.append(i)
        frontier = nxt
    return None


def mutate(model: onnx.ModelProto, kind: str, eps: float) -> onnx.ModelProto | None:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    floats = _floats(m)
    if kind in ("weight", "weight-near-output"):
        t = _largest(floats) if kind == "weight" else _near_output(m)
        if t is None:
            return None
        _replace(m, t, numpy_helper.to_array(t) * np.float32(1 + eps))
    elif kind == "output":
        out = next((o for o in m.graph.output if o.type.tensor_type.elem_type == 1), None)
        if out is None:
            return None
        inner = f"{out.name}__before_bug"
        for n in m.graph.node:
            for field in (n.output, n.input):
                for i, name in enumerate(field):
                    if name == out.name:
                        field[i] = inner
        k = numpy_helper.from_array(np.array(1 + eps, np.float32), f"{out.name}__bug")
        m.graph.initializer.append(k)
        m.graph.node.append(helper.make_node("Mul", [inner, k.name], [out.name]))
    elif kind == "bias":
        t = _largest(floats, rank=1)
        if t is None:
            return None
        arr = numpy_helper.to_array(t).copy()
        arr[arr.size // 2] += np.float32(eps * max(float(np.abs(arr).max()), 1e-3))
        _replace(m, t, arr)
    elif kind == "swap":
        t = _largest(floats, rank=2)
        if t is None or t.dims[0] < 2:
            return None
        arr = numpy_helper.to_array(t).copy()
        arr[[0, 1]] = arr[[1, 0]]
        _replace(m, t, arr)
    elif kind == "epsilon":
        norm = next((n for n in m.graph.node if n.op_type in NORMS), None)
        if norm is None:
            return None
        attr = next((a for a in norm.attribute if a.name == "epsilon"), None)
        base = attr.f if attr is not None else 1e-5
        if attr is not None:
            norm.attribute.remove(attr)
        norm.attribute.append(helper.make_attribute("epsilon", base * (1 + 1e3 * eps)))
    return m


# --------------------------------------------------------------------------- the bench


def bench_model(name: str, make: Callable[[Path], Path], work: Path, eps_list: list[float]):
    import infercc

    src = make(work)
    built = work / f"{name}.infercc.onnx"
    infercc.optimize(src, built, validate=False)
    feeds = make_feeds(src)
    ref = session_outputs(src, feeds, opt=False)
    own = session_outputs(src, feeds, opt=True)
    mag = scale(ref)
    own_move = movement(ref, own)
    candidate = onnx.load(built)
    rows = []

    def row(bug: str, eps: float | None, model: onnx.ModelProto | Path) -> None:
        cand = session_outputs(model, feeds, opt=False)
        err = movement(ref, cand)
        r = ratios(err, own_move, mag)
        worst = max(r, key=lambda n: r[n])
        rows.append(
            {
                "model": name,
                "bug": bug,
                "eps": eps,
                "output": worst,
                "max_abs": err[worst],
                "movement": own_move.get(worst, 0.0),
                "ratio": r[worst],
                "fixed_passes": fixed_verdict(ref, cand, own),
            }
        )

    row("none (control)", 0.0, built)
    for kind in KINDS:
        for eps in eps_list if kind != "swap" else [None]:
            mutant = mutate(candidate, kind, eps or 0.0)
            if mutant is not None:
                row(kind, eps, mutant)
    return rows


def summarize(rows: list[dict], k: float) -> dict[str, Any]:
    control = [r for r in rows if r["bug"].startswith("none")]
    bugs = [r for r in rows if not r["bug"].startswith("none") and r["max_abs"] > 0]
    worst_control = max(control, key=lambda r: r["ratio"], default=None)
    big = [r for r in bugs if r["ratio"] >= 20]
    least_big = min(big, key=lambda r: r["ratio"], default=None)
    return {
        "largest_control_ratio": worst_control["ratio"] if worst_control else None,
        "largest_control_model": worst_control["model"] if worst_control else None,
        "smallest_bug_ratio_ge_20": least_big["ratio"] if least_big else None,
        "k": k,
        "controls_passing_at_k": sum(r["ratio"] <= k for r in control),
        "controls": len(control),
        "bugs_ge_20_caught_at_k": sum(r["ratio"] > k for r in big),
        "bugs_ge_20": len(big),
        "bugs_caught_by_fixed_tolerance": sum(not r["fixed_passes"] for r in bugs),
        "bugs_caught_at_k_or_fixed": sum((r["ratio"] > k) or not r["fixed_passes"] for r in bugs),
        "bugs": len(bugs),
        "by_eps": {
            str(eps): {
                "bugs": len(group),
                "caught_by_fixed_tolerance": sum(not r["fixed_passes"] for r in group),
                "caught_at_k_or_fixed": sum(r["ratio"] > k or not r["fixed_passes"] for r in group),
            }
            for eps in sorted({r["eps"] for r in bugs}, key=lambda e: (e is None, e or 0.0))
            for group in [[r for r in bugs if r["eps"] == eps]]
        },
    }


def main() -> None:
    from infercc.precisions import MOVEMENT_K

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated names (default: all found)")
    ap.add_argument("--eps", default="1e-5,1e-4,1e-3")
    ap.add_argument("--zoo", action="store_true", help="also bench/zoo_models.py's exports")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    found = models(args.zoo)
    names = [n for n in args.models.split(",") if n] or list(found)
    eps_list = [float(e) for e in args.eps.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                rows += bench_model(name, found[name], Path(tmp), eps_list)
            except Exception as exc:  # one model that will not build or run: say so, go on
                print(f"{name}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    summary = summarize(rows, MOVEMENT_K)
    from hostinfo import host_line

    if args.json:
        print(json.dumps({"host": host_line(), "rows": rows, "summary": summary}, indent=1))
        return
    print(host_line())
    print("| model | bug | eps | output | max abs | ORT movement | ratio | fixed tol | at k |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eps = "-" if r["eps"] is None else f"{r['eps']:g}"
        fixed = "pass" if r["fixed_passes"] else "**fail**"
        at_k = "pass" if r["ratio"] <= MOVEMENT_K else "**fail**"
        print(
            f"| {r['model']} | {r['bug']} | {eps} | {r['output']} | {r['max_abs']:.2g} | "
            f"{r['movement']:.2g} | {r['ratio']:.3g} | {fixed} | {at_k} |"
        )
    print()
    for key, value in summary.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
