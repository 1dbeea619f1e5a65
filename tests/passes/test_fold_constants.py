"""fold-constants: Constant nodes, constant subgraphs, static shapes, If with constant cond."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from infercc.ir import import_model
from infercc.passes import PassContext, evaluate, run_passes
from infercc.passes import fold_constants as fc
from tests.helpers import assert_same_outputs, make_model, op_counts, optimize_proto, parse, run_ort

FOLD = ["fold-constants", "eliminate-dead-code"]
HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _fold(text: str, ctx: PassContext | None = None):
    original = parse(HEADER + text if not text.startswith("<") else text)
    out, report = optimize_proto(original, FOLD, ctx)
    return original, out, report


def _counts(report) -> dict[str, int]:
    return report.passes["fold-constants"].counts


def _inits(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def _reasons(ctx: PassContext) -> list[tuple[str, str]]:
    return [(r.op_type, r.reason) for r in ctx.refusals if r.pass_name == "fold-constants"]


def test_constant_chain_folds_to_one_initializer():
    original, out, report = _fold(
        """
        g (float[2,3] x) => (float[2,3] y) {
          a = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
          b = Constant <value_float = 2.0> ()
          c = Mul(a, b)
          d = Add(c, a)
          y = Mul(x, d)
        }"""
    )
    assert op_counts(out) == {"Mul": 1}
    assert len(out.graph.initializer) == 1
    np.testing.assert_array_equal(_inits(out)["d"], np.float32([3, 6, 9]))
    assert _counts(report)["constants"] == 2
    assert _counts(report)["folded"] == 2
    assert_same_outputs(original, out)


@pytest.mark.parametrize(
    ("attr", "expected"),
    [
        ("value_float = 1.5", np.array(1.5, np.float32)),
        ("value_floats = [1.5, 2.5]", np.array([1.5, 2.5], np.float32)),
        ("value_int = 7", np.array(7, np.int64)),
        ("value_ints = [7, 8]", np.array([7, 8], np.int64)),
        ('value_string = "hi"', np.array("hi", dtype=object)),
        ('value_strings = ["a", "b"]', np.array(["a", "b"], dtype=object)),
        ("value = int32[2] {3, 4}", np.array([3, 4], np.int32)),
    ],
)
def test_every_constant_form_becomes_an_initializer(attr, expected):
    dtype = onnx.helper.np_dtype_to_tensor_dtype(expected.dtype)
    type_name = onnx.helper.tensor_dtype_to_string(dtype).split(".")[-1].lower()
    shape = "[" + ",".join(map(str, expected.shape)) + "]" if expected.ndim else ""
    proto = parse(
        HEADER
        + f"""
        g (float[1] x) => ({type_name}{shape} c, float[1] y) {{
          c = Constant <{attr}> ()
          y = Identity(x)
        }}"""
    )
    out, report = optimize_proto(proto, FOLD)
    assert "Constant" not in op_counts(out)
    got = _inits(out)["c"]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tolist() == expected.tolist()
    assert [o.name for o in out.graph.output] == ["c", "y"]
    assert _counts(report)["constants"] == 1


def test_static_shape_chain_folds_into_reshape_constant():
    original, out, report = _fold(
        """
        g (float[2,3,4] x) => (float[2,12] y) <int64[1] m1 = {-1}, int64 zero = {0}> {
          s = Shape(x)
          d = Gather(s, zero)
          u = Unsqueeze(d, zero)
          t = Concat <axis = 0> (u, m1)
          y = Reshape(x, t)
        }"""
    )
    assert op_counts(out) == {"Reshape": 1}
    shape_input = out.graph.node[0].input[1]
    np.testing.assert_array_equal(_inits(out)[shape_input], [2, -1])
    assert _counts(report)["shapes"] == 1
    assert _counts(report)["folded"] == 3
    assert_same_outputs(original, out)


def test_symbolic_dim_is_never_baked():
    original, out, report = _fold(
        """
        g (float[N,3,4] x) => (float[N,12] y) <int64[1] m1 = {-1}, int64 zero = {0}> {
          s = Shape(x)
          d = Gather(s, zero)
          u = Unsqueeze(d, zero)
          t = Concat <axis = 0> (u, m1)
          y = Reshape(x, t)
        }"""
    )
    counts = op_counts(out)
    assert counts["Shape"] == 1 and counts["Gather"] == 1 and counts["Concat"] == 1
    assert _counts(report)["shapes"] == 0
    assert_same_outputs(original, out, {"x": np.ones((5, 3, 4), np.float32)})


def test_shape_start_end_needs_only_the_selected_dims_static():
    original, out, report = _fold(
        """
        g (float[N,3,4] x) => (int64[2] tail, int64[1] head, int64 n) {
          tail = Shape <start = 1> (x)
          head = Shape <end = 1> (x)
          n = Size(x)
        }"""
    )
    assert op_counts(out) == {"Shape": 1, "Size": 1}
    np.testing.assert_array_equal(_inits(out)["tail"], [3, 4])
    assert _counts(report)["shapes"] == 1
    assert_same_outputs(original, out, {"x": np.ones((5, 3, 4), np.float32)})


def test_size_of_static_value_folds_to_a_scalar():
    original, out, report = _fold(
        """
        g (float[2,3] x) => (int64 n) {
          n = Size(x)
        }"""
    )
    assert op_counts(out) == {}
    assert _inits(out)["n"].shape == () and int(_inits(out)["n"]) == 6
    assert_same_outputs(original, out)


def test_quantize_dequantize_with_constant_inputs_stay():
    ctx = PassContext()
    original, out, report = _fold(
        """
        g (float[3] x) => (float[3] y) <float[3] w = {0.5, -1.0, 2.0}, float s = {0.1},
                                         int8 z = {0}> {
          q = QuantizeLinear(w, s, z)
          dq = DequantizeLinear(q, s, z)
          y = Add(x, dq)
        }""",
        ctx,
    )
    assert op_counts(out) == {"QuantizeLinear": 1, "DequantizeLinear": 1, "Add": 1}
    assert ("QuantizeLinear", fc.NEVER_FOLD["QuantizeLinear"]) in _reasons(ctx)
    assert _counts(report)["refused"] >= 1
    assert_same_outputs(original, out)


def test_random_normal_stays():
    ctx = PassContext()
    _, out, report = _fold(
        """
        g (float[2,3] x) => (float[2,3] y) {
          r = RandomNormal <shape = [2, 3]> ()
          y = Add(x, r)
        }""",
        ctx,
    )
    assert op_counts(out) == {"RandomNormal": 1, "Add": 1}
    assert any(op == "RandomNormal" and "random" in why for op, why in _reasons(ctx))


def test_constant_of_shape_over_the_fold_limit_stays():
    ctx = PassContext(options={"fold_limit": 1024})
    original, out, report = _fold(
        """
        g (float[64,64] x) => (float[64,64] y) <int64[2] shp = {64, 64}> {
          c = ConstantOfShape <value = float[1] {2.0}> (shp)
          y = Mul(x, c)
        }""",
        ctx,
    )
    assert op_counts(out) == {"ConstantOfShape": 1, "Mul": 1}
    reasons = [why for op, why in _reasons(ctx) if op == "ConstantOfShape"]
    assert reasons and "16384 bytes" in reasons[0] and "fold limit" in reasons[0]
    assert_same_outputs(original, out)


@pytest.mark.parametrize(
    ("node", "nbytes"),
    [
        ("y = ConstantOfShape <value = float[1] {1.0}> (big)", 4 * 1000 * 1000),
        ("y = Expand(small, big)", 4 * 1000 * 1000),
        ("y = Tile(small, big)", 4 * 1000 * 1000),
        ("y = Range(zero, lim, one)", 4 * 10**6),
    ],
)
def test_balloon_size_is_predicted_before_evaluating(node, nbytes, monkeypatch):
    proto = parse(
        HEADER
        + f"""
        g (float[1] x) => (float[1] out) <int64[2] big = {{1000, 1000}}, float[1,1] small = {{1.0}},
                                          float zero = {{0.0}}, float lim = {{1000000.0}},
                                          float one = {{1.0}}> {{
          {node}
          out = Identity(x)
        }}"""
    )
    node_ir = next(n for n in import_model(proto).graph if n.op_type != "Identity")
    assert evaluate.predicted_nbytes(node_ir) == nbytes

    def boom(*args):
        raise AssertionError("evaluated a node over the fold limit")

    model = import_model(proto)
    model.graph.outputs.append(next(n for n in model.graph if n.op_type != "Identity").output)
    monkeypatch.setattr(evaluate.Evaluator, "_session", boom)
    monkeypatch.setattr(evaluate, "reference", boom)
    ctx = PassContext(options={"fold_limit": 1 << 20})
    run_passes(model, ctx, ["fold-constants"])
    assert any("fold limit" in why for _, why in _reasons(ctx))


IF_MODEL = """
    g (float[3] x) => (float[3] y) <float[3] base = {1.0, 2.0, 3.0}> {
      c = Constant <value = bool {COND}> ()
      y = If(c) <then_branch = t () => (float[3] ty) <float[1] one = {10.0}> {
                    k = Constant <value_float = 1.0> ()
                    s = Add(one, k)
                    ty = Add(x, s)
                  },
                  else_branch = e () => (float[3] ey) {
                    ey = Mul(x, base)
                  }>
    }"""


@pytest.mark.parametrize(("cond", "expected"), [(1, "then"), (0, "else")])
def test_if_with_constant_condition_inlines_the_taken_branch(cond, expected):
    original, out, report = _fold(IF_MODEL.replace("COND", str(cond)))
    assert "If" not in op_counts(out)
    assert op_counts(out) == ({"Add": 1} if expected == "then" else {"Mul": 1})
    assert _counts(report)["ifs"] == 1
    x = np.float32([1, 2, 3])
    want = x + 11 if expected == "then" else x * np.float32([1, 2, 3])
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], want)
    assert_same_outputs(original, out, {"x": x})
    assert [o.name for o in out.graph.output] == ["y"]


def test_if_branch_reading_outer_values_and_feeding_later_nodes():
    original, out, report = _fold(
        """
        g (float[3] x) => (float[3] z) {
          c = Constant <value = bool {1}> ()
          h = Relu(x)
          y = If(c) <then_branch = t () => (float[3] ty) {
                        a = Sigmoid(h)
                        ty = Mul(a, x)
                      },
                      else_branch = e () => (float[3] ey) {
                        ey = Identity(h)
                      }>
          z = Add(y, h)
        }"""
    )
    assert op_counts(out) == {"Relu": 1, "Sigmoid": 1, "Mul": 1, "Add": 1}
    add = next(n for n in out.graph.node if n.op_type == "Add")
    assert add.input[0] == "y"  # the inlined value took the If's output name
    assert_same_outputs(original, out)


def test_if_whose_branch_returns_an_outer_value_keeps_the_output():
    original, out, report = _fold(
        """
        g (float[3] x) => (float[3] y) {
          c = Constant <value = bool {0}> ()
          y = If(c) <then_branch = t () => (float[3] ty) { ty = Neg(x) },
                      else_branch = e () => (float[3] ey) { ey = Identity(x) }>
        }"""
    )
    assert "If" not in op_counts(out)
    assert [o.name for o in out.graph.output] == ["y"]
    assert_same_outputs(original, out)


def test_inlined_branch_with_nested_if_reading_branch_values():
    original, out, report = _fold(
        """
        g (float[3] x, bool d) => (float[3] y) {
          c = Constant <value = bool {1}> ()
          y = If(c) <then_branch = t () => (float[3] ty) {
                        a = Relu(x)
                        ty = If(d) <then_branch = t2 () => (float[3] u) { u = Neg(a) },
                                    else_branch = e2 () => (float[3] v) { v = Exp(a) }>
                      },
                      else_branch = e () => (float[3] ey) { ey = Identity(x) }>
        }"""
    )
    assert op_counts(out) == {"Relu": 1, "If": 1}
    for flag in (True, False):
        feeds = {"x": np.float32([-1, 0, 2]), "d": np.array(flag)}
        assert_same_outputs(original, out, feeds)


def test_inlining_leaves_no_stale_uses_of_outer_values():
    original, out, report = _fold(
        """
        g (float[3] x) => (float[3] y) {
          c = Constant <value = bool {1}> ()
          h1 = Relu(x)
          h2 = Sigmoid(x)
          y = If(c) <then_branch = t () => (float[3] ty) {
                        unused = Neg(h2)
                        ty = Identity(x)
                      },
                      else_branch = e () => (float[3] ey) { ey = Exp(h1) }>
        }"""
    )
    assert op_counts(out) == {"Identity": 1}
    assert_same_outputs(original, out)


def test_if_with_unknown_condition_stays():
    original, out, report = _fold(
        """
        g (float[3] x, bool c) => (float[3] y) {
          y = If(c) <then_branch = t () => (float[3] ty) { ty = Neg(x) },
                      else_branch = e () => (float[3] ey) { ey = Identity(x) }>
        }"""
    )
    assert op_counts(out) == {"If": 1}
    assert _counts(report)["ifs"] == 0


def test_folded_graph_output_keeps_its_name():
    original, out, report = _fold(
        """
        g (float[2] x) => (float[2] y, int64[2] c) <int64[2] a = {1, 2}> {
          c = Add(a, a)
          y = Identity(x)
        }"""
    )
    assert op_counts(out) == {"Identity": 1}
    assert [o.name for o in out.graph.output] == ["y", "c"]
    np.testing.assert_array_equal(_inits(out)["c"], [2, 4])
    assert_same_outputs(original, out)


def test_shared_initializer_is_not_altered():
    original, out, report = _fold(
        """
        g (float[3] x) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> {
          w2 = Mul(w, w)
          a = Mul(x, w)
          y = Add(a, w2)
        }"""
    )
    inits = _inits(out)
    np.testing.assert_array_equal(inits["w"], [1, 2, 3])
    np.testing.assert_array_equal(inits["w2"], [1, 4, 9])
    assert op_counts(out) == {"Mul": 1, "Add": 1}
    assert_same_outputs(original, out)


def test_opset9_shape_chain_with_attribute_axes():
    original, out, report = _fold(
        """<ir_version: 4, opset_import: ["" : 9]>
        g (float[2,3,4] x) => (float[6,4] y) {
          s = Shape(x)
          i0 = Constant <value = int64 {0}> ()
          i1 = Constant <value = int64 {1}> ()
          d0 = Gather <axis = 0> (s, i0)
          d1 = Gather <axis = 0> (s, i1)
          p = Mul(d0, d1)
          u = Unsqueeze <axes = [0]> (p)
          m = Constant <value = int64[1] {-1}> ()
          t = Concat <axis = 0> (u, m)
          y = Reshape(x, t)
        }"""
    )
    assert op_counts(out) == {"Reshape": 1}
    assert_same_outputs(original, out)


def test_loop_stays_but_its_body_folds():
    original, out, report = _fold(
        """
        g (float[2] x) => (float[2] y) <int64 n = {3}, bool t = {1}> {
          y = Loop(n, t, x) <body = b (int64 i, bool cin, float[2] acc) => (bool cout,
                                                                           float[2] next) {
                k = Constant <value = float[2] {1.0, 2.0}> ()
                k2 = Add(k, k)
                next = Add(acc, k2)
                cout = Identity(cin)
              }>
        }"""
    )
    assert op_counts(out) == {"Loop": 1}
    body = out.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node] == ["Add", "Identity"]
    assert _counts(report)["constants"] == 1
    assert_same_outputs(original, out)


def test_failed_evaluation_is_refused_and_the_rest_still_folds():
    ctx = PassContext()
    original, out, report = _fold(
        """
        g (float[1] x) => (int64 y, int64 z) <int64[3] d = {1, 2, 3}, int64 i = {7},
                                               int64 j = {1}> {
          y = Gather(d, i)
          z = Gather(d, j)
        }""",
        ctx,
    )
    assert op_counts(out) == {"Gather": 1}
    assert any(why.startswith("onnxruntime fails on this node") for _, why in _reasons(ctx))
    assert int(_inits(out)["z"]) == 2


def test_custom_domain_is_not_evaluated():
    ctx = PassContext()
    proto = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17, "my.ops" : 1]>
        g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
          y = my.ops.Twice(w)
        }"""
    )
    out, report = optimize_proto(proto, FOLD, ctx, check=False)
    assert op_counts(out) == {"Twice": 1}
    assert any("domain" in why for _, why in _reasons(ctx))


def test_result_dtype_follows_onnx_for_float16():
    original, out, report = _fold(
        """
        g (float16[3] x) => (float16[3] y) <float[3] w = {1.0, 4.0, 9.0}> {
          h = Cast <to = 10> (w)
          r = Sqrt(h)
          m = ReduceMean <keepdims = 1> (r)
          d = Div(r, m)
          y = Mul(x, d)
        }"""
    )
    assert op_counts(out) == {"Mul": 1}
    assert out.graph.initializer[0].data_type == onnx.TensorProto.FLOAT16
    assert_same_outputs(original, out)


def test_second_run_changes_nothing():
    _, out, _ = _fold(IF_MODEL.replace("COND", "1"))
    again, report = optimize_proto(out, FOLD)
    assert report.passes["fold-constants"].changed == 0
    assert op_counts(again) == op_counts(out)


def test_results_keep_onnxruntimes_dtype_and_shape():
    from infercc.ir import Value

    declared = Value("s", onnx.TensorProto.FLOAT, (2,))
    tensor = fc._tensor(np.ones((0, 1, 1), np.float32), declared, "onnxruntime")
    assert tensor.shape == (0, 1, 1) and tensor.dtype == onnx.TensorProto.FLOAT
    as_int64 = Value("i", onnx.TensorProto.INT64)
    tensor = fc._tensor(np.array([3], np.int32), as_int64, "onnx.reference")
    assert tensor.dtype == onnx.TensorProto.INT64 and tensor.numpy().dtype == np.int64


I64_MAX, I32_MAX = np.iinfo(np.int64).max, np.iinfo(np.int32).max


@pytest.mark.parametrize(
    ("op", "attrs", "inputs", "opset"),
    [
        # onnx.reference differs from onnxruntime on these (issue 12 item 1)
        ("Slice", {}, [np.arange(3.0), [-1], [I64_MAX], [0], [-1]], 17),
        ("Slice", {}, [np.arange(3.0), [-1], [I32_MAX], [0], [-1]], 17),
        ("Squeeze", {}, [np.zeros((1, 3, 1), np.float32), np.array([], np.int64)], 17),
        ("LogSoftmax", {}, [np.float32([1000, 0])], 17),
        ("Unique", {"sorted": 0}, [np.float32([3, 1, 2, 1])], 17),
        ("ArgMax", {}, [np.float32([1, np.nan, 3])], 17),
        ("Cast", {"to": onnx.TensorProto.STRING}, [np.float32([-0.0, np.nan, np.inf, 1.5])], 17),
        # the ops numpy used to compute
        ("Unsqueeze", {}, [np.int64(3), np.array([0, -1])], 17),
        ("Unsqueeze", {"axes": [0]}, [np.arange(3)], 9),
        ("Squeeze", {}, [np.ones((1, 3, 1)), np.array([-1])], 17),
        ("Squeeze", {}, [np.ones((1, 3, 1))], 17),
        ("Concat", {"axis": 0}, [np.arange(2), np.arange(3)], 17),
        ("Gather", {"axis": 0}, [np.arange(4), np.array(-1)], 17),
        ("Gather", {"axis": 1}, [np.ones((2, 3), np.float32), np.array([[0, 2]])], 17),
        ("Reshape", {}, [np.arange(6.0), np.array([0, -1])], 17),
        ("Cast", {"to": onnx.TensorProto.INT32}, [np.float32([1.7, -1.7, np.nan, 1e10])], 17),
        ("Cast", {"to": onnx.TensorProto.FLOAT16}, [np.float32([1e-8, 65520, 1 / 3])], 17),
        ("Transpose", {"perm": [1, 0, 2]}, [np.ones((2, 3, 4))], 17),
        ("Add", {}, [np.int64(2**62), np.array([2**62])], 17),
        ("Sub", {}, [np.float16([1, 2]), np.float16([[3]])], 17),
        (
            "ConstantOfShape",
            {"value": numpy_helper.from_array(np.array([5], np.int32))},
            [np.array([], np.int64)],
            17,
        ),
        ("Sqrt", {}, [np.float32([2, 3, 1e-30])], 17),
        ("Exp", {}, [np.float32([0.1, 10, 88.7])], 17),
    ],
)
def test_folded_value_is_what_onnxruntime_computes(op, attrs, inputs, opset):
    """The folded value equals onnxruntime's output for the node, dtype and shape included."""
    arrays = [np.asarray(a, np.int64) if isinstance(a, list) else np.asarray(a) for a in inputs]
    names = [f"i{k}" for k in range(len(arrays))]
    n_out = 4 if op == "Unique" else 1
    outs = [f"o{k}" for k in range(n_out)]
    node = onnx.helper.make_node(op, names, outs, **attrs)
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [],
        [onnx.ValueInfoProto(name=o) for o in outs],
        [numpy_helper.from_array(a, n) for a, n in zip(arrays, names, strict=True)],
    )
    proto = make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    proto.ir_version = 8
    expected = run_ort(proto, {})
    out, report = optimize_proto(proto, FOLD, check=False)
    assert list(out.graph.node) == []
    assert _counts(report)["by_onnxruntime"] + _counts(report)["by_numpy"] == 1
    got = _inits(out)
    for name, want in zip(outs, expected, strict=True):
        value = got[name]
        assert value.shape == want.shape
        if want.dtype == object:
            assert value.tolist() == want.tolist()
        else:
            assert value.dtype == want.dtype or op == "Cast"
            np.testing.assert_array_equal(value.astype(want.dtype), want)


def test_types_the_python_binding_cannot_hold_fold_exactly():
    # bfloat16, float8 and int4 results leave onnxruntime through an exact Cast and come back
    original, out, report = _fold(
        '<ir_version: 10, opset_import: ["" : 21]>'
        + """
        g (float[3] x) => (float[3] y, float[3] z, float[3] u) <float[3] w = {0.3333, -2.5, 7.1}> {
          b = Cast <to = 16> (w)
          y = Cast <to = 1> (b)
          e = Cast <to = 17> (w)
          z = Cast <to = 1> (e)
          i = Cast <to = 22> (w)
          u = Cast <to = 1> (i)
        }"""
    )
    assert list(out.graph.node) == []
    assert _counts(report)["by_onnxruntime"] == 6
    want = run_ort(original, {"x": np.zeros(3, np.float32)})
    values = _inits(out)
    for name, expected in zip(["y", "z", "u"], want, strict=True):
        np.testing.assert_array_equal(values[name], expected)


def test_one_session_evaluates_a_chain():
    _, out, report = _fold(
        """
        g (float[2,3,4] x) => (float[2,12] y, float[4] c)
          <int64[1] z = {0}, int64[1] o = {1}, int64[1] m1 = {-1},
           float[4] w = {1.0, 2.0, 3.0, 4.0}> {
          a = Sqrt(w)
          b = Exp(a)
          c = Neg(b)
          s = Shape(x)
          k = Slice(s, z, o)
          t = Concat <axis = 0> (k, m1)
          y = Reshape(x, t)
        }"""
    )
    counts = _counts(report)
    assert counts["folded"] == 5 and counts["shapes"] == 1
    assert counts["sessions"] == 1 and counts["by_onnxruntime"] == 5


def test_light_resnet50_weights_fold_and_outputs_match():
    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx"
    )
    original = onnx.load(path)
    out, report = optimize_proto(original, FOLD)
    counts = op_counts(out)
    assert "ConstantOfShape" not in counts
    assert counts["Conv"] == 53
    assert _counts(report)["folded"] >= 239
    assert not any(i.name in {t.name for t in out.graph.initializer} for i in out.graph.input)
    rng = np.random.default_rng(0)
    feeds = {"gpu_0/data_0": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    assert_same_outputs(original, out, feeds)


BATCH = """
g (float[4] x) => (float[4] y) <float[4] w = {1.0, 4.0, 9.0, 16.0}> {
  a = Sqrt(w)
  b = Neg(a)
  c = Exp(b)
  d = Sqrt(c)
  y = Add(x, d)
}"""


def _neg_batches_raise(monkeypatch, error: Exception) -> None:
    """Every onnxruntime batch holding a Neg raises `error` (load or run failure, injected)."""
    session = evaluate.Evaluator._session

    def patched(self, nodes, known):
        if any(n.op_type == "Neg" for n in nodes):
            raise error
        return session(self, nodes, known)

    monkeypatch.setattr(evaluate.Evaluator, "_session", patched)


def test_a_node_onnxruntime_cannot_load_is_split_out_of_its_batch(monkeypatch):
    """The batch fails to load: it is halved until the node at fault is alone, which
    onnx.reference evaluates; the rest stay onnxruntime's."""
    _neg_batches_raise(monkeypatch, evaluate._LoadError("no kernel for Neg"))
    original, out, report = _fold(BATCH)
    counts = _counts(report)
    assert op_counts(out) == {"Add": 1}
    assert counts["by_reference"] == 1 and counts["by_onnxruntime"] == 3
    assert counts["sessions"] > 1
    assert_same_outputs(original, out)


def test_a_node_onnxruntime_fails_to_run_is_refused_and_its_readers_stay(monkeypatch):
    _neg_batches_raise(monkeypatch, evaluate._RunError("Neg failed"))
    ctx = PassContext()
    original, out, report = _fold(BATCH, ctx)
    assert op_counts(out) == {"Neg": 1, "Exp": 1, "Sqrt": 1, "Add": 1}
    assert ("Neg", "onnxruntime fails on this node: Neg failed") in _reasons(ctx)
    assert_same_outputs(original, out)


def _segfault(model, feeds):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_crash_in_onnx_reference_leaves_the_node_unfolded(monkeypatch):
    """onnx.reference runs in the fork server: a native crash there (injected) is a refusal
    naming the signal, and the process goes on."""
    from infercc import isolation

    if not isolation.ENABLED:
        pytest.skip("no fork() on this platform")
    _neg_batches_raise(monkeypatch, evaluate._LoadError("no kernel for Neg"))
    monkeypatch.setattr(evaluate, "_evaluate_reference", _segfault)
    isolation.reset()  # the next fork server sees the patched function
    try:
        ctx = PassContext()
        original, out, report = _fold(BATCH, ctx)
    finally:
        monkeypatch.undo()
        isolation.reset()
    assert op_counts(out) == {"Neg": 1, "Exp": 1, "Sqrt": 1, "Add": 1}
    assert any(op == "Neg" and "killed by SIGSEGV" in why for op, why in _reasons(ctx))
    assert _counts(report).get("by_reference", 0) == 0
    assert_same_outputs(original, out)
