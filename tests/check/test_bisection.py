"""`infercc.check.bisection`: deliberately broken test passes, registered for these tests only,
must be named, with the rewrite and the node where outputs first diverge."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc.check.bisection import PipelineConfig, bisect, first_divergence
from infercc.check.candidates import reference_feeds
from infercc.ir import export_model, import_model
from infercc.passes import DEFAULT_PIPELINE, REGISTRY, PassContext, PassResult, run_passes
from infercc.passes.manager import register_pass
from tests.helpers import run_cli

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 8] x) => (float[1, 8] y) {
  a = Relu(x)
  b = Add(a, x)
  c = Relu(b)
  d = Mul(c, x)
  y = Relu(d)
}
"""
NAMES = ("r1", "add", "r2", "mul", "r3")
FLIP = "test-flip-second-relu"
SILENT = "test-flip-last-relu-silently"


@pytest.fixture(autouse=True)
def private_tuning_cache(tmp_path: Path, monkeypatch) -> None:
    """Artifacts built here tune into a cache of their own, never the user's."""
    monkeypatch.setenv("INFERCC_CACHE_DIR", str(tmp_path / "tuning-cache"))


def _flip_second(graph, ctx):
    """Asks before each of its (harmless) rewrites of a Relu; the one at r2 breaks the model."""
    n = 0
    for node in list(graph.nodes):
        if node.op_type == "Relu" and ctx.allow_rewrite(node):
            n += 1
            if node.name == "r2":
                node.op_type = "Sigmoid"
    return PassResult(changed=False, stats={"rewritten": n})


def _flip_silently(graph, ctx):
    """Breaks r3 without asking `ctx.allow_rewrite`: bisected by runs only."""
    for node in list(graph.nodes):
        if node.name == "r3" and node.op_type == "Relu":
            node.op_type = "Sigmoid"
            return PassResult(changed=True, stats={"flipped": 1})
    return PassResult(changed=False)


@pytest.fixture(autouse=True)
def broken_passes():
    register_pass(FLIP)(_flip_second)
    register_pass(SILENT)(_flip_silently)
    yield
    REGISTRY.pop(FLIP, None)
    REGISTRY.pop(SILENT, None)


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    model = onnx.parser.parse_model(MODEL)
    for node, name in zip(model.graph.node, NAMES, strict=True):
        node.name = name
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "ref.onnx"
    onnx.save(model, path)
    return path


def config_with(test_pass: str) -> PipelineConfig:
    return PipelineConfig(stages=[(*DEFAULT_PIPELINE, test_pass)])


def test_bisect_names_the_pass_the_rewrite_and_the_node(reference: Path) -> None:
    report = bisect(reference, reference_feeds(reference), config_with(FLIP))
    assert report.reproduced
    assert report.guilty_pass == FLIP
    assert report.suspects == [FLIP]
    assert report.granularity == "rewrite"
    assert (report.total, report.first_bad) == (3, 2)  # r1 harmless, r2 broken, r3 after
    assert (report.rewrite_node, report.rewrite_op) == ("r2", "Relu")
    d = report.divergence
    assert (d.node, d.op_type, d.tensor) == ("r2", "Sigmoid", "c")
    assert (d.reference_node, d.reference_op) == ("r2", "Relu")
    assert d.cosine < 0.9999
    assert FLIP in report.message and "'r2'" in report.message
    json.dumps(report.to_dict(), allow_nan=False)


def test_bisect_falls_back_to_runs_for_a_pass_without_the_hook(reference: Path) -> None:
    report = bisect(reference, reference_feeds(reference), config_with(SILENT))
    assert report.guilty_pass == SILENT
    assert report.granularity == "run"
    assert report.first_bad == 1
    assert report.rewrite_node is None
    assert (report.divergence.node, report.divergence.op_type) == ("r3", "Sigmoid")


def test_bisect_of_a_candidate_built_otherwise_does_not_reproduce(reference: Path) -> None:
    proto = onnx.load(reference)
    model = import_model(proto)
    run_passes(model, PassContext(), [SILENT])
    candidate = export_model(model)
    report = bisect(reference, reference_feeds(reference), PipelineConfig(), candidate=candidate)
    assert not report.reproduced
    assert report.guilty_pass is None
    assert "rebuilt" in report.message
    assert (report.divergence.node, report.divergence.reference_op) == ("r3", "Relu")


def test_first_divergence_is_none_for_equal_models(reference: Path) -> None:
    feeds = reference_feeds(reference)[0]
    tol = {"atol": 1e-6, "rtol": 1e-6, "min_cosine": 0.9999}
    assert first_divergence(reference, reference, feeds, tol) is None


def test_allow_rewrite_counts_and_stops_at_the_limit() -> None:
    ctx = PassContext()
    ctx.current_pass = "p"
    node = import_model(onnx.parser.parse_model(MODEL)).graph.nodes[0]
    assert all(ctx.allow_rewrite(node) for _ in range(3))  # no limit: always yes
    ctx.rewrite_limits = {"p": 4}
    assert [ctx.allow_rewrite(node) for _ in range(2)] == [True, False]
    assert len(ctx.rewrites["p"]) == 4


def test_run_limits_cut_a_pass_after_its_first_runs() -> None:
    calls = []

    def counting(graph, ctx):
        calls.append(1)
        return PassResult(changed=len(calls) < 5)

    register_pass("test-counting")(counting)
    try:
        model = import_model(onnx.parser.parse_model(MODEL))
        ctx = PassContext(run_limits={"test-counting": 2})
        report = run_passes(model, ctx, ["test-counting"])
        assert len(calls) == 2
        assert report.passes["test-counting"].runs == 2
    finally:
        REGISTRY.pop("test-counting", None)


def test_cli_bisect_of_a_hand_broken_candidate(reference: Path, tmp_path: Path) -> None:
    broken = onnx.load(reference)
    broken.graph.node[2].op_type = "Sigmoid"  # r2
    cand = tmp_path / "cand.onnx"
    onnx.save(broken, cand)
    r = run_cli("validate", str(cand), "--reference", str(reference), "--bisect", "--json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["passed"] is False
    assert data["bisect"]["reproduced"] is False  # infercc's pipeline does not do that
    assert data["bisect"]["divergence"]["node"] == "r2"
    assert data["bisect"]["divergence"]["op_type"] == "Sigmoid"
    assert np.isfinite(data["bisect"]["divergence"]["max_abs"])


def test_validate_bisect_on_an_artifact_names_a_broken_default_pass(
    reference: Path, tmp_path: Path, monkeypatch
) -> None:
    """A default pass broken in place (as a real bug would be): the candidate is built by
    `optimize` into an artifact, and `validate --bisect` reads how from its manifest."""
    from infercc.api import optimize
    from infercc.check.candidates import validate_candidate
    from infercc.passes.manager import PassInfo

    original = REGISTRY["eliminate-dead-code"]

    def broken_dce(graph, ctx):
        result = original.fn(graph, ctx)
        _flip_second(graph, ctx)
        return result

    monkeypatch.setitem(
        REGISTRY, "eliminate-dead-code", PassInfo("eliminate-dead-code", broken_dce, "")
    )
    art = tmp_path / "art"
    built = optimize(reference, art, backend="ort", tune=False, run_validation=False)
    assert built.artifact is not None
    report = validate_candidate(art, reference, bisect=True)
    assert not report.passed
    b = report.bisect
    assert b.reproduced and b.guilty_pass == "eliminate-dead-code"
    assert b.rewrite_node == "r2"
    assert (b.divergence.node, b.divergence.op_type) == ("r2", "Sigmoid")


# -- real passes cut rewrite by rewrite --------------------------------------------------------

FOLD_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 8] x) => (float[1, 8] y) {
  [c1] k1 = Constant <value = float[8] {1, 2, 3, 4, 5, 6, 7, 8}> ()
  [c2] k2 = Constant <value = float[8] {0.5, 0.25, 2, 1, 3, 0.75, 1.5, 4}> ()
  [m] m = Mul(k1, k2)
  [s] s = Add(m, k1)
  [add] a = Add(x, s)
  [relu] y = Relu(a)
}
"""

NO_OPS_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 8] x) => (float[1, 8] y) {
  [id1] a = Identity(x)
  [relu] b = Relu(a)
  [id2] c = Identity(b)
  [neg] d = Neg(c)
  [id3] e = Identity(d)
  [add] y = Add(e, x)
}
"""


def _save(text: str, path: Path) -> Path:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def test_validate_bisect_names_the_rewrite_of_a_fold_constants_bug(
    tmp_path: Path, monkeypatch
) -> None:
    """fold-constants evaluates node 'm' wrongly (as a bug in one kernel would): the candidate
    is built by `optimize` into an artifact, and `validate --bisect` cuts fold-constants
    rewrite by rewrite (c1, c2, m, s) down to 'm'."""
    from infercc.api import optimize
    from infercc.check.candidates import validate_candidate
    from infercc.passes.evaluate import Evaluator

    store = Evaluator._store

    def broken(self, node, result):
        if node.name == "m" and result.arrays is not None:
            result.arrays = [a + 1 for a in result.arrays]
        store(self, node, result)

    monkeypatch.setattr(Evaluator, "_store", broken)
    reference = _save(FOLD_MODEL, tmp_path / "ref.onnx")
    art = tmp_path / "art"
    built = optimize(reference, art, backend="ort", tune=False, run_validation=False)
    assert built.artifact is not None
    report = validate_candidate(art, reference, bisect=True)
    assert not report.passed
    b = report.bisect
    assert b.reproduced and b.guilty_pass == "fold-constants"
    assert b.granularity == "rewrite"
    assert (b.total, b.first_bad) == (4, 3)
    assert (b.rewrite_node, b.rewrite_op) == ("m", "Mul")
    assert "'m'" in b.message


def test_bisect_names_the_rewrite_of_an_eliminate_no_ops_bug(tmp_path: Path, monkeypatch) -> None:
    """eliminate-no-ops forwards Identity 'id2' to the wrong value (the graph input, skipping
    the Relu): bisection names rewrite 2 of 3, at 'id2', and the Neg reading it diverges."""
    from infercc.passes import no_ops

    forward = no_ops._forward

    def broken(node, src, kind):
        if node.name == "id2":
            src = node.graph.inputs[0]
        return forward(node, src, kind)

    monkeypatch.setattr(no_ops, "_forward", broken)
    reference = _save(NO_OPS_MODEL, tmp_path / "ref.onnx")
    report = bisect(reference, reference_feeds(reference), PipelineConfig())
    assert report.reproduced and report.guilty_pass == "eliminate-no-ops"
    assert report.granularity == "rewrite"
    assert (report.total, report.first_bad) == (3, 2)
    assert (report.rewrite_node, report.rewrite_op) == ("id2", "Identity")
    assert (report.divergence.node, report.divergence.op_type) == ("neg", "Neg")


# -- rebuilding from the artifact's recorded build ----------------------------------------------

ENCODER = Path(__file__).resolve().parents[2] / "examples" / "tiny_encoder.onnx"
BUILT_WITH = ["--fp16", "--portable", "--keep-fp32", "Softmax", "--fold-limit", "1MiB"]


def test_validate_bisect_rebuilds_with_the_artifacts_recorded_settings(tmp_path: Path) -> None:
    """Built with --portable, --keep-fp32 Softmax and --fold-limit 1MiB (and --fp16, which
    --keep-fp32 needs): `validate --bisect` rebuilds with exactly those, read from
    manifest["build"], not guessed from the model. Tolerances tighter than fp16 can hold make
    the candidate fail, so bisection runs."""
    art = tmp_path / "art"
    built = run_cli("optimize", str(ENCODER), "-o", str(art), "--no-tune", *BUILT_WITH)
    assert built.returncode == 0, built.stderr
    recorded = json.loads((art / "manifest.json").read_text())["build"]
    assert recorded["portable"] is True and recorded["keep_fp32"] == ["Softmax"]
    assert recorded["fold_limit"] == 2**20 and recorded["precision"] == "fp16"
    r = run_cli(
        "validate", str(art), "--reference", str(ENCODER), "--bisect", "--json",
        "--atol", "1e-7", "--rtol", "0",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)["bisect"]
    assert report["settings"] == "manifest" and report["build"] == recorded
    assert report["reproduced"]  # the rebuild is the candidate: the failure reproduces


def test_every_rebuild_gets_the_recorded_pass_context(tmp_path: Path, monkeypatch) -> None:
    from infercc import api
    from infercc.check import bisection
    from infercc.check.candidates import validate_candidate
    from infercc.config import BuildConfig

    config = BuildConfig(
        backend="ort", tune=False, precision="fp16", portable=True, keep_fp32=("Softmax",),
        fold_limit="1MiB",
    )  # fmt: skip
    api.optimize(ENCODER, tmp_path / "art", config, cache_dir=tmp_path / "cache")
    seen: list[PassContext] = []
    real = BuildConfig.pass_context

    def spy(build, profile=None):
        seen.append(real(build, profile))
        return seen[-1]

    monkeypatch.setattr(BuildConfig, "pass_context", spy)
    assert bisection.config_for_candidate(tmp_path / "art").build == config
    report = validate_candidate(
        tmp_path / "art", ENCODER, bisect=True, atol=1e-7, rtol=0.0, min_cosine=0.9999999
    )
    assert not report.passed and report.bisect.trials == len(seen) > 1
    for ctx in seen:
        assert (ctx.portable, ctx.option("fold_limit"), ctx.backend) == (True, 2**20, "ort")
        assert ctx.option("fp16").keep_fp32 == ("Softmax",)


def test_validate_target_without_effect_is_refused(reference: Path, tmp_path: Path) -> None:
    from infercc import api
    from infercc.check.candidates import validate_candidate
    from infercc.errors import InferccError

    with pytest.raises(InferccError, match="--target has no effect without --bisect"):
        validate_candidate(reference, reference, target="a100")
    api.optimize(reference, tmp_path / "art", backend="ort", tune=False)
    with pytest.raises(InferccError, match="the artifact records its build"):
        validate_candidate(tmp_path / "art", reference, bisect=True, target="a100", atol=0.0)
