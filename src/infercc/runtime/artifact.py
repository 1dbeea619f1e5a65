"""Artifact directories: the optimized model, the backend's files, and a manifest.

An artifact is built in a temporary directory beside its destination and moved into place when
complete, so a crash never leaves half an artifact. An existing destination is replaced only
when it is itself an infercc artifact (it has a manifest.json); anything else is refused.

`manifest.json` (schema `infercc.manifest/1`) records what was built, from what and for what:
infercc's version, the source model's path and sha256, the passes applied, the target and the
host's fingerprint, the backend with its version and files, the shape profiles, the precision,
the tuning choices, the memory plan summary and the validation result.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infercc.backends.base import MANIFEST, MODEL_FILE, Artifact
from infercc.backends.registry import get_backend
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.util import read_schema_json
from infercc.version import __version__

SCHEMA = "infercc.manifest/1"


def check_destination(out_dir: Path) -> None:
    """Refuse a destination that is a file, or a non-empty directory that is no artifact."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InferccError(f"{out_dir} exists and is not a directory", "pick another -o path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise InferccError(
            f"{out_dir} is a non-empty directory that is not an infercc artifact",
            "give a new or empty directory (or an existing artifact to replace) with -o",
        )
    if not out_dir.parent.is_dir():
        raise InferccError(f"parent directory {out_dir.parent} does not exist", "create it first")


def staging_dir(out_dir: Path) -> Path:
    """A fresh directory beside `out_dir` (same file system, so the final move is a rename)."""
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.infercc-", dir=out_dir.parent))


def candidate_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of an artifact directory given where a model or an artifact is expected."""
    if not (directory / MANIFEST).is_file():
        raise InferccError(
            f"{str(directory)!r} is a directory without {MANIFEST}",
            "pass an .onnx file or an artifact directory built by infercc",
        )
    return read_manifest(directory)


def candidate_model_path(candidate: str | os.PathLike[str]) -> Path:
    """The .onnx file of a model or an artifact (the artifact's model.onnx)."""
    path = Path(candidate)
    if path.is_dir():
        return path / str(candidate_manifest(path).get("model") or MODEL_FILE)
    return path


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
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


def load_artifact(directory: Path):
    """The runner of an artifact, through the backend that built it."""
    artifact = open_artifact(directory)
    backend = get_backend(artifact.backend or "none")
    return backend.load(artifact)


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
) -> dict[str, Any]:
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
        "tuning": backend.get("points", []),
        "memory": memory,
        "validation": validation,
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
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
