"""The one way infercc times runs: `bench`, `bench --compare`, the ort backend's tuner and
calibrate's int8-against-fp32 race all go through these two functions.

- `time_runs(run, warmup, iters)`: `warmup` untimed calls, then `iters` timed ones, each
  measured with `time.perf_counter_ns` around the call alone.
- `interleave(runs, warmup, iters, block)`: several callables in turn, `block` calls of each
  at a time (A A B B A A B B ... for block 2), warm-up calls in the same turns, so that every
  side sees the same machine state: thermal drift or a noisy neighbour hits all alike, and the
  per-turn ratio of two sides is what a comparison reports. `block > 1` is for runners whose
  idle threads keep spinning after a call and would slow the next side down.

Both take `duration` (seconds): timing then goes on, in whole turns, until that much time
has passed and at least `iters` calls of each side were timed (trtexec's `--duration`).

The cyclic garbage collector is paused while timing (a collection would land on a random run).
Times come back in milliseconds, never below one clock tick, so a ratio is always finite.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infercc.util import gc_paused

Tick = Callable[[], None]


@dataclass
class Timed:
    """Times in milliseconds (one row per side for `interleave`) and the outputs of the first
    call (warm-up included) and of the last call of each side."""

    ms: np.ndarray
    first: list[Any]
    last: list[Any]


def _once(run: Callable[[], Any]) -> tuple[int, Any]:
    t0 = time.perf_counter_ns()
    out = run()
    return time.perf_counter_ns() - t0, out


def _ms(ns: np.ndarray) -> np.ndarray:
    return np.maximum(ns, 1) / 1e6


def time_runs(
    run: Callable[[], Any],
    warmup: int,
    iters: int,
    tick: Tick | None = None,
    duration: float | None = None,
) -> Timed:
    """`warmup` untimed calls of `run`, then `iters` (at least one) timed ones, or with
    `duration` as many as fit in that many seconds (and at least `iters`)."""
    timed = interleave([run], warmup, iters, 1, tick, duration)
    return Timed(timed.ms[0], timed.first, timed.last)


def interleave(
    runs: Sequence[Callable[[], Any]],
    warmup: int,
    iters: int,
    block: int = 1,
    tick: Tick | None = None,
    duration: float | None = None,
) -> Timed:
    """Each of `runs` `warmup` times untimed, then `iters` times timed (with `duration`:
    until `duration` seconds have passed too), in turns of `block` calls (see the module doc);
    `tick()` after every call."""
    step = tick or (lambda: None)
    block = max(1, block)
    first: list[Any] = [None] * len(runs)
    last: list[Any] = [None] * len(runs)
    seen = [False] * len(runs)

    def call(side: int) -> int:
        ns, last[side] = _once(runs[side])
        if not seen[side]:
            first[side], seen[side] = last[side], True
        step()
        return ns

    for done in range(0, max(0, warmup), block):
        for side in range(len(runs)):
            for _ in range(min(block, warmup - done)):
                call(side)
    iters = max(1, iters)
    rows: list[list[int]] = [[] for _ in runs]
    with gc_paused():
        start, done = time.perf_counter(), 0
        while done < iters or (duration is not None and time.perf_counter() - start < duration):
            turn = block if done >= iters else min(block, iters - done)
            for side in range(len(runs)):
                rows[side] += [call(side) for _ in range(turn)]
            done += turn
    return Timed(_ms(np.array(rows, dtype=np.int64)), first, last)
