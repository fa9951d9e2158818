"""Rendering of isolation reports: the summary (the overall verdict, one row per dimension), then a table per
dimension.

Every cell is a ``rich.text.Text``: partition labels and engine messages are shown as they are (no markup, no
emoji codes such as ``:b:`` in ``salt:b:``).  JSON comes from the same frozen dataclasses through
kvtool.cli.output.print_json.
"""

from __future__ import annotations

from typing import Any

from kvtool.vllm.isolation.verdicts import INCONCLUSIVE, LEAK, PASS, DimensionResult, IsolationReport

VERDICT_STYLE = {
    PASS: "green",
    LEAK: "bold red",
    INCONCLUSIVE: "yellow",
    "not run": "dim",
    "refused": "dim",
    "ok": "green",
    "failed": "bold yellow",
    "missing": "dim",
    "partial": "yellow",
    "unknown": "dim",
}
EXPECTED_NOTE = "control, victim: cached tokens seen / expected"


def _text(value: object, style: str = "") -> Any:
    from rich.text import Text

    return Text(str(value), style=style)


def _verdict(text: str) -> Any:
    return _text(text, VERDICT_STYLE.get(text, ""))


def _title(prefix: str, verdict: str, suffix: str = "") -> Any:
    from rich.text import Text

    return Text.assemble(prefix, _verdict(verdict), suffix)


def _tokens(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


def _table(title: Any, columns: tuple[tuple[str, str], ...], caption: str | None = None) -> Any:
    from kvtool.core.render import new_table

    table = new_table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    return table


def dimension_table(result: DimensionResult) -> Any:
    columns = (("first -> victim", "left"), ("variant", "left"), ("blocks", "right"), ("n", "right"),
               ("control", "right"), ("victim", "right"), ("verdict", "left"), ("evidence", "left"))  # fmt: skip
    extra = [f"covered: {line}" for line in result.coverage]
    if result.minimal is not None:
        m = result.minimal
        salts = (
            "" if m.first_salt is None and m.second_salt is None else f" (salts {m.first_salt!r} / {m.second_salt!r})"
        )
        extra.append(
            f"minimal leak: {m.first} -> {m.second}{salts}, {m.variant}, {m.full_blocks} full blocks = {m.prompt_tokens} "
            f"tokens (first leak at {m.searched_from_blocks} blocks; {m.steps} shrinking trials); trial {m.trial}: "
            + "; ".join(m.evidence)
        )
    caption = "\n".join((EXPECTED_NOTE, *result.evidence, *extra))
    table = _table(_title(f"{result.title}: ", result.verdict), columns, caption)
    for row in result.rows:
        victim_expected = f"<= {row.victim_expected_tokens}" if row.victim_expected_tokens else "0"
        cells = (
            f"{row.first} -> {row.second}", row.variant, row.full_blocks, row.trials,
            f"{_tokens(row.control_cached_tokens)} / {row.control_expected_tokens}",
            f"{_tokens(row.victim_cached_tokens)} / {victim_expected}",
        )  # fmt: skip
        table.add_row(*map(_text, cells), _verdict(row.verdict), _text(row.evidence))
    return table


def summary_table(report: IsolationReport) -> Any:
    engine = report.engine
    events = "not captured" if report.events_captured is None else f"{report.events_captured:,} KV events"
    suffix = (
        f" ({engine.mode} {engine.endpoint}, model {engine.base_model}, block {engine.block_size}, "
        f"vLLM {engine.version or '?'}; {report.probes} probes, {events})"
    )
    columns = (("dimension", "left"), ("trials", "right"), ("controls shared", "right"),
               ("victims reused", "right"), ("verdict", "left"), ("note", "left"))  # fmt: skip
    if report.headline:
        suffix += f" - {report.headline}"
    table = _table(_title("kvtool vllm isolation: ", report.verdict, suffix), columns)
    for d in report.dimensions:
        if d.skipped_reason is not None:
            table.add_row(*map(_text, (d.title, "-", "-", "-")), _verdict(d.verdict), _text(d.skipped_reason))
            continue
        row = next((r for r in d.rows if r.verdict == d.verdict and d.verdict != PASS), None)
        note = "" if row is None else f"{row.first} -> {row.second}: {row.evidence}"
        if d.minimal is not None and d.minimal.steps:
            m = d.minimal
            note = f"minimal: {m.first} -> {m.second}, {m.full_blocks} blocks: {m.evidence[0] if m.evidence else ''}"
        elif d.verdict == INCONCLUSIVE and report.headline:
            note = report.headline + (f"; {note}" if note else "")
        cells = (d.title, d.trials, f"{d.controls_shared}/{d.trials}", d.victims_reused)
        table.add_row(*map(_text, cells), _verdict(d.verdict), _text(note))
    return table


def preconditions_table(report: IsolationReport) -> Any:
    columns = (("precondition", "left"), ("state", "left"), ("detail", "left"), ("fix", "left"))
    seconds = "" if report.search_seconds is None else f"; {report.probes} requests in {report.search_seconds:g} s"
    budget = "no bound" if report.budget_requests is None else f"{report.budget_requests} requests"
    table = _table(_text(f"Preconditions (budget {budget}{seconds})"), columns)
    for p in report.preconditions:
        table.add_row(_text(p.name), _verdict(p.state), _text(p.detail), _text(p.fix or ""))
    return table


def report_renderables(report: IsolationReport) -> list[Any]:
    """The answer first: the overall verdict (the summary's title, line 1) and one row per dimension with its
    verdict; then the preconditions, each its own line with its fix; then each dimension's trials, the details."""
    tables = [dimension_table(d) for d in report.dimensions if d.verdict != "not run"]
    return [summary_table(report), preconditions_table(report), *tables]
