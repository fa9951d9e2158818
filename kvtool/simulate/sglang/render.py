"""The tables of `kvtool simulate --engine sglang` and `--engine vllm,sglang` (the JSON is the same dataclasses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvtool.core.format import fmt_num, fmt_pct, fmt_plural
from kvtool.simulate.results import _s
from kvtool.simulate.sglang.compare import EngineComparison, EngineRun
from kvtool.simulate.sglang.run import SglangReport


def _pct(x: float | None) -> str:
    return fmt_pct(x, space=True)


def _rate(x: float | None) -> str:
    return fmt_num(x, ",.0f")


def report_table(report: SglangReport):
    from kvtool.core.render import new_table

    table = new_table(title=f"SGLang radix cache: {report.source} ({report.pool_tokens:,}-token pool)")
    for name in (
        "page",
        "pool tokens",
        "steps",
        "prefill steps",
        "cached prompt tokens",
        "hit",
        "evicted tokens",
        "retractions",
        "peak used tokens",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "output tok/s",
    ):
        table.add_column(name, justify="right")
    for r in report.results:
        hit = _pct(r.cache_hit_fraction)
        table.add_row(
            str(r.page_size),
            f"{r.pool_tokens:,}",
            f"{r.steps:,}",
            f"{r.prefill_steps:,}",
            f"{r.cached_prompt_tokens:,}",
            hit,
            f"{r.evicted_tokens:,}",
            f"{r.retractions:,}",
            f"{r.peak_used_tokens:,}",
            _s(r.ttft_p50_s),
            _s(r.ttft_p99_s),
            _s(r.tpot_p50_s),
            _rate(r.throughput_tokens_per_s),
        )
    return table


def render_sglang(report: SglangReport, console: Any) -> None:
    console.print(report_table(report))
    for s in report.setups:
        console.print(
            f"page {s.page_size}: pool {s.pool_text}; max_running_requests {s.max_running_requests:,}, "
            f"chunked_prefill_size {s.chunked_prefill_size:,}, max_prefill_tokens {s.max_prefill_tokens:,} "
            f"(SGLang {s.sglang_version})",
            highlight=False,
        )
    if report.arrivals:
        console.print(f"Arrivals: {report.arrivals}.", highlight=False)
    if report.cost_text:
        console.print(f"Step time: {report.cost_text}", highlight=False)
    for note in report.notes:
        console.print(note, highlight=False)


# The rows of the side-by-side table: what, and how one run shows it.
ROWS: tuple[tuple[str, Callable[[EngineRun], str]], ...] = (
    ("pool tokens", lambda r: f"{r.pool_tokens:,}"),
    ("max running requests", lambda r: f"{r.max_running_requests:,}"),
    ("batch / chunk tokens", lambda r: f"{r.batch_tokens:,}"),
    ("completed", lambda r: f"{r.completed:,} of {r.requests:,}"),
    ("prefix hit (first admission)", lambda r: _pct(r.prefix_hit_rate)),
    ("cached prompt tokens", lambda r: f"{r.cached_prompt_tokens:,}"),
    ("preemptions / retractions", lambda r: f"{r.preemptions:,} ({fmt_plural(r.preempted_requests, 'request')})"),
    ("steps", lambda r: f"{r.steps:,}"),
    ("TTFT p50", lambda r: _s(r.ttft_p50_s)),
    ("TTFT p99", lambda r: _s(r.ttft_p99_s)),
    ("TPOT p50", lambda r: _s(r.tpot_p50_s)),
    ("TPOT p99", lambda r: _s(r.tpot_p99_s)),
    ("output tok/s", lambda r: _rate(r.throughput_tokens_per_s)),
    ("requests/s", lambda r: fmt_num(r.requests_per_s, ",.2f")),
)


def _heading(r: EngineRun) -> str:
    return f"{'vLLM' if r.engine == 'vllm' else 'SGLang'} {r.unit} {r.unit_tokens}"


def render_comparison(c: EngineComparison, console: Any) -> None:
    """vLLM and SGLang side by side: one column per engine and block / page size."""
    from kvtool.core.render import new_table

    table = new_table(title=f"{c.source}: vLLM and SGLang, {c.model} on {c.gpu} (tp {c.tp})")
    table.add_column("")
    for r in c.runs:
        table.add_column(_heading(r), justify="right")
    for what, show in ROWS:
        table.add_row(what, *(show(r) for r in c.runs))
    console.print(table)
    console.print(f"Arrivals: {c.arrivals}.", highlight=False)
    for note in c.notes:
        console.print(note, highlight=False)
