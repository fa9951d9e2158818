"""`kvtool simulate --engine sglang`: SGLang's radix cache and scheduler over the same requests as vLLM's simulation.

The requests come from the same loaders (``kvtool.simulate.inputs.prepare``); each page size of ``--block-size`` is
one run of :mod:`kvtool.simulate.sglang.scheduler` over a pool of ``--kv-tokens`` tokens.  The report is its own
dataclass: SGLang's model counts steps and tokens (no step-time model yet), so it is not folded into vLLM's
``SimulateReport`` (times, TTFT); compare the two engines on one trace by running both (docs in the notes).
"""

from __future__ import annotations

import dataclasses
import itertools

from kvtool.core.errors import UsageError
from kvtool.simulate.sglang.scheduler import SglangConfig, SglangResult, simulate_sglang

NOTES = (
    "SGLang model (sglang 0.5.23 source): radix-cache prefix matching at the page size, LRU eviction of unlocked "
    "leaves, PrefillAdder admission (new_token_ratio reservation, chunked prefill, max_running_requests), retraction "
    "on decode memory pressure; all requests queued at the start; steps are counted, not timed "
    "(kvtool/simulate/sglang/scheduler.py).",
    "Tokens past a trace's shared part (and every generated token) are taken as unique to their request.",
)


@dataclasses.dataclass(frozen=True)
class SglangReport:
    source: str
    engine: str  # "sglang"
    pool_tokens: int
    schedule_policy: str
    results: tuple[SglangResult, ...]  # one per page size
    notes: tuple[str, ...]


def token_prompts(reqs) -> list[list[int]]:
    """Each request's prompt as token ids: its shared part (ids, or one id per (piece, offset)) then unique ids."""
    ids: dict[tuple[object, int], int] = {}
    unique = itertools.count(-(1 << 40), -1)
    out = []
    for i in range(reqs.count):
        n = int(reqs.prompt_tokens[i])
        prompt: list[int] = []
        if reqs.shared is not None:
            kind, shared = reqs.shared[i]
            if kind == "tokens":
                prompt = [int(t) for t in shared][:n]
            else:
                for piece, length in shared:
                    prompt += [ids.setdefault((piece, k), len(ids)) for k in range(int(length))]
                prompt = prompt[:n]
        prompt += [next(unique) for _ in range(n - len(prompt))]
        out.append(prompt)
    return out


def simulate_sglang_report(
    reqs,
    options,
    *,
    max_running_requests: int = 256,
    chunked_prefill_size: int | None = 8192,
    schedule_policy: str = "fcfs",
) -> SglangReport:
    if options.kv_tokens is None:
        raise UsageError(
            "--engine sglang needs the pool size in tokens",
            where="--kv-tokens",
            tip="give --kv-tokens N (SGLang's max_total_num_tokens, from its start-up log)",
        )
    prompts = token_prompts(reqs)
    max_new = [int(x) for x in reqs.output_tokens]
    results = []
    for page in options.block_sizes:
        config = SglangConfig(
            pool_tokens=options.kv_tokens,
            page_size=page,
            max_running_requests=max_running_requests,
            chunked_prefill_size=chunked_prefill_size,
            schedule_policy=schedule_policy,
        )
        try:
            results.append(simulate_sglang(prompts, max_new, config))
        except ValueError as err:
            raise UsageError(f"{err} (page size {page})", where="--kv-tokens") from None
    return SglangReport(reqs.source, "sglang", options.kv_tokens, schedule_policy, tuple(results), NOTES)
