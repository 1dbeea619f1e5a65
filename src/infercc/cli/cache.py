"""`infercc cache`: the tuning cache's entries."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infercc.cli.app import app, make_typer, out
from infercc.cli.common import CacheDirOpt, JsonOpt, finish
from infercc.errors import InferccError
from infercc.util import json_text

cache_app = make_typer(help="The tuning cache: what was tuned, for which model, shapes and host.")
app.add_typer(
    cache_app, name="cache", short_help="The tuning cache: list, show, clear, export, import."
)


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


@cache_app.command("ls", short_help="List the cache's entries.")
def cache_ls(cache_dir: CacheDirOpt = None, as_json: JsonOpt = False) -> None:
    """List the cache's entries (digest, backend, provider, shapes, hits)."""
    from infercc.cli.render import render_cache_entries
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir, read_only=True) as cache:
        listed = {"path": str(cache.path), "exists": cache.exists, "entries": cache.entries()}

    def render(d, console):
        if not d["exists"]:
            console.print(f"no tuning cache at {d['path']} (nothing tuned there yet)")
        else:
            render_cache_entries(d["path"], d["entries"], console)

    finish(listed, as_json, render, data=listed)


@cache_app.command("show", short_help="Print the tuning choices of entries (JSON).")
def cache_show(
    digest: Annotated[
        str, typer.Argument(metavar="DIGEST", help="An entry's digest, or its first characters.")
    ],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Print the entries whose digest starts with DIGEST, with their tuning choices (JSON)."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir, read_only=True) as cache:
        found = cache.show(digest)
    if not found:
        raise InferccError(f"no cache entry starts with {digest!r}", "infercc cache ls lists them")
    out.print_json(json_text(found))


@cache_app.command("clear")
def cache_clear(cache_dir: CacheDirOpt = None) -> None:
    """Remove every entry."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir, read_only=True) as probe:
        missing = not probe.exists  # nothing to clear: create nothing either
    if missing:
        out.print(f"removed {_entries(0)} (no tuning cache at {probe.path})")
        return
    with TuningCache(cache_dir) as cache:
        n = cache.clear()
    out.print(f"removed {_entries(n)}")


@cache_app.command("export", short_help="Write every entry to a JSON file.")
def cache_export(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="JSON file to write.")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Write every entry to a JSON file (to share tuning results across machines of one kind)."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir, read_only=True) as cache:
        n = cache.export(path)
    out.print(f"exported {_entries(n)} to {path}")


@cache_app.command("import", short_help="Merge entries from an exported file.")
def cache_import(
    path: Annotated[
        Path, typer.Argument(metavar="FILE", help="JSON file written by `infercc cache export`.")
    ],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Merge entries from an exported file (the newer entry wins on conflicts)."""
    from infercc.runtime.tuning import TuningCache

    with TuningCache(cache_dir) as cache:
        n = cache.import_(path)
    out.print(f"imported {_entries(n)} from {path}")
