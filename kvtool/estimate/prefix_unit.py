"""The prefix-cache unit vLLM really uses for a model, and the shortest prefix that can ever be a hit.

vLLM hashes a prompt in blocks and a hit covers whole blocks of every KV cache group at once, so a hit is a multiple
of one unit: the least common multiple of the groups' block sizes (vllm/v1/core/kv_cache_coordinator.py
``HybridKVCacheCoordinator``: ``lcm_block_size`` from 0.12.0, ``scheduler_block_size`` from
vllm/v1/core/kv_cache_utils.py ``resolve_kv_cache_block_sizes`` from 0.20.0; before 0.12.0 the other group's block
had to be a multiple of the full-attention one and hits were multiples of it, the same number).  A hit also covers at
most ``num_tokens - 1`` tokens (vllm/v1/core/kv_cache_manager.py ``get_computed_blocks``: the last token is
recomputed for its logits), so the shortest prompt that can hit has ``unit + 1`` tokens and shares its first
``unit`` tokens with an earlier prompt.

Hybrid (Mamba / Gated DeltaNet) models are where the unit grows: vLLM raises the attention block until one
attention page holds a state (:func:`attention_block_size`, the rules of :data:`ATTENTION_BLOCK_RULES`), and
whether prefix caching runs at all, and in which ``mamba_cache_mode``, depends on the release
(:data:`HYBRID_PREFIX_RULES`).  Not modelled: 0.26.0+'s ``--prefix-match-unit`` (finer hashes; hits finer than a
block need Mamba blocks larger than it, 0.32.0+ ``partial_hash_hits_enabled``), 0.33.0's FlashInfer GDN checkpoint
alignment (backend-dependent), decode context parallelism and MLA hybrids' 64/128-token kernel alignment.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from kvtool.estimate.capacity import DEFAULT_BLOCK_SIZE, unify_pages
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.hybrid_block import (
    ATTENTION_BLOCK_RULES,
    HYBRID_PREFIX_RULES,
    KERNEL_BLOCK_ALIGNMENT,
    attention_block_size,
    hybrid_blocks,
    hybrid_prefix_rule,
    is_hybrid,
)
from kvtool.estimate.kinds import MAMBA
from kvtool.estimate.layout import KvLayout
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

__all__ = [
    "ATTENTION_BLOCK_RULES",
    "HYBRID_PREFIX_RULES",
    "CacheGroupBlock",
    "PrefixUnit",
    "attention_block_size",
    "prefix_unit",
    "prefix_unit_with_what_ifs",
]


class HashBlockRule(NamedTuple):
    """How many tokens one block hash covers (vLLM's ``hash_block_size``) when groups' blocks differ."""

    since: str
    gcd_of_groups: bool  # True: the gcd of the groups' blocks (lcm when a Mamba group is not 'align'); False: the
    # cache_config.block_size, the smallest block
    source: str


HASH_BLOCK_RULES: tuple[HashBlockRule, ...] = (
    HashBlockRule(
        "0.10.0",
        False,
        "vllm/v1/core/sched/scheduler.py Scheduler.__init__ (0.12.0-0.19.1): hash_block_size = self.block_size "
        "(cache_config.block_size); before 0.12.0 one block size for hashes and blocks",
    ),
    HashBlockRule(
        "0.20.0",
        True,
        "vllm/v1/core/kv_cache_utils.py resolve_kv_cache_block_sizes (0.20.0-0.33.0): hash_block_size = "
        "gcd(group block sizes) unless a Mamba group is not in 'align' mode (then the lcm)",
    ),
)


def hash_block_size(groups: tuple[CacheGroupBlock, ...], mode: str | None, vllm_version: str) -> int:
    """vLLM's ``hash_block_size`` for these groups (:data:`HASH_BLOCK_RULES`)."""
    sizes = [g.block_size_tokens for g in groups]
    if not pick(HASH_BLOCK_RULES, vllm_version).gcd_of_groups:
        return min(sizes)
    if len(sizes) == 1 or mode not in (None, "align"):
        return math.lcm(*sizes)
    return math.gcd(*sizes)


HIT_UNIT_SOURCE = (
    "vllm/v1/core/kv_cache_manager.py get_computed_blocks: max_cache_hit_length = request.num_tokens - 1; "
    "vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator.find_longest_cache_hit: hits are multiples of "
    "the groups' lcm block size (0.12.0-0.22.1 lcm_block_size; 0.23.0-0.33.0 scheduler_block_size from "
    "vllm/v1/core/kv_cache_utils.py resolve_kv_cache_block_sizes)"
)


@dataclasses.dataclass(frozen=True)
class CacheGroupBlock:
    """One kind of KV cache group and the block it hashes and caches in."""

    kind: str  # "full", "sliding", "chunked", "mla", "mamba"
    num_layers: int
    block_size_tokens: int  # Mamba groups: mamba_block_size (max_model_len without prefix caching)


@dataclasses.dataclass(frozen=True)
class PrefixUnit:
    """What a prefix-cache hit can be for one model on one vLLM release (see the module docstring)."""

    vllm_version: str
    prefix_caching: bool  # whether vLLM caches prefixes for this model with these settings
    why_off: str | None  # when it does not: why, in words
    mamba_cache_mode: str | None  # hybrid models: "all", "align" or "none"; None for attention-only models
    attention_block_size_tokens: int  # the block vLLM runs attention in (hybrids: raised to hold a state)
    groups: tuple[CacheGroupBlock, ...]
    hash_block_size_tokens: int | None  # tokens per block hash (vLLM's hash_block_size); None without caching
    cache_hit_unit_tokens: int | None  # every hit is a multiple of it (the lcm of the group blocks)
    min_shared_prefix_tokens: int | None  # the shortest shared prefix that can be a hit (= the unit)
    min_prompt_tokens: int | None  # the shortest prompt that can get a hit: unit + 1 (the last token is recomputed)
    hit_possible_within_max_model_len: bool  # False when no prompt of max_model_len tokens reaches unit + 1
    rule: str  # the rule in words, with the figures
    source: str  # the upstream files and functions
    # what another vLLM setting would make of the unit, in words (vLLM's option names, those of this release)
    what_if: tuple[str, ...] = ()


def prefix_unit(
    spec: ModelSpec,
    layout: KvLayout,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    prefix_caching: bool | None = None,
    max_model_len: int | None = None,
    vllm_version: str = NEWEST_RELEASE,
    mamba_cache_mode: str | None = None,
    mamba_block_size: int | None = None,
) -> PrefixUnit:
    """The prefix-cache unit of ``spec`` as vLLM ``vllm_version`` runs it with these settings (vLLM's option names:
    ``--block-size``, ``--enable-prefix-caching``, ``--mamba-cache-mode``, ``--mamba-block-size``; None: the
    release's default, for prefix caching: on, but opt-in for hybrid models in 0.11.1-0.27.1)."""
    if is_hybrid(layout):
        return _hybrid(
            spec, layout, block_size, prefix_caching, max_model_len, vllm_version, mamba_cache_mode, mamba_block_size
        )
    pages = unify_pages(layout, block_size)
    groups = tuple(
        CacheGroupBlock(g.kind, g.num_layers, p.block_size) for g, p in zip(layout.groups, pages, strict=True)
    )
    if prefix_caching is False:
        return _off(vllm_version, None, block_size, groups, "--no-enable-prefix-caching", HIT_UNIT_SOURCE)
    unit = math.lcm(*(g.block_size_tokens for g in groups))
    kinds = ", ".join(f"{g.kind} {g.block_size_tokens}" for g in groups)
    rule = (
        f"blocks of {kinds} tokens: hits are multiples of {unit} tokens (the lcm) and cover at most the prompt's "
        f"length - 1, so a prompt of at least {unit + 1} tokens sharing its first {unit} can hit"
    )
    hashed = hash_block_size(groups, None, vllm_version)
    return _on(vllm_version, None, block_size, groups, unit, hashed, max_model_len, rule, HIT_UNIT_SOURCE)


def prefix_unit_with_what_ifs(spec: ModelSpec, layout: KvLayout, **settings) -> PrefixUnit:
    """:func:`prefix_unit` with ``what_if``: for a hybrid, the unit with --enable-prefix-caching where the release
    keeps it opt-in and under the release's other --mamba-cache-mode values (and a halved --mamba-block-size in
    'all' mode); for every model, a --block-size of twice the attention block (or 16 for a larger one)."""
    base = prefix_unit(spec, layout, **settings)
    version = base.vllm_version
    tries: list[tuple[str, dict]] = []
    if base.mamba_cache_mode is not None:
        on = {"prefix_caching": True}
        if not base.prefix_caching and settings.get("prefix_caching") is None:
            tries.append(("--enable-prefix-caching", on))  # the release keeps it opt-in for hybrids
        for mode in hybrid_prefix_rule(version).modes:
            if mode != base.mamba_cache_mode and mode != "none":  # with prefix caching vLLM reads 'none' as unset
                tries.append((f"--enable-prefix-caching --mamba-cache-mode {mode}", {**on, "mamba_cache_mode": mode}))
        if base.mamba_cache_mode == "all" and spec.mamba_chunk_size:
            half = max(KERNEL_BLOCK_ALIGNMENT, spec.mamba_chunk_size // 2)
            tries.append((f"--mamba-block-size {half}", {"mamba_block_size": half}))
    asked = settings.get("block_size", DEFAULT_BLOCK_SIZE)
    other = DEFAULT_BLOCK_SIZE if asked > DEFAULT_BLOCK_SIZE else 2 * base.attention_block_size_tokens
    tries.append((f"--block-size {other}", {"block_size": other}))
    said = []
    for label, change in tries:
        tried = prefix_unit(spec, layout, **{**settings, **change})
        if tried.cache_hit_unit_tokens is None:
            said.append(f"{label}: no prefix caching ({tried.why_off})")
        elif tried.cache_hit_unit_tokens == base.cache_hit_unit_tokens:
            said.append(f"{label}: the same {tried.cache_hit_unit_tokens:,}-token unit")
        else:
            said.append(
                f"{label}: hits in units of {tried.cache_hit_unit_tokens:,} tokens (prompts of "
                f"{tried.min_prompt_tokens:,}+ tokens)"
            )
    return dataclasses.replace(base, what_if=tuple(said))


def _hybrid(spec, layout, block_size, prefix_caching, max_model_len, version, mode, mamba_block_size) -> PrefixUnit:
    hb = hybrid_blocks(
        spec,
        layout,
        block_size,
        prefix_caching=prefix_caching,
        vllm_version=version,
        mamba_cache_mode=mode,
        mamba_block_size=mamba_block_size,
    )
    assert hb is not None
    attn, mamba, mode = hb.attention_block_size, hb.mamba_block_size, hb.mamba_cache_mode
    source = f"{hb.source}; {HIT_UNIT_SOURCE}"
    pages = unify_pages(layout, attn)
    groups = tuple(
        CacheGroupBlock(g.kind, g.num_layers, (mamba or (max_model_len or 0)) if g.kind == MAMBA else p.block_size)
        for g, p in zip(layout.groups, pages, strict=True)
    )
    if hb.why_off is not None:
        return _off(version, mode, attn, groups, hb.why_off, source)
    unit = math.lcm(*(g.block_size_tokens for g in groups))
    step = (
        max(KERNEL_BLOCK_ALIGNMENT, block_size)
        if pick(ATTENTION_BLOCK_RULES, version).step_from_block_size
        else KERNEL_BLOCK_ALIGNMENT
    )
    how = f"a multiple of lcm({hb.chunk_tokens}, {step}) tokens" if mode == "all" else f"a multiple of {step} tokens"
    text = (
        f"mamba_cache_mode '{mode}': attention blocks of {attn} tokens ({how} whose page of {hb.token_bytes:,} B per "
        f"token holds the {hb.state_bytes:,} B state), Mamba blocks of {mamba}; hits are multiples of {unit} tokens "
        f"and cover at most the prompt's length - 1, so a prompt needs at least {unit + 1} tokens sharing its first "
        f"{unit}"
    )
    if mode == "align":
        text += " (an earlier prompt leaves its state only at its last block boundary before its end)"
    return _on(version, mode, attn, groups, unit, hash_block_size(groups, mode, version), max_model_len, text, source)


def _on(version, mode, attn, groups, unit, hash_block, max_model_len, rule, source) -> PrefixUnit:
    possible = max_model_len is None or max_model_len >= unit + 1
    if not possible:
        rule += f"; max_model_len {max_model_len:,} < {unit + 1:,}: no prompt can ever hit"
    return PrefixUnit(
        vllm_version=version,
        prefix_caching=True,
        why_off=None,
        mamba_cache_mode=mode,
        attention_block_size_tokens=attn,
        groups=groups,
        hash_block_size_tokens=hash_block,
        cache_hit_unit_tokens=unit,
        min_shared_prefix_tokens=unit,
        min_prompt_tokens=unit + 1,
        hit_possible_within_max_model_len=possible,
        rule=rule,
        source=source,
    )


def _off(version, mode, attn, groups, why, source) -> PrefixUnit:
    return PrefixUnit(
        vllm_version=version,
        prefix_caching=False,
        why_off=why,
        mamba_cache_mode=mode,
        attention_block_size_tokens=attn,
        groups=groups,
        hash_block_size_tokens=None,
        cache_hit_unit_tokens=None,
        min_shared_prefix_tokens=None,
        min_prompt_tokens=None,
        hit_possible_within_max_model_len=False,
        rule=f"no prefix caching: {why}",
        source=source,
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
