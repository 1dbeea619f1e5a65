"""A longer differential fuzzing run than the test suite's (the same generator and properties).

    python bench/fuzz.py [--examples 5000] [--int-width 1000] [--seed 0] [--idempotence-every 5]
                         [--jobs 1]

Runs `tests/test_fuzz.py`'s properties with many more examples and a seed of your choice:
random graphs optimized with the default pipeline (cpu target and portable) must give
onnxruntime's outputs of the original; one example in every `--idempotence-every` (chosen by a
checksum of the model, so hypothesis' replays while shrinking choose the same ones) is checked
for determinism (two optimizes, byte-identical files) and idempotence (optimizing the result
changes no byte). Prints the number of examples run, the ops they covered, how often each
pass fired, and the first failure (hypothesis shrinks it) with its model in ONNX text.
`--jobs J` runs J processes, process i with seed `seed + i` and its share of the examples,
and adds up their counts. Exit status 1 on a failure.

`--int-width N` then runs N examples of `tests/integration/width_fuzz.py`: int32 and int64
shape arithmetic over two input lengths and constants near the width's limits (products near
2**31 and 2**63), checked under onnxruntime at lengths where it wraps (32768, 46341, 65537,
2**23 + 1) and at small ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import onnx
from hypothesis import HealthCheck, given, seed, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.test_fuzz import (  # noqa: E402  (after the path is set)
    check_deterministic_and_idempotent,
    check_outputs_match,
    models,
)
from tests.integration.width_fuzz import check_width_outputs, width_models  # noqa: E402


class Tally:
    """What the run covered."""

    def __init__(self) -> None:
        self.examples = 0
        self.width_examples = 0
        self.idempotence = 0
        self.ops: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()
        self.last: onnx.ModelProto | None = None

    def note(self, model: onnx.ModelProto) -> None:
        self.examples += 1
        if self.examples % 100 == 0:
            print(f"  {self.examples} examples", file=sys.stderr, flush=True)
        self.last = model
        self.ops.update(n.op_type for n in model.graph.node)

    def fired_in(self, report) -> None:
        for name, stats in report.passes.items():
            self.fired[name] += int(stats.changed > 0)
            for key, n in stats.counts.items():
                if n and key not in ("refused",):
                    self.fired[f"  {name}: {key}"] += 1


def run(examples: int, seed_value: int, every: int, tally: Tally) -> None:
    if examples <= 0:
        return

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(models())
    def prop(case):
        model, feeds = case
        tally.note(model)
        tally.fired_in(check_outputs_match(model, feeds))
        if every and zlib.crc32(model.SerializeToString()) % every == 0:
            tally.idempotence += 1
            check_deterministic_and_idempotent(model)

    prop()


def run_widths(examples: int, seed_value: int, tally: Tally) -> None:
    """The integer-width cases (module docstring)."""
    if examples <= 0:
        return

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(width_models())
    def prop(model):
        tally.width_examples += 1
        tally.last = model
        tally.ops.update(n.op_type for n in model.graph.node)
        tally.fired_in(check_width_outputs(model))

    prop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--int-width", type=int, default=1000, metavar="N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--idempotence-every", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a shard's result
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.jobs > 1:
        return _shards(args)
    tally = Tally()
    t0 = time.perf_counter()
    failure = None
    try:
        run(args.examples, args.seed, args.idempotence_every, tally)
        run_widths(args.int_width, args.seed, tally)
    except Exception as e:  # hypothesis re-raises the shrunk failure
        failure = e
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps(_shard_result(tally, failure, seconds)))
        return 1 if failure is not None else 0
    return _print(tally, args.seed, seconds, failure)


def _shard_result(tally: Tally, failure: Exception | None, seconds: float) -> dict:
    text = None
    if failure is not None:
        text = _describe(failure)
        if tally.last is not None:
            text += "\n" + onnx.printer.to_text(tally.last)
    return {
        "examples": tally.examples,
        "width_examples": tally.width_examples,
        "idempotence": tally.idempotence,
        "ops": dict(tally.ops),
        "fired": dict(tally.fired),
        "failure": text,
        "seconds": seconds,
    }


def _shards(args) -> int:
    t0 = time.perf_counter()
    share = [args.examples // args.jobs + (i < args.examples % args.jobs) for i in range(args.jobs)]
    widths = [
        args.int_width // args.jobs + (i < args.int_width % args.jobs) for i in range(args.jobs)
    ]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--examples",
                str(n),
                "--seed",
                str(args.seed + i),
                "--int-width",
                str(w),
                "--idempotence-every",
                str(args.idempotence_every),
                "--json",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, (n, w) in enumerate(zip(share, widths, strict=True))
    ]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    tally = Tally()
    failures = []
    for r in results:
        tally.examples += r["examples"]
        tally.width_examples += r["width_examples"]
        tally.idempotence += r["idempotence"]
        tally.ops.update(r["ops"])
        tally.fired.update(r["fired"])
        if r["failure"]:
            failures.append(r["failure"])
    seconds = time.perf_counter() - t0
    seeds = f"{args.seed}..{args.seed + args.jobs - 1}"
    _print(tally, seeds, seconds, None)
    for text in failures:
        print(f"FAILED: {text}")
    return 1 if failures else 0


def _describe(failure: BaseException) -> str:
    """The failure and, for a group (hypothesis' Flaky and multiple-failure reports), each
    exception inside it."""
    text = f"{type(failure).__name__}: {str(failure)[:2000]}"
    for inner in getattr(failure, "exceptions", ()):
        text += "\n  " + _describe(inner).replace("\n", "\n  ")
    return text


def _print(tally: Tally, seed, seconds: float, failure: Exception | None) -> int:
    print(f"examples run: {tally.examples} (incl. shrinking), seed {seed}, {seconds:.0f} s")
    print(f"integer-width examples run: {tally.width_examples}")
    print(f"determinism + idempotence checked on: {tally.idempotence}")
    print("ops covered: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.ops.items())))
    print("examples where a pass fired:")
    for name, n in sorted(tally.fired.items(), key=lambda kv: kv[0].replace("  ", "~")):
        print(f"  {name} {n}")
    if failure is not None:
        print(f"FAILED: {_describe(failure)}")
        if tally.last is not None:
            print(onnx.printer.to_text(tally.last))
        return 1
    print("no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
