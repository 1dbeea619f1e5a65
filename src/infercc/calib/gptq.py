"""GPTQ: error-compensating int4 rounding (Frantar et al., 2022), on calibration inputs.

Quantizing the input channels of W [K, N] one at a time, GPTQ moves each channel's rounding
error onto the channels not yet quantized, along the inverse of the layer Hessian
H = 2 X^T X / n (X: the calibration inputs, rows = tokens), which minimizes the output error
|| X W - X Q ||^2 to second order:

    for k in 0..K-1 (in blocks of channels, the update applied lazily per block):
        q_k   = round(w_k; scale, zero point of k's block)
        e_k   = (w_k - q_k) / U[k, k]
        w_j  -= e_k U[k, j]        for j > k
    where U is the upper Cholesky factor of H^-1.

The scale and zero point of each block of `block_size` channels are chosen (min-max, as RTN)
from the block's weights as updated when quantization reaches the block's first channel, so
they see the error already moved onto them. Damping: H + 0.01 mean(diag H) I; a channel never
active on the calibration data (H[k, k] = 0) gets weight 0. Inputs come from the fp32 model
(every layer sees fp32 activations, not those of the already-quantized layers before it).
"""

from __future__ import annotations

import logging

import numpy as np

from infercc.calib.activations import InputStats
from infercc.errors import InferccError
from infercc.passes.quantize_int4 import (
    Blocks,
    _pad_with_zero_point,
    block_params,
    n_blocks,
)

logger = logging.getLogger(__name__)

DAMPING = 0.01
LAZY_BLOCK = 128


def hessian(stats: InputStats) -> np.ndarray:
    if stats.hessian is None or stats.count == 0:
        raise InferccError("GPTQ needs the calibration inputs' X^T X", "collect it first")
    return 2.0 * stats.hessian / stats.count


def _inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of H^-1, damping harder if H is not positive definite."""
    damp = DAMPING * float(np.mean(np.diag(h))) or 1e-6
    eye = np.eye(h.shape[0])
    for _ in range(6):
        try:
            inv = np.linalg.inv(np.linalg.cholesky(h + damp * eye))
            return np.linalg.cholesky(inv.T @ inv).T
        except np.linalg.LinAlgError:
            damp *= 10.0
    raise InferccError("the layer Hessian is not positive definite", "use --method rtn")


def gptq_quantize(w: np.ndarray, stats: InputStats, block_size: int, symmetric: bool) -> Blocks:
    """GPTQ of W [K, N] (module docstring); the result in the same `Blocks` form as RTN."""
    h = hessian(stats).copy()
    k, n = w.shape
    work = np.asarray(w, np.float64).T.copy()  # [N, K]: one row per output column
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    work[:, dead] = 0.0
    u = _inverse_cholesky(h)
    nb = n_blocks(k, block_size)
    codes = np.zeros((n, nb * block_size), np.uint8)
    scales = np.zeros((n, nb), np.float32)
    zero = np.zeros((n, nb), np.uint8)
    lazy = max(LAZY_BLOCK, block_size)
    for start in range(0, k, lazy):
        end = min(start + lazy, k)
        _quantize_span(work, u, (start, end), block_size, symmetric, (codes, scales, zero))
    codes = codes.reshape(n, nb, block_size)
    _pad_with_zero_point(codes, zero, k)
    return Blocks(codes, scales, zero, k, block_size, symmetric)


def _quantize_span(
    work: np.ndarray,
    u: np.ndarray,
    span: tuple[int, int],
    block_size: int,
    symmetric: bool,
    out: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Quantize channels [start, end), then push their error onto the channels after `end`."""
    codes, scales, zero = out
    start, end = span
    w1 = work[:, start:end].copy()
    err = np.zeros_like(w1)
    for i in range(end - start):
        col = start + i
        if col % block_size == 0:
            group = w1[:, i : i + block_size]
            s, z = block_params(group[:, None, :], symmetric)
            scales[:, col // block_size], zero[:, col // block_size] = s[:, 0], z[:, 0]
        b = col // block_size
        s64, z = scales[:, b].astype(np.float64), zero[:, b]
        q = np.clip(np.rint(w1[:, i] / s64) + z, 0, 15)
        codes[:, col] = q.astype(np.uint8)
        e = (w1[:, i] - (q - z) * s64) / u[col, col]
        w1[:, i:] -= np.outer(e, u[col, col:end])
        err[:, i] = e
    work[:, end:] -= err @ u[start:end, end:]
