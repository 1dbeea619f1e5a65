"""`infercc.runtime.timing`: call order, counts, outputs and the paused collector."""

from __future__ import annotations

import gc

from infercc.runtime import timing


def _recorder(log: list[str], name: str):
    def run() -> str:
        log.append(name if gc.isenabled() else name.upper())
        return f"{name}{len(log)}"

    return run


def test_interleave_runs_in_turns_of_block_with_warmup_first() -> None:
    log: list[str] = []
    ticks: list[int] = []
    timed = timing.interleave(
        [_recorder(log, "a"), _recorder(log, "b")], 2, 4, 2, lambda: ticks.append(1)
    )
    # warm-up turns with the collector on, then timed turns with it paused
    assert "".join(log) == "aabb" + "AABBAABB"
    assert timed.ms.shape == (2, 4) and (timed.ms > 0).all()
    assert timed.first == ["a1", "b3"] and timed.last == ["a10", "b12"]
    assert len(ticks) == 12


def test_time_runs_counts_and_keeps_first_and_last_outputs() -> None:
    log: list[str] = []
    timed = timing.time_runs(_recorder(log, "x"), 0, 3)
    assert log == ["X", "X", "X"] and timed.ms.shape == (3,)
    assert (timed.first[0], timed.last[0]) == ("x1", "x3")
    assert gc.isenabled()


def test_a_partial_last_block_and_at_least_one_timed_run() -> None:
    log: list[str] = []
    timing.interleave([_recorder(log, "a"), _recorder(log, "b")], 1, 3, 2)
    assert "".join(log) == "ab" + "AABBAB"
    log.clear()
    assert timing.time_runs(_recorder(log, "y"), 0, 0).ms.shape == (1,)
