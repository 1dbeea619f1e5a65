"""The `infercc ci` manifest: TOML (or `[tool.infercc]` in pyproject.toml), read and checked
into a `CiConfig` of `ModelSpec`s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.data.profiles import ShapeProfile, parse_profile
from infercc.errors import InferccError
from infercc.precisions import BUILD_PRECISIONS
from infercc.util import first_line

DEFAULT_OUT_DIR = "build/infercc-ci"
BACKENDS = ("ort", "tensorrt", "none")
_MODEL_KEYS = {
    "name": str,
    "path": str,
    "target": str,
    "backend": str,
    "precision": str,
    "shapes": dict,
    "data": str,
    "golden": str,
    "reference": str,
    "atol": float,
    "rtol": float,
    "min_cosine": float,
    "tolerances": dict,
    "latency_budget_ms": float,
    "baseline": str,
    "max_slowdown": float,
    "disable_passes": list,
    "portable": bool,
    "warmup": int,
    "iters": int,
}
_CI_KEYS = {"out_dir": str, "cache_dir": str, "warmup": int, "iters": int}
_TOP_KEYS = ("ci", "defaults", "models")

Event = Callable[[str, str], None]


# --------------------------------------------------------------------------- manifest


@dataclass
class ModelSpec:
    """One model of the manifest, with paths resolved."""

    name: str
    path: Path
    output: Path
    target: str = "cpu"
    backend: str | None = None
    precision: str = "fp32"
    profiles: list[ShapeProfile] = field(default_factory=list)
    data: Path | None = None
    golden: Path | None = None
    reference: Path | None = None
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    latency_budget_ms: float | None = None
    baseline: Path | None = None
    max_slowdown: float = 1.10
    disable_passes: list[str] = field(default_factory=list)
    portable: bool = False
    warmup: int = 5
    iters: int = 50
    cache_dir: Path | None = None

    @property
    def benched(self) -> bool:
        return self.latency_budget_ms is not None or self.baseline is not None


@dataclass
class CiConfig:
    path: Path
    out_dir: Path
    models: list[ModelSpec]


def load_config(path: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None):
    """Parse and check a manifest; `out_dir` overrides its `[ci] out_dir`."""
    path = Path(path)
    table = _read_table(path)
    unknown = sorted(set(table) - set(_TOP_KEYS))
    if unknown:
        _bad(path, f"unknown table {unknown[0]!r}", "the manifest has [ci], [defaults], [[models]]")
    ci = _checked(path, "[ci]", _table(path, table, "ci"), _CI_KEYS)
    defaults = _checked(path, "[defaults]", _table(path, table, "defaults"), _MODEL_KEYS)
    base = path.parent
    root = Path(out_dir) if out_dir is not None else _join(base, ci.get("out_dir", DEFAULT_OUT_DIR))
    models = table.get("models")
    if not isinstance(models, list) or not models:
        _bad(path, "no models", "add [[models]] tables, each with a path")
    specs = [
        _model_spec(path, i, {**defaults, **_checked(path, f"models[{i}]", m, _MODEL_KEYS)}, ci)
        for i, m in enumerate(_tables(path, models))
    ]
    _check_unique(path, specs)
    for spec in specs:
        spec.output = root / spec.output
    return CiConfig(path, root, specs)


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


def _checked(path: Path, where: str, table: Mapping[str, Any], keys: Mapping[str, type]):
    """The table with each key known and of its type (an int is a float where one is due)."""
    for key, value in table.items():
        expected = keys.get(key)
        if expected is None:
            _bad(path, f"{where}: unknown key {key!r}", "known keys: " + ", ".join(sorted(keys)))
        ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
        ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            _bad(path, f"{where}: {key} must be a {expected.__name__}", f"fix {key} = ...")
    return dict(table)


def _model_spec(path: Path, i: int, m: dict[str, Any], ci: Mapping[str, Any]) -> ModelSpec:
    where = f"models[{i}]"
    if "path" not in m:
        _bad(path, f"{where} has no path", 'give path = "model.onnx" (relative to the manifest)')
    base = path.parent
    model = _join(base, m["path"])
    name = m.get("name") or Path(m["path"]).stem
    precision = m.get("precision", "fp32")
    backend = m.get("backend")
    _check_choice(path, where, "precision", precision, BUILD_PRECISIONS)
    if backend is not None:
        _check_choice(path, where, "backend", backend, BACKENDS)
    if "latency_budget_ms" in m and not m["latency_budget_ms"] > 0:
        _bad(path, f"{where}: latency_budget_ms must be positive", "give milliseconds, e.g. 5.0")
    return ModelSpec(
        name=name,
        path=model,
        output=Path(f"{name}.opt.onnx" if backend == "none" else name),
        target=m.get("target", "cpu"),
        backend=backend,
        precision=precision,
        profiles=_profiles(path, where, m.get("shapes", {})),
        data=_opt_path(base, m.get("data")),
        golden=_opt_path(base, m.get("golden")),
        reference=_opt_path(base, m.get("reference")),
        atol=_opt_float(m.get("atol")),
        rtol=_opt_float(m.get("rtol")),
        min_cosine=_opt_float(m.get("min_cosine")),
        tolerances=_tolerances(path, where, m.get("tolerances", {})),
        latency_budget_ms=_opt_float(m.get("latency_budget_ms")),
        baseline=_opt_path(base, m.get("baseline")),
        max_slowdown=float(m.get("max_slowdown", 1.10)),
        disable_passes=[str(p) for p in m.get("disable_passes", [])],
        portable=bool(m.get("portable", False)),
        warmup=int(m.get("warmup", ci.get("warmup", 5))),
        iters=int(m.get("iters", ci.get("iters", 50))),
        cache_dir=_opt_path(base, ci.get("cache_dir")),
    )


def _check_choice(path: Path, where: str, key: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        _bad(path, f"{where}: {key} {value!r} is not one of {', '.join(allowed)}", "pick one")


def _opt_path(base: Path, value: str | None) -> Path | None:
    return None if value is None else _join(base, value)


def _join(base: Path, value: str) -> Path:
    """`value` relative to the manifest's directory, `..` collapsed for readable reports."""
    return Path(os.path.normpath(base / value))


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _profiles(path: Path, where: str, shapes: Mapping[str, Any]) -> list[ShapeProfile]:
    profiles = []
    for name, value in shapes.items():
        if isinstance(value, list) and all(isinstance(d, int) for d in value):
            value = "x".join(str(d) for d in value)
        if not isinstance(value, str):
            _bad(path, f'{where}: shapes.{name} must be "1x3x224x224" or a list of ints', "fix it")
        try:
            profiles.append(parse_profile(f"{name}={value}"))
        except InferccError as exc:
            _bad(path, f"{where}: shapes.{name}: {exc.message}", exc.hint or "fix it")
    return profiles


def _tolerances(path: Path, where: str, table: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    from infercc.check.tolerances import parse_tolerances

    result = {}
    for name, value in table.items():
        if isinstance(value, dict) and set(value) <= {"atol", "rtol"}:
            value = f"{value.get('atol', 0.0)}:{value.get('rtol', 0.0)}"
        try:
            result.update(parse_tolerances([f"{name}={value}"]))
        except InferccError:
            _bad(
                path,
                f"{where}: tolerances.{name} = {value!r}",
                'write "ATOL:RTOL" or {atol=, rtol=}',
            )
    return result


def _check_unique(path: Path, specs: Sequence[ModelSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            _bad(path, f"two models are named {spec.name!r}", "give each model a unique name")
        seen.add(spec.name)
