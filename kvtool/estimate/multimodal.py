"""A multimodal checkpoint's vision encoder, as vLLM loads and profiles it: its weights, and the torch memory the
encoder profiling run of ``profile_run`` adds before the KV budget is taken.

Weights: the encoder's parameters from ``vision_config`` (and the projector's from the text hidden size), per
architecture, counted from vLLM's model files (0.19.0):

- SigLIP (Gemma 3; vllm/model_executor/models/siglip.py ``SiglipVisionEmbeddings``, ``SiglipEncoderLayer``,
  gemma3_mm.py ``Gemma3MultiModalProjector``): a biased patch Conv2d, a position embedding of (image/patch)^2 rows,
  per layer two LayerNorms (weight + bias), qkv and out projections with biases, fc1/fc2 with biases; a post
  LayerNorm; the projector's ``mm_input_projection_weight`` (vision hidden x text hidden) and its RMSNorm.
- Pixtral (Mistral 3; pixtral.py ``PixtralHFVisionModel``, ``PixtralHFTransformerBlock``, mistral3.py
  ``Mistral3MultiModalProjector``): a bias-free patch Conv2d, RMSNorm ln_pre, per layer two RMSNorms, qkv/o and a
  gated MLP (gate_up, down), no biases; the projector's RMSNorm, patch merger (4 h -> h), linear_1 (h -> text
  hidden) and linear_2 (text hidden -> text hidden), biased when ``multimodal_projector_bias``.
- Llama 4 (mllama4.py ``Llama4VisionModel``, ``Llama4VisionEncoderLayer``, ``Llama4VisionPixelShuffleMLP``,
  ``Llama4MultiModalProjector``): an unfold-conv linear (3 x patch^2 -> h, no bias), class and positional embeddings,
  pre/post LayerNorms, per layer two LayerNorms, biased qkv/o and fc1/fc2; the pixel-shuffle MLP (intermediate ->
  projector_input_dim -> projector_output_dim) and linear_1 (vision_output_dim -> text hidden).
- Qwen3-VL (qwen3_vl.py ``Qwen3_VisionTransformer``): a biased Conv3d patch embedding (temporal x patch^2), a
  position embedding, per block two LayerNorms, biased qkv/proj and linear_fc1/fc2; the merger (LayerNorm over h,
  4 h -> 4 h -> out_hidden) and one deepstack merger per ``deepstack_visual_indexes`` entry (LayerNorm over 4 h).

The encoder's linear layers are split over TP like the language model's (QKVParallelLinear, Column/RowParallelLinear)
unless ``--mm-encoder-tp-mode data`` replicates them (the encoder runs data-parallel, every rank holds all of it),
for the architectures whose vLLM file honours it in that release (:data:`DATA_PARALLEL_SINCE`).  Embeddings, norms
and biases count as replicated.

Profiling (vllm/v1/worker/gpu_model_runner.py ``profile_run`` (0.19.0)): unless every modality is limited to 0
(``--limit-mm-per-prompt '{"image": 0}'``: vllm/v1/core/encoder_cache_manager.py ``compute_mm_encoder_budget``
returns 0 and no encoder runs), vLLM builds ``max_items = encoder_budget // max_tokens_per_item`` dummy images at
the size with the most features, with ``encoder_budget = max(max_num_batched_tokens, max_tokens_per_item)``, runs
``embed_multimodal`` on them and keeps the outputs in ``encoder_cache`` (and the dummy pixel values in
``batched_dummy_mm_inputs``) through the language model's dummy run.  The torch peak is therefore the larger of the
encoder's transient and the language model's, plus the dummy pixels and the outputs that stay resident.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

from kvtool.core.errors import UsageError
from kvtool.estimate.vllm_versions import pick, version_key

SIGLIP, PIXTRAL, LLAMA4, QWEN3_VL = "siglip", "pixtral", "llama4_vision", "qwen3_vl"
NO_LIMIT = 999  # vLLM's per-prompt item limit when --limit-mm-per-prompt leaves a modality out
WEIGHTS_MODE, DATA_MODE = "weights", "data"  # vLLM's --mm-encoder-tp-mode values


# from this release the tower and projector are not built when their modality's limit is 0 (gemma3_mm.py and
# mistral3.py construct them inside _mark_tower_model since 0.15.0; absent in 0.14.1)
TOWER_SKIPPED_SINCE = "0.15.0"


class DataParallelRule(NamedTuple):
    """Which encoders ``--mm-encoder-tp-mode data`` replicates, for the releases from ``since``."""

    since: str
    source: str
    towers: frozenset[str]


# The option exists from 0.10.2 (vllm/config/__init__.py MultiModalConfig.mm_encoder_tp_mode (0.10.2)); Llama 4's
# vision model honours it from then (mllama4.py use_data_parallel), SigLIP and Pixtral from 0.14.0 (siglip.py,
# pixtral.py disable_tp=use_data_parallel (0.14.0); absent in 0.13.0), Qwen3-VL from its first file (qwen3_vl.py
# use_data_parallel (0.11.0)).
DATA_PARALLEL_SINCE: tuple[DataParallelRule, ...] = (
    DataParallelRule("0.10.0", "vllm/engine/arg_utils.py EngineArgs (0.10.0): no --mm-encoder-tp-mode", frozenset()),
    DataParallelRule(
        "0.10.2",
        "vllm/model_executor/models/mllama4.py Llama4VisionModel use_data_parallel (0.10.2)",
        frozenset({LLAMA4, QWEN3_VL}),
    ),
    DataParallelRule(
        "0.14.0",
        "vllm/model_executor/models/siglip.py, pixtral.py disable_tp=use_data_parallel (0.14.0)",
        frozenset({LLAMA4, QWEN3_VL, SIGLIP, PIXTRAL}),
    ),
)


@dataclasses.dataclass(frozen=True)
class VisionEncoder:
    """A vision tower and projector read from a config.json's ``vision_config``."""

    tower: str  # SIGLIP, PIXTRAL, LLAMA4, QWEN3_VL
    split_params: int  # linear weights vLLM splits over TP (weights mode)
    replicated_params: int  # embeddings, norms, biases: on every rank
    hidden_size: int
    intermediate_size: int
    # one dummy item at the size with the most features: the tokens it puts in the prompt (None: not known from the
    # config, e.g. Qwen3-VL's processor max_pixels), the patches the tower runs on, its pixel values
    tokens_per_item: int | None
    patches_per_item: int
    pixels_per_item: int
    text_hidden_size: int
    source: str  # the vLLM files counted
    num_layers: int = 0  # the tower's layers (vision_config num_hidden_layers / depth; SGLang's VLM adjustment)

    @property
    def num_params(self) -> int:
        return self.split_params + self.replicated_params


@dataclasses.dataclass(frozen=True)
class EncoderPlan:
    """The encoder as one run holds it: weights per GPU and the profiling run's terms (bytes)."""

    encoder: VisionEncoder
    weights_bytes_per_gpu: int
    profiled: bool  # False: --limit-mm-per-prompt turned every modality off, or tokens per item unknown
    items: int  # dummy images in the profiling batch
    # the encoder budget vLLM logs ("Encoder cache will be initialized with a budget of N tokens"): 0 when not profiled
    encoder_budget_tokens: int
    transient_bytes: int  # the tower's largest transient over the dummy batch
    resident_bytes: int  # dummy pixel values + encoder outputs kept through the language model's dummy run
    method: str


def _layernorm(h: int) -> int:
    return 2 * h


def _siglip(v: dict, text_hidden: int, data: dict) -> VisionEncoder:
    h, inter, layers = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    patch, image = v.get("patch_size", 14), v.get("image_size", 896)
    side = image // patch
    split = layers * (4 * h * h + 2 * h * inter)
    replicated = (
        3 * patch * patch * h
        + h  # patch_embedding Conv2d weight + bias
        + side * side * h  # position_embedding
        + layers * (2 * _layernorm(h) + 4 * h + inter + h)  # norms; qkv, out, fc1, fc2 biases
        + _layernorm(h)  # post_layernorm
        + h  # Gemma3MultiModalProjector.mm_soft_emb_norm
    )
    if data.get("model_type") == "paligemma":
        # paligemma.py PaliGemmaMultiModalProjector: one biased nn.Linear(vision hidden, projection_dim), no norm;
        # one image token per patch (siglip.py SiglipEncoderInfo.get_num_image_tokens: (image // patch)^2)
        proj = data.get("projection_dim", v.get("projection_dim", text_hidden))
        return VisionEncoder(
            SIGLIP, split + h * proj, replicated - h + proj, h, inter, side * side, side * side, 3 * image * image,
            proj, "vllm/model_executor/models/siglip.py, paligemma.py (0.32.0)",
        )  # fmt: skip
    split += h * text_hidden  # mm_input_projection_weight
    return VisionEncoder(
        SIGLIP, split, replicated, h, inter, data.get("mm_tokens_per_image", 256), side * side, 3 * image * image, text_hidden,
        "vllm/model_executor/models/siglip.py, gemma3_mm.py (0.19.0)",
    )  # fmt: skip


def _pixtral(v: dict, text_hidden: int, data: dict) -> VisionEncoder:
    h, inter, layers = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    patch, image = v.get("patch_size", 14), v.get("image_size", 1540)
    merge = data.get("spatial_merge_size", 2)
    side = image // patch
    bias = bool(data.get("multimodal_projector_bias", False))
    split = layers * (4 * h * h + 3 * h * inter) + h * text_hidden + text_hidden * text_hidden
    replicated = (
        3 * patch * patch * h  # patch_conv, no bias
        + h  # ln_pre (RMSNorm)
        + layers * 2 * h  # attention_norm, ffn_norm
        + h
        + merge * merge * h * h  # projector norm, patch merger (replicated nn.Linear)
        + (2 * text_hidden if bias else 0)
    )
    merged = image // (patch * merge)
    return VisionEncoder(
        PIXTRAL, split, replicated, h, inter, merged * merged, side * side, 3 * image * image, text_hidden,
        "vllm/model_executor/models/pixtral.py, mistral3.py (0.19.0)",
    )  # fmt: skip


# the Llama 4 image processor's max_patches (tiles of image_size; transformers Llama4ImageProcessorFast default),
# which vllm/model_executor/models/mllama4.py get_image_size_with_most_features (0.19.0) reads from the processor
LLAMA4_MAX_TILES = 16


def _llama4(v: dict, text_hidden: int) -> VisionEncoder:
    h, inter, layers = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    patch, image = v.get("patch_size", 14), v.get("image_size", 336)
    ratio = v.get("pixel_shuffle_ratio", 0.5)
    proj_in, proj_out = v["projector_input_dim"], v["projector_output_dim"]
    side = image // patch
    bias = bool(v.get("multi_modal_projector_bias", False))
    split = (
        3 * patch * patch * h  # Llama4UnfoldConvolution linear
        + layers * (4 * h * h + 2 * h * inter)
        + inter * proj_in
        + proj_in * proj_out  # vision_adapter's pixel-shuffle MLP fc1, fc2
        + v["vision_output_dim"] * text_hidden  # multi_modal_projector.linear_1
    )
    replicated = (
        h
        + (side * side + 1) * h  # class_embedding, positional_embedding_vlm
        + 2 * _layernorm(h)  # layernorm_pre, layernorm_post
        + layers * (2 * _layernorm(h) + 4 * h + inter + h)
        + ((proj_in + proj_out) if bias else 0)
    )
    tiles = LLAMA4_MAX_TILES + 1  # the tiles and the global view
    per_tile = side * side // round(1 / ratio**2)
    return VisionEncoder(
        LLAMA4, split, replicated, h, inter, tiles * per_tile, tiles * (side * side + 1), tiles * 3 * image * image,
        text_hidden, "vllm/model_executor/models/mllama4.py (0.19.0)",
    )  # fmt: skip


def _qwen3_vl(v: dict) -> VisionEncoder:
    h, inter, layers = v["hidden_size"], v["intermediate_size"], v["depth"]
    patch, temporal, merge = v.get("patch_size", 16), v.get("temporal_patch_size", 2), v.get("spatial_merge_size", 2)
    out = v["out_hidden_size"]
    wide = h * merge * merge
    deepstack = len(v.get("deepstack_visual_indexes") or ())
    merger = wide * wide + wide * out  # linear_fc1, linear_fc2
    split = layers * (4 * h * h + 2 * h * inter) + (1 + deepstack) * merger
    replicated = (
        3 * temporal * patch * patch * h
        + h  # Conv3d patch_embed with bias
        + v.get("num_position_embeddings", 2304) * h
        + layers * (2 * _layernorm(h) + 4 * h + inter + h)
        + _layernorm(h)
        + deepstack * _layernorm(wide)  # merger norms
        + (1 + deepstack) * (wide + out)  # merger biases
    )
    return VisionEncoder(
        QWEN3_VL, split, replicated, h, inter, None, 0, 0, out, "vllm/model_executor/models/qwen3_vl.py (0.19.0)"
    )


def vision_encoder(data: dict, text_hidden: int | None) -> VisionEncoder | None:
    """The vision tower of a config.json, or None when it has none or kvtool does not know its architecture."""
    v = data.get("vision_config")
    if not isinstance(v, dict) or not text_hidden:
        return None
    kind = str(v.get("model_type", ""))
    try:
        if kind.startswith("siglip"):
            tower = _siglip(v, text_hidden, data)
        elif kind == "pixtral":
            tower = _pixtral(v, text_hidden, data)
        elif kind == "llama4_vision_model":
            tower = _llama4(v, text_hidden)
        elif kind.startswith("qwen3_vl"):
            tower = _qwen3_vl(v)
        else:
            return None
    except (KeyError, TypeError):
        return None
    return dataclasses.replace(tower, num_layers=int(v.get("num_hidden_layers") or v.get("depth") or 0))


def parse_limit_mm_per_prompt(text: str | None) -> dict[str, int] | None:
    """vLLM's ``--limit-mm-per-prompt`` JSON (``{"image": 2, "video": 0}``); None when not given."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            f"--limit-mm-per-prompt is not JSON ({e.msg})",
            where="--limit-mm-per-prompt",
            tip="write it as vLLM takes it: --limit-mm-per-prompt '{\"image\": 0}'",
        ) from None
    if not isinstance(value, dict):
        raise UsageError(
            "--limit-mm-per-prompt must be a JSON object of modality: count", where="--limit-mm-per-prompt"
        )
    out: dict[str, int] = {}
    for key, count in value.items():
        if isinstance(count, dict):
            count = count.get("count", 1)  # vLLM 0.11+: {"image": {"count": 1, "width": ..}}
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UsageError(
                f"--limit-mm-per-prompt: {key!r} needs a count >= 0 (got {count!r})", where="--limit-mm-per-prompt"
            )
        out[str(key)] = count
    return out


def check_tp_mode(mode: str | None, vllm_version: str) -> str:
    """``--mm-encoder-tp-mode``: weights (vLLM's default) or data; refused before the release that has it."""
    if mode is None:
        return WEIGHTS_MODE
    if mode not in (WEIGHTS_MODE, DATA_MODE):
        raise UsageError(
            f"unknown --mm-encoder-tp-mode {mode!r}", where="--mm-encoder-tp-mode", tip="use weights or data"
        )
    if mode == DATA_MODE and version_key(vllm_version) < version_key("0.10.2"):
        raise UsageError(
            f"vLLM {vllm_version} has no --mm-encoder-tp-mode (added in 0.10.2)", where="--mm-encoder-tp-mode"
        )
    return mode


def plan_encoder(
    encoder: VisionEncoder,
    *,
    dtype_bytes: int,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    limit_mm_per_prompt: dict[str, int] | None,
    tp_mode: str,
    vllm_version: str,
) -> EncoderPlan:
    """The encoder's weights per GPU and its profiling terms under ``vllm_version``'s rules."""
    replicate = tp_mode == DATA_MODE and encoder.tower in pick(DATA_PARALLEL_SINCE, vllm_version).towers
    split_tp = 1 if replicate else tp
    weights = (-(-encoder.split_params // split_tp) + encoder.replicated_params) * dtype_bytes
    how = [f"{encoder.tower} encoder {encoder.num_params:,} parameters ({encoder.source})"]
    how.append("replicated on every rank (--mm-encoder-tp-mode data)" if replicate else f"split over TP {tp}")
    limits = limit_mm_per_prompt or {}
    if limits.get("image", 1) == 0:
        how.append("not profiled: --limit-mm-per-prompt image 0 (compute_mm_encoder_budget returns 0)")
        if version_key(vllm_version) >= version_key(TOWER_SKIPPED_SINCE):
            weights = 0
            how.append(
                f"not loaded (vllm/model_executor/models/interfaces.py _mark_tower_model ({TOWER_SKIPPED_SINCE}))"
            )
        return EncoderPlan(encoder, weights, False, 0, 0, 0, 0, "; ".join(how))
    if encoder.tokens_per_item is None:
        how.append("profiling not modelled: the tokens per image depend on the processor's max_pixels")
        return EncoderPlan(encoder, weights, False, 0, 0, 0, 0, "; ".join(how))
    # vllm/v1/core/encoder_cache_manager.py compute_mm_encoder_budget (0.32.0): min(max(max_num_encoder_input_tokens,
    # t), max(encoder_cache_size, t)), both scheduler fields equal to max_num_batched_tokens (vllm/config/scheduler.py);
    # vllm/multimodal/encoder_budget.py MultiModalBudget._get_max_items (0.19.0): the encoder budget's items, at
    # most max_num_seqs x the items a prompt holds, at least one
    budget = max(max_num_batched_tokens, encoder.tokens_per_item)
    per_prompt = max(1, min(limits.get("image", NO_LIMIT), max_model_len // encoder.tokens_per_item))
    items = max(1, min(budget // encoder.tokens_per_item, max_num_seqs * per_prompt))
    patches = items * encoder.patches_per_item
    # one layer's MLP in and out (fc1 output, activation output) over every patch, and the residual stream twice
    transient = patches * (2 * encoder.intermediate_size // split_tp + 2 * encoder.hidden_size) * dtype_bytes
    resident = items * (encoder.pixels_per_item + encoder.tokens_per_item * encoder.text_hidden_size) * dtype_bytes
    how.append(
        f"profiled on {items} dummy images of {encoder.tokens_per_item:,} tokens (budget max({max_num_batched_tokens:,}"
        f", {encoder.tokens_per_item:,})), {patches:,} patches"
    )
    return EncoderPlan(encoder, weights, True, items, budget, transient, resident, "; ".join(how))
