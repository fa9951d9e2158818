"""What ``vllm serve`` picks when it is not told: max_num_seqs and max_num_batched_tokens by GPU, per vLLM release.

One rule for every command: ``kvtool estimate``, ``kvtool simulate --serve`` and the API read these defaults from
:func:`serve_batch_defaults`, and each says which one it used (:attr:`BatchDefaults.reason`).  A rule that changes
between releases is one row of :data:`BATCH_DEFAULTS_RULES`, keyed by the first release it applies to and naming the
upstream function it is read from, so a new release is one row.
"""

from __future__ import annotations

import dataclasses

from kvtool.estimate.capacity import max_in_flight_tokens
from kvtool.estimate.gpu import AskedGpu
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.vllm_versions import NEWEST_RELEASE

_GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class BatchDefaultsRule:
    """``vllm serve``'s (OPENAI_API_SERVER's) scheduler defaults by device memory, for the releases from ``since``.

    A device of ``large_gpu_bytes`` or more takes ``large``; of ``mid_gpu_bytes`` or more, unless its name holds
    "a100", ``mid``; any other, and a device vLLM cannot query (memory 0), ``other``.  Each pair is
    (max_num_seqs, max_num_batched_tokens).
    """

    since: str  # the first vLLM release this row applies to
    source: str  # the upstream file and function the figures are read from
    large_gpu_bytes: int
    large: tuple[int, int]
    mid_gpu_bytes: int
    mid: tuple[int, int]
    other: tuple[int, int]


BATCH_DEFAULTS_RULES: tuple[BatchDefaultsRule, ...] = (
    # vllm/engine/arg_utils.py (0.32.0) EngineArgs.get_batch_defaults, applied by
    # _set_default_max_num_seqs_and_batched_tokens_args: >= 160 GiB (B200/B300) 1024 and 16384; >= 70 GiB and not
    # an A100 (H100, H200; PR #17885 keeps A100s low) 1024 and 8192; else, and when the device cannot be queried,
    # 256 and 2048 for OPENAI_API_SERVER.
    BatchDefaultsRule(
        since="0.32",
        source="vllm/engine/arg_utils.py: EngineArgs.get_batch_defaults",
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
    asked = _version_key(vllm_version)
    rows = [r for r in BATCH_DEFAULTS_RULES if _version_key(r.since) <= asked]
    return max(rows, key=lambda r: _version_key(r.since)) if rows else BATCH_DEFAULTS_RULES[0]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


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
    elif gpu_memory_bytes >= rule.large_gpu_bytes:
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
    in_flight = max_in_flight_tokens(mnbt, async_scheduling=request.async_scheduling, pp=request.pp)
    return Scheduler(seqs, mnbt, in_flight, tuple(said))
