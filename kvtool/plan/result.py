"""The result of ``kvtool plan``: every configuration that holds the workload, cheapest first, as frozen records the
table and ``--json`` are both rendered from."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.jsonable import to_jsonable
from kvtool.plan.candidates import Workload


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One candidate as estimate counts it, for the workload's concurrency at its length."""

    gpu: str  # the GPU profile's name
    num_gpus: int  # tp x pp
    tp: int
    pp: int
    kv_dtype: str  # as resolved by estimate ("auto" -> "bf16")
    gpu_memory_utilization: float
    quantization: str | None
    kv_budget_bytes: int  # per GPU (the binding pipeline stage's at pp > 1)
    reserve_bytes: int  # per GPU: activation peak, non-torch memory and CUDA graphs as modelled
    num_blocks: int
    block_size: int
    kv_cache_tokens: int  # num_blocks x block_size
    blocks_per_request: int  # at the workload's length
    max_concurrency: float  # vLLM's "Maximum concurrency for S tokens per request", unrounded
    max_batch: int  # requests of the workload's length that fit at once (one block is the null block)
    fits: bool  # the workload's concurrency fits: estimate's "fits"
    margin_requests: int  # max_batch - the workload's concurrency (negative when it does not fit)
    idle_kv_bytes: int  # KV budget the workload leaves unused, all GPUs (the binding stage's per GPU x num_gpus)
    vllm_logged_tokens: int  # vLLM's "KV cache size: N tokens"
    vllm_log: str  # the start-up lines vLLM would log for this configuration at the workload's length
    max_num_seqs: int  # the scheduler's: requests beyond it queue even when their blocks fit
    # vLLM's --max-model-len auto: the longest context its auto-fit picks for this configuration (capped at the
    # model's context); None where the release has no auto-fit (before 0.14.0); 0: not even one token fits
    max_model_len_auto: int | None
    serving: ServingFigures | None = None  # with --qps: the serving simulation's figures and verdict


@dataclasses.dataclass(frozen=True)
class SloTarget:
    """``kvtool plan --qps``'s target: TTFT and/or TPOT at most so many ms at a percentile of the requests."""

    ttft_ms: float | None
    tpot_ms: float | None
    percentile: float  # --slo-percentile, e.g. 99 (numpy's linear interpolation over the simulated requests)


@dataclasses.dataclass(frozen=True)
class ServingWorkload:
    """What ``kvtool plan --qps`` runs through the serving simulation of each fitting configuration."""

    requests: int
    source: str  # where the lengths came from, in words
    arrivals: str  # in words: "Poisson at 10 requests/s (seed 0)", "from the trace's timestamps"
    qps: float | None  # None: the trace's own timestamps
    seed: int
    block_size: int
    target: SloTarget


@dataclasses.dataclass(frozen=True)
class ServingFigures:
    """One configuration through the serving simulation (kvtool simulate --serve's engine), judged on the target."""

    ttft_ms: float | None  # at the target's percentile; arrival to the first token
    tpot_ms: float | None  # at the target's percentile; (completion - first token) / (output tokens - 1)
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    throughput_tokens_per_s: float  # output tokens of completed requests / span
    requests_per_s: float  # completed requests / span (first arrival to last completion)
    requests: int
    completed: int
    preemptions: int
    peak_blocks: int  # most KV blocks in use at once
    max_num_seqs: int  # the scheduler's limits the run used (given, or vllm serve's default for the GPU)
    max_num_batched_tokens: int
    meets_slo: bool  # every request completed and each target given is met (value <= target)
    ttft_headroom_ms: float | None  # target - value: positive is room to spare, negative the miss (None: no target)
    tpot_headroom_ms: float | None
    verdict: str  # in words: "meets: TTFT p99 288 ms under 500 ms"
    shared_simulation: bool = False  # its simulation inputs equal a cheaper row's: that run's figures, not a new one


@dataclasses.dataclass(frozen=True)
class Skipped:
    """Configurations that hold the workload in memory but were not simulated, and why."""

    reason: str
    candidates: int


@dataclasses.dataclass(frozen=True)
class LongestContext:
    """The longest context (vLLM's --max-model-len auto) over the options tried for one GPU and parallelism."""

    gpu: str
    tp: int
    pp: int
    max_model_len_auto: int  # the best over the kv dtypes, utilizations and quantizations tried
    full_context: bool  # True: the model's whole context fits (auto-fit keeps the derived max_model_len)
    kv_dtype: str  # the settings that reach it (the first reaching it, in grid order)
    gpu_memory_utilization: float
    quantization: str | None


@dataclasses.dataclass(frozen=True)
class Refused:
    """Candidates vLLM would refuse to start (every GPU, KV dtype and utilization of one parallelism), and why."""

    tp: int
    pp: int
    quantization: str | None
    candidates: int  # how many candidates of the grid this refusal covers
    reason: str  # vLLM's reason, as estimate gives it


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """What ``kvtool plan`` found for one model and workload."""

    model: str
    vllm_version: str
    model_context_tokens: int | None  # the model's max_position_embeddings (vLLM's derived max_model_len)
    workload: Workload
    candidates: int  # configurations tried (the grid less --max-gpus' and vLLM's refusals)
    over_max_gpus: int  # left out for --max-gpus
    refused: tuple[Refused, ...]  # refused as vLLM refuses them (a --tp that does not divide the heads)
    fitting: int  # how many fit (before --top)
    rows: tuple[PlanRow, ...]  # the fitting ones, cheapest first: fewest GPUs, then least idle KV memory (--top)
    longest_context: tuple[LongestContext, ...]  # per GPU, tp and pp: vLLM's --max-model-len auto
    warnings: tuple[str, ...]
    # with --qps: what was simulated; then ``rows`` are the configurations meeting the target (cheapest first),
    # ``missed`` those simulated that miss it, ``not_simulated`` the fitting ones left out and why
    serving: ServingWorkload | None = None
    missed: tuple[PlanRow, ...] = ()
    not_simulated: tuple[Skipped, ...] = ()
    simulations: int = 0  # engine runs (identical inputs share one)

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtool plan --json`` object."""
        return to_jsonable(self)
