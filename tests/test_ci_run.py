""".ci/run: the Pythons it proves the README on, and how it finds (or misses) an interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "run"


def _constant(name: str) -> str:
    match = re.search(rf"^{name}=(\d+\.\d+)", SCRIPT.read_text(), re.M)
    assert match, f"{name}= not found in .ci/run"
    return match.group(1)


def test_the_pythons_ci_proves_are_the_ones_the_package_and_readme_name():
    oldest, newest = _constant("OLDEST"), _constant("NEWEST")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'requires-python = ">={oldest}"' in pyproject
    assert f'target-version = "py{oldest.replace(".", "")}"' in pyproject
    assert f"Python {oldest} to {newest}" in (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_commands_verbatim():
    readme = (ROOT / "README.md").read_text()
    script = SCRIPT.read_text()
    for name in ("INSTALL_CMD", "TEST_CMD"):
        (command,) = re.findall(rf"^{name}='(.+)'$", script, re.M)
        assert f"\n{command}\n" in readme, f"{name} is not a README command"


def _find(version: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--find", version], capture_output=True, text=True, timeout=60
    )


def test_find_names_what_it_looked_for_when_a_python_is_missing():
    r = _find("3.99")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("no Python 3.99 found (looked for python3.99 on PATH, ")
    assert "versions/3.99.*" in r.stderr and "uv python find 3.99" in r.stderr


def test_find_gives_an_interpreter_of_the_version_asked_for():
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    r = _find(version)
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    got = subprocess.run(
        [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.stdout.strip() == version
