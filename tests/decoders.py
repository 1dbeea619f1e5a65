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
    kv_heads: int | None = None,
    rotary: bool | str = False,
    causal: bool = True,
    opset: int = 21,
    dynamo_kt: bool = False,
    guard: bool = False,
    empty_tail: bool = False,
    rows: bool | str = False,
    mask_value: float = -1e9,
) -> onnx.ModelProto:
    """`attention="bias"` writes the scores as torch's export does: Div(Q K^T, sqrt(d)) plus an
    additive causal bias; `"where"` (default) masks them with Where; `"sdpa"` is the bias form
    with the scale split as torch.onnx writes scaled_dot_product_attention (Mul(Q, c) and
    Mul(K^T, c), c = d ** -0.25). `norm="rms"` writes every LayerNormalization as an RMSNorm
    the way TorchScript exports Llama's (`x * rsqrt(mean(x ** 2) + eps) * w`: Pow,
    ReduceMean, Add, Sqrt, Div(1, .), Mul, Mul). `kv_heads` (fewer than `heads`): grouped-query
    attention, the cache holding `kv_heads` heads, each repeated heads / kv_heads times in a row
    (Unsqueeze, Tile, Reshape: torch's repeat_interleave). `rotary`: Q and K rotated after the
    head split by com.microsoft.RotaryEmbedding (what fuse-rotary-embedding leaves), from
    position_ids and cos/sin tables of `positions` rows; `rotary="standard"`: by the standard
    opset-23 RotaryEmbedding (pass `opset=23`), its caches the tables' rows gathered by
    position_ids. `dynamo_kt`: K^T written as the dynamo exporter writes it,
    Reshape(Transpose(Reshape(K, [B H, T, D]), [0, 2, 1]), [B, H, D, T]). `causal=False`
    writes the bias' causal term the wrong way round (keys at or after the query's position
    kept). `guard`: the Softmax's NaN guard `Where(IsNaN(P), 0, P)` of torch's SDPA export.
    `empty_tail` (with `rotary`): each rotated head concatenated with its empty remainder,
    `Concat(RotaryEmbedding(x), x[..., D:])`, as transformers' Phi-3 writes its rotation at a
    partial_rotary_factor of 1.0. `rows`: the attention output projected as GPT-2's Conv1D
    does it, the merged heads viewed as rows [-1, hidden], Gemm, and viewed back as
    [B, S, hidden] (the dynamo export); `rows="both"`: the merged heads also reshaped to
    [B, S, hidden], whose Shape gives the view back (the TorchScript export). `mask_value`:
    what a masked score becomes (-1e9; torch's masks use float32's lowest, its SDPA -inf)."""
    b = _Builder(seed)
    d = hidden // heads
    kv = kv_heads or heads
    h = b.op(
        "Add",
        [
            b.op("Gather", [b.w("wte", (vocab, hidden), 0.5), "input_ids"]),
            b.op("Gather", [b.w("wpe", (positions, hidden), 0.1), "position_ids"]),
        ],
    )
    shape_bshd = b.const("shape_bshd", np.array([0, 0, heads, d], np.int64))
    if kv != heads:
        shape_kv = b.const("shape_kv", np.array([0, 0, kv, d], np.int64))
        repeat = b.const("repeat", np.array([1, 1, heads // kv, 1, 1], np.int64))
        shape_rep = b.const("shape_rep", np.array([0, heads, -1, d], np.int64))
    if attention == "sdpa":
        quarter = b.const("quarter", np.array(d**-0.25, np.float32))
    if rotary:
        angles = np.arange(positions)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
        b.const("cos_cache", np.cos(angles).astype(np.float32))
        b.const("sin_cache", np.sin(angles).astype(np.float32))
        if rotary == "standard":  # [batch, seq, D / 2] rows, no position ids
            rows = [b.op("Gather", [t, "position_ids"]) for t in ("cos_cache", "sin_cache")]
    shape_bsc = b.const("shape_bsc", np.array([0, 0, hidden], np.int64))
    scale = b.const("scale", np.array(1.0 / np.sqrt(d), np.float32))
    neg = b.const("neg", np.array(mask_value, np.float32))
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
        for part, n in zip("qkv", (heads, kv, kv), strict=True):
            y = b.op(
                "Add",
                [
                    b.op("MatMul", [x, b.w(f"w{part}{i}", (hidden, n * d))]),
                    b.w(f"b{part}{i}", n * d, 0.05),
                ],
            )
            split = shape_kv if n != heads else shape_bshd
            y = b.op("Transpose", [b.op("Reshape", [y, split])], perm=[0, 2, 1, 3])
            if rotary == "standard" and part != "v":
                y = b.op("RotaryEmbedding", [y, *rows])
            elif rotary and part != "v":
                split_heads = y
                y = b.op(
                    "RotaryEmbedding",
                    [split_heads, "position_ids", "cos_cache", "sin_cache"],
                    domain="com.microsoft",
                )
                if empty_tail:  # Concat(rotated, x[..., D:]): nothing is appended
                    ends = b.const(f"end_{i}{part}", np.array([2**63 - 1], np.int64))
                    starts = b.const(f"start_{i}{part}", np.array([d], np.int64))
                    last = b.const(f"last_{i}{part}", np.array([-1], np.int64))
                    tail = b.op("Slice", [split_heads, starts, ends, last])
                    y = b.op("Concat", [y, tail], axis=-1)
            qkv.append(y)
        q, k, v = qkv
        k_all = b.named("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        v_all = b.named("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        if kv != heads:
            k_all, v_all = (
                b.op(
                    "Reshape",
                    [
                        b.op("Tile", [b.op("Unsqueeze", [t, b.const(f"a2_{i}{t}", [2])]), repeat]),
                        shape_rep,
                    ],
                )
                for t in (k_all, v_all)
            )
        if dynamo_kt:  # Reshape(Transpose(Reshape(K, [B H, T, D]), [0, 2, 1]), [B, H, D, T])
            dims = b.op("Shape", [k_all])
            part = {
                (lo, hi): b.op(
                    "Slice",
                    [dims, b.const(f"s{lo}{hi}_{i}", [lo]), b.const(f"e{lo}{hi}_{i}", [hi])],
                )
                for lo, hi in ((0, 2), (2, 4), (2, 3))
            }
            flat = b.op("Concat", [b.const(f"m1_{i}", [-1]), part[2, 4]], axis=0)
            back = b.op("Concat", [part[0, 2], b.const(f"d_{i}", [d]), part[2, 3]], axis=0)
            k_t = b.op(
                "Reshape",
                [b.op("Transpose", [b.op("Reshape", [k_all, flat])], perm=[0, 2, 1]), back],
            )
        else:
            k_t = b.op("Transpose", [k_all], perm=[0, 1, 3, 2])
        if attention == "sdpa":
            qk = b.op("MatMul", [b.op("Mul", [q, quarter]), b.op("Mul", [k_t, quarter])])
        else:
            qk = b.op("MatMul", [q, k_t])
        if attention == "where":
            scores = b.op("Mul", [qk, scale])
        else:
            scores = qk if attention == "sdpa" else b.op("Div", [qk, sqrt_d])
        total = b.op("Shape", ["attention_mask"], start=1, end=2)
        new = b.op("Shape", ["input_ids"], start=1, end=2)
        t = b.op("Squeeze", [total])
        qpos = b.op("Range", [b.op("Sub", [t, b.op("Squeeze", [new])]), t, one])
        kpos = b.op("Range", [zero, t, one])
        keys = b.op("Unsqueeze", [kpos, b.const(f"a0_{i}", [0])])
        queries = b.op("Unsqueeze", [qpos, b.const(f"a1_{i}", [1])])
        # causal: key index <= query position; else the comparison the wrong way round
        term = b.op("LessOrEqual", [keys, queries] if causal else [queries, keys])
        allowed = b.op("And", [term, mask])
        if attention == "where":
            masked = b.op("Where", [allowed, scores, neg])
        else:
            masked = b.op("Add", [scores, b.op("Where", [allowed, zero_f, neg])])
        probs = b.op("Softmax", [masked], axis=-1)
        if guard:
            probs = b.op("Where", [b.op("IsNaN", [probs]), zero_f, probs])
        merged = b.op("Transpose", [b.op("MatMul", [probs, v_all])], perm=[0, 2, 1, 3])
        if rows:  # GPT-2's Conv1D: x.view(-1, hidden) @ w + b, viewed back
            flat = b.op("Reshape", [merged, b.const(f"rows{i}", np.array([-1, hidden]))])
            wo, bo = b.w(f"wo{i}", (hidden, hidden)), b.w(f"bo{i}", hidden, 0.05)
            proj = b.op("Gemm", [flat, wo, bo])
            source = b.op("Reshape", [merged, shape_bsc]) if rows == "both" else h
            lead = b.op("Shape", [source], start=0, end=2)
            back = b.op("Concat", [lead, b.const(f"width{i}", np.array([hidden]))], axis=0)
            out = b.op("Reshape", [proj, back])
        else:
            ctx = b.op("Reshape", [merged, shape_bsc])
            out = b.op(
                "Add",
                [
                    b.op("MatMul", [ctx, b.w(f"wo{i}", (hidden, hidden))]),
                    b.w(f"bo{i}", hidden, 0.05),
                ],
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
        for name in ("key", "value"):
            inputs.append(
                oh.make_tensor_value_info(
                    f"past_key_values.{i}.{name}", f, ["batch", kv, "past", d]
                )
            )
            outputs.append(
                oh.make_tensor_value_info(f"present.{i}.{name}", f, ["batch", kv, "total", d])
            )
    graph = oh.make_graph(b.nodes, "tiny_decoder", inputs, outputs, b.inits)
    contrib = rotary and rotary != "standard"
    opsets = [oh.make_opsetid("", opset)] + (
        [oh.make_opsetid("com.microsoft", 1)] if contrib else []
    )
    model = make_model(graph, opset_imports=opsets)
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


# (batch, past, new, right padding of the last row): a prefill, a decode step, a chunk after a
# past at batch 3, a right-padded prefill and a decode step after a right-padded prompt
DECODER_SHAPES = [(1, 0, 7, 0), (2, 9, 1, 0), (3, 5, 4, 0), (2, 0, 6, 2), (2, 6, 1, 3)]


def cache_feeds(
    proto: onnx.ModelProto, batch: int, past: int, new: int, pad: int = 0, seed: int = 0
) -> dict[str, np.ndarray]:
    """Inputs of a KV-cache decoder (input_ids, attention_mask, position_ids if it takes them,
    past_key_values.N.key/value [batch, kv_heads, past, head_size]): the last row's final
    `pad` positions masked out (right padding), positions counted from the past."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + new), np.int64)
    if pad:
        mask[-1, past + new - pad :] = 0
    feeds: dict[str, np.ndarray] = {"attention_mask": mask}
    for vi in proto.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "input_ids":
            feeds[vi.name] = rng.integers(0, _vocab(proto), (batch, new)).astype(np.int64)
        elif vi.name == "position_ids":
            feeds[vi.name] = np.tile(np.arange(past, past + new), (batch, 1)).astype(np.int64)
        elif vi.name.startswith("past_key_values"):
            shape = (batch, dims[1], past, dims[3])
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _vocab(proto: onnx.ModelProto) -> int:
    logits = next(o for o in proto.graph.output if o.name == "logits")
    return logits.type.tensor_type.shape.dim[-1].dim_value or 2
