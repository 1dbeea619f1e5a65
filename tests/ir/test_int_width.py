"""Shape arithmetic at the tensor's integer width, and an algebra without process history.

onnxruntime computes int32 and int64 elements at their width and wraps; the algebra computes
in unbounded integers. `Div(Mul(Cast(Shape(x), int32), 65536), 65536)` compared with the dim
was folded to True, and the optimized model differed from the original for every dim >= 32768.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infercc.ir import symbolic as S
from infercc.ir.graph import Graph
from tests.helpers import make_model, optimize_proto


def _round_trip(dtype: int, factor: int, elem: int = TensorProto.BOOL) -> onnx.ModelProto:
    """eq = Div(Mul(shape, factor), factor) == shape, the shape of x: [n] cast to `dtype`."""
    np_type = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}[dtype]
    nodes = [oh.make_node("Shape", ["x"], ["s64"])]
    src = "s64"
    if dtype != TensorProto.INT64:
        nodes.append(oh.make_node("Cast", ["s64"], ["s"], to=dtype))
        src = "s"
    nodes += [
        oh.make_node("Mul", [src, "k"], ["m"]),
        oh.make_node("Div", ["m", "k"], ["d"]),
        oh.make_node("Equal", ["d", src], ["eq"]),
    ]
    graph = oh.make_graph(
        nodes,
        "wrap",
        [oh.make_tensor_value_info("x", elem, ["n"])],
        [oh.make_tensor_value_info("eq", TensorProto.BOOL, [1])],
        [numpy_helper.from_array(np.array([factor], np_type), "k")],
    )
    model = make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _run(model: onnx.ModelProto, n: int) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options)
    return session.run(None, {"x": np.zeros(n, np.bool_)})[0]


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize(
    "dtype, factor, wraps_at",
    [(TensorProto.INT32, 65536, 32768), (TensorProto.INT64, 2**40, 2**23 + 1)],
    ids=["int32", "int64"],
)
def test_a_product_that_may_wrap_is_not_folded(dtype: int, factor: int, wraps_at: int) -> None:
    model = _round_trip(dtype, factor)
    assert _run(model, wraps_at).tolist() == [False]  # onnxruntime wraps: not the dim
    optimized, _ = optimize_proto(model)
    assert _ops(optimized)["Equal"] == 1  # kept: its truth depends on there being no overflow
    for n in (4, wraps_at):
        assert _run(optimized, n).tolist() == _run(model, n).tolist(), n


def test_a_product_that_cannot_wrap_still_folds() -> None:
    """int64 * 65536 of a dimension (below 2**31) stays below 2**47: folded to True."""
    model = _round_trip(TensorProto.INT64, 65536)
    optimized, _ = optimize_proto(model)
    assert _ops(optimized)["Equal"] == 0 and _ops(optimized)["Mul"] == 0
    for n in (4, 40000):
        assert _run(optimized, n).tolist() == _run(model, n).tolist() == [True]


def test_fits_carries_the_width() -> None:
    n, b, s = S.sym("n"), S.sym("batch"), S.sym("seq")
    assert S.fits(n, 32) and S.fits(S.add(n, 0), 64)
    assert not S.fits(S.mul(n, 65536), 32) and S.fits(S.mul(n, 65536), 64)
    assert not S.fits(S.mul(n, 2**40), 64)
    assert S.fits(S.mul(b, s), 64) and not S.fits(S.mul(S.mul(b, s), 4), 64)
    assert S.fits(2**31 - 1, 32) and not S.fits(2**31, 32) and S.fits(-(2**31), 32)
    assert not S.fits(None, 64)


def test_an_atom_carries_its_range() -> None:
    n = S.sym("n")
    q = S.div(S.mul(n, 65536), 3)  # up to 65536 * DIM_MAX
    assert S.bounds(q) == (0, 65536 * S.DIM_MAX)
    assert not S.fits(q, 32) and S.fits(q, 64)
    r = S.mod(S.mul(n, 2**40), 7)
    assert S.bounds(r) == (0, 7) and S.fits(r, 8)
    signed = S.div(S.sub(1, n), 2)
    assert not S.nonneg(signed) and S.bounds(signed)[0] < 0


def test_int32_arithmetic_of_symbols_is_checked_in_the_shapes() -> None:
    """The analysis keeps an int32 element only where it fits: `n + 0` (a dimension) does,
    `n * 65536` does not."""
    from infercc.ir import import_model
    from infercc.ir.shapes import infer_shapes
    from infercc.ir.symbolic_shapes import SymbolicShapes

    model = import_model(_round_trip(TensorProto.INT32, 65536))
    infer_shapes(model)
    shapes = SymbolicShapes(S.algebra_for(model.graph))
    values = {v.name: v for node in model.graph for v in node.outputs}
    assert shapes.elems(values["s"]) == (S.sym("n"),)
    assert shapes.elems(values["m"]) == (None,)
    assert shapes.elems(values["eq"]) == (None,)


# --------------------------------------------------------------------------- no process history


QUESTION = (  # symbolic.py alone (stdlib only), loaded from its file: a fresh process, fast
    "import importlib.util, sys\n"
    f"spec = importlib.util.spec_from_file_location('S', {S.__file__!r})\n"
    "S = importlib.util.module_from_spec(spec); sys.modules['S'] = S\n"
    "spec.loader.exec_module(S)\n"
    "b, s = S.sym('batch'), S.sym('seq')\n"
    "print(S.equal(S.from_ir('batch*seq'), S.mul(b, s)), "
    "S.nonneg(S.from_ir('div(-seq + 1, 2)')))\n"
)


def _answers() -> str:
    b, s = S.sym("batch"), S.sym("seq")
    return (
        f"{S.equal(S.from_ir('batch*seq'), S.mul(b, s))} {S.nonneg(S.from_ir('div(-seq + 1, 2)'))}"
    )


def test_a_fresh_process_and_one_after_to_text_answer_the_same() -> None:
    fresh = subprocess.run(
        [sys.executable, "-c", QUESTION], capture_output=True, text=True, check=True
    ).stdout.strip()
    before = _answers()
    b, s = S.sym("batch"), S.sym("seq")
    S.to_text(S.mul(b, s))  # outside any analysis
    with S.using(S.Algebra()):  # inside one, which then ends
        S.to_text(S.mul(b, s))
        assert S.from_ir("batch*seq") == S.mul(b, s)
    signed = S.div(S.sub(1, s), 2)  # once a global table of signed atoms
    assert str(signed) == "div(-seq + 1, 2)" and not S.nonneg(signed)
    # a polynomial's text reads as that polynomial in every process (symbolic.parse)
    assert fresh == before == _answers() == "True True"


def test_each_model_has_its_own_algebra() -> None:
    g1, g2 = Graph("a"), Graph("b")
    assert S.algebra_for(g1) is S.algebra_for(g1) and S.algebra_for(g1) is not S.algebra_for(g2)
    atom = S.div(S.sub(1, S.sym("seq")), 2)  # an atom: its text spells no polynomial
    with S.using(S.algebra_for(g1)):
        S.to_text(atom)
    with S.using(S.algebra_for(g2)):
        assert S.from_ir("div(-seq + 1, 2)") == S.sym("div(-seq + 1, 2)")
        assert S.from_ir("batch*seq") == S.mul(S.sym("batch"), S.sym("seq"))  # parsed
    with S.using(S.algebra_for(g1)):
        assert S.from_ir("div(-seq + 1, 2)") == atom


def test_an_atom_pickles_with_its_facts() -> None:
    import pickle

    q = S.div(S.sub(1, S.sym("seq")), 2)
    back = pickle.loads(pickle.dumps(q))
    assert back == q and not S.nonneg(back) and S.bounds(back) == S.bounds(q)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("s69 + s70", S.add(S.sym("s69"), S.sym("s70"))),  # torch's dynamo exporter
        ("2*seq - 1", S.sub(S.mul(2, S.sym("seq")), 1)),
        ("s1**2 - s2", S.sub(S.mul(S.sym("s1"), S.sym("s1")), S.sym("s2"))),
        ("batch*seq", S.mul(S.sym("batch"), S.sym("seq"))),
        ("seq-len", None),  # unspaced: a name
        ("max(a, b)", None),
        ("a + -b", S.sub(S.sym("a"), S.sym("b"))),
        ("a +b", None),
        ("batch", None),
    ],
)
def test_a_polynomials_text_parses_as_that_polynomial(text, want) -> None:
    assert S.parse(text) == want
    assert S.from_ir(text) == (want if want is not None else S.sym(text))
