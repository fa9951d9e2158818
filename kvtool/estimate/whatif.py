"""What-ifs on one estimate: ``--compare``'s rows (other attention layouts and KV dtypes of the same model) and,
when the batch asked does not fit, the changes that would make it fit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Protocol

from kvtool.core.errors import KvtoolError
from kvtool.core.format import fmt_plural
from kvtool.estimate.capacity import Budget, Capacity
from kvtool.estimate.fit import capacity_at
from kvtool.estimate.hf_config import KvShape, ModelSpec
from kvtool.estimate.layout import kv_layout
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.serve_defaults import Scheduler


class _Tried(Protocol):
    """What a suggestion reads of a retried estimate (an EstimateResult)."""

    @property
    def fits(self) -> bool | None: ...
    @property
    def max_batch(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class CompareRow:
    """One row of --compare: the model with another attention layout or KV dtype, against the model as is."""

    label: str
    attention: str
    kv_heads: int
    kv_dtype: str
    bytes_per_token: int  # all layers, all GPUs
    kv_bytes: int  # seq_len x batch, all GPUs
    ratio_to_as_is: float
    num_blocks: int | None
    max_concurrency: float | None


def suggest_fits(
    request: EstimateRequest,
    spec: ModelSpec,
    capacity: Capacity | None,
    scheduler: Scheduler,
    rerun: Callable[[EstimateRequest], _Tried],
) -> tuple[str, ...]:
    """What would fit when the asked batch does not: the smallest larger --tp, an fp8 KV cache, a shorter context.

    ``rerun`` is the estimate itself (each try is a whole estimate with the scheduler settings of this one)."""
    if not request.suggest or capacity is None or capacity.fits:
        return ()
    seq_len, batch = capacity.max_model_len, capacity.batch
    said: list[str] = []
    one = dataclasses.replace(
        request,
        seq_lens=(seq_len,),
        batches=(batch,),
        suggest=False,
        compare=False,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_num_seqs=scheduler.max_num_seqs,
    )
    for tp in (2, 4, 8, 16):
        if tp <= request.tp or spec.num_attention_heads % tp:
            continue
        try:
            tried = rerun(dataclasses.replace(one, tp=tp))
        except KvtoolError:
            continue
        if tried.fits:
            said.append(f"--tp {tp} fits (up to {_requests(tried.max_batch)} of {seq_len:,} tokens)")
            break
    if not request.kv_dtype.startswith("fp8") and request.kv_dtype not in ("int4", "nvfp4"):
        tried = rerun(dataclasses.replace(one, kv_dtype="fp8"))
        verdict = "fits" if tried.fits else "is not enough"
        said.append(f"--kv-dtype fp8 {verdict} (up to {_requests(tried.max_batch)} of {seq_len:,} tokens)")
    if capacity.max_seq_len_at_batch:
        said.append(f"--seq-len {capacity.max_seq_len_at_batch:,} fits {_requests(batch)}")
    return tuple(said)


def _requests(count: int | None) -> str:
    """'1 request', '4 requests' (it said 'up to 1 requests')."""
    return fmt_plural(count or 0, "request")


def compare_rows(
    spec: ModelSpec,
    request: EstimateRequest,
    budget: Budget | None,
    scheduler: Scheduler,
    seq_len: int,
    batch: int,
    base_per_gpu: int,
) -> tuple[CompareRow, ...]:
    """What-if rows for the same model: as-is, MHA, GQA-8, MQA, fp8 KV, int8 KV (and MLA's MHA equivalent)."""
    if spec.is_mla:
        # Without MLA, vLLM caches K and V for every head at qk_nope + qk_rope dims (DeepSeek's non-MLA path).
        attn_dim = (spec.qk_nope_head_dim or 0) + (spec.qk_rope_head_dim or 0)
        plain = dataclasses.replace(spec, is_mla=False, num_kv_heads=spec.num_attention_heads, head_dim=attn_dim)
    else:
        plain = spec
    heads = spec.num_attention_heads
    # fp8_ds_mla is MLA's own layout: the rows without MLA take plain fp8 (it refused the whole command)
    plain_dtype = "fp8" if request.kv_dtype == "fp8_ds_mla" else request.kv_dtype
    variants: list[tuple[str, ModelSpec, str]] = [("as-is", spec, request.kv_dtype)]
    variants.append(("MHA", _with_kv_heads(plain, heads), plain_dtype))
    if heads >= 8:
        variants.append(("GQA-8", _with_kv_heads(plain, 8), plain_dtype))
    variants.append(("MQA", _with_kv_heads(plain, 1), plain_dtype))
    variants.append(("fp8 KV", spec, "fp8"))
    variants.append(("int8 KV", spec, "int8"))
    rows = []
    for label, variant, dtype in variants:
        layout = kv_layout(variant, dtype, request.tp)
        per_gpu = layout.kv_bytes_per_gpu(seq_len, batch)
        cap = capacity_at(variant, layout, budget, request, scheduler, seq_len, batch)
        rows.append(
            CompareRow(
                label=label,
                attention=variant.attention_kind,
                kv_heads=variant.num_kv_heads,
                kv_dtype=layout.kv_dtype,
                bytes_per_token=math.ceil(layout.bytes_per_token_per_gpu) * request.tp,
                kv_bytes=per_gpu * request.tp,
                ratio_to_as_is=per_gpu / base_per_gpu if base_per_gpu else float("nan"),
                num_blocks=cap.num_blocks if cap else None,
                max_concurrency=cap.max_concurrency if cap else None,
            )
        )
    return tuple(rows)


def _with_kv_heads(spec: ModelSpec, kv_heads: int) -> ModelSpec:
    """The same model with ``kv_heads`` KV heads on every layer (full-attention layers keep their head size)."""
    full = spec.full_attention_kv
    return dataclasses.replace(
        spec, num_kv_heads=kv_heads, full_attention_kv=KvShape(kv_heads, full.head_dim) if full else None
    )
