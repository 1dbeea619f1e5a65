""".ci/mypy_check.py, the types as a check: its baseline (which may only shrink, and holds
nothing of the IR and the passes), how it reads mypy's output and what it refuses. mypy itself
is not run here (CI's step runs it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("mypy_check", ROOT / ".ci" / "mypy_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mc = _load()

OUTPUT = """\
src/infercc/api.py:12: error: Item "None" of "X | None" has no attribute "y"  [union-attr]
src/infercc/api.py:12: note: Error code "arg-type" not covered by "type: ignore" comment
src/infercc/api.py:40: error: Item "None" of "X | None" has no attribute "y"  [union-attr]
src/infercc/cli/app.py:7:3: error: "Parameter" has no attribute "hidden"  [attr-defined]
Found 3 errors in 2 files (checked 143 source files)
"""
A = 'src/infercc/api.py: Item "None" of "X | None" has no attribute "y"  [union-attr]'
B = 'src/infercc/cli/app.py: "Parameter" has no attribute "hidden"  [attr-defined]'


def test_errors_are_one_line_each_without_line_numbers_notes_left_out():
    assert mc.errors(OUTPUT) == [A, A, B]


def test_the_check_fails_on_a_new_error_and_on_a_fixed_one():
    assert mc.check([A, A, B], [A, A, B]) == []
    new = mc.check([A, A, B], [A, B])  # a second error of the same kind is new
    assert new[0].startswith("1 mypy error(s) not in .ci/mypy-baseline.txt") and new[1] == f"  {A}"
    fixed = mc.check([A], [A, B])
    assert fixed[0].startswith("1 baseline line(s) mypy no longer reports") and B in fixed[1]


def test_an_error_in_the_ir_or_the_passes_fails_whatever_the_baseline_says():
    line = 'src/infercc/passes/cse.py: Unused "type: ignore" comment  [unused-ignore]'
    problems = mc.check([line], [line])
    assert problems[0].startswith("1 error(s) in src/infercc/ir/, src/infercc/passes/")


def test_update_only_shrinks_the_baseline(tmp_path: Path):
    path = tmp_path / "baseline.txt"
    path.write_text(f"{A}\n{B}\n")
    assert mc.update([A, A], [A, B], path) == [A]  # refused: A twice is one error more
    assert path.read_text() == f"{A}\n{B}\n"
    assert mc.update([B], [A, B], path) == []
    assert mc.read_baseline(path) == [B]


def test_the_baseline_is_sorted_one_error_a_line_and_none_in_the_ir_or_the_passes():
    lines = mc.read_baseline()
    assert lines == sorted(lines) and len(lines) < 100
    assert all(re.match(r"^src/infercc/\S+\.py: .+  \[[a-z-]+\]$", line) for line in lines)
    assert mc.in_zero_dirs(lines) == []


@pytest.mark.parametrize("where", ["pyproject.toml", ".ci/constraints.txt", ".ci/run"])
def test_mypy_is_installed_pinned_and_run_by_ci(where: str):
    text = (ROOT / where).read_text()
    wanted = {
        "pyproject.toml": r'^\s*"mypy>=[\d.]+",',
        ".ci/constraints.txt": r"^mypy==[\d.]+$",
        ".ci/run": r"^run_step .*\$MYPY_CMD",
    }[where]
    assert re.search(wanted, text, re.M), f"{where} lacks {wanted}"
