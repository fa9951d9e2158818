"""`kvtool plan`: parse the workload and the candidates, call kvtool.plan.search, render."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kvtool.cli.estimate import (
    BlockSizeOpt,
    ConfigOpt,
    DraftMemoryOpt,
    EnableLoraOpt,
    EncoderMemoryOpt,
    LimitMmOpt,
    LoraMemoryOpt,
    MaxLoraRankOpt,
    MaxLorasOpt,
    MaxNumSeqsOpt,
    MmEncoderTpModeOpt,
    ModelOpt,
    SpeculativeConfigOpt,
    VllmVersionOpt,
)
from kvtool.cli.options import JsonOpt, ProfilesOpt, path_option
from kvtool.cli.output import handle_errors
from kvtool.estimate.vllm_versions import NEWEST_RELEASE

if TYPE_CHECKING:
    from kvtool.plan.result import PlanResult

ConcurrencyOpt = Annotated[
    Optional[int], typer.Option("--concurrency", "-n", help="Requests that must be held at once.", show_default=False)
]
PlanSeqLenOpt = Annotated[
    Optional[int], typer.Option("--seq-len", help="Tokens per request, prompt + output (vLLM's max_model_len).")
]
InputLenOpt = Annotated[
    Optional[int], typer.Option("--input-len", help="Prompt tokens per request (with --output-len).")
]
OutputLenOpt = Annotated[Optional[int], typer.Option("--output-len", help="Output tokens per request.")]
PercentileOpt = Annotated[
    Optional[float], typer.Option("--percentile", help="With --trace: the percentile of request lengths [default: 99].")
]
PlanGpuOpt = Annotated[
    Optional[str], typer.Option("--gpu", help="GPU profiles to try, comma-separated [default: every profile].")
]
PlanTpOpt = Annotated[
    str,
    typer.Option(
        "--tp",
        help="Tensor-parallel sizes: a comma list, or a range such as 1-8 (its powers of two). Sizes vLLM refuses "
        "for the model (not dividing its heads) are reported, not tried.",
    ),
]
PlanPpOpt = Annotated[str, typer.Option("--pp", help="Pipeline-parallel sizes: a comma list or a range such as 1-2.")]
PlanKvDtypeOpt = Annotated[
    str, typer.Option("--kv-dtype", help="KV-cache dtypes to try, comma-separated (vLLM's --kv-cache-dtype names).")
]
PlanUtilOpt = Annotated[
    str, typer.Option("--gpu-memory-utilization", help="gpu_memory_utilization values to try, comma-separated.")
]
PlanQuantOpt = Annotated[
    Optional[str],
    typer.Option(
        "--quantization",
        help="vLLM --quantization methods to try, comma-separated; 'none' is the checkpoint as it is [default: none].",
    ),
]
MaxGpusOpt = Annotated[Optional[int], typer.Option("--max-gpus", help="Try only configurations of at most N GPUs.")]
TopOpt = Annotated[
    Optional[int],
    typer.Option(
        "--top",
        help="Show only the N cheapest fitting configurations (with --qps: meeting the target; the scan stops there).",
    ),
]
_SERVE = "Requests per second with a TTFT/TPOT target (the serving simulation)"
QpsOpt = Annotated[
    Optional[float],
    typer.Option(
        "--qps",
        help="Poisson arrivals at this rate (requests/s): each fitting configuration runs through kvtool simulate "
        "--serve's engine (default with a timestamped --trace: its timestamps).",
        rich_help_panel=_SERVE,
    ),
]
TtftOpt = Annotated[
    Optional[float],
    typer.Option("--ttft-ms", help="TTFT target (ms) at --slo-percentile.", rich_help_panel=_SERVE),
]
TpotOpt = Annotated[
    Optional[float],
    typer.Option("--tpot-ms", help="TPOT target (ms per output token) at --slo-percentile.", rich_help_panel=_SERVE),
]
SloPercentileOpt = Annotated[
    Optional[float],
    typer.Option(
        "--slo-percentile",
        help="The percentile of the requests the targets hold at [default: 99].",
        rich_help_panel=_SERVE,
    ),
]
RequestsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--requests",
        help="Requests to simulate [default: 1,000 of --input-len/--output-len; every row of --trace, or this many "
        "sampled with replacement].",
        rich_help_panel=_SERVE,
    ),
]
SeedOpt = Annotated[
    Optional[int],
    typer.Option("--seed", help="Seed of the arrivals and the sampling [default: 0].", rich_help_panel=_SERVE),
]
MaxNumBatchedTokensOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-num-batched-tokens",
        help="Token budget per step (default: vllm serve's for the GPU); also sizes the reserve, as estimate's.",
    ),
]


def plan_command(
    model: ModelOpt = None,
    config: ConfigOpt = None,
    concurrency: ConcurrencyOpt = None,
    seq_len: PlanSeqLenOpt = None,
    input_len: InputLenOpt = None,
    output_len: OutputLenOpt = None,
    trace: Optional[Path] = path_option(
        None,
        "--trace",
        empty_tip="give a trace file (the formats of kvtool simulate --trace)",
        help="A trace (as kvtool simulate --trace reads): the request length is its --percentile; with --qps or a "
        "target, its requests (and timestamps) are simulated.",
    ),
    percentile: PercentileOpt = None,
    gpu: PlanGpuOpt = None,
    tp: PlanTpOpt = "1-8",
    pp: PlanPpOpt = "1",
    kv_dtype: PlanKvDtypeOpt = "auto",
    gpu_memory_utilization: PlanUtilOpt = "0.9",
    quantization: PlanQuantOpt = None,
    max_gpus: MaxGpusOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    block_size: BlockSizeOpt = 16,
    vllm_version: VllmVersionOpt = NEWEST_RELEASE,
    speculative_config: SpeculativeConfigOpt = None,
    draft_memory: DraftMemoryOpt = None,
    limit_mm_per_prompt: LimitMmOpt = None,
    mm_encoder_tp_mode: MmEncoderTpModeOpt = None,
    encoder_memory: EncoderMemoryOpt = None,
    enable_lora: EnableLoraOpt = False,
    max_loras: MaxLorasOpt = None,
    max_lora_rank: MaxLoraRankOpt = None,
    lora_memory: LoraMemoryOpt = None,
    top: TopOpt = None,
    qps: QpsOpt = None,
    ttft_ms: TtftOpt = None,
    tpot_ms: TpotOpt = None,
    slo_percentile: SloPercentileOpt = None,
    requests: RequestsOpt = None,
    seed: SeedOpt = None,
    profiles: ProfilesOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Which GPUs, how many, what TP/PP, KV dtype and utilization hold a workload: every configuration that fits,
    cheapest first, each counted as kvtool estimate counts it, and the longest context (vLLM's --max-model-len auto).

    Examples:

      kvtool plan -m llama-3.1-70b --concurrency 64 --seq-len 16384 --gpu H100-80GB,L40S,A100-80GB --kv-dtype auto,fp8

      kvtool plan -m qwen2.5-7b -n 32 --trace requests.csv --percentile 95 --max-gpus 2 --json

      kvtool plan -m llama-3.1-8b -n 16 --seq-len 8192 --enable-lora --max-loras 4 --gpu L40S,H100

      kvtool plan -m llama-3.1-8b --qps 20 --input-len 2000 --output-len 200 --ttft-ms 300 --tpot-ms 30 --gpu L40S,H100
    """
    from kvtool.estimate.request import EstimateRequest
    from kvtool.plan.candidates import (
        DEFAULT_PP,
        DEFAULT_TP_RANGE,
        build_grid,
        parse_names,
        parse_sizes,
        parse_utilizations,
    )
    from kvtool.plan.search import PlanRequest, plan_deployments
    from kvtool.plan.workload import ServingOptions, serving_workload_from, workload_from

    dirs = tuple(profiles or ())
    serving = ServingOptions(qps, ttft_ms, tpot_ms, slo_percentile, requests, seed, max_num_batched_tokens)
    if not serving.given():
        workload, ask = workload_from(concurrency, seq_len, input_len, output_len, trace, percentile), None
    if gpu is None:
        from kvtool.estimate.profiles import list_gpus

        gpus = tuple(g.name for g in list_gpus(dirs))
    else:
        gpus = parse_names(gpu, "--gpu")
    quants = tuple(None if q.lower() == "none" else q for q in parse_names(quantization or "none", "--quantization"))
    grid = build_grid(
        gpus,
        parse_sizes(tp or DEFAULT_TP_RANGE, "--tp", powers_of_two_in_ranges=True),
        parse_sizes(pp or DEFAULT_PP, "--pp", powers_of_two_in_ranges=False),
        parse_names(kv_dtype, "--kv-dtype"),
        parse_utilizations(gpu_memory_utilization),
        quants,
        max_gpus,
    )
    base = EstimateRequest(
        model=model,
        config=config,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        vllm_version=vllm_version,
        profile_dirs=dirs,
        speculative_config=speculative_config,
        draft_memory=draft_memory,
        limit_mm_per_prompt=limit_mm_per_prompt,
        mm_encoder_tp_mode=mm_encoder_tp_mode,
        encoder_memory=encoder_memory,
        enable_lora=enable_lora,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        lora_memory=lora_memory,
    )
    if serving.given():
        workload, ask = serving_workload_from(
            base, serving, concurrency, seq_len, input_len, output_len, trace, percentile
        )
    _print_plan(plan_deployments(PlanRequest(base, workload, grid, top, ask)), json_output)


def _print_plan(result: PlanResult, json_output: bool) -> None:
    from kvtool.cli.output import print_answer
    from kvtool.plan.render import render_plan

    print_answer(result, json_output, render_plan, result.warnings)


def register(app: typer.Typer) -> None:
    app.command("plan")(handle_errors(plan_command))
