"""vLLM's ``--max-model-len auto`` (-1): the longest context its auto-fit picks for a KV budget.

vllm/v1/core/kv_cache_utils.py ``_estimate_max_model_len_from_groups`` (0.14.0; kv_cache_planning.py in 0.33.0)
binary-searches the largest ``max_model_len`` in [1, the model's derived max_model_len] whose
``_max_memory_usage_bytes_from_groups`` (the blocks one request needs in every KV-cache group, times the pool's bytes
per block: page x group_size, padding included) is at most the available KV memory; that is, whose blocks fit in
``budget // (page x group_size)`` = the pool's ``num_blocks``.  Unlike the admission check, the null block is not
counted.  It returns 0 when one token does not fit (vLLM then refuses to start: "Cannot auto-fit max_model_len").
Releases before 0.14.0 have no auto-fit (``max_model_len`` takes no -1).
"""

from __future__ import annotations

from typing import NamedTuple

from kvtool.estimate.capacity import Capacity, blocks_for
from kvtool.estimate.vllm_versions import OLDEST_RELEASE, pick


class AutoFitRule(NamedTuple):
    """Whether ``--max-model-len auto`` exists in the releases from ``since``."""

    since: str
    auto_fit: bool
    source: str


AUTO_FIT_RULES: tuple[AutoFitRule, ...] = (
    AutoFitRule(OLDEST_RELEASE, False, "vllm/config/model.py ModelConfig.max_model_len (0.13.0): no -1 / auto"),
    AutoFitRule(
        "0.14.0",
        True,
        "vllm/v1/core/kv_cache_utils.py _auto_fit_max_model_len, _estimate_max_model_len_from_groups (0.14.0); "
        "vllm/v1/core/kv_cache_planning.py (0.33.0)",
    ),
)


def auto_fit_max_model_len(capacity: Capacity, context_tokens: int, vllm_version: str) -> int | None:
    """The max_model_len vLLM's auto-fit picks for ``capacity``'s pool, at most ``context_tokens`` (the model's
    derived max_model_len); None where ``vllm_version`` has no auto-fit."""
    if not pick(AUTO_FIT_RULES, vllm_version).auto_fit:
        return None
    groups, block, in_flight = capacity.groups, capacity.block_size, capacity.max_in_flight_tokens

    def fits(length: int) -> bool:
        return blocks_for(groups, length, block, in_flight) <= capacity.num_blocks

    if not fits(1):
        return 0
    low, high, best = 1, context_tokens, 1
    while low <= high:  # vLLM's own search: blocks_for never decreases with the length
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best
