"""The core of ``kvtool plan``: one pass over the candidates, each counted by estimate's own steps.

Every candidate goes through the steps :func:`kvtool.estimate.estimator.estimate` takes (model, layout, GPU,
scheduler, budget, fit), with the same :class:`EstimateRequest` estimate would be given, so a candidate fits here
exactly when ``kvtool estimate`` says it fits.  What does not change between candidates is computed once and reused:

    resolve the model     once per (tp, pp, quantization): the profile is read, the weights sized, --tp checked
    find the GPU          once per GPU profile
    lay out the KV cache  once per (tp, pp, quantization, kv dtype), with --speculative-config's drafter added
    scheduler settings    once per (GPU, pp): vllm serve's defaults depend on the GPU only
    budget and fit        per candidate: the reserve, ceil(memory x utilization) - weights - reserve, the blocks
    auto-fit              per candidate: vLLM's --max-model-len auto (:mod:`kvtool.plan.autofit`)

The memory terms estimate takes (--speculative-config and --draft-memory, --limit-mm-per-prompt, --mm-encoder-tp-mode
and --encoder-memory, --enable-lora and its options) ride in the base request and take the same steps.  What is
skipped is what estimate adds for its own table: the result record, --compare, the "Would fit" tries, and the CPU
tier and the prefill/decode handoff (they do not change which candidates hold the workload).
"""

from __future__ import annotations

import dataclasses

from kvtool.core.errors import UsageError
from kvtool.estimate.budget import PipelinePlan, plan_budget
from kvtool.estimate.capacity import Capacity
from kvtool.estimate.fit import Lengths, plan_fit
from kvtool.estimate.gpu import AskedGpu, asked_gpu, check_block_size
from kvtool.estimate.layout import KvLayout, kv_layout
from kvtool.estimate.model import ResolvedModel, resolve_model
from kvtool.estimate.request import EstimateRequest, check_request
from kvtool.estimate.serve_defaults import Scheduler, scheduler_settings
from kvtool.plan.autofit import auto_fit_max_model_len
from kvtool.plan.candidates import Candidate, Grid, Workload
from kvtool.plan.result import LongestContext, PlanResult, PlanRow, Refused
from kvtool.plan.slo import ServingAsk, nobody_meets, serve_fitting


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What ``kvtool plan`` was asked: the model and fixed settings (as estimate takes them), the workload, the grid."""

    base: EstimateRequest  # model/config, vLLM version, block size, scheduler limits ...; per-candidate fields unset
    workload: Workload
    grid: Grid
    top: int | None = None  # keep the N cheapest fitting rows (None: all); with serving, stop after N meet
    serving: ServingAsk | None = None  # --qps: simulate each fitting row against a TTFT/TPOT target


def candidate_request(base: EstimateRequest, workload: Workload, candidate: Candidate) -> EstimateRequest:
    """The request ``kvtool estimate`` would get for this candidate at the workload's length and concurrency."""
    return dataclasses.replace(
        base,
        gpu=candidate.gpu,
        tp=candidate.tp,
        pp=candidate.pp,
        kv_dtype=candidate.kv_dtype,
        gpu_memory_utilization=candidate.gpu_memory_utilization,
        quantization=candidate.quantization,
        seq_lens=(workload.seq_len,),
        batches=(workload.concurrency,),
        suggest=False,
    )


class _Steps:
    """The steps' results that several candidates share, each computed on first use.

    A model vLLM refuses at some parallelism (a --tp that does not divide the heads) is kept as its error, so every
    candidate of that parallelism is refused with estimate's own reason."""

    def __init__(self, lengths: Lengths) -> None:
        self.lengths = lengths
        self.models: dict[tuple[int, int, str | None], ResolvedModel | UsageError] = {}
        self.gpus: dict[str, AskedGpu] = {}
        self.layouts: dict[tuple[int, int, str | None, str], tuple[ResolvedModel, KvLayout]] = {}
        self.schedulers: dict[tuple[str, int], Scheduler] = {}

    def model(self, request: EstimateRequest) -> ResolvedModel | UsageError:
        key = (request.tp, request.pp, request.quantization)
        if key not in self.models:
            try:
                self.models[key] = resolve_model(request)
            except UsageError as err:
                if err.where not in ("--tp", "--pp"):
                    raise
                self.models[key] = err
        return self.models[key]

    def gpu(self, request: EstimateRequest) -> AskedGpu:
        name = str(request.gpu)
        if name not in self.gpus:
            found = asked_gpu(request)
            assert found is not None  # a candidate always names a GPU
            check_block_size(request.block_size, found)
            self.gpus[name] = found
        return self.gpus[name]

    def layout(self, request: EstimateRequest, model: ResolvedModel) -> tuple[ResolvedModel, KvLayout]:
        """The KV layout and, with --speculative-config, the model with its drafter (estimate's with_drafter: the
        draft layers in the layout, its weights with the model's)."""
        key = (request.tp, request.pp, request.quantization, request.kv_dtype)
        if key not in self.layouts:
            layout = kv_layout(model.spec, request.kv_dtype, request.tp)
            if request.speculative_config is not None:
                from kvtool.estimate.estimator import with_drafter

                model, layout, _ = with_drafter(request, model, layout)
            self.layouts[key] = (model, layout)
        return self.layouts[key]

    def scheduler(self, request: EstimateRequest, gpu: AskedGpu) -> Scheduler:
        key = (str(request.gpu), request.pp)
        if key not in self.schedulers:
            self.schedulers[key] = scheduler_settings(request, gpu)
        return self.schedulers[key]


def plan_deployments(request: PlanRequest) -> PlanResult:
    """Every candidate of the grid that holds the workload, cheapest first (fewest GPUs, then least idle KV)."""
    first = _checked_base(request)
    workload = request.workload
    steps = _Steps(Lengths((workload.seq_len,), (workload.concurrency,), ()))
    rows: list[PlanRow] = []
    tried: list[Candidate] = []  # the candidate of each row
    refused: dict[tuple[int, int, str | None], list] = {}
    spec = None
    for candidate in request.grid.candidates:
        asked = candidate_request(first, workload, candidate)
        if asked.pp != first.pp:  # async scheduling's default depends on pp (check_request resolves it)
            try:
                asked = check_request(dataclasses.replace(asked, async_scheduling=request.base.async_scheduling))
            except UsageError as err:  # --speculative-config with pp > 1: estimate refuses it, so is the candidate
                if err.where != "--speculative-config":
                    raise
                refused.setdefault((asked.tp, asked.pp, asked.quantization), [err, 0])[1] += 1
                continue
        model = steps.model(asked)
        if isinstance(model, UsageError):
            refused.setdefault((asked.tp, asked.pp, asked.quantization), [model, 0])[1] += 1
            continue
        spec = model.spec
        rows.append(_row(asked, model, steps, workload))
        tried.append(candidate)
    if spec is None and not refused:
        raise UsageError("no candidate to try: every one needs more GPUs than --max-gpus", where="--max-gpus")
    order = sorted(
        (i for i, r in enumerate(rows) if r.fits), key=lambda i: (rows[i].num_gpus, rows[i].idle_kv_bytes, rows[i].gpu)
    )
    fitting = [rows[i] for i in order]
    context = spec.max_position_embeddings if spec else None
    warnings = _warnings(context, workload)
    served = None
    if request.serving is not None:
        served = serve_fitting(((rows[i], tried[i]) for i in order), request.serving, request.top)
        if not served.met:
            warnings += (nobody_meets(served, request.serving.target),)
    shown = fitting if served is None else list(served.met)
    return PlanResult(
        model=spec.name if spec else str(first.model or first.config),
        vllm_version=first.vllm_version,
        model_context_tokens=spec.max_position_embeddings if spec else None,
        workload=workload,
        candidates=len(rows),
        over_max_gpus=request.grid.over_max_gpus,
        refused=tuple(Refused(tp, pp, q, n, err.message) for (tp, pp, q), (err, n) in refused.items()),
        fitting=len(fitting),
        rows=tuple(shown[: request.top] if request.top else shown),
        longest_context=longest_contexts(rows, context),
        warnings=warnings,
        serving=None if request.serving is None else request.serving.workload,
        missed=() if served is None else served.missed,
        not_simulated=() if served is None else served.skipped,
        simulations=0 if served is None else served.simulations,
    )


def _checked_base(request: PlanRequest) -> EstimateRequest:
    """The base request checked as estimate checks it (the version resolved), at the grid's first candidate."""
    if not request.grid.candidates:
        raise UsageError("no candidate to try: every one needs more GPUs than --max-gpus", where="--max-gpus")
    if request.top is not None and request.top <= 0:
        raise UsageError(f"--top must be greater than zero, not {request.top}", where="--top")
    return check_request(candidate_request(request.base, request.workload, request.grid.candidates[0]))


def _row(request: EstimateRequest, model: ResolvedModel, steps: _Steps, workload: Workload) -> PlanRow:
    """Estimate's steps for one candidate, reusing what it shares with others."""
    gpu = steps.gpu(request)
    model, layout = steps.layout(request, model)
    scheduler = steps.scheduler(request, gpu)
    plan = plan_budget(request, model, layout, gpu, scheduler)
    fit = plan_fit(request, plan, scheduler, steps.lengths)
    capacity = fit.capacity
    budget = plan.planned.budget
    assert capacity is not None and budget is not None  # a GPU always gives a budget
    return _plan_row(request, plan, capacity, scheduler, workload, model.spec.max_position_embeddings)


def _plan_row(
    request: EstimateRequest,
    plan: PipelinePlan,
    capacity: Capacity,
    scheduler: Scheduler,
    workload: Workload,
    context_tokens: int | None,
) -> PlanRow:
    budget = plan.planned.budget
    assert budget is not None
    bytes_per_block = capacity.page_bytes_per_layer * capacity.layers_per_group
    held_blocks = workload.concurrency * capacity.blocks_per_request + 1  # and the null block
    idle_per_gpu = max(0, budget.kv_budget_bytes - held_blocks * bytes_per_block)
    auto = auto_fit_max_model_len(capacity, context_tokens or workload.seq_len, request.vllm_version)
    return PlanRow(
        gpu=budget.gpu_name or str(request.gpu),
        num_gpus=request.tp * request.pp,
        tp=request.tp,
        pp=request.pp,
        kv_dtype=plan.layout.kv_dtype,
        gpu_memory_utilization=float(budget.gpu_memory_utilization or 0.0),
        quantization=request.quantization,
        kv_budget_bytes=budget.kv_budget_bytes,
        reserve_bytes=budget.reserve_bytes or 0,
        num_blocks=capacity.num_blocks,
        block_size=capacity.block_size,
        kv_cache_tokens=capacity.kv_cache_tokens,
        blocks_per_request=capacity.blocks_per_request,
        max_concurrency=capacity.max_concurrency,
        max_batch=capacity.max_batch,
        fits=capacity.fits,
        margin_requests=capacity.max_batch - workload.concurrency,
        idle_kv_bytes=idle_per_gpu * request.tp * request.pp,
        vllm_logged_tokens=capacity.vllm_logged_tokens,
        vllm_log=vllm_log_lines(budget.kv_budget_bytes, capacity),
        max_num_seqs=scheduler.max_num_seqs,
        max_model_len_auto=auto,
    )


def vllm_log_lines(kv_budget_bytes: int, capacity: Capacity) -> str:
    """What vLLM logs at start-up for this budget and capacity (vllm/v1/worker/gpu_worker.py
    ``determine_available_memory``: "Available KV cache memory: %s GiB" with ``format_gib``, round(b / GiB, 2);
    vllm/v1/core/kv_cache_utils.py ``update_kv_cache_capacity`` (0.33.0): "KV cache size: %s tokens, Maximum
    concurrency for %s tokens per request: %.2fx")."""
    gib = round(kv_budget_bytes / 1024**3, 2)
    return (
        f"Available KV cache memory: {gib} GiB; KV cache size: {capacity.vllm_logged_tokens:,} tokens, "
        f"Maximum concurrency for {capacity.max_model_len:,} tokens per request: {capacity.max_concurrency:.2f}x"
    )


def longest_contexts(rows: list[PlanRow], context_tokens: int | None) -> tuple[LongestContext, ...]:
    """Per GPU, tp and pp (in grid order): the longest --max-model-len auto over the other options tried
    (``context_tokens``: the model's, which auto-fit never exceeds)."""
    best: dict[tuple[str, int, int], PlanRow] = {}
    for row in rows:
        if row.max_model_len_auto is None:
            continue
        key = (row.gpu, row.tp, row.pp)
        held = best.get(key)
        if held is None or (held.max_model_len_auto or 0) < row.max_model_len_auto:
            best[key] = row
    return tuple(
        LongestContext(
            gpu=r.gpu,
            tp=r.tp,
            pp=r.pp,
            max_model_len_auto=r.max_model_len_auto or 0,
            full_context=context_tokens is not None and (r.max_model_len_auto or 0) >= context_tokens,
            kv_dtype=r.kv_dtype,
            gpu_memory_utilization=r.gpu_memory_utilization,
            quantization=r.quantization,
        )
        for r in best.values()
    )


def _warnings(context_tokens: int | None, workload: Workload) -> tuple[str, ...]:
    if context_tokens is not None and workload.seq_len > context_tokens:
        return (
            f"{workload.seq_len:,} tokens per request exceed the model's context ({context_tokens:,}): vLLM refuses "
            "such a --max-model-len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
        )
    return ()
