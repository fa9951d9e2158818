"""The four PNG charts of ``kvtool analyze --plot DIR`` (matplotlib, Agg backend, imported only here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvtool.core.errors import UsageError
from kvtool.events.analysis import Analysis

MAX_NAME_CHARS = 80  # a pool's folder name keeps at most this much of the pool name (then a digest)
NAME_DIGEST_CHARS = 8  # hex digits of sha256(name) added to a name that had to change: two names never share a folder
MAX_STEP_POINTS = 20_000  # a longer step curve is thinned to its per-bucket maxima before plotting

CHARTS = (
    "blocks_in_use.png",
    "holding_vs_utilization.png",
    "match_length_hist.png",
    "free_latency_hist.png",
)


def safe_file_name(name: str, fallback: str = "pool") -> str:
    """A pool or instance name as one plain file name: ASCII letters, digits and ``-_.=``, no leading dot, at most
    about MAX_NAME_CHARS.  A name that had to change gets ``-`` and a digest of the original, so ``a/b`` and ``a_b``
    stay apart; ``..``, ``/abs``, a NUL or 300 characters can never name a folder outside the one given."""
    cleaned = "".join(c if (c.isascii() and c.isalnum()) or c in "-_.=" else "_" for c in name)
    if cleaned.startswith("."):  # ".", "..", a hidden folder
        cleaned = "_" + cleaned[1:]
    cleaned = cleaned or fallback
    if cleaned == name and len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:NAME_DIGEST_CHARS]
    return f"{cleaned[:MAX_NAME_CHARS]}-{digest}"


def pool_plot_folder(plot_dir: Path, pool_name: str) -> Path:
    """The folder of one pool's charts: a child of ``plot_dir`` named by :func:`safe_file_name`, checked to be one
    once both are resolved (symlinks included)."""
    folder = plot_dir / safe_file_name(pool_name)
    root = plot_dir.resolve()
    if folder.resolve().parent != root:
        raise UsageError(
            f"the charts of pool {pool_name!r} would be written outside the plot folder", where=str(folder)
        )
    return folder


def write_plots(analysis: Analysis, directory: Path) -> list[Path]:
    """Write the charts into ``directory`` (created if needed); return their paths."""
    from kvtool.core.extras import require

    require("matplotlib", feature="kvtool analyze --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create the plot directory: {err.strerror or err}", where=str(directory)) from None
    paths = [directory / name for name in CHARTS]
    painters = (_blocks_in_use, _holding_vs_utilization, _match_lengths, _free_latency)
    for path, paint in zip(paths, painters):
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        try:
            paint(analysis, ax)
            fig.tight_layout()
            fig.savefig(path)
        except OSError as err:
            raise UsageError(f"cannot write the chart: {err.strerror or err}", where=str(path)) from None
        finally:
            plt.close(fig)
    return paths


def _thin(t, v):
    """Keep a step curve readable: at most MAX_STEP_POINTS buckets, each showing its maximum."""
    from kvtool.events.segments import thin_step_curve

    return thin_step_curve(t, v, None, MAX_STEP_POINTS)[:2]


def _blocks_in_use(analysis: Analysis, ax) -> None:
    tl, lr = analysis.timeline, analysis.long_requests
    if tl.time_s.size:
        ax.step(*_thin(tl.time_s, tl.blocks_in_use), where="post", label="blocks in use (per request)")
        ax.step(
            *_thin(tl.time_s, tl.long_blocks_in_use),
            where="post",
            label=f"held by long requests (> {lr.threshold_tokens} tokens)",
        )
        if tl.physical_time_s is not None and tl.physical_time_s.size:
            ax.step(
                *_thin(tl.physical_time_s, tl.physical_blocks_in_use),
                where="post",
                label="physical blocks in use (block_ids)",
            )
        if lr.capacity_blocks is not None:
            ax.axhline(lr.capacity_blocks, color="grey", linestyle=":", label="pool capacity")
            ax.axhline(
                lr.capacity_blocks * lr.alert_share,
                color="red",
                linestyle="--",
                label=f"long-request alert ({lr.alert_share:.0%} of capacity)",
            )
        ax.legend(loc="upper left", fontsize="small")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("blocks")
    ax.set_title("Blocks in use over time")


def _holding_vs_utilization(analysis: Analysis, ax) -> None:
    import numpy as np

    req = analysis.requests
    ok = ~np.isnan(req.utilization)
    ax.scatter(req.holding_time_s[ok], req.utilization[ok], s=6, alpha=0.4, label="requests")
    ids = {c.request_id for c in analysis.culprits}
    if ids:
        mark = np.array([r in ids for r in req.request_ids]) & ok
        ax.scatter(
            req.holding_time_s[mark],
            req.utilization[mark],
            s=40,
            facecolors="none",
            edgecolors="red",
            label=f"top {len(ids)} culprits (wasted slot-seconds)",
        )
    ax.set_xlabel("holding time (s)")
    ax.set_ylabel("utilization (tokens / slots held)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Holding time versus utilization")
    ax.legend(loc="lower right", fontsize="small")


def _no_data(ax, text: str) -> None:
    """An empty chart says why it is empty instead of showing bare axes."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _match_lengths(analysis: Analysis, ax) -> None:
    m = analysis.match_tokens
    if not analysis.prefix_reuse.reused_tokens and not analysis.prefix_reuse.requests_with_hit:
        _no_data(ax, "no prefix-cache hits in the file (no reuse rows, or none with tokens)")
    elif m.size:
        ax.hist(m, bins=min(100, max(10, int(m.max() // max(analysis.summary.default_block_size, 1)) + 1)))
    ax.set_xlabel("prefix match length (tokens)")
    ax.set_ylabel("requests")
    ax.set_title("Prefix-cache match length (" + ", ".join(analysis.prefix_reuse.diagnosis) + ")")


def _free_latency(analysis: Analysis, ax) -> None:
    """Free latency on linear axes; frees above the late-free threshold marked on the axis and the worst named.

    A log count axis hides a single 900 ms free (a bar of height 1 is a sliver at the bottom); here every late
    free is a red mark at its latency and the worst ones carry their request id and latency.
    """
    import numpy as np

    lat = analysis.free_latencies_ms
    late = analysis.late_frees
    if not lat.size:
        _no_data(ax, "no free latency recorded (no latency_ms on free rows)")
    else:
        ax.hist(lat, bins=60, color="tab:blue", label=f"{lat.size:,} frees")
        p99 = analysis.pool.free_latency_ms_p99
        ax.axvline(p99, color="orange", linestyle="--", label=f"p99 = {p99:,.1f} ms")
        if lat.max() > late.threshold_ms:
            ax.axvline(late.threshold_ms, color="red", linestyle=":", label=f"late: > {late.threshold_ms:,.0f} ms")
            slow = lat[lat > late.threshold_ms]
            ax.plot(
                slow,
                np.zeros(slow.size),
                "v",
                color="red",
                markersize=9,
                clip_on=False,
                label=f"{slow.size:,} late frees (one mark each)",
            )
            top = ax.get_ylim()[1]
            for i, r in enumerate(late.top[:3]):
                ax.annotate(
                    f"{r.request_id}: {r.free_latency_ms:,.0f} ms, {r.late_free_block_seconds:,.2f} block-s",
                    xy=(r.free_latency_ms, 0),
                    xytext=(r.free_latency_ms, top * (0.55 - 0.15 * i)),
                    ha="right",
                    fontsize="small",
                    arrowprops={"arrowstyle": "->", "color": "red"},
                )
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlabel("free latency (ms): request finished -> blocks back in the pool")
    ax.set_ylabel("free events")
    ax.set_title("Free latency (linear axes; late frees marked)")
