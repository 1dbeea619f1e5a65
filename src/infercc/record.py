"""A replayable record of a build: the model, the output and the `BuildConfig`, in a file.

`infercc optimize --save-config build.toml` writes one, and `infercc optimize --config FILE`
replays one (flags given on the command line win over the file's values). What `--config`
reads, TOML or JSON:

- a record, as `save_record` writes it: `model`, `output` and a `[build]` table;
- a `--json` report of `infercc optimize` (its `build`, and the model and output of its
  `run` record);
- an artifact's `manifest.json` (its `build`; the model is given on the command line, since
  the manifest's `model` is the artifact's own file);
- a bare table of `BuildConfig` keys (what a model entry of an `infercc ci` manifest holds),
  optionally with `model` and `output`.

Relative paths in a file (the model, the output, `data`, `ranges`, TensorRT plugins and the
calibration cache) are relative to the file's directory, as in ci manifests; `save_record`
writes them so.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercc.config import BuildConfig
from infercc.errors import InferccError
from infercc.util import first_line
from infercc.version import __version__

MANIFEST_SCHEMA = "infercc.manifest/1"
_RECORD_KEYS = {"command", "infercc", "model", "output", "build"}
_BUILD_PATHS = ("data",)
_TRT_PATHS = ("plugins", "calib_cache")


@dataclass(frozen=True)
class BuildRecord:
    """What a record file holds: the model and output (None when the file names none) and the
    build."""

    config: BuildConfig
    model: Path | None = None
    output: Path | None = None
    path: Path | None = None  # the file it was read from


# --------------------------------------------------------------------------- reading


def load_record(path: str | os.PathLike[str]) -> BuildRecord:
    """Read a record, a `--json` report, a manifest or a bare build table (module doc);
    InferccError naming the file and the problem otherwise."""
    path = Path(path)
    data = _read(path)
    base = path.parent
    build, model, output = _parts(path, data)
    try:
        config = BuildConfig.from_dict(build, base=base)
    except InferccError as exc:
        raise InferccError(f"--config {path}: {exc.message}", exc.hint) from None
    return BuildRecord(config, _resolve(model, base), _resolve(output, base), path)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InferccError(f"--config {str(path)!r} does not exist", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InferccError(f"cannot read --config {str(path)!r}: {first_line(exc)}") from None
    try:
        data = _parse(path, text)
    except ValueError as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise InferccError(
            f"--config {str(path)!r} is not valid {kind}: {first_line(exc)}", "fix the syntax"
        ) from None
    if not isinstance(data, dict):
        raise InferccError(f"--config {str(path)!r} holds no table", "write key = value pairs")
    return data


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".toml":
        return _tomllib().loads(text)
    return json.loads(text)


def _tomllib() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise InferccError(
                "reading TOML needs Python 3.11 or the tomli package", "pip install tomli"
            ) from None
    return tomllib


def _parts(path: Path, data: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(build table, model, output) of whichever form `data` is."""
    if data.get("schema") == MANIFEST_SCHEMA:
        return _build_of(path, data), None, None
    if isinstance(data.get("run"), Mapping):  # a --json report of optimize
        options = data["run"].get("options") or {}
        return _build_of(path, data), options.get("model"), options.get("output")
    if "build" in data:
        unknown = sorted(set(data) - _RECORD_KEYS)
        if unknown:
            raise InferccError(
                f"--config {path.name}: unknown key {unknown[0]!r}",
                "a record has model, output and a [build] table",
            )
        return _build_of(path, data), data.get("model"), data.get("output")
    build = {k: v for k, v in data.items() if k not in ("model", "output")}
    return build, data.get("model"), data.get("output")


def _build_of(path: Path, data: Mapping[str, Any]) -> Mapping[str, Any]:
    build = data.get("build")
    if not isinstance(build, Mapping):
        raise InferccError(
            f"--config {path.name} records no build (its 'build' is {type(build).__name__})",
            "give a record written by --save-config, an optimize --json report or a manifest",
        )
    return build


def _resolve(value: Any, base: Path) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InferccError(f"--config: a path must be text, got {value!r}", "fix the file")
    return Path(os.path.normpath(base / value))


# --------------------------------------------------------------------------- writing


def save_record(
    path: str | os.PathLike[str],
    model: str | os.PathLike[str] | None,
    output: str | os.PathLike[str] | None,
    config: BuildConfig,
) -> Path:
    """Write a record (TOML for a `.toml` path, else JSON), paths relative to its directory;
    written to a temporary file and renamed."""
    path = Path(path)
    base = path.parent.resolve() if path.parent.exists() else None
    if base is None:
        raise InferccError(
            f"--save-config: directory {path.parent} does not exist", "create it first"
        )
    record: dict[str, Any] = {"command": "optimize", "infercc": __version__}
    if model is not None:
        record["model"] = _relative(model, base)
    if output is not None:
        record["output"] = _relative(output, base)
    record["build"] = _relative_build(config.to_dict(), base)
    if path.suffix.lower() == ".toml":
        text = "# infercc build record: replay with `infercc optimize --config FILE`\n"
        text += toml_dumps(record)
    else:
        text = json.dumps(record, indent=1) + "\n"
    _write_atomic(path, text)
    return path


def _relative(value: str | os.PathLike[str], base: Path) -> str:
    full = Path(os.path.abspath(value))
    try:
        return Path(os.path.relpath(full, base)).as_posix()
    except ValueError:  # another drive (Windows)
        return str(full)


def _relative_build(build: dict[str, Any], base: Path) -> dict[str, Any]:
    build = dict(build)
    for key in _BUILD_PATHS:
        if build.get(key) is not None:
            build[key] = _relative(build[key], base)
    trt = dict(build.get("tensorrt") or {})
    if trt.get("plugins"):
        trt["plugins"] = [_relative(p, base) for p in trt["plugins"]]
    if trt.get("calib_cache") is not None:
        trt["calib_cache"] = _relative(trt["calib_cache"], base)
    build["tensorrt"] = trt
    return build


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- TOML


def toml_dumps(data: Mapping[str, Any]) -> str:
    """TOML text for a table of text, numbers, booleans, lists and tables (None values are
    left out: TOML has no null). Lists of tables are written inline."""
    lines: list[str] = []
    _toml_table(lines, data, ())
    return "\n".join(lines).strip("\n") + "\n"


def _toml_table(lines: list[str], table: Mapping[str, Any], path: tuple[str, ...]) -> None:
    items = [(k, v) for k, v in table.items() if v is not None]
    plain = [(k, v) for k, v in items if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in items if isinstance(v, Mapping) and v]  # {} is as absent
    if path:
        lines += ["", "[" + ".".join(_toml_key(k) for k in path) + "]"]
    lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in plain]
    for key, sub in tables:
        _toml_table(lines, sub, (*path, key))


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: Any) -> str:
    key = str(key)
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        inner = ", ".join(
            f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise InferccError(f"cannot write {value!r} to TOML", "report it")


__all__ = ["BuildRecord", "load_record", "save_record", "toml_dumps"]
