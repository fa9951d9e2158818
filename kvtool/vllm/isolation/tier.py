"""The second-tier dimension of the isolation check: does a hit served by a KV connector respect the salt?

vLLM's own prefix cache keys a block by its chained block hash, whose first block carries the ``cache_salt``.  A KV
connector (LMCache, the offloading connector's CPU tier, a disk tier such as vLLM's ExampleConnector) keeps blocks
under a key of its own and serves them back when the GPU cache misses.  If that key leaves out the salt, another
tenant's request with the same tokens is served the first tenant's KV from the tier, though the GPU cache kept them
apart.  A trial therefore has to make the GPU copy go away and see who the tier serves:

1. ``prime``   partition A, a fresh prompt: the engine computes it, the GPU cache and the connector store it;
2. fillers     fresh prompts writing more blocks than the GPU pool holds (``num_gpu_blocks`` + one prompt, as the
               eviction dimension sizes them), so the prime's GPU blocks are evicted; the tier may keep it;
3. ``victim``  partition B, the prime's tokens: a correct engine reuses nothing (expected 0); a hit here comes from
               the tier (the GPU copy is gone) and is a leak through it;
4. ``control`` partition A again, the same tokens: must reuse the prime's full blocks, from the tier.  If it does
               not, the tier did not keep the prime and the victim's miss proves nothing (inconclusive, with the
               ``kv-connector`` precondition failed: "the tier did not keep the prime").

The victim runs before the control so that it meets the state the fillers left (a tier that drops an entry once it
is loaded back cannot hide a leak).  Which cache served a hit is read from the counters around each request:
``vllm:prefix_cache_hits`` (the GPU cache) and ``vllm:external_prefix_cache_hits`` (the connector; vLLM 0.32
``vllm/v1/metrics/loggers.py``), used only when no other traffic moved them; vLLM reports a connector's tokens in
``usage.prompt_tokens_details.cached_tokens`` too (``PrefillStats.set``: local + external, vllm/v1/metrics/stats.py).
With KV events, the prime's ``BlockRemoved`` before the victim shows the GPU copy gone.

**Detection.**  The dimension runs only when the engine has a KV connector: before planning, one fresh request
(one full block and a partial one, under a salt of its own) is sent and ``vllm:external_prefix_cache_queries`` read
around it.  vLLM 0.32 counts connector lookups only when a connector exists (``Scheduler.connector_prefix_cache_stats``
is created with the connector, vllm/v1/core/sched/scheduler.py), so the counter rises with a connector and stays at 0
without one; absent from /metrics, it cannot be told (``unknown``).  Either way the dimension is then "not run" with
the reason, and the report says the tier was not covered.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

from kvtool.vllm.isolation.plan import FILLER, MIN_FULL_BLOCKS, DimensionPartitions, Partition, Plan, Probe

if TYPE_CHECKING:
    from kvtool.vllm.isolation.client import Client
    from kvtool.vllm.isolation.record import SkippedDimension

TIER = "tier"
DETECTED, NONE, UNKNOWN = "detected", "none", "unknown"
TIER_LENGTHS = (MIN_FULL_BLOCKS,)  # full blocks of the tier primes (minimization shrinks a leak from here)
KEPT_NOTHING = "the tier did not keep the prime"
GPU_KEPT = "the fillers did not evict the prime from the GPU cache"
CONNECTOR_TIP = (
    'start vLLM with a KV connector (--kv-transfer-config \'{"kv_connector": ..., "kv_role": "kv_both"}\', or '
    "--kv-offloading-backend) to check its tier"
)


@dataclasses.dataclass(frozen=True)
class ConnectorDetection:
    """Whether the engine serves a second tier through a KV connector, and what showed it."""

    state: str  # detected | none | unknown
    detail: str  # the counter and its movement, in words

    @property
    def text(self) -> str:
        return f"{self.state}: {self.detail}"


def detect_connector(client: Client, block_size: int, run_id: str) -> ConnectorDetection:
    """Send one fresh request and read ``vllm:external_prefix_cache_queries`` around it (see the module docstring)."""
    before = client.counters()
    seeds = random.Random(f"{run_id}-detect")
    probe = Probe(-1, TIER, f"{TIER}/detect", FILLER, Partition("detect", cache_salt=f"kvtool-{run_id}-detect"),
                  "tokens", (seeds.getrandbits(63), seeds.getrandbits(63)), -1, f"kvtool-iso-{run_id}-detect")  # fmt: skip
    partial = max(1, block_size // 2)
    reply = client.complete(probe, Plan(block_size, 1, partial, run_id, ()), with_events=False, hidden_size=None)
    after = client.counters()
    tokens = reply.prompt_tokens or block_size + partial
    if before.external_queries_tokens is None or after.external_queries_tokens is None:
        return ConnectorDetection(UNKNOWN, "no vllm:external_prefix_cache_queries in /metrics")
    delta = after.external_queries_tokens - before.external_queries_tokens
    if delta > 0:
        return ConnectorDetection(
            DETECTED, f"vllm:external_prefix_cache_queries rose by {delta:g} tokens on a fresh {tokens}-token request"
        )
    return ConnectorDetection(
        NONE, f"vllm:external_prefix_cache_queries stayed at {after.external_queries_tokens:g} on a fresh "
        f"{tokens}-token request: no KV connector",
    )  # fmt: skip


def add_tier(
    partitions: tuple[DimensionPartitions, ...], skipped: tuple[SkippedDimension, ...],
    connector: ConnectorDetection | None, run_id: str, pool_blocks: int | None, max_blocks: int, budget: int | None,
) -> tuple[tuple[DimensionPartitions, ...], tuple[SkippedDimension, ...]]:  # fmt: skip
    """The tier dimension's partitions (two salts, both orders, exact prompts, fillers after the prime), or why it
    cannot run: no connector, no pool size to size the fillers from, or fillers too many for the budget."""
    from kvtool.vllm.isolation.record import SkippedDimension

    if connector is None:
        return partitions, skipped
    reason = None
    if connector.state != DETECTED:
        reason = f"not covered: no KV connector ({connector.detail}); {CONNECTOR_TIP}"
    elif not pool_blocks:
        reason = "needs the KV pool size to size the fillers (vllm:cache_config_info num_gpu_blocks in /metrics)"
    fill_prompt = max_blocks
    fill_blocks = (pool_blocks or 0) + fill_prompt  # more than the pool holds: the prime's GPU blocks are evicted
    requests = 2 * (-(-fill_blocks // fill_prompt) + 3)
    if reason is None and budget is not None and requests > budget // 3:
        reason = (f"filling the pool ({pool_blocks} blocks, {fill_prompt} per request) takes {requests} requests, more "
                  f"than a third of --budget {budget}")  # fmt: skip
    if reason is not None:
        return partitions, (*skipped, SkippedDimension(TIER, reason))
    pair = (
        Partition("salt:ta", cache_salt=f"kvtool-{run_id}-ta"),
        Partition("salt:tb", cache_salt=f"kvtool-{run_id}-tb"),
    )
    group = DimensionPartitions(TIER, (pair,), variants=("exact",), lengths=TIER_LENGTHS, filler_blocks=fill_blocks,
                                filler_prompt_blocks=fill_prompt, fillers_after_prime=True)  # fmt: skip
    return (*partitions, group), skipped


def minimize_fields(fillers: tuple[Probe, ...]) -> dict[str, Any]:
    """DimensionPartitions fields that give a shrinking trial the fillers of the tier trial it shrinks."""
    per = len(fillers[0].block_seeds) - 1 if fillers else 0
    return {"filler_blocks": len(fillers) * per, "filler_prompt_blocks": per, "fillers_after_prime": True}
