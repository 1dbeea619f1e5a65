"""Declared graph-output types that contradict what the graph computes, replaced by the computed
ones, so that every written model passes `onnx.checker.check_model(full_check=True)`.

A trained model may declare an output `[1, seqlen]` while its last Reshape, by a target
`[0, 1, -1]` computed at run time, gives rank 3: onnx's strict inference cannot see the
target, so the original passes the checker, and onnxruntime (which runs the graph, not the
declaration) returns rank 3. Once fold-constants makes that target a constant, strict
inference infers rank 3 and rejects the declared rank 2. The declaration was never what the
model computes, so it is replaced (the computed rank, and each dimension onnx's inference or
the symbolic shapes give; unknown ones are left unnamed), and the report says so.

Only a contradiction that infercc's rewrites exposed is replaced: the original passes onnx's
strict inference (`strictly_typed`, checked before the passes), the result does not, and the
contradiction is another rank or two static sizes that differ. A model whose original onnx
already rejects (where onnx's inference is wrong about what onnxruntime computes) keeps its
declarations: onnx's inference is no better a witness than the declaration there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from infercc.ir import symbolic as S
from infercc.ir.exporter import export_model
from infercc.ir.graph import ANONYMOUS_DIM_PARAMS, Model, Value
from infercc.ir.shapes import _typed_skeleton, add_weightless_constants
from infercc.ir.symbolic_shapes import SymbolicShapes

log = logging.getLogger(__name__)

Dims = tuple[int | str | None, ...]


@dataclass(frozen=True)
class OutputTypeChange:
    """One output whose declared shape was replaced by the computed one."""

    output: str
    declared: Dims
    computed: Dims

    def to_dict(self) -> dict[str, object]:
        return {
            "output": self.output,
            "declared": list(self.declared),
            "computed": list(self.computed),
        }

    def message(self) -> str:
        return (
            f"output {self.output!r} declared {_text(self.declared)}, the graph computes "
            f"{_text(self.computed)}: the declaration was replaced by the computed type"
        )


def strictly_typed(model: Model) -> bool:
    """Whether onnx's strict inference accepts the model's declared types (weights aside)."""
    try:
        onnx.shape_inference.infer_shapes(_declared_skeleton(model), strict_mode=True)
    except Exception:
        return False
    return True


def _declared_skeleton(model: Model) -> onnx.ModelProto:
    """The model without weight bytes, its declared types kept, small constants inlined."""
    skeleton = export_model(model, with_weights=False)
    del skeleton.graph.initializer[:]
    add_weightless_constants(model, skeleton.graph)
    return skeleton


def reconcile_output_types(model: Model, original_typed: bool) -> list[OutputTypeChange]:
    """Replace each graph output's declared shape that the graph contradicts (module
    docstring), when the original passed strict inference (`original_typed`) and the result
    does not; returns what was replaced."""
    if not original_typed or strictly_typed(model):
        return []
    inferred = _inferred_outputs(model)
    changes = []
    for v in model.graph.outputs:
        declared = _declared(v)
        computed = inferred.get(v.name)
        if declared is None or computed is None or not _contradicts(declared, computed):
            continue
        computed = _named(model, v, computed)
        _declare(v, computed)
        change = OutputTypeChange(v.name, declared, computed)
        log.info("%s", change.message())
        changes.append(change)
    return changes


def _inferred_outputs(model: Model) -> dict[str, Dims]:
    """Each output's shape as onnx's inference computes it with the declarations dropped."""
    proto = _typed_skeleton(model)  # no weight bytes; small constants (targets) kept
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception as exc:  # inference that fails says nothing about the declarations
        log.debug("output types not checked: %s", exc)
        return {}
    out = {}
    for vi in inferred.graph.output:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape"):
            out[vi.name] = tuple(_dim(d) for d in tt.shape.dim)
    return out


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    if d.HasField("dim_param") and not d.dim_param.startswith("unk__"):
        if d.dim_param in ANONYMOUS_DIM_PARAMS:
            return None
        return d.dim_param
    return None


def _declared(v: Value) -> Dims | None:
    tp = v.type_proto
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    return tuple(_dim(d) for d in tp.tensor_type.shape.dim)


def _contradicts(declared: Dims, computed: Dims) -> bool:
    if len(declared) != len(computed):
        return True
    return any(
        isinstance(a, int) and isinstance(b, int) and a != b
        for a, b in zip(declared, computed, strict=True)
    )


def _named(model: Model, v: Value, computed: Dims) -> Dims:
    """Unknown dimensions named from the symbolic shapes where they give the same rank."""
    algebra = S.algebra_for(model.graph)
    symbolic = SymbolicShapes(algebra).shape(v)
    if symbolic is None or len(symbolic) != len(computed):
        return computed
    with S.using(algebra):
        return tuple(
            c if c is not None else S.to_text(s) for c, s in zip(computed, symbolic, strict=True)
        )


def _declare(v: Value, dims: Dims) -> None:
    tp = onnx.TypeProto()
    tp.CopyFrom(v.type_proto)
    shape = tp.tensor_type.shape
    shape.Clear()
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        elif isinstance(d, str):
            dim.dim_param = d
    v.type_proto = tp
    v.shape = dims


def _text(dims: Dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
