"""`bench --profile`'s summary of onnxruntime's trace, and timing for a duration."""

from __future__ import annotations

import json

import pytest

from infercc.errors import InferccError
from infercc.runtime import timing
from infercc.runtime.kernel_profile import read_events, summarize


def _trace(runs: int) -> list[dict]:
    """`runs` runs of a Conv (300 us) and two Relus (50 us each), 1000 us apart."""
    events = []
    for r in range(runs):
        t = r * 1000
        events.append({"cat": "Session", "name": "model_run", "ts": t, "dur": 900})
        events.append(_kernel("conv", "Conv", t + 1, 300))
        events.append(_kernel("relu1", "Relu", t + 400, 50))
        events.append(_kernel("relu2", "Relu", t + 500, 50))
        events.append({"cat": "Node", "name": "conv_fence_before", "ts": t + 1, "dur": 7})
    return events


def _kernel(node: str, op: str, ts: int, dur: int) -> dict:
    return {"cat": "Node", "name": f"{node}_kernel_time", "ts": ts, "dur": dur,
            "args": {"op_name": op}}  # fmt: skip


def test_summary_is_per_timed_run_by_op_and_node() -> None:
    events = _trace(5)
    events[1]["dur"] = 100_000  # a slow first (warm-up) run must not count
    p = summarize(events, warmup=2)
    assert p.runs == 3 and p.kernel_ms == pytest.approx(0.4)
    ops = [(o.name, o.calls, round(o.ms, 6)) for o in p.ops]
    assert ops == [("Conv", 1, 0.3), ("Relu", 2, 0.1)]
    assert [o.share for o in p.ops] == pytest.approx([0.75, 0.25])
    assert [n.name for n in p.nodes] == ["conv", "relu1", "relu2"]
    assert p.nodes[0].op_type == "Conv" and p.to_dict()["ops"][0]["share"] == 0.75


def test_summary_needs_a_timed_run_and_files_are_removed(tmp_path) -> None:
    with pytest.raises(InferccError, match="no timed run"):
        summarize(_trace(2), warmup=2)
    path = tmp_path / "ort_profile.json"
    path.write_text(json.dumps(_trace(1)))
    assert len(read_events([path])) == 5 and not path.exists()


def test_a_duration_times_until_it_has_passed(monkeypatch) -> None:
    clock = iter(range(10_000))  # each reading of the clock is one second later
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    timed = timing.time_runs(lambda: None, warmup=0, iters=2, duration=5.0)
    # the 2 runs --iters asks for, then one per reading while under 5 s (1, 2, 3, 4)
    assert timed.ms.shape == (6,)
    timed = timing.interleave([lambda: 1, lambda: 2], 0, 3, block=2, duration=0.5)
    assert timed.ms.shape == (2, 3)  # the duration is short: --iters decides
