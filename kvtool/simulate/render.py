"""Rendering for `kvtool simulate`: rich tables, the JSON object and plots of a SimulateReport."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtool.core.format import fmt_num as _num
from kvtool.simulate.offload_tier import OffloadCurve
from kvtool.simulate.results import ServeSetup, SimulateReport, _n, _pct, _s
from kvtool.simulate.serving import ServeResult


def to_json(report: SimulateReport) -> dict[str, Any]:
    """The --json object (:meth:`SimulateReport.to_dict`)."""
    return report.to_dict()


def render(report: SimulateReport, console) -> None:
    from kvtool.core.render import new_table

    st = report.static
    console.print(f"[bold]kvtool simulate[/bold]: {report.source}")
    if report.offload_curve is not None:
        _render_offload_curve(report.offload_curve, console)  # the question asked: the curve first
    _render_recommendations(report, console)  # the answer first; the figures that back it follow
    console.print(
        f"{report.requests:,} requests; final length (prompt + output) mean {st.mean_length_tokens:,.1f}, "
        f"p99 {st.p99_length_tokens:,.1f}, max {st.max_length_tokens:,} tokens"
    )
    has_prefix = st.results[0].shared_prefix_tokens > 0
    table = new_table(title="Static comparison: final lengths in blocks", title_justify="left")
    for col in ("block", "frag.", "util.", "empty slots/req", "entries mean", "p99", "max"):
        table.add_column(col, justify="right")
    for r in st.results:
        table.add_row(
            str(r.block_size),
            _pct(r.internal_fragmentation),
            _pct(r.effective_utilization),
            f"{r.mean_waste_tokens:.2f}",
            f"{r.mean_table_entries:.1f}",
            f"{r.p99_table_entries:.1f}",
            str(r.max_table_entries),
        )
    console.print(table)
    _render_groups(st, console)
    if has_prefix:
        t2 = new_table(
            title=f"Shared prefix of {st.results[0].shared_prefix_tokens} tokens (full blocks only)",
            title_justify="left",
        )
        for col in ("block", "shared blocks", "dup. tail tok", "saving (slots)", "saving", "util. with sharing"):
            t2.add_column(col, justify="right")
        for r in st.results:
            t2.add_row(
                str(r.block_size),
                str(r.prefix_shared_blocks),
                str(r.prefix_tail_tokens),
                f"{r.prefix_saving_slots:,}",
                _pct(r.prefix_saving_fraction),
                _pct(r.utilization_with_prefix_sharing),
            )
        console.print(t2)
    if st.kv_tokens is not None:
        t3 = new_table(title=f"Requests that fit at once in {st.kv_tokens:,} KV tokens", title_justify="left")
        for col in ("block", "pool blocks", "p50", "p99", "p1", "fixed-length claim"):
            t3.add_column(col, justify="right")
        for r in st.results:
            t3.add_row(
                str(r.block_size),
                f"{r.pool_blocks:,}",
                f"{r.fit_at_once_p50:.0f}",
                f"{r.fit_at_once_p99:.0f}",
                f"{r.fit_at_once_p1:.0f}",
                _claim(r),
            )
        console.print(t3)
        if report.kv_tokens_text:
            console.print(f"KV budget: {st.kv_tokens:,} tokens ({report.kv_tokens_text}).")
        console.print(
            "Over windows of consecutive requests; p1 is what fits 99% of the time; the fixed-length "
            "claim is what a test at the mean length would report, and how far it is above p1."
        )
    if st.max_length_tokens == st.min_length_tokens:
        console.print(
            f"Every request is {st.max_length_tokens:,} tokens long: a fixed length has no spread, so each "
            "request wastes the same part of one block and every window fits the same count. Real "
            "lengths waste about (b-1)/2 slots per request and fit fewer requests at the tail (p1); "
            "run --trace or --dist lognormal with the same mean to see by how much."
        )
    c = st.contiguous
    origin = "the longest request" if c.max_model_len_from_data else "--max-model-len"
    line = (
        f"Contiguous baseline: every request reserves {c.max_model_len:,} slots ({origin}): utilization "
        f"{_pct(c.utilization)}, waste {_pct(c.waste_fraction)}"
    )
    if c.requests_too_long:
        line += f", {_n(c.requests_too_long, 'request')} longer than that cannot be served"
    if c.fit_at_once is not None:
        line += f", {c.fit_at_once:,} requests fit at once"
    console.print(line)
    if has_prefix and st.results[0].requests_shorter_than_prefix:
        console.print(
            f"{st.results[0].requests_shorter_than_prefix:,} prompts are shorter than the shared prefix "
            "and share only their own full blocks."
        )
    if report.serve and report.serve_setup is not None:
        _render_serving(report.serve, report.serve_setup, console)
    for path in report.exported_events.values():
        console.print(f"Events written: {path}")


def _render_offload_curve(curve: OffloadCurve, console) -> None:
    from kvtool.core.render import new_table

    table = new_table(
        title=f"Prefix hits against the CPU tier's size (--kv-offloading-size, {curve.backend})",
        title_justify="left",
    )
    for col in ("block", "GiB", "CPU blocks", "CPU tokens", "GPU hits", "CPU hits", "hit rate", "TTFT p50 Δ", "p99 Δ"):
        table.add_column(col, justify="right")
    for p in curve.points:
        table.add_row(
            str(p.block_size),
            f"{p.kv_offloading_size_gib:g}",
            f"{p.cpu_kv_blocks:,}",
            f"{p.cpu_kv_tokens:,}",
            f"{p.gpu_hit_tokens:,}",
            f"{p.cpu_hit_tokens:,}",
            _pct(p.hit_rate),
            _signed_s(p.ttft_p50_change_s),
            _signed_s(p.ttft_p99_change_s),
        )
    console.print(table)
    console.print(
        f"Hits: prompt tokens found at each request's first admission; hit rate: (GPU + CPU hits) / prompt tokens; "
        f"TTFT p50 and p99 against the simulation without a CPU tier (below). A load takes blocks x bytes / {curve.h2d_gb_s:g} GB/s host-to-device "
        f"({curve.h2d_from}), added to its step. CPU blocks: {curve.sizing or 'none'}. The tier is vLLM 0.32's LRU "
        "OffloadingConnector with stores and loads done within their step (docs/simulate.md)."
    )


def _signed_s(x: float | None) -> str:
    return "-" if x is None else ("+" if x >= 0 else "-") + _s(abs(x))


def _render_recommendations(report: SimulateReport, console) -> None:
    for rec in report.recommendations:
        console.print(f"Recommendation ({rec.objective}): block size {rec.block_size}: {rec.reason}")
    if report.recommendations:
        console.print()


def _render_groups(st, console) -> None:
    """The model's KV-cache groups one by one: the blocks a request holds at its end and how full they are."""
    from kvtool.core.render import new_table

    if not any(r.groups or r.groups_note for r in st.results):
        return
    table = new_table(title="Per KV-cache group, at each request's end", title_justify="left")
    for col in ("block", "group", "layers", "blocks held mean", "max", "frag.", "outside window", "util."):
        table.add_column(col, justify="right")
    for r in st.results:
        for g in r.groups:
            what = g.kind if g.window_tokens is None else f"{g.kind} {g.window_tokens}"
            table.add_row(
                str(r.block_size),
                f"{g.group} {what}",
                str(g.num_layers),
                f"{g.blocks_held_mean:.1f}",
                str(g.blocks_held_max),
                "state" if g.internal_fragmentation is None else _pct(g.internal_fragmentation),
                "-" if g.outside_window_fraction is None else _pct(g.outside_window_fraction),
                "-" if g.utilization is None else _pct(g.utilization),
            )
        if r.group_blocks_held_mean is not None:
            table.add_row(str(r.block_size), "all groups", "", f"{r.group_blocks_held_mean:.1f}", "", "", "", "")
    console.print(table)
    for r in st.results:
        if r.groups_note:
            console.print(f"block {r.block_size}: groups not counted: {r.groups_note}")
    console.print(
        "A sliding window holds only the blocks its window still reads (vLLM frees the others); 'outside window': "
        "slots of tokens the window no longer reads, kept because their block also holds tokens it does."
    )


def _render_serving(serve: list[ServeResult], setup: ServeSetup, console) -> None:
    from kvtool.core.render import new_table

    console.print()
    console.print(
        f"Serving simulation (vLLM 0.32 V1 scheduler): pool {setup.pool_text}; arrivals {setup.arrivals}; "
        f"max_num_seqs {setup.max_num_seqs}, max_num_batched_tokens {setup.max_num_batched_tokens:,}"
        + (
            f", long_prefill_token_threshold {setup.long_prefill_token_threshold:,}"
            if setup.long_prefill_token_threshold
            else ""
        )
        + f"; {setup.extras}"
    )
    if setup.scheduler_defaults:
        console.print(f"Scheduler defaults: {'; '.join(setup.scheduler_defaults)}")
    console.print(f"Step time: {setup.cost_text}")
    if serve and serve[0].group_hit_tokens:
        console.print(f"KV-cache groups simulated (vLLM 0.32, one pool shared): {'; '.join(serve[0].kv_groups)}")
        for r in serve:
            per_group = ", ".join(f"{n:,}" for n in r.group_hit_tokens)
            console.print(
                f"Prefix hits at block {r.block_size}: {per_group} tokens per group alone; "
                f"{r.cached_prompt_tokens:,} agreed by every group (num_cached_tokens)"
            )
    refused = serve[0].refused_too_long if serve else 0
    if refused:
        console.print(
            f"{refused:,} of {serve[0].requests:,} requests refused: a prompt of --max-model-len tokens or more, "
            "which vLLM 0.32 rejects at input (never scheduled, not in the figures below)"
        )
    t = new_table(title="Serving: the block pool", title_justify="left")
    for col in ("block", "pool blocks", "peak", "mean", "util.", "prefix hits", "evicted", "preemptions", "never fit"):
        t.add_column(col, justify="right")
    for r in serve:
        t.add_row(
            str(r.block_size),
            f"{r.pool_blocks:,}",
            f"{r.peak_blocks:,}",
            _num(r.mean_blocks, ",.1f"),
            _pct(r.utilization),
            _pct(r.prefix_hit_rate),
            f"{r.evicted_blocks:,}",
            f"{r.preemptions:,} ({r.preempted_requests:,} req.)",
            f"{r.never_fit:,}",
        )
    console.print(t)
    t = new_table(title="Serving: latency and throughput", title_justify="left")
    for col in (
        "block",
        "queue p50",
        "queue p99",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "completed",
        "busy",
        "tok/s",
    ):
        t.add_column(col, justify="right")
    for r in serve:
        t.add_row(
            str(r.block_size),
            _s(r.queue_delay_p50_s),
            _s(r.queue_delay_p99_s),
            _s(r.ttft_p50_s),
            _s(r.ttft_p99_s),
            _s(r.tpot_p50_s),
            f"{r.completed:,}",
            f"{100 * r.busy_s / r.span_s:.1f}%" if r.span_s else "-",
            _num(r.throughput_tokens_per_s, ",.0f"),
        )
    console.print(t)
    if not any(r.completed for r in serve):
        console.print(
            f"No request ran at any block size: every final length needs more blocks than the pool "
            f"has ({setup.pool_tokens:,} tokens)."
        )
    if len(serve[0].pools) > 1:
        for r in serve:
            parts = [
                f"{p.name}: {p.pool_blocks:,} blocks, {p.requests:,} requests, peak {p.peak_blocks:,}, "
                f"{_n(p.preemptions, 'preemption')}, TTFT p99 {_s(p.ttft_p99_s)}"
                for p in r.pools
            ]
            console.print(f"block {r.block_size} pools: " + "; ".join(parts))


def _claim(r) -> str:
    """'146 (+33% vs p1)': the fixed-length claim and its overstatement of what fits 99% of the time."""
    claim = f"{r.fit_if_fixed_mean_length:,}"
    if r.fit_at_once_p1:
        claim += f" ({r.fit_if_fixed_mean_length / r.fit_at_once_p1 - 1:+.0%} vs p1)"
    return claim


def write_plots(report: SimulateReport, traces: dict[int, Any], directory: Path) -> list[Path]:
    """PNG charts: fragmentation and table size against block size; blocks in use over time per block size."""
    from kvtool.core.extras import require

    require("matplotlib", feature="kvtool simulate --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvtool.core.errors import UsageError

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create the plot directory: {err.strerror or err}", where=str(directory)) from None
    written = []
    sizes = [r.block_size for r in report.static.results]
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(sizes, [100 * r.internal_fragmentation for r in report.static.results], "o-", color="tab:red")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(sizes, [str(b) for b in sizes])
    ax1.set_xlabel("block size (tokens)")
    ax1.set_ylabel("internal fragmentation (%)", color="tab:red")
    ax2 = ax1.twinx()
    ax2.plot(sizes, [r.mean_table_entries for r in report.static.results], "s--", color="tab:blue")
    ax2.set_ylabel("block-table entries per request (mean)", color="tab:blue")
    ax1.set_title(report.source[:90], fontsize=8)
    fig.tight_layout()
    path = directory / "fragmentation_vs_block_size.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    if traces:
        serve = {r.block_size: r for r in report.serve or []}
        fig, axes = plt.subplots(len(traces), 1, figsize=(8, 1.2 + 1.3 * len(traces)), sharex=True, squeeze=False)
        for ax, (b, trace) in zip(axes[:, 0], traces.items()):
            ax.step(trace.timeline_s, trace.timeline_blocks, where="post", linewidth=0.6)
            pool = serve[b].pool_blocks if b in serve else None
            if pool:
                ax.axhline(pool, color="tab:red", linewidth=0.8, linestyle="--")
            ax.set_ylabel(f"block {b}", fontsize=8)
        axes[0, 0].set_title("blocks in use over time (dashed: pool size)", fontsize=9)
        axes[-1, 0].set_xlabel("time (s)")
        fig.tight_layout()
        path = directory / "blocks_in_use_over_time.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
