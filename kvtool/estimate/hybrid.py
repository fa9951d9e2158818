"""Hybrid models: attention layers plus layers that keep a fixed-size recurrent state per request (vLLM's MambaSpec).

vLLM 0.32 (vllm/model_executor/layers/mamba/mamba_utils.py ``MambaStateShapeCalculator``) gives each such layer a
state per request, split over tensor-parallel ranks:

- Gated DeltaNet (Qwen3-Next): conv ``(kernel - 1) x (2 k_heads k_dim + v_heads v_dim) / tp`` and temporal
  ``v_heads / tp x v_dim x k_dim``;
- Mamba-2 (Nemotron-H, Granite-4.0-H, Falcon-H1): conv ``(kernel - 1) x (intermediate + 2 groups state) / tp``
  (groups padded up to tp when they do not divide) and temporal ``heads / tp x head_dim x state``;
- Mamba-1 (Jamba): conv ``intermediate / tp x (kernel - 1)`` and temporal ``intermediate / tp x state``.

With speculative decoding the conv state keeps ``num_speculative_tokens`` more rows in the model files that pass
``num_spec`` (kvtool.estimate.spec_decode ``SPEC_CONV_ROWS_RULES``, applied by the estimator; ``MambaState.family``
names the file).  Conv states are kept at the model dtype, temporal states at ``mamba_ssm_cache_dtype`` (the model dtype, but float32
for Nemotron-H: ``NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE``).  How vLLM then pages them (the
attention block size raised so one attention page holds a state, groups, blocks per request) is in
kvtool/estimate/capacity.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.errors import InputFileError
from kvtool.estimate.kinds import MAMBA  # the layer kind: a fixed state per request


@dataclasses.dataclass(frozen=True)
class MambaState:
    """One state layer's per-request state, before the tensor-parallel split."""

    kind: str  # "gated_deltanet", "mamba2", "mamba1"
    conv_rows: int  # kernel - 1
    conv_dim: int  # channels of the conv state (split over tp)
    heads: int  # temporal-state heads (split over tp); 1 for Mamba-1 (intermediate carries the split)
    head_shape: tuple[int, int]  # per head: (head_dim, state) or (v_dim, k_dim); Mamba-1: (intermediate, state)
    conv_bytes: int  # per conv element (model dtype)
    ssm_bytes: int  # per temporal element (mamba_ssm_cache_dtype)
    groups: int = 0  # Mamba-2 n_groups (padded to tp when they do not divide)
    group_state: int = 0  # Mamba-2 state size per group (in the conv channels)
    family: str = ""  # the vLLM model file that builds the state (its own rule for speculative conv rows)
    # whether the temporal state takes the model dtype too (mamba_ssm_cache_dtype 'auto'), so that --dtype or vLLM's
    # float32 -> bfloat16 downcast changes it as it changes the conv state (kvtool.estimate.model._with_dtype)
    ssm_follows_model_dtype: bool = False

    def bytes_per_gpu(self, tp: int) -> int:
        """vLLM MambaSpec.page_size_bytes before padding: the state of one request on one GPU."""
        conv_dim = self.conv_dim
        if self.kind == "mamba2":
            groups = self.groups if self.groups % tp == 0 else self.groups + tp - self.groups
            conv_dim = self.conv_dim + 2 * groups * self.group_state
        conv = self.conv_rows * (conv_dim // tp) * self.conv_bytes
        if self.kind == "mamba1":
            temporal = (self.head_shape[0] // tp) * self.head_shape[1]
        else:
            temporal = (self.heads // tp) * self.head_shape[0] * self.head_shape[1]
        return conv + temporal * self.ssm_bytes


@dataclasses.dataclass(frozen=True)
class HybridLayout:
    layer_kinds: tuple[str, ...]  # "full" or MAMBA per layer (Falcon-H1: both, so attention layers are listed)
    state: MambaState
    state_layers: int  # layers with a state (Falcon-H1: every layer, besides its attention)
    note: str
    blocks: tuple[str, ...] = ()  # Nemotron-H: each layer's block (M Mamba-2, * attention, - MLP, E MoE)


def _need(cfg: dict[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 10_000_000:
        raise InputFileError(
            f"hybrid config needs a positive integer {key}, not {value!r}", where=f"{where}: field {key}"
        )
    return value


def _qwen3_next(cfg: dict[str, Any], where: str, dtype_bytes: int, layers: int) -> HybridLayout:
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        kinds = tuple("full" if t == "full_attention" else MAMBA for t in types)
    else:
        every = _need(cfg, "full_attention_interval", where)
        kinds = tuple("full" if (i + 1) % every == 0 else MAMBA for i in range(layers))
    k_heads, v_heads = _need(cfg, "linear_num_key_heads", where), _need(cfg, "linear_num_value_heads", where)
    k_dim, v_dim = _need(cfg, "linear_key_head_dim", where), _need(cfg, "linear_value_head_dim", where)
    kernel = _need(cfg, "linear_conv_kernel_dim", where)
    # Qwen3.5-style configs ask for a float32 temporal state ("mamba_ssm_dtype": "float32"), which vLLM honours
    ssm_bytes = 4 if cfg.get("mamba_ssm_dtype") == "float32" else dtype_bytes
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    follows = cfg.get("mamba_ssm_dtype") != "float32"
    state = MambaState(
        "gated_deltanet",
        kernel - 1,
        conv_dim,
        v_heads,
        (v_dim, k_dim),
        dtype_bytes,
        ssm_bytes,
        family="qwen3_next",
        ssm_follows_model_dtype=follows,
    )
    return HybridLayout(kinds, state, kinds.count(MAMBA), "Gated DeltaNet layers keep a per-request state (Qwen3-Next)")


def _mamba2(cfg: dict[str, Any], where: str, keys: dict[str, str], inter: int, conv_b: int, ssm_b: int) -> MambaState:
    heads, head_dim = _need(cfg, keys["heads"], where), _need(cfg, keys["head_dim"], where)
    return MambaState(
        "mamba2",
        _need(cfg, keys["conv"], where) - 1,
        inter,
        heads,
        (head_dim, _need(cfg, keys["state"], where)),
        conv_b,
        ssm_b,
        groups=_need(cfg, keys["groups"], where),
        group_state=_need(cfg, keys["state"], where),
    )


def _nemotron_h(cfg: dict[str, Any], where: str, dtype_bytes: int, layers: int) -> HybridLayout:
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != layers:
        raise InputFileError(
            f"hybrid_override_pattern must give one character per layer ({layers})",
            where=f"{where}: field hybrid_override_pattern",
        )
    # M = Mamba-2, * = attention, - = MLP, E = MoE (vllm/model_executor/models/nemotron_h.py); only M and * cache
    kinds = tuple("full" if c == "*" else MAMBA for c in pattern if c in "M*")
    keys = {"heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "state": "ssm_state_size", "groups": "n_groups"}
    keys["conv"] = "conv_kernel"
    inter = _need(cfg, "mamba_num_heads", where) * _need(cfg, "mamba_head_dim", where)
    state = _mamba2(cfg, where, keys, inter, dtype_bytes, 4)  # float32 SSM state by default for Nemotron-H
    state = dataclasses.replace(state, family="nemotron_h")
    note = "Mamba-2 layers keep a per-request state (Nemotron-H)"
    return HybridLayout(kinds, state, kinds.count(MAMBA), note, blocks=tuple(pattern))


def _granite(cfg: dict[str, Any], where: str, dtype_bytes: int, layers: int) -> HybridLayout:
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != layers:
        raise InputFileError(f"layer_types must list the {layers} layers", where=f"{where}: field layer_types")
    kinds = tuple("full" if t == "attention" else MAMBA for t in types)
    keys = {"heads": "mamba_n_heads", "head_dim": "mamba_d_head", "state": "mamba_d_state", "groups": "mamba_n_groups"}
    keys["conv"] = "mamba_d_conv"
    inter = _need(cfg, "mamba_expand", where) * _need(cfg, "hidden_size", where)
    state = dataclasses.replace(
        _mamba2(cfg, where, keys, inter, dtype_bytes, dtype_bytes),
        family="granitemoehybrid",
        ssm_follows_model_dtype=True,
    )
    return HybridLayout(kinds, state, kinds.count(MAMBA), "Mamba-2 layers keep a per-request state (Granite-4.0-H)")


def _falcon_h1(cfg: dict[str, Any], where: str, dtype_bytes: int, layers: int) -> HybridLayout:
    keys = {"heads": "mamba_n_heads", "head_dim": "mamba_d_head", "state": "mamba_d_state", "groups": "mamba_n_groups"}
    keys["conv"] = "mamba_d_conv"
    d_ssm = cfg.get("mamba_d_ssm")
    inter = (
        d_ssm
        if isinstance(d_ssm, int) and d_ssm > 0
        else int(_need(cfg, "mamba_expand", where) * _need(cfg, "hidden_size", where))
    )
    state = dataclasses.replace(
        _mamba2(cfg, where, keys, inter, dtype_bytes, dtype_bytes), family="falcon_h1", ssm_follows_model_dtype=True
    )
    # every Falcon-H1 layer runs attention and Mamba-2 side by side: L attention layers and L states
    return HybridLayout(("full",) * layers, state, layers, "every layer has attention and a Mamba-2 state (Falcon-H1)")


def _jamba(cfg: dict[str, Any], where: str, dtype_bytes: int, layers: int) -> HybridLayout:
    period, offset = _need(cfg, "attn_layer_period", where), cfg.get("attn_layer_offset", 0)
    if not isinstance(offset, int) or offset < 0:
        raise InputFileError(
            "attn_layer_offset must be a non-negative integer", where=f"{where}: field attn_layer_offset"
        )
    kinds = tuple("full" if i % period == offset else MAMBA for i in range(layers))
    inter = _need(cfg, "mamba_expand", where) * _need(cfg, "hidden_size", where)
    state = MambaState(
        "mamba1",
        _need(cfg, "mamba_d_conv", where) - 1,
        inter,
        1,
        (inter, _need(cfg, "mamba_d_state", where)),
        dtype_bytes,
        dtype_bytes,
        ssm_follows_model_dtype=True,
    )
    return HybridLayout(kinds, state, kinds.count(MAMBA), "Mamba-1 layers keep a per-request state (Jamba)")


READERS = {
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_next,
    "qwen3_5_moe": _qwen3_next,
    # the text_config of the published Qwen3.5 / Qwen3.6 checkpoints (Qwen3_5MoeForConditionalGeneration)
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "nemotron_h": _nemotron_h,
    "granitemoehybrid": _granite,
    "falcon_h1": _falcon_h1,
    "jamba": _jamba,
}


def read_hybrid(cfg: dict[str, Any], model_type: str, where: str, dtype_bytes: int, layers: int) -> HybridLayout | None:
    """The hybrid layout of a config vLLM 0.32 sizes with MambaSpec; None for a plain attention model."""
    reader = READERS.get(model_type)
    return None if reader is None else reader(cfg, where, dtype_bytes, layers)
