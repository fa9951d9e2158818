"""Random LoRA adapters in PEFT format, written without peft or safetensors.

An adapter directory holds ``adapter_config.json`` (PEFT's ``LoraConfig`` fields that vLLM reads:
``r``, ``lora_alpha``, ``target_modules``, ``base_model_name_or_path``) and
``adapter_model.safetensors`` with ``base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight``
tensors (A: ``r x in_features``, B: ``out_features x r``), the names PEFT writes for a Llama-style model.
The weights are random: the isolation check needs adapters that differ, not adapters that are useful.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

from kvtool.core.errors import InputFileError

LORA_RANK = 8


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """What a q/v LoRA needs to know about the base model (from its config.json)."""

    num_layers: int
    hidden_size: int
    q_out_features: int  # num_attention_heads x head_dim
    v_out_features: int  # num_key_value_heads x head_dim


def attention_shape(model_dir: Path) -> AttentionShape:
    """Read layer count and q/v projection sizes from a Hugging Face config.json."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputFileError(f"cannot read the model's config.json: {err}", where=str(path)) from None
    config = config.get("text_config", config)
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        layers = int(config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as err:
        raise InputFileError(f"config.json lacks a usable field: {err}", where=str(path)) from None
    return AttentionShape(layers, hidden, heads * head_dim, kv_heads * head_dim)


def _safetensors_bytes(tensors: dict[str, tuple[tuple[int, int], bytes]]) -> bytes:
    """A safetensors file: 8-byte little-endian header length, JSON header, then the F32 data."""
    header: dict[str, object] = {}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the spec pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(raw)) + raw + b"".join(data for _, data in tensors.values())


def write_random_adapter(directory: Path, shape: AttentionShape, base_model: str, seed: int) -> Path:
    """Write one random rank-8 q/v LoRA adapter into ``directory`` (created); return the directory."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tensors: dict[str, tuple[tuple[int, int], bytes]] = {}
    for layer in range(shape.num_layers):
        for module, out_features in (("q_proj", shape.q_out_features), ("v_proj", shape.v_out_features)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            for part, dims in (("lora_A", (LORA_RANK, shape.hidden_size)), ("lora_B", (out_features, LORA_RANK))):
                values = rng.normal(0.0, 0.02, size=dims).astype("<f4")
                tensors[f"{prefix}.{part}.weight"] = (dims, values.tobytes())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (directory / "adapter_model.safetensors").write_bytes(_safetensors_bytes(tensors))
    return directory
