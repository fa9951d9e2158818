"""Which model runner a vLLM release runs a model with, and what Model Runner V2 profiles differently.

vllm/config/vllm.py ``VllmConfig.use_v2_model_runner``: ``VLLM_USE_V2_MODEL_RUNNER`` (kvtool's ``--model-runner``)
decides when set; otherwise ``_is_default_v2_model_runner_model`` picks Model Runner V2
(vllm/v1/worker/gpu/model_runner.py) for some models and the V1 runner (vllm/v1/worker/gpu_model_runner.py) for the
rest.  :data:`MODEL_RUNNER_RULES` holds that default per release, read from config.json's ``architectures`` and
kvtool's MoE / quantized / hybrid reading of the model; :data:`V2_RESERVE_RULES` what V2's ``profile_run`` and
``profile_cudagraph_memory`` take from the KV budget where they differ from V1's (kvtool.estimate.reserve).  The
features that make V2 fall back to V1 (``_get_v2_model_runner_unsupported_features``: speculative methods, custom
logits processors, dual batch overlap ...) are none that kvtool models, so they are not read.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from kvtool.core.errors import UsageError
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

V1 = "V1"
V2 = "V2"
RUNNER_CHOICES = ("auto", "v1", "v2")  # --model-runner

# which models default to V2
NONE = "none"  # V1 unless VLLM_USE_V2_MODEL_RUNNER=1
LISTED = "listed"  # the listed architectures
LISTED_OR_DENSE = "listed or dense"  # the listed architectures, or any model without experts
ALL = "all"  # every model (on CUDA)


class ModelRunnerRule(NamedTuple):
    """Which models ``vllm serve`` runs with Model Runner V2 by default, for the releases from ``since``."""

    since: str
    source: str
    default_v2: str  # NONE, LISTED, LISTED_OR_DENSE or ALL
    architectures: frozenset[str] = frozenset()  # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
    dense_unquantized_only: bool = False  # a listed architecture only without experts and unquantized
    hybrid_v1: bool = False  # hybrid (Mamba / linear-attention) models stay on V1
    hybrid_listed_v2: bool = False  # ... unless their architecture is listed
    v2_exists: bool = True  # whether VLLM_USE_V2_MODEL_RUNNER=1 can force V2


_SOURCE = "vllm/config/vllm.py VllmConfig._is_default_v2_model_runner_model ({})"
_MOE_LISTED_0_25 = frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})
_MOE_LISTED_0_26 = _MOE_LISTED_0_25 | {
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "LongcatFlashNgramForCausalLM",
}
MODEL_RUNNER_RULES: tuple[ModelRunnerRule, ...] = (
    # no vllm/v1/worker/gpu/ package yet
    ModelRunnerRule(
        since="0.10.0",
        source="vllm/v1/worker/gpu_worker.py Worker.init_device (0.10.0)",
        default_v2=NONE,
        v2_exists=False,
    ),
    # Model Runner V2 ships, opt-in: VLLM_USE_V2_MODEL_RUNNER defaults to "0" (vllm/envs.py (0.12.0))
    ModelRunnerRule(since="0.12.0", source="vllm/v1/worker/gpu_worker.py Worker.init_device (0.12.0)", default_v2=NONE),
    # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = {"Qwen3ForCausalLM"}; "not model_config.is_moe and not
    # model_config.is_quantized"; hybrid/mamba models are an unsupported feature (V1)
    ModelRunnerRule(
        since="0.22.0",
        source=_SOURCE.format("0.22.0"),
        default_v2=LISTED,
        architectures=frozenset({"Qwen3ForCausalLM"}),
        dense_unquantized_only=True,
        hybrid_v1=True,
    ),
    ModelRunnerRule(
        since="0.23.0",
        source=_SOURCE.format("0.23.0"),
        default_v2=LISTED,
        architectures=frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
        dense_unquantized_only=True,
    ),
    # the list grows by three MoE architectures and the MoE / quantization condition is dropped
    ModelRunnerRule(
        since="0.24.0",
        source=_SOURCE.format("0.24.0"),
        default_v2=LISTED,
        architectures=frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}) | _MOE_LISTED_0_25,
    ),
    # "any(arch in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES ...) or not model_config.is_moe", not for is_hybrid or
    # is_attention_free models
    ModelRunnerRule(
        since="0.25.0",
        source=_SOURCE.format("0.25.0"),
        default_v2=LISTED_OR_DENSE,
        architectures=_MOE_LISTED_0_25,
        hybrid_v1=True,
    ),
    ModelRunnerRule(
        since="0.26.0",
        source=_SOURCE.format("0.26.0"),
        default_v2=LISTED_OR_DENSE,
        architectures=_MOE_LISTED_0_26,
        hybrid_v1=True,
    ),
    # a hybrid model whose architecture is listed goes to V2 as well
    ModelRunnerRule(
        since="0.27.0",
        source=_SOURCE.format("0.27.0"),
        default_v2=LISTED_OR_DENSE,
        architectures=_MOE_LISTED_0_26 | {"KimiK3ForConditionalGeneration"},
        hybrid_v1=True,
        hybrid_listed_v2=True,
    ),
    ModelRunnerRule(
        since="0.28.0",
        source=_SOURCE.format("0.28.0"),
        default_v2=LISTED_OR_DENSE,
        architectures=_MOE_LISTED_0_26 | {"KimiK3ForConditionalGeneration", "DeepseekV4ForCausalLM"},
        hybrid_v1=True,
        hybrid_listed_v2=True,
    ),
    # _is_default_v2_model_runner_model is gone: use_v2_model_runner returns True unless a feature is unsupported
    # (ROCm keeps a few architectures on V1; kvtool models CUDA GPUs)
    ModelRunnerRule(
        since="0.29.0",
        source="vllm/config/vllm.py VllmConfig.use_v2_model_runner (0.29.0)",
        default_v2=ALL,
    ),
)


@dataclasses.dataclass(frozen=True)
class RunnerChoice:
    """The model runner modelled, and why."""

    runner: str  # V1 or V2
    why: str  # in words, naming the rule's source


def _is_hybrid(spec: ModelSpec) -> bool:
    """vLLM's ``is_hybrid``: state (Mamba / linear-attention) layers beside attention."""
    return spec.mamba_state is not None or spec.state_layers > 0


def default_runner(spec: ModelSpec, vllm_version: str = NEWEST_RELEASE) -> RunnerChoice:
    """The runner ``vllm_version`` picks for ``spec`` when VLLM_USE_V2_MODEL_RUNNER is unset."""
    rule = pick(MODEL_RUNNER_RULES, vllm_version)
    listed = any(arch in rule.architectures for arch in spec.architectures)
    moe = bool(spec.num_experts)
    if rule.default_v2 == NONE:
        return RunnerChoice(V1, f"V1, vLLM {vllm_version}'s only default runner ({rule.source})")
    if rule.default_v2 == ALL:
        return RunnerChoice(V2, f"V2, vLLM {vllm_version}'s default for every model ({rule.source})")
    if _is_hybrid(spec) and rule.hybrid_v1 and not (listed and rule.hybrid_listed_v2):
        return RunnerChoice(V1, f"V1: a hybrid model stays on V1 in vLLM {vllm_version} ({rule.source})")
    names = ", ".join(spec.architectures) or "no architectures in the config"
    if rule.default_v2 == LISTED_OR_DENSE and not moe:
        return RunnerChoice(V2, f"V2: vLLM {vllm_version} runs every model without experts on V2 ({rule.source})")
    if not listed:
        return RunnerChoice(V1, f"V1: {names} is not one of vLLM {vllm_version}'s V2 architectures ({rule.source})")
    if rule.dense_unquantized_only and (moe or spec.weight_quant is not None):
        what = "has experts" if moe else "is quantized"
        return RunnerChoice(V1, f"V1: {names} {what}, which vLLM {vllm_version} keeps on V1 ({rule.source})")
    return RunnerChoice(V2, f"V2: {names} is one of vLLM {vllm_version}'s V2 architectures ({rule.source})")


def choose_runner(spec: ModelSpec, asked: str, vllm_version: str = NEWEST_RELEASE) -> RunnerChoice:
    """The runner for ``--model-runner`` ``asked`` (auto, v1, v2: VLLM_USE_V2_MODEL_RUNNER unset, 0, 1)."""
    if asked == "auto":
        return default_runner(spec, vllm_version)
    if asked == "v1":
        return RunnerChoice(V1, "V1 (--model-runner v1, VLLM_USE_V2_MODEL_RUNNER=0)")
    if asked == "v2":
        if not pick(MODEL_RUNNER_RULES, vllm_version).v2_exists:
            first = next(r.since for r in MODEL_RUNNER_RULES if r.v2_exists)
            raise UsageError(
                f"vLLM {vllm_version} has no Model Runner V2 (it ships from {first})",
                where="--model-runner",
                tip=f"use --model-runner v1, or --vllm-version {first} or later",
            )
        return RunnerChoice(V2, "V2 (--model-runner v2, VLLM_USE_V2_MODEL_RUNNER=1)")
    raise UsageError(
        f"--model-runner takes {', '.join(RUNNER_CHOICES)}, not {asked!r}",
        where="--model-runner",
    )


class V2ReserveRule(NamedTuple):
    """What Model Runner V2's profiling takes from the KV budget, for the releases from ``since``."""

    since: str
    source: str
    sampler_fp32_pipeline: bool  # False: the dummy batch is greedy and unprocessed (logits in the model dtype only)
    cudagraphs_estimated: bool  # False: profile_cudagraph_memory returns 0
    how: str


# gumbel_sample's per-block partial results: local_argmax (int64) + local_max (float32) per 1024 logits
# (vllm/v1/worker/gpu/sample/gumbel.py gumbel_sample, BLOCK_SIZE = 1024)
GUMBEL_BYTES_PER_LOGIT = (8 + 4) / 1024
V2_RESERVE_RULES: tuple[V2ReserveRule, ...] = (
    # _dummy_sampler_run: compute_logits (model dtype) then the sampler on InputBatch.make_dummy, whose requests were
    # never added: SamplingStates' temperature is 0 (UvaBackedTensor zeros), top_k = vocab, top_p = 1, no logprobs.
    # Sampler._requires_logits_processing is False, so no float32 copy; get_top_k_top_p gives (None, None), so no
    # top-k/top-p and no FlashInfer (greedy); gumbel_sample allocates only its per-block partials.  Peak: the logits
    # (model dtype) + GUMBEL_BYTES_PER_LOGIT.  profile_cudagraph_memory "return 0" ("It is TBD whether we keep this
    # API or not"), so no graph memory is taken from the budget even where V1 subtracts it (0.20+).
    V2ReserveRule(
        since="0.12.0",
        source="vllm/v1/worker/gpu/model_runner.py GPUModelRunner._dummy_sampler_run, profile_cudagraph_memory "
        "(0.27.1)",
        sampler_fp32_pipeline=False,
        cudagraphs_estimated=False,
        how="greedy unprocessed dummy batch (the sampler skips top-k/top-p and logprobs)",
    ),
    # profile_cudagraph_memory -> cudagraph_utils.profile_cudagraph_memory: captures the PIECEWISE graphs and a few
    # FULL ones into a throwaway pool and extrapolates the FULL total, the measurement V1's estimate makes
    # (gpu_model_runner.py profile_cudagraph_memory); modelled with V1's CUDA-graph rule
    V2ReserveRule(
        since="0.29.0",
        source="vllm/v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory (0.29.0)",
        sampler_fp32_pipeline=False,
        cudagraphs_estimated=True,
        how="greedy unprocessed dummy batch (the sampler skips top-k/top-p and logprobs)",
    ),
    # _dummy_sampler_run runs the sampler a second time with SamplingParams.for_sampler_warmup (temperature, top-k,
    # top-p, min-p, penalties, logprobs): "warmup_kernels ... pays for the fp32 logits pipeline, so the profiled
    # peak must too": the float32 copy, in-place processing and the top-k/top-p kernel, as V1's sampler does; modelled
    # with V1's sampler figure
    V2ReserveRule(
        since="0.33.0",
        source="vllm/v1/worker/gpu/model_runner.py GPUModelRunner._dummy_sampler_run (0.33.0)",
        sampler_fp32_pipeline=True,
        cudagraphs_estimated=True,
        how="warm-up sampling parameters (float32 top-k/top-p pipeline)",
    ),
)
