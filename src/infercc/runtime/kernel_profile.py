"""`bench --ort-profile`: onnxruntime's per-node profile, summarised as the ops that take the time.

onnxruntime writes one JSON trace per session (`SessionOptions.enable_profiling`): an event per
run (`model_run`) and per kernel (`cat` "Node", named `<node>_kernel_time`, with `args.op_name`
and `dur` in microseconds). Node names are those of the graph onnxruntime executes, after its
own optimizations (a fused `Conv` may be `conv1_nchwc`). Kernel events that start before the
end of the warm-up runs are dropped, so the figures are per timed run. Kernel times are
summed: on parallel executors their sum can exceed the wall time, so each share is of the
summed kernel time, not of the latency.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercc.errors import InferccError
from infercc.util import first_line

KERNEL_SUFFIX = "_kernel_time"
TOP_NODES = 10


@dataclass
class OpTime:
    """The time of one op type (or one node), per timed run."""

    name: str
    op_type: str
    calls: float  # kernel launches per run
    ms: float  # summed kernel time per run
    share: float  # of all kernel time

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "calls": round(self.calls, 3),
            "ms": self.ms,
            "share": round(self.share, 6),
        }


@dataclass
class Profile:
    """Where the time of `runs` timed runs went."""

    runs: int
    kernel_ms: float  # summed kernel time per run
    ops: list[OpTime] = field(default_factory=list)  # by op type, slowest first
    nodes: list[OpTime] = field(default_factory=list)  # the slowest nodes

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "kernel_ms": self.kernel_ms,
            "ops": [o.to_dict() for o in self.ops],
            "nodes": [n.to_dict() for n in self.nodes],
        }


def read_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The events of onnxruntime's profile files (each file is deleted after reading)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise InferccError(
                f"cannot read onnxruntime's profile {path}: {first_line(exc)}", "report it"
            ) from None
        finally:
            Path(path).unlink(missing_ok=True)
        events += [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
    return events


def summarize(events: Sequence[dict[str, Any]], warmup: int, top: int = TOP_NODES) -> Profile:
    """Per-run op and node times of the runs after the first `warmup` (module doc)."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    timed = runs[warmup:]
    if not timed:
        raise InferccError("onnxruntime's profile holds no timed run", "give --iters 1 or more")
    start = timed[0]["ts"]
    kernels = [
        e
        for e in events
        if e.get("cat") == "Node"
        and str(e.get("name", "")).endswith(KERNEL_SUFFIX)
        and e.get("ts", 0) >= start
    ]
    n = len(timed)
    total_us = sum(float(e.get("dur", 0)) for e in kernels)
    by_op = _group(kernels, lambda e: _op(e))
    by_node = _group(kernels, lambda e: str(e["name"])[: -len(KERNEL_SUFFIX)])
    ops = [_entry(name, name, group, n, total_us) for name, group in by_op.items()]
    nodes = [_entry(name, _op(group[0]), group, n, total_us) for name, group in by_node.items()]
    return Profile(
        runs=n,
        kernel_ms=total_us / n / 1e3,
        ops=sorted(ops, key=lambda o: (-o.ms, o.name)),
        nodes=sorted(nodes, key=lambda o: (-o.ms, o.name))[:top],
    )


def _op(event: dict[str, Any]) -> str:
    return str((event.get("args") or {}).get("op_name") or "?")


def _group(events: Iterable[dict[str, Any]], key: Any) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        groups[key(e)].append(e)
    return groups


def _entry(name: str, op_type: str, group: list[dict], runs: int, total_us: float) -> OpTime:
    us = sum(float(e.get("dur", 0)) for e in group)
    share = us / total_us if total_us else 0.0
    return OpTime(name, op_type, len(group) / runs, us / runs / 1e3, share)
