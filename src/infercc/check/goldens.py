"""Goldens: inputs and the reference's outputs saved once (`--save-golden DIR`), so later
validations need no reference model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from infercc.errors import InferccError
from infercc.outputs import Staging, check_output_dir, record_written
from infercc.util import read_schema_json

log = logging.getLogger(__name__)


Outputs = list[dict[str, np.ndarray]]
Feeds = list[dict[str, np.ndarray]]


GOLDEN_SCHEMA = "infercc.golden/1"
GOLDEN_FILE = "golden.json"
# --------------------------------------------------------------------------- goldens


def save_golden(
    directory: str | os.PathLike[str],
    feeds_list: Feeds,
    outputs: Outputs,
    reference: str | os.PathLike[str] | None = None,
) -> Path:
    """Write inputs and expected outputs (see the module docstring); replaces an older golden
    directory, refuses any other non-empty directory."""
    out = Path(directory)
    _check_golden_destination(out)
    with Staging(out, out.name) as staging:
        _write_golden(staging.path, feeds_list, outputs, reference)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging.path, out)
        record_written(out)
    log.info("saved %d golden sample(s) to %s", len(feeds_list), out)
    return out


def _check_golden_destination(out: Path) -> None:
    check_output_dir(out)
    if out.exists() and not out.is_dir():
        raise InferccError(f"{str(out)!r} exists and is not a directory", "pick another path")
    if out.is_dir() and any(out.iterdir()) and not (out / GOLDEN_FILE).is_file():
        raise InferccError(
            f"{str(out)!r} is a non-empty directory that holds no goldens",
            "give a new or empty directory (or an older golden directory to replace)",
        )


def _write_golden(
    stage: Path, feeds_list: Feeds, outputs: Outputs, reference: str | os.PathLike[str] | None
) -> None:
    (stage / "inputs").mkdir()
    (stage / "outputs").mkdir()
    for i, (feeds, outs) in enumerate(zip(feeds_list, outputs, strict=True)):
        np.savez(stage / "inputs" / f"sample_{i:03d}.npz", **_plain(feeds))
        np.savez(stage / "outputs" / f"sample_{i:03d}.npz", **_plain(outs))
    meta = {
        "schema": GOLDEN_SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reference": None if reference is None else str(reference),
        "reference_sha256": _sha256(reference),
        "samples": len(feeds_list),
        "inputs": list(feeds_list[0]) if feeds_list else [],
        "outputs": list(outputs[0]) if outputs else [],
    }
    (stage / GOLDEN_FILE).write_text(json.dumps(meta, indent=1) + "\n")


def _plain(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Arrays numpy can save without pickling (string tensors as unicode arrays)."""
    result = {}
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise InferccError(
                f"output {name!r} is not a tensor ({type(value).__name__})",
                "goldens hold tensors only",
            )
        result[name] = value.astype(str) if value.dtype == np.dtype(object) else value
    return result


def _sha256(path: str | os.PathLike[str] | None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_golden(directory: str | os.PathLike[str]) -> tuple[Feeds, Outputs, dict[str, Any]]:
    """Inputs, expected outputs and metadata of a golden directory."""
    root = Path(directory)
    meta = _golden_meta(root)
    inputs = _load_npz_dir(root / "inputs")
    outputs = _load_npz_dir(root / "outputs")
    if len(inputs) != len(outputs) or len(inputs) != meta.get("samples", len(inputs)):
        raise InferccError(
            f"golden directory {str(root)!r} is incomplete "
            f"({len(inputs)} input and {len(outputs)} output files)",
            "write it again with --save-golden",
        )
    return inputs, outputs, meta


def _golden_meta(root: Path) -> dict[str, Any]:
    missing = (
        f"{str(root)!r} has no {GOLDEN_FILE}: it is not a golden directory",
        "write one with infercc validate --reference MODEL --save-golden DIR",
    )
    return read_schema_json(root / GOLDEN_FILE, GOLDEN_SCHEMA, missing, "write it again")


def _load_npz_dir(directory: Path) -> list[dict[str, np.ndarray]]:
    files = sorted(directory.glob("sample_*.npz")) if directory.is_dir() else []
    result = []
    for file in files:
        try:
            with np.load(file, allow_pickle=False) as archive:
                result.append({key: archive[key] for key in archive.files})
        except (OSError, ValueError) as exc:
            raise InferccError(f"cannot read {str(file)!r}: {exc}", "write it again") from exc
    return result
