"""Rich rendering of the decoder reports: generation benchmarks and int4 calibration."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from infercc.cli.render import human_bytes


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None or x != x else format(x, fmt)


def render_generate(report, console: Console) -> None:
    s = report.stats
    console.print(
        f"[bold]{report.path}[/]  batch {report.batch}, prompt {report.prompt_len}, "
        f"{report.new_tokens} new token(s), {s.runs} timed generation(s)",
        highlight=False,
    )
    t = Table()
    for col in ("TTFT ms", "TPOT p50 ms", "TPOT p90 ms", "TPOT p99 ms", "decode tokens/s"):
        t.add_column(col, justify="right")
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
    t = Table(title="ratio = B / A (time), per step pair", title_justify="left")
    for col in ("", "A", "B", "ratio p50", "ratio p10..p90"):
        t.add_column(col, justify="left" if not col else "right")
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
    console.print(f"generated tokens equal: {100 * report.token_agreement:.1f}%")
    _render_memory(a, console, "A: ")
    _render_memory(b, console, "B: ")
