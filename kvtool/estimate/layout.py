"""KV-cache bytes per token, per layer kind, per GPU: the seed formula ``2 x L x H x S x D x P x B``, exactly.

- attention layers (full, sliding or chunked local): K and V, ``kv_heads_per_gpu`` heads of ``head_dim`` values
  each; a sliding layer holds ``min(S, window)`` tokens, a chunked local layer (Llama 4) ``min(S, chunk)``;
- MLA layers: one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token, no factor 2, replicated on
  every tensor-parallel rank; ``fp8_ds_mla`` is vLLM's fixed 656 bytes per token per layer;
- tensor parallelism: ``kv_heads_per_gpu = max(1, kv_heads // tp)`` (vLLM replicates KV heads when tp > kv_heads);
- per-layer shapes (Gemma 4): each kind of layer has its own KV heads and head size (``ModelSpec.kv_shape``);
  KV-sharing layers (Gemma 3n, Gemma 4 ``num_kv_shared_layers``) hold no KV and are left out.

Sizes are exact (``Fraction``) so int4 and nvfp4 never round before the end.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from kvtool.core.errors import UsageError
from kvtool.estimate.dtypes import FP8_DS_MLA_BYTES_PER_TOKEN, KV_DTYPE_BYTES, kv_vector_bytes, resolve_kv_dtype
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.kinds import CHUNKED, FULL, MAMBA, SLIDING

MLA = "mla"


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """Layers that store the same thing per token."""

    kind: str  # "full", "sliding", "chunked", "mla" or "mamba"
    num_layers: int
    kv_heads_per_gpu: int  # 1 for MLA (one latent)
    vector_elements: int  # head_dim, or the MLA latent width
    kv_factor: int  # 2 (K and V) or 1 (MLA latent)
    window_tokens: int | None  # sliding (chunked local) layers keep at most this many tokens: the window (chunk)
    bytes_per_token_per_layer: Fraction  # one GPU, exact
    state_bytes_per_request: int = 0  # hybrid state layers: a fixed state per request and layer, one GPU

    def tokens_held(self, seq_len: int) -> int:
        return min(seq_len, self.window_tokens) if self.window_tokens else seq_len

    def bytes_per_gpu(self, seq_len: int, batch: int) -> Fraction:
        """This group's KV cache (and state) for ``batch`` requests of ``seq_len`` tokens, one GPU."""
        per_request = self.bytes_per_token_per_layer * self.tokens_held(seq_len) + self.state_bytes_per_request
        return per_request * self.num_layers * batch


@dataclasses.dataclass(frozen=True)
class KvLayout:
    """The KV cache of one model on one GPU, for a KV dtype and a tensor-parallel size."""

    kv_dtype: str  # resolved vLLM name ("bf16", "fp8", ...)
    tp: int
    groups: tuple[LayerGroup, ...]
    notes: tuple[str, ...]

    @property
    def bytes_per_token_per_gpu(self) -> Fraction:
        """One more token of one sequence, all layers, one GPU (sliding layers counted while S <= window)."""
        return sum((g.bytes_per_token_per_layer * g.num_layers for g in self.groups), Fraction(0))

    def kv_bytes_per_gpu(self, seq_len: int, batch: int) -> int:
        return math.ceil(sum((g.bytes_per_gpu(seq_len, batch) for g in self.groups), Fraction(0)))


def kv_layout(spec: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> KvLayout:
    dtype = resolve_kv_dtype(kv_dtype, spec.dtype)
    if tp < 1:
        raise UsageError(f"--tp must be at least 1, not {tp}", where="--tp")
    notes: list[str] = []
    if dtype == "fp8_ds_mla" and not spec.is_mla:
        raise UsageError("--kv-dtype fp8_ds_mla applies only to MLA models (DeepSeek)", where="--kv-dtype")
    if spec.is_mla:
        if dtype == "fp8_ds_mla":
            per_layer = Fraction(FP8_DS_MLA_BYTES_PER_TOKEN)
            notes.append("fp8_ds_mla: vLLM's fixed 656 bytes per token per layer")
        else:
            per_layer = kv_vector_bytes(dtype, spec.head_dim)
        if tp > 1:
            notes.append(f"MLA latents are replicated on each of the {tp} GPUs")
        latent = (LayerGroup(MLA, spec.num_layers, 1, spec.head_dim, 1, None, per_layer),)
        return KvLayout(dtype, tp, latent, tuple(notes))

    groups: list[LayerGroup] = []
    windows = {FULL: None, SLIDING: spec.sliding_window, CHUNKED: spec.attention_chunk_size}
    kinds = spec.kv_layer_kinds
    for kind, window in windows.items():
        n = kinds.count(kind)
        if n:
            shape = spec.kv_shape(kind)
            heads = _kv_heads_per_gpu(shape.num_kv_heads, tp, notes)
            per_layer = 2 * heads * kv_vector_bytes(dtype, shape.head_dim)
            groups.append(LayerGroup(kind, n, heads, shape.head_dim, 2, window, per_layer))
    if spec.mamba_state is not None and spec.state_layers:
        state = spec.mamba_state.bytes_per_gpu(tp)
        groups.append(LayerGroup(MAMBA, spec.state_layers, 0, 0, 0, None, Fraction(0), state))
        notes.append(f"{spec.state_layers} state layers keep {state:,} B per request each (one GPU), whatever S")
    return KvLayout(dtype, tp, tuple(groups), tuple(notes))


def _kv_heads_per_gpu(kv_heads: int, tp: int, notes: list[str]) -> int:
    """KV heads one GPU keeps: split over tp, or one replicated head when tp > kv_heads (vLLM)."""
    heads = max(1, kv_heads // tp)
    if tp > kv_heads:
        said = f"tp {tp} > {kv_heads} KV heads: each GPU keeps a replicated copy of 1 KV head (vLLM)"
    elif kv_heads % tp:
        said = f"{kv_heads} KV heads do not divide evenly over tp {tp}; {heads} per GPU assumed"
    else:
        return heads
    if said not in notes:
        notes.append(said)
    return heads


def element_bytes_text(kv_dtype: str, elements: int) -> str:
    """How one vector's bytes are written in the formula: ``128 x 2`` or ``(128/2 + 128/16)`` for nvfp4."""
    if kv_dtype == "nvfp4":
        return f"({elements}/2 + {elements}/16)"
    size = KV_DTYPE_BYTES[kv_dtype]
    size_text = str(size.numerator) if size.denominator == 1 else f"{float(size):g}"
    return f"{elements} x {size_text}"


def group_formula(group: LayerGroup, kv_dtype: str, seq_len: int, batch: int) -> str:
    """``2 x L x H x S x D x P x B = N bytes`` for one layer group, numbers substituted (one GPU)."""
    s_text = f"min({seq_len}, {group.window_tokens})" if group.window_tokens else f"{seq_len}"
    n = math.ceil(group.bytes_per_gpu(seq_len, batch))
    if group.kind == MAMBA:
        return f"{group.num_layers} x {group.state_bytes_per_request:,} B state x {batch} = {n:,} bytes"
    if group.kind == MLA:
        if kv_dtype == "fp8_ds_mla":
            return f"{group.num_layers} x {s_text} x 656 x {batch} = {n:,} bytes"
        return f"{group.num_layers} x {s_text} x {element_bytes_text(kv_dtype, group.vector_elements)} x {batch} = {n:,} bytes"
    return (
        f"2 x {group.num_layers} x {group.kv_heads_per_gpu} x {s_text} x "
        f"{element_bytes_text(kv_dtype, group.vector_elements)} x {batch} = {n:,} bytes"
    )
