"""AWQ: activation-aware int4 weights (Lin et al., 2023), on calibration inputs.

A weight's input channels are not equally important: those that see large activations
matter most. Scaling input channel k of W up by s_k before quantizing (and the input down by
the same s_k, which is exact) gives those channels finer steps relative to their blocks:

    y = x @ W = (x / s) @ (diag(s) W)  ~=  (x / s) @ Q(diag(s) W)

1. **Scales.** s = mean|x|^alpha (normalized to a geometric mean of 1) for alpha on a grid
   0, 0.05, ..., 1 (alpha 0 is plain RTN); the alpha whose output error
   || X W - (X / s) Q(diag(s) W) ||^2 over the row sample is smallest wins.
2. **Clipping.** Then each block's range is shrunk by a ratio r in 1.0, 0.95, ..., 0.75 when
   that lowers the block's own output error || X_b (W_b - Q_r(W_b)) ||^2 (X_b: the block's
   input channels), per block and output column.

The node's input is then divided by s in the graph (a Mul by 1/s, shared by nodes that read
the same input with the same s), and the weight stored is Q(diag(s) W). With s = 1 (alpha 0)
and r = 1 this is exactly RTN; a weight whose AWQ error on the row sample is not below RTN's
keeps RTN (and no input scaling), so on the calibration rows AWQ is never worse than RTN by
its own measure. On held-out text the report says whether it won.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from infercc.calib.activations import InputStats
from infercc.passes.quantize_int4 import (
    Blocks,
    _pad_with_zero_point,
    block_params,
    block_view,
    quantize_rtn,
    round_codes,
)

logger = logging.getLogger(__name__)

ALPHAS = tuple(i / 20 for i in range(21))
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


@dataclass
class AwqResult:
    blocks: Blocks  # of diag(s) W
    scale: np.ndarray  # s [K]; the input is divided by it
    alpha: float
    error_rtn: float  # output error of plain RTN on the row sample
    error_awq: float


def _output_error(x: np.ndarray, y: np.ndarray, w_hat: np.ndarray) -> float:
    return float(np.sum((x @ w_hat - y) ** 2))


def search_scale(
    w: np.ndarray, stats: InputStats, block_size: int, symmetric: bool
) -> tuple[np.ndarray, float, float, float]:
    """(s, alpha, error of RTN, error at the best alpha) on the row sample."""
    x = stats.row_matrix().astype(np.float64)
    w64 = np.asarray(w, np.float64)
    y = x @ w64
    mean = np.maximum(stats.abs_mean, 1e-8)
    best = (np.ones(w.shape[0]), 0.0, np.inf)
    rtn_error = np.inf
    for alpha in ALPHAS:
        s = mean**alpha
        s = s / np.exp(np.mean(np.log(s)))
        blocks = quantize_rtn((w64 * s[:, None]).astype(np.float32), block_size, symmetric)
        err = _output_error(x / s, y, blocks.dequantize().astype(np.float64))
        if alpha == 0.0:
            rtn_error = err
        if err < best[2]:
            best = (s, alpha, err)
    return best[0], best[1], rtn_error, best[2]


def clip_search(w: np.ndarray, x: np.ndarray, block_size: int, symmetric: bool) -> Blocks:
    """RTN with each block's range shrunk by the ratio that lowers its output error most."""
    k = w.shape[0]
    blocks = block_view(w, block_size)  # [N, nb, bs]
    n, nb, bs = blocks.shape
    xp = np.zeros((x.shape[0], nb * bs))
    xp[:, :k] = x
    xb = xp.reshape(x.shape[0], nb, bs)  # [R, nb, bs]
    best_err = np.full((n, nb), np.inf)
    chosen = np.ones((n, nb))
    for ratio in CLIP_RATIOS:
        scales, zero = block_params(blocks, symmetric, ratio)
        codes = round_codes(blocks, scales, zero)
        dw = blocks - (codes.astype(np.float64) - zero[..., None]) * scales[..., None]
        per_block = np.matmul(xb.transpose(1, 0, 2), dw.transpose(1, 2, 0))  # [nb, R, N]
        err = np.square(per_block).sum(axis=1).T  # [N, nb]
        better = err < best_err
        best_err = np.where(better, err, best_err)
        chosen = np.where(better, ratio, chosen)
    scales, zero = block_params(blocks, symmetric, chosen)
    codes = round_codes(blocks, scales, zero)
    _pad_with_zero_point(codes, zero, k)
    return Blocks(codes, scales, zero, k, block_size, symmetric)


def awq_quantize(
    w: np.ndarray, stats: InputStats, block_size: int, symmetric: bool, clip: bool = True
) -> AwqResult:
    s, alpha, rtn_err, _ = search_scale(w, stats, block_size, symmetric)
    scaled = (np.asarray(w, np.float64) * s[:, None]).astype(np.float32)
    x = stats.row_matrix().astype(np.float64) / s
    if clip:
        blocks = clip_search(scaled, x, block_size, symmetric)
    else:
        blocks = quantize_rtn(scaled, block_size, symmetric)
    y = stats.row_matrix().astype(np.float64) @ np.asarray(w, np.float64)
    err = _output_error(x, y, blocks.dequantize().astype(np.float64))
    if not err < rtn_err:
        rtn = quantize_rtn(w, block_size, symmetric)
        return AwqResult(rtn, np.ones(w.shape[0], np.float32), 0.0, rtn_err, rtn_err)
    return AwqResult(blocks, s.astype(np.float32), alpha, rtn_err, err)
