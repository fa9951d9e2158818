"""The table of `kvtool simulate --engine sglang`."""

from __future__ import annotations

from kvtool.simulate.sglang.run import SglangReport


def report_table(report: SglangReport):
    from kvtool.core.render import new_table

    table = new_table(title=f"SGLang radix cache: {report.source} ({report.pool_tokens:,}-token pool)")
    for name in (
        "page",
        "steps",
        "prefill steps",
        "cached prompt tokens",
        "hit",
        "evicted tokens",
        "retractions",
        "peak used tokens",
    ):
        table.add_column(name, justify="right")
    for r in report.results:
        hit = "-" if r.cache_hit_fraction is None else f"{100 * r.cache_hit_fraction:.1f} %"
        table.add_row(
            str(r.page_size),
            f"{r.steps:,}",
            f"{r.prefill_steps:,}",
            f"{r.cached_prompt_tokens:,}",
            hit,
            f"{r.evicted_tokens:,}",
            f"{r.retractions:,}",
            f"{r.peak_used_tokens:,}",
        )
    return table
