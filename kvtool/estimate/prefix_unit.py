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
from kvtool.estimate.kinds import MAMBA
from kvtool.estimate.layout import KvLayout
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

# vLLM's SupportsMambaPrefixCaching models among those kvtool reads (vllm/model_executor/models/{nemotron_h,
# granitemoehybrid,falcon_h1,jamba}.py, 0.11.1-0.33.0); Qwen3-Next / Qwen3.5 (Gated DeltaNet) lack it
MAMBA_PREFIX_CACHING_MODEL_TYPES = frozenset({"nemotron_h", "granitemoehybrid", "falcon_h1", "jamba"})
KERNEL_BLOCK_ALIGNMENT = 16  # FlashAttention's smallest kernel block (MultipleOf(16)); the hybrid block's step


class HybridPrefixRule(NamedTuple):
    """Whether a hybrid model caches prefixes in a release, and in which mamba_cache_mode by default."""

    since: str
    # "refused": vLLM will not start with prefix caching on; "off": it turns prefix caching off; "supported": on for
    # SupportsMambaPrefixCaching models only; "modes": --mamba-cache-mode picks (modes below)
    policy: str
    modes: tuple[str, ...]  # the --mamba-cache-mode values the release takes (() before 0.15.0)
    default_supported: str  # the mode with prefix caching for SupportsMambaPrefixCaching models
    default_other: str  # the mode for the others ("none": prefix caching turned off)
    source: str


HYBRID_PREFIX_RULES: tuple[HybridPrefixRule, ...] = (
    HybridPrefixRule(
        "0.10.0",
        "refused",
        (),
        "none",
        "none",
        "vllm/v1/worker/gpu_model_runner.py get_kv_cache_spec (0.10.0-0.10.1.1): raise NotImplementedError("
        "'Prefix caching is not supported for Mamba yet.')",
    ),
    HybridPrefixRule(
        "0.10.2",
        "off",
        (),
        "none",
        "none",
        "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config (0.10.2-0.11.0): "
        "cache_config.enable_prefix_caching = False ('Hybrid or mamba-based model detected: disabling prefix caching')",
    ),
    HybridPrefixRule(
        "0.11.1",
        "supported",
        (),
        "all",
        "none",
        "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config (0.11.1-0.14.1): kept if "
        "model_config.supports_mamba_prefix_caching, else enable_prefix_caching = False; "
        "HybridAttentionMambaModelConfig.verify_and_update_config: attn_block_size = chunk_size x "
        "cdiv(cdiv(mamba_page_size, attn_page_size_1_token), chunk_size), chunk_size = lcm(mamba_block_size or "
        "get_mamba_chunk_size(), 16); mamba_block_size = attn_block_size (the mode 0.15.0 names 'all')",
    ),
    HybridPrefixRule(
        "0.15.0",
        "modes",
        ("all", "align", "none"),
        "all",
        "align",
        "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config (0.15.0-0.31.0): "
        "mamba_cache_mode = 'all' if model_config.supports_mamba_prefix_caching else 'align'; 'align': "
        "mamba_block_size = cache_config.block_size (HybridAttentionMambaModelConfig, from 0.20.0 "
        "vllm/platforms/interface.py Platform._align_hybrid_block_size)",
    ),
    HybridPrefixRule(
        "0.32.0",
        "modes",
        ("align", "none"),
        "align",
        "align",
        "vllm/config/cache.py MambaCacheMode = Literal['align', 'none'] (0.32.0-0.33.0); "
        "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config: 'none' -> 'align' with "
        "prefix caching; vllm/platforms/interface.py Platform._align_hybrid_block_size: mamba_block_size = block_size",
    ),
)


class AttentionBlockRule(NamedTuple):
    """The step the hybrid attention block is a multiple of (``kernel_block_alignment_size``)."""

    since: str
    step_from_block_size: bool  # True: max(16, --block-size); False: 16 whatever --block-size says
    source: str


ATTENTION_BLOCK_RULES: tuple[AttentionBlockRule, ...] = (
    AttentionBlockRule(
        "0.10.0",
        False,
        "vllm/model_executor/models/config.py HybridAttentionMambaModelConfig.verify_and_update_config "
        "(0.10.0-0.19.1): kernel_block_alignment_size = 16; attn_block_size = 16 x cdiv(mamba_page_size, "
        "16 x attn_page_size_1_token); block_size raised to it when smaller",
    ),
    AttentionBlockRule(
        "0.20.0",
        True,
        "vllm/platforms/interface.py Platform._align_hybrid_block_size (0.20.0-0.33.0): "
        "kernel_block_alignment_size = max(min(backend kernel block sizes), cache_config.block_size); "
        "attn_block_size = alignment x cdiv(mamba_page_size, alignment x attn_page_size_1_token)",
    ),
)


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


def hybrid_prefix_rule(vllm_version: str) -> HybridPrefixRule:
    return pick(HYBRID_PREFIX_RULES, vllm_version)


def attention_block_size(
    state_bytes: int,
    token_bytes: int,
    block_size: int,
    *,
    mode: str,
    chunk_tokens: int | None,
    vllm_version: str = NEWEST_RELEASE,
) -> tuple[int, int]:
    """(attention block, Mamba block) vLLM picks for a hybrid model whose state takes ``state_bytes`` and whose
    attention layer takes ``token_bytes`` per token (one GPU), for ``--block-size`` ``block_size`` and a
    mamba_cache_mode; ``chunk_tokens``: --mamba-block-size, else the model's Mamba chunk ("all" mode only).

    The Mamba block of "none" is returned as 0 (vLLM sets it to max_model_len, which the caller knows)."""
    rule = pick(ATTENTION_BLOCK_RULES, vllm_version)
    step = max(KERNEL_BLOCK_ALIGNMENT, block_size) if rule.step_from_block_size else KERNEL_BLOCK_ALIGNMENT
    if mode == "all":
        if chunk_tokens is None:
            raise ValueError("mamba_cache_mode 'all' needs the model's Mamba chunk size")
        chunk = math.lcm(chunk_tokens, step)
        attn = chunk * _cdiv(_cdiv(state_bytes, token_bytes), chunk)
        return max(block_size, attn), attn
    attn = step * _cdiv(state_bytes, step * token_bytes)
    block = max(block_size, attn)
    return block, (block if mode == "align" else 0)


def prefix_unit(
    spec: ModelSpec,
    layout: KvLayout,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    prefix_caching: bool = True,
    max_model_len: int | None = None,
    vllm_version: str = NEWEST_RELEASE,
    mamba_cache_mode: str | None = None,
    mamba_block_size: int | None = None,
) -> PrefixUnit:
    """The prefix-cache unit of ``spec`` as vLLM ``vllm_version`` runs it with these settings (vLLM's option names:
    ``--block-size``, ``--enable-prefix-caching``, ``--mamba-cache-mode``, ``--mamba-block-size``; None: the
    release's default)."""
    states = [g for g in layout.groups if g.kind == MAMBA]
    attention = [g for g in layout.groups if g.kind != MAMBA]
    if states and attention:
        return _hybrid(
            spec, layout, block_size, prefix_caching, max_model_len, vllm_version, mamba_cache_mode, mamba_block_size
        )
    pages = unify_pages(layout, block_size)
    groups = tuple(
        CacheGroupBlock(g.kind, g.num_layers, p.block_size) for g, p in zip(layout.groups, pages, strict=True)
    )
    if not prefix_caching:
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
    """:func:`prefix_unit` with ``what_if``: the unit under the other --mamba-cache-mode values of the release, a
    --block-size of twice the attention block (or 16 for a larger one) and --no-enable-prefix-caching."""
    base = prefix_unit(spec, layout, **settings)
    version = base.vllm_version
    tries: list[tuple[str, dict]] = []
    hybrid = base.mamba_cache_mode is not None
    if hybrid:
        for mode in hybrid_prefix_rule(version).modes:
            if mode != base.mamba_cache_mode:
                tries.append((f"--mamba-cache-mode {mode}", {"mamba_cache_mode": mode}))
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
    rule = hybrid_prefix_rule(version)
    supported = spec.model_type in MAMBA_PREFIX_CACHING_MODEL_TYPES
    state = max(g.state_bytes_per_request for g in layout.groups if g.kind == MAMBA)
    token = math.ceil(next(g for g in layout.groups if g.kind != MAMBA).bytes_per_token_per_layer)
    source = f"{rule.source}; {pick(ATTENTION_BLOCK_RULES, version).source}; {HIT_UNIT_SOURCE}"
    why = None
    if not prefix_caching:
        why, mode = "--no-enable-prefix-caching", "none"
    elif rule.policy == "refused":
        why, mode = (
            f"vLLM {version} refuses to start a Mamba model with prefix caching (NotImplementedError); "
            "it runs only with --no-enable-prefix-caching",
            "none",
        )
    elif rule.policy == "off":
        why, mode = f"vLLM {version} turns prefix caching off for hybrid and Mamba models", "none"
    elif rule.policy == "supported" and not supported:
        why, mode = (
            f"vLLM {version} turns prefix caching off for {spec.model_type} (no SupportsMambaPrefixCaching; "
            "Mamba prefix caching for it comes with 'align' mode in 0.15.0)",
            "none",
        )
    else:
        if mode is None or rule.policy == "supported":
            mode = rule.default_supported if supported else rule.default_other
        elif mode == "all" and not supported:
            mode = "align"  # 0.15.0-0.31.0: "falling back to 'align' mode"
        if mode == "none":
            why = "--mamba-cache-mode none turns Mamba prefix caching off"
    chunk = mamba_block_size or spec.mamba_chunk_size
    if mode == "all" and chunk is None:
        mode = "align"  # kvtool cannot size 'all' without the chunk; said in the rule
        source += "; the config gives no mamba_chunk_size / chunk_size, so kvtool sizes 'align'"
    attn, mamba = attention_block_size(state, token, block_size, mode=mode, chunk_tokens=chunk, vllm_version=version)
    pages = unify_pages(layout, attn)
    groups = tuple(
        CacheGroupBlock(g.kind, g.num_layers, (mamba or (max_model_len or 0)) if g.kind == MAMBA else p.block_size)
        for g, p in zip(layout.groups, pages, strict=True)
    )
    if why is not None:
        return _off(version, mode, attn, groups, why, source)
    unit = math.lcm(*(g.block_size_tokens for g in groups))
    how = (
        f"a multiple of lcm({chunk}, {max(KERNEL_BLOCK_ALIGNMENT, block_size)}) tokens"
        if mode == "all"
        else f"a multiple of {KERNEL_BLOCK_ALIGNMENT if not pick(ATTENTION_BLOCK_RULES, version).step_from_block_size else max(KERNEL_BLOCK_ALIGNMENT, block_size)} tokens"
    )
    text = (
        f"mamba_cache_mode '{mode}': attention blocks of {attn} tokens ({how} whose page of {token:,} B per token "
        f"holds the {state:,} B state), Mamba blocks of {mamba}; hits are multiples of {unit} tokens and cover at "
        f"most the prompt's length - 1, so a prompt needs at least {unit + 1} tokens sharing its first {unit}"
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
