"""examples/ci/github-actions.yml can be copied as is: it installs infercc (not the user's
project) from the wheel of this version, grants the JUnit action the permission it needs, and
runs only `infercc ci` options that exist on a manifest laid out as its comment says."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"


def _steps() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc["permissions"] == {"contents": "read", "checks": "write"}
    return doc["jobs"]["models"]["steps"]


def test_installs_infercc_at_this_version_from_its_wheel_not_the_package_index():
    from infercc.version import __version__

    install = next(s["run"] for s in _steps() if s.get("name") == "Install infercc")
    assert "install ." not in install
    # no release is on the package index: `infercc==X` would fail for every user who copies it
    assert "infercc==" not in install
    wheel = f"wheels/infercc-{__version__}-py3-none-any.whl"
    assert install.split() == ["python", "-m", "pip", "install", wheel]


def test_its_infercc_ci_command_runs_on_the_example_manifest(tmp_path):
    from typer.testing import CliRunner

    from infercc.cli.app import app

    command = next(s["run"] for s in _steps() if "infercc ci" in str(s.get("run")))
    args = command.split()[1:]  # "infercc ci infercc.toml --jobs 2 ..."
    assert args[:2] == ["ci", "infercc.toml"]
    # the layout the comment describes: the manifest at the repository root, models beside it
    manifest = (ROOT / "examples" / "ci" / "infercc.toml").read_text()
    manifest = manifest.replace('"../', '"models/')
    (tmp_path / "models").mkdir()
    for model in set(re.findall(r'"models/([^"]+)"', manifest)):
        shutil.copy(ROOT / "examples" / model, tmp_path / "models" / model)
    (tmp_path / "infercc.toml").write_text(manifest)
    args[1] = str(tmp_path / "infercc.toml")
    args = [str(tmp_path / a) if a.startswith("infercc-") else a for a in args]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "infercc-junit.xml").is_file() and (
        tmp_path / "infercc-report.json"
    ).is_file()
    upload = next(s for s in _steps() if s.get("name") == "Upload the reports and artifacts")
    assert "build/infercc-ci/" in upload["with"]["path"]
    assert (tmp_path / "build" / "infercc-ci").is_dir()
