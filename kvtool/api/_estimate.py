"""``kvtool.api.estimate``: the KV-cache size of a model and what fits on a GPU, as ``kvtool estimate`` computes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from kvtool.estimate.estimator import EstimateResult


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
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    kv_memory: str | int | None = None,
    gpu_memory_utilization: float | None = None,
    reserve: str | int | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    compare: bool = False,
    profiles: Sequence[str] = (),
) -> EstimateResult:
    """Exact KV-cache bytes for a model, and how many requests fit on a GPU the way vLLM counts it.

    The options are ``kvtool estimate``'s (docs/estimate.md), with the same defaults: ``model`` is a profile name
    (``kvtool models``), ``config`` a Hugging Face ``config.json`` or model folder, or give ``layers``,
    ``kv_heads`` and ``head_dim`` by hand.  ``seq_len`` and ``batch`` take one value or a sequence (a sweep);
    sizes (``gpu_memory``, ``kv_memory``, ``reserve``) take ``"80GiB"``, ``"10GB"`` or a number of bytes.

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
    from kvtool.estimate.estimator import EstimateRequest
    from kvtool.estimate.estimator import estimate as run_estimate

    request = EstimateRequest(
        model=model,
        config=config,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        heads=heads,
        hidden=hidden,
        dtype=dtype,
        seq_lens=_ints(seq_len),
        batches=_ints(batch),
        kv_dtype=kv_dtype,
        tp=tp,
        gpu=gpu,
        gpu_memory=_size(gpu_memory),
        kv_memory=_size(kv_memory),
        gpu_memory_utilization=gpu_memory_utilization,
        reserve=_size(reserve),
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        compare=compare,
        profile_dirs=tuple(profiles),
    )
    return run_estimate(request)
