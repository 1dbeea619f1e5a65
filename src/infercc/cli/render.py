"""Rendering reports for people (rich tables). The JSON form is each report's `to_dict()`.

Tables never cut a value: numbers never wrap (nor get an ellipsis), names and text fold onto
more lines when a terminal is narrow, and on a pipe or CI log the console is wide enough
(`infercc.cli.app.PIPE_WIDTH`) that every row prints whole, names included. Shapes print as
`[batch, 128, 64]`, as errors write them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infercc.analysis.model_info import InspectReport
from infercc.api import OptimizeReport
from infercc.check.compare import ValidationReport
from infercc.cli.app import detail, is_tty
from infercc.cli.units import (
    accuracy_table,
    hint_line,
    human_bytes,
    human_count,
    num,
    number_column,
    prose,
    render_bisect_verdict,
    render_refusals,
    scaled,
    shape_text,
    shapes_text,
    table,
    text_column,
)
from infercc.precisions import TARGET_PRECISIONS


def render_optimize(
    report: OptimizeReport, console: Console, explain: bool = False, level: int | None = None
) -> None:
    """The report of `infercc optimize` at `level` (`infercc.cli.app.detail`, from -q / -v
    unless given): -1 the two summary lines and the verdict; 0 also the passes that changed
    the model, the op counts and what validation saw; 1 also every pass, the refusals' count
    and the coverage of each If/Loop body. `explain` lists refusals and float32 nodes."""
    level = detail() if level is None else level
    console.print(_optimize_header(report), highlight=False)
    bodies = (
        f" (+{report.body_nodes_before} -> {report.body_nodes_after} in If/Loop bodies)"
        if report.body_nodes_before or report.body_nodes_after
        else ""
    )
    console.print(
        f"nodes {report.nodes_before} -> {report.nodes_after}{bodies}   "
        f"size {human_bytes(report.size_before)} -> {human_bytes(report.size_after)}   "
        f"{report.iterations} round(s){'' if report.reached_fixpoint else ' (step cap reached)'}"
        f"   {num(report.seconds, '.2f')} s"
    )
    if level >= 0:
        _render_body(report, console, level)
    if report.validation is not None:
        render_validation(report.validation, console, level, report.precision)
        if report.validation.error is not None:
            console.print(
                "[red]the model infercc wrote does not run in onnxruntime: this is infercc's "
                "failure, not the input model's[/]"
            )
        _render_bisect_outcome(report, console)
        if not report.validation.passed:
            console.print("[red]validation failed: the optimized model was not written[/]")
    else:
        console.print("validation skipped (--no-validate)")
    if level >= 0 or explain:
        _render_precision(report, console, explain)
    if level >= 0:
        _render_assumptions(report, console)
        _render_output_types(report, console)
        if report.artifact is not None:
            _render_artifact(report.artifact, console)
    if explain:
        render_refusals(report.refusals, console)
    elif level >= 1 and report.refusals:
        console.print(f"{len(report.refusals)} rewrite(s) refused; --explain lists them")


def _optimize_header(report: OptimizeReport) -> str:
    """`in.onnx -> out.onnx (+ out.memory_plan.json)  (target cpu)`: the files written beside
    the model are named (an artifact directory's are listed by its own line)."""
    from pathlib import Path

    written = ""
    if report.artifact is None and len(report.files) > 1:
        written = " (+ " + ", ".join(Path(f).name for f in report.files[1:]) + ")"
    return (
        f"[bold]{escape(report.input)}[/] -> [bold]{escape(report.output)}[/]"
        f"{escape(written)}  (target {report.target})"
    )


def _render_body(report: OptimizeReport, console: Console, level: int) -> None:
    """What the build did: the shapes it was fixed to, the passes, the op counts."""
    if report.static_shapes:
        fixed = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in report.static_shapes.items())
        console.print(f"[yellow]valid only for the input shapes {fixed}[/] (--static-shapes)")
    passes = _passes_table(report, every=level >= 1)
    if passes.row_count:
        console.print(passes)
    else:
        console.print(f"no pass changed the model (-v lists the {len(report.passes)} that ran)")
    console.print(_ops_table(report))


def _render_precision(report: OptimizeReport, console: Console, explain: bool) -> None:
    if report.precision == "fp32" or (report.precision != "fp16" and not report.kept_fp32):
        return  # bf16 and int8 are not graph rewrites of optimize: the backend's line says
    console.print(
        f"precision {report.precision}: {len(report.kept_fp32)} node(s) kept in float32"
        + ("" if explain or not report.kept_fp32 else " (--explain lists them)")
    )
    if explain:
        for k in report.kept_fp32:
            prose(console, f"{k['node']} ({k['op']}): {k['reason']}", indent="  ")


def _render_bisect_outcome(report: OptimizeReport, console: Console) -> None:
    """The pass a failed validation was bisected to, or the command that would find it."""
    if report.bisect is not None:
        render_bisect_verdict(report.bisect, console)
    elif report.bisect_hint is not None:
        console.print(f"{escape(report.bisect_hint)}: {escape(_rerun_with_bisect())}")


def _rerun_with_bisect() -> str:
    """This command line with --bisect added (or how to add it, outside the infercc CLI)."""
    import shlex
    import sys
    from pathlib import Path

    if Path(sys.argv[0]).name not in ("infercc", "__main__.py") or "optimize" not in sys.argv:
        return "infercc optimize ... --bisect"
    return shlex.join(["infercc", *sys.argv[1:], "--bisect"])


def _render_artifact(artifact: dict, console: Console) -> None:
    backend = artifact["backend"]
    console.print(
        f"artifact [bold]{artifact['path']}[/] built with {backend['name']} "
        f"{backend.get('version', '')} in {num(artifact.get('compile_seconds', 0), '.2f')} s",
        highlight=False,
    )
    for p in backend.get("points", []):
        so = p.get("session_options", {})
        shapes = shapes_text(p.get("shapes", {}))
        console.print(
            f"  {p['name']}: {shapes or 'default shapes'} -> {p.get('provider', '')}, "
            f"{so.get('graph_optimization_level', '')}, {so.get('intra_op_num_threads', '')} "
            f"intra-op threads, {so.get('execution_mode', '')}: "
            f"{num(p.get('median_ms') or 0, '.3f')} ms (cache {p.get('cache', '')})",
            highlight=False,
        )
    if backend.get("name") == "openvino":
        _render_openvino(artifact, console)
    if artifact.get("race"):
        _render_race(artifact["race"], console)


def _render_race(race: dict, console: Console) -> None:
    """--backend auto: what was raced and what was kept."""
    if race.get("cache") != "miss":
        why = race.get("why") or "the tuning cache's choice for this model, shape and host"
        console.print(f"  auto: {race.get('chosen')} ({race.get('cache')}: {why})", highlight=False)
        return
    parts = []
    for c in race.get("candidates", []):
        figure = c.get("median_ms")
        parts.append(
            f"{c['backend']} {num(figure, '.3f')} ms" if figure is not None
            else f"{c['backend']} dropped ({c.get('skipped')})"
        )  # fmt: skip
    console.print(
        f"  auto: raced {', '.join(parts)} at {shapes_text(race.get('shapes', {}))}; kept "
        f"{race.get('chosen')}",
        highlight=False,
    )


def _render_openvino(artifact: dict, console: Console) -> None:
    """What OpenVINO ran (read back from the compiled model) and the artifact's validation."""
    backend = artifact["backend"]
    layers = ", ".join(f"{n} {p}" for p, n in (backend.get("layers") or {}).items()) or "none"
    console.print(
        f"  {backend.get('device', 'CPU')} ({backend.get('cpu_class') or 'unknown CPU class'}): "
        f"ran {backend.get('precision_used')}, compute layers {layers}; inference precision "
        f"{backend.get('hint')} (cache {backend.get('cache', '')})",
        highlight=False,
    )
    checked = artifact.get("validation")
    if checked is None:
        return
    validation = checked.get("validation") or {}
    outputs = validation.get("outputs") or {}
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    cosines = [m.get("cosine") for m in outputs if m.get("cosine") is not None]
    worst = f", worst cosine {min(cosines):.6f}" if cosines else ""
    criterion = validation.get("min_cosine")
    profiles = len(validation.get("profiles") or [])
    console.print(
        f"  artifact validated against the original under onnxruntime fp32 at {profiles} "
        f"shape profile(s) ({checked.get('precision')}: cosine >= {criterion}){worst}: "
        f"{'passed' if checked.get('passed') else 'FAILED'}",
        highlight=False,
    )


_NOT_REWRITES = ("runs", "changed", "time_s")


def _did_something(stats: dict[str, Any]) -> bool:
    """A pass changed the model (an older report without `changed`: it counted a rewrite)."""
    if "changed" in stats:
        return bool(stats["changed"])
    return any(v for k, v in stats.items() if k not in (*_NOT_REWRITES, "refused"))


def _passes_table(report: OptimizeReport, every: bool = False) -> Table:
    """The passes that changed the model and their rewrites; `every`: all passes, with the
    refusals they counted."""
    shown = {n: st for n, st in report.passes.items() if every or _did_something(st)}
    title = "passes"
    if not every and len(shown) < len(report.passes):
        title = f"passes: {len(shown)} of {len(report.passes)} changed the model (-v lists all)"
    t = table(title)
    text_column(t, "pass")
    text_column(t, "rewrites")
    number_column(t, "time")
    skip = _NOT_REWRITES if every else (*_NOT_REWRITES, "refused")
    for name, st in shown.items():
        counts = {k: v for k, v in st.items() if k not in skip and v}
        text = ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"
        t.add_row(name, text, f"{num(scaled(st['time_s'], 1000), '.1f')} ms")
    return t


def _ops_table(report: OptimizeReport) -> Table:
    t = table("ops")
    text_column(t, "op")
    for col in ("before", "after", "delta"):
        number_column(t, col)
    for op in sorted(set(report.ops_before) | set(report.ops_after)):
        a, b = report.ops_before.get(op, 0), report.ops_after.get(op, 0)
        delta = f"{b - a:+d}" if b != a else ""
        t.add_row(op, str(a), str(b), delta)
    return t


def _render_assumptions(report: OptimizeReport, console: Console) -> None:
    """Each assumption stated, what it promises and the rewrites it enabled per pass; each not
    stated under which rewrites were refused only for want of it, with its flag."""
    for a in report.assumptions:
        rewrites = a.get("rewrites") or {}
        enabled = ", ".join(f"{p} {n}" for p, n in rewrites.items()) or "no rewrite"
        console.print(
            f"assumed [bold]{a['name']}[/] ({a['doc']}): enabled {enabled}; the model is exact "
            "only on inputs that satisfy it",
            highlight=False,
        )
    for h in report.assumption_hints:
        console.print(hint_line(h), highlight=False)


def _render_output_types(report: OptimizeReport, console: Console) -> None:
    """Declared output types the graph contradicted, replaced by the computed ones."""
    for c in getattr(report, "output_types", None) or []:
        console.print(
            f"[yellow]output {escape(c['output'])}: declared {shape_text(c['declared'])}, the "
            f"graph computes {shape_text(c['computed'])}; the declaration was replaced by the "
            "computed type[/] (onnx's full checker rejects the declared one)",
            highlight=False,
        )


def tolerance_text(v: ValidationReport, precision: str | None = None) -> str:
    """The criterion validation applied: `atol 0.0001, rtol 0.001, cosine >= 0.9999 (fp32)`,
    or `cosine >= 0.999 (fp16)` where no elementwise bound applies (infercc.precisions)."""
    import math

    parts = [
        f"{name} {num(value, 'g')}"
        for name, value in (("atol", v.atol), ("rtol", v.rtol))
        if value is not None and math.isfinite(value)
    ]
    parts.append(f"cosine >= {num(v.min_cosine, 'g')}")
    return ", ".join(parts) + (f" ({precision})" if precision else "")


def render_validation(
    v: ValidationReport, console: Console, level: int = 0, precision: str | None = None
) -> None:
    """The verdict and its criterion; at `level` >= 0 also the profiles, notes and the table
    of outputs; why each failed output failed, always, on a line of its own under the table
    (never inside a column, where a narrow terminal would break its words)."""
    status = "[green]passed[/]" if v.passed else "[red]FAILED[/]"
    console.print(
        f"validation {status} on {v.samples} sample(s): {escape(tolerance_text(v, precision))}",
        highlight=False,
    )
    if v.ran_on and level >= 0:
        prose(console, f"ran on {v.ran_on}", indent="  ")
    if level >= 0:
        _render_profiles(v, console)
    if v.error is not None:
        prose(console, v.error, style="red")
    if v.outputs and level >= 0:
        console.print(_outputs_table(v))
        large_rel = [m for m in v.outputs.values() if m.passed and (m.max_rel or 0) > v.rtol]
        if large_rel:
            by = "; ".join(f"{m.name}: {m.decided_by or 'elementwise'}" for m in large_rel)
            prose(
                console,
                "max rel is the largest |optimized - original| / |original| over the elements: "
                "large where the original is near zero; an output passes when every element "
                "is within atol + rtol x |original|, or on the criterion its 'decided by' "
                f"names ({by})",
                indent="  ",
            )
        for m in v.outputs.values():
            if m.note is not None:
                prose(console, f"{m.name}: {m.note}", indent="  ")
    for m in v.failures():
        prose(console, f"{m.name}: {m.reason or 'failed'}", indent="  ", style="red")
    rounding = v.rounding_only()
    if rounding is not None:
        prose(console, rounding, style="yellow")
    if v.coverage is not None and (level >= 0 or not v.coverage.passed):
        render_coverage(v.coverage, console, tree=level >= 1)


def _render_profiles(v: ValidationReport, console: Console) -> None:
    for i, p in enumerate(v.profiles, 1):
        shapes = ", ".join(f"{k}=[{', '.join(map(str, s))}]" for k, s in p["shapes"].items())
        values = "".join(f", {k}={val}" for k, val in p.get("values", {}).items())
        ok = {True: "passed", False: "[red]failed[/]", None: "-"}[p.get("passed")]
        console.print(
            f"  profile {i} ({p['source']}): {escape(shapes + values) or 'no inputs'}: {ok}",
            highlight=False,
        )
    for note in v.notes:
        prose(console, f"note: {note}", indent="  ")


def _outputs_table(v: ValidationReport) -> Table:
    t = table()
    text_column(t, "output")
    for col in ("max abs", "max rel", "cosine", "out of tol"):
        number_column(t, col)
    text_column(t, "decided by")
    t.add_column("ok", no_wrap=True)
    for m in v.outputs.values():
        t.add_row(
            escape(m.name),
            _num(m.max_abs),
            _num(m.max_rel),
            "n/a" if m.near_constant and m.cosine is None else _num(m.cosine, ".6f"),
            _num(m.frac_out_of_tol, ".2%"),
            m.decided_by or "-",
            "yes" if m.passed else "[red]no[/]",
        )
    return t


def render_coverage(c, console: Console, tree: bool = True) -> None:
    """Which rewritten If/Loop bodies the validation inputs ran: the count, each rewritten
    body (with `tree`; else those that never ran), and what it means."""
    if not c.bodies:
        return
    rewritten = [b for b in c.bodies if b.rewritten is not False]
    console.print(
        f"coverage: {len(c.bodies)} If/Loop/Scan bod{'y' if len(c.bodies) == 1 else 'ies'}, "
        f"{len(rewritten)} rewritten (or not known to be untouched), "
        f"{len(c.unexecuted)} of them not run by the validation inputs",
        highlight=False,
    )
    for b in rewritten if tree else [b for b in rewritten if b.executed is False]:
        ran = {True: "ran", False: "[red]never ran[/]", None: "not measured"}[b.executed]
        by = f" by {', '.join(b.passes)}" if b.passes else ""
        console.print(f"  {escape(b.path)} (rewritten{by}): {ran}", highlight=False)
    if c.error:
        prose(console, c.error, indent="  ")
    message = c.message()
    if message is not None:
        style = "red" if c.strict else "yellow"
        suffix = "" if c.strict else " (--strict-coverage makes this a failure)"
        prose(console, message + suffix, style=style)


def _tail(text: str, width: int, console: Console) -> str:
    """The end of a long name on a terminal (hierarchical names say most at their end); the
    whole name on a pipe or log."""
    if not is_tty(console.file) or len(text) <= width:
        return text
    return "…" + text[-(width - 1) :]


_num = num


def render_inspect(r: InspectReport, console: Console) -> None:
    console.print(f"[bold]{r.path}[/]  {human_bytes(r.size)}  IR {r.ir_version}  {r.producer}")
    console.print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in r.opsets.items()))
    io = table("inputs and outputs")
    for col in ("", "name", "dtype", "shape"):
        text_column(io, col)
    for kind, items in (("in", r.inputs), ("out", r.outputs)):
        for t in items:
            io.add_row(kind, escape(t.name), t.dtype, shape_text(t.shape))
    console.print(io)
    ops = table(f"{r.nodes} nodes")
    text_column(ops, "op")
    number_column(ops, "count")
    for op, n in sorted(r.ops.items(), key=lambda kv: (-kv[1], kv[0])):
        ops.add_row(op, str(n))
    console.print(ops)
    console.print(
        f"parameters {human_count(r.parameters)} ({human_bytes(r.parameter_bytes)})   "
        f"FLOPs {human_count(r.flops)}"
        + "".join(f"   {op} {human_count(f)}" for op, f in r.flops_by_op.items())
    )
    if r.shape_profile:
        console.print("shape profile: " + shapes_text(r.shape_profile), highlight=False)
    if r.flops_unknown_nodes:
        console.print(
            f"{len(r.flops_unknown_nodes)} compute node(s) have unknown shapes; "
            "pin symbolic inputs with --shape NAME=1x3x224x224",
            highlight=False,
        )
    if r.roofline is not None and r.target is not None:
        _render_roofline(r, console)


def _render_roofline(r: InspectReport, console: Console) -> None:
    roof, tgt, mem = r.roofline, r.target, r.memory
    assert roof is not None and tgt is not None and mem is not None
    t = table(f"ten slowest nodes on {_target_label(tgt)} (roofline)")
    for col in ("node", "op", "FLOPs", "bytes", "FLOP/B", "ridge", "bound", "time"):
        if col in ("node", "op", "bound"):
            text_column(t, col)
        else:
            number_column(t, col)
    for n in roof["top"]:
        t.add_row(
            escape(_tail(n["name"], 28, console)),
            n["op_type"],
            human_count(n["flops"]),
            human_bytes(n["bytes_read"] + n["bytes_written"]),
            _num(n["intensity"], ".1f"),
            _num(n["ridge_point"], ".1f"),
            n["bound"],
            f"{num(scaled(n['time_s'], 1e6), '.2f')} us",
        )
    console.print(t)
    console.print(
        f"roofline latency {num(scaled(roof['total_time_s'], 1e3), '.3f')} ms "
        "(a lower bound for one inference; "
        f"{roof['main_precision']}, {len(roof['nodes'])} nodes)"
    )
    batch = mem.get("largest_batch")
    if batch is not None and batch >= 65536:
        batch = ">= 65536 (the search limit)"
    console.print(
        f"memory on {tgt['name']}: weights {human_bytes(mem['weights_bytes'])} + arena "
        f"{human_bytes(mem['arena_bytes'])} + workspace {human_bytes(mem['workspace_bytes'])} = "
        f"{human_bytes(mem['total_bytes'])} of {human_bytes(mem['memory_bytes'])} "
        f"({'fits' if mem['fits'] else '[red]does not fit[/]'})"
        + (f"; largest batch that fits: {batch}" if batch is not None else "")
    )
    if mem.get("decoder"):
        from infercc.cli.render_decoder import render_decoder_memory

        render_decoder_memory(mem["decoder"], tgt["name"], console)


def _target_label(tgt: dict) -> str:
    """`cpu (x86-avx2)` for the host, a row or GPU by its name."""
    row = tgt.get("cpu_class")
    name = tgt["name"]
    return f"{name} ({row['name']})" if row and row["name"] != name else name


def render_targets(targets, console: Console) -> None:
    t = table("targets: dense peak TFLOP/s (TOP/s for int8)")
    text_column(t, "name")
    for col in ("GB", "GB/s", *TARGET_PRECISIONS, "cc"):
        number_column(t, col)
    text_column(t, "int8 w")
    for tg in targets:
        peaks = [
            num(scaled(tg.peak_flops[p], 1e-12), ".1f") if p in tg.peak_flops else "-"
            for p in TARGET_PRECISIONS
        ]
        t.add_row(
            tg.name,
            num(scaled(tg.memory_bytes, 1e-9), ".0f"),
            num(scaled(tg.memory_bandwidth, 1e-9), ".0f"),
            *peaks,
            tg.compute_capability or "-",
            f"{tg.row.int8.weight_bits}-bit" if tg.cpu_class else "8-bit",
        )
    console.print(t)
    for tg in targets:
        console.print(f"[bold]{tg.name}[/]: {tg.description}", highlight=False)
        if tg.cpu_class and tg.name == "cpu":
            continue  # its row's line follows
        if tg.cpu_class:
            row = tg.row
            vnni = "int32 sums" if row.int8.weight_bits == 8 else "int16 pair sums"
            console.print(
                f"  int8: {row.int8.weight_bits}-bit weights ({vnni}); int4: accuracy_level "
                f"{row.int4.accuracy_level}, block {row.int4.block_size}",
                highlight=False,
            )
            fastest = ", ".join(f"{b} {p}" for b, p in row.fastest)
            console.print(
                f"  bf16: {'yes (--bf16, openvino)' if row.has_bf16 else 'no'}; fastest build "
                f"(--backend auto races, default first): {fastest}",
                highlight=False,
            )


def render_cache_entries(path, entries: list[dict], console: Console) -> None:
    console.print(f"tuning cache {path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    if not entries:
        return
    t = table()
    for col in ("digest", "backend", "provider", "shapes"):
        text_column(t, col)
    for col in ("hits", "tuning s"):
        number_column(t, col)
    for e in entries:
        t.add_row(
            e["digest"][:12],
            f"{e['backend']} {e['backend_version']}",
            e["provider"],
            e["shapes"],
            "-" if e["hits"] is None else str(e["hits"]),
            f"{num(e['tuning_seconds'], '.2f')}",
        )
    console.print(t)


# What runs a model or artifact, by the backend `open_source` names (a plug-in: its name).
_RUNTIMES = {
    "onnxruntime": "onnxruntime, default session options",
    "ort": "onnxruntime, the artifact's tuned session options",
    "none": "onnxruntime, default session options (an artifact of --backend none)",
    "tensorrt": "TensorRT",
}


def runtime_label(backend: str) -> str:
    """What runs a bench: `onnxruntime, default session options`, never a bare `none`."""
    return _RUNTIMES.get(backend, f"backend {backend}")


def render_bench(report, console: Console) -> None:
    console.print(
        f"[bold]{escape(report.path)}[/] on {escape(runtime_label(report.backend))}",
        highlight=False,
    )
    host = report.host
    console.print(
        f"on {host.get('cpu')} ({host.get('cpu_class') or 'no CPU class'}), "
        f"{host.get('cores')} cores, onnxruntime {host.get('onnxruntime')}",
        highlight=False,
    )
    t = table()
    number_column(t, "batch")
    text_column(t, "input shapes")
    for col in ("runs", "p50 ms", "p90 ms", "p99 ms", "mean ms", "samples/s"):
        number_column(t, col)
    for r in report.results:
        t.add_row(
            str(r.batch),
            shapes_text(r.shapes),
            str(r.iters),
            f"{num(r.p50_ms, '.3f')}",
            f"{num(r.p90_ms, '.3f')}",
            f"{num(r.p99_ms, '.3f')}",
            f"{num(r.mean_ms, '.3f')}",
            f"{num(r.throughput, ',.1f')}",
        )
    console.print(t)
    for r in report.results:
        for note in r.notes:
            prose(console, f"note: {note}")
    for r in report.results:
        if r.profile is not None:
            _render_profile(r.batch, r.profile, console)


def _render_profile(batch: int, p: Any, console: Console, top: int = 10) -> None:
    """The op types that take the time, then the slowest nodes (onnxruntime's names)."""
    t = table(
        f"profile, batch {batch}: kernel time {num(p.kernel_ms, '.3f')} ms per run ({p.runs} runs, "
        "onnxruntime's profiler)"
    )
    text_column(t, "op")
    for col in ("calls/run", "ms/run", "share"):
        number_column(t, col)
    for o in p.ops[:top]:
        t.add_row(escape(o.name), num(o.calls, "g"), num(o.ms, ".4f"), num(o.share, ".1%"))
    console.print(t)
    if len(p.ops) > top:
        console.print(f"{len(p.ops) - top} more op type(s) in --json", highlight=False)
    n = table(f"slowest nodes, batch {batch}")
    text_column(n, "node")
    text_column(n, "op")
    for col in ("ms/run", "share"):
        number_column(n, col)
    for o in p.nodes:
        n.add_row(escape(o.name), o.op_type, f"{num(o.ms, '.4f')}", f"{num(o.share, '.1%')}")
    console.print(n)


def render_compare(report, console: Console) -> None:
    console.print(
        f"A = {report.path_a} on {runtime_label(report.backend_a)}\n"
        f"B = {report.path_b} on {runtime_label(report.backend_b)}",
        highlight=False,
    )
    t = table("interleaved runs: ratio = time B / time A per pair")
    for col in ("batch", "pairs", "A p50 ms", "B p50 ms", "ratio p50", "ratio p10..p90"):
        number_column(t, col)
    text_column(t, "faster")
    for r in report.results:
        t.add_row(
            str(r.batch),
            str(r.a.iters),
            f"{num(r.a.p50_ms, '.3f')}",
            f"{num(r.b.p50_ms, '.3f')}",
            f"{num(r.ratio_median, '.3f')}",
            f"{num(r.ratio_p10, '.3f')}..{num(r.ratio_p90, '.3f')}",
            r.faster,
        )
    console.print(t)
    if report.max_abs_diff is not None:
        console.print(f"outputs: max abs difference {num(report.max_abs_diff, '.3g')}")


def _settings_line(settings: dict) -> str:
    """The summary line, e.g. "settings: method percentile (chosen: ...); ..."."""
    names = {"method": "method", "percentile": "percentile", "min_cosine": "min cosine"}
    parts = []
    for key, choice in settings.items():
        value = "none" if choice["value"] is None else choice["value"]
        why = "given" if choice["given"] else f"chosen: {choice['why']}"
        parts.append(f"{names.get(key, key)} {value} ({why})")
    return "settings: " + "; ".join(parts)


def render_calibration(report, console: Console, explain: bool = False) -> None:
    """`infercc calibrate`'s int8 report; `explain` lists every refused rewrite, as
    optimize's."""
    d = report.to_dict()
    status = _verdict_word(d)
    samples = ", ".join(f"{k} {v}" for k, v in d["samples"].items())
    console.print(
        f"[bold]{d['model']}[/] -> [bold]{d['out_dir']}[/]  int8 QDQ ({d['activations']} "
        f"activations), {d['method']} ranges ({samples}), {d['quantized_nodes']} node(s) "
        f"quantized  {status}",
        highlight=False,
    )
    conversion = d.get("opset_conversion")
    if conversion:
        console.print(
            f"converted opset {conversion['from']} -> {conversion['to']} for int8 "
            "quantization; accuracy measured against the original model",
            highlight=False,
        )
    t = accuracy_table("int8 against fp32", d["outputs"], _num)
    console.print(t)
    _print_int8_form(d.get("int8"), console)
    settings = d.get("settings")
    if settings:
        console.print(_settings_line(settings), highlight=False)
    split = d.get("outlier_channels") or {}
    decided = d.get("outlier_split") or {}
    if split:
        channels = sum(len(v) for v in split.values())
        why = f" ({decided['why']})" if decided.get("why") else ""
        found = len(decided.get("found") or split)
        console.print(
            f"outlier channels: {len(split)} of {found} projection(s) split, {channels} "
            f"channel(s) kept float beside their int8 MatMul{why}",
            highlight=False,
        )
    elif decided.get("found"):
        console.print(
            f"outlier channels: found in {len(decided['found'])} projection(s), not split: "
            f"{decided['why']} (--min-cosine higher to split them)",
            highlight=False,
        )
    by_reason: dict[str, list[str]] = {}
    for k in d["kept_float"]:
        if k["cause"] == "outliers":
            continue
        if k["cause"] == "sensitivity":
            console.print(f"kept in float: {k['node']}: {k['reason']}", highlight=False)
        else:
            by_reason.setdefault(k["reason"], []).append(k["node"])
    for reason, nodes in by_reason.items():
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        console.print(f"kept in float: {shown}: {reason}", highlight=False)
    if d["message"]:
        console.print(d["message"], highlight=False)
    speed = d.get("speed")
    if speed:
        style = "bold red" if speed["slower"] else "default"
        console.print(f"speed: {speed['message']}", style=style, highlight=False)
    if explain:
        render_refusals(d["refusals"], console)


def _verdict_word(d: dict) -> str:
    """The calibration's verdict as its summary line ends: "passed" only when an accuracy
    target was checked and met (`infercc.calib.report.VERDICTS`)."""
    if not d["passed"]:
        return "[red]FAILED[/]"
    verdict = d.get("verdict", "passed")
    if verdict == "passed":
        return "[green]passed[/]"
    return f"[yellow]{escape(verdict)}[/]"


def _print_int8_form(form: dict | None, console: Console) -> None:
    """The int8 form the target got (`infercc.calib.forms`) and what this host did not
    measure."""
    if not form:
        return
    row = form["cpu_class"]
    name = form["target"] if row in (None, form["target"]) else f"{form['target']} ({row})"
    console.print(
        f"int8 form for {name}: {form['weight_bits']}-bit weights, "
        f"{form['activations']} activations, {form['format'].upper()}; {form['reason']}",
        highlight=False,
    )
    console.print(f"evaluated with {form['evaluated_with']}", highlight=False)
    for item in form["not_measured"]:
        console.print(f"not measured: {item}", highlight=False)


def render_candidate(report, console: Console) -> None:
    """`infercc validate`: what was compared, the per-output table, the bisection."""
    against = f"goldens {report.golden}" if report.golden else f"reference {report.reference}"
    if report.saved_golden:
        console.print(f"goldens written to [bold]{escape(report.saved_golden)}[/]")
    if report.validation is None:
        return
    console.print(
        f"[bold]{escape(report.candidate)}[/] against {escape(against)}  "
        f"(precision {report.precision})",
        highlight=False,
    )
    render_validation(report.validation, console, detail(), report.precision)
    if report.criterion is not None:
        console.print(f"criterion: {escape(report.criterion)}", highlight=False)
    if report.bisect is not None:
        render_bisect(report.bisect, console)


def render_bisect(b, console: Console) -> None:
    """The verdict of `--bisect`: the pass, the rewrite and the first diverging node."""
    if not b.reproduced or b.guilty_pass is None:
        console.print(f"bisect: {escape(b.message)} ({b.trials} rebuilds)", highlight=False)
    else:
        console.print(f"bisect ({b.trials} rebuilds): guilty pass [bold]{escape(b.guilty_pass)}[/]")
        if len(b.suspects) > 1:
            console.print(f"  passes whose absence alone fixes it: {', '.join(b.suspects)}")
        if b.granularity == "rewrite" and b.first_bad is not None:
            console.print(
                f"  rewrite {b.first_bad} of {b.total}: node {escape(str(b.rewrite_node))} "
                f"({b.rewrite_op})",
                highlight=False,
            )
        elif b.granularity == "run" and b.first_bad is not None:
            console.print(f"  run {b.first_bad} of {b.total} (the pass does not count rewrites)")
    if b.build is not None:
        where = {"manifest": "recorded in the manifest", "build": "of this run"}.get(
            b.settings, "the defaults"
        )
        console.print(f"  rebuilt with the build {where} (--json: bisect.build)")
    d = b.divergence
    if d is not None:
        ref = ""
        if d.reference_node is not None:
            ref = f", {escape(d.reference_node)} ({d.reference_op}) in the reference"
        console.print(
            f"  outputs first diverge at node [bold]{escape(d.node)}[/] ({d.op_type}){ref}: "
            f"tensor {escape(d.tensor)}, max abs {_num(d.max_abs)}, "
            f"cosine {_num(d.cosine, '.6f')}",
            highlight=False,
        )


def render_ci(report, console: Console) -> None:
    """`infercc ci`: one row per model, then the reason of each failure."""
    from infercc.ci.reports import worst_metrics

    t = table(f"infercc ci {escape(report.config)}")
    text_column(t, "model")
    t.add_column("status", no_wrap=True)
    t.add_column("precision", no_wrap=True)
    for col in ("nodes", "max abs", "cosine", "p50 ms"):
        number_column(t, col)
    placed = report.ray is not None
    if placed:
        t.add_column("built on", no_wrap=True)
        number_column(t, "queued s")
        number_column(t, "ran s")
    for m in report.models:
        w = worst_metrics(m.validation)
        row = [
            escape(m.name),
            "[green]passed[/]" if m.passed else ("[red]ERROR[/]" if m.error else "[red]FAILED[/]"),
            m.precision or "-",
            "-" if m.nodes_before is None else f"{m.nodes_before} -> {m.nodes_after}",
            num(w["max_abs"], ".3g"),
            num(w["cosine"], ".6f"),
            num((m.latency or {}).get("p50_ms"), ".3f"),
        ]
        t.add_row(*row, *(_placement_cells(m.placement) if placed else ()))
    console.print(t)
    for m in report.failures():
        console.print(f"[red]{escape(m.name)}[/]: {escape(m.reason or 'failed')}", highlight=False)
    n = len(report.failures())
    verdict = "[green]all passed[/]" if n == 0 else f"[red]{n} of {len(report.models)} failed[/]"
    where = ""
    if placed:
        nodes = len(report.ray.get("nodes", []))
        where = f" on {nodes} Ray node(s) at {escape(str(report.ray.get('address')))}"
    seconds = num(report.seconds, ".1f")
    console.print(f"{len(report.models)} model(s){where}, {verdict} in {seconds} s")
    if report.interrupted:
        console.print("[red]interrupted[/]: unfinished models were cancelled", highlight=False)


def _placement_cells(placement) -> tuple[str, str, str]:
    """`built on` (host, accelerator, attempts), queued and running seconds of a --ray model."""
    p = placement or {}
    if p.get("host") is None:
        return "-", "-", "-"
    where = p["host"] + (f" ({p['accelerator']})" if p.get("accelerator") else "")
    if p.get("attempts", 1) > 1:
        where += f", attempt {p['attempts']}"
    return escape(where), f"{num(p['queued_s'], '.1f')}", f"{num(p['running_s'], '.1f')}"


def render_passes(listed: dict, console: Console) -> None:
    """The pipelines (stages joined by " | ") and the passes, as `infercc passes` shows them."""
    console.print("[bold]Pipelines[/] (each stage runs to a fixpoint; | separates stages)")
    pipelines = Table(box=None, show_header=False, padding=(0, 2, 0, 2))
    pipelines.add_column(no_wrap=True, style="bold")
    pipelines.add_column()
    for p in listed["pipelines"]:
        stages = " | ".join(" -> ".join(stage) for stage in p["stages"])
        pipelines.add_row(p["name"], f"{escape(p['doc'])}\n[dim]{stages}[/]")
    console.print(pipelines)
    console.print("[bold]Passes[/] (the names --disable-pass takes)")
    passes = Table(box=None, show_header=False, padding=(0, 2, 0, 2))
    passes.add_column(no_wrap=True, style="bold")
    passes.add_column()
    for p in listed["passes"]:
        where = ", ".join(p["pipelines"]) or "no pipeline"
        declared = _declared(p)
        passes.add_row(
            p["name"], f"{escape(p['doc'])} [dim]({where})[/]" + (f"\n[dim]{declared}[/]")
        )
    console.print(passes)


def _declared(p: dict) -> str:
    """What a pass declared at registration, as `infercc passes` shows it under its line."""
    parts = [
        f"{label} {', '.join(p[key])}"
        for label, key in (
            ("reads", "reads"),
            ("assumes", "assumptions"),
            ("requires", "requires"),
            ("ensures", "ensures"),
        )
        if p[key]
    ]
    return escape("; ".join(parts))


def render_extract(report, console: Console) -> None:
    """`infercc extract`: what was cut, the check, the validation."""
    d = report.to_dict()
    console.print(
        f"[bold]{escape(d['input'])}[/] -> [bold]{escape(d['destination'])}[/]  "
        f"nodes {d['nodes_before']} -> {d['nodes_after']}",
        highlight=False,
    )
    t = table("subgraph inputs and outputs")
    for col in ("", "name", "dtype", "shape"):
        text_column(t, col)
    for kind, items in (("in", d["inputs"]), ("out", d["outputs"])):
        for v in items:
            t.add_row(kind, escape(v["name"]), v["dtype"] or "?", shape_text(v["shape"]))
    console.print(t)
    if not d["checked"]:
        console.print(
            f"[red]onnx.checker refused the subgraph[/]: {escape(d['check_error'] or '')}",
            highlight=False,
        )
    if report.validation is not None:
        render_validation(report.validation, console)
    elif d["checked"]:
        console.print("validation skipped (--no-validate)")
    if not report.passed:
        console.print("[red]nothing was written[/]")
