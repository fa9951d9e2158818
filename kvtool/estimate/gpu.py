"""The GPU of a request: --gpu (a profile) or --gpu-memory (a size), after refusing combinations vLLM would ignore,
and the block sizes its attention backends take."""

from __future__ import annotations

import dataclasses

from kvtool.core.errors import UsageError
from kvtool.core.units import GIB, parse_size
from kvtool.estimate.request import EstimateRequest


@dataclasses.dataclass(frozen=True)
class AskedGpu:
    """The GPU asked with --gpu or --gpu-memory: what the driver reports, and its profile name."""

    memory_bytes: int
    name: str | None


def implausible_size(text: str, size: int, option: str, floor: int) -> None:
    """``--gpu-memory 80`` is 80 bytes: say so, with the likely intent."""
    if size < floor:
        bare = str(text).strip()
        guess = f"{bare}GiB" if bare.replace(".", "", 1).isdigit() else "a size such as 80GiB"
        raise UsageError(
            f"{option} {bare} is {size:,} bytes, too small for {'a GPU' if option == '--gpu-memory' else 'a KV cache'}",
            where=option,
            tip=f"did you mean {guess}? (plain numbers are bytes; units: GiB, GB, MiB)",
        )


def asked_gpu(request: EstimateRequest) -> AskedGpu | None:
    """The GPU of --gpu / --gpu-memory, after refusing option combinations vLLM would ignore."""
    given = (("--reserve", request.reserve), ("--gpu-memory-utilization", request.gpu_memory_utilization))
    gpu_only = [option for option, value in given if value is not None]  # options that size a GPU budget only
    if request.kv_memory is not None:
        if gpu_only:  # vLLM too ignores gpu_memory_utilization once kv_cache_memory_bytes is set
            raise UsageError(
                f"{' and '.join(gpu_only)} would be ignored: --kv-memory is the KV budget itself",
                where=gpu_only[0],
                tip="drop it, or give --gpu/--gpu-memory instead of --kv-memory",
            )
        if not (request.gpu or request.gpu_memory):
            return None
        # as vllm serve --kv-cache-memory-bytes on a GPU: the budget is the bytes given, the GPU still picks the
        # scheduler defaults (max_num_seqs, max_num_batched_tokens) and the attention backends' block sizes
    if request.gpu and request.gpu_memory:
        raise UsageError("give --gpu or --gpu-memory, not both", where="--gpu")
    if not (request.gpu or request.gpu_memory):
        if gpu_only:
            raise UsageError(
                f"{' and '.join(gpu_only)} would be ignored without a GPU",
                where=gpu_only[0],
                tip="add --gpu NAME or --gpu-memory SIZE",
            )
        return None
    if request.gpu:
        from kvtool.estimate.profiles import find_gpu

        profile = find_gpu(request.gpu, request.profile_dirs)
        return AskedGpu(profile.memory_bytes, profile.name)
    text = str(request.gpu_memory)
    memory = parse_size(text, option="--gpu-memory")
    implausible_size(text, memory, "--gpu-memory", GIB // 4)
    return AskedGpu(memory, None)


def check_block_size(block_size: int, gpu: AskedGpu | None) -> None:
    """Refuse a block size vLLM's GPU attention backends refuse.

    vLLM 0.32's CUDA backends declare their kernel block sizes: FlashAttention ``MultipleOf(16)``, FlashInfer 16, 32
    or 64 (vllm/v1/attention/backends, ``get_supported_kernel_block_sizes``); no backend takes other sizes.
    """
    if gpu is not None and block_size % 16:
        raise UsageError(
            f"--block-size {block_size} is refused by vLLM's GPU attention backends (FlashAttention needs a multiple "
            "of 16)",
            where="--block-size",
            tip="use 16 (vLLM's default), 32, 64 or 128",
        )
