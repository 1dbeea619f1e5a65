"""Coverage of If/Loop/Scan bodies (`infercc.check.coverage`): which bodies the validation
inputs executed (measured exactly on an instrumented copy), which ones the passes rewrote, and
`--strict-coverage` failing a rewritten body that never ran."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc import api
from infercc.check import coverage
from infercc.check.candidates import validate_candidate
from infercc.check.compare import run_model
from infercc.cli.app import main

# The then branch runs only when ReduceSum(x) > 100, which random normal inputs never give;
# it holds an Add of zero that eliminate-no-ops removes and a constant fold-constants folds.
GUARDED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 4] x) => (float[batch, 4] y) {
  s = ReduceSum<keepdims = 0>(x)
  hundred = Constant<value = float {100}>()
  big = Greater(s, hundred)
  y = If(big) <then_branch = t () => (float[batch, 4] a) {
        zero = Constant<value = float {0}>()
        a0 = Add(x, zero)
        a = Mul(a0, x)
      }, else_branch = e () => (float[batch, 4] b) { b = Neg(x) }>
}
"""

# A Loop of n iterations whose body takes an If once the iteration number passes 2.
LOOP = """
<ir_version: 8, opset_import: ["" : 17]>
g (int64 n, float[4] x) => (float[4] y) {
  t = Constant<value = bool {1}>()
  y = Loop(n, t, x) <body = b (int64 i, bool c, float[4] acc) => (bool co, float[4] out) {
    co = Identity(c)
    two = Constant<value = int64 {2}>()
    late = Greater(i, two)
    out = If(late) <then_branch = tb () => (float[4] r) { r = Neg(acc) },
                    else_branch = eb () => (float[4] q) { q = Identity(acc) }>
  }>
}
"""

SCAN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] init, float[n, 4] rows) => (float[4] total, float[n, 4] partial) {
  total, partial = Scan<num_scan_inputs = 1, body = b (float[4] acc, float[4] row)
      => (float[4] next, float[4] seen) {
    next = Add(acc, row)
    seen = Identity(next)
  }>(init, rows)
}
"""


def parse(text: str, **names: str) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(text)
    for node in proto.graph.node:
        if node.op_type in names:
            node.name = names[node.op_type]
    onnx.checker.check_model(proto, full_check=True)
    return proto


def save(path: Path, proto: onnx.ModelProto) -> Path:
    onnx.save(proto, path)
    return path


def flags_of(proto: onnx.ModelProto, feeds: list[dict]) -> dict[str, bool]:
    instrumented, flags = coverage.instrument(proto)
    onnx.checker.check_model(instrumented, full_check=True)
    outs = run_model(instrumented, feeds)
    plain = run_model(proto, feeds)
    for out, ref in zip(coverage.strip(flags, outs), plain, strict=True):  # same outputs
        assert out.keys() == ref.keys()
        for name in ref:
            np.testing.assert_array_equal(out[name], ref[name])
    ran = coverage.executed(flags, outs)
    paths = {b.key: b.path for b in coverage.proto_bodies(proto)}
    return {paths[k]: v for k, v in ran.items()}


# --------------------------------------------------------------------------- measuring


@pytest.mark.parametrize(
    ("n", "ran"),
    [
        (0, {"body": False, "then": False, "else": False}),
        (2, {"body": True, "then": False, "else": True}),
        (5, {"body": True, "then": True, "else": True}),
    ],
)
def test_loop_and_nested_if_flags_are_exact(n: int, ran: dict[str, bool]) -> None:
    proto = parse(LOOP, Loop="loop")
    proto.graph.node[1].attribute[0].g.node[3].name = "late_if"
    feeds = [{"n": np.array(n, np.int64), "x": np.ones(4, np.float32)}]
    got = flags_of(proto, feeds)
    assert got == {
        "Loop 'loop' body": ran["body"],
        "Loop 'loop' body > If 'late_if' then_branch": ran["then"],
        "Loop 'loop' body > If 'late_if' else_branch": ran["else"],
    }


def test_scan_flags(tmp_path: Path) -> None:
    # (onnxruntime refuses to scan an empty input, so a Scan that runs always runs its body.)
    proto = parse(SCAN, Scan="scan")
    full = {"init": np.zeros(4, np.float32), "rows": np.ones((3, 4), np.float32)}
    assert flags_of(proto, [full]) == {"Scan 'scan' body": True}
    (body,) = coverage.proto_bodies(proto)
    assert body.how == "runs when scan input 'rows' is not empty"


def test_the_how_names_what_makes_a_body_run() -> None:
    bodies = {b.path: b.how for b in coverage.proto_bodies(parse(LOOP, Loop="loop"))}
    loop = "runs when trip count 'n' > 0 and 't' (from Constant) is true"
    assert bodies["Loop 'loop' body"] == loop
    then = next(v for k, v in bodies.items() if k.endswith("then_branch"))
    assert then == "runs when 'late' (from Greater) is true"


# --------------------------------------------------------------------------- optimize


@pytest.fixture
def guarded(tmp_path: Path) -> Path:
    return save(tmp_path / "guarded.onnx", parse(GUARDED, If="pick"))


def test_optimize_reports_a_rewritten_branch_that_never_ran(guarded: Path, tmp_path) -> None:
    report = api.optimize(guarded, tmp_path / "out.onnx")
    assert report.passed  # reported, not a failure without --strict-coverage
    c = report.validation.coverage
    then, other = c.bodies
    assert (then.path, then.rewritten, then.executed) == ("If 'pick' then_branch", True, False)
    assert then.passes == ["fold-constants", "eliminate-no-ops", "eliminate-dead-code"]
    assert (other.rewritten, other.executed) == (False, True)
    assert [b.path for b in c.unexecuted] == ["If 'pick' then_branch"]
    message = c.message()
    assert "If 'pick' then_branch" in message and "'big' (from Greater) is true" in message
    assert "--data" in message
    data = json.loads(json.dumps(report.to_dict()))["validation"]["coverage"]
    assert data["unexecuted"] == ["If 'pick' then_branch"] and data["passed"] is True


def test_strict_coverage_fails_it_and_data_that_reaches_it_passes(guarded: Path, tmp_path) -> None:
    out = tmp_path / "out.onnx"
    report = api.optimize(guarded, out, strict_coverage=True)
    assert not report.passed and report.validation.outputs_passed
    assert not out.exists() and report.bisect is None  # outputs agree: nothing to bisect
    samples = tmp_path / "samples"
    samples.mkdir()
    np.savez(samples / "big.npz", x=np.full((2, 4), 20, np.float32))
    np.savez(samples / "small.npz", x=np.zeros((2, 4), np.float32))
    report = api.optimize(guarded, out, strict_coverage=True, data=samples)
    assert report.passed and out.exists()
    assert [b.executed for b in report.validation.coverage.bodies] == [True, True]


def test_cli_strict_coverage_exit_1_naming_the_branch(guarded, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.onnx"
    monkeypatch.setattr(sys, "argv", ["infercc", "optimize", str(guarded), "-o", str(out)])
    main()
    text = capsys.readouterr().out
    assert "If 'pick' then_branch (rewritten by fold-constants" in text and "never ran" in text
    assert "--strict-coverage makes this a failure" in text
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--strict-coverage"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "never ran in rewritten body If 'pick' then_branch" in text and "--data DIR" in text


def test_validate_compares_bodies_with_the_reference(guarded: Path, tmp_path: Path) -> None:
    changed = parse(GUARDED, If="pick")
    changed.graph.node[3].attribute[0].g.node[2].op_type = "Add"  # then branch: a0 + x
    cand = save(tmp_path / "cand.onnx", changed)
    report = validate_candidate(cand, guarded)
    assert report.passed  # the branch that differs never runs: the outputs agree
    assert [b.rewritten for b in report.validation.coverage.bodies] == [True, False]
    strict = validate_candidate(cand, guarded, strict_coverage=True)
    assert not strict.passed
    same = validate_candidate(guarded, guarded, strict_coverage=True)
    assert same.passed and same.validation.coverage.unexecuted == []


def test_a_model_without_bodies_has_an_empty_coverage(tmp_path: Path) -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) { y = Relu(x) }
    """
    src = save(tmp_path / "m.onnx", parse(text))
    report = api.optimize(src, tmp_path / "out.onnx", strict_coverage=True)
    assert report.passed and report.validation.coverage.bodies == []


def test_the_tracker_names_the_passes_that_changed_a_body() -> None:
    from infercc.ir import import_model
    from infercc.passes import PassContext, run_passes

    model = import_model(parse(GUARDED, If="pick"))
    tracker = coverage.BodyTracker(model)
    run_passes(model, PassContext(), on_pass=tracker.before_pass)
    found = tracker.finish()
    assert list(found.values()) == [["fold-constants", "eliminate-no-ops", "eliminate-dead-code"]]
    ((level,),) = found.keys()
    assert level[1:] == ("pick", "then_branch")


def test_the_report_counts_main_graph_and_body_nodes_apart(guarded: Path, tmp_path) -> None:
    """The report's node count is what the file's main graph holds; If/Loop bodies apart."""
    out = tmp_path / "out.onnx"
    report = api.optimize(guarded, out)
    src, dst = onnx.load(guarded), onnx.load(out)

    def bodies(graph: onnx.GraphProto) -> int:
        return sum(
            len(a.g.node) + bodies(a.g) for n in graph.node for a in n.attribute if a.HasField("g")
        )

    assert (report.nodes_before, report.body_nodes_before) == (
        len(src.graph.node),
        bodies(src.graph),
    )
    assert (report.nodes_after, report.body_nodes_after) == (len(dst.graph.node), bodies(dst.graph))
    assert report.body_nodes_after < report.body_nodes_before  # the then branch's Add of zero
    data = report.to_dict()
    assert data["body_nodes_after"] == report.body_nodes_after
    from io import StringIO

    from rich.console import Console

    from infercc.cli.render import render_optimize

    buf = StringIO()
    render_optimize(report, Console(file=buf, width=200), level=-1)
    line = f"nodes {report.nodes_before} -> {report.nodes_after} (+{report.body_nodes_before} -> "
    assert line in buf.getvalue()
