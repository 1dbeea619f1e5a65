"""The `none` backend: an artifact holding the optimized model and its manifest, untuned.

For users who deploy the optimized ONNX with their own runtime but want the manifest (source
hash, passes, validation, memory plan) beside it. Loading runs it with onnxruntime's defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infercc.analysis.targets import Target
from infercc.data.profiles import ShapeProfile
from infercc.precisions import BUILD_PRECISIONS
from infercc.runtime.artifact import Artifact, Runner
from infercc.runtime.backend import CompileOptions
from infercc.version import __version__


class NoneBackend:
    name = "none"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def version(self) -> str:
        return __version__

    def precisions(self, target: Target) -> tuple[str, ...]:
        return BUILD_PRECISIONS

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        return {"name": self.name, "version": self.version(), "files": [], "points": []}

    def load(self, artifact: Artifact) -> Runner:
        from infercc.backends.ort import default_runner

        return default_runner(artifact.model_path)
