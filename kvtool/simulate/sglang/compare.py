"""``kvtool simulate --engine vllm,sglang``: one trace through both engines' models, side by side.

The same requests (lengths, prefix structure, arrivals), the same model and GPU, the same step-time model
(:class:`kvtool.simulate.costs.RooflineCost`); each engine keeps its own pool (vLLM's KV budget in blocks of
``--block-size``, SGLang's max_total_num_tokens in pages of ``--page-size``, each from kvtool's estimate rules, or
both ``--kv-tokens``), its own batch settings (vLLM's max_num_seqs and max_num_batched_tokens, SGLang's
max_running_requests and chunked_prefill_size, each engine's default for the GPU) and its own scheduler.  Every
block size and page size given is one column (a sweep over the unit of each pool).  Mirrors ``kvtool estimate
--engine vllm,sglang`` (kvtool.estimate.sglang.compare).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.simulate.serving import ServeResult
from kvtool.simulate.sglang.run import SglangOptions, SglangReport, SglangSetup
from kvtool.simulate.sglang.scheduler import SglangResult


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One column of the side-by-side table: one engine at one block (vLLM) or page (SGLang) size."""

    engine: str  # "vllm" or "sglang"
    unit: str  # "block" or "page"
    unit_tokens: int  # the block size or the page size
    pool_tokens: int  # usable KV tokens (vLLM: blocks less the null block, x block size; SGLang max_total_num_tokens)
    max_running_requests: int  # vLLM max_num_seqs, SGLang max_running_requests
    batch_tokens: int  # vLLM max_num_batched_tokens, SGLang chunked_prefill_size
    requests: int
    completed: int
    cached_prompt_tokens: int  # prefix hit at each request's first admission, summed
    prefix_hit_rate: float | None  # cached_prompt_tokens / prompt tokens of the requests that ran
    preemptions: int  # vLLM preemptions, SGLang retractions (events: a request can count more than once)
    preempted_requests: int  # requests preempted / retracted at least once
    steps: int  # engine steps
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    throughput_tokens_per_s: float | None  # output tokens of completed requests / span
    requests_per_s: float | None
    span_s: float | None  # first arrival to last completion


@dataclasses.dataclass(frozen=True)
class EngineComparison:
    """Both engines on one trace: the columns, and each engine's own report."""

    source: str
    requests: int
    model: str
    gpu: str
    tp: int
    arrivals: str
    runs: tuple[EngineRun, ...]  # vLLM's block sizes, then SGLang's page sizes
    vllm: tuple[ServeResult, ...]
    vllm_setup: Any  # kvtool.simulate.results.ServeSetup
    sglang: SglangReport
    notes: tuple[str, ...]


def vllm_run(r: ServeResult, max_num_seqs: int, max_num_batched_tokens: int) -> EngineRun:
    return EngineRun(
        engine="vllm",
        unit="block",
        unit_tokens=r.block_size,
        pool_tokens=r.pool_tokens,
        max_running_requests=max_num_seqs,
        batch_tokens=max_num_batched_tokens,
        requests=r.requests,
        completed=r.completed,
        cached_prompt_tokens=r.cached_prompt_tokens,
        prefix_hit_rate=r.prefix_hit_rate,
        preemptions=r.preemptions,
        preempted_requests=r.preempted_requests,
        steps=r.steps,
        ttft_p50_s=r.ttft_p50_s,
        ttft_p99_s=r.ttft_p99_s,
        tpot_p50_s=r.tpot_p50_s,
        tpot_p99_s=r.tpot_p99_s,
        throughput_tokens_per_s=r.throughput_tokens_per_s,
        requests_per_s=r.requests_per_s,
        span_s=r.span_s,
    )


def sglang_run(r: SglangResult, setup: SglangSetup) -> EngineRun:
    return EngineRun(
        engine="sglang",
        unit="page",
        unit_tokens=r.page_size,
        pool_tokens=r.pool_tokens,
        max_running_requests=setup.max_running_requests,
        batch_tokens=setup.chunked_prefill_size,
        requests=r.requests,
        completed=r.finished_requests,
        cached_prompt_tokens=r.first_cached_prompt_tokens,
        prefix_hit_rate=r.prefix_hit_rate,
        preemptions=r.retractions,
        preempted_requests=r.retracted_requests,
        steps=r.steps,
        ttft_p50_s=r.ttft_p50_s,
        ttft_p99_s=r.ttft_p99_s,
        tpot_p50_s=r.tpot_p50_s,
        tpot_p99_s=r.tpot_p99_s,
        throughput_tokens_per_s=r.throughput_tokens_per_s,
        requests_per_s=r.requests_per_s,
        span_s=r.span_s,
    )


def compare_engines(reqs, options, sglang: SglangOptions = SglangOptions()) -> EngineComparison:
    """vLLM's serving simulation at each of ``options.block_sizes`` and SGLang's at each of ``sglang.page_sizes``,
    on the same requests, model and GPU (``options``: kvtool.simulate.run.SimulateOptions)."""
    from kvtool.simulate.run import resolve_serving_hardware, serve_requests
    from kvtool.simulate.sglang.run import simulate_sglang_report

    options = dataclasses.replace(options, serve=True)
    hw = resolve_serving_hardware(options)
    vllm_results, setup, _, _, _ = serve_requests(reqs, options, None, keep_traces=False, hardware=hw)
    sg = simulate_sglang_report(reqs, options, sglang, hardware=hw)
    runs = [vllm_run(r, setup.max_num_seqs, setup.max_num_batched_tokens) for r in vllm_results]
    runs += [sglang_run(r, s) for r, s in zip(sg.results, sg.setups)]
    notes = (
        f"vLLM: {setup.pool_text}; {setup.extras}.",
        *(f"SGLang page {s.page_size}: {s.pool_text}." for s in sg.setups),
        "Prefix hit: each request's hit at its first admission over the prompt tokens of the requests that ran "
        "(vLLM whole blocks, at most prompt - 1 tokens; SGLang whole pages of its radix match on prompt - 1 tokens).",
        "Preemptions: vLLM's preemptions (recompute), SGLang's decode retractions.",
        *sg.notes,
    )
    return EngineComparison(
        source=reqs.source,
        requests=reqs.count,
        model=hw.model,
        gpu=hw.gpu,
        tp=hw.tp,
        arrivals=setup.arrivals,
        runs=tuple(runs),
        vllm=tuple(vllm_results),
        vllm_setup=setup,
        sglang=sg,
        notes=notes,
    )
