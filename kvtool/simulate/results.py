"""The results of `kvtool simulate`: the report dataclasses, the recommendations and the cost model in words.

No rendering here: ``kvtool.simulate.render`` turns a :class:`SimulateReport` into tables, JSON and plots.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.format import fmt_pct
from kvtool.core.jsonable import to_jsonable
from kvtool.simulate.serving import CostModel, ServeResult
from kvtool.simulate.static import StaticComparison


@dataclasses.dataclass(frozen=True)
class Recommendation:
    objective: str  # "least waste", "most concurrency", "fewest preemptions", "fastest engine", ...
    block_size: int
    reason: str  # the numbers behind the choice


@dataclasses.dataclass(frozen=True)
class ServeSetup:
    """How the serving simulation was set up, as stated in the output."""

    pool_tokens: int
    pool_is_default: bool  # no --kv-tokens or --model/--gpu: the documented default pool
    pool_text: str  # the pool and where it came from, in words
    arrivals: str  # where arrival times came from, in words
    max_num_seqs: int
    cost_model: CostModel
    cost_text: str  # the step-time formula with its parameters
    extras: str  # prefix cache and split pools, in words


@dataclasses.dataclass(frozen=True)
class SimulateReport:
    source: str
    requests: int
    block_sizes: list[int]
    static: StaticComparison
    serve: list[ServeResult] | None
    serve_setup: ServeSetup | None
    recommendations: list[Recommendation]
    exported_events: dict[int, str]  # block size -> events file written
    kv_tokens_text: str | None = None  # where the KV budget came from ("--kv-tokens", estimate's plan for ...)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (without ``plots``): one entry per block size in ``results``, static and serving
        figures side by side."""
        serve = {r.block_size: r for r in self.serve} if self.serve else {}
        results = []
        for st in self.static.results:
            row = to_jsonable(st)
            if st.block_size in serve:
                row.update({k: v for k, v in to_jsonable(serve[st.block_size]).items() if k != "block_size"})
                row["exported_events"] = self.exported_events.get(st.block_size)
            results.append(row)
        return {
            "source": self.source,
            "requests": self.requests,
            "block_sizes": self.block_sizes,
            "kv_tokens": self.static.kv_tokens,
            "kv_tokens_text": self.kv_tokens_text,
            "mean_length_tokens": self.static.mean_length_tokens,
            "p99_length_tokens": self.static.p99_length_tokens,
            "max_length_tokens": self.static.max_length_tokens,
            "min_length_tokens": self.static.min_length_tokens,
            "contiguous": to_jsonable(self.static.contiguous),
            "serve_setup": to_jsonable(self.serve_setup),
            "results": results,
            "recommendations": to_jsonable(self.recommendations),
        }


def _pct(x: float | None) -> str:
    return fmt_pct(x, decimals=2)


def _alt(values: dict[int, float], best: int, fmt, extra: str = "") -> str:
    """' (8: x, 32: y; extra)': the other block sizes' figures, or '' when there are none."""
    others = ", ".join(f"{b}: {fmt(v)}" for b, v in values.items() if b != best)
    inside = "; ".join(p for p in (others, extra) if p)
    return f" ({inside})" if inside else ""


def _ties(values: dict[int, float], best: int, rule: str) -> str:
    """'; tied with 8, 16: <rule>' when other block sizes have the winning figure, else ''."""
    tied = [b for b, v in values.items() if b != best and v == values[best]]
    return f"; tied with {', '.join(map(str, tied))}: {rule}" if tied else ""


def recommend(static: StaticComparison, serve: list[ServeResult] | None) -> list[Recommendation]:
    """One line per objective: the block size that wins it, with the figures of the others and how a tie was broken.

    Serving objectives are judged only over block sizes where some request ran; none when no request ran at all.
    """
    recs = []
    frag = {r.block_size: r.internal_fragmentation for r in static.results}
    best = min(frag, key=lambda b: (frag[b], -b))
    recs.append(
        Recommendation(
            "least waste",
            best,
            f"{_pct(frag[best])} of allocated slots empty"
            + _alt(frag, best, _pct)
            + _ties(frag, best, "the largest has the fewest table entries"),
        )
    )
    if static.kv_tokens is not None:
        fit = {r.block_size: r.fit_at_once_p50 for r in static.results}
        best = max(fit, key=lambda b: (fit[b], b))
        if fit[best] == 0:
            reason = (
                f"none: at every block size most requests alone need more than the {static.kv_tokens:,} KV "
                "tokens (p50 of requests that fit at once is 0)"
            )
        else:
            reason = (
                f"{fit[best]:.0f} requests fit at once (p50) in {static.kv_tokens:,} KV tokens"
                + _alt(fit, best, lambda v: f"{v:.0f}", f"contiguous: {static.contiguous.fit_at_once}")
                + _ties(fit, best, "the largest has the fewest table entries")
            )
        recs.append(Recommendation("most concurrency", best, reason))
    ran = [r for r in serve or [] if r.completed]
    if ran:
        pre = {r.block_size: r for r in ran}
        counts = {b: r.preemptions for b, r in pre.items()}
        best = min(pre, key=lambda b: (pre[b].preemptions, pre[b].ttft_p99_s or 0.0, b))
        recs.append(
            Recommendation(
                "fewest preemptions",
                best,
                f"{_n(pre[best].preemptions, 'preemption')}"
                + _alt(counts, best, lambda v: f"{v:,}")
                + _ties(counts, best, f"lowest TTFT p99 ({_s(pre[best].ttft_p99_s)})"),
            )
        )
        tpot = {r.block_size: r.tpot_p50_s for r in ran if r.tpot_p50_s is not None}
        if tpot:
            best = min(tpot, key=lambda b: (tpot[b], -b))
            recs.append(
                Recommendation(
                    "fastest decode",
                    best,
                    f"time per output token p50 {tpot[best] * 1e3:.2f} ms"
                    + _alt(tpot, best, lambda v: f"{v * 1e3:.2f} ms")
                    + _ties(tpot, best, "the largest has the fewest table entries"),
                )
            )
        ttft = {r.block_size: r.ttft_p99_s for r in ran if r.ttft_p99_s is not None}
        if ttft:
            best = min(ttft, key=lambda b: (ttft[b], b))
            recs.append(
                Recommendation(
                    "lowest TTFT p99",
                    best,
                    f"{ttft[best]:.3f} s"
                    + _alt(ttft, best, lambda v: f"{v:.3f} s")
                    + _ties(ttft, best, "the smallest wastes the least"),
                )
            )
    return recs


def _n(count: int, noun: str) -> str:
    """'1 preemption', '3 preemptions'."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 0.1 else f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def cost_text(cost: CostModel) -> str:
    return (
        f"{cost.step_overhead_ms:g} ms + {cost.token_us:g} us x tokens computed + "
        f"({cost.table_entry_us:g} us + block_size x {cost.kv_token_us:g} us) x blocks in use"
    )
