"""The int8 form a calibration writes, chosen by its target (`infercc.analysis.cpu_classes`).

`plan_int8(target, activations, weight_bits)` decides, once per run, what the quantized model
looks like and how it can be checked on this host:

- **The form.** A CPU row gives its weight width (8 bits where the int8 kernels sum products
  in int32: VNNI, AMX, arm64; 7 bits, |q| <= 64, where they sum u8 x s8 pairs in int16 with
  saturation: AVX2, AVX-512 without VNNI), uint8 activations and the QDQ format. A GPU
  (TensorRT) takes 8-bit weights and int8 activations. `weight_bits` and `activations` given
  by the user override the row; 8-bit weights for a row whose kernels saturate them are
  refused (the model would compute something else there), and 7 bits are refused for a GPU
  (TensorRT runs 8-bit weights exactly, so they would only cost resolution).
- **How it is checked.** When the target is this host (`--target cpu`, or the name of the
  host's own row), the kernel check runs (`infercc.calib.kernels`: each quantized node fused
  and unfused on real values; a node whose kernel disagrees stays float, with the cause and
  the remedy), candidates are evaluated with onnxruntime's fused int8 kernels, and int8 is
  raced against fp32. For another target the host's kernels are not the target's: the
  candidates are evaluated as their Q/DQ graph in float (onnxruntime with optimizations off),
  which is what the target's kernels compute exactly for the row's form, and the kernel check
  and the speed race are not run; the report lists both as not measured, and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnxruntime as ort

from infercc.analysis.cpu_classes import CpuClass
from infercc.errors import InferccError

WEIGHT_BITS_CHOICES = ("auto", "8", "7")
AMX_BUG = ((1, 21), (1, 25))  # onnxruntime#26324: wrong u8 x s8 products on AMX, fixed in 1.25


@dataclass(frozen=True)
class Int8Plan:
    """The int8 form of one calibration, and what of it this host can measure."""

    target: str
    kind: str  # "cpu" | "gpu"
    row: str | None  # the target's CPU row
    host_row: str | None  # this host's CPU row
    on_host: bool  # the target's kernels are this host's
    weight_bits: int
    activations: str
    reason: str  # why this form
    format: str = "qdq"
    given: tuple[str, ...] = ()  # "weight_bits", "activations": set by the user
    not_measured: tuple[str, ...] = field(default=())

    @property
    def fused_evaluation(self) -> bool:
        """Evaluate with onnxruntime's fused int8 kernels (this host is the target)."""
        return self.on_host

    @property
    def evaluated_with(self) -> str:
        if self.on_host:
            return f"onnxruntime's int8 kernels on this host ({self.host_row or 'CPU'})"
        return (
            "the Q/DQ graph in float (onnxruntime, optimizations off), which the target's "
            "kernels compute exactly"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "cpu_class": self.row,
            "host_cpu_class": self.host_row,
            "on_host": self.on_host,
            "weight_bits": self.weight_bits,
            "activations": self.activations,
            "format": self.format,
            "reason": self.reason,
            "given": list(self.given),
            "evaluated_with": self.evaluated_with,
            "not_measured": list(self.not_measured),
        }


def plan_int8(target: str, activations: str = "auto", weight_bits: str | int = "auto") -> Int8Plan:
    """The int8 form for `target` (module doc); InferccError for a form it cannot run."""
    from infercc.analysis.targets import get_target, host_cpu_info

    t = get_target(target)
    host = host_cpu_info()[0].row
    host_row = None if host is None else host.name
    bits = _check_bits(weight_bits)
    given = tuple(
        name for name, value in (("weight_bits", bits), ("activations", activations))
        if value not in (None, "auto")
    )  # fmt: skip
    if t.kind == "gpu":
        return _gpu_plan(t.name, activations, bits, host_row, given)
    row = t.row if t.cpu_class is not None else None
    return _cpu_plan(t.name, t.host, row, activations, bits, host_row, given)


def _check_bits(weight_bits: str | int) -> int | None:
    text = str(weight_bits).strip().lower()
    if text not in WEIGHT_BITS_CHOICES:
        raise InferccError(
            f"--weight-bits {weight_bits!r} is not a weight width",
            "use auto (the target's row decides), 8 or 7",
        )
    return None if text == "auto" else int(text)


def _gpu_plan(
    name: str, activations: str, bits: int | None, host_row: str | None, given: tuple[str, ...]
) -> Int8Plan:
    if bits == 7:
        raise InferccError(
            f"--weight-bits 7 has no use on the {name} target: TensorRT runs 8-bit weights "
            "exactly, so 7 bits would only cost resolution",
            "drop --weight-bits (7 bits are for CPUs without VNNI, e.g. --target x86-avx2)",
        )
    return Int8Plan(
        name,
        "gpu",
        None,
        host_row,
        False,
        8,
        "int8" if activations == "auto" else activations,
        "TensorRT's int8 form: 8-bit symmetric weights and activations",
        given=given,
        not_measured=_not_here(name, host_row),
    )


def _cpu_plan(
    name: str,
    on_host: bool,
    row: CpuClass | None,
    activations: str,
    bits: int | None,
    host_row: str | None,
    given: tuple[str, ...],
) -> Int8Plan:
    row_bits = 8 if row is None else row.int8.weight_bits
    if bits == 8 and row_bits == 7:
        assert row is not None
        raise InferccError(
            f"--weight-bits 8 cannot run exactly on {row.name}: without VNNI its int8 kernels "
            "sum u8 x s8 pairs in int16 with saturation, and 2 x 255 x 127 > 2**15",
            f"drop --weight-bits (7 bits is {row.name}'s form), or build for a row with VNNI "
            "(--target x86-avx512-vnni)",
        )
    chosen = row_bits if bits is None else bits
    if row is None:
        reason = "no CPU row for this host: 8-bit weights, checked by the kernel check"
    elif bits is None:
        reason = f"{row.name}: {row.int8.reason}"
    else:
        reason = f"{chosen}-bit weights as given ({row.name} takes {row_bits})"
    return Int8Plan(
        name,
        "cpu",
        None if row is None else row.name,
        host_row,
        on_host,
        chosen,
        "uint8" if activations == "auto" else activations,
        reason,
        given=given,
        not_measured=() if on_host else _not_here(name, host_row),
    )


def _not_here(target: str, host_row: str | None = None) -> tuple[str, ...]:
    here = f"this host is {host_row}" if host_row else "this host is a CPU"
    return (
        f"kernel check: the {target} target's int8 kernels are not on this host ({here})",
        f"speed: int8 against fp32 is measured on the target only ({here})",
    )


def kernel_cause(plan: Int8Plan, version: str | None = None) -> str:
    """Why onnxruntime's fused int8 kernel on this host can disagree with its Q/DQ graph, and
    what to do: the remedy the report names beside a node kept in float."""
    version = version or ort.__version__
    if amx_bug(plan.host_row, version) or amx_bug(_hardware_row(), version):
        return (
            f"onnxruntime {version} computes some u8 x s8 products wrong on AMX-INT8 CPUs "
            "(onnxruntime#26324, fixed in 1.25): kept in float; upgrade onnxruntime to 1.25 or "
            "later to run it in int8"
        )
    return (
        f"no known cause in onnxruntime {version} on {plan.host_row or 'this CPU'}: kept in "
        "float, so the model computes what its Q/DQ graph means"
    )


def _hardware_row() -> str | None:
    """The row this host's CPU flags give, whatever row INFERCC_CPU_CLASS states: onnxruntime's
    kernels pick their instructions from the hardware, not from the stated row."""
    from infercc.analysis.targets import host_cpu_info

    row = host_cpu_info()[0].detected_row
    return None if row is None else row.name


def amx_bug(host_row: str | None, version: str | None = None) -> bool:
    """Whether onnxruntime `version` (the installed one) has onnxruntime#26324 on a host of
    row `host_row`: wrong u8 x s8 products on AMX-INT8, 1.21 to 1.24."""
    version = version or ort.__version__
    return host_row == "x86-amx" and AMX_BUG[0] <= _version(version) < AMX_BUG[1]


def _version(text: str) -> tuple[int, int]:
    parts = [int(p) for p in text.split(".")[:2] if p.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


# --------------------------------------------------------------------------- int4


@dataclass(frozen=True)
class Int4Row:
    """What the target's CPU row says about MatMulNBits, and whether it is this host."""

    row: str | None  # None: no CPU row (a GPU or an unknown CPU)
    accuracy_level: int  # the row's level: 4 where it has an int8 kernel, else 0
    block_size: int
    on_host: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu_class": self.row,
            "accuracy_level": self.accuracy_level,
            "block_size": self.block_size,
            "on_host": self.on_host,
        }


def int4_row(target: str, default_block: int) -> Int4Row:
    """The int4 facts of `target`'s row (level 0 and `default_block` where it has none)."""
    from infercc.analysis.targets import get_target

    t = get_target(target)
    if t.kind != "cpu" or t.cpu_class is None:
        return Int4Row(None, 0, default_block, t.kind == "cpu")
    row = t.row
    return Int4Row(row.name, row.int4.accuracy_level, row.int4.block_size, t.host)


def accuracy_level_decision(
    facts: Int4Row, p10: float | None, p90: float | None, keeps: bool, on_data: bool = False
) -> tuple[int, str]:
    """(level, why) for `--accuracy-level auto`.

    The target's row decides first: a row without an int8 kernel for MatMulNBits takes 0
    (fp32 compute). Elsewhere level 4 (int8 compute) is the row's level, and two things can
    overrule it. Accuracy, only where it was measured on the user's samples (`on_data`:
    held-out agreement on real data, `keeps` False when level 4 lost more than the bound):
    on generated inputs the logits are random, and their top-1 flips with noise a trained
    model does not have, so the change is reported but vetoes nothing. Speed, where the
    target is this host (p10..p90 of the time ratio of level 4 to level 0): a race that
    level 4 clearly loses (p10 above 1) takes 0; a race that crosses 1 says nothing either
    way and leaves the row's level."""
    where = facts.row or "this target"
    if facts.accuracy_level == 0:
        return 0, f"{where} has no int8 kernel for MatMulNBits: fp32 compute"
    if on_data and not keeps:
        return 0, "int8 compute lost accuracy on the held-out samples (--data)"
    accuracy = (
        "as accurate on the held-out samples (--data)"
        if on_data
        else "accuracy on random inputs reported, not a veto (give --data to measure it)"
    )
    if not facts.on_host or p10 is None or p90 is None:
        return (
            4,
            f"{where}'s level (int8 compute), not raced: this host is not the target; {accuracy}",
        )
    if p10 > 1.0:
        return 0, "int8 compute is slower on this host (p10 of the time ratio above 1)"
    if p90 < 1.0:
        return 4, f"int8 compute is faster on this host (time ratio p90 below 1); {accuracy}"
    return 4, (
        f"the race was noisy (time ratio p10..p90 {p10:.2f}..{p90:.2f} crosses 1), so "
        f"{where}'s level stands: int8 compute; {accuracy}"
    )
