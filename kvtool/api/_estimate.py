"""``kvtool.api.estimate``: the KV-cache size of a model and what fits on a GPU, as ``kvtool estimate`` computes it."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtool.estimate.sglang.versions import NEWEST_RELEASE as SGLANG_NEWEST_RELEASE
from kvtool.estimate.vllm_versions import NEWEST_RELEASE

if TYPE_CHECKING:  # pragma: no cover
    from kvtool.estimate.estimator import EstimateResult
    from kvtool.estimate.sglang.compare import EngineComparison
    from kvtool.estimate.sglang.pool import SglangEstimate


def _ints(value: int | Sequence[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _size(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def estimate(
    model: str | None = None,
    *,
    config: str | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    heads: int | None = None,
    hidden: int | None = None,
    dtype: str | None = None,
    seq_len: int | Sequence[int] | None = None,
    batch: int | Sequence[int] | None = None,
    kv_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    kv_memory: str | int | None = None,
    gpu_memory_utilization: float | None = None,
    reserve: str | int | None = None,
    activation_memory: str | int | None = None,
    non_torch_memory: str | int | None = None,
    cudagraph_memory: str | int | None = None,
    max_num_seqs: int | None = None,
    enforce_eager: bool = False,
    prefix_caching: bool | None = None,
    mamba_cache_mode: str | None = None,
    mamba_block_size: int | None = None,
    async_scheduling: bool | None = None,
    quantization: str | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    compare: bool = False,
    profiles: Sequence[str] = (),
    vllm_version: str = NEWEST_RELEASE,
    model_runner: str = "auto",
    kv_offloading_size: float | None = None,
    kv_offloading_backend: str = "native",
    lmcache_chunk_size: int | None = None,
    limit_mm_per_prompt: str | None = None,
    mm_encoder_tp_mode: str | None = None,
    encoder_memory: str | int | None = None,
    speculative_config: str | None = None,
    draft_memory: str | int | None = None,
    kv_transfer_config: str | None = None,
    prompt_len: int | None = None,
    transfers_in_flight: int | None = None,
    ttft_budget_ms: float | None = None,
    prefill_ms: float | None = None,
    enable_lora: bool = False,
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
    lora_memory: str | int | None = None,
    engine: str = "vllm",
    sglang_version: str = SGLANG_NEWEST_RELEASE,
    mem_fraction_static: float | None = None,
    page_size: int = 1,
    max_running_requests: int | None = None,
    max_total_tokens: int | None = None,
    chunked_prefill_size: int | None = None,
) -> EstimateResult | SglangEstimate | EngineComparison:
    """Exact KV-cache bytes for a model, and how many requests fit on a GPU the way vLLM counts it.

    The options are ``kvtool estimate``'s (docs/estimate.md), with the same defaults: ``model`` is a profile name
    (``kvtool models``), ``config`` a Hugging Face ``config.json`` or model folder, or give ``layers``,
    ``kv_heads`` and ``head_dim`` by hand.  ``seq_len`` and ``batch`` take one value or a sequence (a sweep);
    sizes (``gpu_memory``, ``kv_memory``, ``reserve`` and the reserve terms ``activation_memory``,
    ``non_torch_memory``, ``cudagraph_memory``) take ``"80GiB"``, ``"10GB"`` or a number of bytes.
    ``vllm_version`` picks the release whose rules apply (0.10.0-0.33.0, default the newest), ``model_runner``
    the model runner (``auto``: that release's default for the model) and ``async_scheduling`` None its default;
    ``kv_offloading_size`` (GiB), ``kv_offloading_backend`` and ``lmcache_chunk_size`` (LMCache's chunk_size) size a
    CPU tier as vLLM's ``--kv-offloading-size``;
    ``limit_mm_per_prompt``, ``mm_encoder_tp_mode``, ``speculative_config`` and ``kv_transfer_config`` take vLLM's
    JSON and values; ``prompt_len``, ``transfers_in_flight``, ``ttft_budget_ms`` and ``prefill_ms`` size a
    prefill-to-decode handoff; ``prefix_caching`` None is vLLM's default (opt-in for hybrid models 0.11.1-0.27.1),
    ``mamba_cache_mode`` and ``mamba_block_size`` vLLM's options of those names; ``enable_lora``, ``max_loras``,
    ``max_lora_rank`` and ``lora_memory`` add vLLM's LoRA buffers; ``encoder_memory`` (the vision encoder's weights
    per GPU) and ``draft_memory`` (the drafter's, with ``speculative_config``) replace kvtool's model of them.
    ``engine`` ``"sglang"`` sizes SGLang's pool instead (kvtool.estimate.sglang: ``sglang_version``,
    ``mem_fraction_static``, ``page_size``, ``max_running_requests``, ``max_total_tokens``, ``chunked_prefill_size``
    are SGLang's options; ``seq_len`` is its ``--context-length``) and returns a
    :class:`~kvtool.estimate.sglang.pool.SglangEstimate`; ``"vllm,sglang"`` both, an
    :class:`~kvtool.estimate.sglang.compare.EngineComparison`.

    Returns the :class:`~kvtool.estimate.estimator.EstimateResult`; its ``to_dict()`` is ``kvtool estimate
    --json``'s object.  Raises :class:`~kvtool.core.errors.KvtoolError` (``UsageError``, ``InputFileError``) for
    bad input, with the message the CLI prints.

    Example (the seed article's 7B model, MHA, FP16, 2,048 tokens: 2 x 32 x 32 x 2048 x 128 x 2 bytes):

    >>> from kvtool.api import estimate
    >>> result = estimate("llama-2-7b", seq_len=2048, kv_dtype="fp16")
    >>> result.kv_bytes
    1073741824
    >>> result.to_dict()["kv_gib"]
    1.0
    """
    from kvtool.estimate.estimator import estimate as run_estimate
    from kvtool.estimate.estimator import request_from

    given = dict(locals())  # every argument by its option name
    defaults = {name: p.default for name, p in inspect.signature(estimate).parameters.items()}
    changed = [name for name, value in given.items() if name in defaults and value != defaults[name]]
    given.update(seq_len=_ints(seq_len), batch=_ints(batch), profiles=tuple(profiles))
    for name in (
        "gpu_memory",
        "kv_memory",
        "reserve",
        "activation_memory",
        "non_torch_memory",
        "cudagraph_memory",
        "lora_memory",
        "encoder_memory",
        "draft_memory",
    ):
        given[name] = _size(given[name])
    from kvtool.estimate.sglang.engines import estimate_engines, parse_engines, refuse_other_engines_options

    engines = parse_engines(engine)
    refuse_other_engines_options(engines, changed)
    if "sglang" in engines:
        return estimate_engines(engines, given, given if "vllm" in engines else None)
    request = request_from(given)
    return run_estimate(request)
