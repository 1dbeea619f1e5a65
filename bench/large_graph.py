"""Optimize time on a synthetic graph with many nodes (the IR's hot paths at scale).

    python bench/large_graph.py [--nodes 100000]

Builds a chain of small blocks (Identity, Relu, Add of a per-block constant, a duplicated Neg
that common-subexpression elimination merges), optimizes it with the default pipeline without
validation, and prints nodes before/after and the time of each phase.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import infercc


def build(n_nodes: int) -> onnx.ModelProto:
    nodes, inits = [], []
    x = "x"
    for i in range(n_nodes // 5):
        inits.append(numpy_helper.from_array(np.full((8,), i % 7, np.float32), f"c{i}"))
        nodes += [
            helper.make_node("Identity", [x], [f"i{i}"]),
            helper.make_node("Relu", [f"i{i}"], [f"r{i}"]),
            helper.make_node("Neg", [f"r{i}"], [f"n{i}"]),
            helper.make_node("Neg", [f"r{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"n{i}", f"m{i}"], [f"a{i}"]),
        ]
        x = f"a{i}"
    nodes.append(helper.make_node("Add", [x, "c0"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "chain.onnx"
        t0 = time.perf_counter()
        onnx.save(build(args.nodes), src)
        print(f"built {args.nodes} nodes in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        report = infercc.optimize(src, Path(tmp) / "out.onnx", run_validation=False)
        total = time.perf_counter() - t0
    print(
        f"nodes {report.nodes_before} -> {report.nodes_after}, optimize {total:.2f} s "
        f"({report.iterations} rounds)"
    )
    for name, st in report.passes.items():
        print(f"  {name:34s} {st['time_s']:7.2f} s")


if __name__ == "__main__":
    main()
