"""Rich tables of a fleet report and a sweep report (JSON: their ``to_dict``)."""

from __future__ import annotations

from kvtool.simulate.fleet.results import FleetReport, PolicyResult, SweepReport


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _policy_row(r: PolicyResult) -> list[str]:
    s = r.serve
    return [
        r.router,
        _pct(r.prefix_hit_rate),
        _pct(r.infinite_cache_hit_rate),
        _pct(r.regret_rate),
        _s(s.ttft_p50_s),
        _s(s.ttft_p99_s),
        _s(s.tpot_p50_s),
        _s(s.tpot_p99_s),
        f"{s.throughput_tokens_per_s:,.0f}",
        f"{r.request_imbalance:.2f} / {r.busy_imbalance:.2f}",
        f"{r.preemptions:,}",
    ]


_HEADERS = [
    "router",
    "prefix hits",
    "bound (inf. cache)",
    "regret",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "out tok/s",
    "imbalance req / busy",
    "preempt.",
]


def render_fleet(report: FleetReport, console) -> None:
    from rich.table import Table

    console.print(f"[bold]Fleet simulation[/bold]: {report.source}, {report.requests:,} requests")
    console.print(f"Replicas: {report.replicas_text}; pool: {report.pool_text}")
    console.print(f"Arrivals: {report.arrivals}")
    table = Table(title="Per router policy")
    for h in _HEADERS:
        table.add_column(h, justify="left" if h == "router" else "right")
    for r in report.results:
        table.add_row(*_policy_row(r))
    console.print(table)
    if len(report.results) == 1:
        r = report.results[0]
        per = Table(title=f"Per replica ({r.router})")
        for h in ("replica", "GPU", "TP", "blocks", "requests", "prefix hits", "busy", "TTFT p99", "preempt."):
            per.add_column(h, justify="left" if h in ("replica", "GPU") else "right")
        for x in r.per_replica:
            per.add_row(
                x.name, x.gpu, str(x.tp), f"{x.pool_blocks:,}", f"{x.requests:,}", _pct(x.prefix_hit_rate),
                _s(x.busy_s), _s(x.ttft_p99_s), f"{x.preemptions:,}",
            )  # fmt: skip
        console.print(per)
    console.print(
        "prefix hits: num_cached_tokens / prompt tokens; bound: one infinite prefix cache over the fleet; regret: "
        "the best replica's cached prefix at routing less the chosen one's, / prompt tokens; imbalance: max / mean "
        "per replica (docs/fleet.md)"
    )


def render_sweep(report: SweepReport, console) -> None:
    from rich.table import Table

    console.print(
        f"[bold]Fleet design sweep[/bold]: {report.source}, {report.requests:,} requests, {len(report.rows)} points "
        f"on {report.ran_on}"
    )
    table = Table(title="Points")
    for h in ("replicas", "block", "kv tokens", "GPU", "max seqs", *_HEADERS):
        table.add_column(h, justify="right")
    for row in report.rows:
        p = row.point
        table.add_row(
            p.replicas,
            str(p.block_size),
            "-" if p.kv_tokens is None else f"{p.kv_tokens:,}",
            p.gpu or "-",
            str(row.result.max_num_seqs),
            *_policy_row(row.result),
        )
    console.print(table)
    rec = report.recommendation
    if rec is not None:
        console.print(f"[bold]Recommendation (pick)[/bold]: {rec.reason} (rule: {rec.rule})")
