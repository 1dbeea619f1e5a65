"""Peak of live intermediate bytes under each candidate order of schedule-memory, per model.

    python bench/schedule_candidates.py [--no-large] [--json]

Each model is imported and run through the default pipeline without schedule-memory (what the
pass sees in `infercc optimize`), sized at its default shape profile, and the peak of live bytes
(`infercc.analysis.memory.peak_live`, KiB) printed for: the order before scheduling, each
candidate of `infercc.passes.schedule.CANDIDATES` (greedy, depth_first), two candidates measured
and not adopted (marked *: regions, the fork..join regions of the post-dominator tree,
`networkx.immediate_dominators`; generations, `networkx.topological_generations`), and the order
the pass adopts ("new": the lowest, only when strictly below "before"), with the candidate that
won. "floor" is the most bytes one node reads and writes at once, which no order goes below;
"greedy/new" is the gain over the greedy scheduler alone.

Models: the two in examples/, onnx's shipped model-zoo subset (`light_*`; --no-large skips
alexnet, vgg19 and zfnet512, whose weights are folded first) and three built with onnx.helper
(`tests/branchy.py`: a ResNet-like tower, Inception-like blocks of four branches, a U-Net).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnx

import infercc.passes.schedule as schedule
from infercc.analysis.memory import peak_live, value_sizes
from infercc.data.signature import resolve_shapes
from infercc.ir import export_model, import_model
from infercc.passes import PassContext, run_passes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import branchy  # noqa: E402
from tests.zoo import LARGE, SMALL, light_path  # noqa: E402

KIB = 1024
FOLD_LIMIT = 2**30


def models(large: bool) -> list[tuple[str, onnx.ModelProto]]:
    out = [(p.stem, onnx.load(p)) for p in sorted((ROOT / "examples").glob("*.onnx"))]
    for name in SMALL + (LARGE if large else []):
        out.append((name, onnx.load(light_path(name))))
    out += [
        ("resnet_tower", branchy.resnet_tower()),
        ("inception", branchy.inception()),
        ("unet", branchy.unet()),
    ]
    return out


# Candidates measured and not adopted by the pass: on no model here do they beat both greedy
# and depth_first (ties go to those), so the pass does not pay for them.
def _regions(deps: schedule.Dependencies, sizes: dict[str, int]) -> list:
    """Fork..join regions as units: the post-dominator tree (`networkx.immediate_dominators` of
    the reversed graph from a virtual sink) in postorder, so every node's post-dominated region
    is computed before it, the regions of a node's children one after the other, the one that
    needs the most bytes beyond what it leaves first. A region's nodes can read values from
    outside it; a node whose producers are not computed yet pulls them in first (depth-first).
    Sizes of a region: what its nodes live at once need, and what leaves it (its join's output
    and the graph outputs inside it)."""
    import networkx as nx

    dag, index = deps.dag, deps.index
    sink = _Sink()
    rev = dag.reverse(copy=True)
    rev.add_edges_from((sink, n) for n in deps.nodes if not dag.succ[n])
    idom = nx.immediate_dominators(rev, sink)
    children: dict[object, list] = {n: [] for n in deps.nodes}
    children[sink] = []
    for n in deps.nodes:
        children[idom[n]].append(n)
    out, kept = deps.out_bytes(sizes), deps.kept_bytes(sizes)
    need: dict = {}
    left: dict = {}  # bytes live once the region is done (before its join runs)
    inner_kept: dict = {}
    for n in deps.nodes:  # a post-dominator comes after what it post-dominates
        cs = children[n]
        cs.sort(key=lambda c: (left[c] - need[c], index[c]))
        need[n] = schedule._need([(need[c], left[c]) for c in cs], out[n])
        inner_kept[n] = kept.get(n, 0) + sum(inner_kept[c] for c in cs)
        left[n] = out[n] + inner_kept[n] - kept.get(n, 0)
    roots = sorted(children[sink], key=lambda c: (left[c] - need[c], index[c]))
    firsts: dict[object, list] = {sink: roots}
    firsts.update(children)
    tree_order = schedule._postorder([sink], firsts)  # type: ignore[list-item]
    producers = {n: sorted(dag.pred[n], key=index.__getitem__) for n in deps.nodes}
    order: list = []
    done: set = set()
    schedule._postorder(tree_order[:-1], producers, done, order)  # the virtual sink comes last
    return order


class _Sink:
    """The virtual node every sink of the graph leads to (the root of the post-dominator tree)."""


def _generations(deps: schedule.Dependencies, sizes: dict[str, int]) -> list:
    """Breadth-first: `networkx.topological_generations`, each generation in the current order."""
    import networkx as nx

    index = deps.index
    return [
        n
        for gen in nx.topological_generations(deps.dag)
        for n in sorted(gen, key=index.__getitem__)
    ]


REJECTED = [("regions", _regions), ("generations", _generations)]


def measure(name: str, proto: onnx.ModelProto) -> dict:
    model = import_model(proto)
    run_passes(model, PassContext(options={"fold_limit": FOLD_LIMIT}), disabled=["schedule-memory"])
    shapes = resolve_shapes(export_model(model, with_weights=False), None)
    sizes, _ = value_sizes(model, shapes)
    deps = schedule.Dependencies.of(model.graph)
    before = peak_live(deps.nodes, model.graph, sizes)
    floor = schedule.floor(deps, sizes)
    makers = list(schedule.CANDIDATES) + REJECTED
    peaks = {cand: peak_live(make(deps, sizes), model.graph, sizes) for cand, make in makers}
    winner, _order, new = schedule.best_order(deps, sizes, before)
    greedy = min(before, peaks["greedy"])  # what the greedy-only pass adopted
    return {
        "model": name,
        "nodes": len(deps.nodes),
        "floor": floor,
        "before": before,
        **peaks,
        "new": new,
        "winner": winner,
        "greedy_over_new": greedy / new if new else 1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-large", action="store_true", help="skip alexnet, vgg19, zfnet512")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    names = [c[0] for c in schedule.CANDIDATES] + [c[0] + "*" for c in REJECTED]
    rows = []
    if not args.json:
        print(
            "| model | nodes | floor KiB | before | "
            + " | ".join(names)
            + " | new | won | greedy/new |"
        )
        print(
            "| --- | ---: | ---: | ---: | "
            + " | ".join("---:" for _ in names)
            + " | ---: | --- | ---: |"
        )
    for name, proto in models(not args.no_large):
        r = measure(name, proto)
        rows.append(r)
        if not args.json:
            kib = [r[c] / KIB for c in ("floor", "before", *(c.rstrip("*") for c in names), "new")]
            cells = " | ".join(f"{k:.1f}" for k in kib)
            print(
                f"| {name} | {r['nodes']} | {cells} | {r['winner'] or '-'} | "
                f"{r['greedy_over_new']:.3f} |",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
