"""Artifact directories: the optimized model, the backend's files, and a manifest.

An artifact is built in a temporary directory beside its destination and moved into place when
complete, so a crash never leaves half an artifact. An existing destination is replaced only
when it is itself an infercc artifact (it has a manifest.json); anything else is refused.

`manifest.json` (schema `infercc.manifest/1`) records what was built, from what and for what:
infercc's version, the source model's path and sha256, the passes applied, the target and the
host's fingerprint, the backend with its version and files, the shape profiles, the precision,
the tuning choices, the memory plan summary, the validation result, and `build`: the
`infercc.config.BuildConfig` it was built with, as data (`BuildConfig.from_dict` reads it
back; `validate --bisect` rebuilds from it).

This module owns the format's names (`MANIFEST`, `MODEL_FILE`), `Artifact` (a directory and
its parsed manifest) and the `Runner` protocol every backend's runner keeps; `open_source` opens
a model or an artifact, and `infercc.runtime.registry.load_runner` runs it through the backend
that built it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import onnx

from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.ir.wire import read_model
from infercc.outputs import Staging, check_output_dir, record_written
from infercc.util import first_line, json_text, read_schema_json
from infercc.version import __version__

SCHEMA = "infercc.manifest/1"
MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"

Feeds = Mapping[str, np.ndarray]


@dataclass
class Artifact:
    """A built artifact: its directory and the parsed manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.path / str(self.manifest.get("model") or MODEL_FILE)

    @property
    def backend(self) -> str:
        return str(self.manifest.get("backend", {}).get("name", ""))


@runtime_checkable
class Runner(Protocol):
    """Runs a loaded artifact (or model): feeds by input name -> outputs in graph order."""

    input_names: Sequence[str]
    output_names: Sequence[str]

    def run(self, feeds: Feeds) -> list[np.ndarray]: ...


def check_destination(out_dir: Path) -> None:
    """Refuse a destination that is a file, or a non-empty directory that is no artifact, or
    one in a folder that cannot be written (missing parent directories are created later)."""
    check_output_dir(out_dir, "-o")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise InferccError(
            f"{out_dir} is a non-empty directory that is not an infercc artifact",
            "give a new or empty directory (or an existing artifact to replace) with -o",
        )


def staging_dir(out_dir: Path) -> Staging:
    """A fresh, locked directory beside `out_dir` (same file system, so the final move is a
    rename); `.path` is where to build, `.close()` removes what is left."""
    return Staging(out_dir, out_dir.name)


def candidate_model_path(candidate: str | os.PathLike[str]) -> Path:
    """The .onnx file of a model or an artifact (the model its manifest names)."""
    path = Path(candidate)
    return open_source(path).model_path if path.is_dir() else path


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / MANIFEST
    path.write_text(json_text(manifest, indent=1) + "\n")  # numbers or null, never NaN
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    missing = (
        f"{directory} has no {MANIFEST}: it is not an infercc artifact",
        "build one with infercc optimize MODEL -o DIR",
    )
    return read_schema_json(
        Path(directory) / MANIFEST, SCHEMA, missing, "rebuild the artifact with this infercc"
    )


def open_artifact(directory: Path) -> Artifact:
    directory = Path(directory)
    return Artifact(directory, read_manifest(directory))


# --------------------------------------------------------------------------- model or artifact

PLAIN_RUNTIME = "onnxruntime"  # what runs a plain .onnx file


@dataclass
class Source:
    """A model to run: a plain .onnx file, or an artifact directory (`artifact` set)."""

    path: Path
    artifact: Artifact | None = None

    @property
    def model_path(self) -> Path:
        """The .onnx file: the path itself, or the artifact's model (as its manifest names)."""
        return self.artifact.model_path if self.artifact is not None else self.path

    @property
    def backend(self) -> str:
        """The backend that runs it (onnxruntime's defaults for a plain file)."""
        return self.artifact.backend if self.artifact is not None else PLAIN_RUNTIME

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self.artifact.manifest if self.artifact is not None else None

    def skeleton(self) -> onnx.ModelProto:
        return read_skeleton(self.model_path)


def open_source(path: str | os.PathLike[str]) -> Source:
    """The one way to open "a model or an artifact": checks that the path exists, that a
    directory is an infercc artifact whose manifest names its backend."""
    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise InferccError(f"{str(path)!r} does not exist", NOT_A_SOURCE)
        return Source(path)
    if not (path / MANIFEST).is_file():
        raise InferccError(f"{str(path)!r} is a directory without {MANIFEST}", NOT_A_SOURCE)
    artifact = open_artifact(path)
    if not artifact.backend:
        raise InferccError(f"{str(path / MANIFEST)!r} names no backend", "rebuild the artifact")
    return Source(path, artifact)


NOT_A_SOURCE = "pass an .onnx file or an artifact directory built by infercc"


def read_skeleton(model_path: Path) -> onnx.ModelProto:
    """The model without its weights (raw data left in the file), or one clear error."""
    if not model_path.is_file():
        raise InferccError(f"model file {str(model_path)!r} does not exist", "check the path")
    try:
        return read_model(model_path)[0]
    except Exception as exc:  # protobuf's DecodeError, WireError and friends
        raise InferccError(
            f"cannot read ONNX model {str(model_path)!r}: {first_line(exc)}",
            "is it an .onnx file?",
        ) from exc


def manifest(
    *,
    source: Path,
    source_sha256: str,
    passes: dict[str, Any],
    target: dict[str, Any],
    host: dict[str, Any],
    backend: dict[str, Any],
    profiles: Sequence[ShapeProfile],
    precision: str,
    memory: dict[str, Any] | None,
    validation: dict[str, Any] | None,
    build: dict[str, Any] | None = None,
    static_shapes: Mapping[str, Sequence[int]] | None = None,
    assumptions: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The artifact's manifest. `static_shapes`: the input shapes --static-shapes fixed the
    model to (it is valid only for them), else None. `assumptions`: what the build assumed
    about the inputs (`infercc.assumptions`), each with the rewrites it enabled; the artifact
    is exact only on inputs that satisfy them."""
    return {
        "schema": SCHEMA,
        "infercc_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": {"path": str(source), "sha256": source_sha256},
        "model": MODEL_FILE,
        "passes": passes,
        "target": target,
        "host": host,
        "backend": backend,
        "shape_profiles": [p.to_dict() for p in profiles],
        "precision": precision,
        "build": build,
        "tuning": backend.get("points", []),
        "memory": memory,
        "validation": validation,
        "static_shapes": {k: list(v) for k, v in static_shapes.items()} if static_shapes else None,
        "assumptions": list(assumptions),
    }


def publish(staged: Path, out_dir: Path) -> None:
    """Move a complete artifact into place, replacing an older artifact at `out_dir`."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
    try:
        os.replace(staged, out_dir)
    except OSError:
        if old is not None:
            os.replace(old, out_dir)
        raise
    record_written(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
