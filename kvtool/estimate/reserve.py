"""What vLLM keeps out of the KV cache besides the weights, term by term (vLLM 0.32's memory profiler).

vllm/v1/worker/gpu_worker.py ``determine_available_memory`` (0.32)::

    available_kv = requested_memory - non_kv_cache_memory - cudagraph_memory_estimate
    non_kv_cache_memory = weights + torch activation peak of profile_run() + non-torch increase

``profile_run`` runs one dummy forward of ``max_num_batched_tokens`` tokens and then the sampler on
``min(max_num_batched_tokens, max_num_seqs)`` requests (gpu_model_runner.py ``_dummy_run``, ``_dummy_sampler_run``);
the peak is the larger of the two, since the forward's activations are freed before the sampler runs.  CUDA-graph
memory is subtracted since vLLM 0.21 (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``, the default); with
``--enforce-eager`` there are no graphs.

The coefficients are fitted to public logs (docs/estimate.md, "The reserve"): vLLM 0.11 on an H100 with
VLLM_LOGGING_LEVEL=DEBUG, max_num_batched_tokens 8192 and max_num_seqs 1024 (``vllm serve``'s defaults there) logs
the activation peak of Qwen3-0.6B, Qwen3-32B, Llama-3.1-8B and gpt-oss-20b/120b at 38.0-39.5 bytes per sampler
logit (requests x vocabulary), the sampler's float32 logits, sort values, int64 sort indices, softmax and top-p
mask; non-torch memory at 0.13 GiB at TP 1 and 0.55 GiB at TP 2 (NCCL and custom all-reduce buffers).
"""

from __future__ import annotations

import dataclasses

from kvtool.estimate.dtypes import model_dtype_bytes
from kvtool.estimate.hf_config import ModelSpec

GIB = 1024**3
SAMPLER_BYTES_PER_LOGIT = 38.7  # fitted: 4.76 GiB / (1024 x 128,256) for Llama-3.1-8B, 7.38 GiB for gpt-oss
NON_TORCH_TP1_BYTES = int(0.13 * GIB)  # cuBLAS/cuDNN workspaces allocated outside torch's allocator
NON_TORCH_TP_BYTES = int(0.55 * GIB)  # plus NCCL and custom all-reduce buffers once TP >= 2
CUDAGRAPH_BYTES = int(0.5 * GIB)  # vLLM's estimate of the graph pool: 0.1-1.0 GiB in public logs


@dataclasses.dataclass(frozen=True)
class ReserveOverrides:
    """Terms the user set (bytes); None: modelled."""

    total_bytes: int | None = None  # --reserve: all three terms at once
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cudagraph_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Reserve:
    """Per-GPU memory vLLM keeps out of the KV cache besides the weights."""

    activation_bytes: int  # torch peak of profile_run: max(forward, sampler)
    non_torch_bytes: int  # NCCL / cuBLAS memory outside torch's allocator
    cudagraph_bytes: int  # CUDA-graph pool vLLM 0.32 subtracts (0 with --enforce-eager)
    total_bytes: int
    forward_bytes: int  # the forward pass of max_num_batched_tokens tokens (modelled)
    sampler_bytes: int  # the sampler on min(tokens, max_num_seqs) requests (modelled)
    max_num_seqs: int
    method: str  # how each term was obtained, in words


def _forward_bytes(spec: ModelSpec, tokens: int, tp: int) -> int:
    """The largest transient of one layer's forward over ``tokens`` tokens: MLP in and out, residual stream."""
    hidden = spec.hidden_size or 0
    if spec.num_experts and spec.moe_intermediate_size:
        inter = spec.moe_intermediate_size * (spec.num_experts_per_tok or 1)
    else:
        inter = spec.intermediate_size or 4 * hidden
    width = 3 * inter // tp + 4 * hidden  # gate_up (2x), activation out (1x), residual + norm copies
    return tokens * width * model_dtype_bytes(spec.dtype)


def model_reserve(
    spec: ModelSpec,
    *,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    enforce_eager: bool = False,
    overrides: ReserveOverrides = ReserveOverrides(),
    pp: int = 1,
    last_stage: bool = True,
) -> Reserve:
    """The reserve per GPU, each term modelled unless overridden (only the last pipeline stage samples)."""
    forward = _forward_bytes(spec, max_num_batched_tokens, tp)
    requests = min(max_num_batched_tokens, max_num_seqs)
    sampler = int(SAMPLER_BYTES_PER_LOGIT * requests * (spec.vocab_size or 32_000)) if last_stage else 0
    said: list[str] = []
    if overrides.total_bytes is not None:
        return Reserve(0, 0, 0, overrides.total_bytes, forward, sampler, max_num_seqs, "--reserve (all terms)")
    activation = overrides.activation_bytes
    if activation is None:
        activation = max(forward, sampler)
        said.append(
            f"activation = max(forward of {max_num_batched_tokens:,} tokens, sampler on {requests:,} requests "
            f"x {spec.vocab_size or 32_000:,} vocab x {SAMPLER_BYTES_PER_LOGIT} B)"
        )
    non_torch = overrides.non_torch_bytes
    if non_torch is None:
        non_torch = NON_TORCH_TP1_BYTES if tp * pp == 1 else NON_TORCH_TP_BYTES
        said.append(f"non-torch {non_torch / GIB:.2f} GiB at TP {tp}" + (f" x PP {pp}" if pp > 1 else ""))
    graphs = overrides.cudagraph_bytes
    if graphs is None:
        graphs = 0 if enforce_eager else CUDAGRAPH_BYTES
        said.append("no CUDA graphs (--enforce-eager)" if enforce_eager else "CUDA graphs 0.50 GiB")
    method = "; ".join(said) if said else "all terms given"
    return Reserve(
        activation, non_torch, graphs, activation + non_torch + graphs, forward, sampler, max_num_seqs, method
    )
