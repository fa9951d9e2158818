"""The results of `kvtool simulate`: the report dataclasses, the recommendations and the cost model in words.

No rendering here: ``kvtool.simulate.render`` turns a :class:`SimulateReport` into tables, JSON and plots.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.format import fmt_pct
from kvtool.core.jsonable import to_jsonable
from kvtool.simulate.costs import Hardware
from kvtool.simulate.offload_tier import OffloadCurve
from kvtool.simulate.serving import ServeResult
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
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    hardware: Hardware
    scheduler_defaults: tuple[str, ...]  # the defaults taken for max_num_seqs / max_num_batched_tokens, in words
    cost_text: str  # the step-time formula with its parameters and where each came from
    extras: str  # prefix cache, prompts' prefix structure and split pools, in words
    slo_ttft_ms: float | None = None


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
    offload_curve: OffloadCurve | None = None  # --kv-offloading-size: hit rate against the CPU tier's size

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
        out = {
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
        if self.offload_curve is not None:
            out["offload_curve"] = to_jsonable(self.offload_curve)
        return out


def _pct(x: float | None) -> str:
    return fmt_pct(x, decimals=2)


# Throughputs within this fraction of the best count as a tie (the smaller block wins: less waste, finer prefix
# sharing).
TIE_FRACTION = 0.01


def recommend(
    static: StaticComparison, serve: list[ServeResult] | None, slo_ttft_ms: float | None = None
) -> list[Recommendation]:
    """One pick with its rule, then one line per other block size with its trade-off.

    With the serving simulation: the highest output throughput among the block sizes whose TTFT p99 meets
    ``slo_ttft_ms`` (all of them without a target), throughputs within 1 % tied to the smaller block; when none
    meets the target, the lowest TTFT p99.  Static comparison only: the least internal fragmentation with a budget's
    p1 concurrency as the tie-breaker is not a serving decision, so the pick is the block with the most requests
    fitting 99 % of the time (--kv-tokens), else the least waste, ties to the larger block (fewer table entries).
    """
    ran = [r for r in serve or [] if r.completed]
    if ran:
        return _recommend_serving(ran, slo_ttft_ms)
    return _recommend_static(static)


def _recommend_serving(ran: list[ServeResult], slo_ttft_ms: float | None) -> list[Recommendation]:
    slo_s = None if slo_ttft_ms is None else slo_ttft_ms / 1e3
    meets = [r for r in ran if slo_s is None or (r.ttft_p99_s is not None and r.ttft_p99_s <= slo_s)]
    if meets:
        top = max(r.throughput_tokens_per_s for r in meets)
        tied = [r for r in meets if r.throughput_tokens_per_s >= top * (1 - TIE_FRACTION)]
        fastest = min(r.tpot_p50_s if r.tpot_p50_s is not None else float("inf") for r in tied)
        best = min(
            (r for r in tied if r.tpot_p50_s is None or r.tpot_p50_s <= fastest * (1 + TIE_FRACTION)),
            key=lambda r: r.block_size,
        )
        target = f"TTFT p99 <= {slo_ttft_ms:g} ms" if slo_s is not None else "no TTFT target (--slo-ttft-ms)"
        rule = (
            f"highest output throughput with {target}; within {TIE_FRACTION:.0%}, the lowest TPOT p50; within "
            f"{TIE_FRACTION:.0%} again, the smaller block"
        )
    else:
        best = min(ran, key=lambda r: (r.ttft_p99_s or 0.0, r.block_size))
        rule = f"no block size meets TTFT p99 <= {slo_ttft_ms:g} ms: the lowest TTFT p99"
    recs = [Recommendation("pick", best.block_size, f"{_serve_line(best)} (rule: {rule})")]
    for r in ran:
        if r is best:
            continue
        recs.append(Recommendation("trade-off", r.block_size, _trade_off(r, best, slo_s)))
    return recs


def _serve_line(r: ServeResult) -> str:
    return (
        f"{r.throughput_tokens_per_s:,.0f} output tok/s, TTFT p99 {_s(r.ttft_p99_s)}, TPOT p50 {_s(r.tpot_p50_s)}, "
        f"{_n(r.preemptions, 'preemption')}, prefix hits {_pct(r.prefix_hit_rate)}, utilization {_pct(r.utilization)}"
    )


def _trade_off(r: ServeResult, best: ServeResult, slo_s: float | None) -> str:
    parts = [f"{r.throughput_tokens_per_s / best.throughput_tokens_per_s - 1:+.1%} throughput"]
    if r.ttft_p99_s is not None and best.ttft_p99_s:
        parts.append(f"TTFT p99 {_s(r.ttft_p99_s)} ({r.ttft_p99_s / best.ttft_p99_s - 1:+.0%})")
    if r.tpot_p50_s is not None and best.tpot_p50_s:
        parts.append(f"TPOT p50 {r.tpot_p50_s / best.tpot_p50_s - 1:+.1%}")
    parts.append(f"prefix hits {_pct(r.prefix_hit_rate)}")
    parts.append(f"{_n(r.preemptions, 'preemption')}")
    if slo_s is not None and (r.ttft_p99_s is None or r.ttft_p99_s > slo_s):
        parts.append("misses the TTFT target")
    return ", ".join(parts)


def _recommend_static(static: StaticComparison) -> list[Recommendation]:
    res = {r.block_size: r for r in static.results}
    score: dict[int, tuple[float, ...]]
    if static.kv_tokens is not None:
        score = {b: (r.fit_at_once_p1 or 0.0, -r.internal_fragmentation, b) for b, r in res.items()}
        rule = f"most requests fit at once 99 % of the time in {static.kv_tokens:,} KV tokens, ties to the larger block"
    else:
        score = {b: (-r.internal_fragmentation, b) for b, r in res.items()}
        rule = "least internal fragmentation, ties to the larger block (no --kv-tokens, no --serve)"
    best = max(score, key=lambda b: score[b])
    recs = [Recommendation("pick", best, f"{_static_line(res[best], static)} (rule: {rule}; --serve to judge speed)")]
    for b, r in res.items():
        if b != best:
            recs.append(Recommendation("trade-off", b, _static_line(r, static)))
    return recs


def _static_line(r, static: StaticComparison) -> str:
    line = (
        f"{_pct(r.internal_fragmentation)} of allocated slots empty, {r.mean_table_entries:.1f} table entries/request"
    )
    if static.kv_tokens is not None:
        line += f", {r.fit_at_once_p1:.0f} requests fit at once (p1)"
    return line


def _n(count: int, noun: str) -> str:
    """'1 preemption', '3 preemptions'."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 0.1 else f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"


def cost_text(hw: Hardware) -> str:
    return (
        f"{hw.step_overhead_ms:g} ms + max((weights + KV read) / {hw.bandwidth_bytes_per_s / 1e9:,.0f} GB/s, "
        f"FLOPs / {hw.peak_flops_per_s / 1e12:,.0f} TFLOP/s) + {hw.table_entry_us:g} us x block-table entries; "
        f"{hw.model} on {hw.gpu}, tp {hw.tp}: " + "; ".join(hw.sources)
    )
