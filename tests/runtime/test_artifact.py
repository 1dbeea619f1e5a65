"""`infercc.runtime.artifact.open_source`: the one way a model or an artifact is opened, and
`infercc.runtime.registry.load_runner`: the one way it is run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infercc import api
from infercc.errors import InferccError
from infercc.runtime.artifact import PLAIN_RUNTIME, open_source
from infercc.runtime.registry import load_runner

ENCODER = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"


def test_a_plain_model_runs_on_onnxruntime(tmp_path: Path) -> None:
    source = open_source(ENCODER)
    assert source.artifact is None and source.manifest is None
    assert source.model_path == ENCODER and source.backend == PLAIN_RUNTIME
    assert [vi.name for vi in source.skeleton().graph.input] == ["hidden_states"]
    assert load_runner(source, spinning=False).spinning is False


def test_an_artifact_opens_the_model_its_manifest_names(tmp_path: Path) -> None:
    art = tmp_path / "art"
    api.optimize(ENCODER, art, backend="none", run_validation=False)
    manifest = json.loads((art / "manifest.json").read_text())
    shutil.move(art / "model.onnx", art / "renamed.onnx")
    manifest["model"] = "renamed.onnx"
    (art / "manifest.json").write_text(json.dumps(manifest))
    source = open_source(art)
    assert source.backend == "none" and source.model_path == art / "renamed.onnx"
    assert load_runner(source).output_names


def test_what_is_not_a_model_or_an_artifact_is_named(tmp_path: Path) -> None:
    with pytest.raises(InferccError, match="does not exist"):
        open_source(tmp_path / "missing.onnx")
    with pytest.raises(InferccError, match="directory without manifest.json"):
        open_source(tmp_path)
