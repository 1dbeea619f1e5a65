"""Rich rendering of the decoder reports: generation benchmarks and int4 calibration."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from infercc.cli.units import (
    accuracy_table,
    hint_line,
    human_bytes,
    num,
    number_column,
    render_bisect_verdict,
    render_refusals,
    scaled,
    table,
    text_column,
)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return num(x, fmt)


def render_generate(report, console: Console) -> None:
    s = report.stats
    console.print(
        f"[bold]{report.path}[/]  batch {report.batch}, prompt {report.prompt_len}, "
        f"{report.new_tokens} new token(s), {s.runs} timed generation(s), threads "
        f"{'spinning (--spin)' if report.spinning else 'not spinning between steps'}",
        highlight=False,
    )
    if report.prefill != "one call":
        console.print(
            "the model takes one token per call (input_ids fixed at [batch, 1]): the prompt "
            "was fed token by token, and TTFT is those calls together",
            highlight=False,
        )
    t = table()
    for col in ("TTFT ms", "TPOT p50 ms", "TPOT p90 ms", "TPOT p99 ms", "decode tokens/s"):
        number_column(t, col)
    t.add_row(
        _f(s.ttft_ms),
        _f(s.tpot_p50_ms),
        _f(s.tpot_p90_ms),
        _f(s.tpot_p99_ms),
        _f(s.decode_tokens_per_s, ",.1f"),
    )
    console.print(t)
    _render_memory(s, console)


def _render_memory(stats, console: Console, label: str = "") -> None:
    m = stats.memory
    kv = human_bytes(stats.kv_cache_bytes)
    if m is None:
        console.print(f"{label}KV cache at the last step {kv}", highlight=False)
        return
    console.print(
        f"{label}peak RSS {human_bytes(m.peak_rss_bytes)} (model file "
        f"{human_bytes(m.model_bytes)}, KV cache at the last step {kv}; "
        f"{human_bytes(m.generation_bytes)} over the process before loading)",
        highlight=False,
    )


def render_generate_compare(report, console: Console) -> None:
    console.print(
        f"A = {report.path_a}\nB = {report.path_b}\nbatch {report.batch}, prompt "
        f"{report.prompt_len}, {report.new_tokens} new token(s), interleaved per step",
        highlight=False,
    )
    t = table("ratio = B / A (time), per step pair")
    text_column(t, "")
    for col in ("A", "B", "ratio p50", "ratio p10..p90"):
        number_column(t, col)
    a, b = report.a, report.b
    t.add_row(
        "TTFT ms",
        _f(a.ttft_ms),
        _f(b.ttft_ms),
        _f(report.ttft_ratio.median),
        f"{_f(report.ttft_ratio.p10)}..{_f(report.ttft_ratio.p90)}",
    )
    t.add_row(
        "TPOT ms (p50)",
        _f(a.tpot_p50_ms),
        _f(b.tpot_p50_ms),
        _f(report.tpot_ratio.median),
        f"{_f(report.tpot_ratio.p10)}..{_f(report.tpot_ratio.p90)}",
    )
    t.add_row(
        "decode tokens/s",
        _f(a.decode_tokens_per_s, ",.1f"),
        _f(b.decode_tokens_per_s, ",.1f"),
        f"{_f(report.tokens_per_s_ratio)} (B/A)",
        "",
    )
    console.print(t)
    console.print(f"generated tokens equal: {num(scaled(report.token_agreement, 100), '.1f')}%")
    _render_memory(a, console, "A: ")
    _render_memory(b, console, "B: ")


def render_int4(report, console: Console, explain: bool = False) -> None:
    """`calibrate --int4`'s report; `explain` lists every refused rewrite, as optimize's."""
    from infercc.cli.app import detail

    d = report.to_dict()
    status = "[green]done[/]" if d["passed"] else "[red]FAILED[/]"
    sym = "symmetric" if d["symmetric"] else "asymmetric"
    samples = ", ".join(f"{k} {v}" for k, v in d["samples"].items())
    console.print(
        f"[bold]{d['model']}[/] -> [bold]{d['out_dir']}[/]  int4 {d['method']} ({d['form']}, "
        f"block {d['block_size']}, {sym}), {d['quantized_nodes']} weight(s) and "
        f"{len(d['embeddings'])} embedding(s) in int4 ({samples})  {status}",
        highlight=False,
    )
    if d["bisect"] is not None:
        render_bisect_verdict(d["bisect"], console)
    if not d["passed"]:
        console.print(f"[red]{escape(d['message'])}[/]", highlight=False)
        if explain:
            render_refusals(d["refusals"], console)
        return
    t = accuracy_table("int4 against fp32", d["outputs"], _f)
    console.print(t)
    if d["perplexity"] is not None:
        console.print(
            f"perplexity {num(d['perplexity'], '.4f')} vs fp32 {num(d['perplexity_fp32'], '.4f')} "
            f"({num(scaled(d['perplexity_ratio'], 100, -1), '+.2f')}%)",
            highlight=False,
        )
    size = d["size"]
    if size:
        console.print(
            f"size {human_bytes(size['before_bytes'])} -> {human_bytes(size['after_bytes'])} "
            f"({num(size['ratio'], '.3f')}x)",
            highlight=False,
        )
    _render_int4_choices(d, console)
    if d["timings"]:
        words = {"passes": "fp32 passes", "plan": "reference", "quantize_write": "quantize+write"}
        split = ", ".join(f"{words.get(k, k)} {num(v, '.1f')} s" for k, v in d["timings"].items())
        console.print(f"time {num(d['seconds'], '.1f')} s: {split}", highlight=False)
    for name, counts in d["fusions"].items():
        fired = ", ".join(f"{k} {v}" for k, v in counts.items())
        console.print(f"fused: {name} ({fired})", highlight=False)
    for a in d["assumptions"]:
        used = ", ".join(f"{k} {v}" for k, v in a["rewrites"].items()) or "no rewrite"
        console.print(f"assumed: {a['name']} ({used})", highlight=False)
    for h in d["assumption_hints"]:
        console.print(hint_line(h), highlight=False)
    for line in kept_float_lines(d["kept_float"]):
        console.print(line, highlight=False)
    if explain:
        render_refusals(d["refusals"], console)
    elif detail() >= 1 and d["refusals"]:
        console.print(f"{len(d['refusals'])} rewrite(s) refused; --explain lists them")


KEPT_FLOAT_LISTED = 3  # more nodes kept float for one reason than this: one line for them


def kept_float_lines(kept: list[dict]) -> list[str]:
    """`kept float: NODE: REASON` for each node, one line per reason where more than
    KEPT_FLOAT_LISTED share it (a decoder's attention MatMuls: one per layer, twice); the JSON
    report lists every node."""
    by_reason: dict[str, list[str]] = {}
    for k in kept:
        by_reason.setdefault(k["reason"], []).append(k["node"])
    lines = []
    for reason, nodes in by_reason.items():
        if len(nodes) <= KEPT_FLOAT_LISTED:
            lines += [f"kept float: {node}: {reason}" for node in nodes]
        else:
            lines.append(
                f"kept float: {len(nodes)} nodes ({nodes[0]}, ..., {nodes[-1]}): {reason} "
                "(--json lists them)"
            )
    return lines


def _render_int4_choices(d: dict, console: Console) -> None:
    level = d["accuracy_level"]
    if level.get("chosen") is not None:
        line = f"accuracy_level {level['chosen']} ({level['reason']}"
        race = level.get("level4_vs_level0")
        if race:
            line += (
                f"; level 4 / level 0 time {num(race['ratio_median'], '.3f')} "
                f"(p10..p90 {num(race['ratio_p10'], '.3f')}..{num(race['ratio_p90'], '.3f')})"
            )
        console.print(line + ")", highlight=False)
    if d["versus_rtn"] is not None:
        console.print(d["versus_rtn"]["message"], highlight=False)
    speed = d["speed"]
    if speed:
        console.print(
            f"speed: int4 {num(speed['b_ms'], '.3f')} ms vs fp32 {num(speed['a_ms'], '.3f')} ms "
            f"({num(speed['ratio_median'], '.2f')}x the fp32 time, p10..p90 "
            f"{num(speed['ratio_p10'], '.2f')}..{num(speed['ratio_p90'], '.2f')}; {speed['feed']})",
            highlight=False,
        )
    elif d.get("speed_skipped"):
        console.print(f"speed: {d['speed_skipped']['reason']}", highlight=False)


def render_decoder_memory(d: dict, target: str, console: Console) -> None:
    t = table(
        f"decoder memory on {target}: weights {human_bytes(d['weights_bytes'])}, KV cache "
        f"{human_bytes(d['kv_bytes_per_token'])} per token and batch row"
    )
    cols = ("context", "KV cache (batch 1)", "decode arena", "total (batch 1)", "largest batch")
    for col in cols:
        number_column(t, col)
    for r in d["contexts"]:
        batch = r["largest_batch"]
        t.add_row(
            f"{r['context']:,}",
            human_bytes(r["kv_cache_bytes"]),
            human_bytes(r["activation_bytes"]),
            human_bytes(r["total_bytes"]) + ("" if r["fits"] else " (does not fit)"),
            "-" if batch is None else (">= 65536" if batch >= 65536 else f"{batch:,}"),
        )
    console.print(t)
    largest = d["largest_context_at_batch_1"]
    console.print(
        "largest context at batch 1 (of those listed): "
        + ("none fits" if largest is None else f"{largest:,} tokens"),
        highlight=False,
    )
