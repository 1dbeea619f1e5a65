"""Memory planning time on a synthetic graph with many tensors.

    python bench/plan_speed.py [--tensors 100000] [--skip-every 50] [--skip-length 500]

Builds a chain of period-3 blocks (Relu or Add -> Concat(x, x) doubling the width -> Slice back
to the width), where every `--skip-every`-th block output is also read `--skip-length` steps
later by an Add (long-lived skip connections, as in a U-Net). The model is built in memory and
imported (not timed as planning); then value sizing (`value_sizes`, shape inference included),
lifetimes, each placement heuristic and the plan check are timed, and the figures printed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from infercc.analysis.memory import (
    BY_BREADTH,
    BY_SIZE,
    check_plan,
    lower_bound,
    naive,
    plan_intervals,
    tensor_lifetimes,
    value_sizes,
)
from infercc.ir import import_model

WIDTH = 256


def build(n_tensors: int, skip_every: int, skip_length: int) -> onnx.ModelProto:
    """About `n_tensors` node outputs in a chain with long skip connections."""
    nodes, x, sources = [], "x", {}
    blocks = max(n_tensors // 3, 1)
    for b in range(blocks):
        src = sources.pop(b, None)
        if src is None:
            nodes.append(helper.make_node("Relu", [x], [f"a{b}"]))
        else:
            nodes.append(helper.make_node("Add", [x, src], [f"a{b}"]))
        nodes.append(helper.make_node("Concat", [f"a{b}", f"a{b}"], [f"c{b}"], axis=1))
        nodes.append(helper.make_node("Slice", [f"c{b}", "starts", "ends", "axes"], [f"s{b}"]))
        x = f"s{b}"
        if b % skip_every == 0:
            sources[b + max(skip_length // 3, 1)] = x
    ints = [
        numpy_helper.from_array(np.array([v], np.int64), n)
        for n, v in (("starts", 0), ("ends", WIDTH), ("axes", 1))
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", WIDTH])],
        ints,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def timed(label: str, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    print(f"  {label:<22} {time.perf_counter() - t0:7.2f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=100_000)
    ap.add_argument("--skip-every", type=int, default=50, help="blocks between skip sources")
    ap.add_argument("--skip-length", type=int, default=500, help="steps a skip tensor lives")
    ap.add_argument("--alignment", type=int, default=64)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = import_model(build(args.tensors, args.skip_every, args.skip_length))
    print(f"built and imported {len(model.graph)} nodes in {time.perf_counter() - t0:.1f} s")
    sizes, unknown = timed("value sizes", value_sizes, model, {"x": (1, WIDTH)})
    order = model.graph.nodes
    intervals = timed("lifetimes", tensor_lifetimes, order, model.graph, sizes)
    plans = {}
    for name in (BY_SIZE, BY_BREADTH):
        plans[name] = timed(name, plan_intervals, intervals, args.alignment, [name])
    timed("check_plan", check_plan, plans[BY_SIZE])
    bound = lower_bound(intervals, args.alignment)
    print(
        f"tensors {len(intervals)}  unknown {len(unknown)}  naive {naive(intervals):,} B  "
        f"bound {bound:,} B"
    )
    for name, plan in plans.items():
        print(f"  {name:<18} arena {plan.arena_bytes:,} B  ratio {plan.ratio:.3f}")


if __name__ == "__main__":
    main()
