"""The pass library. Importing this package registers every pass: it imports each of its
modules, so a new pass is its own module (`@register_pass`) and one line in a pipeline of
`infercc.passes.pipelines`, which names every pipeline; `infercc.passes.rules` is the
rewrite-rule contract and `infercc.passes.match` the helpers rules match with."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from infercc.passes.manager import (
    DEFAULT_PIPELINE,
    OPTIONS,
    REGISTRY,
    PassContext,
    PassOption,
    PassResult,
    PipelineReport,
    condition,
    option_fields,
    register_option,
    register_pass,
    run_passes,
)
from infercc.passes.pipelines import PIPELINES, Pipeline, pipelines_of

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")  # registers the passes it defines

from infercc.passes.fp16 import Fp16Settings  # noqa: E402  (each option's record, from its owner)
from infercc.passes.quantize_int4 import Int4Settings  # noqa: E402
from infercc.passes.quantize_qdq import QuantizeSettings  # noqa: E402

__all__ = [
    "DEFAULT_PIPELINE",
    "OPTIONS",
    "PIPELINES",
    "REGISTRY",
    "Fp16Settings",
    "Int4Settings",
    "PassContext",
    "PassOption",
    "PassResult",
    "Pipeline",
    "PipelineReport",
    "QuantizeSettings",
    "catalog",
    "declarations_table",
    "register_option",
    "register_pass",
    "run_passes",
]


def catalog() -> dict[str, list[dict[str, Any]]]:
    """Every pipeline (its stages of pass names), every registered pass (its one-line
    description, the pipelines it runs in, and what it declared at registration: the
    assumptions it may use, the context options it reads, the conditions it requires and
    ensures), pipelines' passes first, in their order, and the options and conditions those
    declarations name: what `infercc passes` lists, derived from the registry."""
    names = [n for p in PIPELINES.values() for n in p.passes if n in REGISTRY]
    names = list(dict.fromkeys([*names, *sorted(REGISTRY)]))
    named = dict.fromkeys(c for n in names for c in (*REGISTRY[n].requires, *REGISTRY[n].ensures))
    return {
        "pipelines": [
            {"name": p.name, "stages": [list(s) for s in p.stages], "doc": p.doc}
            for p in PIPELINES.values()
        ],
        "passes": [
            {
                "name": n,
                "doc": REGISTRY[n].doc,
                "pipelines": pipelines_of(n),
                "final": REGISTRY[n].final,
                "once": REGISTRY[n].once,
                "assumptions": list(REGISTRY[n].assumptions),
                "reads": list(REGISTRY[n].reads),
                "requires": list(REGISTRY[n].requires),
                "ensures": list(REGISTRY[n].ensures),
            }
            for n in names
        ],
        "options": option_fields(),
        "conditions": [{"name": c, "doc": condition(c).doc} for c in named],
    }


def declarations_table() -> str:
    """The Markdown table of what every pass declares (docs/passes.md holds it, between
    `<!-- declarations -->` markers; a test compares the two)."""
    rows = [
        "| pass | pipelines | reads | assumes | requires | ensures |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for p in catalog()["passes"]:
        cells = [p["pipelines"], p["reads"], p["assumptions"], p["requires"], p["ensures"]]
        text = [", ".join(f"`{x}`" for x in c) or "-" for c in cells]
        rows.append(f"| `{p['name']}` | " + " | ".join(text) + " |")
    return "\n".join(rows)
