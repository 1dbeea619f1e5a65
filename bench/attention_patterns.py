"""Print the Q/K/V projection subgraph of one attention layer of an ONNX transformer.

Bench-only study tool (onnx only). It finds groups of >= 3 MatMul/Gemm nodes with a constant
2-D weight that read the same activation tensor (the Q, K, V projections of a layer), then
prints, in graph order, every node from those projections forward up to the attention output
projection (the next MatMul/Gemm with a constant weight), plus the shape-computation nodes
(Shape/Gather/Unsqueeze/Concat...) that feed their Reshapes. Constants are annotated with
shape, kind (initializer or Constant node) and, when small, their value.

Usage::

    python bench/attention_patterns.py bench/.cache/bert_L2_sdpa_ts.onnx [--layer 0]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

LINEAR_OPS = ("MatMul", "Gemm")
SHAPE_OPS = {
    "Shape",
    "Gather",
    "Unsqueeze",
    "Squeeze",
    "Concat",
    "Slice",
    "Cast",
    "Constant",
    "Reshape",
    "Expand",
    "Max",
}
STOP_FORWARD = {"LayerNormalization"}


class Graph:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.nodes = list(g.node)
        self.index = {id(n): i for i, n in enumerate(self.nodes)}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
        for n in self.nodes:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        # constant tensors: name -> (array, kind)
        self.const: dict[str, tuple[np.ndarray, str]] = {}
        for t in g.initializer:
            self.const[t.name] = (numpy_helper.to_array(t), "init")
        for n in self.nodes:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        self.const[n.output[0]] = (numpy_helper.to_array(a.t), "Constant")
                    elif a.name in ("value_int", "value_ints", "value_float", "value_floats"):
                        arr = np.array(helper.get_attribute_value(a))
                        self.const[n.output[0]] = (arr, "Constant")
        self.graph_inputs = {i.name for i in g.input}
        self.vi: dict[str, onnx.ValueInfoProto] = {}
        for v in list(g.value_info) + list(g.input) + list(g.output):
            self.vi[v.name] = v

    def shape_of(self, name: str) -> str:
        if name in self.const:
            return str(tuple(self.const[name][0].shape))
        v = self.vi.get(name)
        if v is None or not v.type.HasField("tensor_type"):
            return "?"
        tt = v.type.tensor_type
        if not tt.HasField("shape"):
            return "?"
        dims = [
            d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
            for d in tt.shape.dim
        ]
        return "[" + ",".join(dims) + "]"

    def is_const(self, name: str) -> bool:
        return name in self.const

    def weight_input(self, n: onnx.NodeProto) -> str | None:
        """The constant 2-D weight input of a MatMul/Gemm (B), or None."""
        if n.op_type not in LINEAR_OPS or len(n.input) < 2:
            return None
        b = n.input[1]
        if b in self.const and self.const[b][0].ndim == 2:
            return b
        # weight produced by Transpose of a constant (not folded)
        p = self.producer.get(b)
        if p is not None and p.op_type == "Transpose" and p.input[0] in self.const:
            return b
        return None

    def describe_input(self, name: str) -> str:
        if not name:
            return "''"
        if name in self.const:
            arr, kind = self.const[name]
            s = f"{name}<{kind} {arr.dtype} {tuple(arr.shape)}"
            if arr.size <= 8:
                s += f" ={arr.tolist()}"
            return s + ">"
        tag = "graph-input" if name in self.graph_inputs else ""
        shape = self.shape_of(name)
        return f"{name}{shape if shape != '?' else ''}{'<' + tag + '>' if tag else ''}"


def fmt_attrs(n: onnx.NodeProto) -> str:
    out = []
    for a in n.attribute:
        if n.op_type == "Constant":
            continue
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        out.append(f"{a.name}={v}")
    return (" {" + ", ".join(out) + "}") if out else ""


def find_qkv_groups(G: Graph) -> list[tuple[str, list[onnx.NodeProto]]]:
    groups = []
    for x, cons in G.consumers.items():
        lin = [c for c in cons if c.input and c.input[0] == x and G.weight_input(c)]
        if len(lin) >= 3:
            groups.append((x, lin))
    groups.sort(key=lambda t: min(G.index[id(n)] for n in t[1]))
    return groups


def region(G: Graph, starts: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    seen: dict[int, onnx.NodeProto] = {}
    stack = list(starts)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        for o in n.output:
            for c in G.consumers.get(o, []):
                if id(c) in seen or c.op_type in STOP_FORWARD:
                    continue
                if c not in starts and G.weight_input(c) and c.input[0] == o:
                    seen[id(c)] = c  # output projection: include, do not expand
                    continue
                stack.append(c)
    # weights given as Transpose(constant) (exports without constant folding)
    for n in list(seen.values()):
        w = G.weight_input(n)
        p = G.producer.get(w) if w else None
        if p is not None and p.op_type == "Transpose":
            seen[id(p)] = p
    # backward: shape-computation producers of region nodes' non-constant inputs
    frontier = list(seen.values())
    depth = 0
    while frontier and depth < 8:
        nxt = []
        for n in frontier:
            for i in n.input:
                p = G.producer.get(i)
                if p is None or id(p) in seen or p.op_type not in SHAPE_OPS:
                    continue
                if p.op_type == "Constant":
                    continue  # shown inline as <Constant ...>
                seen[id(p)] = p
                nxt.append(p)
        frontier = nxt
        depth += 1
    return sorted(seen.values(), key=lambda n: G.index[id(n)])


def summarize(G: Graph, x: str, qkv: list[onnx.NodeProto]) -> list[str]:
    lines = [f"shared input of the projections: {G.describe_input(x)}"]
    px = G.producer.get(x)
    lines.append(f"  produced by: {px.op_type if px else 'graph input'}")
    for role, n in zip("QKV", qkv, strict=False):
        w = G.weight_input(n)
        arr, kind = G.const.get(w, (None, ""))
        if arr is None:  # Transpose of a constant
            tp = G.producer[w]
            arr, k0 = G.const[tp.input[0]]
            kind = f"Transpose{fmt_attrs(tp)} of {k0} {tp.input[0]} {tuple(arr.shape)}"
            arr = None
        attrs = fmt_attrs(n)
        lines.append(
            f"  {role}: {n.op_type}{attrs} name={n.name!r} weight={w} "
            f"{'' if arr is None else tuple(arr.shape)} [{kind}]"
        )
        nxt = G.consumers.get(n.output[0], [])
        chain = []
        cur = n
        for _ in range(6):
            nxt = G.consumers.get(cur.output[0], [])
            if len(nxt) != 1:
                chain.append(f"<{len(nxt)} consumers>")
                break
            c = nxt[0]
            desc = c.op_type
            if c.op_type == "Add":
                other = [i for i in c.input if i != cur.output[0]]
                pos = list(c.input).index(cur.output[0])
                if other and other[0] in G.const:
                    a, k = G.const[other[0]]
                    desc += f"(bias {tuple(a.shape)} {k}, matmul-output at input {pos})"
            elif c.op_type in ("Transpose",):
                desc += fmt_attrs(c)
            elif c.op_type in ("Mul", "Div"):
                other = [i for i in c.input if i != cur.output[0]]
                if other and other[0] in G.const:
                    desc += f"(by {G.const[other[0]][0].tolist()})"
            chain.append(desc)
            if c.op_type in ("MatMul", "Softmax"):
                break
            cur = c
        lines.append("     then: " + " -> ".join(chain))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--layer", type=int, default=0, help="which attention layer (default 0)")
    ap.add_argument("--no-infer", action="store_true", help="skip onnx shape inference")
    args = ap.parse_args(argv)

    model = onnx.load(str(args.model))
    if not args.no_infer:
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception as exc:  # shape info is only decoration
            print(f"(shape inference failed: {exc})")
    G = Graph(model)
    groups = find_qkv_groups(G)
    print(f"{args.model.name}: {len(G.nodes)} nodes, {len(groups)} QKV groups found")
    if not groups:
        return 1
    if args.layer >= len(groups):
        print(f"--layer {args.layer} out of range")
        return 1
    x, qkv = groups[args.layer]
    qkv = sorted(qkv, key=lambda n: G.index[id(n)])
    print("\n".join(summarize(G, x, qkv)))
    print(f"\n--- nodes of attention layer {args.layer} (graph order) ---")
    for n in region(G, qkv):
        ins = ", ".join(G.describe_input(i) for i in n.input)
        outs = ", ".join(f"{o}{G.shape_of(o) if G.shape_of(o) != '?' else ''}" for o in n.output)
        print(
            f"#{G.index[id(n)]:<4d} {n.op_type}{fmt_attrs(n)}  [{n.name}]\n"
            f"        in:  {ins}\n        out: {outs}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
