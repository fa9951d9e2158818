"""Rendering of vLLM capture summaries and KV-event analyses: rich tables and PNG plots.

JSON comes from the same frozen dataclasses through kvtool.cli.output.print_json.
rich is imported by the callers' consoles; matplotlib only inside :func:`write_plots`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.core.format import fmt_num as _num
from kvtool.core.format import fmt_pct as _pct
from kvtool.vllm.events.analysis import Stats, VllmAnalysis
from kvtool.vllm.events.capture import CaptureResult
from kvtool.vllm.events.cross_instance import CrossInstanceReuse
from kvtool.vllm.recorder.launch import RecordResult

TIMELINE_ROWS = 8  # rows of the stored-over-time table (the plot has every point)


def capture_table(result: CaptureResult):
    from kvtool.core.render import new_table

    table = new_table(title=f"kvtool capture -> {result.output}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("socket", f"{result.role} {result.endpoint}"),
        ("events written", _num(result.events_written)),
        ("batches written", _num(result.batches_written)),
        ("sequence numbers", "-" if result.first_seq is None else f"{result.first_seq} .. {result.last_seq}"),
        ("gaps", _num(result.gaps)),
        (
            "batches missed / recovered / lost",
            f"{result.batches_missed:,} / {result.batches_recovered:,} / {result.batches_unrecovered:,}",
        ),
        ("sequence resets", _num(result.sequence_resets)),
        ("malformed frames", _num(result.malformed_frames)),
        ("duration (s)", f"{result.duration_s:,.1f}"),
        ("stopped by", result.stopped_by),
    ]
    if result.replay_error:
        rows.append(("replay error", result.replay_error))
    if result.malformed_file:
        rows.append(("malformed frames kept in", result.malformed_file))
        rows.extend(("  reason", reason) for reason in result.malformed_reasons)
    for row in rows:
        table.add_row(*row)
    return table


def record_table(result: RecordResult):
    """One row per file written by `kvtool record` (one per data-parallel rank that ran)."""
    from kvtool.core.render import new_table

    table = new_table(
        title=f"kvtool record: command exited with {result.command_exit_code} after {result.duration_s:.1f} s"
    )
    table.add_column("file", overflow="fold", min_width=24)
    for name in ("DP rank", "rows", "engine steps", "recorder time"):
        table.add_column(name, justify="right")
    table.add_column("note", overflow="fold")
    for f in result.files:
        per_step = f"{f.recorder_s / f.engine_steps * 1e3:.3f} ms/step" if f.engine_steps else "-"
        note = f"turned off: {f.turned_off}" if f.turned_off else ("spool converted" if f.spool_converted else "")
        table.add_row(f.path, str(f.dp_rank), f"{f.rows:,}", f"{f.engine_steps:,}", per_step, note)
    return table


def _stats_row(name: str, stats: Stats) -> tuple[str, ...]:
    return (
        name,
        _num(stats.count),
        _num(stats.min_s),
        _num(stats.median_s),
        _num(stats.mean_s),
        _num(stats.p90_s),
        _num(stats.max_s),
    )


def analysis_tables(analysis: VllmAnalysis) -> list:
    """The rich renderables of one analysis, in print order."""
    from rich.text import Text

    from kvtool.core.render import new_table

    c = analysis.counts
    out: list[Any] = []
    summary = new_table(
        title=f"{'SGLang' if analysis.engine == 'sglang' else 'vLLM'} KV-cache events: {analysis.source}",
        show_header=False,
    )
    summary.add_column("what")
    summary.add_column("value", justify="right")
    for name, value in [
        (
            "BlockStored / BlockRemoved / AllBlocksCleared events",
            f"{c.block_stored_events:,} / {c.block_removed_events:,} / {c.all_blocks_cleared_events:,}",
        ),
        ("other events (not analysed)", _num(c.other_events)),
        ("batches (seq range)", f"{c.batches:,} ({c.first_seq} .. {c.last_seq})"),
        ("missing sequence numbers", _num(c.missing_seqs)),
        ("streams (engine runs) / restarts", f"{len(analysis.streams):,} / {c.sequence_resets:,}"),
        ("data-parallel rank ids", ", ".join(map(str, c.dp_ranks))),
        ("duration (s)", _num(c.duration_s)),
        ("block size (tokens)", _num(analysis.block_size)),
        ("distinct blocks stored", _num(analysis.distinct_blocks)),
        ("peak cached blocks", _num(analysis.peak_cached_blocks)),
        ("cached blocks at the end", _num(analysis.final_cached_blocks)),
        ("report mode (inferred)", analysis.hits.report_mode),
    ]:
        summary.add_row(name, value)
    out.append(summary)
    if len(analysis.streams) > 1:
        out.append(_streams_table(analysis))

    timeline = new_table(title="Prefix-cache blocks over time")
    for name in ("t (s)", "seq", "cached blocks", "stored so far", "evicted so far"):
        timeline.add_column(name, justify="right")
    points = analysis.timeline
    step = max(1, (len(points) - 1) // (TIMELINE_ROWS - 1)) if len(points) > 1 else 1
    shown = list(points[::step])
    if points and shown[-1] is not points[-1]:
        shown.append(points[-1])
    for p in shown:
        timeline.add_row(
            f"{p.t_s:,.3f}",
            str(p.seq),
            f"{p.cached_blocks:,}",
            f"{p.stored_blocks_total:,}",
            f"{p.removed_blocks_total:,}",
        )
    out.append(timeline)

    life = new_table(title="Block lifetimes in the prefix cache (s)")
    for name in ("ended by", "blocks", "min", "median", "mean", "p90", "max"):
        life.add_column(name, justify="right" if name != "ended by" else "left")
    life.add_row(*_stats_row("evicted (BlockRemoved)", analysis.lifetimes.evicted))
    life.add_row(*_stats_row("cleared (AllBlocksCleared)", analysis.lifetimes.cleared))
    life.add_row(*_stats_row("still cached at end (age)", analysis.lifetimes.still_cached))
    if analysis.lifetimes.restarted.count:
        life.add_row(*_stats_row("engine restart", analysis.lifetimes.restarted))
    out.append(life)

    ch, chains, hits = analysis.churn, analysis.chains, analysis.hits
    work = new_table(title="Churn, prefix chains and hits", show_header=False)
    work.add_column("what")
    work.add_column("value", justify="right")
    for name, value in [
        ("blocks computed (first time + again)", _num(ch.computed_blocks)),
        (
            "computed again after eviction (churn)",
            f"{ch.recomputed_blocks:,} blocks, {ch.recomputed_hashes:,} hashes, {_num(ch.recomputed_tokens)} tokens",
        ),
        ("churn share of computed blocks", _pct(ch.recomputed_fraction)),
        ("stored again after AllBlocksCleared", _num(ch.restored_after_clear_blocks)),
        ("chain roots / max depth (blocks)", f"{chains.root_blocks:,} / {chains.max_depth_blocks:,}"),
        ("longest cached prefix (tokens)", _num(chains.max_prefix_tokens)),
        ("mean depth (blocks)", _num(chains.mean_depth_blocks)),
        ("forking blocks / max children", f"{chains.branch_blocks:,} / {chains.max_children:,}"),
        (
            "hit evidence: re-sent blocks (tokens)",
            "-" if hits.report_mode != "full" else f"{hits.hit_blocks:,} ({_num(hits.hit_tokens)})",
        ),
        ("hit share of looked-up blocks", _pct(hits.hit_fraction)),
    ]:
        work.add_row(name, value)
    out.append(work)

    if analysis.sessions:
        sessions = new_table(title="Per session_id")
        for name in (
            "session_id",
            "store events",
            "computed blocks",
            "hit blocks",
            "recomputed blocks",
            "first t (s)",
            "last t (s)",
        ):
            sessions.add_column(name, justify="left" if name == "session_id" else "right")
        for s in analysis.sessions:
            sessions.add_row(
                s.session_id,
                f"{s.store_events:,}",
                f"{s.computed_blocks:,}",
                f"{s.hit_blocks:,}" if hits.report_mode == "full" else "-",
                f"{s.recomputed_blocks:,}",
                f"{s.first_t_s:,.3f}",
                f"{s.last_t_s:,.3f}",
            )
        out.append(sessions)
    for note in analysis.notes:
        out.append(Text(f"Note: {note}"))
    return out


def cross_instance_tables(result: CrossInstanceReuse) -> list:
    """The rich renderables of the cross-instance reuse report, in print order."""
    from rich.text import Text

    from kvtool.core.render import new_table

    engine = " of SGLang" if result.engine == "sglang" else ""
    per = new_table(title=f"Reuse missed across instances{engine} (blocks matched by {result.matched_by})")
    per.add_column("instance")
    for name in ("computed blocks", "computed tokens", "local hit blocks", "missed blocks", "missed tokens"):
        per.add_column(name, justify="right")
    per.add_column("missed share", justify="right")
    per.add_column("held by")
    for i in result.instances:
        per.add_row(
            i.instance,
            f"{i.computed_blocks:,}",
            f"{i.computed_tokens:,}",
            f"{i.local_hit_blocks:,}" if i.report_mode == "full" else "-",
            f"{i.missed_blocks:,}",
            f"{i.missed_tokens:,}",
            _pct(i.missed_share),
            ", ".join(f"{h.instance} {h.blocks:,}" for h in i.held_by) or "-",
        )
    per.add_row(
        "fleet",
        f"{result.computed_blocks:,}",
        f"{result.computed_tokens:,}",
        "",
        f"{result.missed_blocks:,}",
        f"{result.missed_tokens:,}",
        _pct(result.missed_share),
        "",
    )
    out: list[Any] = [per]

    summary = new_table(title="What the events show", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    lead, hashes = result.lead, result.hashes
    for name, value in [
        ("what-if share: computed tokens held elsewhere", _pct(result.missed_share)),
        ("blocks computed after another instance had computed them", _num(result.computed_elsewhere_before_blocks)),
        ("held elsewhere for (s): min / median / max", f"{_num(lead.min_s)} / {_num(lead.median_s)} / "
         f"{_num(lead.max_s)}"),
        ("missed blocks held elsewhere < 1 s (clock skew)", _num(result.skew_sensitive_blocks)),
        (f"{'SGLang page' if result.engine == 'sglang' else 'vLLM block'} hashes across instances", hashes.verdict),
        ("block contents on 2+ instances / same hash", f"{hashes.shared_contents:,} / {hashes.same_hash_contents:,}"),
        ("missed blocks a hash-keyed router would see", _num(hashes.missed_blocks_same_hash)
         if result.matched_by == "content" else "-"),
    ]:  # fmt: skip
        summary.add_row(name, value)
    out.append(summary)

    if result.top_prefixes:
        top = new_table(title="Prefixes computed again while held elsewhere")
        for name in ("prefix tokens", "times", "missed tokens", "computed on", "held on", "first token ids"):
            top.add_column(name, justify="right" if name in ("prefix tokens", "times", "missed tokens") else "left")
        for p in result.top_prefixes:
            top.add_row(
                f"{p.prefix_tokens:,}",
                f"{p.times:,}",
                f"{p.missed_tokens:,}",
                ", ".join(p.computed_on),
                ", ".join(p.held_on),
                " ".join(map(str, p.first_token_ids)) or "-",
            )
        out.append(top)
    for note in result.notes:
        out.append(Text(f"Note: {note}"))
    return out


def _streams_table(analysis: VllmAnalysis):
    """One row per engine run in the file: each has its own sequence numbers, so its own gaps."""
    from kvtool.core.render import new_table

    table = new_table(title="Streams (one per engine run)")
    for name in ("stream", "dp rank", "started by", "line", "seq range", "batches", "missing", "t (s)"):
        table.add_column(name, justify="left" if name == "started by" else "right")
    for s in analysis.streams:
        table.add_row(
            str(s.index),
            str(s.dp_rank),
            s.started_by,
            f"{s.first_line:,}",
            f"{s.first_seq} .. {s.last_seq}",
            f"{s.batches:,}",
            f"{s.missing_seqs:,}",
            f"{s.start_t_s:,.3f} .. {s.end_t_s:,.3f}",
        )
    return table


def write_plots(analysis: VllmAnalysis, plot_dir: Path) -> list[Path]:
    """PNG plots of the analysis into plot_dir (created); returns the paths written."""
    plot_dir = Path(plot_dir)
    try:
        plot_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create the plot directory: {err.strerror or err}", where=str(plot_dir)) from None
    from kvtool.core.extras import require

    require("matplotlib", feature="kvtool analyze --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(fig, ax, name: str, xlabel: str, ylabel: str, title: str) -> None:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(plot_dir / name, dpi=100)
        plt.close(fig)
        written.append(plot_dir / name)

    fig, ax = plt.subplots(figsize=(8, 4))
    t = [p.t_s for p in analysis.timeline]
    ax.step(t, [p.cached_blocks for p in analysis.timeline], where="post", label="cached blocks")
    ax.step(t, [p.stored_blocks_total for p in analysis.timeline], where="post", label="stored so far")
    ax.step(t, [p.removed_blocks_total for p in analysis.timeline], where="post", label="evicted so far")
    ax.legend()
    save(
        fig, ax, "vllm_cached_blocks.png", "time since first batch (s)", "blocks", "vLLM prefix-cache blocks over time"
    )

    histogram = analysis.lifetimes.evicted_histogram
    if histogram:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.bar(
            [lo for lo, _, _ in histogram],
            [n for _, _, n in histogram],
            width=[hi - lo for lo, hi, _ in histogram],
            align="edge",
        )
        save(
            fig,
            ax,
            "vllm_block_lifetimes.png",
            "lifetime in the prefix cache, stored -> evicted (s)",
            "blocks",
            "Evicted block lifetimes",
        )

    fig, ax = plt.subplots(figsize=(8, 4))
    depths = analysis.chains.depth_histogram
    ax.bar([d for d, _ in depths], [n for _, n in depths])
    save(fig, ax, "vllm_chain_depth.png", "depth in prefix chain (blocks)", "distinct blocks", "Prefix chain depth")
    return written
