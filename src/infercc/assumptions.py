"""Assumptions a user states about the inputs a model will see (`--assume NAME`).

infercc's rewrites are exact by default: the optimized model computes what the original
computes on every input. Some rewrites are exact only on the inputs a deployment actually
feeds: a user who knows that every sequence has at least one real token may say so, and a
rewrite that needs it may then fire. Each assumption here is:

- documented (`doc`, `detail`: what it promises, what changes on an input that breaks it);
- recorded: in the pass context (`PassContext.assumptions`), in the artifact manifest and in
  the report, which lists each assumption with the rewrites it enabled, pass by pass;
- offered: a rewrite refused only because an assumption was not stated is counted
  (`PassContext.wants`), and the report's `assumption_hints` name the assumption, the flag
  and those rewrites (`hints`), so that a user learns what stating it would buy;
- honoured by validation: the random feeds validation generates satisfy it (`honour`), so
  the comparison with the original is made on inputs the assumption allows.

The assumptions:

- `nonempty-sequences`: every attention row keeps at least one position, i.e. no sequence's
  attention mask is all zeros (all padding). torch.onnx writes scaled_dot_product_attention
  with a guard `Where(IsNaN(p), 0, p)` after the Softmax, so that a fully masked row gives
  zeros instead of NaN; under this assumption the guard never fires and is removed, and
  onnxruntime's Attention op is emitted without the NaN filter on its output. On an input
  that breaks it (an all-zero attention_mask row) those rows come out NaN instead of zeros.
  In a causal decoder it also rules out left padding: a padding token before a prompt's
  first real one keeps no key. onnxruntime's GroupQueryAttention (`fuse-group-query-attention`)
  computes such a row over its causal keys where the original spreads it over every key;
  without the assumption the pass fixes those rows up (one flag per step, a Where per layer)
  where torch's mask value makes that exact, and under it leaves the fix-up out (and fuses a
  -1e9 mask at all); the real tokens' results are the same either way. Validation's feeds
  keep the first position of every mask row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from infercc.errors import InferccError

NONEMPTY_SEQUENCES = "nonempty-sequences"

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Assumption:
    """A statement about the inputs (module docstring): its name, a one-line `doc`, the
    `detail` of what changes on an input that breaks it, and `honour`, which makes a feed
    that validation generated satisfy it."""

    name: str
    doc: str
    detail: str
    honour: Callable[[Feeds], Feeds]

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "doc": self.doc, "detail": self.detail}


def _is_mask_like(name: str, array: np.ndarray) -> bool:
    """Bool inputs, and integer inputs whose name says mask: what a generated feed may use as
    an attention mask (index inputs such as input_ids are left alone)."""
    if array.ndim < 1:
        return False
    if array.dtype == np.bool_:
        return True
    return array.dtype.kind in "iu" and "mask" in name.lower()


def _nonempty_rows(feeds: Feeds) -> Feeds:
    """Every row (last axis) of a mask-like input keeps its first position (1, True): no row
    is all zeros, and no causal query row, which sees the first key, is left without one."""
    out = dict(feeds)
    for name, array in feeds.items():
        if not _is_mask_like(name, array) or array.shape[-1] == 0:
            continue
        if np.any(array[..., 0] == 0):
            fixed = array.copy()
            fixed[..., 0] = 1
            out[name] = fixed
    return out


ASSUMPTIONS: dict[str, Assumption] = {
    NONEMPTY_SEQUENCES: Assumption(
        NONEMPTY_SEQUENCES,
        "every attention row keeps at least one position: no sequence is all padding, and "
        "no decoder prompt is padded on the left",
        "removes the NaN guard Where(IsNaN(p), 0, p) after attention Softmax and the NaN "
        "filter on emitted Attention ops; a sequence whose attention_mask is all zeros then "
        "gives NaN instead of zeros. A decoder's attention becomes GroupQueryAttention, which "
        "differs from the original on a left-padded prompt's padding rows",
        _nonempty_rows,
    ),
}


def check_assumptions(names: Iterable[str]) -> tuple[str, ...]:
    """The assumption names, known ones only (InferccError naming an unknown one), deduplicated
    and sorted so that the same set always builds the same model."""
    found = []
    for raw in names:
        name = str(raw).strip().lower()
        if name not in ASSUMPTIONS:
            raise InferccError(
                f"--assume {raw!r} is not an assumption infercc knows",
                "known assumptions: "
                + "; ".join(f"{a.name} ({a.doc})" for a in ASSUMPTIONS.values()),
            )
        found.append(name)
    return tuple(sorted(set(found)))


def honour(feeds: Feeds, names: Iterable[str]) -> Feeds:
    """`feeds` changed so that they satisfy every assumption in `names`."""
    for name in check_assumptions(names):
        feeds = ASSUMPTIONS[name].honour(feeds)
    return feeds


def describe(
    names: Iterable[str], used: Mapping[str, Mapping[str, int]] | None = None
) -> list[dict[str, object]]:
    """The report's form: each assumption with its doc and the rewrites it enabled per pass."""
    used = used or {}
    return [
        {**ASSUMPTIONS[n].to_dict(), "rewrites": dict(sorted(used.get(n, {}).items()))}
        for n in check_assumptions(names)
    ]


def hints(wanted: Mapping[str, Mapping[str, int]] | None) -> list[dict[str, object]]:
    """The report's hint: each assumption the user did not state under which rewrites were
    refused only for want of it (`PassContext.wanted`), with its doc and those rewrites per
    pass, and the flag that states it."""
    return [
        {
            **ASSUMPTIONS[name].to_dict(),
            "rewrites": dict(sorted(per_pass.items())),
            "flag": f"--assume {name}",
        }
        for name, per_pass in sorted((wanted or {}).items())
    ]


def check_used(
    names: Iterable[str],
    used: Mapping[str, Mapping[str, int]] | None,
    readers: Callable[[str], Iterable[str]] = lambda _name: (),
) -> None:
    """InferccError for a stated assumption under which no pass rewrote anything: on this
    model it has no effect (`used` is `PassContext.assumed`; `readers(name)` the passes that
    could have used it, named in the message)."""
    used = used or {}
    for name in check_assumptions(names):
        if any(used.get(name, {}).values()):
            continue
        passes = ", ".join(readers(name))
        by = f" ({passes} found nothing to rewrite)" if passes else ""
        raise InferccError(
            f"--assume {name} has no effect on this model: no pass rewrote anything under it{by}",
            f"drop --assume {name}",
        )
