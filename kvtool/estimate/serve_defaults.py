"""What ``vllm serve`` picks when it is not told: max_num_seqs and max_num_batched_tokens by GPU, per vLLM release.

One rule for every command: ``kvtool estimate``, ``kvtool simulate --serve`` and the API read these defaults from
:func:`serve_batch_defaults`, and each says which one it used (:attr:`BatchDefaults.reason`).  A rule that changes
between releases is one row of :data:`BATCH_DEFAULTS_RULES`, keyed by the first release it applies to and naming the
upstream function it is read from, so a new release is one row.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from kvtool.estimate.async_scheduling import ASYNC_SCHEDULING_RULES, AsyncSchedulingRule, default_async_scheduling
from kvtool.estimate.capacity import max_in_flight_tokens
from kvtool.estimate.gpu import AskedGpu
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

__all__ = ["ASYNC_SCHEDULING_RULES", "AsyncSchedulingRule", "default_async_scheduling"]  # re-exported

_GIB = 1024**3


class BatchDefaultsRule(NamedTuple):
    """``vllm serve``'s (OPENAI_API_SERVER's) scheduler defaults by device memory, for the releases from ``since``.

    A device of ``large_gpu_bytes`` or more (where the release has that tier) takes ``large``; of ``mid_gpu_bytes`` or more, unless its name holds
    "a100", ``mid``; any other, and a device vLLM cannot query (memory 0), ``other``.  Each pair is
    (max_num_seqs, max_num_batched_tokens).
    """

    since: str  # the first vLLM release this row applies to
    source: str  # the upstream file and function the figures are read from
    large_gpu_bytes: int | None  # None: no tier above mid
    large: tuple[int, int] | None
    mid_gpu_bytes: int
    mid: tuple[int, int]
    other: tuple[int, int]


BATCH_DEFAULTS_RULES: tuple[BatchDefaultsRule, ...] = (
    # vllm/engine/arg_utils.py (0.10.0) EngineArgs._set_default_args_v1 (get_batch_defaults from 0.11.1, applied by
    # _set_default_max_num_seqs_and_batched_tokens_args from 0.12.0; the same figures): >= 70 GiB and not an A100
    # (PR #17885 keeps A100s low) 1024 and 8192; else, and when the device cannot be queried, 256 and 2048 for
    # OPENAI_API_SERVER.  No larger tier: a B200 takes the 70 GiB row.
    BatchDefaultsRule(
        since="0.10.0",
        source="vllm/engine/arg_utils.py EngineArgs._set_default_args_v1 (0.10.0)",
        large_gpu_bytes=None,
        large=None,
        mid_gpu_bytes=70 * _GIB,
        mid=(1024, 8192),
        other=(256, 2048),
    ),
    # vllm/engine/arg_utils.py (0.28.0) EngineArgs.get_batch_defaults: a >= 160 GiB tier (B200/B300) with 1024 and
    # 16384 comes first; the rest as before (0.27.1 has no such tier)
    BatchDefaultsRule(
        since="0.28.0",
        source="vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (0.28.0)",
        large_gpu_bytes=160 * _GIB,
        large=(1024, 16384),
        mid_gpu_bytes=70 * _GIB,
        mid=(1024, 8192),
        other=(256, 2048),
    ),
)


@dataclasses.dataclass(frozen=True)
class BatchDefaults:
    """``vllm serve``'s max_num_seqs and max_num_batched_tokens for one GPU, and why."""

    max_num_seqs: int
    max_num_batched_tokens: int
    reason: str  # which of vLLM's cases applied, in words ("vllm serve's default on GPUs under 70 GiB")
    # (max_num_seqs, max_num_batched_tokens) of an A100 when only a size was given and it cannot be told from one
    if_a100: tuple[int, int] | None
    vllm_version: str
    source: str  # upstream file and function

    def max_num_seqs_words(self) -> str:
        """The default max_num_seqs and why, as every command states it."""
        return self._words("max-num-seqs", self.max_num_seqs, 0)

    def max_num_batched_tokens_words(self) -> str:
        """The default max_num_batched_tokens and why, as every command states it."""
        return self._words("max-num-batched-tokens", self.max_num_batched_tokens, 1)

    def _words(self, option: str, value: int, which: int) -> str:
        why = self.reason
        if self.if_a100 is not None and self.if_a100[which] != value:
            why += f"; an A100 would use {self.if_a100[which]}: pass --{option}"
        return f"{option} {value} ({why})"


def batch_defaults_rule(vllm_version: str = NEWEST_RELEASE) -> BatchDefaultsRule:
    """The row of :data:`BATCH_DEFAULTS_RULES` for ``vllm_version``: the newest whose ``since`` is not later."""
    return pick(BATCH_DEFAULTS_RULES, vllm_version)


def serve_batch_defaults(
    gpu_memory_bytes: int | None, gpu_name: str | None, vllm_version: str = NEWEST_RELEASE
) -> BatchDefaults:
    """``vllm serve``'s defaults for a GPU of ``gpu_memory_bytes`` (None: not known, as with --kv-memory) named
    ``gpu_name`` (a profile name; None when only a size was given, which cannot be told from an A100)."""
    rule = batch_defaults_rule(vllm_version)
    is_a100 = gpu_name is not None and "a100" in gpu_name.lower()
    if_a100: tuple[int, int] | None = None
    if gpu_memory_bytes is None:
        pair, why = rule.other, "vllm serve's default when the GPU is not known"
    elif rule.large_gpu_bytes is not None and rule.large is not None and gpu_memory_bytes >= rule.large_gpu_bytes:
        pair, why = rule.large, f"vllm serve's default on GPUs with >= {rule.large_gpu_bytes // _GIB} GiB"
    elif gpu_memory_bytes >= rule.mid_gpu_bytes and not is_a100:
        pair, why = rule.mid, f"vllm serve's default on non-A100 GPUs with >= {rule.mid_gpu_bytes // _GIB} GiB"
        if_a100 = None if gpu_name else rule.other  # a size alone cannot tell an A100-80GB from an H100
    elif is_a100:
        pair, why = rule.other, "vllm serve's default on A100s"
    else:
        pair, why = rule.other, f"vllm serve's default on GPUs under {rule.mid_gpu_bytes // _GIB} GiB"
    return BatchDefaults(pair[0], pair[1], why, if_a100, vllm_version, rule.source)


@dataclasses.dataclass(frozen=True)
class Scheduler:
    """The scheduler settings a request runs with: as given, else ``vllm serve``'s defaults for its GPU."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_in_flight_tokens: int  # vLLM's: max_num_batched_tokens x batches in flight (sizes sliding/chunked layers)
    defaults: tuple[str, ...]  # the defaults taken, in words (max-num-batched-tokens first)


def scheduler_settings(request: EstimateRequest, gpu: AskedGpu | None) -> Scheduler:
    """max_num_batched_tokens and max_num_seqs as ``vllm serve`` picks them for the GPU, unless given."""
    memory, name = (gpu.memory_bytes, gpu.name) if gpu else (None, None)
    serve = serve_batch_defaults(memory, name, request.vllm_version)
    said: list[str] = []
    mnbt, seqs = request.max_num_batched_tokens, request.max_num_seqs
    if mnbt is None:
        mnbt = serve.max_num_batched_tokens
        said.append(serve.max_num_batched_tokens_words())
    if seqs is None:
        seqs = serve.max_num_seqs
        said.append(serve.max_num_seqs_words())
    async_scheduling = request.async_scheduling
    if async_scheduling is None:  # check_request resolves it; a request built by hand may not have been checked
        async_scheduling = default_async_scheduling(request.vllm_version, request.pp)
    in_flight = max_in_flight_tokens(
        mnbt, async_scheduling=async_scheduling, pp=request.pp, vllm_version=request.vllm_version
    )
    return Scheduler(seqs, mnbt, in_flight, tuple(said))
