"""What vLLM keeps out of the KV cache besides the weights, term by term, as each release profiles it.

vllm/v1/worker/gpu_worker.py ``determine_available_memory``::

    available_kv = requested_memory - non_kv_cache_memory [- cudagraph_memory_estimate, since 0.20.0]
    non_kv_cache_memory = weights + torch activation peak of profile_run() + non-torch increase

(vllm/utils/mem_utils.py ``memory_profiling``; since 0.27.0 it measures the same sum as the free-memory drop plus the
transient torch peak, which kvtool models with the same terms).  ``profile_run`` runs one dummy forward of
``max_num_batched_tokens`` tokens and then the sampler on ``min(max_num_batched_tokens, max_num_seqs)`` requests
(gpu_model_runner.py ``_dummy_run``, ``_dummy_sampler_run``) on the full vocabulary, on every TP rank (the sampler does
not shrink with TP); the peak is the larger of the two, since the forward's activations are freed before the sampler
runs.  What changes between releases is one row of a table below, looked up with :func:`vllm_versions.pick`:

- :data:`SAMPLER_RULES`: the sampler's bytes per logit (a torch sort before 0.17.0; Triton's in-place top-k/top-p
  kernel since).
- :data:`NON_TORCH_RULES`: memory outside torch's allocator (cuBLAS workspaces; NCCL and custom all-reduce at TP > 1).
- :data:`CUDAGRAPH_RULES`: whether the CUDA-graph pool is taken from the KV budget (0.20.0 on), and its size.

The fitted coefficients come from benchmarks/fit_reserve.py (docs/estimate.md, "The reserve").  Multimodal encoder
profiling (profile_run's encoder-cache dummy batch) enters the activation term through
:class:`kvtool.estimate.multimodal.EncoderPlan`.

Not modelled: a drafter's share of the activation peak.  With --speculative-config, ``_dummy_run`` also calls
``self.drafter.dummy_run(num_tokens, ...)`` after the target's forward (gpu_model_runner.py 0.19.0-0.33.0; a DFlash
drafter's runs ``precompute_and_store_context_kv`` on all ``max_num_batched_tokens`` context states, a fused K/V GEMM
of num_layers x 2 x kv_size columns and its layer-major copy, vllm/v1/spec_decode/dflash.py), and
``_dummy_sampler_run`` adds the rejection sampler on one draft token a request (``SpecDecodeMetadata.make_dummy``:
logits of 2 x num_reqs rows x vocab; from 0.22.0 also ``draft_probs``, num_reqs x vocab fp32, for probabilistic draft
sampling).  None of the public logs in
tests/data/gpu-logs with a drafter prints a torch peak, activation or non-torch figure (no DEBUG profile line, no
--kv-cache-memory suggestion), so there is no figure to check a model of it against; the drafter's weights are
counted (kvtool.estimate.spec_decode), its activations are not.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from kvtool.estimate.dtypes import model_dtype_bytes
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.model_runner import GUMBEL_BYTES_PER_LOGIT, V1, V2_RESERVE_RULES
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

if TYPE_CHECKING:
    from kvtool.estimate.multimodal import EncoderPlan

GIB = 1024**3


class SamplerRule(NamedTuple):
    """The profiling run's sampler peak per logit (requests x vocabulary), for the releases from ``since``."""

    since: str  # the first vLLM release this row applies to
    source: str  # "vllm/<path> <function> (X.Y.Z)"
    bytes_per_logit: float  # at triton_min_requests requests or more (all requests when that is None)
    sort_bytes_per_logit: float  # below triton_min_requests: the torch-sort path
    triton_min_requests: int | None  # None: no Triton path, always the sort
    how: str  # the path, in words
    # bytes per (batched token x hidden) still alive while the sampler runs: the dummy forward's output hidden
    # states and residual (2 x model dtype); 0 where the fitted per-logit figure absorbs them
    resident_hidden_dtype_copies: int = 0


# The torch-sort figure is fitted by benchmarks/fit_reserve.py (least squares through the origin) on the fitting
# half's vLLM 0.11 H100 DEBUG tables at 1024 requests: gpt-oss-120b-h100 (7.38 GiB / 201,088 vocab),
# llama-3.1-8b-h100 (4.76 GiB / 128,256) and qwen3-32b-h100-tp2 (5.64 GiB / 151,936).  Held out: gpt-oss-20b-h100,
# qwen3-0.6b-h100 and qwen3-32b-h100-tp1 log 38.5, 38.4 and 38.9 B; qwen3-235b-a22b-fp8-l40s-tp8-v0.10.2's 0.10.2
# suggestion line 1.40 GiB at 256 requests x 151,936 = 38.6 B.
_SORT_BYTES_PER_LOGIT = 38.6
# Fitted by benchmarks/fit_reserve.py (least squares through the origin of the logged torch peak less the resident
# hidden states and the MoE workspace, over requests x vocabulary) on the fitting half's vLLM 0.19.0 H100 DEBUG logs;
# the held-out half's error is in docs/estimate.md ("The reserve").
_TRITON_BYTES_PER_LOGIT = 14.3
SAMPLER_RULES: tuple[SamplerRule, ...] = (
    # apply_top_k_top_p_pytorch: logits.sort (float32 values + int64 indices), the top-k gather, softmax and cumsum
    # of the sorted values, the top-p mask and the scatter back, beside the model-dtype and float32 logits
    SamplerRule(
        since="0.10.0",
        source="vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (0.10.0)",
        bytes_per_logit=_SORT_BYTES_PER_LOGIT,
        sort_bytes_per_logit=_SORT_BYTES_PER_LOGIT,
        triton_min_requests=None,
        how="torch-sort top-k/top-p",
    ),
    # logits.shape[0] >= 8 takes apply_top_k_top_p_triton, which masks the float32 logits in place: what stays alive
    # is the model-dtype logits, their float32 copy (Sampler.forward), the softmax probs and random_sample's
    # exponential q, about 14 B per logit by the source, beside the dummy forward's hidden states and residual
    # (2 x tokens x hidden x model dtype).  The per-logit figure is fitted by benchmarks/fit_reserve.py on the
    # fitting half's vLLM 0.19.0 H100 DEBUG logs (llm-d-planner sweep): see _TRITON_BYTES_PER_LOGIT.
    SamplerRule(
        since="0.17.0",
        source="vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (0.17.0)",
        bytes_per_logit=_TRITON_BYTES_PER_LOGIT,
        sort_bytes_per_logit=_SORT_BYTES_PER_LOGIT,
        triton_min_requests=8,
        how="Triton in-place top-k/top-p",
        resident_hidden_dtype_copies=2,
    ),
    # the small-batch sort path is gone: Triton at any batch
    SamplerRule(
        since="0.30.0",
        source="vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (0.30.0)",
        bytes_per_logit=_TRITON_BYTES_PER_LOGIT,
        sort_bytes_per_logit=_TRITON_BYTES_PER_LOGIT,
        triton_min_requests=None,
        how="Triton in-place top-k/top-p",
        resident_hidden_dtype_copies=2,
    ),
)


class MoeWorkspaceRule(NamedTuple):
    """Whether the fused-MoE scratch buffers of the profiling forward stay allocated (and so count in the torch
    peak), for the releases from ``since``."""

    since: str
    source: str
    persistent: bool


MOE_WORKSPACE_RULES: tuple[MoeWorkspaceRule, ...] = (
    # each fused_experts call allocates and frees its intermediate caches (torch.empty in fused_moe.py)
    MoeWorkspaceRule(
        since="0.10.0",
        source="vllm/model_executor/layers/fused_moe/modular_kernel.py FusedMoEModularKernel.forward (0.10.0)",
        persistent=False,
    ),
    # the WorkspaceManager keeps the largest workspace13 + workspace2 ever asked for (get_simultaneous), so the
    # profiling forward's MoE scratch stays allocated through the sampler run
    MoeWorkspaceRule(
        since="0.13.0",
        source="vllm/v1/worker/workspace.py WorkspaceManager; modular_kernel.py _allocate_buffers (0.13.0)",
        persistent=True,
    ),
)


def moe_workspace_bytes(spec: ModelSpec, tokens: int, tp: int, vllm_version: str = NEWEST_RELEASE) -> int:
    """The fused-MoE workspace the profiling forward of ``tokens`` tokens leaves allocated (0 without experts, or
    before the release that keeps it).

    TritonExperts.workspace_shapes (fused_moe.py): workspace13 (M, topk, max(N / 2, K)) shared with the output
    (M, K), workspace2 (M, topk, max(N, K)), N = 2 x moe_intermediate_size / TP (gate and up), K = hidden, in the
    activation dtype.  gpt-oss's MXFP4 experts (OAITritonExperts, gpt_oss_triton_kernels_moe.py) ask only for the
    output (M, K) and workspace2 (M x topk, N / 2).
    """
    if not (spec.num_experts and spec.moe_intermediate_size and spec.hidden_size):
        return 0
    if not pick(MOE_WORKSPACE_RULES, vllm_version).persistent:
        return 0
    topk = spec.num_experts_per_tok or 1
    n = 2 * spec.moe_intermediate_size // tp
    k = spec.hidden_size
    if spec.model_type == "gpt_oss":
        elements = tokens * k + tokens * topk * (n // 2)
    else:
        elements = tokens * topk * (max(n // 2, k) + max(n, k))
    return elements * model_dtype_bytes(spec.dtype)


class NonTorchRule(NamedTuple):
    """Memory vLLM's profiler counts outside torch's allocator, for the releases from ``since``."""

    since: str
    source: str
    tp1_bytes: int  # one GPU: cuBLAS/cuDNN workspaces
    tp_bytes: int  # TP > 1: plus NCCL communicators and custom all-reduce buffers
    pp_only_bytes: int | None = None  # TP 1 x PP > 1 (no all-reduce buffers); None: as tp_bytes


# (TP 1, TP > 1, PP only) GiB, fitted by benchmarks/fit_reserve.py on the fitting half's vLLM 0.19.0 DEBUG logs
_NON_TORCH_0_19 = (0.25, 2.07, 0.07)
NON_TORCH_RULES: tuple[NonTorchRule, ...] = (
    # fitted by benchmarks/fit_reserve.py (medians) on the fitting half's logged non-torch figures: TP 1 the vLLM
    # 0.11 H100 tables of gpt-oss-120b, Llama-3.1-8B and Mistral-Small-3.2 (0.13, 0.13, 0.14 GiB); TP > 1 the one
    # fitting case, qwen3-32b-h100-tp2 (0.54 GiB at TP 2 over NVLink: NCCL plus custom all-reduce buffers).  The
    # held-out qwen3-235b-a22b-fp8-l40s-tp8-v0.10.2 logs 0.21 GiB at TP 8 on PCIe L40S (custom all-reduce off):
    # 0.33 GiB less, which one TP > 1 figure cannot tell apart.
    NonTorchRule(
        since="0.10.0",
        source="vllm/utils/__init__.py memory_profiling (0.10.0)",
        tp1_bytes=int(0.13 * GIB),
        tp_bytes=int(0.55 * GIB),
    ),
    # the vLLM 0.19.0 H100 DEBUG logs (llm-d-planner sweep) log 0.25-0.27 GiB at TP 1, 2.07-2.17 GiB at TP 2-4
    # (NCCL, custom all-reduce and symmetric-memory buffers) and 0.07 GiB at PP 2 alone; medians of the fitting half
    # (benchmarks/fit_reserve.py).  No DEBUG log between 0.11 and 0.19 is at hand, so the row starts at the first
    # release whose logs show the change.
    NonTorchRule(
        since="0.19.0",
        source="vllm/utils/mem_utils.py memory_profiling (0.19.0)",
        tp1_bytes=int(_NON_TORCH_0_19[0] * GIB),
        tp_bytes=int(_NON_TORCH_0_19[1] * GIB),
        pp_only_bytes=int(_NON_TORCH_0_19[2] * GIB),
    ),
)


class CudagraphRule(NamedTuple):
    """Whether the KV budget loses the CUDA-graph pool, for the releases from ``since``."""

    since: str
    source: str
    subtracted: bool  # False: graphs are captured after the KV cache is sized, out of the headroom
    estimate_bytes: int  # the pool modelled when subtracted: a dense model on one GPU at 512 capture sizes
    how: str
    moe_estimate_bytes: int = 0  # the same for a model with routed experts
    multi_gpu_estimate_bytes: int = 0  # at TP > 1 (the all-reduce inside each graph)
    # the share of the pool that does not scale with the largest capture size min(2 x max_num_seqs, 512)
    # (vllm/config/vllm.py _set_cudagraph_sizes)
    fixed_share: float = 1.0


# (dense TP 1, MoE TP 1, TP > 1) GiB at 512 capture sizes, fitted by benchmarks/fit_reserve.py
_CUDAGRAPH_ESTIMATE = (0.84, 1.39, 0.59)
CUDAGRAPH_RULES: tuple[CudagraphRule, ...] = (
    # the KV budget is requested - non_kv_cache_memory; compile_or_warm_up_model captures the graphs afterwards and
    # logs "Graph capturing finished in N secs, took X GiB" apart (0.10.2's --kv-cache-memory suggestion names it)
    CudagraphRule(
        since="0.10.0",
        source="vllm/v1/worker/gpu_worker.py determine_available_memory (0.10.0)",
        subtracted=False,
        estimate_bytes=0,
        how="not subtracted",
    ),
    # profile_cudagraph_memory estimates the pool, subtracted only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1,
    # whose default is "0" (vllm/envs.py (0.18.0))
    CudagraphRule(
        since="0.18.0",
        source="vllm/v1/worker/gpu_worker.py determine_available_memory (0.18.0)",
        subtracted=False,
        estimate_bytes=0,
        how="estimated, not subtracted (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 by default)",
    ),
    # the env default turns "1" (vllm/envs.py (0.20.0)).  The pool sizes are the medians of the "estimated CUDA graph
    # memory" that the fitting half's vLLM 0.19.0 H100 DEBUG logs print (it is estimated there, not subtracted) at
    # max_num_seqs 1024 (capture sizes up to 512): dense TP 1, MoE TP 1, TP > 1 (benchmarks/fit_reserve.py);
    # the fixed share from gemma-4-31b-kaggle-v0.23.0 (max_num_seqs 20: 0.13 GiB against a dense model's 0.84).
    CudagraphRule(
        since="0.20.0",
        source="vllm/v1/worker/gpu_worker.py determine_available_memory (0.20.0)",
        subtracted=True,
        estimate_bytes=int(_CUDAGRAPH_ESTIMATE[0] * GIB),
        how="subtracted (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default)",
        moe_estimate_bytes=int(_CUDAGRAPH_ESTIMATE[1] * GIB),
        multi_gpu_estimate_bytes=int(_CUDAGRAPH_ESTIMATE[2] * GIB),
        fixed_share=0.1,
    ),
)


def cudagraph_estimate_bytes(spec: ModelSpec, tp: int, max_num_seqs: int, rule: CudagraphRule) -> int:
    """The CUDA-graph pool ``rule`` takes from the KV budget for this model, TP and max_num_seqs."""
    if not rule.subtracted:
        return 0
    if tp > 1:
        full = rule.multi_gpu_estimate_bytes
    elif spec.num_experts:
        full = rule.moe_estimate_bytes
    else:
        full = rule.estimate_bytes
    capture = min(2 * max_num_seqs, 512) / 512
    return int(full * (rule.fixed_share + (1 - rule.fixed_share) * capture))


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
    cudagraph_bytes: int  # CUDA-graph pool taken from the KV budget (0 before vLLM 0.20 and with --enforce-eager)
    total_bytes: int
    forward_bytes: int  # the forward pass of max_num_batched_tokens tokens (modelled)
    sampler_bytes: int  # the sampler on min(tokens, max_num_seqs) requests (modelled)
    max_num_seqs: int
    method: str  # how each term was obtained, in words
    vllm_version: str = NEWEST_RELEASE  # the release whose rules were applied
    model_runner: str = V1  # the vLLM model runner whose profile_run was modelled (kvtool.estimate.model_runner)
    encoder_activation_bytes: int = 0  # of activation_bytes: what the multimodal encoder's profiling adds


def _forward_bytes(spec: ModelSpec, tokens: int, tp: int) -> int:
    """The largest transient of one layer's forward over ``tokens`` tokens: MLP in and out, residual stream."""
    hidden = spec.hidden_size or 0
    if spec.num_experts and spec.moe_intermediate_size:
        inter = spec.moe_intermediate_size * (spec.num_experts_per_tok or 1)
    else:
        inter = spec.intermediate_size or 4 * hidden
    width = 3 * inter // tp + 4 * hidden  # gate_up (2x), activation out (1x), residual + norm copies
    return tokens * width * model_dtype_bytes(spec.dtype)


def sampler_bytes_per_logit(requests: int, vllm_version: str = NEWEST_RELEASE) -> tuple[float, str]:
    """The sampler's profiled bytes per logit for a dummy batch of ``requests`` under ``vllm_version``, and the
    path it takes in words."""
    rule = pick(SAMPLER_RULES, vllm_version)
    if rule.triton_min_requests is not None and requests < rule.triton_min_requests:
        return rule.sort_bytes_per_logit, f"torch-sort top-k/top-p below {rule.triton_min_requests} requests"
    return rule.bytes_per_logit, rule.how


def non_torch_bytes(tp: int, pp: int = 1, vllm_version: str = NEWEST_RELEASE) -> int:
    """Non-torch memory per GPU at ``tp`` x ``pp`` under ``vllm_version``."""
    rule = pick(NON_TORCH_RULES, vllm_version)
    if tp * pp == 1:
        return rule.tp1_bytes
    if tp == 1 and rule.pp_only_bytes is not None:
        return rule.pp_only_bytes
    return rule.tp_bytes


def _v2_sampler_bytes_per_logit(spec: ModelSpec, requests: int, vllm_version: str) -> tuple[float, str]:
    """Model Runner V2's sampler peak per logit in its profiling run (kvtool.estimate.model_runner.V2_RESERVE_RULES):
    the model-dtype logits and gumbel_sample's partials, or V1's figure where the float32 pipeline runs too."""
    rule = pick(V2_RESERVE_RULES, vllm_version)
    if rule.sampler_fp32_pipeline:
        per_logit, _ = sampler_bytes_per_logit(requests, vllm_version)
        return per_logit, rule.how
    return model_dtype_bytes(spec.dtype) + GUMBEL_BYTES_PER_LOGIT, rule.how


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
    vllm_version: str = NEWEST_RELEASE,
    model_runner: str = V1,
    encoder: EncoderPlan | None = None,
) -> Reserve:
    """The reserve per GPU as ``vllm_version`` profiles it with ``model_runner`` (V1 or V2), each term modelled
    unless overridden (only the last pipeline stage samples)."""
    forward = _forward_bytes(spec, max_num_batched_tokens, tp)
    requests = min(max_num_batched_tokens, max_num_seqs)
    vocab = spec.vocab_size or 32_000
    if model_runner == V1:
        per_logit, path = sampler_bytes_per_logit(requests, vllm_version)
    else:
        per_logit, path = _v2_sampler_bytes_per_logit(spec, requests, vllm_version)
    # both runners keep the dummy forward's hidden states alive through the sampler run
    copies = pick(SAMPLER_RULES, vllm_version).resident_hidden_dtype_copies
    resident = copies * max_num_batched_tokens * (spec.hidden_size or 0) * model_dtype_bytes(spec.dtype)
    workspace = moe_workspace_bytes(spec, max_num_batched_tokens, tp, vllm_version)
    sampler = int(per_logit * requests * vocab) + resident if last_stage else 0
    said: list[str] = []
    if overrides.total_bytes is not None:
        return Reserve(
            0,
            0,
            0,
            overrides.total_bytes,
            forward,
            sampler,
            max_num_seqs,
            "--reserve (all terms)",
            vllm_version,
            model_runner,
        )
    activation = overrides.activation_bytes
    encoder_term = 0
    if activation is None:
        activation = max(forward, sampler) + workspace
        if encoder is not None and encoder.profiled:  # kvtool.estimate.multimodal: the encoder ran first
            encoder_term = max(0, encoder.transient_bytes - max(forward, sampler)) + encoder.resident_bytes
            activation += encoder_term
        said.append(
            f"activation = max(forward of {max_num_batched_tokens:,} tokens, sampler on {requests:,} requests "
            f"x {vocab:,} vocab x {per_logit:g} B, {path}"
            + (f", + {copies} resident hidden-state copies" if copies and last_stage else "")
            + ")"
            + (f" + MoE workspace {workspace / GIB:.2f} GiB" if workspace else "")
        )
    non_torch = overrides.non_torch_bytes
    if non_torch is None:
        non_torch = non_torch_bytes(tp, pp, vllm_version)
        said.append(f"non-torch {non_torch / GIB:.2f} GiB at TP {tp}" + (f" x PP {pp}" if pp > 1 else ""))
    graphs = overrides.cudagraph_bytes
    if graphs is None:
        graphs = _modelled_graphs(spec, tp, max_num_seqs, enforce_eager, vllm_version, model_runner, said)
    if encoder is not None and encoder_term:
        said.append(
            f"+ encoder profiling: max with its transient {encoder.transient_bytes / GIB:.2f} GiB, + "
            f"{encoder.resident_bytes / GIB:.2f} GiB of dummy images and encoder outputs resident"
        )
    method = "; ".join(said) if said else "all terms given"
    return Reserve(
        activation,
        non_torch,
        graphs,
        activation + non_torch + graphs,
        forward,
        sampler,
        max_num_seqs,
        method,
        vllm_version,
        model_runner,
        encoder_term,
    )


def _modelled_graphs(
    spec: ModelSpec,
    tp: int,
    max_num_seqs: int,
    enforce_eager: bool,
    vllm_version: str,
    model_runner: str,
    said: list[str],
) -> int:
    """The CUDA-graph pool taken from the budget, its words appended to ``said``."""
    rule = pick(CUDAGRAPH_RULES, vllm_version)
    if enforce_eager:
        said.append("no CUDA graphs (--enforce-eager)")
        return 0
    if model_runner != V1 and not pick(V2_RESERVE_RULES, vllm_version).cudagraphs_estimated:
        said.append(f"CUDA graphs not subtracted (Model Runner V2's profile_cudagraph_memory is 0 in {vllm_version})")
        return 0
    if not rule.subtracted:
        said.append(f"CUDA graphs {rule.how} by vLLM {vllm_version}")
        return 0
    graphs = cudagraph_estimate_bytes(spec, tp, max_num_seqs, rule)
    said.append(f"CUDA graphs {graphs / GIB:.2f} GiB {rule.how}")
    return graphs
