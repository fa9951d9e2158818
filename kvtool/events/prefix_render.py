"""Tables of the prefix-outcome report (kvtool analyze --prompts); its JSON is the dataclass itself."""

from __future__ import annotations

from kvtool.events.prefix_outcomes import OUTCOME_WORDS, PrefixReport, sliding_groups


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _group_name(g) -> str:
    return f"{g.index}: {g.kind}" + (f" (window {g.sliding_window_tokens})" if g.sliding_window_tokens else "")


def prefix_tables(report: PrefixReport) -> list:
    from rich.table import Table

    windowed = bool(sliding_groups(report.groups))
    per_request = Table(
        title=f"Prefix-cache outcome per request ({report.source}; cacheable unit {report.unit_tokens} tokens)"
    )
    columns = ["request", "prompt", "shared", "with", "cacheable"] + (["kept by window"] if windowed else [])
    for name in [*columns, "hit", "outcome", "evidence"]:
        per_request.add_column(name, justify="right" if name in ("prompt", "shared", "cacheable", "hit") else "left")
    for r in report.requests:
        cells = [
            r.request_id,
            str(r.prompt_tokens),
            str(r.shared_tokens),
            r.shared_with or "-",
            str(r.cacheable_tokens),
        ]
        if windowed:
            cells.append(str(r.reachable_tokens))
        per_request.add_row(*cells, str(r.hit_tokens), OUTCOME_WORDS[r.outcome], r.evidence or "")
    shares = Table(title="Prompt tokens by outcome")
    for name in ("outcome", "requests", "prompt tokens", "share"):
        shares.add_column(name, justify="left" if name == "outcome" else "right")
    for s in report.shares:
        if s.outcome == "window" and not windowed:
            continue
        words = "served from the cache (hit)" if s.outcome == "hit" else f"lost: {OUTCOME_WORDS[s.outcome]}"
        shares.add_row(words, str(s.requests), f"{s.lost_tokens:,}", _pct(s.share_of_prompt_tokens))
    out: list = [per_request, shares]
    if report.utilization:
        util = Table(title="Effective utilization per KV-cache group (time-weighted over the rows)")
        for name in ("group", "blocks held", "token slots held", "slots holding a token", "effective"):
            util.add_column(name, justify="left" if name == "group" else "right")
        for u in report.utilization:
            util.add_row(
                _group_name(u.group),
                f"{u.mean_blocks_held:.2f}",
                f"{u.mean_slots_held:.1f}",
                f"{u.mean_slots_written:.1f}",
                _pct(u.effective_utilization),
            )
        util.caption = (
            f"vLLM's gauge (1 - free / (blocks - 1), free counting cached blocks no request holds): mean "
            f"{_pct(report.vllm_usage_mean)}, peak {_pct(report.vllm_usage_peak)}"
        )
        out.append(util)
    for note in report.notes:
        out.append(f"note: {note}")
    return out
