"""The rotary embeddings' cos/sin caches vLLM builds on the GPU with the model, inside "Model loading took".

vLLM's ``get_rope`` builds one rotary embedding per distinct (head size, rotary dim, max position, rope parameters,
dtype) key (vllm/model_executor/layers/rotary_embedding/__init__.py ``_ROPE_DICT``), and each registers a
``cos_sin_cache`` buffer of ``positions x rotary_dim`` elements, computed on the GPU in float32 and kept in the model
dtype (``cache.to(dtype)``; rotary_embedding/base.py RotaryEmbedding.__init__ (0.19.0; rotary_embedding.py 0.10.0)).
It is a non-persistent buffer, so no checkpoint holds it: a config's or safetensors' weight count leaves it out, and
every rank (and every pipeline stage with attention layers) holds a whole copy.  ``positions`` by rope type (the same
rules 0.10.0-0.33.0):

- default, llama3, proportional (Gemma 4), ntk, dynamic with ``alpha``: ``max_position_embeddings``;
- linear, dynamic with ``factor``: ``max_position_embeddings x factor`` (linear_scaling_rope.py,
  dynamic_ntk_scaling_rope.py ``max_len = self.max_position_embeddings * scaling_factor``);
- yarn, deepseek_yarn: ``original_max_position_embeddings x factor`` (yarn_scaling_rope.py,
  deepseek_scaling_rope.py);
- longrope: ``original_max_position_embeddings + max_position_embeddings`` (phi3_long_rope_scaled_rope.py: the short
  and long caches concatenated);
- M-RoPE (an ``mrope_section`` in the rope parameters, Qwen2-VL .. Qwen3.6): those positions x 4 (mrope.py
  ``cache_max_position_num = max_position_embeddings * 4``), x 1 for the models of :data:`MROPE_POSITIONS_RULES`.

Gemma 3 builds two: its sliding layers' rope is the default one at ``rope_local_base_freq`` and its full layers' the
config's (gemma3.py Gemma3Attention (0.19.0)).  Llama 4 Scout's 10,485,760 positions x 128 make 2.5 GiB per GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from kvtool.estimate.vllm_versions import pick


@dataclasses.dataclass(frozen=True)
class RotaryCache:
    """One rotary embedding's cos/sin cache: ``positions x rotary_dim`` elements (x 4 positions under M-RoPE)."""

    positions: int
    rotary_dim: int
    mrope: bool = False
    rope_type: str = "default"
    base: float | None = None  # rope_theta: part of get_rope's key, so two thetas are two caches


class MropePositionsRule(NamedTuple):
    since: str
    factor_one_types: frozenset[str]  # language-model model_types whose M-RoPE cache holds positions x 1
    source: str


MROPE_POSITIONS_RULES: tuple[MropePositionsRule, ...] = (
    MropePositionsRule(
        "0.10.0",
        frozenset(),
        "vllm/model_executor/layers/rotary_embedding/mrope.py MRotaryEmbedding (0.10.0-0.31.0): "
        "cache_max_position_num = max_position_embeddings * 4",
    ),
    MropePositionsRule(
        "0.32.0",
        frozenset({"qwen3_vl_text", "qwen3_vl_moe_text"}),
        "vllm/model_executor/models/qwen3_vl.py mrope_positions_factor (0.32.0): 4 only with video pruning, else 1 "
        "(Qwen3VLDecoderLayer, qwen3_vl_moe.py)",
    ),
    MropePositionsRule(
        "0.33.0",
        frozenset({"qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_5_text", "qwen3_5_moe_text"}),
        "vllm/model_executor/models/qwen3_5.py (0.33.0): mrope_positions_factor(vllm_config), as qwen3_vl.py",
    ),
)

# model types whose vLLM file builds no rotary embedding (no get_rope call: nemotron_h.py, jamba.py, bloom.py,
# mpt.py (0.19.0)); Falcon with alibi and Granite-4.0-H with position_embedding_type "nope" neither
NO_ROPE_TYPES = frozenset({"nemotron_h", "jamba", "bloom", "mpt"})


# Gemma 3 (gemma3.py Gemma3Attention) and Gemma 3n (gemma3n.py): sliding layers take a default rope at
# rope_local_base_freq beside the full layers' (scaled) one
LOCAL_ROPE_TYPES = frozenset({"gemma3", "gemma3_text", "gemma3n", "gemma3n_text"})


def _params(data: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters as vLLM normalises them: transformers 5's ``rope_parameters``, else ``rope_scaling``
    (``type`` an alias of ``rope_type``; ``mrope``, Qwen2-VL's old spelling, is default with mrope_section)."""
    params = data.get("rope_parameters")
    if not isinstance(params, dict):
        params = data.get("rope_scaling")
    params = dict(params) if isinstance(params, dict) else {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "mrope":
        kind = "default"
    params["rope_type"] = kind
    if "partial_rotary_factor" not in params and isinstance(data.get("partial_rotary_factor"), (int, float)):
        params["partial_rotary_factor"] = data["partial_rotary_factor"]
    return params


def _cache(params: dict[str, Any], head_size: int, max_position: int) -> RotaryCache:
    kind = str(params.get("rope_type", "default"))
    factor = params.get("factor")
    original = params.get("original_max_position_embeddings")
    positions = max_position
    if factor and (kind == "linear" or (kind == "dynamic" and "alpha" not in params)):
        positions = int(max_position * factor)
    elif kind in ("yarn", "deepseek_yarn", "deepseek_llama_scaling") and factor and original:
        positions = int(original * factor)
    elif kind == "longrope" and original:
        positions = original + max_position
    rotary_dim = int(head_size * float(params.get("partial_rotary_factor", 1.0)))
    base = params.get("rope_theta")
    return RotaryCache(positions, rotary_dim, "mrope_section" in params, kind, base)


def rotary_caches(
    data: dict[str, Any],
    model_type: str,
    head_size: int,
    max_position: int | None,
    *,
    full_head_size: int | None = None,
) -> tuple[RotaryCache, ...]:
    """The distinct rotary caches vLLM builds for a language model's config (``data``: the text config), or ()
    when its layers have no rotary embedding or the config gives no max_position_embeddings.  ``full_head_size``:
    the full-attention layers' own head size where it differs (Gemma 4's global_head_dim)."""
    if model_type in NO_ROPE_TYPES or data.get("alibi") is True or data.get("position_embedding_type") == "nope":
        return ()
    max_position = data.get("max_position_embeddings") or max_position
    if not isinstance(max_position, int) or max_position <= 0 or head_size <= 0:
        return ()
    params = data.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        # transformers 5: one parameter set per layer type (Gemma 3/4)
        distinct = {
            _cache({"rope_type": "default", **v}, (full_head_size or head_size) if k == "full_attention" else head_size,
                   max_position)
            for k, v in params.items()
        }  # fmt: skip
        return tuple(sorted(distinct, key=lambda c: (c.positions, c.rotary_dim)))
    params = _params(data)
    params.setdefault("rope_theta", data.get("rope_theta"))
    caches = [_cache(params, head_size, max_position)]
    # transformers' Gemma3TextConfig / Gemma3nTextConfig default rope_local_base_freq 10,000 (rope_theta 1,000,000)
    local = data.get("rope_local_base_freq", 10_000.0)
    if model_type in LOCAL_ROPE_TYPES and local != (params.get("rope_theta") or 1_000_000.0):  # the sliding layers
        caches.append(RotaryCache(max_position, head_size, base=local))
    return tuple(dict.fromkeys(caches))


def rotary_cache_bytes(
    caches: tuple[RotaryCache, ...], model_type: str, dtype_bytes: int, vllm_version: str
) -> tuple[int, str]:
    """The bytes of the caches per GPU under ``vllm_version``, and how they were counted."""
    if not caches:
        return 0, ""
    rule = pick(MROPE_POSITIONS_RULES, vllm_version)
    total = 0
    parts = []
    for c in caches:
        factor = (1 if model_type in rule.factor_one_types else 4) if c.mrope else 1
        total += c.positions * factor * c.rotary_dim * dtype_bytes
        parts.append(f"{c.positions * factor:,} x {c.rotary_dim}")
    how = f"rotary caches {total / 2**20:,.0f} MiB per GPU ({' + '.join(parts)} x {dtype_bytes} B)"
    return total, how
