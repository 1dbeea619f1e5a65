"""README.md and docs/*.md: every code block marked runnable still runs (docs/README.md,
"Runnable examples", defines the marker), the README's dependency list is pyproject.toml's,
relative links point at files that exist, and the README stays a short page."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import run_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pyproject.toml requires tomli on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200

FENCE = re.compile(r"^(`{3,})(.*)$")
MARKER = re.compile(r"^(bash|python) runnable(?: exit=(\d+))?$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info, start, body = opening.group(1), opening.group(2).strip(), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{page.relative_to(ROOT)}:{start}: code block never closed"
        found.append(Block(page, start, info, "\n".join(body)))
        i += 1
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if "runnable" in b.info]


def commands(block: Block) -> list[list[str]]:
    """The infercc command lines of a `bash runnable` block, as argument lists (continued
    lines joined, comments dropped). Any other command fails: the marker promises that the
    whole block runs."""
    joined = block.text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        args = shlex.split(line, comments=True)
        if not args:
            continue
        assert args[0] == "infercc", (
            f"{block.where}: a `bash runnable` block holds infercc commands only, not {line!r}"
        )
        out.append(args)
    assert out, f"{block.where}: a runnable block with no command"
    return out


def sandbox(tmp_path: Path) -> Path:
    """A directory laid out as the repository root is for a newcomer: a copy of examples/
    (the models, the pictures, the CI manifest), without what earlier runs wrote there."""
    work = tmp_path / "work"
    shutil.copytree(
        ROOT / "examples",
        work / "examples",
        ignore=shutil.ignore_patterns("build", "__pycache__", "*.opt.onnx", "*.memory_plan.json"),
    )
    return work


def run_block(block: Block, work: Path) -> None:
    marker = MARKER.match(block.info)
    assert marker, (
        f"{block.where}: {block.info!r} is not a runnable marker: write 'bash runnable', "
        "'bash runnable exit=N' or 'python runnable' (docs/README.md, Runnable examples)"
    )
    language, expected = marker.group(1), int(marker.group(2) or 0)
    if language == "python":
        assert expected == 0, f"{block.where}: exit=N is for bash blocks"
        code = compile(block.text, block.where, "exec")
        saved = os.getcwd()
        os.chdir(work)
        try:
            exec(code, {"__name__": "__main__"})
        finally:
            os.chdir(saved)
        return
    for args in commands(block):
        result = run_cli(*args[1:], cwd=work)
        assert result.returncode == expected, (
            f"{block.where}: `{shlex.join(args)}` exited {result.returncode}, "
            f"the block states {expected}\n--- stdout\n{result.stdout[-3000:]}"
            f"\n--- stderr\n{result.stderr[-3000:]}"
        )


PAGES_WITH_RUNNABLE = [p for p in PAGES if runnable(p)]


@pytest.mark.parametrize("page", PAGES_WITH_RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_runnable_block_of_the_page_runs(page, tmp_path):
    work = sandbox(tmp_path)
    for block in runnable(page):
        run_block(block, work)


def test_a_runnable_block_that_fails_is_reported_with_its_place(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```bash runnable\ninfercc optimize examples/absent.onnx\n```\n\n"
        "```bash runnable exit=2\ninfercc optimize examples/absent.onnx\n```\n"
        "```sh runnable\ninfercc passes\n```\n"
        "```bash runnable\npip install infercc\n```\n"
    )
    wrong, right, misspelt, foreign = runnable(page)
    work = sandbox(tmp_path)
    with pytest.raises(AssertionError, match=r"page.md:3: .* exited 2, the block states 0"):
        run_block(_rooted(wrong, tmp_path), work)
    run_block(_rooted(right, tmp_path), work)
    with pytest.raises(AssertionError, match="'sh runnable' is not a runnable marker"):
        run_block(_rooted(misspelt, tmp_path), work)
    with pytest.raises(AssertionError, match="infercc commands only"):
        run_block(_rooted(foreign, tmp_path), work)


def _rooted(block: Block, tmp_path: Path) -> Block:
    """The block, as if its page were in the repository (for `where`)."""
    return Block(ROOT / block.page.relative_to(tmp_path), block.line, block.info, block.text)


def test_continued_lines_and_comments_make_one_command():
    block = Block(README, 1, "bash runnable", "infercc optimize a.onnx \\\n    --fp16  # note\n")
    assert commands(block) == [["infercc", "optimize", "a.onnx", "--fp16"]]


def test_the_readme_runs_one_command_per_job_on_a_cpu_host():
    found = [b for b in runnable(README)]
    lines = [" ".join(args) for b in found if b.info.startswith("bash") for args in commands(b)]
    jobs = {
        "GPU fp16": lambda c: c.startswith("infercc optimize") and "--target a100 --fp16" in c,
        "a transformer on the CPU": lambda c: "tiny_encoder" in c and "optimize" in c,
        "int8 from images": lambda c: "calibrate" in c and "--int8" in c and "images" in c,
        "int4": lambda c: "calibrate" in c and "--int4" in c,
        "a CI step": lambda c: c.startswith("infercc ci ") and "--junit" in c,
    }
    missing = [job for job, test in jobs.items() if not any(test(c) for c in lines)]
    # the workflow's own step, shown beside it, is run by tests/ci/test_example_workflow.py
    workflow = (ROOT / "examples" / "ci" / "github-actions.yml").read_text()
    (step,) = re.findall(r"^\s+(infercc ci .+)$", workflow.replace("\n          --", " --"), re.M)
    assert f"\n{step}\n" in README.read_text(), "the README shows the workflow's CI step"
    assert not missing, f"no runnable README command for: {', '.join(missing)}"
    python = [b for b in found if b.info == "python runnable"]
    assert len(python) == 1 and "import infercc" in python[0].text
    code = [line for line in python[0].text.splitlines() if line.strip()]
    assert len(code) <= 5, "the Python API in five lines"


def test_the_readme_is_a_short_page():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest goes to docs/"


def _paragraph(text: str, start: str) -> str:
    (match,) = re.findall(rf"^{re.escape(start)}.*?(?:\n\n|\Z)", text, re.M | re.S)
    return match


def test_the_readme_states_pyprojects_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stated = re.findall(r"`([^`]+)`", _paragraph(README.read_text(), "Dependencies"))
    assert stated == project["dependencies"]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0).lower()


def test_the_readme_states_pyprojects_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    paragraph = _paragraph(README.read_text(), "Extras:")
    stated = {
        name: sorted(p.strip().lower() for p in packages.split(","))
        for name, packages in re.findall(r"`infercc\[(\w+)\]` \(([^)]*)\)", paragraph)
    }
    assert stated == {name: sorted(_name(r) for r in reqs) for name, reqs in extras.items()}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page):
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to -."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert not {p for p in pages if f"]({p})" not in index}
