#!/usr/bin/env python3
"""Types as a check: mypy on the package (its config in pyproject.toml), against a baseline.

    python .ci/mypy_check.py            fail on any mypy error not in .ci/mypy-baseline.txt,
                                        and on baseline lines mypy no longer reports
    python .ci/mypy_check.py --update   rewrite the baseline to what mypy reports now: only
                                        ever smaller (refused when an error is new)

The baseline holds one line per error, `path: message  [code]` without the line number (so an
edit above an old error does not make it new), sorted; the same line twice is two errors. It
may only shrink: a new error fails the check, a fixed one too until its line is removed (with
--update), so the file always says what is left. Errors in ZERO_ERRORS (the IR and the passes)
fail whatever the baseline says: there the count is 0 and stays 0.

mypy runs on this interpreter, with the versions .ci/constraints.txt pins (mypy's own among
them): other versions of numpy's or onnx's stubs report other errors.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline.txt"
ZERO_ERRORS = ("src/infercc/ir/", "src/infercc/passes/")

# `path:line: error: message  [code]` (mypy's --show-error-codes form; notes are not errors)
_ERROR = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+)(?::\d+)?: error: (?P<rest>.*)$")


def errors(output: str) -> list[str]:
    """The baseline lines for mypy's output: one per error, without its line number."""
    found = []
    for line in output.splitlines():
        m = _ERROR.match(line.strip())
        if m:
            found.append(f"{m['path'].replace(chr(92), '/')}: {m['rest'].strip()}")
    return sorted(found)


def compare(now: Iterable[str], baseline: Iterable[str]) -> tuple[list[str], list[str]]:
    """(errors not in the baseline, baseline lines no longer reported), counted as multisets."""
    have, allowed = Counter(now), Counter(baseline)
    return sorted((have - allowed).elements()), sorted((allowed - have).elements())


def in_zero_dirs(lines: Iterable[str]) -> list[str]:
    return [line for line in lines if line.startswith(ZERO_ERRORS)]


def read_baseline(path: Path = BASELINE) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line.strip()]


def run_mypy() -> tuple[int, str]:
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output", "--no-error-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return r.returncode, r.stdout + r.stderr


def check(now: list[str], baseline: list[str]) -> list[str]:
    """What is wrong (empty: the check passes)."""
    problems = []
    new, fixed = compare(now, baseline)
    zero = in_zero_dirs(now)
    if zero:
        problems.append(f"{len(zero)} error(s) in {', '.join(ZERO_ERRORS)}, which keep 0:")
        problems += [f"  {line}" for line in zero]
    new = [line for line in new if line not in zero]
    if new:
        problems.append(f"{len(new)} mypy error(s) not in {BASELINE.relative_to(ROOT)}:")
        problems += [f"  {line}" for line in new]
    if fixed:
        problems.append(
            f"{len(fixed)} baseline line(s) mypy no longer reports (fixed: remove them with "
            "`python .ci/mypy_check.py --update`):"
        )
        problems += [f"  {line}" for line in fixed]
    return problems


def update(now: list[str], baseline: list[str], path: Path = BASELINE) -> list[str]:
    """Write `now` as the baseline, when that only removes lines; else what would be added."""
    new, _ = compare(now, baseline)
    if new or in_zero_dirs(now):
        return sorted(set(new) | set(in_zero_dirs(now)))
    path.write_text("".join(f"{line}\n" for line in now))
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="shrink the baseline to now")
    args = parser.parse_args(argv)
    code, output = run_mypy()
    now = errors(output)
    if code not in (0, 1) or (code == 1 and not now):
        print(output.rstrip())
        print(f"mypy did not run (exit {code})", file=sys.stderr)
        return 2
    baseline = read_baseline()
    if args.update:
        grown = update(now, baseline)
        if grown:
            print("refused: the baseline may only shrink; these errors are new:")
            print("\n".join(f"  {line}" for line in grown))
            return 1
        print(f"{BASELINE.relative_to(ROOT)}: {len(baseline)} -> {len(now)} error(s)")
        return 0
    problems = check(now, baseline)
    if problems:
        print("\n".join(problems))
        return 1
    print(f"mypy: {len(now)} error(s), all in the baseline (0 in {', '.join(ZERO_ERRORS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
