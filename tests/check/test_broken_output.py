"""A model infercc wrote that onnxruntime cannot load or run is infercc's failure: exit 1, said
so, with the pass that broke it named by a bisection that runs by itself when it is cheap (or
the command that runs it) — never "bad input, check the model with onnx.checker"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from infercc import api
from infercc.check.candidates import validate_candidate
from infercc.cli.app import main
from infercc.passes.manager import REGISTRY, PassResult, register_pass

UNKNOWN_OP = "test-unknown-op"
BAKE = "test-bake-shape"

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 4] x) => (float[batch, 4] y) {
  a = Relu(x)
  shape = Shape(a)
  b = Reshape(a, shape)
  y = Neg(b)
}
"""


def _unknown_op(graph, ctx):
    """Breaks the model: Neg becomes an op no runtime has."""
    n = 0
    for node in list(graph.nodes):
        if node.op_type == "Neg" and ctx.allow_rewrite(node):
            node.op_type = "NoSuchOp"
            n += 1
    return PassResult(changed=n > 0, stats={"broken": n})


def _bake_shape(graph, ctx):
    """Bakes Shape(a) at the profile's shape: the Reshape then fails at another batch."""
    n = 0
    for node in list(graph.nodes):
        shapes = ctx.option("shapes")
        if node.op_type == "Shape" and shapes and ctx.allow_rewrite(node):
            const = graph.make_constant(np.array(shapes["x"], np.int64), "baked")
            graph.replace_all_uses_with(node.output, const)
            graph.remove(node)
            n += 1
    return PassResult(changed=n > 0, stats={"baked": n})


@pytest.fixture
def with_pass(monkeypatch):
    """Appends a deliberately broken test pass to optimize's first stage."""
    stages = api.pipelines
    added: list[str] = []

    def use(name: str, fn, first: bool = False, reads: tuple[str, ...] = ()) -> None:
        """`first`: before the stage's passes (which would otherwise remove what it breaks);
        `reads`: the context options it declares."""
        register_pass(name, reads=reads)(fn)
        added.append(name)

        def staged(s: tuple[str, ...]) -> tuple[str, ...]:
            return (name, *s) if first else (*s, name)

        monkeypatch.setattr(
            api,
            "pipelines",
            lambda cfg: [staged(s) if i == 0 else s for i, s in enumerate(stages(cfg))],
        )

    yield use
    for name in added:
        REGISTRY.pop(name, None)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    proto = onnx.parser.parse_model(MODEL)
    onnx.checker.check_model(proto, full_check=True)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    return path


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["infercc", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, " ".join(captured.out.split()), captured.err


def test_an_unloadable_output_is_infercc_failure_and_the_pass_is_named(src, tmp_path, with_pass):
    with_pass(UNKNOWN_OP, _unknown_op)
    report = api.optimize(src, tmp_path / "out.onnx")
    v = report.validation
    assert not report.passed and not (tmp_path / "out.onnx").exists()
    assert v.error.startswith("onnxruntime cannot load the optimized model:")
    assert "NoSuchOp" in v.error and v.outputs == {}
    assert report.bisect["guilty_pass"] == UNKNOWN_OP and report.bisect["reproduced"]
    assert report.bisect["rewrite_op"] == "Neg" and report.bisect_hint is None
    data = json.loads(json.dumps(report.to_dict()))
    assert data["validation"]["error"] == v.error and data["bisect"]["guilty_pass"] == UNKNOWN_OP


def test_cli_exit_1_says_it_is_infercc_and_names_the_pass(
    src, tmp_path, with_pass, monkeypatch, capsys
):
    with_pass(UNKNOWN_OP, _unknown_op)
    code, out, err = run_main(
        monkeypatch, capsys, "optimize", str(src), "-o", str(tmp_path / "o.onnx")
    )
    assert code == 1
    assert "this is infercc's failure, not the input model's" in out
    assert f"pass '{UNKNOWN_OP}'" in out and "onnx.checker" not in out + err
    code, out, _ = run_main(
        monkeypatch, capsys, "optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--json"
    )
    assert code == 1


def test_a_costly_bisection_prints_the_command_that_runs_it(
    src, tmp_path, with_pass, monkeypatch, capsys
):
    with_pass(UNKNOWN_OP, _unknown_op)
    monkeypatch.setattr(api, "AUTO_BISECT_SECONDS", 0.0)
    out_path = str(tmp_path / "o.onnx")
    code, out, _ = run_main(monkeypatch, capsys, "optimize", str(src), "-o", out_path)
    assert code == 1
    assert "rerun with --bisect to name the pass that broke it" in out
    assert f"infercc optimize {src} -o {out_path} --bisect" in out
    code, out, _ = run_main(monkeypatch, capsys, "optimize", str(src), "-o", out_path, "--bisect")
    assert code == 1 and f"pass '{UNKNOWN_OP}'" in out  # --bisect runs it however costly


def test_an_output_that_fails_to_run_at_the_second_shape(src, tmp_path, with_pass) -> None:
    # first: fold-shapes removes Reshape(a, Shape(a))
    with_pass(BAKE, _bake_shape, first=True, reads=("shapes",))
    report = api.optimize(src, tmp_path / "out.onnx")
    v = report.validation
    assert not report.passed
    assert v.error.startswith("onnxruntime failed to run the optimized model:")
    assert "Reshape" in v.error
    assert report.bisect["guilty_pass"] == BAKE


def test_validate_a_candidate_that_does_not_load_is_a_failure_not_bad_input(src, tmp_path):
    broken = onnx.load(src)
    broken.graph.node[3].op_type = "NoSuchOp"
    cand = tmp_path / "cand.onnx"
    onnx.save(broken, cand)
    report = validate_candidate(cand, src)
    assert not report.passed
    assert report.validation.error.startswith("onnxruntime cannot load the candidate:")
