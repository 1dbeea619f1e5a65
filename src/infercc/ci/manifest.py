"""The `infercc ci` manifest: TOML (or `[tool.infercc]` in pyproject.toml), read and checked
into a `CiConfig` of `ModelSpec`s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.config import BUILD_KEYS, BuildConfig
from infercc.data.profiles import ShapeProfile
from infercc.errors import InferccError
from infercc.util import first_line

DEFAULT_OUT_DIR = "build/infercc-ci"
BACKENDS = ("ort", "tensorrt", "none")
# Keys of a model entry that are ci's own; every other key is a `BuildConfig` key
# (`infercc.config.BUILD_KEYS`), read by `BuildConfig.from_dict`.
_CI_MODEL_KEYS = {
    "name": str,
    "path": str,
    "golden": str,
    "reference": str,
    "latency_budget_ms": float,
    "baseline": str,
    "max_slowdown": float,
    "warmup": int,
    "iters": int,
}
_NESTED = ("ort", "tensorrt")  # build keys whose value is a table, merged key by key
_CI_KEYS = {"out_dir": str, "cache_dir": str, "warmup": int, "iters": int}
_RAY_KEYS = {"shared_storage": bool, "cpus": int, "max_retries": int}
_TOP_KEYS = ("ci", "defaults", "models", "ray")

Event = Callable[[str, str], None]


# --------------------------------------------------------------------------- manifest


@dataclass
class ModelSpec:
    """One model of the manifest: its `BuildConfig` (paths resolved against the manifest)
    and what only ci uses."""

    name: str
    path: Path
    output: Path
    build: BuildConfig = field(default_factory=BuildConfig)
    golden: Path | None = None
    reference: Path | None = None
    latency_budget_ms: float | None = None
    baseline: Path | None = None
    max_slowdown: float = 1.10
    warmup: int = 5
    iters: int = 50
    cache_dir: Path | None = None

    @property
    def benched(self) -> bool:
        return self.latency_budget_ms is not None or self.baseline is not None

    @property
    def target(self) -> str:
        return self.build.target

    @property
    def backend(self) -> str | None:
        return self.build.backend

    @property
    def precision(self) -> str:
        return self.build.precision

    @property
    def profiles(self) -> list[ShapeProfile]:
        return list(self.build.shapes)

    @property
    def data(self) -> Path | None:
        return Path(self.build.data) if self.build.data is not None else None

    @property
    def tolerances(self) -> dict[str, tuple[float, float]]:
        return self.build.tolerance_map


@dataclass
class RaySettings:
    """The `[ray]` table: how `infercc ci --ray` runs the models on a cluster.

    `shared_storage`: every node sees the manifest's paths (models, samples, out_dir, cache_dir)
    at the same place, so workers read inputs and write artifacts there; otherwise inputs go to
    the workers and artifacts come back through Ray's object store. `cpus`: CPUs each model's
    task asks for. `max_retries`: how often Ray reruns a task whose node or worker was lost.
    """

    shared_storage: bool = False
    cpus: int = 1
    max_retries: int = 2


@dataclass
class CiConfig:
    path: Path
    out_dir: Path
    models: list[ModelSpec]
    ray: RaySettings = field(default_factory=RaySettings)


def load_config(path: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None):
    """Parse and check a manifest; `out_dir` overrides its `[ci] out_dir`."""
    path = Path(path)
    table = _read_table(path)
    unknown = sorted(set(table) - set(_TOP_KEYS))
    if unknown:
        _bad(path, f"unknown table {unknown[0]!r}", "the manifest has [ci], [defaults], [[models]]")
    ci = _checked(path, "[ci]", _table(path, table, "ci"), _CI_KEYS)
    defaults = _checked(path, "[defaults]", _table(path, table, "defaults"), _MODEL_KEYS)
    defaults = {k: v for k, v in defaults.items() if k not in ("name", "path")}
    base = path.parent
    root = Path(out_dir) if out_dir is not None else _join(base, ci.get("out_dir", DEFAULT_OUT_DIR))
    models = table.get("models")
    if not isinstance(models, list) or not models:
        _bad(path, "no models", "add [[models]] tables, each with a path")
    specs = [
        _model_spec(path, i, _merged(defaults, _checked(path, f"models[{i}]", m, _MODEL_KEYS)), ci)
        for i, m in enumerate(_tables(path, models))
    ]
    _check_unique(path, specs)
    for spec in specs:
        spec.output = root / spec.output
    ray = _ray_settings(path, _checked(path, "[ray]", _table(path, table, "ray"), _RAY_KEYS))
    return CiConfig(path, root, specs, ray)


def _ray_settings(path: Path, table: Mapping[str, Any]) -> RaySettings:
    settings = RaySettings(**table)
    if settings.cpus < 1:
        _bad(path, "[ray] cpus must be 1 or more", "give the CPUs each model's task needs")
    if settings.max_retries < 0:
        _bad(path, "[ray] max_retries must be 0 or more", "give how often a lost task reruns")
    return settings


def _read_table(path: Path) -> dict[str, Any]:
    tomllib = _tomllib()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InferccError(f"manifest {str(path)!r} does not exist", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InferccError(f"cannot read manifest {str(path)!r}: {exc}", "check the file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InferccError(
            f"manifest {str(path)!r} is not valid TOML: {first_line(exc)}", "fix the syntax"
        ) from None
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("infercc")
        if not isinstance(data, dict):
            _bad(path, "has no [tool.infercc] table", "add [[tool.infercc.models]] tables")
    return data


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


def _bad(path: Path, problem: str, hint: str) -> None:
    raise InferccError(f"manifest {path.name}: {problem}", hint)


def _table(path: Path, table: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        _bad(path, f"[{key}] must be a table", f"write [{key}] followed by key = value lines")
    return value


def _tables(path: Path, models: list[Any]) -> list[dict[str, Any]]:
    for i, m in enumerate(models):
        if not isinstance(m, dict):
            _bad(path, f"models[{i}] is not a table", "write each model as a [[models]] table")
    return models


def _checked(path: Path, where: str, table: Mapping[str, Any], keys: Mapping[str, Any]):
    """The table with each key known and, for ci's own keys, of its type (an int is a float
    where one is due); build keys are checked by `BuildConfig.from_dict`."""
    for key, value in table.items():
        if key not in keys:
            _bad(path, f"{where}: unknown key {key!r}", "known keys: " + ", ".join(sorted(keys)))
        expected = keys[key]
        if expected is None:
            continue
        ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
        ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            _bad(path, f"{where}: {key} must be a {expected.__name__}", f"fix {key} = ...")
    return dict(table)


_MODEL_KEYS: dict[str, Any] = {**_CI_MODEL_KEYS, **dict.fromkeys(BUILD_KEYS)}


def _merged(defaults: Mapping[str, Any], model: Mapping[str, Any]) -> dict[str, Any]:
    """The model's keys over the defaults; backend tables (ort, tensorrt) merged key by key."""
    merged = {**defaults, **model}
    for key in _NESTED:
        if isinstance(defaults.get(key), dict) and isinstance(model.get(key), dict):
            merged[key] = {**defaults[key], **model[key]}
    return merged


def _model_spec(path: Path, i: int, m: dict[str, Any], ci: Mapping[str, Any]) -> ModelSpec:
    where = f"models[{i}]"
    if "path" not in m:
        _bad(path, f"{where} has no path", 'give path = "model.onnx" (relative to the manifest)')
    base = path.parent
    name = m.get("name") or Path(m["path"]).stem
    if m.get("backend") is not None and m["backend"] not in BACKENDS:
        known = ", ".join(BACKENDS)
        _bad(path, f"{where}: backend {m['backend']!r} is not one of {known}", "pick one")
    if "latency_budget_ms" in m and not m["latency_budget_ms"] > 0:
        _bad(path, f"{where}: latency_budget_ms must be positive", "give milliseconds, e.g. 5.0")
    build = _build(path, where, {k: v for k, v in m.items() if k in BUILD_KEYS})
    return ModelSpec(
        name=name,
        path=_join(base, m["path"]),
        output=Path(f"{name}.opt.onnx" if build.backend == "none" else name),
        build=build,
        golden=_opt_path(base, m.get("golden")),
        reference=_opt_path(base, m.get("reference")),
        latency_budget_ms=_opt_float(m.get("latency_budget_ms")),
        baseline=_opt_path(base, m.get("baseline")),
        max_slowdown=float(m.get("max_slowdown", 1.10)),
        warmup=int(m.get("warmup", ci.get("warmup", 5))),
        iters=int(m.get("iters", ci.get("iters", 50))),
        cache_dir=_opt_path(base, ci.get("cache_dir")),
    )


def _build(path: Path, where: str, keys: Mapping[str, Any]) -> BuildConfig:
    """The model's BuildConfig, resolved (backend none: an .onnx file) and checked."""
    try:
        build = BuildConfig.from_dict(keys, base=path.parent)
        return build.resolve(artifact=build.backend != "none").check()
    except InferccError as exc:
        _bad(path, f"{where}: {exc.message}", exc.hint or "fix it")
        raise  # unreachable: _bad raises


def _opt_path(base: Path, value: str | None) -> Path | None:
    return None if value is None else _join(base, value)


def _join(base: Path, value: str) -> Path:
    """`value` relative to the manifest's directory, `..` collapsed for readable reports."""
    return Path(os.path.normpath(base / value))


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _check_unique(path: Path, specs: Sequence[ModelSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            _bad(path, f"two models are named {spec.name!r}", "give each model a unique name")
        seen.add(spec.name)
