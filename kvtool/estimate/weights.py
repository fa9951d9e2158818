"""Weight parameters and bytes estimated from a config (dense, MoE, MLA, tied embeddings, FP8 block weights).

Counts the matrices of a Llama-style decoder: embeddings (and an untied LM head), per layer the attention
projections (q, k, v, o; or MLA's q/kv low-rank projections), the MLP (gated: 3 x hidden x intermediate;
Falcon: 2 x hidden x 4 hidden; MoE: every expert, shared experts and the router) and the norms.  In hybrid models
whose layers each hold attention or a state mixer (Granite-4.0-H, Qwen3-Next), a Mamba-2 or Gated DeltaNet layer
counts its own projections instead of attention's (vLLM's MambaMixer2 and Qwen3NextGatedDeltaNet).  Biases other
than Qwen2's q/k/v biases, rotary buffers and multi-token-prediction layers are not counted.  Within 2% of the
published counts for dense Llama-family models (tests/estimate/test_weights.py cites them).

Bytes: every parameter at the model dtype, except with ``quantization_config.quant_method: fp8`` (DeepSeek-V3's
published checkpoint): the decoder's linear weights are one byte each plus one float32 ``weight_scale_inv`` per
``weight_block_size`` block (one per matrix without blocks), while embeddings, the LM head, norms and the MoE
router stay at the model dtype (DeepSeek-V3 README_WEIGHTS.md "FP8 Weight Documentation"; vLLM's Fp8Config
quantizes linear layers only).
"""

from __future__ import annotations

import dataclasses

from kvtool.estimate.dtypes import model_dtype_bytes
from kvtool.estimate.hf_config import PER_LAYER_EMBEDDING_TYPES, ModelSpec
from kvtool.estimate.kinds import MAMBA
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick


@dataclasses.dataclass(frozen=True)
class WeightEstimate:
    """The weights of the whole model: parameters, bytes as vLLM loads them, and how they were counted."""

    num_params: int
    weights_bytes: int
    method: str  # "config estimate", "safetensors headers", "index.json total_size"


@dataclasses.dataclass(frozen=True)
class _Parts:
    """The parameters of the decoder, split into what a quantization method stores its way and the rest."""

    linear: tuple[tuple[int, int, int], ...]  # (rows, cols, count) of the decoder's linear weight matrices
    other: int  # embeddings, LM head, norms, router, biases: parameters never quantized
    experts: int = 0  # routed experts over all layers, each gate + up (inter x hidden) and down (hidden x inter)
    expert_inter: int = 0
    hidden: int = 0
    expert_matrices: int = 3  # gate, up, down; 2 (up, down) for Nemotron-H's squared-ReLU experts

    @property
    def params(self) -> int:
        expert = self.expert_matrices * self.expert_inter * self.hidden * self.experts
        return sum(r * c * n for r, c, n in self.linear) + expert + self.other


def _state_mixer(spec: ModelSpec) -> tuple[list[tuple[int, int]], int] | None:
    """The linear matrices (rows, cols) and other parameters of one state layer's mixer, for hybrids whose
    layer_kinds mark each layer as attention or state (None otherwise: such layers are counted as attention).

    Mamba-2 (vLLM MambaMixer2): in_proj hidden -> 2 x intermediate + 2 x groups x state + heads (z, x, B, C, dt),
    out_proj intermediate -> hidden; conv1d weight and bias over intermediate + 2 x groups x state channels; A, D and
    dt_bias per head; a gated RMSNorm over intermediate.
    Gated DeltaNet (vLLM Qwen3NextGatedDeltaNet): in_proj_qkvz hidden -> 2 x key_dim + 2 x value_dim, in_proj_ba
    hidden -> 2 x value heads, out_proj value_dim -> hidden; conv1d (no bias) over 2 x key_dim + value_dim channels;
    A and dt_bias per value head; an RMSNorm over the value head dim."""
    st, h = spec.mamba_state, spec.hidden_size
    if st is None or h is None:
        return None
    kernel = st.conv_rows + 1
    if st.kind == "mamba2":
        inter, conv_dim = st.conv_dim, st.conv_dim + 2 * st.groups * st.group_state
        linear = [(inter + conv_dim + st.heads, h), (h, inter)]
        return linear, conv_dim * kernel + conv_dim + 3 * st.heads + inter
    if st.kind == "gated_deltanet":
        v_dim = st.head_shape[0]
        value_dim = st.heads * v_dim
        key_dim = (st.conv_dim - value_dim) // 2
        linear = [(2 * key_dim + 2 * value_dim, h), (2 * st.heads, h), (h, value_dim)]
        return linear, st.conv_dim * kernel + 2 * st.heads + v_dim
    return None


def _parts(spec: ModelSpec) -> _Parts | None:
    h = spec.hidden_size
    if h is None or spec.vocab_size is None:
        return None
    heads, kv, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    other = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2) + h  # embeddings (+ head), final norm

    if spec.is_mla:
        lora = spec.kv_lora_rank or 0
        nope = spec.qk_nope_head_dim or 0
        rope = spec.qk_rope_head_dim or 0
        v = spec.v_head_dim or nope
        q_dim = heads * (nope + rope)
        if spec.q_lora_rank:
            attn = [(spec.q_lora_rank, h), (q_dim, spec.q_lora_rank)]
            attn_other = spec.q_lora_rank  # q_a_layernorm
        else:
            attn, attn_other = [(q_dim, h)], 0
        attn += [(lora + rope, h), (heads * (nope + v), lora), (h, heads * v)]
        attn_other += lora  # kv_a_layernorm
    else:
        attn = [(heads * d, h), (kv * d, h), (kv * d, h), (h, heads * d)]
        attn_other = (heads + 2 * kv) * d if spec.model_type == "qwen2" else 0  # q/k/v biases
    norms = 4 * h if spec.model_type.startswith("gemma") else 2 * h

    dense_mlp: list[tuple[int, int]]
    if spec.intermediate_size is not None:
        dense_mlp = [(spec.intermediate_size, h)] * 2 + [(h, spec.intermediate_size)]  # gate, up, down
    elif spec.model_type == "falcon":
        dense_mlp = [(4 * h, h), (h, 4 * h)]  # Falcon: dense_h_to_4h and dense_4h_to_h
    elif spec.num_experts and spec.moe_intermediate_size and not spec.first_k_dense_replace and not spec.moe_layers:
        dense_mlp = []  # every layer is MoE: Qwen3.5 / Qwen3.6 configs have no intermediate_size
    else:
        return None

    if spec.model_type.startswith(("qwen3_next", "qwen3_5")):
        attn[0] = (2 * heads * d, h)  # q_proj also yields the output gate (vLLM Qwen3NextAttention attn_output_gate)
    mixer = _state_mixer(spec)
    if spec.block_types and mixer is not None:
        return _nemotron_h_parts(spec, attn, mixer, other)
    if len(spec.layer_kinds) != spec.num_layers:
        mixer = None
    shared_mlp = spec.shared_expert_intermediate_size
    if shared_mlp and spec.model_type == "granitemoehybrid":
        # Granite-4.0: every layer's MLP is shared_mlp (input_linear, output_linear); experts only when configured
        dense_mlp = [(shared_mlp, h)] * 2 + [(h, shared_mlp)]

    counts: dict[tuple[int, int], int] = {}
    experts = 0
    inter = spec.moe_intermediate_size or spec.intermediate_size or 0
    moe_layers = set(spec.moe_layers) if spec.moe_layers is not None else None
    for layer in range(spec.num_layers):
        moe = layer >= spec.first_k_dense_replace if moe_layers is None else layer in moe_layers
        if spec.num_experts and moe:
            shared = (spec.n_shared_experts or 0) * inter or (shared_mlp or 0)
            mlp = [(shared, h), (shared, h), (h, shared)] if shared else []
            experts += spec.num_experts
            other += h * spec.num_experts  # router
            if spec.shared_expert_intermediate_size and spec.model_type != "granitemoehybrid":
                other += h  # shared_expert_gate (Qwen2-MoE, Qwen3-Next)
        else:
            mlp = dense_mlp
        if mixer is not None and spec.layer_kinds[layer] == MAMBA:
            mixer_shapes, mixer_other = mixer
        else:
            mixer_shapes, mixer_other = attn, attn_other
        for shape in mixer_shapes + mlp:
            counts[shape] = counts.get(shape, 0) + 1
        other += mixer_other + norms
    return _Parts(tuple((r, c, n) for (r, c), n in counts.items()), other, experts, inter, h)


def _nemotron_h_parts(
    spec: ModelSpec, attn: list[tuple[int, int]], mixer: tuple[list[tuple[int, int]], int], other: int
) -> _Parts:
    """Nemotron-H (vLLM nemotron_h.py): each layer is one block with one RMSNorm and one mixer: M a Mamba-2 mixer,
    * attention, - a squared-ReLU MLP (up, down) of intermediate_size, E a MoE of n_routed_experts squared-ReLU
    experts (up, down) of moe_intermediate_size, a router with a score-correction bias and n_shared_experts x
    moe_shared_expert_intermediate_size shared (up, down)."""
    h = spec.hidden_size or 0
    counts: dict[tuple[int, int], int] = {}
    experts = 0
    for block in spec.block_types:
        shapes: list[tuple[int, int]] = []
        if block == "M":
            shapes, other = mixer[0], other + mixer[1]
        elif block == "*":
            shapes = attn
        elif block == "-" and spec.intermediate_size:
            shapes = [(spec.intermediate_size, h), (h, spec.intermediate_size)]
        elif block == "E" and spec.num_experts:
            experts += spec.num_experts
            other += (h + 1) * spec.num_experts  # router and e_score_correction_bias
            shared = (spec.n_shared_experts or 0) * (spec.shared_expert_intermediate_size or 0)
            shapes = [(shared, h), (h, shared)] if shared else []
        for shape in shapes:
            counts[shape] = counts.get(shape, 0) + 1
        other += h  # the block's norm
    inter = spec.moe_intermediate_size or 0
    return _Parts(tuple((r, c, n) for (r, c), n in counts.items()), other, experts, inter, h, expert_matrices=2)


def estimate_params(spec: ModelSpec) -> int | None:
    """Parameter count from the config; None when the config lacks the sizes needed."""
    parts = _parts(spec)
    return None if parts is None else parts.params


def estimate_weights(spec: ModelSpec, vllm_version: str = NEWEST_RELEASE, tp: int = 1) -> WeightEstimate | None:
    """The whole model's weights as ``vllm_version`` loads them over ``tp`` ranks (the sum of the ranks: MXFP4
    experts are padded per TP partition, kvtool.estimate.quant.MXFP4_LAYOUTS)."""
    if spec.model_type in PER_LAYER_EMBEDDING_TYPES:
        return None  # per-layer embeddings, AltUp, Laurel: not in the formula (safetensors headers give them)
    parts = _parts(spec)
    if parts is None:
        return None
    dtype_bytes = model_dtype_bytes(spec.dtype)
    quant = spec.weight_quant
    if quant is None:
        return WeightEstimate(parts.params, parts.params * dtype_bytes, "config estimate")
    if quant.experts_only:
        linear = sum(r * c * n for r, c, n in parts.linear) * dtype_bytes
    else:
        linear = sum(quant.matrix_bytes(r, c) * n for r, c, n in parts.linear)
    if quant.mxfp4_experts:
        from kvtool.estimate.quant import MXFP4_LAYOUTS, mxfp4_expert_bytes  # a quantized checkpoint's rules only

        layout = pick(MXFP4_LAYOUTS, vllm_version)
        per_rank = -(-parts.expert_inter // tp)
        per_expert = tp * mxfp4_expert_bytes(layout, parts.hidden, per_rank, parts.expert_matrices)
    else:
        up = quant.matrix_bytes(parts.expert_inter, parts.hidden)
        per_expert = (parts.expert_matrices - 1) * up + quant.matrix_bytes(parts.hidden, parts.expert_inter)
    return WeightEstimate(
        parts.params,
        linear + per_expert * parts.experts + parts.other * dtype_bytes,
        f"config estimate; {quant.method}, the rest {spec.dtype}",
    )
