"""Test-session settings: infercc's cache directory (tuning cache, host facts) is a fresh
temporary one, never the user's, unless the environment names one; int8 builds take one form
and one kernel-check answer on every host (below); and a time budget that is
seen: at the end of a run, every test whose call (or setup) took over `SLOW_TEST_S` seconds is
listed (a report, never a failure: timings depend on the host)."""

from __future__ import annotations

import os
import tempfile

import pytest

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
CPU_CLASS_ENV = "INFERCC_CPU_CLASS"


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
        mp.setattr("infercc.calib.calibrate.broken_kernels", lambda *args, **kwargs: {})
        yield


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
