"""A tiny GPT-like decoder with a KV cache, built with onnx.helper (random weights).

Inputs: input_ids [batch, seq] int64, attention_mask [batch, past + seq] int64, position_ids
[batch, seq] int64 and past_key_values.N.key / .value [batch, heads, past, head_size]; outputs:
logits [batch, seq, vocab] and present.N.key / .value [batch, heads, past + seq, head_size].
Pre-LayerNorm blocks: causal self-attention over past + new keys, a ReLU MLP.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from tests.helpers import make_model


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def w(self, name: str, shape, std: float = 0.2, mean: float = 0.0) -> str:
        array = (mean + std * self.rng.standard_normal(shape)).astype(np.float32)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def const(self, name: str, array) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        self.count += 1
        outs = [f"{op_type.lower()}_{self.count}_{i}" for i in range(n_out)]
        self.nodes.append(
            oh.make_node(op_type, list(inputs), outs, name=f"{op_type}_{self.count}", **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def named(self, op_type: str, inputs, output: str, **attrs) -> str:
        self.count += 1
        self.nodes.append(
            oh.make_node(op_type, list(inputs), [output], name=f"{op_type}_{self.count}", **attrs)
        )
        return output


def tiny_decoder(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    vocab: int = 50,
    seed: int = 0,
    positions: int = 256,
    attention: str = "where",
    norm: str = "layer",
) -> onnx.ModelProto:
    """`attention="bias"` writes the scores as torch's export does: Div(Q K^T, sqrt(d)) plus an
    additive causal bias; `"where"` (default) masks them with Where. `norm="rms"` writes
    every LayerNormalization as an RMSNorm the way TorchScript exports Llama's
    (`x * rsqrt(mean(x ** 2) + eps) * w`: Pow, ReduceMean, Add, Sqrt, Div(1, .), Mul, Mul)."""
    b = _Builder(seed)
    d = hidden // heads
    h = b.op(
        "Add",
        [
            b.op("Gather", [b.w("wte", (vocab, hidden), 0.5), "input_ids"]),
            b.op("Gather", [b.w("wpe", (positions, hidden), 0.1), "position_ids"]),
        ],
    )
    shape_bshd = b.const("shape_bshd", np.array([0, 0, heads, d], np.int64))
    shape_bsc = b.const("shape_bsc", np.array([0, 0, hidden], np.int64))
    scale = b.const("scale", np.array(1.0 / np.sqrt(d), np.float32))
    neg = b.const("neg", np.array(-1e9, np.float32))
    zero_f = b.const("zero_f", np.array(0.0, np.float32))
    sqrt_d = b.const("sqrt_d", np.array(np.sqrt(d), np.float32))
    zero = b.const("zero", np.array(0, np.int64))
    one = b.const("one", np.array(1, np.int64))
    mask = b.op(
        "Cast",
        [b.op("Unsqueeze", ["attention_mask", b.const("ax12", np.array([1, 2]))])],
        to=TensorProto.BOOL,
    )
    for i in range(layers):
        x = _norm(b, norm, h, b.w(f"ln1_g{i}", hidden, 0.1, 1.0), b.w(f"ln1_b{i}", hidden, 0.05))
        qkv = []
        for part in "qkv":
            y = b.op(
                "Add",
                [
                    b.op("MatMul", [x, b.w(f"w{part}{i}", (hidden, hidden))]),
                    b.w(f"b{part}{i}", hidden, 0.05),
                ],
            )
            qkv.append(b.op("Transpose", [b.op("Reshape", [y, shape_bshd])], perm=[0, 2, 1, 3]))
        q, k, v = qkv
        k_all = b.named("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        v_all = b.named("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        qk = b.op("MatMul", [q, b.op("Transpose", [k_all], perm=[0, 1, 3, 2])])
        scores = b.op("Mul", [qk, scale]) if attention == "where" else b.op("Div", [qk, sqrt_d])
        total = b.op("Shape", ["attention_mask"], start=1, end=2)
        new = b.op("Shape", [q], start=2, end=3)
        t = b.op("Squeeze", [total])
        qpos = b.op("Range", [b.op("Sub", [t, b.op("Squeeze", [new])]), t, one])
        kpos = b.op("Range", [zero, t, one])
        causal = b.op(
            "LessOrEqual",
            [
                b.op("Unsqueeze", [kpos, b.const(f"a0_{i}", [0])]),
                b.op("Unsqueeze", [qpos, b.const(f"a1_{i}", [1])]),
            ],
        )
        allowed = b.op("And", [causal, mask])
        if attention == "where":
            masked = b.op("Where", [allowed, scores, neg])
        else:
            masked = b.op("Add", [scores, b.op("Where", [allowed, zero_f, neg])])
        probs = b.op("Softmax", [masked], axis=-1)
        ctx = b.op(
            "Reshape",
            [b.op("Transpose", [b.op("MatMul", [probs, v_all])], perm=[0, 2, 1, 3]), shape_bsc],
        )
        out = b.op(
            "Add",
            [b.op("MatMul", [ctx, b.w(f"wo{i}", (hidden, hidden))]), b.w(f"bo{i}", hidden, 0.05)],
        )
        h = b.op("Add", [h, out])
        x = _norm(b, norm, h, b.w(f"ln2_g{i}", hidden, 0.1, 1.0), b.w(f"ln2_b{i}", hidden, 0.05))
        up = b.op(
            "Relu",
            [
                b.op(
                    "Add",
                    [
                        b.op("MatMul", [x, b.w(f"w1{i}", (hidden, 4 * hidden))]),
                        b.w(f"b1{i}", 4 * hidden, 0.05),
                    ],
                )
            ],
        )
        down = b.op(
            "Add",
            [
                b.op("MatMul", [up, b.w(f"w2{i}", (4 * hidden, hidden), 0.1)]),
                b.w(f"b2{i}", hidden, 0.05),
            ],
        )
        h = b.op("Add", [h, down])
    x = _norm(b, norm, h, b.w("lnf_g", hidden, 0.1, 1.0), b.w("lnf_b", hidden, 0.05))
    b.named("MatMul", [x, b.w("lm_head", (hidden, vocab), 0.3)], "logits")
    f = TensorProto.FLOAT
    inputs = [
        oh.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        oh.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        oh.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = [oh.make_tensor_value_info("logits", f, ["batch", "seq", vocab])]
    for i in range(layers):
        for kv in ("key", "value"):
            inputs.append(
                oh.make_tensor_value_info(
                    f"past_key_values.{i}.{kv}", f, ["batch", heads, "past", d]
                )
            )
            outputs.append(
                oh.make_tensor_value_info(f"present.{i}.{kv}", f, ["batch", heads, "total", d])
            )
    graph = oh.make_graph(b.nodes, "tiny_decoder", inputs, outputs, b.inits)
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def _norm(b: _Builder, kind: str, x: str, gain: str, bias: str) -> str:
    if kind == "layer":
        return b.op("LayerNormalization", [x, gain, bias], axis=-1)
    two = b.const(f"two_{b.count}", np.array(2.0, np.float32))
    eps = b.const(f"eps_{b.count}", np.array(1e-6, np.float32))
    one = b.const(f"one_{b.count}", np.array(1.0, np.float32))
    axes = b.const(f"axes_{b.count}", np.array([-1], np.int64))
    mean = b.op("ReduceMean", [b.op("Pow", [x, two]), axes], keepdims=1)
    inv = b.op("Div", [one, b.op("Sqrt", [b.op("Add", [mean, eps])])])
    return b.op("Mul", [b.op("Mul", [x, inv]), gain])


def greedy_reference(path, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """A plain greedy loop with onnxruntime (numpy feeds, presents copied back as pasts)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    batch, length = prompt.shape
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    feeds = {
        "input_ids": prompt,
        "attention_mask": np.ones((batch, length), np.int64),
        "position_ids": np.tile(np.arange(length), (batch, 1)),
    }
    for p in pasts:
        feeds[p.name] = np.zeros((batch, p.shape[1], 0, p.shape[3]), np.float32)
    tokens = []
    total = length
    for _ in range(new_tokens):
        outs = dict(zip(names, sess.run(names, feeds), strict=True))
        nxt = outs["logits"][:, -1].argmax(-1)[:, None]
        tokens.append(nxt)
        feeds = {
            "input_ids": nxt,
            "attention_mask": np.ones((batch, total + 1), np.int64),
            "position_ids": np.full((batch, 1), total, np.int64),
        }
        for p in pasts:
            feeds[p.name] = outs[p.name.replace("past_key_values", "present")]
        total += 1
    return np.concatenate(tokens, axis=1)
