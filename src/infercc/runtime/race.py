"""`--backend auto`: which backends a build races, how they are timed, and the cached choice.

The candidates are the host's CPU row's `fastest` pairs (`infercc.analysis.cpu_classes`) at
the build's own precision, among the backends installed here: a race never lowers precision
by itself (bf16 needs `--bf16`, int8 a Q/DQ model and `--int8`). Each candidate is built and
validated as a build of its own (`infercc.api`); the artifacts that validate are run
interleaved on the same inputs (`infercc.runtime.timing.interleave`, idle threads not
spinning) and the lowest median wins.

The choice is kept in the tuning cache under the source model's hash, the build's shapes,
the precision and the candidates, the backends' versions and the host fingerprint (which
holds the CPU row): a warm build builds the chosen backend alone and times nothing.

A target that is not this host (another CPU row) is not raced: a timing here says nothing of
that CPU, so its row's first candidate for the precision is built, and the race record says
why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infercc.analysis.targets import Target
from infercc.data.feeds import make_inputs
from infercc.errors import InferccError
from infercc.ir.wire import read_model
from infercc.runtime import timing
from infercc.runtime.registry import get_backend, load_runner

log = logging.getLogger(__name__)

WARMUP, ITERS = 5, 40


def candidates(target: Target, precision: str) -> tuple[list[str], list[dict[str, str]]]:
    """The backends a build of `precision` races on `target` (its row's order), and those left
    out, each with why."""
    if target.kind != "cpu" or target.cpu_class is None:
        raise InferccError(
            f"--backend auto races CPU backends; {target.name} is not a CPU of a known row",
            "give --target cpu (or a CPU row), or name the backend",
        )
    chosen: list[str] = []
    left: list[dict[str, str]] = []
    for backend, p in target.row.fastest:
        if p != precision or backend in chosen:
            continue
        ok, reason = get_backend(backend).available()
        if ok:
            chosen.append(backend)
        else:
            left.append({"backend": backend, "skipped": reason})
    if not chosen:
        rows = ", ".join(f"{b} {p}" for b, p in target.row.fastest)
        raise InferccError(
            f"--backend auto has no backend for a {precision} build on {target.row.name} "
            f"(its row races: {rows})",
            "build another precision, or name the backend",
        )
    return chosen, left


def cache_key(
    source: Path, shapes: Mapping[str, Sequence[int]], precision: str, backends: Sequence[str]
) -> Any:
    from infercc.runtime.tuning import CacheKey, file_sha256, fingerprint_hash, host_fingerprint

    versions = ";".join(f"{b} {get_backend(b).version()}" for b in backends)
    return CacheKey(
        model_hash=file_sha256(source),
        shapes=CacheKey.canonical_shapes(shapes),
        backend="auto",
        backend_version=versions,
        provider=f"{precision}:{','.join(backends)}",
        fingerprint=fingerprint_hash(host_fingerprint()),
    )


def time_artifacts(
    artifacts: Sequence[Path],
    source: Path,
    shapes: Mapping[str, Sequence[int]],
    on_step: Callable[[str], None] | None = None,
    warmup: int = WARMUP,
    iters: int = ITERS,
) -> list[float]:
    """The median milliseconds of each artifact, run interleaved on one input at `shapes`."""
    proto = read_model(source)[0]
    feeds = make_inputs(proto, {k: tuple(v) for k, v in shapes.items()})
    runners = [load_runner(a, spinning=False) for a in artifacts]
    if on_step is not None:
        on_step(f"racing {len(runners)} artifacts ({iters} interleaved runs each)")
    runs = [_call(r, feeds) for r in runners]
    timed = timing.interleave(runs, warmup, iters)
    return [round(float(np.median(row)), 4) for row in timed.ms]


def _call(runner: Any, feeds: Mapping[str, np.ndarray]) -> Callable[[], Any]:
    mine = {name: feeds[name] for name in runner.input_names if name in feeds}
    return lambda: runner.run(mine)


def choose(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The fastest record that was built and timed (None: none was)."""
    timed = [r for r in records if r.get("median_ms") is not None]
    return min(timed, key=lambda r: r["median_ms"]) if timed else None
