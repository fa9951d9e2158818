"""Weight parameters and bytes estimated from a config (dense, MoE, MLA, tied embeddings).

Counts the matrices of a Llama-style decoder: embeddings (and an untied LM head), per layer the attention
projections (q, k, v, o; or MLA's q/kv low-rank projections), the MLP (gated: 3 x hidden x intermediate;
Falcon: 2 x hidden x 4 hidden; MoE: every expert, shared experts and the router) and the norms.  Biases other
than Qwen2's q/k/v biases, rotary buffers and multi-token-prediction layers are not counted.  Within 2% of the
published counts for dense Llama-family models (tests/test_weights.py cites them).
"""

from __future__ import annotations

import dataclasses

from kvtool.dtypes import model_dtype_bytes
from kvtool.hf_config import ModelSpec


@dataclasses.dataclass(frozen=True)
class WeightEstimate:
    num_params: int
    weights_bytes: int
    method: str  # "config estimate", "safetensors headers", "index.json total_size"


def estimate_params(spec: ModelSpec) -> int | None:
    """Parameter count from the config; None when the config lacks the sizes needed."""
    h = spec.hidden_size
    if h is None or spec.vocab_size is None:
        return None
    embed = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    heads, kv, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim

    if spec.is_mla:
        nope = spec.qk_nope_head_dim or 0
        rope = spec.qk_rope_head_dim or 0
        v = spec.v_head_dim or nope
        q_dim = heads * (nope + rope)
        q = h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * q_dim if spec.q_lora_rank else h * q_dim
        attn = q + h * (spec.kv_lora_rank + rope) + spec.kv_lora_rank + spec.kv_lora_rank * heads * (nope + v)
        attn += heads * v * h
    else:
        attn = h * heads * d + 2 * h * kv * d + heads * d * h
        if spec.model_type == "qwen2":
            attn += (heads + 2 * kv) * d  # q/k/v biases
    norms = 4 * h if spec.model_type.startswith("gemma") else 2 * h

    if spec.intermediate_size is None:
        if spec.model_type != "falcon":
            return None
        dense_mlp = 2 * h * 4 * h  # Falcon: dense_h_to_4h and dense_4h_to_h
    else:
        dense_mlp = 3 * h * spec.intermediate_size  # gate, up, down

    total = 0
    for layer in range(spec.num_layers):
        if spec.num_experts and layer >= spec.first_k_dense_replace:
            inter = spec.moe_intermediate_size or spec.intermediate_size or 0
            mlp = spec.num_experts * 3 * h * inter + (spec.n_shared_experts or 0) * 3 * h * inter
            mlp += h * spec.num_experts  # router
        else:
            mlp = dense_mlp
        total += attn + mlp + norms
    return total + embed + h  # + final norm


def estimate_weights(spec: ModelSpec) -> WeightEstimate | None:
    params = estimate_params(spec)
    if params is None:
        return None
    return WeightEstimate(params, params * model_dtype_bytes(spec.dtype), "config estimate")
