"""Read a Hugging Face ``config.json`` into a :class:`ModelSpec`, the way vLLM reads it.

Rules (vllm/config/model.py ``get_head_size``, ``get_total_num_kv_heads``; transformers configs):

- head size: an explicit ``head_dim`` wins, else ``hidden_size // num_attention_heads``;
- KV heads: Falcon ``multi_query: true`` without ``new_decoder_architecture`` means 1; otherwise the first
  of ``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num`` that is set; otherwise
  the attention-head count (MHA);
- MLA (``kv_lora_rank`` set): one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer;
- sliding windows: ``sliding_window: 0`` means none (vLLM ``ModelConfig``: "Some checkpoints set sliding_window
  to 0 to indicate that sliding window is disabled"); ``layer_types`` when present; else
  ``use_sliding_window: false`` means none; Gemma-2
  alternates (layer 0 sliding); ``sliding_window_pattern`` (Gemma-3) makes every N-th layer full; Qwen2's
  ``max_window_layers`` keeps the first layers full; otherwise a set ``sliding_window`` covers every layer (Mistral);
- per-layer KV shapes (Gemma 4, transformers' ``Gemma4TextConfig.per_layer_config``): a ``per_layer_config`` in the
  file (transformers >= 5.19 writes one: ``{"05": {"head_dim": 64, "num_key_value_heads": 1}}``) gives each listed
  layer's ``head_dim`` / ``num_key_value_heads``; without it full-attention layers keep ``global_head_dim`` values per
  head (512 when absent) and, when ``attention_k_eq_v``, ``num_global_key_value_heads`` KV heads; the other layers
  ``head_dim`` and ``num_key_value_heads``;
- KV sharing (Gemma 3n, Gemma 4): the last ``num_kv_shared_layers`` layers read an earlier layer's KV cache
  (vLLM's ``kv_sharing_target_layer_name``) and allocate none;
- dtype: ``dtype`` (transformers 5) or ``torch_dtype`` (older); multimodal configs use ``text_config``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtool.core.errors import InputFileError
from kvtool.core.jsonfile import read_json_object
from kvtool.estimate.dtypes import MODEL_DTYPE_BYTES
from kvtool.estimate.kinds import CHUNKED, FULL, SLIDING
from kvtool.estimate.rope import RotaryCache, rotary_caches

if TYPE_CHECKING:  # imported where a config needs them, so a plain decoder's estimate never loads them
    from kvtool.estimate.hybrid import MambaState
    from kvtool.estimate.quant import WeightQuant

# The model_types whose state layers kvtool.estimate.hybrid sizes (the keys of its READERS; a test keeps them equal).
HYBRID_TYPES = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "nemotron_h", "granitemoehybrid",
     "falcon_h1", "jamba"}
)  # fmt: skip
LLAMA4_TYPES = frozenset({"llama4", "llama4_text"})
GEMMA4_TYPES = frozenset({"gemma4", "gemma4_text"})
# Gemma 3n and Gemma 4 add per-layer embeddings, AltUp, Laurel (3n) and per-layer MLP widths that kvtool's weight
# formula does not count: their weights come from safetensors headers only.
PER_LAYER_EMBEDDING_TYPES = frozenset({"gemma3n", "gemma3n_text", *GEMMA4_TYPES})


@dataclasses.dataclass(frozen=True)
class KvShape:
    """What one attention layer caches per token: K and V, ``num_kv_heads`` heads of ``head_dim`` values each
    (before tensor parallelism)."""

    num_kv_heads: int
    head_dim: int


MANUAL = "manual"  # the model_type of a spec given by --layers --kv-heads --head-dim
NO_MODEL_TYPE = "unknown"  # the model_type of a config that names none


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What kvtool needs to know about a model, read from a config.json or a profile."""

    name: str
    source: str  # the file (or profile and its Hugging Face repo) the numbers came from
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int  # total over all GPUs; 1 for MLA (one latent per layer)
    head_dim: int  # per attention head; for MLA the latent width kv_lora_rank + qk_rope_head_dim
    hidden_size: int | None
    dtype: str  # config.json spelling: "bfloat16", "float16", "float32"
    layer_kinds: tuple[str, ...]  # FULL, SLIDING or CHUNKED, one per layer
    sliding_window: int | None  # tokens a sliding layer keeps (None: no sliding layers)
    attention_chunk_size: int | None = None  # tokens per chunk of a CHUNKED layer (None: no chunked layers)
    is_mla: bool = False
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int | None = None
    # Only for the weight estimate:
    vocab_size: int | None = None
    intermediate_size: int | None = None
    tie_word_embeddings: bool = False
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    n_shared_experts: int | None = None
    # one shared gated MLP of this width beside the routed experts (Qwen2-MoE / Qwen3-Next
    # shared_expert_intermediate_size, Granite-4.0 shared_intermediate_size; Nemotron-H's
    # moe_shared_expert_intermediate_size, per shared expert)
    shared_expert_intermediate_size: int | None = None
    first_k_dense_replace: int = 0
    moe_layers: tuple[int, ...] | None = None  # layers with experts (None: every layer from first_k_dense_replace)
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    num_nextn_predict_layers: int = 0
    mtp_num_hidden_layers: int = 0  # Qwen3.5/3.6's MTP layers (a speculative drafter, kvtool.estimate.spec_decode)
    # how quantized linear weights are stored (quantization_config or --quantization); None: all at `dtype`
    weight_quant: WeightQuant | None = None
    # hybrid models (kvtool.estimate.hybrid): each state layer keeps mamba_state per request, not per token
    mamba_state: MambaState | None = None
    state_layers: int = 0
    # Nemotron-H: each layer's block from hybrid_override_pattern (M Mamba-2, * attention, - MLP, E MoE); () otherwise
    block_types: tuple[str, ...] = ()
    # hybrid models: the Mamba-2 kernel's chunk (config mamba_chunk_size, else chunk_size; vLLM ModelConfig
    # get_mamba_chunk_size), which the "all" prefix-caching mode aligns attention blocks to; None when not given
    mamba_chunk_size: int | None = None
    # Gemma 4: the full-attention layers' own KV shape (global_head_dim, num_global_key_value_heads); None when every
    # layer caches num_kv_heads x head_dim
    full_attention_kv: KvShape | None = None
    # Gemma 3n / Gemma 4: the last kv_shared_layers layers reuse an earlier layer's KV cache and allocate none
    kv_shared_layers: int = 0
    # the rotary embeddings' cos/sin caches vLLM builds with the model (kvtool.estimate.rope), in no checkpoint
    rotary_caches: tuple[RotaryCache, ...] = ()
    notes: tuple[str, ...] = ()  # how each non-obvious value was read
    architectures: tuple[str, ...] = ()  # config.json's architectures (vLLM picks its model runner by them)

    @property
    def kv_layer_kinds(self) -> tuple[str, ...]:
        """The kinds of the layers that allocate a KV cache (all but the trailing KV-sharing layers)."""
        return self.layer_kinds[: len(self.layer_kinds) - self.kv_shared_layers]

    def kv_shape(self, kind: str) -> KvShape:
        """The KV shape of a layer of this kind (FULL layers may have their own, Gemma 4)."""
        if kind == FULL and self.full_attention_kv is not None:
            return self.full_attention_kv
        return KvShape(self.num_kv_heads, self.head_dim)

    @property
    def known_model_type(self) -> bool:
        """Whether kvtool's reading of this model_type was checked against published configs (KNOWN_MODEL_TYPES);
        manual mode states its shape itself.  Any other model_type is sized by the generic rules all the same."""
        return self.model_type in KNOWN_MODEL_TYPES or self.model_type == MANUAL

    @property
    def attention_kind(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == 1 and self.num_attention_heads > 1:
            return "MQA"
        if self.num_kv_heads < self.num_attention_heads:
            return f"GQA-{self.num_kv_heads}"
        return "MHA"


# Keys kvtool reads, with their accepted JSON types.  Profiles may use only these; config.json files may
# hold anything else, which is ignored.
_INT = (int,)
_OPT_INT = (int, type(None))
KNOWN_KEYS: dict[str, tuple[type, ...]] = {
    "model_type": (str,),
    "architectures": (list,),
    "hidden_size": _INT,
    "n_embd": _INT,
    "d_model": _INT,
    "num_hidden_layers": _INT,
    "n_layer": _INT,
    "num_layers": _INT,
    "n_layers": _INT,
    "num_attention_heads": _INT,
    "n_head": _INT,
    "num_heads": _INT,
    "num_key_value_heads": _OPT_INT,
    "num_kv_heads": _OPT_INT,
    "n_head_kv": _OPT_INT,
    "multi_query_group_num": _OPT_INT,
    "multi_query": (bool,),
    "new_decoder_architecture": (bool,),
    "head_dim": _OPT_INT,
    "intermediate_size": (int, list, type(None)),  # Gemma 3n lists one width per layer
    "ffn_hidden_size": _OPT_INT,
    "vocab_size": _INT,
    "padded_vocab_size": _INT,
    "max_position_embeddings": _OPT_INT,
    "tie_word_embeddings": (bool,),
    "dtype": (str, type(None)),
    "torch_dtype": (str, type(None)),
    "sliding_window": _OPT_INT,
    "use_sliding_window": (bool,),
    "max_window_layers": _OPT_INT,
    "sliding_window_pattern": _OPT_INT,
    "layer_types": (list,),
    "attention_chunk_size": _OPT_INT,
    "no_rope_layers": (list, type(None)),
    "no_rope_layer_interval": _OPT_INT,
    "kv_lora_rank": _OPT_INT,
    "q_lora_rank": _OPT_INT,
    "qk_rope_head_dim": _OPT_INT,
    "qk_nope_head_dim": _OPT_INT,
    "v_head_dim": _OPT_INT,
    "num_local_experts": _OPT_INT,
    "n_routed_experts": _OPT_INT,
    "num_experts": _OPT_INT,
    "num_experts_per_tok": _OPT_INT,
    "moe_intermediate_size": _OPT_INT,
    # hybrid models (kvtool.estimate.hybrid)
    "full_attention_interval": _OPT_INT,
    "linear_conv_kernel_dim": _OPT_INT,
    "linear_key_head_dim": _OPT_INT,
    "linear_value_head_dim": _OPT_INT,
    "linear_num_key_heads": _OPT_INT,
    "linear_num_value_heads": _OPT_INT,
    "mamba_ssm_dtype": (str, type(None)),
    "mamba_chunk_size": _OPT_INT,  # Bamba, Falcon-H1, Granite-4.0-H (vLLM ModelConfig.get_mamba_chunk_size)
    "chunk_size": _OPT_INT,  # Mamba-2, Nemotron-H, Zamba2
    "n_shared_experts": _OPT_INT,
    "shared_expert_intermediate_size": _OPT_INT,
    "shared_intermediate_size": _OPT_INT,
    "moe_shared_expert_intermediate_size": _OPT_INT,
    "first_k_dense_replace": _OPT_INT,
    "interleave_moe_layer_step": _OPT_INT,
    "moe_layers": (list, type(None)),
    "intermediate_size_mlp": _OPT_INT,
    "num_nextn_predict_layers": _OPT_INT,
    "mtp_num_hidden_layers": _OPT_INT,
    "parallel_attn": (bool,),
    "bias": (bool,),
    "text_config": (dict,),
    "quantization_config": (dict, type(None)),
    # per-layer KV shapes and KV sharing (Gemma 3n, Gemma 4)
    "global_head_dim": _OPT_INT,
    "num_global_key_value_heads": _OPT_INT,
    "attention_k_eq_v": (bool,),
    "num_kv_shared_layers": _OPT_INT,
    "per_layer_config": (dict, type(None)),
}

_FALCON_TYPES = {"falcon", "RefinedWeb", "RefinedWebModel"}


class _Reader:
    """Typed access to one config mapping, with errors that name the file and the field."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data = data
        self.where = where

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key, default)
        if key in self.data and key in KNOWN_KEYS and not _type_ok(value, KNOWN_KEYS[key]):
            raise InputFileError(
                f"{key} must be {_type_names(KNOWN_KEYS[key])}, not {type(value).__name__} {value!r}",
                where=f"{self.where}: field {key}",
            )
        return value

    def first(self, *keys: str) -> tuple[str | None, Any]:
        for key in keys:
            value = self.get(key)
            if value is not None:
                return key, value
        return None, None

    def need(self, *keys: str) -> int:
        """A required positive integer (the error names the file and the first key)."""
        value = self.positive(*keys, required=True)
        assert value is not None  # positive(required=True) raises instead of returning None
        return value

    def positive(self, *keys: str, required: bool = True, limit: int | None = None) -> int | None:
        """A positive integer, at most ``limit`` (default MAX_CONFIG_INT); None when absent and not required."""
        limit = MAX_CONFIG_INT if limit is None else limit
        key, value = self.first(*keys)
        if value is None:
            if required:
                raise InputFileError(f"config lacks {' / '.join(keys)}", where=f"{self.where}: field {keys[0]}")
            return None
        if value <= 0:
            raise InputFileError(f"{key} must be positive, not {value}", where=f"{self.where}: field {key}")
        if value > limit:
            raise InputFileError(
                f"{key} {value:.3g} is not a plausible model dimension (over {limit:,})",
                where=f"{self.where}: field {key}",
            )
        return value


# No published model comes near this in any dimension (vocabularies reach ~262k, hidden sizes ~30k, layers ~200);
# a larger value is a typo or a hostile file, refused in one line instead of an overflow deep in the arithmetic.
MAX_CONFIG_INT = 10_000_000
# Context lengths are larger: Llama 4 Scout's config says 10,485,760 tokens.  vLLM keeps token positions in int32.
MAX_CONTEXT_TOKENS = 2**31 - 1

# model_type values of encoder-only models: vLLM serves them as pooling models, without a KV cache.
ENCODER_ONLY = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "deberta", "deberta-v2", "electra", "albert", "modernbert"}
)
# Models that mix attention with linear-attention or Mamba-style layers (per-request recurrent state, sized by
# vLLM's MambaSpec / hybrid KV groups).  kvtool does not model them yet and refuses them rather than count every
# layer as full attention.
HYBRID_MODEL_TYPES = frozenset(
    {
        "mamba",
        "mamba2",
        "zamba",
        "zamba2",
        "bamba",
        "minimax",
        "minimax_m1",
        "minimax_text_01",
        "plamo2",
        "lfm2",
        "kimi_linear",
        "rwkv",
    }
)
HYBRID_KEYS = (
    "attn_type_list",
    "hybrid_override_pattern",
    "layers_block_type",
    "mamba_d_state",
    "linear_num_key_heads",
)


def refuse_unmodelled(data: dict[str, Any], where: str) -> None:
    """Encoder-only and hybrid (linear-attention / Mamba) configs: a clear refusal, never a wrong number."""
    nested = data.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else data
    model_type = str(text.get("model_type") or data.get("model_type") or "")
    architectures = " ".join(str(a) for a in data.get("architectures") or [])
    if model_type in ENCODER_ONLY or "ForMaskedLM" in architectures:
        raise InputFileError(
            f"{model_type or architectures} is an encoder-only model: vLLM serves it as a pooling model with no KV "
            "cache to size",
            where=f"{where}: field model_type",
        )
    listed = text.get("layer_types")
    layer_types: list[Any] = listed if isinstance(listed, list) else []
    odd = sorted({str(t) for t in layer_types} - {"full_attention", "sliding_attention", "attention"})
    if model_type in HYBRID_TYPES:
        return  # sized as vLLM 0.32 sizes it (kvtool.estimate.hybrid)
    hybrid_key = next((k for k in HYBRID_KEYS if k in text and not _all_full_attention(k, text[k])), None)
    if model_type in HYBRID_MODEL_TYPES or hybrid_key or odd:
        why = (
            f"layer_types holds {', '.join(odd)}"
            if odd
            else f"{hybrid_key} marks linear-attention or Mamba layers"
            if hybrid_key
            else f"model_type {model_type} mixes attention with linear-attention or Mamba layers"
        )
        raise InputFileError(
            f"hybrid model not modelled: {why}; vLLM keeps per-request recurrent state for those layers "
            "(MambaSpec) and sizes the KV groups differently, so kvtool will not count them as full attention"
            + (" (and vLLM 0.32 has no MiniMax-Text-01/M1 model class)" if model_type.startswith("minimax") else "")
            + f"; modelled: {', '.join(sorted(HYBRID_TYPES))}",
            where=f"{where}: field {'layer_types' if odd else hybrid_key or 'model_type'}",
            tip="vLLM's own start-up log gives its figure ('GPU KV cache size' and 'Maximum concurrency' lines)",
        )


def _all_full_attention(key: str, value: Any) -> bool:
    """MiniMax-M2's config.json lists ``attn_type_list`` with 1 (softmax attention) on every layer; only a 0 marks
    MiniMax-Text-01/M1's lightning (linear) attention.  vLLM's minimax_m2.py builds full attention on every layer."""
    return key == "attn_type_list" and isinstance(value, list) and bool(value) and all(v == 1 for v in value)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true is not an integer here
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}
    return " or ".join(names.get(t, "null") for t in types)


def load_config_path(path: str | Path) -> tuple[dict[str, Any], Path]:
    """Read ``config.json`` (or a directory holding one); return the mapping and the file read."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.exists():
        where = str(p)
        raise InputFileError("no config.json found" if p.is_dir() else "file not found", where=where)
    data = read_json_object(file)
    return data, file


# Defaults of transformers' config classes for keys that published config.json files leave out (vLLM reads configs
# through these classes, so it sees the defaults).  google/gemma-3-27b-it's text_config has no
# sliding_window_pattern, vocab_size or max_position_embeddings: transformers' Gemma3TextConfig
# (models/gemma3/configuration_gemma3.py) supplies vocab_size 262_208, max_position_embeddings 131_072 and
# sliding_window_pattern 6 (its layer_types: every 6th layer full attention, the others sliding).
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
    # transformers 5.19 models/gemma3n/configuration_gemma3n.py (Gemma3nTextConfig, google/gemma-3n-E4B's values):
    # layer_types defaults to every 5th layer full attention
    "gemma3n_text": {
        "vocab_size": 262_400,
        "hidden_size": 2048,
        "num_hidden_layers": 35,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32_768,
        "sliding_window": 512,
        "sliding_window_pattern": 5,
        "num_kv_shared_layers": 15,
    },
    # models/gemma4/configuration_gemma4.py (Gemma4TextConfig): every 6th layer full attention;
    # num_kv_shared_layers 0 (global_head_dim's default 512 is applied in _full_attention_kv)
    "gemma4_text": {
        "vocab_size": 262_144,
        "hidden_size": 2304,
        "num_hidden_layers": 30,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
    },
}


# model_type values whose transformers config class defaults tie_word_embeddings to False (transformers 5.19,
# models/*/configuration_*.py); PretrainedConfig's own default, and Gemma's, is True.  A config.json without the key
# (the published Mistral-Small-3.2-24B text_config, model_type mistral) has an untied LM head in vLLM.
UNTIED_BY_DEFAULT = frozenset(
    {
        "llama", "llama4_text", "mistral", "mixtral", "ministral", "ministral3", "mistral4",
        "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
        "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm", "glm4", "glm4_moe", "glm4_moe_lite",
        "gpt_oss", "gpt_neox", "phi", "phi3", "phimoe", "minimax", "minimax_m2", "nemotron", "nemotron_h",
        "granite", "granitemoe", "granitemoehybrid", "granitemoeshared", "olmo", "olmo2", "olmo3", "olmoe",
        "falcon_h1", "jamba", "dbrx", "exaone4", "hunyuan_v1_dense", "hunyuan_v1_moe", "seed_oss", "stablelm",
        "dots1", "longcat_flash",
    }
)  # fmt: skip


# Plain decoders whose config.json layout the rules above are written for: a profile (profiles/models/), a published
# config in the tests (tests/data/estimate/, tests/data/gpu-logs/) or a rule of their own covers each of them.
STANDARD_DECODER_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
        "phi3", "gpt_oss", "deepseek_v2", "deepseek_v3", "minimax_m2",
        # Qwen3-VL's language models: plain Qwen3 / Qwen3-MoE decoders (vllm/model_executor/models/qwen3_vl*.py)
        "qwen3_vl_text", "qwen3_vl_moe_text",
    }
)  # fmt: skip
# Every model_type kvtool knows: those plain decoders and the types that kvtool's reading rules name (Falcon's KV
# heads, Llama 4's chunked layers, the hybrid readers, transformers' class defaults).  A config of any other
# model_type is sized as a standard decoder from num_hidden_layers, num_key_value_heads and head_dim (and their
# aliases), and `kvtool estimate` says so in a warning (kvtool.estimate.estimator).
KNOWN_MODEL_TYPES = (
    STANDARD_DECODER_TYPES
    | LLAMA4_TYPES
    | PER_LAYER_EMBEDDING_TYPES
    | frozenset(_FALCON_TYPES)
    | HYBRID_TYPES
    | frozenset(_CLASS_DEFAULTS)
)


def _with_class_defaults(reader: _Reader, notes: list[str]) -> _Reader:
    """The config with its transformers class defaults filled in where keys are absent (see _CLASS_DEFAULTS)."""
    defaults = _CLASS_DEFAULTS.get(str(reader.data.get("model_type")), {})
    listed = "layer_types" in reader.data  # layer_types, when given, wins over any pattern
    missing = {k: v for k, v in defaults.items() if k not in reader.data and not (listed and k.startswith("sliding"))}
    if not missing:
        return reader
    notes.append(
        f"{', '.join(f'{k} {v}' for k, v in missing.items())}: not in the config, transformers' "
        f"{reader.data.get('model_type')} defaults (as vLLM reads it)"
    )
    return _Reader({**reader.data, **missing}, reader.where)


def parse_config(data: dict[str, Any], *, where: str, name: str | None = None) -> ModelSpec:
    """Turn a config.json mapping into a ModelSpec (see the module docstring for the rules)."""
    refuse_unmodelled(data, where)
    top = _Reader(data, where)
    text_config = top.get("text_config")
    cfg = _Reader({**text_config}, f"{where}: text_config") if isinstance(text_config, dict) else top
    notes: list[str] = []
    if cfg is not top:
        notes.append("read the language model from text_config")
    cfg = _with_class_defaults(cfg, notes)

    model_type = cfg.get("model_type") or top.get("model_type") or NO_MODEL_TYPE
    num_layers = cfg.need("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    num_heads = cfg.need("num_attention_heads", "n_head", "num_heads")
    hidden = cfg.positive("hidden_size", "n_embd", "d_model", required=False)

    dtype = _dtype(cfg, top, notes)
    kv_lora_rank = cfg.positive("kv_lora_rank", required=False)
    is_mla = kv_lora_rank is not None
    qk_rope = None
    if kv_lora_rank is not None:
        qk_rope = cfg.need("qk_rope_head_dim")
        head_dim = kv_lora_rank + qk_rope
        num_kv_heads = 1
        notes.append(f"MLA: one latent of kv_lora_rank {kv_lora_rank} + qk_rope_head_dim {qk_rope} per layer")
    else:
        explicit = cfg.positive("head_dim", required=False)
        if explicit is not None:
            head_dim = explicit
            if hidden is not None and hidden // num_heads != explicit:
                notes.append(f"head_dim {explicit} from the config (not hidden/heads = {hidden // num_heads})")
        else:
            if hidden is None:
                raise InputFileError("config lacks head_dim and hidden_size", where=f"{cfg.where}: field head_dim")
            if hidden % num_heads:
                raise InputFileError(
                    f"hidden_size {hidden} is not divisible by {num_heads} attention heads",
                    where=f"{cfg.where}: field hidden_size",
                )
            head_dim = hidden // num_heads
        num_kv_heads = _kv_heads(cfg, model_type, num_heads, notes)

    hybrid = None
    if model_type in HYBRID_TYPES:
        from kvtool.estimate.hybrid import read_hybrid

        hybrid = read_hybrid(cfg.data, model_type, cfg.where, MODEL_DTYPE_BYTES.get(dtype, 2), num_layers)
    chunked = _chunked_layer_kinds(cfg, model_type, num_layers, notes)
    chunk_size = None
    if hybrid is not None:
        layer_kinds, window = hybrid.layer_kinds, None
        notes.append(hybrid.note)
    elif chunked is not None:
        (layer_kinds, chunk_size), window = chunked, None
    else:
        layer_kinds, window = _layer_kinds(cfg, model_type, num_layers, notes)
    layer_kinds = _gemma4_last_layer_full(model_type, layer_kinds, notes)
    full_kv = _full_attention_kv(cfg, model_type, KvShape(num_kv_heads, head_dim), num_heads, layer_kinds, notes)
    shared = _kv_shared_layers(cfg, model_type, layer_kinds, notes)
    vocab = cfg.positive("vocab_size", "padded_vocab_size", required=False)
    experts = _expert_count(cfg, "num_local_experts", "n_routed_experts", "num_experts")
    llama4_mlp = _llama4_mlp(cfg, model_type, num_layers, notes)
    spec = ModelSpec(
        name=name or model_type,
        source=where,
        architectures=tuple(str(a) for a in top.get("architectures") or ()),
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        dtype=dtype,
        layer_kinds=layer_kinds,
        sliding_window=window,
        attention_chunk_size=chunk_size,
        is_mla=is_mla,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope,
        max_position_embeddings=_context_length(cfg, notes),
        vocab_size=vocab,
        intermediate_size=_intermediate_size(cfg),
        # absent from the config: the default of the model's transformers config class (see UNTIED_BY_DEFAULT)
        tie_word_embeddings=bool(
            cfg.get("tie_word_embeddings", top.get("tie_word_embeddings", model_type not in UNTIED_BY_DEFAULT))
        ),
        num_experts=experts,
        num_experts_per_tok=_expert_count(cfg, "num_experts_per_tok"),
        moe_intermediate_size=cfg.positive("moe_intermediate_size", required=False),
        n_shared_experts=cfg.get("n_shared_experts"),
        shared_expert_intermediate_size=_expert_count(
            cfg, "shared_expert_intermediate_size", "shared_intermediate_size", "moe_shared_expert_intermediate_size"
        ),
        first_k_dense_replace=cfg.get("first_k_dense_replace") or 0,
        q_lora_rank=cfg.positive("q_lora_rank", required=False),
        qk_nope_head_dim=cfg.positive("qk_nope_head_dim", required=False),
        v_head_dim=cfg.positive("v_head_dim", required=False),
        num_nextn_predict_layers=cfg.get("num_nextn_predict_layers") or 0,
        mtp_num_hidden_layers=cfg.get("mtp_num_hidden_layers") or 0,
        weight_quant=_weight_quant(top, dtype, notes),
        mamba_state=hybrid.state if hybrid else None,
        state_layers=hybrid.state_layers if hybrid else 0,
        block_types=hybrid.blocks if hybrid else (),
        mamba_chunk_size=(cfg.get("mamba_chunk_size") or cfg.get("chunk_size")) if hybrid else None,
        full_attention_kv=full_kv,
        kv_shared_layers=shared,
        rotary_caches=rotary_caches(
            cfg.data,
            model_type,
            (qk_rope if is_mla else head_dim) or 0,
            _context_length(cfg, []),
            full_head_size=full_kv.head_dim if full_kv is not None else None,
        ),
        notes=tuple(notes),
    )
    return dataclasses.replace(spec, **llama4_mlp) if llama4_mlp else spec


# Keys that give some layers their own KV shape or no KV cache at all, read for GEMMA4_TYPES (shapes) and
# KV_SHARING_TYPES (sharing) only; another model type carrying them is refused rather than sized with one shape.
GEMMA4_GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig.__post_init__: kwargs.pop("global_head_dim", 512)
PER_LAYER_KV_KEYS = ("global_head_dim", "num_global_key_value_heads", "num_kv_shared_layers")
KV_SHARING_TYPES = frozenset({"gemma3n", "gemma3n_text", *GEMMA4_TYPES})


def _refuse_other_per_layer_kv(cfg: _Reader, model_type: str) -> None:
    """A per-layer KV key on a model type whose vLLM class kvtool has not read: refused, never a wrong number."""
    same = {"global_head_dim": cfg.get("head_dim"), "num_global_key_value_heads": cfg.get("num_key_value_heads")}
    modelled = {"num_kv_shared_layers": KV_SHARING_TYPES}.get
    for key in PER_LAYER_KV_KEYS:
        value = cfg.get(key)
        if value in (None, 0) or value == same.get(key) or model_type in (modelled(key) or GEMMA4_TYPES):
            continue
        raise InputFileError(
            f"per-layer KV shapes not modelled for model_type {model_type}: {key} {value} gives some layers another "
            f"KV shape (or none); kvtool reads it for {', '.join(sorted(modelled(key) or GEMMA4_TYPES))} only",
            where=f"{cfg.where}: field {key}",
            tip="vLLM's own start-up log gives its figure ('GPU KV cache size' and 'Maximum concurrency' lines)",
        )


def _gemma4_last_layer_full(model_type: str, kinds: tuple[str, ...], notes: list[str]) -> tuple[str, ...]:
    """transformers' Gemma4TextConfig forces the last layer to full attention ("Last layer must use
    `full_attention`"), and vLLM builds the layers from that config."""
    if model_type not in GEMMA4_TYPES or not kinds or kinds[-1] == FULL:
        return kinds
    notes.append("Gemma 4: the last layer is full attention (transformers forces it)")
    return (*kinds[:-1], FULL)


def _full_attention_kv(
    cfg: _Reader, model_type: str, base: KvShape, num_heads: int, kinds: tuple[str, ...], notes: list[str]
) -> KvShape | None:
    """Gemma 4's full-attention layers: ``global_head_dim`` values per head and, only when ``attention_k_eq_v``,
    ``num_global_key_value_heads`` KV heads (transformers' Gemma4TextConfig.__post_init__ builds per_layer_config so;
    vLLM gemma4.py Gemma4DecoderLayer reads it).  None when they cache what the other layers cache."""
    _refuse_other_per_layer_kv(cfg, model_type)
    if model_type not in GEMMA4_TYPES or FULL not in kinds:
        return None
    listed_layers = cfg.get("per_layer_config")
    if listed_layers:
        return _per_layer_config_kv(cfg, listed_layers, base, num_heads, kinds, notes)
    head_dim = cfg.positive("global_head_dim", required=False)
    if head_dim is None:
        head_dim = GEMMA4_GLOBAL_HEAD_DIM
        notes.append(f"global_head_dim not in the config: {head_dim} (transformers' Gemma4TextConfig default)")
    kv_heads = base.num_kv_heads
    listed = cfg.positive("num_global_key_value_heads", required=False)
    if listed is not None and cfg.get("attention_k_eq_v", False):
        _check_kv_heads(cfg, "num_global_key_value_heads", listed, num_heads)
        kv_heads = listed
    elif listed is not None and listed != kv_heads:
        notes.append(
            f"num_global_key_value_heads {listed} ignored: attention_k_eq_v is false (transformers' Gemma4TextConfig "
            "applies it only to k_eq_v models)"
        )
    shape = KvShape(kv_heads, head_dim)
    if shape == base:
        return None
    notes.append(
        f"Gemma 4: full-attention layers cache {kv_heads} KV heads x {head_dim} (global_head_dim), sliding layers "
        f"{base.num_kv_heads} x {base.head_dim}"
    )
    return shape


def _check_kv_heads(cfg: _Reader, key: str, kv_heads: int, num_heads: int) -> None:
    refused = kv_heads_not_dividing(kv_heads, num_heads)
    if refused:
        raise InputFileError(f"{key} {refused}", where=f"{cfg.where}: field {key}")


def _per_layer_config_kv(
    cfg: _Reader, listed: dict[str, Any], base: KvShape, num_heads: int, kinds: tuple[str, ...], notes: list[str]
) -> KvShape | None:
    """Gemma 4 configs as transformers >= 5.19 writes them: ``per_layer_config`` maps a layer index to the values it
    overrides, and vLLM's Gemma4DecoderLayer reads ``head_dim`` and ``num_key_value_heads`` from each layer's config.
    kvtool keeps one shape per kind of layer, so the full-attention layers must agree among themselves and the
    sliding layers keep the model's shape; anything else is refused."""
    per_layer = [base] * len(kinds)
    for key, overrides in listed.items():
        where = f"{cfg.where}: field per_layer_config.{key}"
        if not (str(key).isdigit() and int(key) < len(kinds)) or not isinstance(overrides, dict):
            raise InputFileError(f"per_layer_config keys must be layer indices below {len(kinds)}", where=where)
        layer = _Reader(overrides, where)
        kv_heads = layer.positive("num_key_value_heads", required=False) or base.num_kv_heads
        _check_kv_heads(layer, "num_key_value_heads", kv_heads, num_heads)
        per_layer[int(key)] = KvShape(kv_heads, layer.positive("head_dim", required=False) or base.head_dim)
    shapes: dict[str, set[KvShape]] = {}
    for kind, shape in zip(kinds, per_layer, strict=True):
        shapes.setdefault(kind, set()).add(shape)
    for kind, found in shapes.items():
        if len(found) > 1 or (kind != FULL and found != {base}):
            raise InputFileError(
                f"per_layer_config gives {kind} layers KV shapes "
                f"{', '.join(f'{s.num_kv_heads} x {s.head_dim}' for s in sorted(found, key=str))}: kvtool models one "
                f"shape for full-attention layers and the model's {base.num_kv_heads} x {base.head_dim} for the others",
                where=f"{cfg.where}: field per_layer_config",
                tip="vLLM's own start-up log gives its figure ('GPU KV cache size' and 'Maximum concurrency' lines)",
            )
    (shape,) = shapes.get(FULL, {base})
    if shape == base:
        return None
    notes.append(
        f"Gemma 4: full-attention layers cache {shape.num_kv_heads} KV heads x {shape.head_dim} (per_layer_config), "
        f"sliding layers {base.num_kv_heads} x {base.head_dim}"
    )
    return shape


def _kv_shared_layers(cfg: _Reader, model_type: str, kinds: tuple[str, ...], notes: list[str]) -> int:
    """``num_kv_shared_layers``: the last layers read the KV cache of the last earlier layer of their kind (vLLM
    gemma3n.py / gemma4.py ``kv_sharing_target_layer_name``), so vLLM gives them no KV cache spec."""
    if model_type not in KV_SHARING_TYPES:
        return 0
    shared = cfg.get("num_kv_shared_layers") or 0
    if not 0 <= shared < len(kinds):
        raise InputFileError(
            f"num_kv_shared_layers must be between 0 and the {len(kinds)} layers less one, not {shared}",
            where=f"{cfg.where}: field num_kv_shared_layers",
        )
    owners = kinds[: len(kinds) - shared]
    for kind in set(kinds[len(kinds) - shared :]):
        if kind not in owners:
            raise InputFileError(
                f"num_kv_shared_layers {shared}: a shared {kind} layer has no earlier {kind} layer to read from "
                "(vLLM refuses to build the model)",
                where=f"{cfg.where}: field num_kv_shared_layers",
            )
    if shared:
        notes.append(
            f"the last {shared} layers reuse earlier layers' KV cache (num_kv_shared_layers) and allocate none: "
            f"{len(owners)} layers hold KV"
        )
    return shared


def _intermediate_size(cfg: _Reader) -> int | None:
    """The MLP width; None for Gemma 3n's list of per-layer widths (its weights are not estimated from the config)."""
    if isinstance(cfg.get("intermediate_size"), list):
        return None
    return cfg.positive("intermediate_size", "ffn_hidden_size", required=False)


def _expert_count(cfg: _Reader, *keys: str) -> int | None:
    """An expert count or size, None when absent or 0.  0 means none: ibm-granite/granite-4.0-h-micro's config.json
    says ``num_local_experts: 0`` and ``num_experts_per_tok: 0`` (vLLM's granitemoehybrid.py builds the MoE block only
    ``if config.num_local_experts > 0``); MiniMax-M2's says ``shared_intermediate_size: 0`` (no shared expert)."""
    key, value = cfg.first(*keys)
    if value == 0:
        return None
    return cfg.positive(key, required=False) if key else None


# vLLM's keys for the model's context (vllm/transformers_utils/model_arch_config_convertor.py
# ``derive_max_model_len_and_key``): the smallest one set wins.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def _context_length(cfg: _Reader, notes: list[str]) -> int | None:
    """The model's context as vLLM derives its default max_model_len: the smallest integer of _CONTEXT_KEYS."""
    for key in _CONTEXT_KEYS:  # type-checked and > 0, with file and field on error
        cfg.positive(key, required=False, limit=MAX_CONTEXT_TOKENS)
    found = {k: cfg.data[k] for k in _CONTEXT_KEYS if type(cfg.data.get(k)) is int and cfg.data[k] > 0}
    if not found:
        return None
    key = min(found, key=lambda k: found[k])
    if key != "max_position_embeddings":
        notes.append(f"context {found[key]:,} from {key} (vLLM takes the smallest of its length keys)")
    return found[key]


def _dtype(cfg: _Reader, top: _Reader, notes: list[str]) -> str:
    """The checkpoint dtype: ``dtype`` or ``torch_dtype`` (the language model's first), else float32."""
    dtype_key, dtype = cfg.first("dtype", "torch_dtype")
    if dtype is None:
        dtype_key, dtype = top.first("dtype", "torch_dtype")
    if dtype is None:
        notes.append("no dtype or torch_dtype in the config: float32 (the transformers default)")
        return "float32"
    if dtype not in MODEL_DTYPE_BYTES:
        raise InputFileError(
            f"unknown dtype {dtype!r}; expected one of {', '.join(sorted(MODEL_DTYPE_BYTES))}",
            where=f"{cfg.where}: field {dtype_key}",
        )
    return dtype


def _weight_quant(top: _Reader, dtype: str, notes: list[str]) -> WeightQuant | None:
    """Quantized weights from ``quantization_config`` (kvtool.estimate.quant); a method not modelled is said."""
    config = top.get("quantization_config")
    if config is None:
        return None
    from kvtool.estimate.quant import from_quantization_config

    quant = from_quantization_config(config, top.where, MODEL_DTYPE_BYTES.get(dtype, 2))
    if quant is None:
        notes.append(
            f"quantization_config quant_method {config.get('quant_method')!r} is not modelled: weights estimated at "
            f"the config dtype (safetensors headers beside the config give exact bytes)"
        )
    return quant


def kv_heads_not_dividing(kv_heads: int, num_heads: int) -> str | None:
    """Why vLLM refuses ``kv_heads`` for ``num_heads`` query heads, or None: its Attention layer asserts
    ``num_heads % num_kv_heads == 0`` (each KV head serves a whole group of query heads)."""
    if num_heads % kv_heads == 0:
        return None
    return (
        f"{kv_heads} does not divide the {num_heads} attention heads; vLLM's attention asserts "
        "num_heads % num_kv_heads == 0"
    )


def _kv_heads(cfg: _Reader, model_type: str, num_heads: int, notes: list[str]) -> int:
    new_arch = model_type in _FALCON_TYPES and bool(cfg.get("new_decoder_architecture", False))
    if not new_arch and cfg.get("multi_query", False):
        notes.append("multi_query: true (Falcon) means one KV head")
        return 1
    key, value = cfg.first("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    if value is None:
        return num_heads
    if value <= 0 or value > num_heads:
        raise InputFileError(
            f"{key} must be between 1 and the {num_heads} attention heads, not {value}",
            where=f"{cfg.where}: field {key}",
        )
    refused = kv_heads_not_dividing(value, num_heads)
    if refused:
        raise InputFileError(f"{key} {refused}", where=f"{cfg.where}: field {key}")
    return value


def _llama4_mlp(cfg: _Reader, model_type: str, num_layers: int, notes: list[str]) -> dict[str, Any]:
    """Llama 4's MLPs, for the weight estimate: the MoE layers (``moe_layers``, else every
    ``interleave_moe_layer_step``-th) hold the routed experts and one shared expert, both of ``intermediate_size``;
    the other layers a dense MLP of ``intermediate_size_mlp`` (transformers' Llama4TextMoe and Llama4TextMLP,
    vLLM's llama4.py).  Empty for other models."""
    if model_type not in LLAMA4_TYPES:
        return {}
    step = cfg.positive("interleave_moe_layer_step", required=False) or 1
    listed = cfg.get("moe_layers")
    if listed and not all(type(i) is int and 0 <= i < num_layers for i in listed):
        raise InputFileError(
            f"moe_layers must list layer indices below {num_layers}", where=f"{cfg.where}: field moe_layers"
        )
    moe = tuple(listed) if listed else tuple(range(step - 1, num_layers, step))
    inter = cfg.positive("intermediate_size", required=False)
    dense = cfg.positive("intermediate_size_mlp", required=False) or inter
    notes.append(
        f"Llama 4 weights: {len(moe)} MoE layers (routed experts and 1 shared expert of {inter}), "
        f"{num_layers - len(moe)} dense MLP layers of {dense}"
    )
    return {"moe_layers": moe, "moe_intermediate_size": inter, "intermediate_size": dense, "n_shared_experts": 1}


def _chunked_layer_kinds(cfg: _Reader, model_type: str, n: int, notes: list[str]) -> tuple[tuple[str, ...], int] | None:
    """Llama 4's layers and chunk: its RoPE layers attend within chunks of attention_chunk_size tokens (vLLM 0.32
    builds them as ChunkedLocalAttention, vllm/model_executor/models/llama4.py), its NoPE layers
    (no_rope_layers[i] == 0) attend to everything.  None for other models or without a chunk size."""
    if model_type not in LLAMA4_TYPES:
        return None
    chunk = cfg.positive("attention_chunk_size", required=False, limit=MAX_CONTEXT_TOKENS)
    if chunk is None:
        return None
    flags = cfg.get("no_rope_layers")
    if not flags:  # transformers' Llama4TextConfig: empty or absent means the default pattern
        interval = cfg.positive("no_rope_layer_interval", required=False) or 4
        flags = [int((i + 1) % interval != 0) for i in range(n)]
        notes.append(f"no_rope_layers not listed: every {interval}th layer is NoPE (transformers' default)")
    elif len(flags) != n or any(f not in (0, 1) for f in flags):
        raise InputFileError(
            f"no_rope_layers must list 0 or 1 for each of the {n} layers", where=f"{cfg.where}: field no_rope_layers"
        )
    kinds = tuple(CHUNKED if flag else FULL for flag in flags)
    notes.append(
        f"Llama 4: {kinds.count(CHUNKED)} RoPE layers attend within {chunk:,}-token chunks (chunked local "
        f"attention), {kinds.count(FULL)} NoPE layers attend to the whole context"
    )
    return kinds, chunk


def _layer_kinds(cfg: _Reader, model_type: str, n: int, notes: list[str]) -> tuple[tuple[str, ...], int | None]:
    window = cfg.get("sliding_window")
    if window == 0:  # vLLM turns 0 into None before reading layer kinds, so every layer is full attention
        notes.append("sliding_window 0: no sliding window (as vLLM reads it)")
        return (FULL,) * n, None
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != n:
            raise InputFileError(
                f"layer_types lists {len(layer_types)} layers but the model has {n}",
                where=f"{cfg.where}: field layer_types",
            )
        kinds = []
        for i, kind in enumerate(layer_types):
            if kind == "full_attention":
                kinds.append(FULL)
            elif kind == "sliding_attention":
                kinds.append(SLIDING)
            else:
                raise InputFileError(
                    f"layer type {kind!r} is not supported (full_attention or sliding_attention)",
                    where=f"{cfg.where}: field layer_types[{i}]",
                )
        if SLIDING in kinds and window is None:
            raise InputFileError(
                "layer_types has sliding_attention layers but sliding_window is not set",
                where=f"{cfg.where}: field sliding_window",
            )
        notes.append("layer kinds from layer_types")
        return tuple(kinds), (window if SLIDING in kinds else None)
    if window is None:
        return (FULL,) * n, None
    if window <= 0:
        raise InputFileError(
            f"sliding_window must be positive, not {window}", where=f"{cfg.where}: field sliding_window"
        )
    if cfg.get("use_sliding_window") is False:
        notes.append("use_sliding_window: false, so no sliding layers")
        return (FULL,) * n, None
    if model_type == "gemma2":
        notes.append("Gemma-2: layers alternate, layer 0 sliding")
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n)), window
    pattern = cfg.get("sliding_window_pattern")
    if pattern:
        notes.append(f"sliding_window_pattern {pattern}: every {pattern}th layer is full")
        return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)), window
    if model_type in {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"} and cfg.get("max_window_layers") is not None:
        first = cfg.get("max_window_layers")
        notes.append(f"Qwen2 max_window_layers {first}: layers from {first} on are sliding")
        return tuple(SLIDING if i >= first else FULL for i in range(n)), window
    notes.append(f"sliding_window {window} on every layer (Mistral rule)")
    return (SLIDING,) * n, window


def manual_spec(
    *, layers: int, kv_heads: int, head_dim: int, heads: int | None, hidden: int | None, dtype: str = "float16"
) -> ModelSpec:
    """A ModelSpec from ``--layers --kv-heads --head-dim`` (manual mode; no weights known)."""
    num_heads = heads or kv_heads
    return ModelSpec(
        name="manual",
        source="command-line options",
        model_type=MANUAL,
        num_layers=layers,
        num_attention_heads=num_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        dtype=dtype,
        layer_kinds=(FULL,) * layers,
        sliding_window=None,
    )
