"""INT8 calibration: range observers over real samples, and TensorRT calibration cache files.

`collect_ranges` runs a model on samples with its intermediate float tensors exposed and
returns one `TensorRange` (min, max, symmetric INT8 scale) per tensor, by MinMax, entropy
(TensorRT's KL-divergence search) or percentile; `write_calibration_cache` stores the scales
in the text format TensorRT's calibrators and trtexec `--calib` read.
"""

from infercc.calib.observers import (
    Calibrator,
    HistogramObserver,
    MinMaxObserver,
    TensorRange,
    collect_ranges,
    int8_scale,
)
from infercc.calib.trt_cache import (
    CalibrationCache,
    read_calibration_cache,
    trt_version_tag,
    write_calibration_cache,
)

__all__ = [
    "CalibrationCache",
    "Calibrator",
    "HistogramObserver",
    "MinMaxObserver",
    "TensorRange",
    "collect_ranges",
    "int8_scale",
    "read_calibration_cache",
    "trt_version_tag",
    "write_calibration_cache",
]
