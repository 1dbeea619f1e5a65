"""Facts about ONNX operators that several parts of infercc rely on, written once.

- **Domains.** The standard domain has two spellings, `""` and `"ai.onnx"`; onnxruntime's
  contrib ops live in `com.microsoft`.
- **Random ops** draw new values at every run: folding one would freeze one sample, merging
  two would make them draw the same values, and their output type is an attribute. Dropout
  draws only in training mode, so it is listed apart (`DRAWS_IN_TRAINING`): a pass that can
  prove inference mode may treat it as deterministic, one that cannot must not.
- **Quantization ops** are the standard ops of quantized models: the QDQ pair
  (QuantizeLinear, DequantizeLinear), DynamicQuantizeLinear, and the integer compute ops
  (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger). A backend needs them as written:
  they are never folded, their float scales never change type, and a model holding one is an
  int8 model. `INT8_COMPUTE_OPS` are the ops that compute in int8 (for the roofline), the
  integer ops above and onnxruntime's contrib ops its optimizer makes of QDQ models
  (`com.microsoft` QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul, the QLinear* family).
- **Control-flow ops** hold subgraphs (If, Loop, Scan; SequenceMap's body is a graph too).
- **Non-tensor ops** output a sequence or an optional, which no tensor constant can stand for
  (`NON_TENSOR_OPS`; If, Loop and OptionalGetElement may too, depending on their inputs).
"""

from __future__ import annotations

STANDARD_DOMAINS = ("", "ai.onnx")
MS_DOMAIN = "com.microsoft"

RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)
DRAWS_IN_TRAINING = frozenset({"Dropout"})

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
QUANTIZATION_OPS = QDQ_OPS | frozenset(
    {"DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}
)
INT8_COMPUTE_OPS = frozenset(
    {
        "ConvInteger",
        "MatMulInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
    }
)

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

NON_TENSOR_OPS = frozenset(
    {
        "SequenceEmpty",
        "SequenceConstruct",
        "SequenceInsert",
        "SequenceErase",
        "SplitToSequence",
        "SequenceMap",
        "Optional",
    }
)


def is_standard_domain(domain: str) -> bool:
    """Whether `domain` names the standard ONNX operator set."""
    return domain in STANDARD_DOMAINS


def default_opset(opset_imports: dict[str, int]) -> int:
    """The standard domain's opset version in `opset_imports` (either spelling).

    A model that imports no standard opset has no standard node (the importer refuses one that
    does), so the fallback only decides what a standard node a pass creates would mean: the
    newest version the installed onnx knows, as for a model being written today.
    """
    version = opset_imports.get("", opset_imports.get("ai.onnx"))
    if version is not None:
        return int(version)
    import onnx

    return int(onnx.defs.onnx_opset_version())
