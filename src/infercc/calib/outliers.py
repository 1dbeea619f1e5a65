"""Outlier channels: which input channels of a transformer projection to keep in float.

Trained transformers carry a handful of activation channels far larger than the rest. In
all-MiniLM-L6-v2 the input of layer 0's FFN output projection reaches 24.6 in one channel of
1536, while 99% of the channels stay under 5.0: a per-tensor int8 (or uint8) scale set by that
one channel leaves every other channel a few quantization steps, and the embedding's cosine
drops. Clipping the channel (percentile, entropy, MSE ranges) is worse: it matters.

This module measures the channels on the calibration samples and picks the outliers; the
exact split of the projection is the split-outlier-channels pass
(`infercc.passes.split_outliers`, which also says which MatMuls are candidates).

A channel is an outlier when its absolute maximum over the calibration samples exceeds
`RATIO` (2.5) times the (`MAX_CHANNELS` + 1)-th largest channel maximum, so at most
`MAX_CHANNELS` (8) channels can be outliers and a tensor with many large channels has none;
only projections with at least `MIN_K` (64) input channels are considered. On all-MiniLM-L6-v2
it finds outliers in 11 of 24 projections (1 to 3 channels each); split, they raise the
held-out minimum cosine, every projection in int8, from 0.9909 to 0.9956, for about 10% more
time (docs/benchmarks.md). So calibrate splits only when the all-int8 model misses its
accuracy target without the split, and then only as many projections as the target needs,
the most `severity` first (`infercc.calib.job`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike

import numpy as np

from infercc.calib.observers import tensor_values
from infercc.passes.split_outliers import MIN_K

logger = logging.getLogger(__name__)

RATIO = 2.5
MAX_CHANNELS = 8


def channel_absmax(
    model_path: str | PathLike[str],
    samples: Iterable[Mapping[str, np.ndarray]],
    tensors: Sequence[str],
) -> dict[str, np.ndarray]:
    """Per last-axis channel absolute maximum of each tensor over the samples (streamed)."""
    amax: dict[str, np.ndarray] = {}
    for values in tensor_values(model_path, samples, list(dict.fromkeys(tensors))):
        for name, x in values.items():
            x = np.asarray(x)
            if x.ndim == 0 or x.size == 0:
                continue
            m = np.nanmax(np.abs(x.reshape(-1, x.shape[-1])), axis=0)
            amax[name] = m if name not in amax else np.maximum(amax[name], m)
    return amax


def outlier_channels(amax: np.ndarray) -> list[int]:
    """The outlier channels of one tensor (empty when none, or too many to be outliers)."""
    amax = np.asarray(amax, np.float64)
    level = _level(amax)
    if level is None:
        return []
    idx = np.flatnonzero(amax > RATIO * level)
    return [int(i) for i in idx]


def severity(amax: np.ndarray, channels: Sequence[int]) -> float:
    """How far the largest of `channels` stands above the rest: its maximum over the largest
    channel past the outliers (> RATIO for outliers; 0.0 when there is no such level)."""
    amax = np.asarray(amax, np.float64)
    level = _level(amax)
    if level is None or not len(channels):
        return 0.0
    return float(amax[list(channels)].max() / level)


def _level(amax: np.ndarray) -> float | None:
    """The largest channel maximum past the `MAX_CHANNELS` largest (None when the tensor is
    too small, not finite, or all zero there)."""
    if amax.size < MIN_K or not np.isfinite(amax).all():
        return None
    level = float(np.sort(amax)[-(MAX_CHANNELS + 1)])
    return level if level > 0.0 else None
