"""Weight parameters and bytes estimated from a config (dense, MoE, MLA, tied embeddings, FP8 block weights).

Counts the matrices of a Llama-style decoder: embeddings (and an untied LM head), per layer the attention
projections (q, k, v, o; or MLA's q/kv low-rank projections), the MLP (gated: 3 x hidden x intermediate;
Falcon: 2 x hidden x 4 hidden; MoE: every expert, shared experts and the router) and the norms.  Biases other
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
from kvtool.estimate.hf_config import ModelSpec


@dataclasses.dataclass(frozen=True)
class WeightEstimate:
    num_params: int
    weights_bytes: int
    method: str  # "config estimate", "safetensors headers", "index.json total_size"


@dataclasses.dataclass(frozen=True)
class _Parts:
    linear: tuple[tuple[int, int, int], ...]  # (rows, cols, count) of the decoder's linear weight matrices
    other: int  # embeddings, LM head, norms, router, biases: parameters never quantized
    experts: int = 0  # routed experts over all layers, each gate + up (inter x hidden) and down (hidden x inter)
    expert_inter: int = 0
    hidden: int = 0

    @property
    def params(self) -> int:
        expert = 3 * self.expert_inter * self.hidden * self.experts
        return sum(r * c * n for r, c, n in self.linear) + expert + self.other


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

    if spec.intermediate_size is None:
        if spec.model_type != "falcon":
            return None
        dense_mlp = [(4 * h, h), (h, 4 * h)]  # Falcon: dense_h_to_4h and dense_4h_to_h
    else:
        dense_mlp = [(spec.intermediate_size, h)] * 2 + [(h, spec.intermediate_size)]  # gate, up, down

    counts: dict[tuple[int, int], int] = {}
    experts = 0
    inter = spec.moe_intermediate_size or spec.intermediate_size or 0
    moe_layers = set(spec.moe_layers) if spec.moe_layers is not None else None
    for layer in range(spec.num_layers):
        moe = layer >= spec.first_k_dense_replace if moe_layers is None else layer in moe_layers
        if spec.num_experts and moe:
            shared = (spec.n_shared_experts or 0) * inter
            mlp = [(shared, h), (shared, h), (h, shared)] if shared else []
            experts += spec.num_experts
            other += h * spec.num_experts  # router
        else:
            mlp = dense_mlp
        for shape in attn + mlp:
            counts[shape] = counts.get(shape, 0) + 1
        other += attn_other + norms
    return _Parts(tuple((r, c, n) for (r, c), n in counts.items()), other, experts, inter, h)


def estimate_params(spec: ModelSpec) -> int | None:
    """Parameter count from the config; None when the config lacks the sizes needed."""
    parts = _parts(spec)
    return None if parts is None else parts.params


def estimate_weights(spec: ModelSpec) -> WeightEstimate | None:
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
    inter = -(-parts.expert_inter // quant.pad_intermediate_to) * quant.pad_intermediate_to
    per_expert = 2 * quant.matrix_bytes(inter, parts.hidden) + quant.matrix_bytes(parts.hidden, inter)
    return WeightEstimate(
        parts.params,
        linear + per_expert * parts.experts + parts.other * dtype_bytes,
        f"config estimate; {quant.method}, the rest {spec.dtype}",
    )
