"""TensorRT calibration cache files: exact format, round trip, errors, version tags."""

from __future__ import annotations

import logging
import re
import struct

import numpy as np
import pytest

from infercc.backends.trt.calib_cache import (
    read_calibration_cache,
    scale_to_hex,
    trt_version_tag,
    write_calibration_cache,
)
from infercc.errors import InferccError

LINE = re.compile(r"(.+): ([0-9a-f]{8})")


def test_version_tags() -> None:
    assert trt_version_tag("10.3.0") == 100300
    assert trt_version_tag("8.6.1") == 8601
    assert trt_version_tag("10.14.1") == 101401
    assert trt_version_tag("8.6") == 8600
    assert trt_version_tag("10.3.0.26") == 100300  # build number ignored
    assert trt_version_tag("100300") == 100300
    assert trt_version_tag(8601) == 8601
    with pytest.raises(InferccError, match="TensorRT version"):
        trt_version_tag("ten")


def test_exact_format(tmp_path) -> None:
    path = tmp_path / "calib.cache"
    write_calibration_cache(path, {"zeta": 1.0, "alpha": 0.0078125}, "entropy", "10.3.0")
    text = path.read_text()
    assert text == "TRT-100300-EntropyCalibration2\nalpha: 3c000000\nzeta: 3f800000\n"
    for line in text.splitlines()[1:]:
        assert LINE.fullmatch(line)


def test_minmax_header_and_old_version(tmp_path) -> None:
    path = tmp_path / "calib.cache"
    write_calibration_cache(path, {"x": 0.5}, "minmax", "8.6.1")
    assert path.read_text().splitlines()[0] == "TRT-8601-MinMaxCalibration"
    cache = read_calibration_cache(path)
    assert (cache.version, cache.method) == (8601, "minmax")


def test_round_trip_equals_float32_rounding(tmp_path) -> None:
    rng = np.random.default_rng(0)
    scales = {f"/layer{i}/Conv_output_0": float(v) for i, v in enumerate(rng.random(50) * 0.1)}
    path = tmp_path / "calib.cache"
    write_calibration_cache(path, scales)
    cache = read_calibration_cache(path)
    assert cache.version == 100300 and cache.method == "entropy"
    assert cache.scales == {k: float(np.float32(v)) for k, v in scales.items()}
    assert cache.dynamic_ranges()["/layer0/Conv_output_0"] == pytest.approx(
        float(np.float32(scales["/layer0/Conv_output_0"])) * 127
    )


def test_written_bytes_are_deterministic(tmp_path) -> None:
    a, b = tmp_path / "a.cache", tmp_path / "b.cache"
    write_calibration_cache(a, {"x": 0.1, "y": 0.2})
    write_calibration_cache(b, {"y": 0.2, "x": 0.1})
    assert a.read_bytes() == b.read_bytes()


def test_hex_is_big_endian_float32_bits() -> None:
    assert scale_to_hex(0.0078125) == "3c000000"
    value = 0.0123
    bits = struct.unpack(">I", struct.pack(">f", value))[0]
    assert scale_to_hex(value) == f"{bits:08x}"
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e39):
        with pytest.raises(InferccError, match="positive finite"):
            scale_to_hex(bad)


def test_names_with_colons_and_spaces_round_trip(tmp_path, caplog) -> None:
    scales = {"conv:0": 0.25, "a: b": 0.5, "with space ": 1.0, "end:": 2.0}
    path = tmp_path / "calib.cache"
    with caplog.at_level(logging.WARNING, logger="infercc.backends.trt.calib_cache"):
        write_calibration_cache(path, scales)
    assert "conv:0: 3e800000" in path.read_text().splitlines()
    assert read_calibration_cache(path).scales == scales
    flagged = [r for r in caplog.records if "onnxruntime" in r.getMessage()]
    assert len(flagged) == 1  # ':' in a name is flagged, once for all of them
    assert "3 tensor name(s)" in flagged[0].getMessage()


def test_unwritable_name_and_method(tmp_path) -> None:
    with pytest.raises(InferccError, match="cannot be written"):
        write_calibration_cache(tmp_path / "c", {"a\nb": 1.0})
    with pytest.raises(InferccError, match="no method"):
        write_calibration_cache(tmp_path / "c", {"a": 1.0}, method="percentile")
    assert not list(tmp_path.iterdir())  # nothing written, no temp file left


def test_failed_write_keeps_old_file(tmp_path) -> None:
    path = tmp_path / "calib.cache"
    write_calibration_cache(path, {"x": 1.0})
    before = path.read_bytes()
    with pytest.raises(InferccError):
        write_calibration_cache(path, {"x": 1.0, "y": float("nan")})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["calib.cache"]


@pytest.mark.parametrize(
    "header",
    ["", "TRT-abc-EntropyCalibration2", "TRT-8601-Percentile", "calibration table", "TRT-8601"],
)
def test_bad_header(tmp_path, header: str) -> None:
    path = tmp_path / "bad.cache"
    path.write_text(header + "\nx: 3c000000\n")
    with pytest.raises(InferccError, match=r"bad\.cache:1") as info:
        read_calibration_cache(path)
    assert info.value.hint


@pytest.mark.parametrize(
    "line", ["x 3c000000", "x: zz000000", "x: 3c0000001", ": 3c000000", "x: 00000000", "x:"]
)
def test_bad_line_names_file_and_line(tmp_path, line: str) -> None:
    path = tmp_path / "bad.cache"
    path.write_text(f"TRT-100300-EntropyCalibration2\nok: 3c000000\n{line}\n")
    with pytest.raises(InferccError, match=r"bad\.cache:3"):
        read_calibration_cache(path)


def test_duplicate_name_is_an_error(tmp_path) -> None:
    path = tmp_path / "dup.cache"
    path.write_text("TRT-8601-EntropyCalibration2\nx: 3c000000\nx: 3c000000\n")
    with pytest.raises(InferccError, match=r"dup\.cache:3.*twice"):
        read_calibration_cache(path)


def test_reads_tensorrt_style_files(tmp_path) -> None:
    """Short or uppercase hex, CRLF line ends, legacy calibrator names."""
    path = tmp_path / "trt.cache"
    path.write_bytes(b"TRT-7103-EntropyCalibration\r\ndata_0: 4000889D\r\ntiny: 1\r\n")
    cache = read_calibration_cache(path)
    assert (cache.version, cache.method) == (7103, "entropy-legacy")
    assert cache.scales["data_0"] == struct.unpack(">f", bytes.fromhex("4000889d"))[0]
    assert cache.scales["tiny"] == struct.unpack(">f", bytes.fromhex("00000001"))[0]


def test_missing_file(tmp_path) -> None:
    with pytest.raises(InferccError, match="cannot read calibration cache"):
        read_calibration_cache(tmp_path / "nope.cache")
