"""What `calibrate` uses when the user does not say: settings chosen from what the model is.

The plain `infercc calibrate model.onnx --data samples/ -o out` should give the best result
infercc knows for the model, so the range method, the percentile and the accuracy target that
the user leaves out are chosen here, each with the reason the report shows:

- **The model is a transformer** when it has attention: a Softmax over a MatMul of two
  activations (the scores Q x K^T, possibly scaled, masked or cast on the way), or a fused
  attention op. Its activations have rare, large values (after GELU, in the residual stream) that
  min/max ranges spend most of the int8 steps on; the 99.999th percentile of |x| clips those few.
  On all-MiniLM-L6-v2 with held-out English prose, percentile 99.999 with the 0.99 target gave a
  minimum cosine of 0.9904 at 0.48x the fp32 time, where min/max gave 0.9889 at 0.51x.
  A transformer also gets the accuracy target min cosine 0.99 (the worst output, against fp32
  on the held-out samples): when int8 misses it, the most sensitive layers move back to float.
- **Anything else** keeps min/max ranges and no target, so results on CNNs and MLPs are what
  they were: on shufflenet (random weights, six images) the 0.99 target spent all 64 trials to
  move 8 of 50 Convs to float and still missed it (cosine 0.9844 -> 0.9871).

A target the user gives (`min_cosine`, `max_top1_drop`) replaces the chosen one;
`min_cosine=0` turns it off.

**A floor, not a target.** A run with no target (a CNN's default), or whose default target is
still missed at the max_trials cap, is not "passed": its verdict says "no accuracy target" (or
"default target missed") with the cosine measured, and the run fails below the floor
`DEFAULT_MIN_COSINE_FLOOR` (0.9: an int8 model whose worst output is further from fp32 is not
usable; on a zoo CNN with int8 activations infercc once said "passed" at 0.414).
`min_cosine_floor` lowers or raises it (0: no floor); with a target the user gives, the target
decides and a floor is refused as having no effect.

A setting the user gives is always kept, and the report says "given".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infercc.calib.observers import DEFAULT_PERCENTILE
from infercc.ir import Model
from infercc.passes.match import const_value
from infercc.precisions import INT8_COSINE_FLOOR

logger = logging.getLogger(__name__)

TRANSFORMER_METHOD = "percentile"
TRANSFORMER_PERCENTILE = 99.999
OTHER_METHOD = "minmax"
DEFAULT_MIN_COSINE = 0.99
DEFAULT_MIN_COSINE_FLOOR = INT8_COSINE_FLOOR
GIVEN = "given"

# Ops a Softmax's input passes through on the way from the attention scores' MatMul.
_SCORE_OPS = frozenset(
    {"Div", "Mul", "Add", "Sub", "Where", "Cast", "Reshape", "Transpose", "Clip", "Tanh"}
)
_SCORE_DEPTH = 6
FUSED_ATTENTION_OPS = frozenset(
    {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"}
)


@dataclass(frozen=True)
class Choice:
    """One setting: its value and why it is that (`GIVEN` when the user gave it)."""

    value: Any
    why: str

    @property
    def given(self) -> bool:
        return self.why == GIVEN

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "why": self.why, "given": self.given}


@dataclass(frozen=True)
class Settings:
    """The range method, its percentile (percentile method only) and the cosine target."""

    method: Choice
    percentile: Choice | None
    min_cosine: Choice

    def to_dict(self) -> dict[str, Any]:
        data = {"method": self.method.to_dict()}
        if self.percentile is not None:
            data["percentile"] = self.percentile.to_dict()
        data["min_cosine"] = self.min_cosine.to_dict()
        return data


def attention_evidence(ir: Model) -> str | None:
    """What makes `ir` a transformer ("6 Softmax over a MatMul of two activations"), or None."""
    fused = sum(1 for n in ir.graph if n.op_type in FUSED_ATTENTION_OPS)
    softmax = sum(1 for n in ir.graph if n.op_type == "Softmax" and _over_scores(n))
    parts = []
    if softmax:
        parts.append(f"{softmax} Softmax over a MatMul of two activations")
    if fused:
        parts.append(f"{fused} fused attention op(s)")
    return ", ".join(parts) or None


def _over_scores(softmax) -> bool:
    """Whether the Softmax's input comes from a MatMul of two activations within a few
    elementwise/reshaping steps."""
    frontier = [softmax.input(0)]
    for _ in range(_SCORE_DEPTH):
        nodes = [v.producer for v in frontier if v is not None and v.producer is not None]
        for node in nodes:
            if node.op_type == "MatMul" and _two_activations(node.inputs):
                return True
        frontier = [
            v
            for node in nodes
            if node.op_type in _SCORE_OPS
            for v in node.inputs
            if v is not None and const_value(v) is None
        ]
        if not frontier:
            return False
    return False


def _two_activations(inputs: Iterable) -> bool:
    values = [v for v in inputs if v is not None]
    return len(values) == 2 and all(const_value(v) is None for v in values)


def choose(
    ir: Model,
    method: str | None,
    percentile: float | None,
    min_cosine: float | None,
    max_top1_drop: float | None,
) -> Settings:
    """The settings for `ir`: the given ones kept, the others chosen (module doc).

    `percentile` given without `method` means the percentile method. `min_cosine` 0 is the
    user turning the target off (value None)."""
    evidence = attention_evidence(ir)
    if method is not None:
        method_choice = Choice(method, GIVEN)
    elif percentile is not None:
        method_choice = Choice("percentile", "a percentile was given")
    elif evidence:
        method_choice = Choice(TRANSFORMER_METHOD, f"the model is a transformer ({evidence})")
    else:
        method_choice = Choice(
            OTHER_METHOD,
            "the model is not a transformer (no Softmax over a MatMul of two activations)",
        )
    percentile_choice = None
    if method_choice.value == "percentile":
        if percentile is not None:
            percentile_choice = Choice(percentile, GIVEN)
        elif evidence:
            percentile_choice = Choice(
                TRANSFORMER_PERCENTILE, f"the model is a transformer ({evidence})"
            )
        else:
            percentile_choice = Choice(DEFAULT_PERCENTILE, "the percentile method's default")
    if min_cosine is not None:
        cosine_choice = Choice(min_cosine or None, GIVEN)
    elif max_top1_drop is not None:
        cosine_choice = Choice(None, "a top-1 drop target was given")
    elif evidence:
        cosine_choice = Choice(
            DEFAULT_MIN_COSINE, f"the model is a transformer ({evidence}); 0 turns it off"
        )
    else:
        cosine_choice = Choice(
            None,
            "the model is not a transformer: no default target (give one to have "
            "sensitive layers moved to float)",
        )
    settings = Settings(method_choice, percentile_choice, cosine_choice)
    logger.info("calibration settings: %s", settings.to_dict())
    return settings
