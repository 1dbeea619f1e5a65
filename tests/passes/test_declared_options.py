"""A pass declares at registration the context options it reads and the conditions it requires
and ensures; the manager enforces the options while the pass runs and checks the conditions
under verify; `infercc passes` and docs/passes.md's table are derived from the registry."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.config import BuildConfig
from infercc.errors import InferccError, PassError
from infercc.ir import import_model
from infercc.passes import OPTIONS, REGISTRY, PassContext, declarations_table, run_passes
from infercc.passes.fp16 import Fp16Settings
from infercc.passes.manager import PassResult, register_option, register_pass
from infercc.passes.pipelines import CALIBRATE_INT4, FP16, INT4, INT8, OPTIMIZE
from infercc.passes.quantize_int4 import Int4Options, Int4Settings
from tests.decoders import tiny_decoder
from tests.helpers import make_model, run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "passes.md"
BEGIN, END = "<!-- declarations: generated from the registry -->", "<!-- end declarations -->"


def relu_model(opset: int = 17):
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y])
    return import_model(make_model(graph, opset_imports=[oh.make_opsetid("", opset)]))


@pytest.fixture
def temporary_pass():
    """Register passes for one test; removed after it."""
    names: list[str] = []

    def register(name: str, fn, **declared):
        names.append(name)
        register_pass(name, **declared)(fn)
        return name

    yield register
    for name in names:
        del REGISTRY[name]


# --------------------------------------------------------------------------- options


def _reads(option: str):
    def reader(graph, ctx):
        ctx.option(option) if option in OPTIONS else getattr(ctx, option)
        return PassResult(False)

    return reader


def test_a_pass_reading_an_undeclared_option_fails(temporary_pass) -> None:
    name = temporary_pass("test-reads-fold-limit", _reads("fold_limit"))
    with pytest.raises(InferccError, match="reads option 'fold_limit' of its context, which it"):
        run_passes(relu_model(), PassContext(), [name])
    declared = temporary_pass(
        "test-declares-fold-limit", _reads("fold_limit"), reads=("fold_limit",)
    )
    ctx = PassContext()
    run_passes(relu_model(), ctx, [declared])
    assert ctx.options_read[declared] == {"fold_limit"}


def test_a_pass_that_catches_the_error_still_fails(temporary_pass) -> None:
    def swallows(graph, ctx):
        try:
            assert ctx.option("shapes") is None
        except InferccError:
            pass
        return PassResult(False)

    name = temporary_pass("test-swallows", swallows)
    with pytest.raises(InferccError, match="reads option 'shapes' of its context"):
        run_passes(relu_model(), PassContext(), [name])


def test_shared_facts_need_no_declaration_and_outside_a_pass_nothing_is_enforced(
    temporary_pass,
) -> None:
    def reader(graph, ctx):
        assert ctx.target == "cpu" and ctx.backend == "ort" and ctx.fused_ops_allowed
        return PassResult(False)

    name = temporary_pass("test-reads-shared", reader)
    ctx = PassContext()
    run_passes(relu_model(), ctx, [name])
    assert ctx.options_read[name] == {"target", "backend", "portable", "fused_ops_allowed"}
    assert ctx.option("fold_limit") > 0 and ctx.option("quantize") is None  # outside: no rule


def test_a_pass_reading_the_assumptions_directly_fails(temporary_pass) -> None:
    name = temporary_pass(
        "test-reads-assumptions", _reads("assumptions"), assumptions=(NONEMPTY_SEQUENCES,)
    )
    ctx = PassContext(assumptions=frozenset({NONEMPTY_SEQUENCES}))
    with pytest.raises(InferccError, match="reads the assumptions directly"):
        run_passes(relu_model(), ctx, [name])


def test_each_option_is_registered_by_the_module_of_the_pass_that_reads_it() -> None:
    """An option belongs to its pass's module (TVM's pass-config keys): it is registered there
    with its type and default, and every pass that declares it is defined in that module or
    reads it through that module's handle."""
    owners = {name: option.owner for name, option in OPTIONS.items()}
    assert owners == {
        "fold_limit": "infercc.passes.fold_constants",
        "fp16": "infercc.passes.fp16",
        "int4": "infercc.passes.quantize_int4",
        "outlier_channels": "infercc.passes.split_outliers",
        "quantize": "infercc.passes.quantize_qdq",
        "shapes": "infercc.passes.schedule",
    }
    for info in REGISTRY.values():
        for name in info.reads:
            assert info.fn.__module__ == owners[name], (info.name, name)
    assert PassContext().option("fp16") == Fp16Settings()  # its record's defaults
    with pytest.raises(InferccError, match="'fold_limit' is registered twice"):
        register_option("fold_limit", int, "a second owner", 1)


def test_an_option_of_the_wrong_type_or_name_is_refused() -> None:
    with pytest.raises(InferccError, match="'fold_limit' takes int, not str"):
        PassContext(options={"fold_limit": "1MiB"})
    with pytest.raises(InferccError, match="'quantise' is no pass context option"):
        PassContext(options={"quantise": None})
    with pytest.raises(InferccError, match=r"'int4' takes Int4Settings \| None, not dict"):
        PassContext().set_option("int4", {"block_size": 32})


def test_a_pass_reading_the_options_directly_fails(temporary_pass) -> None:
    def peeks(graph, ctx):
        ctx.options.get("fold_limit")
        return PassResult(False)

    name = temporary_pass("test-peeks", peeks, reads=("fold_limit",))
    with pytest.raises(InferccError, match="reads the context's options directly"):
        run_passes(relu_model(), PassContext(), [name])


def test_declaring_what_is_no_option_or_condition_is_refused_at_registration() -> None:
    with pytest.raises(InferccError, match="reads 'fp16_io', which is no registered context"):
        register_pass("test-bad-option", reads=("fp16_io",))  # now a field of the fp16 record
    with pytest.raises(InferccError, match="declares it reads 'target', which is no"):
        register_pass("test-bad-option", reads=("target",))  # shared: never declared
    with pytest.raises(InferccError, match="unknown pass condition 'shapes-ok'"):
        register_pass("test-bad-condition", requires=("shapes-ok",))
    assert "test-bad-option" not in REGISTRY and "test-bad-condition" not in REGISTRY


# --------------------------------------------------------------------------- every pass


def _run_all(ctx: PassContext, model, stages) -> set[str]:
    ran = set()
    for stage in stages:
        report = run_passes(model, ctx, stage)
        ran |= {n for n, st in report.passes.items() if st.runs}
    return ran


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict[str, set[str]]:
    """Every registered pass run with the enforcing context (verify on: requires and ensures
    checked too) on models that exercise it: the example encoder and CNN through optimize and
    fp16, a decoder through the int4 pipeline, a projection and a CNN through int8. The
    options each pass was seen reading."""
    from tests.calib.test_outliers import OUTLIER, projection
    from tests.passes.test_quantize_qdq import _settings, conv_net

    seen: dict[str, set[str]] = {}
    ran: set[str] = set()

    def run(ctx: PassContext, model, stages) -> None:
        ran.update(_run_all(ctx, model, stages))
        for name, read in ctx.options_read.items():
            seen.setdefault(name, set()).update(read & set(OPTIONS))

    for path in sorted(EXAMPLES.glob("*.onnx")):
        config = BuildConfig(verify=True, precision="fp16", ranges=(("x", -1.0, 1.0),))
        ctx = config.pass_context(None)
        model = import_model(onnx.load(path))
        run(ctx, model, [OPTIMIZE.passes, *FP16.stages])
    decoder = import_model(tiny_decoder(layers=1, norm="rms", rotary=True, kv_heads=2))
    config = BuildConfig(verify=True, assume=(NONEMPTY_SEQUENCES,))
    run(config.pass_context(None), decoder, [CALIBRATE_INT4.passes])
    int4 = Int4Settings(Int4Options(block_size=16))
    run(PassContext(options={"int4": int4}, verify=True), decoder, INT4.stages)
    _, proto = projection(tmp_path_factory.mktemp("projection"))
    split = PassContext(options={"outlier_channels": {"proj": [OUTLIER]}}, verify=True)
    run(split, import_model(proto), INT8.stages[:1])
    cnn = import_model(conv_net())
    run(PassContext(options={"quantize": _settings(cnn)}, verify=True), cnn, INT8.stages[1:])
    assert ran == set(REGISTRY), f"not exercised: {sorted(set(REGISTRY) - ran)}"
    return seen


def test_every_pass_reads_exactly_the_options_it_declares(observed) -> None:
    """Reading an undeclared option would have raised while the passes ran; here, every
    declared option was also read (no declaration is stale)."""
    for name, info in REGISTRY.items():
        assert observed.get(name, set()) == set(info.reads), name
    assert {n for n, info in REGISTRY.items() if info.reads} >= {
        "fold-constants",
        "convert-fp16",
        "schedule-memory",
        "split-outlier-channels",
        "quantize-qdq",
        "quantize-int4",
    }


# --------------------------------------------------------------------------- conditions


def _leaves_a_dead_node(graph, ctx):
    graph.make_node("Neg", [graph.inputs[0]], name="dead")
    return PassResult(True)


def test_a_pass_that_breaks_what_it_ensures_fails_under_verify(temporary_pass) -> None:
    name = temporary_pass("test-dead-node", _leaves_a_dead_node, ensures=("no-dead-nodes",))
    assert REGISTRY[name].ensures == ("lint", "no-dead-nodes")
    broke = "'test-dead-node' did not ensure no-dead-nodes: 'dead"
    with pytest.raises(PassError, match=broke) as e:
        run_passes(relu_model(), PassContext(verify=True), [name], max_iterations=1)
    assert e.value.exit_code == 1  # infercc's pass broke its promise: infercc's failure
    run_passes(relu_model(), PassContext(), [name], max_iterations=1)  # unchecked without it


def test_a_pass_given_a_graph_it_does_not_accept_fails_under_verify() -> None:
    assert REGISTRY["quantize-qdq"].requires == ("opset>=13",)
    lacks = "'quantize-qdq' requires opset>=13: the model has opset"
    with pytest.raises(PassError, match=lacks) as e:
        run_passes(relu_model(opset=11), PassContext(verify=True), ["quantize-qdq"])
    assert e.value.exit_code == 2  # the model lacks what the pass needs: bad input
    ctx = PassContext(verify=True)
    run_passes(relu_model(), ctx, ["eliminate-dead-code"])  # ensures no-dead-nodes: holds


# --------------------------------------------------------------------------- the catalogue


def test_infercc_passes_lists_every_declaration() -> None:
    r = run_cli("passes", "--json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    listed = {p["name"]: p for p in data["passes"]}
    assert set(listed) == set(REGISTRY)
    for name, info in REGISTRY.items():
        p = listed[name]
        assert (p["reads"], p["assumptions"], p["requires"], p["ensures"]) == (
            list(info.reads),
            list(info.assumptions),
            list(info.requires),
            list(info.ensures),
        )
    assert listed["convert-fp16"]["reads"] == ["fp16"]
    options = {o["name"]: o for o in data["options"]}
    assert options["fold_limit"]["type"] == "int" and options["target"]["kind"] == "shared"
    assert options["quantize"]["owner"] == "infercc.passes.quantize_qdq"
    assert {c["name"] for c in data["conditions"]} == {"lint", "no-dead-nodes", "opset>=13"}
    text = run_cli("passes").stdout
    assert "reads quantize; requires opset>=13; ensures lint" in text
    assert "assumes nonempty-sequences" in text


def test_the_docs_table_is_the_registrys() -> None:
    page = DOCS.read_text()
    assert BEGIN in page and END in page, f"docs/passes.md lacks the {BEGIN} section"
    table = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    want = declarations_table()
    assert table == want, (
        "docs/passes.md's declarations table disagrees with the registry; replace it with:\n" + want
    )
    for name in REGISTRY:
        assert f"| `{name}` |" in table
