"""`kvtool simulate --engine sglang`: SGLang's radix cache and scheduler over the same requests as vLLM's simulation.

The requests, their prefix structure (``--shared-prefix``, token ids, Mooncake hash ids) and their arrivals come
from the same code as vLLM's serving simulation (``kvtool.simulate.inputs.prepare``,
``kvtool.simulate.workloads.build_prompts``, ``kvtool.simulate.run.arrivals_for``).  Each page size is one run of
:mod:`kvtool.simulate.sglang.scheduler` over SGLang's own pool, sized as `kvtool estimate --engine sglang` sizes it
(``kvtool.estimate.sglang.pool.estimate_sglang``: max_total_num_tokens, max_running_requests,
chunked_prefill_size for the model on the GPU), or ``--kv-tokens``.  The step times are the roofline of vLLM's
simulation (:class:`kvtool.simulate.costs.RooflineCost`, one implementation) on the same model and GPU, over
SGLang's batches.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.estimate.sglang.pool import MAX_PREFILL_TOKENS
from kvtool.estimate.sglang.versions import NEWEST_RELEASE
from kvtool.simulate.sglang.scheduler import POLICIES, SglangConfig, SglangResult, simulate_sglang

NOTES = (
    "SGLang model (sglang 0.5.23 source): radix-cache prefix matching at the page size, LRU eviction of unlocked "
    "leaves, PrefillAdder admission (new_token_ratio reservation, chunked prefill, max_running_requests), retraction "
    "on decode memory pressure, prefill and decode batches apart (no mixed chunk) (kvtool/simulate/sglang/"
    "scheduler.py).",
    "Step times: vLLM's roofline (kvtool/simulate/costs.py) over SGLang's batches, with no per-page kernel term "
    "(it is calibrated on vLLM's paged attention); SGLang's overlap scheduler (CPU scheduling hidden behind the GPU "
    "step) and CUDA graphs are not modelled: both engines pay the same fixed time per step.",
    "Tokens past a trace's shared part (and every generated token) are taken as unique to their request.",
)
# The kernel's cost per table entry that vLLM's simulation calibrated (kvtool.simulate.costs) is not SGLang's: its
# attention kernels (FlashInfer, FA3) walk a page table too, but no published figure ties a per-page cost to them.
SGLANG_TABLE_ENTRY_US = 0.0


@dataclasses.dataclass(frozen=True)
class SglangOptions:
    """SGLang's own settings for the simulation (None: SGLang's default for the model and GPU, as estimate gives)."""

    page_sizes: tuple[int, ...] = (1,)  # --page-size, one run each
    max_running_requests: int | None = None  # --max-running-requests
    chunked_prefill_size: int | None = None  # --chunked-prefill-size
    mem_fraction_static: float | None = None  # --mem-fraction-static (sizes the pool)
    schedule_policy: str = "fcfs"  # --schedule-policy
    sglang_version: str = NEWEST_RELEASE  # --sglang-version (the pool's rules)


@dataclasses.dataclass(frozen=True)
class SglangSetup:
    """How one page size's run was set up, as stated in the output."""

    page_size: int
    pool_tokens: int  # max_total_num_tokens
    pool_text: str  # the pool and where it came from, in words
    max_running_requests: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    sglang_version: str


@dataclasses.dataclass(frozen=True)
class SglangReport:
    source: str
    engine: str  # "sglang"
    pool_tokens: int  # the first page size's pool (each result carries its own)
    schedule_policy: str
    results: tuple[SglangResult, ...]  # one per page size
    notes: tuple[str, ...]
    setups: tuple[SglangSetup, ...] = ()  # one per page size, the results' order
    arrivals: str = ""  # where arrival times came from, in words
    cost_text: str = ""  # the step-time formula with its parameters (kvtool.simulate.results.cost_text)
    hardware: Any = None  # kvtool.simulate.costs.Hardware the step times use


def token_prompts(prompts) -> list[list[int]]:
    """Each :class:`~kvtool.simulate.scheduler.Prompt` as token ids for the radix tree: its shared part (the ids,
    or one id per (piece, offset): equal pieces, equal tokens), then ids unique to the request."""
    ids: dict[tuple[object, int], int] = {}
    unique = itertools.count(-(1 << 40), -1)
    out = []
    for p in prompts:
        n = int(p.tokens)
        tokens: list[int] = []
        if p.kind == "tokens":
            tokens = [int(t) for t in p.shared][:n]
        else:
            for piece, length in p.shared:
                tokens += [ids.setdefault((piece, k), len(ids)) for k in range(int(length))]
            tokens = tokens[:n]
        tokens += [next(unique) for _ in range(n - len(tokens))]
        out.append(tokens)
    return out


def sglang_kv_dtype(kv_dtype: str) -> str:
    """simulate's --kv-dtype (vLLM's spelling) in SGLang's --kv-cache-dtype terms."""
    return {"fp8": "fp8_e4m3"}.get(kv_dtype, kv_dtype)


def sglang_hardware(hw, cell_bytes_per_token: int, table_entry_us: float | None):
    """vLLM's resolved model and GPU (kvtool.simulate.costs.Hardware) with SGLang's KV cell and page-entry term."""
    entry = SGLANG_TABLE_ENTRY_US if table_entry_us is None else table_entry_us
    why = "--table-entry-us" if table_entry_us is not None else "SGLang: no figure calibrated for its kernels"
    sources = [s for s in hw.sources if not s.startswith("block-table entry") and not s.startswith("KV ")]
    sources.append(f"KV {cell_bytes_per_token:,} B per token per GPU (SGLang's cell_size)")
    sources.append(f"page-table entry {entry:g} us ({why})")
    return dataclasses.replace(
        hw, kv_bytes_per_token_per_gpu=cell_bytes_per_token, table_entry_us=entry, sources=tuple(sources)
    )


def _estimate(options, sglang: SglangOptions, page_size: int, running: int | None, chunked: int | None):
    """SGLang's pool for the model on the GPU at this page size (kvtool estimate --engine sglang's answer)."""
    from kvtool.estimate.sglang.pool import SglangRequest, estimate_sglang
    from kvtool.simulate.run import DEFAULT_POOL_GPU, DEFAULT_POOL_MODEL

    model = options.model if options.model is not None or options.config is not None else DEFAULT_POOL_MODEL
    return estimate_sglang(
        SglangRequest(
            model=model,
            config=options.config,
            gpu=None if options.gpu_memory is not None else options.gpu or DEFAULT_POOL_GPU,
            gpu_memory=options.gpu_memory,
            tp=options.tp,
            kv_cache_dtype=sglang_kv_dtype(options.kv_dtype),
            page_size=page_size,
            mem_fraction_static=sglang.mem_fraction_static,
            max_running_requests=running,
            chunked_prefill_size=chunked,
            context_length=options.max_model_len,
            sglang_version=sglang.sglang_version,
            profile_dirs=options.profile_dirs,
        )
    )


def _setup(options, sglang: SglangOptions, page: int, fallback_running: int | None, fallback_chunked: int | None):
    """The pool, max_running_requests and chunked_prefill_size of one page size, and SGLang's estimate."""
    from kvtool.estimate.sglang.pool import running_requests

    running_asked = sglang.max_running_requests or fallback_running
    chunked_asked = sglang.chunked_prefill_size or fallback_chunked
    est = _estimate(options, sglang, page, running_asked, chunked_asked)
    if options.kv_tokens is not None:
        pool = options.kv_tokens // page * page
        running = running_requests(pool, est.context_len, running_asked, est.sglang_version)[1]
        text = f"{pool:,} tokens (--kv-tokens, whole pages of {page})"
    else:
        if est.max_total_num_tokens is None or est.max_running_requests is None:
            raise UsageError("SGLang's pool needs a GPU", where="--gpu", tip="give --gpu NAME or --kv-tokens N")
        pool, running = est.max_total_num_tokens, est.max_running_requests
        text = (
            f"{pool:,} tokens (kvtool estimate --engine sglang: {est.model} on {est.gpu or 'the GPU'}, tp {est.tp}, "
            f"mem_fraction_static {est.mem_fraction_static:.3f})"
        )
    setup = SglangSetup(page, pool, text, running, est.chunked_prefill_size, MAX_PREFILL_TOKENS, est.sglang_version)
    return setup, est


def simulate_sglang_report(
    reqs,
    options,
    sglang: SglangOptions = SglangOptions(),
    *,
    fallback_running: int | None = None,
    fallback_chunked: int | None = None,
    hardware=None,
) -> SglangReport:
    """SGLang's model over ``reqs`` at each of ``sglang.page_sizes``, timed on the model and GPU of ``options``.

    ``fallback_running`` / ``fallback_chunked``: vLLM's --max-num-seqs / --max-num-batched-tokens, which
    ``--engine sglang`` alone takes as SGLang's settings when SGLang's own are not given.  ``hardware``: the model and
    GPU already resolved (kvtool.simulate.run.resolve_serving_hardware), else resolved here.
    """
    from kvtool.simulate.costs import RooflineCost
    from kvtool.simulate.results import cost_text
    from kvtool.simulate.run import arrivals_for, resolve_serving_hardware
    from kvtool.simulate.workloads import build_prompts

    if sglang.schedule_policy not in POLICIES:
        raise UsageError(
            f"--schedule-policy must be one of {', '.join(POLICIES)}, not {sglang.schedule_policy!r}",
            where="--schedule-policy",
        )
    serving = dataclasses.replace(options, serve=True)
    hw = hardware if hardware is not None else resolve_serving_hardware(serving)
    arrivals = arrivals_for(reqs, serving)
    prompts = token_prompts(
        build_prompts(reqs, options.shared_prefix_tokens, options.prefix_variant_share, options.seed)
    )
    max_new = [int(x) for x in reqs.output_tokens]
    results, setups = [], []
    shown_hw = None
    for page in sglang.page_sizes:
        setup, est = _setup(options, sglang, page, fallback_running, fallback_chunked)
        page_hw = sglang_hardware(hw, est.cell_bytes_per_token, options.cost.table_entry_us)
        shown_hw = shown_hw or page_hw
        config = SglangConfig(
            pool_tokens=setup.pool_tokens,
            page_size=page,
            max_running_requests=setup.max_running_requests,
            chunked_prefill_size=setup.chunked_prefill_size,
            max_prefill_tokens=setup.max_prefill_tokens,
            schedule_policy=sglang.schedule_policy,
        )
        try:
            result = simulate_sglang(
                prompts, max_new, config, [float(t) for t in arrivals.times_s], RooflineCost(page_hw, page)
            )
        except ValueError as err:
            where = "--kv-tokens" if options.kv_tokens is not None else "--model/--gpu"
            raise UsageError(f"SGLang's pool: {err} (page size {page})", where=where) from None
        results.append(result)
        setups.append(setup)
    return SglangReport(
        source=reqs.source,
        engine="sglang",
        pool_tokens=setups[0].pool_tokens,
        schedule_policy=sglang.schedule_policy,
        results=tuple(results),
        notes=NOTES,
        setups=tuple(setups),
        arrivals=arrivals.text,
        cost_text=cost_text(shown_hw) if shown_hw is not None else "",
        hardware=shown_hw,
    )


def parse_page_sizes(text: str | Sequence[int] | None) -> tuple[int, ...]:
    """'1,16' -> (1, 16): as --block-size takes its list (positive integers, no duplicates)."""
    from kvtool.simulate.run import parse_block_sizes

    if text is None:
        return (1,)
    if not isinstance(text, str):
        text = ",".join(str(x) for x in text)
    try:
        return tuple(parse_block_sizes(text))
    except UsageError as err:
        raise UsageError(err.message.replace("block size", "page size"), where="--page-size") from None
