"""Test-session settings: infercc's cache directory (tuning cache, host facts) is a fresh
temporary one, never the user's, unless the environment names one; models built once per
session and shared (`optimized`); and a time budget that is seen: at the end of a run, every
test whose call (or setup) took over `SLOW_TEST_S` seconds is listed (a report, never a
failure: timings depend on the host)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infercc.analysis.targets import CPU_CLASS_ENV
from tests.helpers import Built

# A test of the default run should take less; one that takes more is listed at the end of the
# run, to be made cheaper or marked `slow` (with a fast sibling in the default run).
SLOW_TEST_S = 2.0

_over_budget: list[tuple[float, str, str]] = []


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir():
    if os.environ.get("INFERCC_CACHE_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="infercc-test-cache-") as tmp:
        os.environ["INFERCC_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            os.environ.pop("INFERCC_CACHE_DIR", None)


# int8 builds in tests take one form on every host: the x86-avx2 row's 7-bit weights, which
# onnxruntime's int8 kernels compute exactly on every x86-64 (with or without VNNI) and arm64
# CPU, unless the environment states a row (INFERCC_CPU_CLASS). And the int8 kernel check
# answers "no kernel is wrong here", so that which nodes are quantized does not depend on the
# host either. tests/calib/test_kernels.py runs the real check with the host's own row.
TEST_CPU_CLASS = "x86-avx2"


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The host first: its CPU and CPU row (what int8 speed and kernels depend on), and the
    row the tests' int8 builds take on every host."""
    from infercc.analysis.targets import host_cpu_info

    info, cores = host_cpu_info()
    detected = info.detected_row
    row = detected.name if detected else "no CPU row"
    stated = os.environ.get(CPU_CLASS_ENV) or TEST_CPU_CLASS
    return [
        f"host: {info.model}, {cores} cores, {info.arch}, CPU class {row} "
        f"(flags: {' '.join(info.features) or 'none known'})",
        f"int8 builds in tests take the {stated} row's form on every host ({CPU_CLASS_ENV})",
    ]


@pytest.fixture(scope="session", autouse=True)
def _one_int8_form_on_every_host():
    if os.environ.get(CPU_CLASS_ENV):
        yield
        return
    os.environ[CPU_CLASS_ENV] = TEST_CPU_CLASS
    try:
        yield
    finally:
        os.environ.pop(CPU_CLASS_ENV, None)


@pytest.fixture(scope="session", autouse=True)
def _no_broken_int8_kernel():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("infercc.calib.job.broken_kernels", lambda *args, **kwargs: {})
        yield


@pytest.fixture(scope="session")
def optimized(
    tmp_path_factory: pytest.TempPathFactory, _private_cache_dir: None
) -> Iterator[Callable[[Path], Built]]:
    """`optimized(source)`: `api.optimize(source, verify=True)` with every other option at its
    default, built once per session per source (the examples and the zoo models several test
    modules read) into a session folder. The output is shared: tests read it and never write
    it; at the end of the session each output is checked unchanged (an error if not)."""
    from infercc import api

    root = tmp_path_factory.mktemp("optimized")
    built: dict[Path, Built] = {}
    digests: dict[Path, str] = {}

    def build(source: Path) -> Built:
        source = Path(source).resolve()
        if source not in built:
            out = root / f"{len(built)}-{source.stem}.onnx"
            report = api.optimize(source, out, verify=True)
            built[source] = Built(source, out, report)
            digests[out] = hashlib.sha256(out.read_bytes()).hexdigest()
        return built[source]

    yield build
    changed = [
        str(out) for out, d in digests.items() if hashlib.sha256(out.read_bytes()).hexdigest() != d
    ]
    assert not changed, f"a test wrote a shared optimized model: {changed}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call") and report.duration > SLOW_TEST_S:
        _over_budget.append((report.duration, report.when, report.nodeid))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _over_budget:
        return
    terminalreporter.write_sep("=", f"tests over {SLOW_TEST_S:g} s ({len(_over_budget)})")
    for seconds, when, nodeid in sorted(_over_budget, reverse=True):
        terminalreporter.write_line(f"{seconds:7.2f}s {when:<5} {nodeid}")
    total = sum(seconds for seconds, _, _ in _over_budget)
    terminalreporter.write_line(
        f"{total:.1f} s in these; make them cheaper, or mark them slow with a fast sibling "
        "(tests/README.md)"
    )
