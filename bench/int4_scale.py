"""int4 of a 7B-class decoder on this host: peak memory and wall time, infercc vs onnxruntime.

    python bench/int4_scale.py WORKDIR [--gb 8] [--skip-ort] [--no-speed-check] [--json]

Writes into WORKDIR a Llama-shaped decoder in float16 (what `model.half()` exports): token
embedding, per layer an RMSNorm computed in float32 (as transformers' LlamaRMSNorm), q/k/v/o
projections, rotary embeddings (rotate-half, cos/sin tables gathered by position_ids), causal
attention over past + new keys with the attention mask, a SwiGLU MLP, residuals; a final norm
and an untied LM head. Inputs `input_ids`, `attention_mask`, `position_ids`,
`past_key_values.{i}.key/value [batch, heads, past, head]`; outputs `logits` and
`present.{i}.key/value`. Random weights N(0, 0.02), norm gains 1 + 0.1 N(0, 1), stored as
external data written tensor by tensor (never the whole model in memory). `--gb` sets the
number of layers so the float16 weights add up to about that many GB (hidden 3072, 24 heads,
MLP 8192, vocabulary 32000: 113 M parameters, 0.23 GB, a layer).

Then, each in its own subprocess, measuring wall time and peak RSS (getrusage of the child):

1. infercc: `python -m infercc calibrate MODEL --int4 --method rtn -o OUT` (its defaults
   otherwise: the validation against the original, and the speed race unless
   `--no-speed-check`; calibrate itself leaves the race out, saying so in `speed_skipped`,
   past 0.5 GiB of float16 weights, whose float32 copies onnxruntime's CPU session would hold);
2. onnxruntime's `MatMulNBitsQuantizer` (block 32, RTN, the class default), as its
   documentation shows it: `onnx.load` of the model, `process()`, `save_model_to_file` with
   external data; run under an address-space limit (`--ort-limit-gb`, default 22) so that it
   fails with MemoryError, reported, instead of taking the host down.

Prints the figures with the host line: peak RSS / float16 weight bytes for each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hostinfo import host_line  # noqa: E402

DATA = "weights.data"
ALIGN = 4096
HIDDEN, HEADS, MLP, VOCAB = 3072, 24, 8192, 32000
F16 = TensorProto.FLOAT16


class _Writer:
    """Nodes and external-data initializers, weights appended to one data file as made."""

    def __init__(self, folder: Path, seed: int):
        self.folder = folder
        self.fd = (folder / DATA).open("wb")
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.count = 0
        self.weight_bytes = 0

    def _external(self, name: str, array: np.ndarray) -> str:
        self.fd.write(b"\0" * ((-self.fd.tell()) % ALIGN))
        offset = self.fd.tell()
        self.fd.write(array.tobytes())
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                        dims=list(array.shape), data_location=TensorProto.EXTERNAL)
        for k, v in (("location", DATA), ("offset", str(offset)), ("length", str(array.nbytes))):
            t.external_data.add(key=k, value=v)
        self.inits.append(t)
        return name

    def weight(self, name: str, shape, std: float = 0.02, mean: float = 0.0) -> str:
        rows = []
        for start in range(0, shape[0], 1024):  # a few MB at a time
            n = min(1024, shape[0] - start)
            rows.append((mean + std * self.rng.standard_normal((n, *shape[1:]), np.float32))
                        .astype(np.float16))
        array = np.concatenate(rows)
        self.weight_bytes += array.nbytes
        return self._external(name, array)

    def const(self, name: str, array) -> str:
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs, n_out: int = 1, name: str | None = None, **attrs):
        self.count += 1
        outs = [name] if name else [f"{op_type.lower()}_{self.count}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=f"{op_type}_{self.count}", **attrs))
        return outs[0] if n_out == 1 else outs


def _rms(w: _Writer, x: str, gain: str) -> str:
    x32 = w.op("Cast", [x], to=TensorProto.FLOAT)
    var = w.op("ReduceMean", [w.op("Mul", [x32, x32]), "axes_last"], keepdims=1)
    inv = w.op("Reciprocal", [w.op("Sqrt", [w.op("Add", [var, "eps"])])])
    return w.op("Mul", [w.op("Cast", [w.op("Mul", [x32, inv])], to=F16), gain])


def _heads(w: _Writer, x: str) -> str:
    """[B, S, H] -> [B, heads, S, head]."""
    return w.op("Transpose", [w.op("Reshape", [x, "heads_shape"])], perm=[0, 2, 1, 3])


def _rotate(w: _Writer, x: str, cos: str, sin: str) -> str:
    lo, hi = w.op("Split", [x, "half_split"], n_out=2, axis=-1)
    rotated = w.op("Concat", [w.op("Neg", [hi]), lo], axis=-1)
    return w.op("Add", [w.op("Mul", [x, cos]), w.op("Mul", [rotated, sin])])


def build(folder: Path, layers: int, seed: int = 0) -> tuple[Path, int]:
    folder.mkdir(parents=True, exist_ok=True)
    w = _Writer(folder, seed)
    head = HIDDEN // HEADS
    w.const("axes_last", np.array([-1], np.int64))
    w.const("eps", np.array(1e-5, np.float32))
    w.const("heads_shape", np.array([0, 0, HEADS, head], np.int64))
    w.const("merge_shape", np.array([0, 0, HIDDEN], np.int64))
    w.const("half_split", np.array([head // 2, head // 2], np.int64))
    w.const("scale", np.array(1 / np.sqrt(head), np.float16))
    w.const("zero_f", np.array(0.0, np.float32))
    w.const("neg_f", np.array(-1e4, np.float32))
    w.const("one_i", np.array(1, np.int64))
    w.const("zero_i", np.array(0, np.int64))
    w.const("ax01", np.array([0, 1], np.int64))
    w.const("ax1", np.array([1], np.int64))
    inv = 1.0 / (10000 ** (np.arange(0, head, 2) / head))
    ang = np.arange(4096)[:, None] * inv[None, :]
    w.const("cos_table", np.concatenate([np.cos(ang)] * 2, -1).astype(np.float16))
    w.const("sin_table", np.concatenate([np.sin(ang)] * 2, -1).astype(np.float16))

    # causal mask over past + new, with the attention mask: [B, 1, S, T] additive, float32
    seq = w.op("Gather", [w.op("Shape", ["input_ids"]), "one_i"])
    total = w.op("Gather", [w.op("Shape", ["attention_mask"]), "one_i"])
    past = w.op("Sub", [total, seq])
    rows = w.op("Add", [w.op("Range", ["zero_i", seq, "one_i"]), past])
    cols = w.op("Range", ["zero_i", total, "one_i"])
    causal = w.op("LessOrEqual", [w.op("Unsqueeze", [cols, "ax01"]),
                                  w.op("Unsqueeze", [rows, "ax1"])])  # [S, T]
    keep = w.op("Cast", [w.op("Unsqueeze", ["attention_mask", "ax1"])], to=TensorProto.BOOL)
    keep = w.op("And", [w.op("Unsqueeze", [keep, "ax1"]), causal])  # [B, 1, S, T]
    mask = w.op("Where", [keep, "zero_f", "neg_f"])
    cos = w.op("Unsqueeze", [w.op("Gather", ["cos_table", "position_ids"]), "ax1"])
    sin = w.op("Unsqueeze", [w.op("Gather", ["sin_table", "position_ids"]), "ax1"])

    x = w.op("Gather", [w.weight("embed", (VOCAB, HIDDEN)), "input_ids"])
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = []
    for i in range(layers):
        n = _rms(w, x, w.weight(f"l{i}.attn_norm", (HIDDEN,), 0.1, 1.0))
        q = _rotate(w, _heads(w, w.op("MatMul", [n, w.weight(f"l{i}.q", (HIDDEN, HIDDEN))])),
                    cos, sin)
        k = _rotate(w, _heads(w, w.op("MatMul", [n, w.weight(f"l{i}.k", (HIDDEN, HIDDEN))])),
                    cos, sin)
        v = _heads(w, w.op("MatMul", [n, w.weight(f"l{i}.v", (HIDDEN, HIDDEN))]))
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        for name in (pk, pv):
            inputs.append(helper.make_tensor_value_info(name, F16,
                                                        ["batch", HEADS, "past", head]))
        k = w.op("Concat", [pk, k], axis=2, name=f"present.{i}.key")
        v = w.op("Concat", [pv, v], axis=2, name=f"present.{i}.value")
        for name in (k, v):
            outputs.append(helper.make_tensor_value_info(name, F16,
                                                         ["batch", HEADS, "total", head]))
        scores = w.op("Mul", [w.op("MatMul", [q, w.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              "scale"])
        scores = w.op("Add", [w.op("Cast", [scores], to=TensorProto.FLOAT), mask])
        probs = w.op("Cast", [w.op("Softmax", [scores], axis=-1)], to=F16)
        ctx = w.op("Transpose", [w.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = w.op("Reshape", [ctx, "merge_shape"])
        x = w.op("Add", [x, w.op("MatMul", [ctx, w.weight(f"l{i}.o", (HIDDEN, HIDDEN))])])
        n = _rms(w, x, w.weight(f"l{i}.mlp_norm", (HIDDEN,), 0.1, 1.0))
        g = w.op("MatMul", [n, w.weight(f"l{i}.gate", (HIDDEN, MLP))])
        u = w.op("MatMul", [n, w.weight(f"l{i}.up", (HIDDEN, MLP))])
        a = w.op("Mul", [w.op("Mul", [g, w.op("Sigmoid", [g])]), u])
        x = w.op("Add", [x, w.op("MatMul", [a, w.weight(f"l{i}.down", (MLP, HIDDEN))])])
    n = _rms(w, x, w.weight("final_norm", (HIDDEN,), 0.1, 1.0))
    w.op("MatMul", [n, w.weight("lm_head", (HIDDEN, VOCAB))], name="logits")
    outputs.insert(0, helper.make_tensor_value_info("logits", F16, ["batch", "seq", VOCAB]))
    w.fd.close()
    graph = helper.make_graph(w.nodes, "llama_f16", inputs, outputs, w.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path, w.weight_bytes


PEAK = """
import json, resource, subprocess, sys
limit = float(sys.argv[1])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (int(limit * 2**30),) * 2)
rc = subprocess.call(sys.argv[2:], stdout=sys.stderr)
print(json.dumps({"rc": rc, "peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _child(cmd: list[str], log: Path, limit_gb: float = 0.0) -> dict:
    """Run `cmd` in a fresh wrapper process: its exit code, wall time and peak RSS alone."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run([sys.executable, "-c", PEAK, str(limit_gb), *cmd],
                              stdout=subprocess.PIPE, stderr=f, text=True)
    seconds = time.perf_counter() - t0
    result = json.loads(done.stdout.strip().splitlines()[-1])
    tail = log.read_text(errors="replace").strip().splitlines()[-2:]
    return {"rc": result["rc"], "seconds": seconds, "peak_rss_bytes": result["peak"] * 1024,
            "tail": tail}


ORT_SCRIPT = """
import sys, onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
q = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), block_size=32)
q.process()
q.model.save_model_to_file(sys.argv[2], use_external_data_format=True)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--gb", type=float, default=8.0, help="float16 weight GB to build")
    p.add_argument("--skip-ort", action="store_true")
    p.add_argument("--no-speed-check", action="store_true", help="infercc --no-speed-check")
    p.add_argument("--ort-limit-gb", type=float, default=22.0)
    p.add_argument("--keep", action="store_true", help="keep WORKDIR")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    per_layer = 2 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * MLP)
    layers = max(1, round((a.gb * 1e9 - 2 * 2 * VOCAB * HIDDEN) / per_layer))
    a.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, weight_bytes = build(a.workdir / "fp16", layers)
    figures = {"host": host_line(), "layers": layers, "weight_bytes": weight_bytes,
               "build_seconds": time.perf_counter() - t0}
    print(f"built {model}: {layers} layers, {weight_bytes / 1e9:.2f} GB of float16 weights",
          flush=True)
    out = a.workdir / "infercc_int4"
    cmd = [sys.executable, "-m", "infercc", "calibrate", str(model), "--int4", "--method", "rtn",
           "-o", str(out)] + (["--no-speed-check"] if a.no_speed_check else [])
    figures["infercc"] = _child(cmd, a.workdir / "infercc.log")
    print("infercc:", json.dumps(figures["infercc"]), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    if not a.skip_ort:
        dest = a.workdir / "ort" / "model_int4.onnx"
        dest.parent.mkdir(exist_ok=True)
        figures["onnxruntime"] = _child(
            [sys.executable, "-c", ORT_SCRIPT, str(model), str(dest)], a.workdir / "ort.log",
            a.ort_limit_gb,
        )
        print("onnxruntime:", json.dumps(figures["onnxruntime"]), flush=True)
        shutil.rmtree(dest.parent, ignore_errors=True)
    if not a.keep:
        shutil.rmtree(a.workdir / "fp16", ignore_errors=True)
    if a.json:
        print(json.dumps(figures))
    for name in ("infercc", "onnxruntime"):
        if name in figures:
            f = figures[name]
            print(f"{name}: exit {f['rc']}, {f['seconds']:.0f} s, peak RSS "
                  f"{f['peak_rss_bytes'] / 1e9:.2f} GB = "
                  f"{f['peak_rss_bytes'] / weight_bytes:.2f}x the float16 weights")
    print(figures["host"])


if __name__ == "__main__":
    main()
