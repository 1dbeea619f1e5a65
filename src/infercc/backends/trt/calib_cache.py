"""TensorRT INT8 calibration cache files: write the scales infercc calibrated, read them back.

The format is TensorRT's, so it lives with the TensorRT backend, whose calibrator reads it
(`calibrator.py`); `infercc.calib` writes it, and imports the backends, never the reverse.

The format is the text file TensorRT's calibrators write (`writeCalibrationCache`) and read
(`readCalibrationCache`), and that trtexec takes with `--calib`:

```
TRT-100300-EntropyCalibration2
input: 3c010a14
conv1_out: 3d8e4d7f
```

- Line 1: `TRT-<version>-<calibrator>`. `<version>` is TensorRT's `NV_TENSORRT_VERSION` integer:
  since TensorRT 10 it is `major*10000 + minor*100 + patch` (`NV_TENSORRT_VERSION_INT` in
  NvInferRuntimeBase.h; caches written by 10.3 start `TRT-100300-`), before 10 it was
  `major*1000 + minor*100 + patch` (8.6.1 -> 8601, caches start `TRT-8601-`). `<calibrator>`
  is `EntropyCalibration2` (IInt8EntropyCalibrator2, TensorRT's default) or
  `MinMaxCalibration` (IInt8MinMaxCalibrator); the reader also accepts the older
  `EntropyCalibration` and `LegacyCalibration`. Write the version of the TensorRT that will
  read the cache: caches are not promised to carry across versions.
- Then one line per tensor, `name: <hex>`, the hex being the big-endian IEEE-754 bits of the
  float32 scale (dynamic range = scale * 127). Written as 8 lowercase digits; read
  case-insensitively with 1 to 8 digits.

Decisions:

- Lines are written sorted by tensor name, so the same scales always give the same bytes
  (TensorRT looks tensors up by name and reads any order).
- A line is split at its **last** `": "`: the hex never contains one, so tensor names with
  `:` or spaces (torch.onnx names such as `/layer1/Conv_output_0` have neither, but TF-exported
  `conv:0` does) read back intact. onnxruntime's TensorRT provider splits at the first `:`, so
  the writer logs a warning for such names. Names with a line break cannot be written.
- Writes are atomic: a temporary file in the same folder, then `os.replace`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike, fspath
from pathlib import Path

from infercc.errors import InferccError
from infercc.outputs import umask_mode
from infercc.passes.quantize_qdq import INT8_MAX

logger = logging.getLogger(__name__)

DEFAULT_TRT_VERSION = "10.3.0"

# Our method names <-> TensorRT's calibrator names in the header.
_WRITE_NAMES = {"entropy": "EntropyCalibration2", "minmax": "MinMaxCalibration"}
_READ_NAMES = {
    "EntropyCalibration2": "entropy",
    "MinMaxCalibration": "minmax",
    "EntropyCalibration": "entropy-legacy",
    "LegacyCalibration": "legacy",
}
_HEADER = re.compile(r"TRT-(\d+)-([A-Za-z0-9]+)")
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)*")
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class CalibrationCache:
    """A parsed cache: the version integer, our method name, and the scales by tensor name."""

    version: int
    method: str
    scales: dict[str, float]

    def dynamic_ranges(self) -> dict[str, float]:
        """Tensor name -> dynamic range (scale * 127), as TensorRT's setDynamicRange takes."""
        return {name: scale * INT8_MAX for name, scale in self.scales.items()}


# --------------------------------------------------------------------------- version


def trt_version_tag(version: str | int) -> int:
    """TensorRT's NV_TENSORRT_VERSION integer: "10.3.0" -> 100300, "8.6.1" -> 8601.

    An integer, or a string of digits only, is taken as the tag itself.
    """
    if isinstance(version, int) or str(version).isdigit():
        return int(version)
    match = _VERSION.fullmatch(str(version).strip())
    if match is None:
        raise InferccError(
            f"cannot read TensorRT version {version!r}", "give it as major.minor.patch, e.g. 10.3.0"
        )
    major, minor, patch = int(match[1]), int(match[2]), int(match[3] or 0)
    if major >= 10:
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


# --------------------------------------------------------------------------- writing


def write_calibration_cache(
    path: str | PathLike[str],
    scales: Mapping[str, float],
    method: str = "entropy",
    trt_version: str | int = DEFAULT_TRT_VERSION,
) -> None:
    """Write `scales` (tensor name -> float32 scale) as a TensorRT calibration cache."""
    if method not in _WRITE_NAMES:
        raise InferccError(
            f"TensorRT calibration caches have no method {method!r}",
            "use 'entropy' (EntropyCalibration2) or 'minmax' (MinMaxCalibration)",
        )
    lines = [f"TRT-{trt_version_tag(trt_version)}-{_WRITE_NAMES[method]}"]
    lines.extend(_line(name, scales[name]) for name in sorted(scales))
    colons = sorted(name for name in scales if ":" in name)
    if colons:  # one line for them all: a TensorFlow export names every tensor 'x:0'
        logger.warning(
            "%d tensor name(s) in %s hold ':' (%r%s); onnxruntime's TensorRT provider misreads "
            "such cache lines",
            len(colons),
            path,
            colons[0],
            ", ..." if len(colons) > 1 else "",
        )
    _write_atomic(Path(fspath(path)), "\n".join(lines) + "\n")
    logger.info("wrote %d scale(s) to %s", len(scales), path)


def _line(name: str, scale: float) -> str:
    if not name or "\n" in name or "\r" in name:
        raise InferccError(
            f"tensor name {name!r} cannot be written to a calibration cache",
            "names must be non-empty and on one line",
        )
    return f"{name}: {scale_to_hex(scale)}"


def scale_to_hex(scale: float) -> str:
    """8 lowercase hex digits of the big-endian float32 bits of a positive finite scale."""
    value = float(scale)
    if not (math.isfinite(value) and 0.0 < value <= _FLOAT32_MAX):
        raise InferccError(
            f"scale {scale!r} is not a positive finite float32",
            "an all-zero tensor should get a tiny positive scale (observers.MIN_SCALE)",
        )
    return struct.pack(">f", value).hex()


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())  # mkstemp's 0600: the user's umask instead
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- reading


def read_calibration_cache(path: str | PathLike[str]) -> CalibrationCache:
    """Parse a TensorRT calibration cache; InferccError naming the file and line when bad."""
    file = Path(fspath(path))
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InferccError(
            f"cannot read calibration cache {str(file)!r}: {exc}", "check the path"
        ) from exc
    lines = text.splitlines()
    if not lines:
        raise InferccError(f"calibration cache {str(file)!r} is empty", _REWRITE_HINT)
    version, method = _parse_header(file, lines[0])
    scales: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        if line.strip():
            name, scale = _parse_line(file, number, line)
            if name in scales:
                raise InferccError(f"{file}:{number}: tensor {name!r} appears twice", _REWRITE_HINT)
            scales[name] = scale
    return CalibrationCache(version, method, scales)


_REWRITE_HINT = "regenerate the cache with infercc calibrate or TensorRT"


def _parse_header(file: Path, line: str) -> tuple[int, str]:
    match = _HEADER.fullmatch(line.strip())
    if match is None or match[2] not in _READ_NAMES:
        raise InferccError(
            f"{file}:1: {line[:60]!r} is not a TensorRT calibration cache header",
            "the first line must be TRT-<version>-EntropyCalibration2 or "
            "TRT-<version>-MinMaxCalibration",
        )
    return int(match[1]), _READ_NAMES[match[2]]


def _parse_line(file: Path, number: int, line: str) -> tuple[str, float]:
    name, sep, digits = line.rpartition(": ")
    digits = digits.strip()
    if not sep or not name or _HEX.fullmatch(digits) is None:
        raise InferccError(
            f"{file}:{number}: {line[:60]!r} is not 'tensor_name: <8 hex digits>'", _REWRITE_HINT
        )
    scale = struct.unpack(">f", int(digits, 16).to_bytes(4, "big"))[0]
    if not (math.isfinite(scale) and scale > 0.0):
        raise InferccError(
            f"{file}:{number}: tensor {name!r} has scale {scale}, not a positive finite number",
            _REWRITE_HINT,
        )
    return name, scale
