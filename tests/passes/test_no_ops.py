"""eliminate-no-ops: each rewrite fires and keeps outputs; each guard refuses a non-no-op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from infercc.ir import import_model
from infercc.ir.shapes import infer_shapes
from infercc.passes import PassContext
from infercc.passes.no_ops import eliminate_no_ops
from tests.helpers import (
    assert_same_outputs,
    make_model,
    op_counts,
    optimize_proto,
    parse,
    random_feeds,
    run_ort,
)

HEADER = '<ir_version: 9, opset_import: ["" : 18]>\n'
PASSES = ["eliminate-no-ops", "eliminate-dead-code"]


def _run(body: str, passes: list[str] = PASSES):
    proto = parse(HEADER + body)
    ctx = PassContext()
    out, report = optimize_proto(proto, passes, ctx)
    return proto, out, report, ctx


def _counts(report) -> dict[str, int]:
    return report.passes["eliminate-no-ops"].counts


def _reasons(ctx: PassContext) -> list[str]:
    return [r.reason for r in ctx.refusals if r.pass_name == "eliminate-no-ops"]


def _fires(body: str, kind: str, gone: str, times: int = 1):
    """Run the pass; `gone` has no node left, `kind` fired `times`, outputs are unchanged."""
    proto, out, report, ctx = _run(body)
    assert op_counts(out)[gone] == 0
    assert _counts(report).get(kind) == times
    assert report.reached_fixpoint
    assert [o.name for o in out.graph.output] == [o.name for o in proto.graph.output]
    assert_same_outputs(proto, out)
    return out, report, ctx


def _refuses(body: str, kept: str, reason: str | None, n_kept: int = 1):
    """Run the pass; `kept` nodes stay, nothing fired, the refusal reason (if any) is recorded."""
    proto, out, report, ctx = _run(body)
    assert op_counts(out)[kept] == n_kept
    assert not _counts(report)
    if reason is not None:
        assert any(reason in r for r in _reasons(ctx)), _reasons(ctx)
    return out, report, ctx


# -- Identity -----------------------------------------------------------------------------------


def test_identity_between_nodes_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) { A = Relu(X)  B = Identity(A)  Y = Neg(B) }",
        "identity",
        "Identity",
    )


def test_identity_feeding_graph_output_hands_over_the_name():
    out, _, _ = _fires(
        "g (float[2,3] X) => (float[2,3] Y) { A = Relu(X)  Y = Identity(A) }",
        "identity",
        "Identity",
    )
    assert out.graph.node[-1].output[0] == "Y"


def test_identity_from_graph_input_to_graph_output_stays_and_reaches_fixpoint():
    proto, out, report, ctx = _run(
        "g (float[2,3] X) => (float[2,3] Y) { Y = Identity(X) }", ["eliminate-no-ops"]
    )
    assert op_counts(out)["Identity"] == 1
    assert report.reached_fixpoint is True
    assert not _counts(report)
    assert any("graph output" in r for r in _reasons(ctx))
    assert_same_outputs(proto, out)


def test_identity_between_two_graph_outputs_stays():
    _refuses(
        "g (float[2,3] X) => (float[2,3] A, float[2,3] Y) { A = Relu(X)  Y = Identity(A) }",
        "Identity",
        "graph output",
    )


# -- Dropout ------------------------------------------------------------------------------------


def test_dropout_without_training_mode_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) { r = Constant<value = float {0.5}>()"
        "  D = Dropout(X, r)  Y = Relu(D) }",
        "dropout",
        "Dropout",
    )


def test_dropout_with_constant_false_training_mode_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) <bool t = {0}> { D, M = Dropout(X, , t)  Y = Relu(D) }",
        "dropout",
        "Dropout",
    )


def test_dropout_with_used_mask_is_refused():
    _refuses(
        "g (float[2,3] X) => (float[2,3] Y, bool[2,3] M) { D, M = Dropout(X)  Y = Relu(D) }",
        "Dropout",
        "mask",
    )


def test_dropout_with_training_mode_true_is_refused():
    _refuses(
        "g (float[2,3] X) => (float[2,3] Y) <float r = {0.5}, bool t = {1}>"
        " { D = Dropout(X, r, t)  Y = Relu(D) }",
        "Dropout",
        "training_mode is true",
    )


def test_dropout_with_runtime_training_mode_is_refused():
    _refuses(
        "g (float[2,3] X, bool T) => (float[2,3] Y) { D = Dropout(X, , T)  Y = Relu(D) }",
        "Dropout",
        "not a constant",
    )


# -- Cast ---------------------------------------------------------------------------------------


def test_cast_to_same_dtype_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) { C = Cast<to = 1>(X)  Y = Relu(C) }", "cast", "Cast"
    )


def test_castlike_same_dtype_is_removed():
    _fires(
        "g (float[2,3] X, float[1] L) => (float[2,3] Y) { C = CastLike(X, L)  Y = Relu(C) }",
        "cast",
        "CastLike",
    )


def test_cast_to_other_dtype_stays():
    _refuses("g (float[2,3] X) => (int64[2,3] Y) { C = Cast<to = 7>(X)  Y = Abs(C) }", "Cast", None)


def test_cast_chain_keeps_the_real_conversion():
    # float -> double -> double: only the second Cast is a no-op.
    proto, out, report, _ = _run(
        "g (float[2,3] X) => (double[2,3] Y)"
        " { A = Cast<to = 11>(X)  B = Cast<to = 11>(A)  Y = Abs(B) }"
    )
    assert op_counts(out)["Cast"] == 1
    assert _counts(report) == {"cast": 1}
    assert_same_outputs(proto, out)


@pytest.mark.parametrize(
    "a, b",
    [("float", 11), ("float16", 1), ("int8", 6), ("uint8", 5), ("int32", 7), ("uint32", 7)],
)
def test_an_exact_cast_round_trip_is_removed(a, b):
    codes = {"float": 1, "float16": 10, "int8": 3, "uint8": 2, "int32": 6, "uint32": 12}
    proto, out, report, _ = _run(
        f"g ({a}[2,3] X) => ({a}[2,3] Y)"
        f" {{ A = Cast<to = {b}>(X)  B = Cast<to = {codes[a]}>(A)  Y = Identity(B) }}"
    )
    assert op_counts(out)["Cast"] == 0
    assert _counts(report).get("cast_round_trip") == 1
    feeds = {"X": (np.arange(-3, 3).reshape(2, 3) * 7).astype(a if a != "float" else "float32")}
    if a.startswith("u"):
        feeds["X"] = np.abs(feeds["X"])
    assert_same_outputs(proto, out, feeds)


@pytest.mark.parametrize("a, b", [("float", 10), ("float", 6), ("int32", 1), ("int64", 6)])
def test_a_lossy_cast_round_trip_stays(a, b):
    codes = {"float": 1, "int32": 6, "int64": 7}
    proto, out, report, ctx = _run(
        f"g ({a}[2,3] X) => ({a}[2,3] Y)"
        f" {{ A = Cast<to = {b}>(X)  B = Cast<to = {codes[a]}>(A)  Y = Abs(B) }}"
    )
    assert op_counts(out)["Cast"] == 2
    assert "the round trip goes through a type that does not hold every value" in _reasons(ctx)


def test_a_round_trip_read_only_inside_if_branches_runs_under_onnxruntime():
    """onnxruntime (1.32) fails with "Missing Input" on a float -> double -> float round trip
    read only inside both branches of an If; the exact round trip goes away, and with it the
    case onnxruntime cannot run."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,4] x) => (float[1,4] y) {
      c1 = Cast<to = 11>(x)
      c2 = Cast<to = 1>(c1)
      r = ReduceSum<keepdims = 0>(x)
      lim = Constant<value = float {0}>()
      gt = Greater(r, lim)
      y = If(gt) <then_branch = g1 () => (float[1,4] t) {
          b1 = Constant<value = float[1] {1.5}>()
          t = Mul(c2, b1)
        }, else_branch = g2 () => (float[1,4] e) {
          b2 = Constant<value = float[1] {2.5}>()
          e = Mul(c2, b2)
        }>
    }
    """
    out, _ = optimize_proto(parse(text))
    assert op_counts(out)["Cast"] == 0
    for sign, scale in ((1.0, 1.5), (-1.0, 2.5)):
        x = np.full((1, 4), sign, np.float32)
        np.testing.assert_array_equal(run_ort(out, {"x": x})[0], x * scale)


# -- Reshape, Flatten, Squeeze, Unsqueeze, Expand -----------------------------------------------


def test_reshape_to_same_static_shape_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) <int64[2] s = {2, 3}>"
        " { R = Reshape(X, s)  Y = Relu(R) }",
        "reshape",
        "Reshape",
    )


@pytest.mark.parametrize(
    ("x", "target"), [("N,3,4", "0, 3, 4"), ("2,3,4", "2, -1, 4"), ("N,3", "0, 3")]
)
def test_reshape_with_copied_dim_or_minus_one_is_removed(x, target):
    n = target.count(",") + 1
    _fires(
        f"g (float[{x}] X) => (float[{x}] Y) <int64[{n}] s = {{{target}}}>"
        " { R = Reshape(X, s)  Y = Relu(R) }",
        "reshape",
        "Reshape",
    )


def test_reshape_that_changes_shape_stays():
    _refuses(
        "g (float[2,3] X) => (float[3,2] Y) <int64[2] s = {3, 2}>"
        " { R = Reshape<allowzero = 1>(X, s)  Y = Relu(R) }",
        "Reshape",
        None,
    )


def test_reshape_with_minus_one_next_to_symbolic_dim_stays():
    # -1 could absorb part of N at run time only if the other dims were unknown: refuse.
    _refuses(
        "g (float[N,M] X) => (float[?,?] Y) <int64[2] s = {-1, 0}>"
        " { R = Reshape(X, s)  Y = Relu(R) }",
        "Reshape",
        None,
    )


def test_reshape_with_unknown_input_shape_is_refused():
    _refuses(
        # Expand to a run-time shape: not even the rank of A is known.
        "g (float[6] X, int64[?] S) => (float[2,3] Y) <int64[2] s = {2, 3}>"
        " { A = Expand(X, S)  R = Reshape(A, s)  Y = Relu(R) }",
        "Reshape",
        "input shape unknown",
    )


def test_reshape_of_reshape_becomes_one_reshape():
    proto, out, report, _ = _run(
        "g (float[2,3,4] X) => (float[4,6] Y) <int64[2] a = {6, 4}, int64[2] b = {4, -1}>"
        " { A = Reshape(X, a)  B = Reshape(A, b)  Y = Relu(B) }"
    )
    assert op_counts(out)["Reshape"] == 1
    assert _counts(report) == {"reshape_chain": 1}
    assert_same_outputs(proto, out)


@pytest.mark.parametrize(
    "first",
    [
        "A = Squeeze(X, ax)",
        "A = Unsqueeze(X, ax)",
        "A = Flatten<axis = 2>(X)",
    ],
)
def test_reshape_of_a_squeeze_unsqueeze_or_flatten_reads_its_input(first):
    """The exporters' `x[:, 1]` then `view(...)`: Slice, Squeeze, Reshape loses the Squeeze."""
    proto, out, report, _ = _run(
        "g (float[N,1,4,6] X) => (float[N,4,2,3] Y) <int64[1] ax = {1}, int64[4] t = {-1, 4, 2, 3}>"
        f" {{ {first}  B = Reshape(A, t)  Y = Relu(B) }}"
    )
    assert op_counts(out) == {"Reshape": 1, "Relu": 1}
    assert _counts(report) == {"reshape_chain": 1}
    for n in (1, 3):
        assert_same_outputs(proto, out, random_feeds(proto, seed=n, dims=n))


def test_reshape_of_reshape_back_to_input_shape_disappears():
    proto, out, report, _ = _run(
        "g (float[2,3,4] X) => (float[2,3,4] Y) <int64[2] a = {6, 4}, int64[3] b = {2, 3, 4}>"
        " { A = Reshape(X, a)  B = Reshape(A, b)  Y = Relu(B) }"
    )
    assert op_counts(out)["Reshape"] == 0
    assert _counts(report) == {"reshape_chain": 1, "reshape": 1}
    assert_same_outputs(proto, out)


def test_reshape_of_reshape_with_copying_zero_is_refused():
    # The 0 copies A's first dim (6), not X's (2): merging would change the result.
    _refuses(
        "g (float[2,3,4] X) => (float[6,2,2] Y) <int64[2] a = {6, 4}, int64[3] b = {0, 2, -1}>"
        " { A = Reshape(X, a)  B = Reshape(A, b)  Y = Relu(B) }",
        "Reshape",
        "0 copying",
        n_kept=2,
    )


def test_flatten_of_matrix_is_removed():
    _fires(
        "g (float[N,3] X) => (float[N,3] Y) { F = Flatten<axis = 1>(X)  Y = Relu(F) }",
        "flatten",
        "Flatten",
    )


def test_flatten_that_merges_dims_stays():
    _refuses(
        "g (float[2,3,4] X) => (float[2,12] Y) { F = Flatten<axis = 1>(X)  Y = Relu(F) }",
        "Flatten",
        None,
    )


def test_unsqueeze_of_squeeze_with_same_axes_is_removed():
    out, report, _ = _fires(
        "g (float[N,1,3] X) => (float[N,1,3] Y) <int64[1] a = {1}, int64[1] b = {-2}>"
        " { S = Squeeze(X, a)  U = Unsqueeze(S, b)  Y = Relu(U) }",
        "squeeze_unsqueeze",
        "Unsqueeze",
    )
    assert op_counts(out)["Squeeze"] == 0


def test_squeeze_of_unsqueeze_with_same_axes_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) <int64[1] a = {0}>"
        " { U = Unsqueeze(X, a)  S = Squeeze(U, a)  Y = Relu(S) }",
        "squeeze_unsqueeze",
        "Squeeze",
    )


def test_unsqueeze_of_squeeze_with_other_axes_stays():
    _refuses(
        "g (float[2,1,3] X) => (float[2,3,1] Y) <int64[1] a = {1}, int64[1] b = {2}>"
        " { S = Squeeze(X, a)  U = Unsqueeze(S, b)  Y = Relu(U) }",
        "Unsqueeze",
        None,
    )


def test_expand_to_own_shape_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) <int64[2] s = {1, 3}>"
        " { E = Expand(X, s)  Y = Relu(E) }",
        "expand",
        "Expand",
    )


@pytest.mark.parametrize(
    ("x", "shape", "y"),
    [("3", "2, 3", "2,3"), ("3", "1, 3", "1,3"), ("1,3", "2, 3", "2,3"), ("2,1", "2, 3", "2,3")],
)
def test_expand_that_broadcasts_is_refused(x, shape, y):
    n = shape.count(",") + 1
    _refuses(
        f"g (float[{x}] X) => (float[{y}] Y) <int64[{n}] s = {{{shape}}}>"
        " { E = Expand(X, s)  Y = Relu(E) }",
        "Expand",
        "broadcasts",
    )


# -- Transpose ----------------------------------------------------------------------------------


def test_transpose_with_identity_perm_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) { T = Transpose<perm = [0, 1]>(X)  Y = Relu(T) }",
        "transpose",
        "Transpose",
    )


def test_transposes_that_cancel_are_removed():
    _fires(
        "g (float[2,3,4] X) => (float[2,3,4] Y)"
        " { A = Transpose<perm = [1, 2, 0]>(X)  B = Transpose<perm = [2, 0, 1]>(A)  Y = Relu(B) }",
        "transpose_pair",
        "Transpose",
    )


def test_transposes_compose_into_one():
    proto, out, report, _ = _run(
        "g (float[2,3,4] X) => (float[3,2,4] Y)"
        " { A = Transpose<perm = [1, 2, 0]>(X)  B = Transpose<perm = [0, 2, 1]>(A)  Y = Relu(B) }"
    )
    assert op_counts(out)["Transpose"] == 1
    assert _counts(report) == {"transpose_pair": 1}
    perm = onnx.helper.get_attribute_value(out.graph.node[0].attribute[0])
    assert list(perm) == [1, 0, 2]
    assert_same_outputs(proto, out)


def test_transpose_pair_keeps_first_when_it_has_other_users():
    proto, out, report, _ = _run(
        "g (float[2,3] X) => (float[2,3] Y, float[3,2] Z)"
        " { A = Transpose(X)  B = Transpose(A)  Y = Relu(B)  Z = Neg(A) }"
    )
    assert op_counts(out)["Transpose"] == 1
    assert _counts(report) == {"transpose_pair": 1}
    assert_same_outputs(proto, out)


# -- Slice, Split, Concat, Pad ------------------------------------------------------------------


def test_slice_of_everything_is_removed():
    _fires(
        "g (float[N,3] X) => (float[N,3] Y)"
        " <int64[2] st = {0, -3}, int64[2] en = {9223372036854775807, 3}, int64[2] ax = {0, 1}>"
        " { S = Slice(X, st, en, ax)  Y = Relu(S) }",
        "slice",
        "Slice",
    )


@pytest.mark.parametrize(
    ("starts", "ends", "steps"), [("0", "2", "1"), ("1", "3", "1"), ("0", "3", "2")]
)
def test_partial_slice_stays(starts, ends, steps):
    _refuses(
        f"g (float[2,3] X) => (float[2,?] Y) <int64[1] st = {{{starts}}}, int64[1] en = {{{ends}}},"
        f" int64[1] ax = {{1}}, int64[1] sp = {{{steps}}}> {{ S = Slice(X, st, en, ax, sp)"
        "  Y = Relu(S) }",
        "Slice",
        None,
    )


def test_split_into_one_output_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) <int64[1] s = {3}>"
        " { S = Split<axis = 1>(X, s)  Y = Relu(S) }",
        "split",
        "Split",
    )


def test_split_into_two_outputs_stays():
    _refuses(
        "g (float[2,4] X) => (float[2,2] Y, float[2,2] Z)"
        " { A, B = Split<axis = 1, num_outputs = 2>(X)  Y = Relu(A)  Z = Relu(B) }",
        "Split",
        None,
    )


def test_concat_of_one_input_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) { C = Concat<axis = 0>(X)  Y = Relu(C) }",
        "concat",
        "Concat",
    )


def test_concat_with_an_empty_slice_is_its_other_input():
    """transformers' partial rotation at a factor of 1.0: Concat(rotated, x[..., D:])."""
    out, _, _ = _fires(
        "g (float[N,2,4] X) => (float[N,2,4] Y)"
        " <int64[1] st = {4}, int64[1] en = {9223372036854775807}, int64[1] ax = {-1}>"
        " { R = Neg(X)  E = Slice(X, st, en, ax)  C = Concat<axis = -1>(R, E)  Y = Relu(C) }",
        "concat_empty",
        "Concat",
    )
    assert op_counts(out)["Slice"] == 0


def test_concat_drops_an_empty_constant_and_keeps_the_rest():
    proto, out, report, _ = _run(
        "g (float[2,3] X, float[2,1] Z) => (float[2,4] Y) <float[2,0] e = {}>"
        " { C = Concat<axis = 1>(X, e, Z)  Y = Relu(C) }"
    )
    assert _counts(report) == {"concat_empty": 1}
    (concat,) = [n for n in out.graph.node if n.op_type == "Concat"]
    assert list(concat.input) == ["X", "Z"]
    assert_same_outputs(proto, out)


@pytest.mark.parametrize(
    "body",
    [
        # empty along another axis than the Concat's: the result is empty, of its own shape
        "g (float[0,3] X) => (float[0,5] Y) <float[0,2] w = {}>"
        " { C = Concat<axis = 1>(X, w)  Y = Relu(C) }",
        # a slice of a symbolic dimension is not provably empty
        "g (float[2,N] X) => (float[2,?] Y)"
        " <int64[1] st = {4}, int64[1] en = {9223372036854775807}, int64[1] ax = {1}>"
        " { E = Slice(X, st, en, ax)  C = Concat<axis = 1>(X, E)  Y = Relu(C) }",
        # a slice that keeps one element
        "g (float[2,4] X) => (float[2,5] Y)"
        " <int64[1] st = {3}, int64[1] en = {4}, int64[1] ax = {1}>"
        " { E = Slice(X, st, en, ax)  C = Concat<axis = 1>(X, E)  Y = Relu(C) }",
    ],
)
def test_concat_keeps_an_input_not_proven_empty(body):
    _refuses(body, "Concat", None)


def test_pad_with_zero_pads_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y) <int64[4] p = {0, 0, 0, 0}>"
        ' { P = Pad<mode = "reflect">(X, p)  Y = Relu(P) }',
        "pad",
        "Pad",
    )


def test_pad_with_nonzero_pads_stays():
    _refuses(
        "g (float[2,3] X) => (float[2,4] Y) <int64[4] p = {0, 0, 0, 1}>"
        " { P = Pad(X, p)  Y = Relu(P) }",
        "Pad",
        None,
    )


# -- arithmetic with neutral constants ----------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "const", "kind"),
    [
        ("Add(X, c)", "float[3] c = {0, 0, 0}", "add"),
        ("Add(c, X)", "float[1,3] c = {0, 0, 0}", "add"),
        ("Sub(X, c)", "float c = {0}", "sub"),
        ("Mul(X, c)", "float[2,1] c = {1, 1}", "mul"),
        ("Mul(c, X)", "float[1] c = {1}", "mul"),
        ("Div(X, c)", "float[3] c = {1, 1, 1}", "div"),
        ("Pow(X, c)", "int64 c = {1}", "pow"),
    ],
)
def test_neutral_constant_is_removed(expr, const, kind):
    _fires(
        f"g (float[2,3] X) => (float[2,3] Y) <{const}> {{ A = {expr}  Y = Relu(A) }}",
        kind,
        expr.split("(")[0],
    )


def test_mul_by_one_constant_node_is_removed():
    _fires(
        "g (float[2,3] X) => (float[2,3] Y)"
        " { c = Constant<value_float = 1.0>()  A = Mul(X, c)  Y = Relu(A) }",
        "mul",
        "Mul",
    )


@pytest.mark.parametrize(
    ("x", "const", "y"),
    [("3", "float[2,3] c = {1, 1, 1, 1, 1, 1}", "2,3"), ("2,1", "float[3] c = {1, 1, 1}", "2,3")],
)
def test_mul_by_ones_that_broadcasts_is_refused(x, const, y):
    proto, out, report, ctx = _run(
        f"g (float[{x}] X) => (float[{y}] Y) <{const}> {{ A = Mul(X, c)  Y = Relu(A) }}"
    )
    assert op_counts(out)["Mul"] == 1
    assert not _counts(report)
    assert any("broadcast" in r for r in _reasons(ctx))
    assert_same_outputs(proto, out)


def test_add_of_zeros_with_symbolic_dim_is_refused_unless_it_is_one():
    _refuses(
        "g (float[N] X) => (float[?] Y) <float[3] c = {0, 0, 0}> { A = Add(X, c)  Y = Relu(A) }",
        "Add",
        "broadcast",
    )


@pytest.mark.parametrize(
    ("expr", "const"),
    [
        ("Sub(c, X)", "float c = {0}"),
        ("Div(c, X)", "float c = {1}"),
        ("Pow(c, X)", "float c = {1}"),
        ("Mul(X, c)", "float[3] c = {1, 0, 1}"),
        ("Add(X, c)", "float c = {1}"),
    ],
)
def test_non_neutral_or_wrong_side_stays(expr, const):
    _refuses(
        f"g (float[2,3] X) => (float[2,3] Y) <{const}> {{ A = {expr}  Y = Relu(A) }}",
        expr.split("(")[0],
        None,
    )


def test_mul_with_unknown_input_shape_is_refused():
    _refuses(
        "g (float[2] X, int64[?] AX) => (float[?,?] Y) <float[1] c = {1}>"
        " { A = Unsqueeze(X, AX)  M = Mul(A, c)  Y = Relu(M) }",
        "Mul",
        "input shape unknown",
    )


# -- subgraphs, fixpoint, idempotence -----------------------------------------------------------

IF_MODEL = """
g (bool C, float[2,3] X) => (float[2,3] Y) {
  Y = If(C) <
    then_branch = t () => (float[2,3] TY) { TA = Identity(X)  TY = Relu(TA) },
    else_branch = e () => (float[2,3] EY) { EY = Identity(X) }
  >
}
"""


def test_subgraphs_are_rewritten_but_outer_values_keep_their_identity():
    proto, out, report, ctx = _run(IF_MODEL)
    then_g, else_g = (a.g for a in out.graph.node[0].attribute)
    assert op_counts(make_model(then_g))["Identity"] == 0
    assert op_counts(make_model(else_g))["Identity"] == 1
    assert _counts(report) == {"identity": 1}
    assert report.reached_fixpoint
    for cond in (True, False):
        feeds = {"C": np.array(cond), "X": np.arange(6, dtype=np.float32).reshape(2, 3) - 2}
        assert_same_outputs(proto, out, feeds)


MANY = """
g (float[2,3] X) => (float[2,3] Y, float[2,3] Z) <int64[2] s = {2, 3}, float k = {1}> {
  A = Identity(X)
  B = Cast<to = 1>(A)
  C = Reshape(B, s)
  D = Transpose<perm = [1, 0]>(C)
  E = Transpose<perm = [1, 0]>(D)
  F = Mul(E, k)
  G = Dropout(F)
  Y = Relu(G)
  Z = Identity(X)
}
"""


def test_everything_at_once_and_fixpoint():
    proto, out, report, _ = _run(MANY)
    assert dict(op_counts(out)) == {"Relu": 1, "Identity": 1}
    assert report.reached_fixpoint
    assert_same_outputs(proto, out)


def test_second_run_changes_nothing():
    model = import_model(parse(HEADER + MANY))
    infer_shapes(model)
    first = eliminate_no_ops(model.graph, PassContext())
    assert first.changed and first.stats
    infer_shapes(model)
    second = eliminate_no_ops(model.graph, PassContext())
    assert second.changed is False and second.stats == {}
    model.graph.lint()


def test_nothing_to_do_reports_unchanged():
    model = import_model(parse(HEADER + "g (float[2,3] X) => (float[2,3] Y) { Y = Relu(X) }"))
    infer_shapes(model)
    assert eliminate_no_ops(model.graph, PassContext()).changed is False


OLD_OPSET = """<ir_version: 6, opset_import: ["" : 11]>
g (float[2,1,3] X) => (float[2,1,3] Y)
  <int64[2] st = {0, 0}, int64[2] en = {2, 3}, int64[2] ax = {0, 2}> {
  S = Squeeze<axes = [1]>(X)
  U = Unsqueeze<axes = [1]>(S)
  P = Split<axis = 2, split = [3]>(U)
  C = Slice(P, st, en, ax)
  Y = Relu(C)
}
"""


def test_attribute_forms_of_older_opsets():
    proto = parse(OLD_OPSET)
    out, report = optimize_proto(proto, PASSES)
    assert dict(op_counts(out)) == {"Relu": 1}
    assert _counts(report) == {"squeeze_unsqueeze": 1, "split": 1, "slice": 1}
    assert_same_outputs(proto, out)


# -- Slice of a Slice -----------------------------------------------------------------------------

PAIR = (
    "g (float[N,12,10] X) => (float[N,?,?] Y)"
    " <int64[1] s1 = {{{s1}}}, int64[1] e1 = {{{e1}}}, int64[1] a1 = {{{a1}}},"
    " int64[1] p1 = {{{p1}}}, int64[1] s2 = {{{s2}}}, int64[1] e2 = {{{e2}}},"
    " int64[1] a2 = {{{a2}}}, int64[1] p2 = {{{p2}}}>"
    " {{ A = Slice(X, s1, e1, a1, p1)  B = Slice(A, s2, e2, a2, p2)  Y = Relu(B) }}"
)


@pytest.mark.parametrize(
    "bounds",
    [
        # other axes: taken as they are, a symbolic one included, negative bounds too
        dict(s1=1, e1=-1, a1=1, p1=1, s2=-3, e2=100, a2=2, p2=1),
        dict(s1=1, e1=9223372036854775807, a1=0, p1=1, s2=2, e2=7, a2=-1, p2=2),
        # one static axis twice: composed (steps, negative and clamped bounds)
        dict(s1=1, e1=11, a1=1, p1=2, s2=1, e2=100, a2=1, p2=2),
        dict(s1=-8, e1=-1, a1=1, p1=1, s2=-5, e2=-2, a2=-2, p2=1),
        dict(s1=2, e1=9, a1=2, p1=3, s2=0, e2=2, a2=2, p2=1),
        dict(s1=3, e1=5, a1=1, p1=1, s2=4, e2=9, a2=1, p2=1),  # nothing left
    ],
)
def test_a_slice_of_a_slice_is_one_slice(bounds):
    body = PAIR.format(**bounds)
    proto, out, report, _ = _run(body)
    assert op_counts(out)["Slice"] == 1
    assert _counts(report).get("slice_pair") == 1
    for n in (1, 3):  # both values of the symbolic batch
        feeds = {"X": np.random.default_rng(n).standard_normal((n, 12, 10)).astype(np.float32)}
        assert_same_outputs(proto, out, feeds, atol=0, rtol=0)
    onnx.checker.check_model(out, full_check=True)


def test_a_pair_on_a_symbolic_axis_or_stepping_back_stays():
    for bounds in (
        dict(s1=1, e1=9223372036854775807, a1=0, p1=1, s2=1, e2=9223372036854775807, a2=0, p2=1),
        dict(s1=9, e1=0, a1=1, p1=-1, s2=1, e2=4, a2=1, p2=1),
    ):
        proto, out, report, ctx = _run(PAIR.format(**bounds))
        assert op_counts(out)["Slice"] == 2 and not _counts(report).get("slice_pair")
        assert any("symbolic dimension" in r for r in _reasons(ctx))
        feeds = {"X": np.random.default_rng(0).standard_normal((3, 12, 10)).astype(np.float32)}
        assert_same_outputs(proto, out, feeds, atol=0, rtol=0)


def test_a_slice_read_by_more_than_the_outer_slice_is_not_merged():
    """rotate_half of x[..., :4]: the inner Slice stays for its other reader, so merging would
    remove nothing (and hide the pattern rotary matchers read)."""
    body = (
        "g (float[N,8] X) => (float[N,4] Y, float[N,2] Z)"
        " <int64[1] z = {0}, int64[1] four = {4}, int64[1] two = {2}, int64[1] ax = {1}>"
        " { R = Slice(X, z, four, ax)  H = Slice(R, z, two, ax)  Y = Relu(R)  Z = Neg(H) }"
    )
    proto, out, report, _ = _run(body)
    assert op_counts(out)["Slice"] == 2 and not _counts(report).get("slice_pair")


def test_a_transpose_of_size_one_dims_after_a_reshape_merges_into_it():
    """Reshape to [N, 6, 1, 4] then Transpose(0, 2, 1, 3) to [N, 1, 6, 4]: only a dimension of
    size 1 moves, so it is a Reshape, and the pair is one Reshape (-1 for the batch)."""
    body = (
        "g (float[N,24] X) => (float[N,1,6,4] Y) <int64[4] s = {0, 6, 1, 4}>"
        " { R = Reshape(X, s)  T = Transpose<perm = [0, 2, 1, 3]>(R)  Y = Relu(T) }"
    )
    proto, out, report, _ = _run(body)
    counts = op_counts(out)
    assert counts["Transpose"] == 0 and counts["Reshape"] == 1
    assert _counts(report).get("transpose_of_ones") == 1
    for n in (1, 3):
        feeds = {"X": np.random.default_rng(n).standard_normal((n, 24)).astype(np.float32)}
        assert_same_outputs(proto, out, feeds, atol=0, rtol=0)
    onnx.checker.check_model(out, full_check=True)


@pytest.mark.parametrize(
    "body",
    [  # a dimension of size 6 crosses one of 4; two symbolic dimensions
        "g (float[N,24] X) => (float[N,4,6] Y) <int64[3] s = {0, 6, 4}>"
        " { R = Reshape(X, s)  T = Transpose<perm = [0, 2, 1]>(R)  Y = Relu(T) }",
        "g (float[N,M,4] X) => (float[N,1,M,4] Y) <int64[1] a = {1}>"
        " { R = Unsqueeze(X, a)  T = Transpose<perm = [0, 2, 1, 3]>(R)  Y = Relu(T) }",
    ],
)
def test_a_transpose_that_moves_data_or_has_no_constant_target_stays(body):
    proto, out, report, _ = _run(body)
    assert op_counts(out)["Transpose"] == 1 and not _counts(report).get("transpose_of_ones")
