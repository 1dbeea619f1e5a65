"""INT8 calibration: range observers over real samples.

`collect_ranges` runs a model on samples with its intermediate float tensors exposed and
returns one `TensorRange` (min, max, symmetric INT8 scale) per tensor, by MinMax, entropy
(TensorRT's KL-divergence search) or percentile; `infercc.backends.trt.calib_cache` stores the
scales in the text format TensorRT's calibrators and trtexec `--calib` read.
"""

from infercc.calib.observers import (
    Calibrator,
    HistogramObserver,
    MinMaxObserver,
    TensorRange,
    collect_ranges,
    int8_scale,
)

__all__ = [
    "Calibrator",
    "HistogramObserver",
    "MinMaxObserver",
    "TensorRange",
    "collect_ranges",
    "int8_scale",
]
