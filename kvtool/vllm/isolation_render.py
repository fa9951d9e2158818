"""Rendering of isolation reports: one rich table per dimension, then a summary.

JSON comes from the same frozen dataclasses through kvtool.cli.output.print_json.
"""

from __future__ import annotations

from typing import Any

from kvtool.vllm.isolation_verdicts import INCONCLUSIVE, LEAK, PASS, DimensionResult, IsolationReport

VERDICT_STYLE = {PASS: "green", LEAK: "bold red", INCONCLUSIVE: "yellow", "not run": "dim"}


def _verdict(text: str) -> str:
    return f"[{VERDICT_STYLE.get(text, '')}]{text}[/]"


def _tokens(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


def dimension_table(result: DimensionResult) -> Any:
    from rich.table import Table

    title = f"{result.title}: {_verdict(result.verdict)}"
    caption = "\n".join(("control, victim: cached tokens seen / expected", *result.evidence))
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for name, justify in (("first -> victim", "left"), ("variant", "left"), ("n", "right"),
                          ("control", "right"), ("victim", "right"),
                          ("verdict", "left"), ("evidence", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in result.rows:
        victim_expected = f"<= {row.victim_expected_tokens}" if row.victim_expected_tokens else "0"
        table.add_row(
            f"{row.first} -> {row.second}", row.variant, str(row.trials),
            f"{_tokens(row.control_cached_tokens)} / {row.control_expected_tokens}",
            f"{_tokens(row.victim_cached_tokens)} / {victim_expected}", _verdict(row.verdict), row.evidence,
        )  # fmt: skip
    return table


def summary_table(report: IsolationReport) -> Any:
    from rich.table import Table

    engine = report.engine
    events = "not captured" if report.events_captured is None else f"{report.events_captured:,} KV events"
    title = (
        f"kvtool vllm isolation: {_verdict(report.verdict)} ({engine.mode} {engine.endpoint}, model {engine.base_model}, "
        f"block {engine.block_size}, vLLM {engine.version or '?'}; {report.probes} probes, {events})"
    )
    table = Table(title=title, title_justify="left")
    for name, justify in (("dimension", "left"), ("trials", "right"), ("controls shared", "right"),
                          ("victims reused", "right"), ("verdict", "left"), ("note", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for d in report.dimensions:
        if d.skipped_reason is not None:
            table.add_row(d.title, "-", "-", "-", _verdict(d.verdict), d.skipped_reason)
            continue
        row = next((r for r in d.rows if r.verdict == d.verdict and d.verdict != PASS), None)
        note = "" if row is None else f"{row.first} -> {row.second}: {row.evidence}"
        table.add_row(d.title, str(d.trials), f"{d.controls_shared}/{d.trials}", str(d.victims_reused),
                      _verdict(d.verdict), note)  # fmt: skip
    return table


def report_renderables(report: IsolationReport) -> list[Any]:
    tables = [dimension_table(d) for d in report.dimensions if d.verdict != "not run"]
    return [*tables, summary_table(report)]
