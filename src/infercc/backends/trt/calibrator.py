"""INT8 on TensorRT 10 from a calibration cache: a calibrator that only reads the cache.

TensorRT's implicit INT8 (BuilderFlag.INT8 without Q/DQ in the graph) asks a calibrator for
scales. When the calibrator's `read_calibration_cache` returns a cache, TensorRT takes the
scales from it and never asks for a batch, so no calibration data needs to be on the GPU
machine: `infercc calibrate` wrote the cache (`infercc.backends.trt.calib_cache`) from real samples.

The cache is parsed with `read_calibration_cache` first, so a broken file is an error naming
the file and line, not a TensorRT failure later; its method picks the calibrator class
(`EntropyCalibration2` -> `IInt8EntropyCalibrator2`, `MinMaxCalibration` ->
`IInt8MinMaxCalibrator`) because TensorRT rejects a cache whose header names another
calibrator. A cache written for another TensorRT version is used with a warning (TensorRT
itself decides whether to accept it); `trt.__version__` has four parts ("10.16.0.72"), of
which the tag uses three. The Python calibrator interface (pyInt8.cpp): `get_batch_size()`,
`get_batch(names)` returning device pointers or None, `read_calibration_cache()` returning a
buffer or None, `write_calibration_cache(cache)`; the base class `__init__` must be called.
The calibrator API is deprecated since TensorRT 10.1. TensorRT 11 has no calibrators:
`precision.decide` refuses a calibration cache there.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from infercc.backends.trt.calib_cache import read_calibration_cache, trt_version_tag
from infercc.backends.trt.versions import tensorrt_majors
from infercc.errors import InferccError

log = logging.getLogger(__name__)

_CLASSES = {"entropy": "IInt8EntropyCalibrator2", "minmax": "IInt8MinMaxCalibrator"}


@tensorrt_majors(10)
def make_calibrator(trt: Any, cache_path: Path | str, trt_version: str) -> Any:
    """A calibrator object for `config.int8_calibrator` that serves `cache_path`'s bytes."""
    path = Path(cache_path)
    cache = read_calibration_cache(path)
    base_name = _CLASSES.get(cache.method)
    if base_name is None:
        raise InferccError(
            f"calibration cache {str(path)!r} is of the legacy {cache.method!r} kind",
            "regenerate it with infercc calibrate (EntropyCalibration2 or MinMaxCalibration)",
        )
    try:
        expected = trt_version_tag(trt_version)
    except InferccError:  # an unusual version text only skips the comparison
        expected = cache.version
    if cache.version != expected:
        log.warning(
            "calibration cache %s was written for TensorRT tag %d, this is %s (tag %d)",
            path,
            cache.version,
            trt_version,
            expected,
        )
    data = path.read_bytes()
    log.info("int8 scales for %d tensors from %s", len(cache.scales), path)
    return _calibrator_class(trt, base_name)(data)


@tensorrt_majors(10)
def _calibrator_class(trt: Any, base_name: str) -> type:
    base = getattr(trt, base_name)

    class CacheOnlyCalibrator(base):  # type: ignore[misc, valid-type]
        """Serves a calibration cache; has no batches (TensorRT does not ask for any)."""

        def __init__(self, data: bytes):
            base.__init__(self)
            self.data = data

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: Any, *args: Any) -> None:
            return None

        def read_calibration_cache(self) -> bytes:
            return self.data

        def write_calibration_cache(self, cache: Any) -> None:
            return None

    return CacheOnlyCalibrator
