"""Loading an ort artifact: its configuration and a runner that picks the session per shape."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infercc.backends.ort.config import (
    CONFIG_FILE,
    CPU,
    OPTIMIZED_FILE,
    REFERENCE_LEVEL,
    SCHEMA,
    _config_only,
    _create_session,
    _require_ort,
    _version,
    config_key,
    default_config,
    disabled_optimizers,
)
from infercc.backends.ort.tuner import _fingerprint
from infercc.data.signature import real_inputs
from infercc.errors import InferccError
from infercc.ir.wire import read_model
from infercc.runtime.artifact import MODEL_FILE, Feeds
from infercc.runtime.ort_support import load_refusal
from infercc.util import first_line

try:
    import onnxruntime as ort
except ImportError:  # the core dependency, but a broken install must give a reason
    ort = None


log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- loading


def read_config(directory: Path) -> dict[str, Any]:
    """The artifact's ort_config.json; InferccError when it is missing or of another schema."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise InferccError(
            f"{directory} has no {CONFIG_FILE}: it was not built by the ort backend",
            "rebuild it with `infercc optimize MODEL -o DIR --backend ort`",
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InferccError(f"cannot read {path}: {exc}", "rebuild the artifact") from exc
    schema = config.get("schema") if isinstance(config, dict) else None
    if schema != SCHEMA or not config.get("points"):
        raise InferccError(
            f"{path} has schema {schema!r}, this infercc reads {SCHEMA!r}",
            "rebuild the artifact with this version of infercc",
        )
    return config


def _usable_optimized(directory: Path, config: Mapping[str, Any]) -> dict | None:
    """The optimized-model description with its path, when it was made on this host."""
    optimized = config.get("optimized_model")
    if not optimized or not (Path(directory) / optimized["file"]).is_file():
        return None
    if config.get("onnxruntime") != _version() or optimized.get("fingerprint") != _fingerprint():
        log.info(
            "%s was written on another host or onnxruntime: using %s", OPTIMIZED_FILE, MODEL_FILE
        )
        return None
    return {**optimized, "path": Path(directory) / optimized["file"]}


class OrtRunner:
    """Runs an ort artifact: one session per distinct configuration, created on first use;
    each call uses the point whose shapes equal the feeds' shapes, else the default point."""

    def __init__(
        self,
        model: Path,
        points: Sequence[Mapping[str, Any]],
        default: int = 0,
        optimized: Mapping[str, Any] | None = None,
    ):
        if not Path(model).is_file():
            raise InferccError(f"model file {str(model)!r} does not exist", "check the path")
        proto = read_model(Path(model))[0]
        self.input_names = [vi.name for vi in real_inputs(proto)]
        self.output_names = [o.name for o in proto.graph.output]
        self.points = list(points)
        self.default = default
        self._model = Path(model)
        self._optimized = optimized
        self._sessions: dict[str, Any] = {}
        # Idle intra-op threads spin after a run by default (good for back-to-back latency);
        # a comparison that interleaves two runners turns it off so neither starves the other.
        self.spinning = True
        # Set (a path prefix): new sessions record onnxruntime's profile (`bench --ort-profile`).
        self.profile_prefix: str | None = None

    def end_profiling(self) -> list[Path]:
        """Stop profiling every session; the JSON profile files onnxruntime wrote."""
        return [Path(s.end_profiling()) for s in self._sessions.values() if self.profile_prefix]

    def select(self, feeds: Feeds) -> int:
        """Index of the point whose shapes equal the feeds' shapes, else the default's."""
        for index, point in enumerate(self.points):
            shapes = point.get("shapes") or {}
            if shapes and all(
                name in feeds and tuple(np.shape(feeds[name])) == tuple(dims)
                for name, dims in shapes.items()
            ):
                return index
        return self.default

    def run(self, feeds: Feeds) -> list[np.ndarray]:
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise InferccError(
                f"no value for model input(s) {', '.join(map(repr, missing))}",
                "feed every input the model declares",
            )
        session = self._session(self.points[self.select(feeds)])
        try:
            return session.run(None, {name: feeds[name] for name in self.input_names})
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InferccError(
                f"onnxruntime failed to run the model: {first_line(exc)}",
                "check the input shapes (--shape) and the batch size (--batch)",
            ) from exc

    def _session(self, point: Mapping[str, Any]) -> Any:
        model, config = self._source(point)
        if not self.spinning:
            config["session_config"] = {
                "session.intra_op.allow_spinning": "0",
                "session.inter_op.allow_spinning": "0",
            }
        if self.profile_prefix:
            config["profile_prefix"] = self.profile_prefix
        key = config_key({"model": str(model), **config})
        if key not in self._sessions:
            try:
                session = _create_session(model, config)
            except Exception as exc:  # onnxruntime raises its own exception types
                raise load_refusal(repr(str(model)), exc) from exc
            if point.get("tuning_results"):
                session.set_tuning_results(point["tuning_results"], error_on_invalid=False)
            self._sessions[key] = session
        return self._sessions[key]

    def _source(self, point: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
        """The model file and configuration a point runs with (the optimized file when it was
        made for this provider and level; it is then loaded with optimization off)."""
        config = _config_only(point)
        opt = self._optimized
        level = config["session_options"]["graph_optimization_level"]
        if (
            opt is not None
            and opt["provider"] == config["provider"]
            and opt["provider_options"] == config["provider_options"]
            and opt["graph_optimization_level"] == level
            and disabled_optimizers(opt) == config["disabled_optimizers"]
        ):
            # onnxruntime's optimized graph already went through the fusions chosen
            config["session_options"]["graph_optimization_level"] = REFERENCE_LEVEL
            config["disabled_optimizers"] = []
            return Path(opt["path"]), config
        return self._model, config


def default_runner(model_path: str | os.PathLike[str]) -> OrtRunner:
    """A runner for a plain .onnx file: onnxruntime's default options on the CPU provider."""
    _require_ort()
    point = {"name": "default", "shapes": {}, **default_config(CPU)}
    return OrtRunner(Path(model_path), [point])
