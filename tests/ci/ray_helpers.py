"""Build functions for the `--ray` tests that misbehave on purpose. They run in the workers'
child processes, so they live in an importable module (the workers get the repository on
PYTHONPATH) and find their scratch directory in `$INFERCC_TEST_RAY_DIR`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from infercc.ci.manifest import ModelSpec
from infercc.ci.results import ModelResult
from infercc.ci.runner import build_and_validate

SCRATCH_ENV = "INFERCC_TEST_RAY_DIR"
ROOT = Path(__file__).resolve().parents[2]


def scratch() -> Path:
    return Path(os.environ[SCRATCH_ENV])


def runtime_env(scratch_dir: Path, cache_dir: Path) -> dict:
    """What every test cluster's workers get: the repository and its sources importable (so a
    checkout other than the installed one runs its own code), a scratch directory,
    and a tuning cache of their own (not the driver's)."""
    return {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "src"))),
            SCRATCH_ENV: str(scratch_dir),
            "INFERCC_CACHE_DIR": str(cache_dir),
        }
    }


def crash_build(spec: ModelSpec) -> ModelResult:
    """Models named `crash*` die of a segfault, every time; the others build normally."""
    if spec.name.startswith("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(30)
    return build_and_validate(spec)


def kill_worker_once_build(spec: ModelSpec) -> ModelResult:
    """The first time a `victim*` model builds, it kills the Ray worker it runs under (as a
    lost node would end it); later attempts build normally."""
    marker = scratch() / f"{spec.name}.killed"
    if spec.name.startswith("victim") and not marker.exists():
        marker.write_text(str(os.getppid()))
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)
    return build_and_validate(spec)


def slow_build(spec: ModelSpec) -> ModelResult:
    """`slow*` models write their pid and sleep for two minutes (until cancelled)."""
    if spec.name.startswith("slow"):
        (scratch() / f"{spec.name}.pid").write_text(str(os.getpid()))
        time.sleep(120)
    return build_and_validate(spec)


def wait_for_node_then_build(spec: ModelSpec) -> ModelResult:
    """The first attempt of a `lost*` model records the raylet (the node) it runs under and
    waits, for the test to remove that node; a later attempt builds normally."""
    marker = scratch() / f"{spec.name}.raylet"
    if spec.name.startswith("lost") and not marker.exists():
        partial = marker.with_suffix(".partial")
        partial.write_text(os.environ["RAY_RAYLET_PID"])
        partial.replace(marker)  # the test never reads a marker that is not yet written
        time.sleep(120)
    return build_and_validate(spec)
