"""Test-session settings: infercc's cache directory (tuning cache, host facts) is a fresh
temporary one, never the user's, unless the environment names one."""

from __future__ import annotations

import os
import tempfile

import pytest


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
