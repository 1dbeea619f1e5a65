"""What calibration samples say about the inputs of the weights int4 quantizes.

`collect_inputs(model_path, samples, tensors)` runs the fp32 model once over the samples with
the given tensors exposed (`observers.tensor_values`) and keeps, per tensor, flattened to rows
[tokens, K]:

- `abs_mean` [K]: the mean |x| per input channel (AWQ's saliency);
- `rows`: about `max_rows` rows, an equal share drawn at random (fixed seed) from each sample
  (AWQ's loss);
- `hessian` [K, K] (float64, with `hessian=True`): sum of x^T x over every row, and `count`,
  so H = 2 X^T X / count is GPTQ's layer Hessian.

Streaming: one sample's tensors are in memory at a time, plus the running sums.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike

import numpy as np

from infercc.calib.observers import tensor_values

logger = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 512


@dataclass
class InputStats:
    abs_sum: np.ndarray
    count: int = 0
    hessian: np.ndarray | None = None
    rows: list[np.ndarray] = field(default_factory=list)

    @property
    def abs_mean(self) -> np.ndarray:
        return self.abs_sum / max(self.count, 1)

    def row_matrix(self) -> np.ndarray:
        return np.concatenate(self.rows, axis=0) if self.rows else np.zeros((0, self.k))

    @property
    def k(self) -> int:
        return int(self.abs_sum.shape[0])


def collect_inputs(
    model_path: str | PathLike[str],
    samples: Iterable[Mapping[str, np.ndarray]],
    tensors: Sequence[str],
    hessian: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    seed: int = 0,
    on_progress: Callable[[int, int | None], None] | None = None,
) -> dict[str, InputStats]:
    """Per tensor: channel |x| means, a row sample, and (optionally) X^T X (module docstring)."""
    rng = np.random.default_rng(seed)
    stats: dict[str, InputStats] = {}
    samples = list(samples)
    share = max(1, max_rows // max(len(samples), 1))
    for done, values in enumerate(tensor_values(model_path, samples, list(tensors)), 1):
        for name, x in values.items():
            x = np.asarray(x, np.float32)
            rows = x.reshape(-1, x.shape[-1])
            s = stats.get(name)
            if s is None:
                k = rows.shape[1]
                s = stats[name] = InputStats(np.zeros(k), 0, np.zeros((k, k)) if hessian else None)
            _update(s, rows, rng, share)
        if on_progress is not None:
            on_progress(done, len(samples))
    logger.info("collected input statistics of %d tensor(s)", len(stats))
    return stats


def _update(s: InputStats, rows: np.ndarray, rng: np.random.Generator, share: int) -> None:
    s.abs_sum += np.abs(rows).sum(axis=0, dtype=np.float64)
    s.count += rows.shape[0]
    if s.hessian is not None:
        r64 = rows.astype(np.float64)
        s.hessian += r64.T @ r64
    pick = rng.choice(rows.shape[0], size=min(share, rows.shape[0]), replace=False)
    s.rows.append(rows[np.sort(pick)].copy())
