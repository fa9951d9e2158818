"""Speculative decoding in vLLM's KV cache: ``--speculative-config`` as vLLM takes it (a JSON object).

What a drafter adds to the memory vLLM plans (vLLM 0.20.1 unless a rule below says otherwise):

- draft attention layers join the KV cache spec beside the target's (vllm/v1/worker/gpu_model_runner.py
  get_kv_cache_spec walks every attention layer of the static forward context, the drafter's included).  An MTP
  drafter (``method`` mtp or a ``*_mtp`` model type) builds ``n_predict`` layers of the target's own attention
  (vllm/config/speculative.py SpeculativeConfig.hf_config_override: ``n_predict = mtp_num_hidden_layers`` for
  qwen3_5, ``num_nextn_predict_layers`` for the others; vllm/model_executor/models/qwen3_5_mtp.py
  ``range(self.num_mtp_layers)``); an EAGLE / EAGLE3 / draft_model / DFlash drafter builds the layers of its own
  config (``"model"``: kvtool reads it from a local folder holding config.json), at the target's dtype (vLLM builds
  the draft ModelConfig with ``dtype=self.target_model_config.dtype``); a DFlash drafter's attention kind and KV
  dtype follow :data:`DFLASH_RULES`.  Layers of the same spec as a target
  layer join its type, so they change vLLM's group_size and the padding layers it logs ("Add N padding layers, may
  waste at most X% KV cache memory", vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size);
- hybrid models' state layers hold ``num_speculative_tokens`` more blocks a request (MambaSpec
  ``num_speculative_blocks``), counted in the planned concurrency from 0.15.0 (:data:`SPEC_STATE_BLOCKS_RULES`);
- and their conv state keeps ``kernel - 1 + num_speculative_tokens`` rows (vllm/model_executor/layers/mamba/mamba_utils.py
  ``MambaStateShapeCalculator``, ``num_spec``), in the model files that pass it (:data:`SPEC_CONV_ROWS_RULES`): a
  larger state page, so a larger attention block ("Setting attention block size to N tokens") and fewer blocks;
- the drafter's weights are loaded with the target's (gpu_model_runner.py load_model: "Model loading took" covers
  both): an MTP drafter's from the target's config (its layers, and the 2h x h projection of the embedding and the
  hidden state), a separate drafter's from its
  checkpoint's safetensors headers where its folder has them (:func:`_draft_weights`), else from its own config;
- ngram, ngram_gpu and suffix keep no KV and no weights.

Full-attention layers need no lookahead blocks in the plan: FullAttentionSpec.max_memory_usage_bytes is
``cdiv(max_model_len, block_size) x page`` whatever num_speculative_tokens is (the scheduler reserves the lookahead
slots at run time, vllm/v1/core/sched/scheduler.py ``num_lookahead_tokens``, inside max_model_len).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

from kvtool.core.errors import UsageError
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.kinds import FULL, SLIDING
from kvtool.estimate.layout import MLA, KvLayout, LayerGroup, kv_layout
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, pick

OPTION = "--speculative-config"

# vllm/config/speculative.py MTPModelTypes (0.20.1): methods whose drafter is the target's own MTP layers
MTP_METHODS = frozenset(
    {
        "mtp",
        "deepseek_mtp",
        "mimo_mtp",
        "glm4_moe_mtp",
        "glm4_moe_lite_mtp",
        "glm_ocr_mtp",
        "ernie_mtp",
        "nemotron_h_mtp",
        "exaone_moe_mtp",
        "exaone4_5_mtp",
        "qwen3_next_mtp",
        "qwen3_5_mtp",
        "longcat_flash_mtp",
        "pangu_ultra_moe_mtp",
        "step3p5_mtp",
        "hy_v3_mtp",
    }
)
# drafters with a model of their own, whose config gives their attention layers
DRAFT_MODEL_METHODS = frozenset({"eagle", "eagle3", "draft_model", "dflash"})
# no drafter model: nothing in the KV cache, no weights (vllm/v1/spec_decode/ngram_proposer.py, suffix_decoding.py)
MODEL_FREE_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})
# a drafter model without attention (a head over the target's hidden state): weights only, not modelled
NOT_MODELLED_METHODS = frozenset({"medusa", "mlp_speculator", "extract_hidden_states"})
_KEYS = frozenset(
    {
        "method",
        "model",
        "num_speculative_tokens",
        "draft_tensor_parallel_size",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "quantization",
        "revision",
        "code_revision",
        "max_model_len",
        "disable_by_batch_size",
        "acceptance_method",
        "rejection_sample_method",
        "parallel_drafting",
        "enforce_eager",
        "disable_padded_drafter_batch",
        "use_local_argmax_reduction",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "speculative_token_tree",
        "draft_load_config",
        "tensor_parallel_size",
    }
)


class SpecStateBlocksRule(NamedTuple):
    """Whether a hybrid model's state groups count num_speculative_tokens more blocks a request in the plan."""

    since: str
    counts_speculative_blocks: bool
    source: str


SPEC_STATE_BLOCKS_RULES: tuple[SpecStateBlocksRule, ...] = (
    SpecStateBlocksRule(
        "0.10.0",
        False,
        "vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes (0.10.0-0.14.1): return self.page_size_bytes "
        "(num_speculative_blocks, a field from 0.10.2, only sizes the run-time block table)",
    ),
    SpecStateBlocksRule(
        "0.15.0",
        True,
        "vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes (0.15.0-0.33.0): page_size_bytes x "
        "(2 + num_speculative_blocks) in 'align' mode, x (1 + num_speculative_blocks) otherwise; "
        "vllm/model_executor/layers/mamba/abstract.py get_kv_cache_spec: num_speculative_blocks = "
        "speculative_config.num_speculative_tokens",
    ),
)


class SpecConvRowsRule(NamedTuple):
    """The state families whose conv state holds num_speculative_tokens more rows, for the releases from ``since``."""

    since: str
    families: frozenset[str]  # kvtool.estimate.hybrid.MambaState.family values
    source: str


SPEC_CONV_ROWS_RULES: tuple[SpecConvRowsRule, ...] = (
    SpecConvRowsRule("0.10.0", frozenset(), "vllm/model_executor/layers/mamba/mamba_utils.py (0.10.0): no num_spec"),
    SpecConvRowsRule(
        "0.10.2",
        frozenset({"qwen3_next"}),
        "vllm/model_executor/models/qwen3_next.py get_mamba_state_shape_from_config (0.10.2): "
        "gated_delta_net_state_shape(..., num_spec) -> conv rows conv_kernel_size - 1 + num_spec",
    ),
    SpecConvRowsRule(
        "0.17.0",
        frozenset({"qwen3_next", "nemotron_h"}),
        "vllm/model_executor/models/nemotron_h.py, mamba2.py (0.17.0): mamba2_state_shape(..., "
        "num_spec=num_speculative_tokens); qwen3_5.py reuses the Gated DeltaNet shape with num_spec",
    ),
    SpecConvRowsRule(
        "0.32.0",
        frozenset({"qwen3_next", "nemotron_h", "granitemoehybrid", "falcon_h1"}),
        "vllm/model_executor/models/granitemoehybrid.py, falcon_h1.py (0.32.0): mamba2_state_shape(..., num_spec)",
    ),
)


class DFlashRule(NamedTuple):
    """How vLLM builds a DFlash drafter's attention layers, for the releases from ``since``."""

    since: str
    available: bool  # the method exists (vllm/v1/spec_decode/dflash.py)
    per_layer_kinds: bool  # False: every draft layer full attention, whatever layer_types / sliding_window say
    follows_kv_cache_dtype: bool  # False: the layers get no cache_config, so their KV is at the model dtype
    source: str


DFLASH_RULES: tuple[DFlashRule, ...] = (
    DFlashRule("0.10.0", False, False, False, "vllm/v1/spec_decode/ (0.10.0-0.19.1): no dflash.py, no method 'dflash'"),
    DFlashRule(
        "0.20.0",
        True,
        False,
        False,
        "vllm/model_executor/models/qwen3_dflash.py DFlashQwen3Model.__init__ (0.20.0-0.21.0): "
        "DFlashQwen3DecoderLayer(current_vllm_config, prefix=..., config=...) without cache_config, so each "
        "DFlashQwen3Attention's Attention(attn_type=DECODER) has kv_cache_dtype 'auto' (full attention, the model "
        "dtype, block size from vllm_config.cache_config); vllm/v1/spec_decode/dflash.py DFlashProposer",
    ),
    DFlashRule(
        "0.22.0",
        True,
        False,
        True,
        "vllm/model_executor/models/qwen3_dflash.py DFlashQwen3Model.__init__ (0.22.0-0.24.0): "
        "cache_config=current_vllm_config.cache_config passed to every DFlashQwen3DecoderLayer (full attention, "
        "--kv-cache-dtype applies)",
    ),
    DFlashRule(
        "0.25.0",
        True,
        True,
        True,
        "vllm/model_executor/models/qwen3_dflash.py _resolve_layer_attention (0.25.0-0.33.0): a layer is sliding "
        "where layer_types[i] == 'sliding_attention' (or every layer where dflash_config.use_swa and layer_types "
        "has no sliding layer), its window dflash_config.swa_window_size else sliding_window; mixed sliding/full "
        "layers raise NotImplementedError (0.25.0; from 0.26.0 unless VLLM_USE_V2_MODEL_RUNNER=1)",
    ),
)


def _dflash_draft_spec(draft: ModelSpec, data: dict[str, Any], target_dtype: str, vllm_version: str) -> ModelSpec:
    """A DFlash drafter's layers as ``vllm_version`` builds them (:data:`DFLASH_RULES`), at the target's dtype."""
    rule = pick(DFLASH_RULES, vllm_version)
    if not rule.available:
        raise UsageError(
            f"{OPTION} method dflash is not in vLLM {vllm_version} (vllm/v1/spec_decode/dflash.py is new in 0.20.0)",
            where=f"{OPTION}: method",
            tip="pass --vllm-version 0.20.0 or later",
        )
    n = draft.num_layers
    if not rule.per_layer_kinds:
        return dataclasses.replace(draft, dtype=target_dtype, layer_kinds=(FULL,) * n, sliding_window=None)
    dflash = data.get("dflash_config") or {}
    layer_types = data.get("layer_types")
    sliding = [t == "sliding_attention" for t in layer_types] if isinstance(layer_types, list) else None
    if sliding is not None and 0 < sum(sliding) < len(sliding):
        raise UsageError(
            f"{OPTION} method dflash: the drafter mixes sliding and full attention layers, which vLLM "
            f"{vllm_version}'s V1 model runner refuses (qwen3_dflash.py _resolve_layer_attention)",
            where=f"{OPTION}: model",
            tip="kvtool models the V1 model runner's DFlash drafters: all full or all sliding attention",
        )
    if sliding is None or (dflash.get("use_swa") and not any(sliding)):
        sliding = [bool(dflash.get("use_swa"))] * n
    window = dflash.get("swa_window_size", data.get("sliding_window")) if any(sliding) else None
    if any(sliding) and not isinstance(window, int):
        raise UsageError(
            f"{OPTION} method dflash: sliding draft layers need dflash_config.swa_window_size or sliding_window",
            where=f"{OPTION}: model",
        )
    kinds = tuple(SLIDING if s else FULL for s in sliding[:n])
    return dataclasses.replace(draft, dtype=target_dtype, layer_kinds=kinds, sliding_window=window)


def with_speculative_conv_rows(spec: ModelSpec, text: str | None, vllm_version: str) -> ModelSpec:
    """The model with its state layers' conv rows grown by num_speculative_tokens, where ``vllm_version``'s model file
    passes ``num_spec`` (:data:`SPEC_CONV_ROWS_RULES`); unchanged otherwise."""
    state = spec.mamba_state
    if not text or state is None or state.family not in pick(SPEC_CONV_ROWS_RULES, vllm_version).families:
        return spec
    config = parsed(text)  # ngram and suffix too: the model file reads speculative_config.num_speculative_tokens
    grown = dataclasses.replace(state, conv_rows=state.conv_rows + config.num_speculative_tokens)
    return dataclasses.replace(spec, mamba_state=grown)


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """The keys of vLLM's --speculative-config that change memory."""

    method: str
    num_speculative_tokens: int
    model: str | None  # the drafter (a local folder holding config.json), None for MTP and ngram
    draft_tensor_parallel_size: int | None


@dataclasses.dataclass(frozen=True)
class SpecDecode:
    """What a drafter adds: KV-cache layers, state blocks, weights (the table's row and --json's ``speculative``)."""

    method: str
    num_speculative_tokens: int
    draft_source: str  # where the draft layers were read from, in words
    draft_kv_layers: int  # attention layers the drafter adds to the KV cache (per GPU: all of them)
    draft_kv_kind: str | None  # "full", "sliding", "mla" (None without layers)
    draft_bytes_per_token_per_gpu: int  # the draft layers' KV per token, one GPU
    draft_weights_bytes: int  # added to the model's weights (0 when already counted or none)
    draft_weights_method: str
    speculative_state_blocks: int  # blocks each state group holds beyond its own per request (0 without state)
    rules: tuple[str, ...]  # the upstream rules applied, cited


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """vLLM's --speculative-config JSON (vllm/engine/arg_utils.py: ``json.loads`` into SpeculativeConfig)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{OPTION} is not JSON: {exc.msg} at character {exc.pos}",
            where=OPTION,
            tip='write it as vLLM takes it: \'{"method": "mtp", "num_speculative_tokens": 3}\'',
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"{OPTION} must be a JSON object, not {type(data).__name__}", where=OPTION)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise UsageError(
            f"{OPTION} has keys vLLM's SpeculativeConfig does not take: {', '.join(unknown)}",
            where=OPTION,
            tip="the keys are vLLM's (vllm/config/speculative.py SpeculativeConfig)",
        )
    model = data.get("model")
    method = data.get("method")
    if method is None:
        method = _method_from_model(model)
    if not isinstance(method, str):
        raise UsageError(f"{OPTION} method must be a string, not {method!r}", where=f"{OPTION}: method")
    known = MTP_METHODS | DRAFT_MODEL_METHODS | MODEL_FREE_METHODS | NOT_MODELLED_METHODS
    if method not in known:
        raise UsageError(
            f"{OPTION} method {method!r} is not one of vLLM's",
            where=f"{OPTION}: method",
            tip="vLLM's methods: " + ", ".join(sorted(known)),
        )
    if method in NOT_MODELLED_METHODS:
        raise UsageError(
            f"{OPTION} method {method} is not modelled by kvtool (its head's weights are not read)",
            where=f"{OPTION}: method",
            tip="mtp, eagle, eagle3, draft_model, dflash, ngram and suffix are",
        )
    tokens = data.get("num_speculative_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise UsageError(
            f"{OPTION} needs num_speculative_tokens, a positive integer, not {tokens!r}",
            where=f"{OPTION}: num_speculative_tokens",
        )
    draft_tp = data.get("draft_tensor_parallel_size")
    if draft_tp is not None and (isinstance(draft_tp, bool) or not isinstance(draft_tp, int) or draft_tp <= 0):
        raise UsageError(
            f"{OPTION} draft_tensor_parallel_size must be a positive integer, not {draft_tp!r}",
            where=f"{OPTION}: draft_tensor_parallel_size",
        )
    if method in DRAFT_MODEL_METHODS and not isinstance(model, str):
        raise UsageError(f'{OPTION} method {method} needs "model": its drafter', where=f"{OPTION}: model")
    return SpeculativeConfig(method, tokens, model if method in DRAFT_MODEL_METHODS else None, draft_tp)


@functools.lru_cache(maxsize=32)
def parsed(text: str) -> SpeculativeConfig:
    return parse_speculative_config(text)


def _method_from_model(model: Any) -> str | None:
    """vLLM's guess when ``method`` is left out (SpeculativeConfig.__post_init__, 0.20.1): eagle / eagle3 / dflash
    ... named in the drafter's name, else draft_model; ngram needs the method written."""
    if not isinstance(model, str):
        return None
    name = model.lower()
    if "eagle3" in name:
        return "eagle3"
    if "eagle" in name:
        return "eagle"
    if "dflash" in name:  # 0.20.0+: elif "dflash" in self.draft_model_config.model.lower()
        return "dflash"
    return "draft_model"


def speculative_state_blocks(text: str | None, vllm_version: str = NEWEST_RELEASE) -> int:
    """The blocks a hybrid model's state groups hold beyond their own per request (:data:`SPEC_STATE_BLOCKS_RULES`)."""
    if not text:
        return 0
    if not pick(SPEC_STATE_BLOCKS_RULES, vllm_version).counts_speculative_blocks:
        return 0
    return parsed(text).num_speculative_tokens


def mtp_layers(spec: ModelSpec) -> int:
    """The target's MTP layers from its config: ``mtp_num_hidden_layers`` (Qwen3.5/3.6), else
    ``num_nextn_predict_layers`` (DeepSeek, Qwen3-Next, GLM-4.5 ...)."""
    return spec.mtp_num_hidden_layers or spec.num_nextn_predict_layers


def _mtp_layout(spec: ModelSpec, target: KvLayout) -> tuple[LayerGroup, int, str]:
    n = mtp_layers(spec)
    if n <= 0:
        raise UsageError(
            f"{OPTION} method mtp, but the model's config has no MTP layers "
            "(mtp_num_hidden_layers / num_nextn_predict_layers)",
            where=f"{OPTION}: method",
            tip='use ngram, or an EAGLE drafter with "model": a local folder holding its config.json',
        )
    attention = [g for g in target.groups if g.kind in (FULL, MLA)]
    if not attention:
        raise UsageError(
            f"{OPTION} method mtp: the model has no full-attention layers for its MTP layers to copy",
            where=f"{OPTION}: method",
        )
    key = "mtp_num_hidden_layers" if spec.mtp_num_hidden_layers else "num_nextn_predict_layers"
    return dataclasses.replace(attention[0], num_layers=n), n, f"the model's own MTP layers ({key} {n})"


def _draft_spec(config: SpeculativeConfig) -> tuple[ModelSpec, dict[str, Any]]:
    """The drafter's config as kvtool parses it, and its config.json mapping."""
    from kvtool.estimate.hf_config import load_config_path, parse_config

    assert config.model is not None
    path = Path(config.model).expanduser()
    if not (path / "config.json").is_file() and not (path.is_file() and path.suffix == ".json"):
        raise UsageError(
            f"{OPTION} model {config.model!r} is not a local folder holding config.json; kvtool reads only local files",
            where=f"{OPTION}: model",
            tip=f"fetch its config first (hf download {config.model} config.json --local-dir DIR), and give DIR",
        )
    data, file = load_config_path(path)
    return parse_config(data, where=str(file)), data


def resolve_spec_decode(
    text: str, spec: ModelSpec, target: KvLayout, weights_method: str | None, kv_dtype: str, tp: int, vllm_version: str
) -> tuple[SpecDecode, tuple[LayerGroup, ...]]:
    """The drafter of ``--speculative-config`` and its KV-cache layer groups (per GPU)."""
    config = parsed(text)
    blocks = speculative_state_blocks(text, vllm_version)
    rule = pick(SPEC_STATE_BLOCKS_RULES, vllm_version)
    rules = [rule.source] if spec.state_layers else []
    groups: tuple[LayerGroup, ...] = ()
    weights, weights_method_text = 0, "no drafter model"
    source = f"{config.method}: no drafter model, no KV"
    if config.method in MTP_METHODS:
        group, n, source = _mtp_layout(spec, target)
        groups = (group,)
        rules.append(
            "vllm/config/speculative.py SpeculativeConfig.hf_config_override (0.20.1): n_predict = "
            "mtp_num_hidden_layers (qwen3_5) / num_nextn_predict_layers; vllm/model_executor/models/qwen3_5_mtp.py "
            "Qwen3_5MultiTokenPredictor: range(num_mtp_layers) decoder layers of the target's attention"
        )
        weights, weights_method_text = _mtp_weights(spec, n, weights_method)
    elif config.method in DRAFT_MODEL_METHODS:
        draft, data = _draft_spec(config)
        draft_kv_dtype = kv_dtype
        if config.method == "dflash":
            draft = _dflash_draft_spec(draft, data, spec.dtype, vllm_version)
            dflash_rule = pick(DFLASH_RULES, vllm_version)
            rules.append(dflash_rule.source)
            if not dflash_rule.follows_kv_cache_dtype:
                draft_kv_dtype = "auto"
        else:  # vllm/config/speculative.py (0.20.1): the draft ModelConfig takes dtype=target_model_config.dtype
            draft = dataclasses.replace(draft, dtype=spec.dtype)
        draft_layout = kv_layout(draft, draft_kv_dtype, config.draft_tensor_parallel_size or tp)
        groups = tuple(g for g in draft_layout.groups if g.num_layers)
        source = f"the drafter's config ({draft.source}): {draft.num_layers} layers"
        rules.append(
            "vllm/v1/worker/gpu_model_runner.py get_kv_cache_spec (0.20.1): every attention layer of the static "
            "forward context, the drafter's (vllm/v1/spec_decode/eagle.py EagleProposer.load_model) included"
        )
        weights, weights_method_text = _draft_weights(config, draft, vllm_version)
    rules.append(
        "vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size (0.20.1): the draft layers join the "
        "layers of their spec; 'Add %d padding layers, may waste at most %.2f%% KV cache memory' per type"
    )
    per_token = sum(g.bytes_per_token_per_layer * g.num_layers for g in groups)
    result = SpecDecode(
        method=config.method,
        num_speculative_tokens=config.num_speculative_tokens,
        draft_source=source,
        draft_kv_layers=sum(g.num_layers for g in groups),
        draft_kv_kind=groups[0].kind if groups else None,
        draft_bytes_per_token_per_gpu=-(-per_token.numerator // per_token.denominator) if groups else 0,
        draft_weights_bytes=weights,
        draft_weights_method=weights_method_text,
        speculative_state_blocks=blocks if spec.state_layers else 0,
        rules=tuple(rules),
    )
    return result, groups


# tensors of a drafter checkpoint that vLLM does not load (vllm/model_executor/models/llama_eagle3.py
# Eagle3LlamaForCausalLM.load_weights, 0.32.0: ``if "t2d" in name: continue``)
_UNLOADED_DRAFT_TENSORS = ("t2d",)


def _draft_weights(config: SpeculativeConfig, draft: ModelSpec, vllm_version: str) -> tuple[int, str]:
    """A separate drafter's weights: its checkpoint's tensors when the folder holds safetensors, else its config.

    The checkpoint is what the drafter owns: vLLM shares the target's embedding and LM head only where the
    checkpoint has none (vllm/v1/spec_decode/llm_base_proposer.py load_model, 0.32.0: "Detected EAGLE model
    without its own lm_head in the checkpoint. Sharing target model lm_head weights with the draft model"), so an
    EAGLE checkpoint without lm_head adds none, and its ``fc`` (2h or 3h -> h) is counted; the config estimate,
    a whole causal LM of the drafter's config, counts an LM head and misses ``fc``."""
    from kvtool.estimate.safetensors import weights_from_dir
    from kvtool.estimate.weights import estimate_weights

    path = Path(config.model or "").expanduser()
    folder = path if path.is_dir() else path.parent
    found_files = weights_from_dir(folder) if folder.is_dir() else None
    if found_files is not None and found_files.method == "safetensors headers":
        from kvtool.estimate.safetensors import read_header, tensor_bytes

        skipped = 0
        for file in found_files.files:
            for name, info in read_header(Path(file)).items():
                if name != "__metadata__" and name.rsplit(".", 1)[-1] in _UNLOADED_DRAFT_TENSORS:
                    skipped += tensor_bytes(name, info, Path(file))
        return found_files.weights_bytes - skipped, (
            f"the drafter's safetensors headers ({found_files.num_tensors} tensors"
            + (f", less {skipped:,} B of t2d vLLM does not load" if skipped else "")
            + "; the target's embedding / LM head shared where the checkpoint has none)"
        )
    found = estimate_weights(draft, vllm_version)
    if found is None:
        return 0, "the drafter's config does not size its weights"
    return found.weights_bytes, f"the drafter's {found.method} ({found.num_params:,} parameters)"


def _mtp_weights(spec: ModelSpec, n: int, weights_method: str | None) -> tuple[int, str]:
    """An MTP drafter's weights from the target's config: n decoder layers of its full-attention kind, each with an
    ``eh_proj`` (2 hidden -> hidden) and 3 norms; embeddings and LM head shared with the target."""
    if weights_method is not None and not weights_method.startswith("config estimate"):
        return 0, f"already in the checkpoint's {weights_method} (its mtp.* tensors)"
    from kvtool.estimate.dtypes import model_dtype_bytes
    from kvtool.estimate.pipeline import stage_spec
    from kvtool.estimate.weights import estimate_weights

    first = spec.layer_kinds.index(FULL) if FULL in spec.layer_kinds else 0
    one = stage_spec(spec, first, 1)
    found = estimate_weights(one)
    if found is None or not spec.hidden_size:
        return 0, "the config does not size the MTP layers' weights"
    dtype_bytes = model_dtype_bytes(spec.dtype)
    copies = 1 if spec.tie_word_embeddings else 2
    vocab = (spec.vocab_size or 0) * spec.hidden_size * copies
    layer_bytes = found.weights_bytes - vocab * dtype_bytes
    extra = (2 * spec.hidden_size * spec.hidden_size + 3 * spec.hidden_size) * dtype_bytes
    total = n * (layer_bytes + extra)
    return total, (
        f"config estimate: {n} x (one full-attention decoder layer {layer_bytes:,} B + eh_proj and norms "
        f"{extra:,} B at {spec.dtype}); embeddings and LM head shared"
    )


def with_draft_memory(spec_decode: SpecDecode, text: str, tp: int) -> SpecDecode:
    """``--draft-memory``: the drafter's weights per GPU as given, in place of kvtool's model of them (all GPUs: x tp,
    so the budget's ceil over TP gives back exactly the size given).  Refused where there is no drafter model
    (ngram, suffix) or where the checkpoint's safetensors headers hold its tensors already (an MTP drafter)."""
    from kvtool.core.units import parse_override_size

    if spec_decode.method in MODEL_FREE_METHODS:
        raise UsageError(
            f"--draft-memory: {spec_decode.method} has no drafter model, so no weights",
            where="--draft-memory",
            tip="leave --draft-memory out",
        )
    if spec_decode.draft_weights_method.startswith("already in the checkpoint"):
        raise UsageError(
            f"--draft-memory: the drafter's weights are {spec_decode.draft_weights_method}",
            where="--draft-memory",
            tip="leave --draft-memory out (the headers are exact)",
        )
    size = parse_override_size(text, option="--draft-memory")
    return dataclasses.replace(
        spec_decode, draft_weights_bytes=size * tp, draft_weights_method=f"--draft-memory {text} per GPU"
    )


def with_draft_layers(layout: KvLayout, draft: tuple[LayerGroup, ...], spec_decode: SpecDecode) -> KvLayout:
    """The target's layout with the draft layers added: a draft layer of a target group's spec joins that group (vLLM
    groups layers by equal KVCacheSpec), any other is a group of its own."""
    groups = list(layout.groups)
    for d in draft:
        for i, g in enumerate(groups):
            if dataclasses.replace(g, num_layers=d.num_layers) == d:
                groups[i] = dataclasses.replace(g, num_layers=g.num_layers + d.num_layers)
                break
        else:
            groups.append(d)
    note = (
        f"speculative decoding ({spec_decode.method}, {spec_decode.num_speculative_tokens} tokens): "
        f"{spec_decode.draft_kv_layers} draft {spec_decode.draft_kv_kind} layer(s) in the KV cache, {spec_decode.draft_source}"
        if draft
        else f"speculative decoding ({spec_decode.method}, {spec_decode.num_speculative_tokens} tokens): no draft KV"
    )
    return dataclasses.replace(layout, groups=tuple(groups), notes=(*layout.notes, note))


def padding_log_lines(layer_counts: list[int], group_size: int) -> tuple[str, ...]:
    """vLLM's "Add N padding layers, may waste at most X% KV cache memory", one per layer type that group_size does not
    divide (vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size, 0.18.0-0.20.1;
    kv_cache_planning.py, 0.33.0)."""
    lines = []
    for n in layer_counts:
        padding = group_size - n % group_size
        if padding != group_size:
            lines.append(f"Add {padding} padding layers, may waste at most {padding / n * 100:.2f}% KV cache memory")
    return tuple(lines)
