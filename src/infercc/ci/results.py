"""What a ci run found, per model and in all (`to_dict()` is the JSON report)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ModelResult:
    """What happened to one model; `reason` says why it failed."""

    name: str
    path: str
    passed: bool
    reason: str | None = None
    stage: str = "compile"  # where it failed (compile, validate, bench), or done
    # The failure is an error (a crash, a missing file, an exception: no verdict on the model)
    # rather than a verdict (validation failed, over the latency budget): JUnit's <error>.
    error: bool = False
    precision: str | None = None
    target: str | None = None
    backend: str | None = None
    output: str | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    validation: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    seconds: float = 0.0
    # under `--ray`: the node that built it (host, node id, accelerator), the seconds queued
    # and running, how many attempts it took
    placement: dict[str, Any] | None = None
    build: dict[str, Any] | None = None  # the resolved BuildConfig it was built with

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "passed": self.passed,
            "reason": self.reason,
            "stage": self.stage,
            "error": self.error,
            "precision": self.precision,
            "target": self.target,
            "backend": self.backend,
            "output": self.output,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "validation": self.validation,
            "latency": self.latency,
            "seconds": round(self.seconds, 4),
            "placement": self.placement,
            "build": self.build,
        }


@dataclass
class CiReport:
    """Every model's result (`to_dict()` is the `--json` form)."""

    config: str
    out_dir: str
    jobs: int | None  # None under --ray, where Ray places the models
    models: list[ModelResult]
    seconds: float
    ray: dict[str, Any] | None = None  # the cluster a --ray run used: address, nodes
    interrupted: bool = False  # Ctrl-C: what had not finished is failed as cancelled
    run: dict[str, Any] | None = None  # what ran (the CLI's record: command, options)

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.models)

    def failures(self) -> list[ModelResult]:
        """Every model that did not pass (verdicts and errors alike)."""
        return [m for m in self.models if not m.passed]

    def errors(self) -> list[ModelResult]:
        """The models that failed by an error (a crash, a missing file), not by a verdict."""
        return [m for m in self.models if not m.passed and m.error]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "out_dir": self.out_dir,
            "jobs": self.jobs,
            "passed": self.passed,
            "total": len(self.models),
            "failed": len(self.failures()),
            "errors": len(self.errors()),
            "models": [m.to_dict() for m in self.models],
            "seconds": round(self.seconds, 4),
            "ray": self.ray,
            "interrupted": self.interrupted,
            **({"run": self.run} if self.run is not None else {}),
        }
