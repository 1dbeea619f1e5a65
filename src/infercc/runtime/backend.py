"""What a backend is: the protocol that turns an optimized ONNX model into something that runs.

A backend answers `available()` with a reason when it cannot run here, says which precisions it
supports on a target, compiles an optimized model into an artifact directory for a target and
shape profiles (tuning where it can, with choices cached on disk), and loads an artifact into a
runner. `infercc.runtime.registry` finds backends by name: the built-in ones of
`infercc.backends` lazily, outside packages' through the `infercc.backends` entry-point group.
The protocol lives here, below the backends that implement it, so that the runtime and
validation open and run artifacts without importing any backend.

An artifact directory holds `model.onnx` (the optimized model), `manifest.json` (what was
built, from what, for what, and how it validated) and the backend's own files
(`infercc.runtime.artifact`: the directory, its manifest and the `Runner` protocol).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from infercc.analysis.targets import Target
from infercc.config import OrtOptions, TrtOptions
from infercc.data.profiles import ShapeProfile
from infercc.runtime.artifact import Artifact, Runner


@dataclass
class CompileOptions:
    """What a backend may need beyond the model, target and shapes (`infercc.api` makes it
    from the build's `BuildConfig`).

    `precision` is the build's (fp16: the graph was rewritten; bf16 and int8 ask TensorRT for
    more than the graph carries, see `infercc.precisions`); `atol`, `rtol` and `min_cosine`
    replace the precision's tolerances where the user gave them; `cache_dir` is where caches
    live when no tuning cache is passed to `compile`; `ort` and `tensorrt` are the typed
    options of those backends."""

    precision: str = "fp32"
    tune: bool = True
    warmup: int = 3
    iters: int = 10
    validate: bool = True
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    seed: int = 0
    cache_dir: str | None = None
    ort: OrtOptions = field(default_factory=OrtOptions)
    tensorrt: TrtOptions = field(default_factory=TrtOptions)
    on_step: Callable[[str], None] | None = None


@runtime_checkable
class Backend(Protocol):
    name: str

    def available(self) -> tuple[bool, str]:
        """(True, "") when it can run here; else (False, one line: why, and how to fix it)."""
        ...

    def version(self) -> str: ...

    def precisions(self, target: Target) -> tuple[str, ...]:
        """The precisions this backend can run on `target`."""
        ...

    def compile(
        self,
        model: Path,
        target: Target,
        shapes: Sequence[ShapeProfile],
        options: CompileOptions,
        cache: Any,
        out_dir: Path,
    ) -> dict[str, Any]:
        """Build backend files for the optimized `model` into `out_dir`; returns the manifest's
        `backend` section (name, version, files, tuning choices...). `cache` is the tuning
        cache (`infercc.runtime.tuning.TuningCache`) or None to tune without one."""
        ...

    def load(self, artifact: Artifact) -> Runner: ...
