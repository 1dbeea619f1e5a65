"""The reports of a ci run: JSON, JUnit XML and Markdown (appended to `$GITHUB_STEP_SUMMARY`)."""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from infercc.ci.results import CiReport, ModelResult
from infercc.outputs import write_text_atomic
from infercc.util import json_float, json_text, num

# --------------------------------------------------------------------------- reports


def write_reports(
    report: CiReport,
    junit: str | os.PathLike[str] | None = None,
    json_report: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    step_summary: bool = True,
) -> None:
    """Write the JUnit, JSON and Markdown files asked for, and the GitHub step summary."""
    if junit is not None:
        write_text_atomic(junit, junit_xml(report))
    if json_report is not None:
        write_text_atomic(json_report, json_text(report.to_dict(), indent=1) + "\n")
    text = None
    if markdown is not None or (step_summary and os.environ.get("GITHUB_STEP_SUMMARY")):
        text = ci_markdown(report)
    if markdown is not None:
        write_text_atomic(markdown, text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(text + "\n")


def junit_xml(report: CiReport) -> str:
    """JUnit XML: one testsuite, one testcase per model; a model that failed a check (its
    validation, its latency budget) has a <failure>, one that could not be checked (a crash,
    a missing file, an exception) an <error>, each with the reason."""
    errors = len(report.errors())
    failures = len(report.failures()) - errors
    suites = ET.Element(
        "testsuites", tests=str(len(report.models)), failures=str(failures), errors=str(errors)
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="infercc ci",
        tests=str(len(report.models)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{report.seconds:.3f}",
    )
    for m in report.models:
        case = ET.SubElement(
            suite, "testcase", classname="infercc.ci", name=m.name, time=f"{m.seconds:.3f}"
        )
        if not m.passed:
            kind = "error" if m.error else "failure"
            element = ET.SubElement(case, kind, message=m.reason or "failed", type=m.stage)
            element.text = json_text(m.to_dict(), indent=1)
        ET.SubElement(case, "system-out").text = _summary_line(m)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _summary_line(m: ModelResult) -> str:
    parts = [f"{m.path} -> {m.output or '-'}", f"precision {m.precision}"]
    if m.nodes_before is not None:
        parts.append(f"nodes {m.nodes_before} -> {m.nodes_after}")
    cosine = _worst_cosine(m.validation)
    if cosine is not None:
        parts.append(f"worst cosine {num(cosine, '.6f')}")
    if m.latency and m.latency.get("p50_ms") is not None:
        parts.append(f"p50 {num(m.latency['p50_ms'], '.3f')} ms")
    placed = placement_text(m.placement)
    if placed:
        parts.append(placed)
    return ", ".join(parts)


def placement_text(placement: Mapping[str, Any] | None) -> str | None:
    """ "built on HOST (A100), queued 0.2 s, ran 3.1 s" for a model built by `--ray`."""
    p = placement or {}
    if p.get("host") is None:
        return None
    where = p["host"] + (f" ({p['accelerator']})" if p.get("accelerator") else "")
    queued, ran = num(p.get("queued_s"), ".1f"), num(p.get("running_s"), ".1f")
    text = f"built on {where}, queued {queued} s, ran {ran} s"
    if p.get("attempts", 1) > 1:
        first = p.get("first_attempt") or {}
        text += f", attempt {p['attempts']}"
        text += f" (the first on {first.get('host')}: {first.get('reason')})"
    return text


def _worst_cosine(validation: Mapping[str, Any] | None) -> float | None:
    """The smallest cosine over outputs of a validation dict (None when there is none). A
    near-constant output's cosine is n/a (null), not a bad one: it is left out; any other
    missing or non-finite cosine ranks worst (NaN)."""
    values = []
    for out in (validation or {}).get("outputs", {}).values():
        c = out.get("cosine")
        if c is None and out.get("near_constant"):
            continue
        values.append(float(c) if isinstance(c, (int, float)) else math.nan)
    if not values:
        return None
    return min(values, key=lambda v: (not math.isnan(v), v))


def worst_metrics(validation: Mapping[str, Any] | None) -> dict[str, Any]:
    """Largest max_abs and smallest cosine over outputs, JSON-safe (for tables)."""
    outs = list((validation or {}).get("outputs", {}).values())
    max_abs = [o["max_abs"] for o in outs if isinstance(o.get("max_abs"), (int, float))]
    return {
        "max_abs": json_float(max(max_abs)) if max_abs else None,
        "cosine": json_float(_worst_cosine(validation)),
    }


def ci_markdown(report) -> str:
    """The Markdown summary of `infercc ci` (for $GITHUB_STEP_SUMMARY and --markdown)."""
    n = len(report.failures())
    head = "all passed" if n == 0 else f"{n} of {len(report.models)} failed"
    lines = [
        f"## infercc ci: {head}",
        "",
        "| model | status | precision | nodes | max abs | cosine | p50 ms | budget ms | reason |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for m in report.models:
        w = worst_metrics(m.validation)
        lat = m.latency or {}
        cells = [
            m.name,
            "passed" if m.passed else ("**ERROR**" if m.error else "**FAILED**"),
            m.precision or "-",
            "-" if m.nodes_before is None else f"{m.nodes_before} → {m.nodes_after}",
            num(w["max_abs"], ".3g"),
            num(w["cosine"], ".6f"),
            num(lat.get("p50_ms"), ".3f"),
            num(lat.get("budget_ms"), "g"),
            m.reason or "",
        ]
        lines.append("| " + " | ".join(_md_cell(str(c)) for c in cells) + " |")
    if report.ray is not None:
        lines += _md_placements(report)
    return "\n".join(lines) + "\n"


def _md_placements(report) -> list[str]:
    """Where each model was built under `--ray`, below the verdicts."""
    lines = [
        "",
        f"Built on the Ray cluster at {report.ray.get('address')} "
        f"({len(report.ray.get('nodes', []))} node(s)):",
        "",
        "| model | host | accelerator | queued s | ran s | attempts |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for m in report.models:
        p = m.placement or {}
        cells = [
            m.name,
            p.get("host") or "-",
            p.get("accelerator") or "-",
            num(p.get("queued_s"), ".1f"),
            num(p.get("running_s"), ".1f"),
            p.get("attempts", "-"),
        ]
        lines.append("| " + " | ".join(_md_cell(str(c)) for c in cells) + " |")
    return lines


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
