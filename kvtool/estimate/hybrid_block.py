"""The one place kvtool decides a hybrid (Mamba / Gated DeltaNet + attention) model's blocks, per vLLM release.

Whether prefix caching runs for the model (vLLM's default for hybrids and what it does with
``--enable-prefix-caching``), in which ``mamba_cache_mode`` (``--mamba-cache-mode``, 0.15.0+), and the attention
block vLLM raises ``--block-size`` to so that one attention page holds a state (:func:`attention_block_size`): "all"
rounds it up to a multiple of lcm(Mamba chunk or ``--mamba-block-size``, kernel step), "align" and "none" to the
kernel step.  Both the capacity plan (:mod:`kvtool.estimate.capacity`) and the prefix-cache unit
(:mod:`kvtool.estimate.prefix_unit`) take their blocks from :func:`hybrid_blocks`, so the two always agree.

Read from vLLM's sources, 0.10.0-0.33.0 (the rows below name the file and function of each rule).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from kvtool.core.errors import UsageError
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.kinds import MAMBA
from kvtool.estimate.layout import KvLayout
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick, version_key

# vLLM's SupportsMambaPrefixCaching models among those kvtool reads (vllm/model_executor/models/{nemotron_h,
# granitemoehybrid,falcon_h1,jamba}.py, 0.11.1-0.33.0); Qwen3-Next / Qwen3.5 (Gated DeltaNet) lack it
MAMBA_PREFIX_CACHING_MODEL_TYPES = frozenset({"nemotron_h", "granitemoehybrid", "falcon_h1", "jamba"})
KERNEL_BLOCK_ALIGNMENT = 16  # FlashAttention's smallest kernel block (MultipleOf(16)); the hybrid block's step
MAMBA_BLOCK_SIZE_SINCE = "0.11.1"  # vllm/engine/arg_utils.py --mamba-block-size (CacheConfig.mamba_block_size)


class HybridPrefixRule(NamedTuple):
    """Whether a hybrid model caches prefixes in a release, and in which mamba_cache_mode."""

    since: str
    # "refused": vLLM will not start with prefix caching on; "off": it turns prefix caching off; "supported": on for
    # SupportsMambaPrefixCaching models only; "modes": --mamba-cache-mode picks (modes below)
    policy: str
    on_by_default: bool  # vLLM's enable_prefix_caching for a hybrid model when no flag says
    modes: tuple[str, ...]  # the --mamba-cache-mode values the release takes (() before 0.15.0)
    default_supported: str  # the mode with prefix caching for SupportsMambaPrefixCaching models
    default_other: str  # the mode for the others ("none": prefix caching turned off)
    source: str


_OPT_IN_0_11 = (
    "vllm/engine/arg_utils.py EngineArgs._set_default_args (0.11.1-0.11.2): default_prefix_caching = not "
    "model_config.is_hybrid"
)
_OPT_IN_0_12 = (
    "vllm/engine/arg_utils.py (0.12.0-0.25.1): default_prefix_caching = model_config.is_prefix_caching_supported, "
    "which vllm/config/model.py ModelConfig.is_prefix_caching_supported makes False for attn_type 'hybrid' "
    "('Hybrid models do not support prefix caching since the feature is still experimental')"
)
_OPT_IN_0_26 = (
    "vllm/engine/arg_utils.py (0.26.0-0.27.1): default_prefix_caching = is_prefix_caching_supported and not "
    "model_config.is_hybrid ('Hybrid models support prefix caching but keep it opt-in for now')"
)
_ON_0_28 = (
    "vllm/engine/arg_utils.py (0.28.0-0.33.0): default_prefix_caching = model_config.is_prefix_caching_supported, "
    "True for hybrids (vllm/config/model.py: 'Generative hybrid models support prefix caching')"
)
_MODES = (
    "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config (0.15.0-0.31.0): with prefix "
    "caching, mamba_cache_mode 'none' (the default value) becomes 'all' if model_config.supports_mamba_prefix_caching "
    "else 'align', and 'all' falls back to 'align' for the others; without it the mode is 'none'"
)
_SUPPORTED = (
    "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config (0.11.1-0.14.1): prefix caching "
    "kept if model_config.supports_mamba_prefix_caching (sized as 0.15.0's 'all'), else enable_prefix_caching = False"
)

HYBRID_PREFIX_RULES: tuple[HybridPrefixRule, ...] = (
    HybridPrefixRule(
        "0.10.0",
        "refused",
        True,
        (),
        "none",
        "none",
        "vllm/v1/worker/gpu_model_runner.py get_kv_cache_spec (0.10.0-0.10.1.1): raise NotImplementedError("
        "'Prefix caching is not supported for Mamba yet.')",
    ),
    HybridPrefixRule(
        "0.10.2",
        "off",
        True,
        (),
        "none",
        "none",
        "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config (0.10.2-0.11.0): "
        "cache_config.enable_prefix_caching = False ('Hybrid or mamba-based model detected: disabling prefix caching')",
    ),
    HybridPrefixRule("0.11.1", "supported", False, (), "all", "none", f"{_OPT_IN_0_11}; {_SUPPORTED}"),
    HybridPrefixRule("0.12.0", "supported", False, (), "all", "none", f"{_OPT_IN_0_12}; {_SUPPORTED}"),
    HybridPrefixRule("0.15.0", "modes", False, ("all", "align", "none"), "all", "align", f"{_OPT_IN_0_12}; {_MODES}"),
    HybridPrefixRule("0.26.0", "modes", False, ("all", "align", "none"), "all", "align", f"{_OPT_IN_0_26}; {_MODES}"),
    HybridPrefixRule("0.28.0", "modes", True, ("all", "align", "none"), "all", "align", f"{_ON_0_28}; {_MODES}"),
    HybridPrefixRule(
        "0.32.0",
        "modes",
        True,
        ("align", "none"),
        "align",
        "align",
        f"{_ON_0_28}; vllm/config/cache.py MambaCacheMode = Literal['align', 'none'] (0.32.0-0.33.0); "
        "vllm/model_executor/models/config.py MambaModelConfig.verify_and_update_config: 'none' -> 'align' with "
        "prefix caching",
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
        "(0.10.0-0.19.1): kernel_block_alignment_size = 16; 'all': attn_block_size = chunk x cdiv(cdiv(mamba_page, "
        "attn_page_1_token), chunk), chunk = lcm(user --mamba-block-size or get_mamba_chunk_size(), 16); else "
        "16 x cdiv(mamba_page, 16 x attn_page_1_token); block_size raised to it when smaller",
    ),
    AttentionBlockRule(
        "0.20.0",
        True,
        "vllm/platforms/interface.py Platform._align_hybrid_block_size (0.20.0-0.33.0): "
        "kernel_block_alignment_size = max(min(backend kernel block sizes), cache_config.block_size); the same "
        "'all' and other formulas with that step",
    ),
)


@dataclasses.dataclass(frozen=True)
class HybridBlocks:
    """The blocks vLLM runs a hybrid model in, for one release and its settings."""

    attention_block_size: int  # tokens; --block-size raised so that one attention page holds a state
    mamba_block_size: int  # tokens per Mamba block: the attention block ('all', 'align'); 0 = max_model_len ('none')
    mamba_cache_mode: str  # "all", "align" or "none"
    prefix_caching: bool  # whether vLLM caches prefixes for the model with these settings
    why_off: str | None  # when it does not: why, in words
    chunk_tokens: int | None  # 'all': the chunk the block is aligned to (--mamba-block-size, else the model's)
    state_bytes: int  # the largest state layer's state, one GPU
    token_bytes: int  # one attention layer's bytes per token, one GPU
    source: str


def hybrid_prefix_rule(vllm_version: str) -> HybridPrefixRule:
    return pick(HYBRID_PREFIX_RULES, vllm_version)


def is_hybrid(layout: KvLayout) -> bool:
    kinds = {g.kind == MAMBA for g in layout.groups}
    return kinds == {True, False}


def check_mamba_options(
    vllm_version: str, mamba_cache_mode: str | None, mamba_block_size: int | None, prefix_caching: bool | None
) -> None:
    """Refuse --mamba-cache-mode / --mamba-block-size for a release that has no such option or value, as vLLM's
    argument parser would (one line naming the release)."""
    rule = hybrid_prefix_rule(vllm_version)
    if mamba_cache_mode is not None:
        if not rule.modes:
            raise UsageError(
                f"vLLM {vllm_version} has no --mamba-cache-mode (it comes with 0.15.0)", where="--mamba-cache-mode"
            )
        if mamba_cache_mode not in rule.modes:
            raise UsageError(
                f"--mamba-cache-mode {mamba_cache_mode}: vLLM {vllm_version} takes {', '.join(rule.modes)}",
                where="--mamba-cache-mode",
            )
    if mamba_block_size is not None:
        if version_key(vllm_version) < version_key(MAMBA_BLOCK_SIZE_SINCE):
            raise UsageError(
                f"vLLM {vllm_version} has no --mamba-block-size (it comes with {MAMBA_BLOCK_SIZE_SINCE})",
                where="--mamba-block-size",
            )
        if mamba_block_size <= 0:
            raise UsageError(
                f"--mamba-block-size must be greater than zero, not {mamba_block_size}", where="--mamba-block-size"
            )
        if prefix_caching is False:
            # vllm/config/vllm.py VllmConfig.validate_mamba_block_size (0.11.1-0.33.0)
            raise UsageError(
                "--mamba-block-size can only be set with --enable-prefix-caching (vLLM's ValueError)",
                where="--mamba-block-size",
            )


def prefix_caching_on(layout: KvLayout, prefix_caching: bool | None, vllm_version: str = NEWEST_RELEASE) -> bool:
    """Whether prefix caching is asked for: the flag, else vLLM's default (on, but opt-in for hybrids 0.11.1-0.27.1)."""
    if prefix_caching is not None:
        return prefix_caching
    return hybrid_prefix_rule(vllm_version).on_by_default if is_hybrid(layout) else True


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


def hybrid_blocks(
    spec: ModelSpec,
    layout: KvLayout,
    block_size: int,
    *,
    prefix_caching: bool | None = None,
    vllm_version: str = NEWEST_RELEASE,
    mamba_cache_mode: str | None = None,
    mamba_block_size: int | None = None,
) -> HybridBlocks | None:
    """The blocks of a hybrid model as vLLM ``vllm_version`` runs it (None for a model without state layers or
    without attention layers); ``prefix_caching`` None: vLLM's default for hybrids in that release."""
    if not is_hybrid(layout):
        return None
    rule = hybrid_prefix_rule(vllm_version)
    supported = spec.model_type in MAMBA_PREFIX_CACHING_MODEL_TYPES
    state = max(g.state_bytes_per_request for g in layout.groups if g.kind == MAMBA)
    token = math.ceil(next(g for g in layout.groups if g.kind != MAMBA).bytes_per_token_per_layer)
    source = f"{rule.source}; {pick(ATTENTION_BLOCK_RULES, vllm_version).source}"
    asked = prefix_caching_on(layout, prefix_caching, vllm_version)
    why = None
    mode = mamba_cache_mode
    if not asked:
        mode = "none"
        why = (
            "--no-enable-prefix-caching"
            if prefix_caching is False
            else f"vLLM {vllm_version} keeps prefix caching off for hybrid models unless --enable-prefix-caching"
        )
    elif rule.policy == "refused":
        why, mode = (
            f"vLLM {vllm_version} refuses to start a Mamba model with prefix caching (NotImplementedError); "
            "it runs only with --no-enable-prefix-caching",
            "none",
        )
    elif rule.policy == "off":
        why, mode = f"vLLM {vllm_version} turns prefix caching off for hybrid and Mamba models", "none"
    elif rule.policy == "supported" and not supported:
        why, mode = (
            f"vLLM {vllm_version} turns prefix caching off for {spec.model_type} (no SupportsMambaPrefixCaching; "
            "Mamba prefix caching for it comes with 'align' mode in 0.15.0)",
            "none",
        )
    elif rule.policy == "supported" or mode in (None, "none"):
        # with prefix caching, vLLM takes 'none' (CacheConfig's default value) for "not given"
        mode = rule.default_supported if supported else rule.default_other
    elif mode == "all" and not supported:
        mode = "align"  # 0.15.0-0.31.0: "falling back to 'align' mode"
    chunk = (mamba_block_size or spec.mamba_chunk_size) if mode == "all" else None
    if mode == "all" and chunk is None:
        mode = "align"  # kvtool cannot size 'all' without the chunk; said in the source
        source += "; the config gives no mamba_chunk_size / chunk_size, so kvtool sizes 'align'"
    attn, mamba = attention_block_size(
        state, token, block_size, mode=mode, chunk_tokens=chunk, vllm_version=vllm_version
    )
    return HybridBlocks(attn, mamba, mode, why is None, why, chunk, state, token, source)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
