"""Tied embeddings (the token table is the LM head's weight transposed; the TorchScript
exporter writes the two as separate initializers): in the nbits form one int4 copy serves
both, GatherBlockQuantized reading the LM head's MatMulNBits codes, scales and zero points,
as onnxruntime-genai builds it. An untied table stays float by default."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as oh

from infercc.passes.quantize_int4 import quantize_rtn
from tests.calib.test_int4 import _model, quantized, rel_err, run

V, D = 40, 64


def _lm(tied: bool):
    rng = np.random.default_rng(0)
    table = (0.1 * rng.standard_normal((V, D))).astype(np.float32)
    head = table.T.copy() if tied else (0.1 * rng.standard_normal((D, V))).astype(np.float32)
    ids = oh.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    y = oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", V])
    nodes = [
        oh.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        oh.make_node("Relu", ["e"], ["h"]),
        oh.make_node("MatMul", ["h", "head"], ["logits"], name="lm_head"),
    ]
    return _model(nodes, [ids], [y], {"table": table, "head": head}), table, head


@pytest.mark.parametrize("symmetric", [True, False])
def test_tied_table_shares_the_heads_int4_copy(symmetric):
    proto, table, head = _lm(tied=True)
    out, report = quantized(proto, form="nbits", symmetric=symmetric, block_size=32)
    assert report.quantized == ["lm_head"] and report.embeddings == ["embed"]
    assert report.tied == {"embed": "lm_head"}
    ops = Counter(n.op_type for n in out.graph.node)
    assert ops == {"GatherBlockQuantized": 1, "Reshape": 1, "Relu": 1, "MatMulNBits": 1}
    names = {t.name for t in out.graph.initializer}
    assert not {"table", "head"} & names  # neither float copy is left
    gbq = next(n for n in out.graph.node if n.op_type == "GatherBlockQuantized")
    nbits = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    assert gbq.input[2] == nbits.input[2]  # one set of scales
    codes = quantize_rtn(head, 32, symmetric).dequantize()  # [D, V]
    for shape in [(1, 3), (2, 5)]:  # symbolic batch and sequence at two shapes
        ids = np.random.default_rng(1).integers(0, V, shape)
        got = run(out, {"ids": ids})
        want = np.maximum(codes.T[ids], 0) @ codes
        assert rel_err(got, want) < 1e-5
        assert rel_err(got, np.maximum(table[ids], 0) @ head) < 0.2


def test_untied_table_stays_float_and_excluded_tied_table_too():
    proto, _table, _head = _lm(tied=False)
    _out, report = quantized(proto, form="nbits", symmetric=False, block_size=32)
    assert report.embeddings == [] and report.tied == {}
    assert "embed" in report.kept_float
    proto, _table, _head = _lm(tied=True)
    _out, report = quantized(proto, form="nbits", symmetric=False, exclude=("embed",))
    assert report.embeddings == [] and report.tied == {} and "embed" in report.kept_float


def test_portable_form_keeps_a_tied_table_float():
    proto, _table, _head = _lm(tied=True)
    _out, report = quantized(proto, form="dq", symmetric=False, block_size=32)
    assert report.tied == {} and "embed" in report.kept_float


def _dynamo_lm():
    """The torch dynamo exporter's tied head: one initializer, read by the Gather and, through
    a Transpose that fold-constants leaves unfolded past its limit, by the LM head."""
    rng = np.random.default_rng(0)
    table = (0.1 * rng.standard_normal((V, D))).astype(np.float32)
    ids = oh.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    y = oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", V])
    nodes = [
        oh.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        oh.make_node("Relu", ["e"], ["h"]),
        oh.make_node("Transpose", ["table"], ["table_t"], name="head_t", perm=[1, 0]),
        oh.make_node("MatMul", ["h", "table_t"], ["logits"], name="lm_head"),
    ]
    return _model(nodes, [ids], [y], {"table": table}), table


@pytest.mark.parametrize("form", ["nbits", "dq"])
def test_head_read_through_a_transpose_of_the_table(form):
    proto, table = _dynamo_lm()
    out, report = quantized(proto, form=form, symmetric=False, block_size=32)
    assert report.quantized == ["lm_head"]
    ops = Counter(n.op_type for n in out.graph.node)
    assert "Transpose" not in ops
    if form == "nbits":
        assert report.tied == {"embed": "lm_head"}
        assert ops == {"GatherBlockQuantized": 1, "Reshape": 1, "Relu": 1, "MatMulNBits": 1}
        assert not {t.name for t in out.graph.initializer} & {"table"}
    else:  # the table stays float for the Gather; the head reads a blocked DequantizeLinear
        assert ops == {"Gather": 1, "Relu": 1, "DequantizeLinear": 1, "MatMul": 1}
    codes = quantize_rtn(table.T, 32, False).dequantize()  # [D, V]
    for shape in [(1, 3), (2, 5)]:
        ids = np.random.default_rng(1).integers(0, V, shape)
        got = run(out, {"ids": ids})
        rows = codes.T[ids] if form == "nbits" else table[ids]
        assert rel_err(got, np.maximum(rows, 0) @ codes) < 1e-5
