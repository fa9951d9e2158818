"""The one table of data-type sizes: model dtypes and vLLM's ``--kv-cache-dtype`` names.

Sizes follow vLLM (vllm/utils/torch_utils.py ``STR_DTYPE_TO_TORCH_DTYPE`` and
``nvfp4_kv_cache_full_dim``; vllm/v1/kv_cache_interface.py ``real_page_size_bytes``):
every fp8 variant and int8 take one byte per element, nvfp4 packs a head of D elements into
D // 2 bytes of fp4 data plus D // 16 bytes of fp8 block scales, and int4 packs two elements
into a byte.  Sizes are exact ``Fraction``s so half-byte formats never round early.
"""

from __future__ import annotations

from fractions import Fraction

from kvtool.core.errors import UsageError

# Model (weight / activation) dtypes as written in config.json ("dtype" or "torch_dtype").
MODEL_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

# Canonical short name of a model dtype (what ``--kv-dtype auto`` resolves to).
_CANONICAL_MODEL_DTYPE = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "int8": "int8",
    "uint8": "int8",
}

# KV-cache dtypes: bytes per element.  nvfp4 is sized per head vector by kv_vector_bytes().
KV_DTYPE_BYTES: dict[str, Fraction] = {
    "fp32": Fraction(4),
    "fp16": Fraction(2),
    "bf16": Fraction(2),
    "fp8": Fraction(1),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "int8": Fraction(1),
    "int4": Fraction(1, 2),
    "nvfp4": Fraction(9, 16),  # D/2 data + D/16 scales per D elements (when 16 divides D)
    "fp8_ds_mla": Fraction(1),  # MLA only: a fixed 656 bytes per token per layer (see kv_memory)
}

# vLLM spellings accepted as aliases.
_KV_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float": "fp32"}

KV_DTYPE_NAMES: tuple[str, ...] = ("auto", *KV_DTYPE_BYTES)

# vLLM's fp8_ds_mla layout (FlashMLA sparse): 656 bytes per token per layer
# (vllm/v1/kv_cache_interface.py MLAAttentionSpec.real_page_size_bytes: block_size * 656).
FP8_DS_MLA_BYTES_PER_TOKEN = 656


def model_dtype_bytes(name: str) -> int:
    """Bytes per element of a config.json dtype name ("bfloat16", "float16", ...)."""
    try:
        return MODEL_DTYPE_BYTES[name]
    except KeyError:
        raise UsageError(
            f"unknown model dtype {name!r}", tip=f"use one of: {', '.join(sorted(MODEL_DTYPE_BYTES))}"
        ) from None


def resolve_kv_dtype(kv_dtype: str, model_dtype: str) -> str:
    """The concrete KV dtype name: ``auto`` means the model's dtype, as in vLLM."""
    name = kv_dtype.strip().lower()
    name = _KV_ALIASES.get(name, name)
    if name == "auto":
        return _CANONICAL_MODEL_DTYPE.get(model_dtype, "fp16")
    if name not in KV_DTYPE_BYTES:
        from difflib import get_close_matches

        close = get_close_matches(name, KV_DTYPE_NAMES, n=3)
        tip = f"did you mean {' or '.join(close)}?" if close else f"use one of: {', '.join(KV_DTYPE_NAMES)}"
        raise UsageError(f"unknown --kv-dtype {kv_dtype!r}", where="--kv-dtype", tip=tip)
    return name


def kv_vector_bytes(kv_dtype: str, elements: int) -> Fraction:
    """Bytes that one cached vector of ``elements`` values takes in ``kv_dtype`` (exact).

    nvfp4: ``elements // 2 + elements // 16`` (vLLM ``nvfp4_kv_cache_full_dim``);
    int4: half a byte per element; everything else: elements x element size.
    """
    if kv_dtype == "nvfp4":
        return Fraction(elements // 2 + elements // 16)
    return KV_DTYPE_BYTES[kv_dtype] * elements
