"""The dimension algebra: canonical forms, exact division, decisions and their refusals."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from infercc.ir import symbolic as S
from tests.helpers import make_model


def test_products_and_sums_are_canonical():
    b, s = S.sym("batch"), S.sym("seq")
    assert S.mul(b, s) == S.mul(s, b)
    assert S.add(S.mul(2, b), s) == S.add(s, S.add(b, b))
    assert str(S.mul(b, s)) == "batch*seq"
    assert S.sub(S.add(b, 3), b) == 3 and isinstance(S.sub(S.add(b, 3), b), int)


def test_exact_division_of_batch_seq_by_seq_is_batch():
    b, s = S.sym("batch"), S.sym("seq")
    assert S.exact_div(S.mul(b, s), s) == b
    assert S.div(S.mul(S.mul(b, s), 64), S.mul(s, 64)) == b
    assert S.exact_div(S.add(b, s), s) is None


def test_inexact_division_is_an_atom_equal_only_to_itself():
    b = S.sym("batch")
    q1, q2 = S.div(b, 2), S.div(b, 2)
    assert q1 == q2 and str(q1) == "div(batch, 2)"
    assert S.equal(q1, S.div(b, 3)) is None


def test_integer_division_truncates_like_onnx():
    assert S.div(7, 2) == 3 and S.div(-7, 2) == -3 and S.div(0, 5) == 0
    assert S.div(3, 0) is None


def test_equal_decides_only_what_holds_for_every_value():
    b, s = S.sym("batch"), S.sym("seq")
    assert S.equal(b, b) is True
    assert S.equal(S.add(b, 1), b) is False
    assert S.equal(b, -1) is False  # a size is never negative
    assert S.equal(b, s) is None  # equal when batch == seq, not otherwise
    assert S.equal(b, 1) is None


def test_max_and_min_of_comparable_sizes():
    s = S.sym("seq")
    assert S.dmax(S.add(s, 1), s) == S.add(s, 1)
    assert S.dmin(S.add(s, 1), s) == s
    assert S.dmax(s, 0) == s
    t = S.sym("total")
    assert S.dmax(s, t) == S.dmax(t, s)  # an atom, the same whichever order
    assert str(S.dmax(s, t)).startswith("max(")


def test_an_atom_of_a_signed_value_is_not_taken_for_a_size():
    s = S.sym("seq")
    d = S.div(S.sub(1, s), 2)  # may be negative
    assert not S.nonneg(d)
    assert S.equal(d, -1) is None


def test_text_written_into_the_ir_reads_back_as_the_same_expression():
    """Within one model's analysis (its algebra); tests/ir/test_int_width.py checks that
    nothing leaks out of it."""
    e = S.mul(S.sym("batch"), S.sym("seq"))
    with S.using(S.Algebra()):
        assert S.from_ir(S.to_text(e)) == e
    assert S.from_ir("batch") == S.sym("batch")
    assert S.from_ir(5) == 5 and S.to_text(5) == 5


def test_slice_length_with_an_int_max_end_and_a_negative_step_is_onnxruntimes():
    """onnxruntime's kernel runs such a slice through index 0; onnx's inference says empty."""
    from infercc.ir.symbolic_shapes import slice_length

    for end in (2**63 - 1, 2**31 - 1):
        node = onnx.helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])
        inits = [
            onnx.numpy_helper.from_array(np.array([v], np.int64), n)
            for n, v in (("s", 1), ("e", end), ("a", 0), ("p", -1))
        ]
        graph = onnx.helper.make_graph(
            [node],
            "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            inits,
        )
        model = make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, {"x": np.arange(3, dtype=np.float32)})[0]
        assert slice_length(3, 1, end, -1) == len(got) == 2
