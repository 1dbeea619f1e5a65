"""The pass manager: the fixpoint and its cap, final and once passes, the error naming the pass,
unknown names, and the details a pass returns beyond counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infercc.errors import InferccError, PassError
from infercc.ir import import_model
from infercc.ir.graph import IRError, Model
from infercc.passes import REGISTRY, PassContext, PassResult, register_pass, run_passes
from tests.helpers import parse

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y) {
  a = Relu(x)
  b = Neg(a)
  y = Abs(b)
}"""


@pytest.fixture
def model() -> Model:
    return import_model(parse(MODEL))


@pytest.fixture
def registered() -> Iterator[Callable[..., str]]:
    """Register test passes for one test, and remove them afterwards."""
    names: list[str] = []

    def register(name: str, fn, **kwargs) -> str:
        register_pass(name, **kwargs)(fn)
        names.append(name)
        return name

    yield register
    for name in names:
        REGISTRY.pop(name, None)


def test_a_pass_that_always_changes_stops_at_the_cap(model, registered) -> None:
    calls: list[int] = []

    def restless(graph, ctx):
        calls.append(1)
        return PassResult(changed=True, stats={"n": 1})

    name = registered("test-restless", restless)
    report = run_passes(model, PassContext(), [name], max_iterations=3)
    assert len(calls) == 3
    assert report.iterations == 3 and not report.reached_fixpoint
    assert report.passes[name].runs == 3 and report.passes[name].changed == 3
    assert report.passes[name].counts == {"n": 3}  # counts are summed over the runs


def test_the_fixpoint_is_the_first_round_without_a_change(model, registered) -> None:
    runs: list[str] = []

    def twice(graph, ctx):
        runs.append("a")
        return PassResult(changed=len(runs) <= 2)

    name = registered("test-twice", twice)
    report = run_passes(model, PassContext(), [name], max_iterations=8)
    assert report.reached_fixpoint and report.iterations == 3
    assert report.passes[name].runs == 3 and report.passes[name].changed == 2


def test_a_final_pass_runs_once_after_the_fixpoint(model, registered) -> None:
    order: list[str] = []

    def rounds(graph, ctx):
        order.append("round")
        return PassResult(changed=order.count("round") < 3)

    def last(graph, ctx):
        order.append("final")
        return PassResult(changed=True)  # a reordering: starts no new round

    a = registered("test-rounds", rounds)
    b = registered("test-final", last, final=True)
    report = run_passes(model, PassContext(), [b, a])  # listed first, still runs last
    assert order == ["round", "round", "round", "final"]
    assert report.reached_fixpoint and report.passes[b].runs == 1


def test_a_once_pass_runs_in_the_first_round_only(model, registered) -> None:
    order: list[str] = []

    def once(graph, ctx):
        order.append("once")
        return PassResult(changed=True)

    def other(graph, ctx):
        order.append("other")
        return PassResult(changed=order.count("other") < 2)

    a = registered("test-once", once, once=True)
    b = registered("test-other", other)
    report = run_passes(model, PassContext(), [a, b])
    assert order == ["once", "other", "other"]
    assert report.reached_fixpoint and report.passes[a].runs == 1


def test_an_exception_in_a_pass_names_the_pass(model, registered) -> None:
    def crash(graph, ctx):
        raise ZeroDivisionError("boom")

    name = registered("test-crash", crash)
    with pytest.raises(PassError) as info:
        run_passes(model, PassContext(), [name])
    assert "pass 'test-crash' failed: ZeroDivisionError: boom" in info.value.message
    assert "--disable-pass test-crash" in info.value.hint
    assert info.value.exit_code == 1  # infercc's failure, not bad input


def test_a_pass_that_breaks_the_graph_is_named_under_verify(model, registered) -> None:
    def dangle(graph, ctx):
        graph.nodes[1].op_type = "Neg"
        graph.outputs[0].producer = None  # an output nothing produces: lint refuses it
        return PassResult(changed=True)

    name = registered("test-dangle", dangle)
    with pytest.raises(PassError, match="pass 'test-dangle' broke the graph"):
        run_passes(model, PassContext(verify=True), [name])


def test_an_ir_error_raised_by_a_pass_is_named(model, registered) -> None:
    def bad(graph, ctx):
        raise IRError("value 'q' is read but never defined")

    name = registered("test-bad", bad)
    with pytest.raises(PassError, match="pass 'test-bad' broke the graph: value 'q'"):
        run_passes(model, PassContext(), [name])


def test_an_infercc_error_passes_through_unchanged(model, registered) -> None:
    def refuse(graph, ctx):
        raise InferccError("the model needs opset 13", "re-export it")

    name = registered("test-refuse", refuse)
    with pytest.raises(InferccError) as info:
        run_passes(model, PassContext(), [name])
    assert type(info.value) is InferccError and info.value.message == "the model needs opset 13"


@pytest.mark.parametrize("where", ["pipeline", "disabled"])
def test_unknown_pass_names_are_refused_with_the_known_ones(model, where) -> None:
    kwargs = {"pipeline": ["fold-constants", "fold-constant"]}
    if where == "disabled":
        kwargs = {"pipeline": ["fold-constants"], "disabled": ["fold-constant"]}
    with pytest.raises(InferccError) as info:
        run_passes(model, PassContext(), **kwargs)
    assert info.value.message == "unknown pass 'fold-constant'"
    assert "fold-constants" in info.value.hint and "quantize-qdq" in info.value.hint


def test_a_disabled_pass_does_not_run_and_is_not_reported(model, registered) -> None:
    calls: list[int] = []
    name = registered("test-off", lambda g, c: calls.append(1) or PassResult(False))
    report = run_passes(model, PassContext(), ["eliminate-dead-code", name], disabled=[name])
    assert calls == [] and name not in report.passes
    assert "eliminate-dead-code" in report.passes


def test_on_pass_is_told_every_run(model, registered) -> None:
    seen: list[str] = []
    report = run_passes(model, PassContext(), ["eliminate-dead-code"], on_pass=seen.append)
    assert seen == ["eliminate-dead-code"] * report.passes["eliminate-dead-code"].runs


@dataclass(frozen=True)
class _Seen:
    first: int
    last: int

    def merged(self, later: _Seen) -> _Seen:
        return _Seen(self.first, later.last)


def test_details_are_merged_over_runs_when_they_know_how(model, registered) -> None:
    runs: list[int] = []

    def mergeable(graph, ctx):
        runs.append(1)
        return PassResult(changed=len(runs) < 3, details=_Seen(len(runs), len(runs)))

    def plain(graph, ctx):
        return PassResult(changed=False, details={"run": len(runs)})

    a = registered("test-mergeable", mergeable)
    b = registered("test-plain", plain)
    report = run_passes(model, PassContext(), [a, b])
    assert report.details(a) == _Seen(1, 3)
    assert report.details(b) == {"run": 3}  # no merged(): the last run's stand
    assert report.details("fold-constants") is None  # did not run


def test_shapes_are_inferred_before_the_first_pass_and_after_a_change(registered) -> None:
    model = import_model(parse(MODEL))
    seen: list[tuple[int, ...] | None] = []

    def look(graph, ctx):
        seen.append(graph.nodes[-1].output.shape)
        return PassResult(changed=False)

    name = registered("test-look", look)
    for v in model.graph.nodes[-1].outputs:
        v.shape = None
    run_passes(model, PassContext(), [name])
    assert seen == [(2, 4)]


def test_a_pass_run_in_two_stages_reports_its_counts_summed(tmp_path):
    """--fp16 runs eliminate-dead-code in the optimize stage and again after convert-fp16: the
    report sums both stages (it kept only the last stage's counts: 0 nodes removed)."""
    import infercc

    src = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"
    fp32 = infercc.optimize(src, tmp_path / "a.onnx").passes["eliminate-dead-code"]
    fp16 = infercc.optimize(src, tmp_path / "b.onnx", precision="fp16").passes[
        "eliminate-dead-code"
    ]
    assert fp32["nodes"] == 5 and fp32["initializers"] == 16
    assert fp16["nodes"] >= fp32["nodes"] and fp16["initializers"] > fp32["initializers"]
    assert fp16["runs"] > fp32["runs"]
