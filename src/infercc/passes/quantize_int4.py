"""Weight-only int4: block quantization of MatMul/Gemm weights (and embedding tables), and the
two graph forms that carry it.

**The numbers.** A weight W [K, N] (y = x @ W) is cut along K, the reduction axis, into blocks
of `block_size` rows (a power of two >= 16; the last block is padded when K is not a multiple).
Each (block, output column) pair gets a float32 scale and a 4-bit zero point, and each weight a
4-bit code q in [0, 15]: w ~= (q - zero_point) * scale.

- asymmetric: the block's range [min(lo, 0), max(hi, 0)] in 15 steps, zero point
  round(-min / scale) (0.0 is exact, so a zero point always fits in 4 bits);
- symmetric: zero point 8 and scale = m / -8 where m is the block's value of largest
  magnitude: m lands exactly on code 0 (-8 steps) and the 16 codes cover [-8, 7] steps,
  the same convention onnxruntime's quantizer uses. The form TensorRT takes (no zero point).

`quantize_rtn` rounds to nearest (RTN); `infercc.calib.awq` and `infercc.calib.gptq` choose
scales or codes better from calibration data and hand back the same `Blocks`.

**The forms.**

- `nbits` (the cpu target / the ORT backend): the MatMul becomes onnxruntime's
  `com.microsoft.MatMulNBits` (attributes K, N, bits=4, block_size, accuracy_level). B is
  uint8 [N, n_blocks, block_size / 2], two codes a byte along K, the first in the low nibble;
  scales [N, n_blocks]; zero points packed the same way, uint8 [N, ceil(n_blocks / 2)], and left
  out when symmetric (the op's default is 8). A Gemm (alpha 1, beta 1, transA 0) becomes one
  too, its C the op's bias. With `embeddings=True` an embedding table [V, D] read by a Gather
  on axis 0 becomes a `com.microsoft.GatherBlockQuantized` (bits 4, quantize_axis 1): data
  uint8 [V, D / 2] packed along D, scales [V, ceil(D / block_size)], zero points as above. By
  default the tables stay float, as onnxruntime's quantizer and onnxruntime-genai keep them:
  an int4 table puts its rounding error straight into the residual stream of every token, and
  on infercc's test decoders (three configurations, three seeds) the token table in int4
  cost 1.4 to 12.1 points of next-token top-1 agreement, 6.8 on average, for a table 0.16x
  the size. Each table kept float is listed, with the bytes int4 would save.
- `dq` (`--portable`, TensorRT targets): standard ONNX. The weight becomes an INT4
  (symmetric, codes - 8) or UINT4 (asymmetric, with a UINT4 zero point) initializer of W's own
  shape read by a blocked `DequantizeLinear` (opset 21: `axis` the K axis, `block_size`, scale
  [ceil(K / block_size), N]) feeding the unchanged MatMul or Gemm. onnxruntime fuses the pair
  into MatMulNBits itself when it optimizes the graph; TensorRT reads it as a weight-only int4
  layer. Embedding tables stay float in this form: standard ONNX has no block-quantized Gather
  (a DequantizeLinear before the Gather would dequantize the whole table on every run).

**The rewrite** is two rules (`infercc.passes.rules`), the MatMul/Gemm weights first (a tied
table reads its LM head's int4 copy), then the embedding Gathers. A node kept float is a
`NoMatch(reason, at=...)` of its rule's check: listed in `Int4Report.kept_float` and, as every
pass's refusals, by `--explain` (at the input where the weight failed: a weight that is no
constant, of rank 3, ...); one rewrite is one node quantized (the limit bisection sets).

Both forms compute exactly x @ dequantize(codes) (checked against a numpy reference under
onnxruntime in the tests, every block size, both modes, K not a multiple of the block).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from infercc.errors import InferccError
from infercc.ir import Graph, Model, Node, Tensor, Value
from infercc.passes.manager import (
    PassContext,
    PassOption,
    PassResult,
    register_option,
    register_pass,
    run_passes,
)
from infercc.passes.match import bias_add
from infercc.passes.match import const_value as const_array
from infercc.passes.rules import NoMatch, Rule, RuleRun, apply_rules

logger = logging.getLogger(__name__)

BITS = 4
LEVELS = 15  # codes 0..15
SYMMETRIC_ZERO = 8
DEFAULT_BLOCK_SIZE = 32
MIN_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 256
MS_DOMAIN = "com.microsoft"
DQ_BLOCK_OPSET = 21
FORMS = ("nbits", "dq")
ACCURACY_LEVELS = (0, 1, 2, 3, 4)  # unset, fp32, fp16, bf16, int8 (MatMulNBits' own numbering)
_TINY = float(np.finfo(np.float32).tiny)
_TINY_F16 = float(np.finfo(np.float16).smallest_subnormal)


def check_block_size(block_size: int) -> int:
    """A power of two in [16, 256]: the kernels' and the packing's requirement."""
    b = int(block_size)
    if b < MIN_BLOCK_SIZE or b > MAX_BLOCK_SIZE or b & (b - 1):
        raise InferccError(
            f"block size {block_size} is not a power of two between {MIN_BLOCK_SIZE} and "
            f"{MAX_BLOCK_SIZE}",
            "use --block-size 32, 64 or 128 (two 4-bit codes a byte; MatMulNBits needs a "
            "power of two >= 16)",
        )
    return b


# --------------------------------------------------------------------------- the numbers


@dataclass
class Blocks:
    """A weight W [K, N] quantized in blocks along K (module docstring)."""

    codes: np.ndarray  # uint8 [N, n_blocks, block_size], 0..15; the K padding holds the zero point
    scales: np.ndarray  # float32 [N, n_blocks]
    zero_points: np.ndarray  # uint8 [N, n_blocks] (all 8 when symmetric)
    k: int
    block_size: int
    symmetric: bool

    @property
    def n(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_blocks(self) -> int:
        return int(self.codes.shape[1])

    def dequantize(self) -> np.ndarray:
        """(codes - zero point) * scale as float32 [K, N], what both forms compute with."""
        q = self.codes.astype(np.float32) - self.zero_points[..., None].astype(np.float32)
        w = q * self.scales[..., None]
        return np.ascontiguousarray(w.reshape(self.n, -1)[:, : self.k].T)


def n_blocks(k: int, block_size: int) -> int:
    return -(-int(k) // int(block_size))


def block_view(w: np.ndarray, block_size: int) -> np.ndarray:
    """W [K, N] as float64 blocks [N, n_blocks, block_size], the K padding zeros."""
    k, n = w.shape
    nb = n_blocks(k, block_size)
    padded = np.zeros((nb * block_size, n), np.float64)
    padded[:k] = w
    return padded.T.reshape(n, nb, block_size)


def block_params(
    blocks: np.ndarray, symmetric: bool, clip: np.ndarray | float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(scales float32 [N, nb], zero points uint8 [N, nb]) of blocks [N, nb, bs]; `clip` (per
    block, or one ratio) shrinks each range (1.0: min-max)."""
    clip = np.asarray(clip, np.float64)
    if symmetric:  # the value of largest magnitude, the first such (argmax of |x|)
        hi, lo = blocks.max(axis=-1), blocks.min(axis=-1)
        peak = np.where(-lo > hi, lo, hi)
        tie = np.nonzero(-lo == hi)  # x and -x both there: the one that comes first
        if tie[0].size:
            b = blocks[tie]
            first_lo = (b == lo[tie][:, None]).argmax(-1) < (b == hi[tie][:, None]).argmax(-1)
            peak[tie] = np.where(first_lo, lo[tie], hi[tie])
        peak = peak.astype(np.float64) * clip
        scales = peak / -float(SYMMETRIC_ZERO)
        scales = np.where(np.abs(scales) < _TINY, 1.0, scales)  # an all-zero block
        zero = np.full(scales.shape, SYMMETRIC_ZERO, np.uint8)
        return scales.astype(np.float32), zero
    lo = np.minimum(blocks.min(axis=-1).astype(np.float64), 0.0) * clip
    hi = np.maximum(blocks.max(axis=-1).astype(np.float64), 0.0) * clip
    scales = (hi - lo) / LEVELS
    scales = np.where(scales < _TINY, 1.0, scales)
    zero = np.clip(np.rint(-lo / scales), 0, LEVELS).astype(np.uint8)
    return scales.astype(np.float32), zero


def round_codes(blocks: np.ndarray, scales: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """Nearest codes of blocks [N, nb, bs] under (scales, zero points), clipped to 0..15, in
    the blocks' float type, in place of one temporary."""
    q = blocks / scales[..., None].astype(blocks.dtype)
    np.rint(q, out=q)
    q += zero[..., None]
    np.clip(q, 0, LEVELS, out=q)
    return q.astype(np.uint8)


# Bytes of float64 working arrays one slice of output columns may take: `quantize_rtn` works
# through a weight this many bytes at a time, so its temporaries (the float64 blocks, their
# quotients) stay a few of these whatever the weight's size, instead of ~30 bytes a weight
# (3.3 GB for a 32000 x 3072 LM head). Columns are independent, so the result is the same.
RTN_CHUNK_BYTES = 32 * 2**20


def quantize_rtn(
    w: np.ndarray, block_size: int, symmetric: bool, clip: np.ndarray | float = 1.0
) -> Blocks:
    """Round-to-nearest int4 of W [K, N] (module docstring), `RTN_CHUNK_BYTES` of columns at a
    time, the slices on a thread each (numpy releases the GIL in these loops), in float32
    (exact for float16 and float32 weights; the scales' arithmetic in float64)."""
    w = _check_weight(w)
    k, n = w.shape
    nb = n_blocks(k, block_size)
    clip_a = np.asarray(clip, np.float64)
    per_column = clip_a.ndim >= 1 and clip_a.shape[0] == n and n > 1
    codes = np.empty((n, nb, block_size), np.uint8)
    scales = np.empty((n, nb), np.float32)
    zero = np.empty((n, nb), np.uint8)
    step = max(1, RTN_CHUNK_BYTES // (4 * nb * block_size))

    def columns(j: int) -> None:
        cols = slice(j, min(j + step, n))
        blocks = _blocks32(w[:, cols], block_size)
        part_clip = clip_a[cols] if per_column else clip_a
        s, z = block_params(blocks, symmetric, part_clip)
        if w.dtype == np.float16:  # the scales are stored as float16: round to those first
            half = s.astype(np.float16).astype(np.float32)  # (symmetric scales are signed)
            s = np.where(half == 0, np.copysign(_TINY_F16, s), half).astype(np.float32)
        codes[cols] = round_codes(blocks, s, z)
        scales[cols], zero[cols] = s, z

    starts = range(0, n, step)
    if len(starts) > 1 and RTN_THREADS > 1:
        with ThreadPoolExecutor(min(RTN_THREADS, len(starts))) as pool:
            list(pool.map(columns, starts))
    else:
        for j in starts:
            columns(j)
    _pad_with_zero_point(codes, zero, k)
    return Blocks(codes, scales, zero, int(k), int(block_size), symmetric)


RTN_THREADS = os.cpu_count() or 1  # quantize_rtn's threads, one slice of columns each


def _blocks32(w: np.ndarray, block_size: int) -> np.ndarray:
    """W [K, N] as float32 blocks [N, n_blocks, block_size] (`block_view`'s layout), the K
    padding zeros: one transposing copy."""
    k, n = w.shape
    nb = n_blocks(k, block_size)
    out = np.zeros((n, nb * block_size), np.float32)
    out[:, :k] = w.T
    return out.reshape(n, nb, block_size)


def all_finite(w: np.ndarray) -> bool:
    """No NaN or infinity in `w`, checked `RTN_CHUNK_BYTES` at a time (no whole-weight mask)."""
    flat = np.asarray(w).reshape(-1) if np.asarray(w).flags.c_contiguous else None
    if flat is None:
        return bool(np.isfinite(w).all())
    step = max(1, RTN_CHUNK_BYTES // max(1, flat.itemsize))
    return all(bool(np.isfinite(flat[i : i + step]).all()) for i in range(0, flat.size, step))


def _check_weight(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype.kind != "f":
        raise InferccError(f"cannot int4-quantize a {w.dtype} weight of rank {w.ndim}", None)
    if not all_finite(w):
        raise InferccError("the weight holds NaN or infinity", "keep that node in float")
    return w


def _pad_with_zero_point(codes: np.ndarray, zero: np.ndarray, k: int) -> None:
    """The padded rows of the last block dequantize to exactly 0."""
    flat = codes.reshape(codes.shape[0], -1)
    if flat.shape[1] > k:
        flat[:, k:] = zero[:, -1:]


def weight_error(w: np.ndarray, blocks: Blocks) -> float:
    """Relative Frobenius error ||W - dequantize|| / ||W||."""
    w = np.asarray(w, np.float64)
    norm = float(np.linalg.norm(w))
    return float(np.linalg.norm(w - blocks.dequantize())) / norm if norm > 0 else 0.0


# --------------------------------------------------------------------------- packing


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Pairs along the last axis into bytes, the first code in the low nibble (even length)."""
    c = np.asarray(codes, np.uint8)
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.zeros((*c.shape[:-1], 1), np.uint8)], axis=-1)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """The inverse of `pack_nibbles`: `count` codes along the last axis."""
    p = np.asarray(packed, np.uint8)
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    return out[..., :count]


@dataclass
class NBitsWeight:
    """MatMulNBits' B, scales and (asymmetric) packed zero points."""

    b: np.ndarray  # uint8 [N, n_blocks, block_size / 2]
    scales: np.ndarray  # float32 [N, n_blocks]
    zero_points: np.ndarray | None  # uint8 [N, ceil(n_blocks / 2)]


def pack_matmul_nbits(blocks: Blocks) -> NBitsWeight:
    zero = None if blocks.symmetric else pack_nibbles(blocks.zero_points)
    return NBitsWeight(pack_nibbles(blocks.codes), blocks.scales.astype(np.float32), zero)


def int4_tensor(codes: np.ndarray, signed: bool, name: str = "") -> Tensor:
    """An INT4 (codes - 8) or UINT4 initializer of `codes`' shape, packed as ONNX stores it
    (row-major, two a byte, the first in the low nibble)."""
    flat: np.ndarray = np.asarray(codes, np.uint8).reshape(-1)
    if signed:
        flat = (flat.astype(np.int16) - SYMMETRIC_ZERO).astype(np.int8).view(np.uint8) & 0x0F
    raw = pack_nibbles(flat).tobytes()
    dtype = TensorProto.INT4 if signed else TensorProto.UINT4
    proto = onnx.helper.make_tensor(name, dtype, list(codes.shape), raw, raw=True)
    return Tensor.from_proto(proto)


@dataclass
class DQWeight:
    """A blocked DequantizeLinear's x, scale and zero point (None when symmetric)."""

    x: Tensor  # INT4 / UINT4, the weight's own shape
    scale: np.ndarray  # float32, the weight's shape with ceil(K / block) on the K axis
    zero_point: Tensor | None
    axis: int


def pack_blocked_dq(blocks: Blocks, transposed: bool = False) -> DQWeight:
    """For W [K, N] (axis 0), or W stored [N, K] (`transposed`, axis 1: a Gemm with transB)."""
    codes = blocks.codes.reshape(blocks.n, -1)[:, : blocks.k]  # [N, K]
    scale, zero = blocks.scales, blocks.zero_points  # [N, nb]
    if not transposed:
        codes, scale, zero = codes.T, scale.T, zero.T
    x = int4_tensor(np.ascontiguousarray(codes), blocks.symmetric)
    zp = None if blocks.symmetric else int4_tensor(np.ascontiguousarray(zero), False)
    return DQWeight(x, np.ascontiguousarray(scale, np.float32), zp, 1 if transposed else 0)


# --------------------------------------------------------------------------- the rewrite


# A method: (node name, W [K, N]) -> Blocks. RTN, or one that calibration data informs.
Method = Callable[[str, np.ndarray], Blocks]


@dataclass
class Int4Options:
    block_size: int = DEFAULT_BLOCK_SIZE
    symmetric: bool = False
    form: str = "nbits"
    accuracy_level: int = 0
    lm_head: bool = True
    embeddings: bool = False
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Int4Settings:
    """What quantize-int4 reads (its option `int4`): its `Int4Options`, the method that gives
    each weight's blocks (`(node name, W [K, N]) -> Blocks`; None: round to nearest) and AWQ's
    per-input-channel scales by node name."""

    options: Int4Options
    method: Method | None = None
    input_scales: Mapping[str, np.ndarray] = field(default_factory=dict)


INT4: PassOption[Int4Settings | None] = register_option(
    "int4", Int4Settings | None, "the options, method and input scales of int4 weight quantization"
)


@dataclass
class Int4Report:
    """What `quantize_int4` did: nodes quantized, kept float (with reasons), bytes."""

    quantized: list[str] = field(default_factory=list)
    embeddings: list[str] = field(default_factory=list)
    tied: dict[str, str] = field(default_factory=dict)  # Gather -> the LM head it shares
    kept_float: dict[str, str] = field(default_factory=dict)
    weight_bytes_before: int = 0  # float bytes of the weights that were quantized
    weight_bytes_after: int = 0  # their int4 bytes (codes, scales, zero points)
    input_scales: int = 0  # activation-aware input scalings applied (AWQ)

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantized": list(self.quantized),
            "embeddings": list(self.embeddings),
            "tied": dict(self.tied),
            "kept_float": dict(self.kept_float),
            "weight_bytes_before": self.weight_bytes_before,
            "weight_bytes_after": self.weight_bytes_after,
            "input_scales": self.input_scales,
        }


TARGET_OPS = ("MatMul", "Gemm")
# Weight types int4 takes: the codes are computed in float64 either way; the scales (and a
# Gemm's bias, an AWQ input scale) are stored in the weight's own type, which is the type of
# the activations MatMulNBits / DequantizeLinear then compute with (float16 models stay so).
WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def is_target(node: Node) -> bool:
    return node.is_standard and node.op_type in TARGET_OPS


def target_weight(node: Node) -> tuple[np.ndarray, bool] | str:
    """(W as [K, N], stored transposed) of a MatMul/Gemm that int4 can take, or why not."""
    try:
        return _find_weight(node)
    except NoMatch as no:
        return str(no.reason)


def _find_weight(node: Node) -> tuple[np.ndarray, bool]:
    """`target_weight`'s answer, or `NoMatch(reason, at=...)`: the rule contract's refusal,
    naming the input where the weight failed (`infercc.passes.rules`)."""
    w_value = node.input(1)
    x = node.input(0)
    if x is None or w_value is None:
        raise NoMatch("an input is missing")
    if const_array(x) is not None:
        raise NoMatch("its A input is a constant, not an activation", at=x)
    w = const_array(w_value)
    if w is None and node.op_type == "MatMul":
        w = _transposed_constant(w_value)
    if w is None:
        raise NoMatch("its weight is not a constant (a MatMul of two activations)", at=w_value)
    if w.dtype not in WEIGHT_DTYPES:
        raise NoMatch(f"its weight is {w.dtype}, not float32 or float16", at=w_value)
    if w.ndim != 2:
        raise NoMatch(f"its weight has rank {w.ndim}, not 2 (a batched MatMul)", at=w_value)
    if not all_finite(w):
        raise NoMatch("its weight holds NaN or infinity", at=w_value)
    if node.op_type == "MatMul":
        return np.asarray(w), False
    problem = _gemm_problem(node)
    if problem:
        c = node.input(2)
        raise NoMatch(problem, at=c if problem.startswith("Gemm whose C") and c else None)
    transposed = bool(node.attr("transB", 0))
    return (np.asarray(w).T if transposed else np.asarray(w)), transposed


def transposed_source(value: Value | None) -> Value | None:
    """The constant E of a weight written `Transpose(E)` (rank 2, perm [1, 0]): the torch
    dynamo exporter's tied LM head, MatMul(x, Transpose(embed)), which fold-constants leaves
    unfolded when the table is past its fold limit."""
    node = None if value is None else value.producer
    if node is None or not node.is_standard or node.op_type != "Transpose":
        return None
    source = node.input(0)
    data = const_array(source)
    if data is None or data.ndim != 2 or list(node.attr("perm", [1, 0])) != [1, 0]:
        return None
    return source


def _transposed_constant(value: Value | None) -> np.ndarray | None:
    """W = E.T (a view: no copy of the table) where the weight is `Transpose(E)`."""
    source = transposed_source(value)
    return None if source is None else np.asarray(const_array(source)).T


def _gemm_problem(node: Node) -> str | None:
    if node.attr("transA", 0):
        return "Gemm with transA"
    if float(node.attr("alpha", 1.0)) != 1.0:
        return "Gemm with alpha != 1"
    c = node.input(2)
    if c is None:
        return None
    if float(node.attr("beta", 1.0)) != 1.0:
        return "Gemm with beta != 1"
    bias = const_array(c)
    weight = const_array(node.input(1)) if node.input(1) is not None else None
    if bias is None or weight is None or bias.dtype != weight.dtype:
        return "Gemm whose C is not a constant of its weight's type"
    return None


def _gemm_bias(node: Node, n: int) -> np.ndarray | None:
    """A Gemm's C as a bias of `n` (None: it has none), or `NoMatch` at C."""
    c = node.input(2)
    if c is None:
        return None
    bias = np.asarray(const_array(c))
    if bias.size == n and (bias.ndim == 1 or bias.shape[-1] == n):
        return bias.reshape(n)
    raise NoMatch(f"Gemm whose C of shape {list(bias.shape)} is not a bias of {n}", at=c)


def _matmul_bias(node: Node, w: np.ndarray) -> tuple[Node | None, np.ndarray | None]:
    """The Add that alone reads a MatMul's output with a constant bias [N] of the weight's
    type (what MatMulNBits takes as its bias input), and that bias; (None, None) if none."""
    found = bias_add(node.output)
    bias = None if found is None else const_array(found[1])
    if found is None or bias is None or bias.dtype != w.dtype or bias.shape != (w.shape[1],):
        return None, None
    return found[0], np.asarray(bias)


def lm_heads(model: Model) -> set[str]:
    """Target nodes whose output reaches a graph output through shape-only or bias ops only:
    the LM head of a decoder (the classifier of an encoder)."""
    passthrough = {"Add", "Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten"}
    found = set()
    for node in model.graph:
        if not is_target(node):
            continue
        value, hops = node.output, 0
        while not value.is_graph_output and hops < 4:
            users = value.users()
            if len(users) != 1 or users[0].op_type not in passthrough:
                break
            value, hops = users[0].output, hops + 1
        if value.is_graph_output:
            found.add(node.name)
    return found


def embedding_gathers(model: Model) -> list[Node]:
    """Gathers on axis 0 of a constant float32 or float16 table [V, D] (token and position
    embeddings)."""
    found = []
    for node in model.graph:
        if node.op_type != "Gather" or not node.is_standard or node.attr("axis", 0) != 0:
            continue
        table = node.input(0)
        data = None if table is None else const_array(table)
        if data is not None and data.dtype in WEIGHT_DTYPES and data.ndim == 2:
            found.append(node)
    return found


def tied_tables(model: Model, heads: set[str], block_size: int) -> dict[str, str]:
    """Embedding Gathers whose table is an LM head's weight transposed (tied embeddings, which
    the TorchScript exporter writes as two initializers): Gather name -> head name. Only where
    the table's width is a whole number of blocks, so one int4 copy can serve both."""
    by_shape: dict[tuple[int, int], list[tuple[str, np.ndarray]]] = {}
    for node in model.graph:
        if node.name in heads and node.op_type == "MatMul":
            found = target_weight(node)
            if not isinstance(found, str):
                w = found[0]
                by_shape.setdefault((w.shape[1], w.shape[0]), []).append((node.name, w))
    tied = {}
    for gather in embedding_gathers(model):
        table = np.asarray(const_array(gather.input(0)))
        if table.shape[1] % block_size:
            continue
        for head, w in by_shape.get(table.shape, []):
            if w.dtype == table.dtype and np.array_equal(w.T, table):
                tied[gather.name or f"Gather({gather.output.name})"] = head
                break
    return tied


def quantize_int4(
    model: Model,
    options: Int4Options,
    method: Method | None = None,
    input_scales: Mapping[str, np.ndarray] | None = None,
) -> Int4Report:
    """Rewrite `model` in place: every MatMul/Gemm weight (and, in the nbits form, embedding
    table) that can be, in int4 (module docstring); the rest listed with reasons. The
    quantize-int4 pass alone, through the pass manager.

    `method(name, W)` gives each weight's Blocks (RTN when None). `input_scales` maps a node
    name to a per-input-channel vector s (AWQ): the node's weight was quantized as diag(s) W,
    so its input is divided by s first (one shared Mul per input tensor).
    """
    settings = Int4Settings(options, method, dict(input_scales or {}))
    report = run_passes(model, PassContext(options={"int4": settings}), ["quantize-int4"])
    return report.details("quantize-int4")


@register_pass("quantize-int4", once=True, reads=("int4",))
def quantize_int4_pass(graph: Graph, ctx: PassContext) -> PassResult:
    """MatMul/Gemm weights (and embedding tables) to int4: MatMulNBits, or blocked
    DequantizeLinear."""
    settings = INT4.read(ctx)
    model = graph.model
    if settings is None or model is None or graph is not model.graph:
        raise InferccError(
            "quantize-int4 needs its options (its option `int4`) and a model's main graph",
            "run it through `infercc calibrate --int4`, or `quantize_int4(model, options)`",
        )
    report = _rewrite(model, settings, ctx)
    logger.info(
        "int4: %d weight(s) and %d table(s) quantized, %d kept float",
        len(report.quantized),
        len(report.embeddings),
        len(report.kept_float),
    )
    stats = {
        "quantized": len(report.quantized),
        "embeddings": len(report.embeddings),
        "kept_float": len(report.kept_float),
    }
    changed = bool(report.quantized or report.embeddings)
    return PassResult(changed=changed, stats=stats, details=report)


LIMIT_REASON = "kept float by a rewrite limit (bisection)"
DQ_TABLE_REASON = "embedding table kept float: standard ONNX has no block-quantized Gather"


@dataclass(frozen=True)
class _WeightMatch:
    """What the weight rule's check proved: W [K, N], stored transposed, a Gemm's bias (or a
    MatMul's, with the Add that adds it: `bias_add`)."""

    w: np.ndarray
    transposed: bool
    bias: np.ndarray | None
    bias_add: Node | None = None


@dataclass(frozen=True)
class _TableMatch:
    """What the table rule's check proved: the table, and the LM head it shares (tied)."""

    table: np.ndarray
    head: str | None


def _rewrite(model: Model, settings: Int4Settings, ctx: PassContext) -> Int4Report:
    """Two rules (`infercc.passes.rules`), the MatMul/Gemm weights first (a tied table reads
    its LM head's int4 copy), then the embedding Gathers: a refusal is a `NoMatch` with its
    reason (what --explain lists, and `Int4Report.kept_float`), one rewrite one node."""
    options: Int4Options = settings.options
    check_block_size(options.block_size)
    if options.form not in FORMS:
        raise InferccError(f"unknown int4 form {options.form!r}", f"use one of {FORMS}")
    rewriter = _Int4Rewriter(model, options, settings.method, dict(settings.input_scales), ctx)
    weights = Rule("quantized", TARGET_OPS, rewriter.check_weight, rewriter.rewrite_weight)
    rewriter.note(apply_rules(model.graph, ctx, [weights], subgraphs=False))
    rewriter.gathers = set(embedding_gathers(model))
    tables = Rule("embeddings", ("Gather",), rewriter.check_table, rewriter.rewrite_table)
    rewriter.note(apply_rules(model.graph, ctx, [tables], subgraphs=False))
    if options.form == "nbits" and (rewriter.report.quantized or rewriter.report.embeddings):
        model.opset_imports.setdefault(MS_DOMAIN, 1)
    return rewriter.report


class _Int4Rewriter:
    """The two rules' state for one run: checks that prove a match or raise `NoMatch`, and
    rewrites that apply it."""

    def __init__(
        self,
        model: Model,
        options: Int4Options,
        method: Method | None,
        input_scales: dict[str, np.ndarray],
        ctx: PassContext,
    ):
        self.ctx = ctx
        self.model = model
        self.graph = model.graph
        self.options = options
        self.method = method or self._rtn
        self.input_scales = input_scales
        self.scaled: dict[tuple[str, bytes], Value] = {}  # (input, s bytes) -> X / s
        self.report = Int4Report()
        self.dtype: np.dtype = np.dtype(np.float32)  # the weight being rewritten's type
        # node -> its MatMulNBits (B, scales, zero points, (N, K, block size)): what a tied
        # table shares (the dims only: the codes of every weight kept would be a byte a weight)
        self.nbits: dict[str, tuple[Value, Value, Value | None, tuple[int, int, int]]] = {}
        self.heads = lm_heads(model)
        self.tied = tied_tables(model, self.heads, options.block_size)
        self.gathers: set[Node] = set()  # the embedding Gathers, once the weights are done
        self.matched: list[Node] = []  # checked, not yet rewritten (the limit may stop them)

    def note(self, run: RuleRun) -> None:
        """The refusals of a rule run in the report; a match the pass manager's rewrite
        limit stopped (bisection) is kept float, and says so."""
        for node, reason in run.refused:
            self.report.kept_float[_label(node)] = reason
        for node in self.matched:
            self.report.kept_float[_label(node)] = LIMIT_REASON
            self.ctx.refuse(node, LIMIT_REASON)
        self.matched = []

    def _rtn(self, _name: str, w: np.ndarray) -> Blocks:
        return quantize_rtn(w, self.options.block_size, self.options.symmetric)

    def check_weight(self, node: Node, _ctx: PassContext) -> _WeightMatch:
        if node.name in self.options.exclude:
            raise NoMatch("excluded by the user")
        if node.name in self.heads and not self.options.lm_head:
            raise NoMatch("the LM head (output projection), kept float (--no-lm-head)")
        w, transposed = _find_weight(node)
        bias = _gemm_bias(node, w.shape[1]) if node.op_type == "Gemm" else None
        bias_add = None
        if node.op_type == "MatMul" and self.options.form == "nbits":
            bias_add, bias = _matmul_bias(node, w)
        self.matched.append(node)
        return _WeightMatch(w, transposed, bias, bias_add)

    def rewrite_weight(self, node: Node, match: _WeightMatch, _ctx: PassContext) -> None:
        self.matched.remove(node)
        label, w = node.name, match.w
        scale = self.input_scales.get(label)
        blocks = self.method(label, w if scale is None else w * scale[:, None])
        self._account(w, blocks)
        self.dtype = w.dtype
        weight_value = node.input(1)
        if scale is not None:
            node.set_input(0, self._scaled_input(node, scale))
        if self.options.form == "nbits":
            self._to_nbits(node, blocks, match.bias)
            if match.bias_add is not None:  # the bias is MatMulNBits' own now
                add = match.bias_add
                bias_value = next(v for v in add.inputs if v is not node.output)
                self.graph.replace_all_uses_with(add.output, node.output)
                self.graph.remove(add)
                self._drop_if_unread(bias_value)
        else:
            self._to_dq(node, blocks, match.transposed)
        self._drop_if_unread(weight_value)
        self.report.quantized.append(label)

    def check_table(self, node: Node, _ctx: PassContext) -> _TableMatch:
        """A tied table shares its LM head's int4 copy where the head was quantized plainly
        (not kept float, excluded or AWQ-scaled: its codes are then of diag(s) W, not of W);
        any other is quantized with --embeddings, else says why it stays float."""
        if node not in self.gathers:
            raise NoMatch()
        options, label = self.options, _label(node)
        table_value = node.input(0)
        table = np.asarray(const_array(table_value))
        head = self.tied.get(node.name)
        nbits = options.form == "nbits"
        if nbits and head in self.nbits and label not in options.exclude:
            self.matched.append(node)
            return _TableMatch(table, head)
        if not nbits:
            raise NoMatch(DQ_TABLE_REASON)
        if not options.embeddings:
            raise NoMatch(_float_table_reason(table, options.block_size))
        if node.name in options.exclude:
            raise NoMatch("excluded by the user")
        if table.shape[1] % 2:
            raise NoMatch(f"embedding width {table.shape[1]} is odd", at=table_value)
        self.matched.append(node)
        return _TableMatch(table, None)

    def rewrite_table(self, node: Node, match: _TableMatch, _ctx: PassContext) -> None:
        self.matched.remove(node)
        if match.head is not None:
            self._share(node, match.head)
        else:
            self._embedding(node, match.table)

    def _account(self, w: np.ndarray, blocks: Blocks) -> None:
        self.report.weight_bytes_before += int(w.nbytes)
        self.report.weight_bytes_after += int_bytes(blocks)

    def _scaled_input(self, node: Node, scale: np.ndarray) -> Value:
        x = node.input(0)
        assert x is not None
        key = (x.name, np.asarray(scale, np.float32).tobytes())
        if key not in self.scaled:
            inv = (1.0 / np.asarray(scale, np.float64)).astype(self.dtype)
            c = self.graph.make_constant(inv, f"{node.name}_awq_input_scale")
            mul = self.graph.make_node("Mul", [x, c], before=node, name=f"{node.name}_awq_scale")
            mul.output.dtype, mul.output.shape = x.dtype, x.shape
            self.scaled[key] = mul.output
            self.report.input_scales += 1
        return self.scaled[key]

    def _to_nbits(self, node: Node, blocks: Blocks, bias: np.ndarray | None) -> None:
        packed = pack_matmul_nbits(blocks)
        g, base = self.graph, node.name
        b_value = g.make_constant(packed.b, f"{base}_int4_B")
        scales_value = g.make_constant(packed.scales.astype(self.dtype), f"{base}_int4_scales")
        inputs = [node.input(0), b_value, scales_value]
        zp_value = None
        if packed.zero_points is not None or bias is not None:
            zp = packed.zero_points
            zp_value = None if zp is None else g.make_constant(zp, f"{base}_int4_zero_points")
            inputs.append(zp_value)
        if node.name not in self.input_scales:
            dims = (blocks.n, blocks.k, blocks.block_size)
            self.nbits[node.name] = (b_value, scales_value, zp_value, dims)
        if bias is not None:
            inputs += [None, g.make_constant(bias, f"{base}_bias")]
        old_bias = node.input(2) if node.op_type == "Gemm" else None
        node.replace_inputs(inputs)
        node.op_type, node.domain = "MatMulNBits", MS_DOMAIN
        node.attributes = {}
        attrs = {"K": blocks.k, "N": blocks.n, "bits": BITS, "block_size": blocks.block_size}
        if self.options.accuracy_level:
            attrs["accuracy_level"] = int(self.options.accuracy_level)
        for key, value in attrs.items():
            node.set_attr(key, int(value))
        self._drop_if_unread(old_bias)

    def _to_dq(self, node: Node, blocks: Blocks, transposed: bool) -> None:
        dq = pack_blocked_dq(blocks, transposed)
        g, base = self.graph, node.name
        inputs = [
            g.make_constant(dq.x, f"{base}_int4_weight"),
            g.make_constant(dq.scale.astype(self.dtype), f"{base}_int4_scale"),
        ]
        if dq.zero_point is not None:
            inputs.append(g.make_constant(dq.zero_point, f"{base}_int4_zero_point"))
        made = g.make_node(
            "DequantizeLinear",
            inputs,
            before=node,
            name=f"DQ_{base}",
            attributes={"axis": dq.axis, "block_size": blocks.block_size},
        )
        w_shape = (blocks.n, blocks.k) if transposed else (blocks.k, blocks.n)
        made.output.dtype = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype))
        made.output.shape = w_shape
        node.set_input(1, made.output)

    def _share(self, node: Node, head: str) -> None:
        """A tied table read through the LM head's int4 copy: GatherBlockQuantized over
        Reshape(B) [V, D / 2] with the head's scales and zero points (as onnxruntime-genai
        builds it); no bytes added."""
        label = _label(node)
        packed = self.nbits[head]
        b, scales, zero, (n, k, block_size) = packed
        g = self.graph
        dims = np.array([n, k // 2], np.int64)
        shape = g.make_constant(dims, f"{label}_tied_shape")
        reshape = g.make_node("Reshape", [b, shape], before=node, name=f"{label}_tied_codes")
        reshape.output.dtype, reshape.output.shape = TensorProto.UINT8, (n, k // 2)
        table_value = node.input(0)
        inputs = [reshape.output, node.input(1), scales]
        if zero is not None:
            inputs.append(zero)
        node.replace_inputs(inputs)
        node.op_type, node.domain = "GatherBlockQuantized", MS_DOMAIN
        node.attributes = {}
        attrs = {"bits": BITS, "block_size": block_size, "gather_axis": 0}
        for key, value in {**attrs, "quantize_axis": 1}.items():
            node.set_attr(key, int(value))
        self.report.weight_bytes_before += int(np.asarray(const_array(table_value)).nbytes)
        self._drop_if_unread(table_value)
        self.report.embeddings.append(label)
        self.report.tied[label] = head

    def _embedding(self, node: Node, table: np.ndarray) -> None:
        label = _label(node)
        table_value = node.input(0)
        blocks = quantize_rtn(table.T, self.options.block_size, self.options.symmetric)
        self._account(table, blocks)
        g, base = self.graph, label
        codes = blocks.codes.reshape(blocks.n, -1)[:, : blocks.k]  # [V, D]
        inputs = [
            g.make_constant(pack_nibbles(codes), f"{base}_int4_table"),
            node.input(1),
            g.make_constant(blocks.scales.astype(table.dtype), f"{base}_int4_scales"),
        ]
        if not blocks.symmetric:
            zp = pack_nibbles(blocks.zero_points)
            inputs.append(g.make_constant(zp, f"{base}_int4_zero_points"))
        node.replace_inputs(inputs)
        node.op_type, node.domain = "GatherBlockQuantized", MS_DOMAIN
        node.attributes = {}
        attrs = {"bits": BITS, "block_size": blocks.block_size, "gather_axis": 0}
        for key, value in {**attrs, "quantize_axis": 1}.items():
            node.set_attr(key, int(value))
        self._drop_if_unread(table_value)
        self.report.embeddings.append(label)

    def _drop_if_unread(self, value: Value | None) -> None:
        source = transposed_source(value)
        transpose = None if value is None else value.producer
        if source is not None and transpose is not None and value is not None:
            if value.uses() or value.is_graph_output:
                return
            self.graph.remove(transpose)  # Transpose(E) nobody reads now, then E if unread
            value = source
        if value is None or value.const is None or value.uses() or value.is_graph_output:
            return
        if self.graph.initializers.get(value.name) is value:
            self.graph.remove_initializer(value)


def _label(node: Node) -> str:
    return node.name or f"{node.op_type}({node.output.name})"


EMBEDDINGS_DEFAULT_REASON = (
    "embedding table kept float (the default, as in onnxruntime's quantizer and "
    "onnxruntime-genai: an int4 token table cost 1.4 to 12.1 points of top-1 agreement on "
    "infercc's test decoders)"
)


def _float_table_reason(table: np.ndarray, block_size: int) -> str:
    v, d = table.shape
    blocks = n_blocks(d, block_size)
    int4 = (v * d + 1) // 2 + v * blocks * 4 + v * ((blocks + 1) // 2)
    saved = max(int(table.nbytes) - int4, 0)
    return f"{EMBEDDINGS_DEFAULT_REASON}; --embeddings makes it int4, {saved:,} bytes smaller"


def int_bytes(blocks: Blocks) -> int:
    """Bytes of the int4 form: codes (half a byte each), float32 scales, packed zero points."""
    codes = (blocks.n * blocks.k + 1) // 2
    scales = blocks.scales.size * 4
    zero = 0 if blocks.symmetric else blocks.n * ((blocks.n_blocks + 1) // 2)
    return int(codes + scales + zero)


def check_symmetry(symmetric: bool, target_kind: str) -> None:
    """TensorRT's int4 weights take no zero point."""
    if target_kind == "gpu" and not symmetric:
        raise InferccError(
            "--asymmetric int4 cannot run on TensorRT: its int4 DequantizeLinear takes no zero "
            "point",
            "use --symmetric (the default for GPU targets)",
        )
