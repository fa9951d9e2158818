"""Weights: config estimates against published parameter counts; safetensors headers read exactly."""

from __future__ import annotations

import json
import struct

import pytest

from kvtool.errors import InputFileError
from kvtool.profile_loader import find_model, model_spec
from kvtool.safetensors_header import weights_from_dir
from kvtool.weights import estimate_params


# Published parameter counts (Hugging Face model cards / Meta's Llama papers): Llama-2-7B 6.74B, 13B 13.0B,
# 70B 69.0B; Llama-3-8B 8.03B; Llama-3.1-70B 70.6B; Llama-3.1-405B 405B; Mistral-7B 7.24B; Qwen2.5-7B 7.61B.
@pytest.mark.parametrize(
    "name, published",
    [
        ("llama-2-7b", 6.74e9), ("llama-2-13b", 13.0e9), ("llama-2-70b", 69.0e9), ("llama-3-8b", 8.03e9),
        ("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.6e9), ("llama-3.1-405b", 405e9),
        ("mistral-7b-v0.1", 7.24e9), ("qwen2.5-7b", 7.61e9), ("qwen2.5-72b", 72.7e9),
    ],
)
def test_dense_within_2_percent_of_published(name, published):
    params = estimate_params(model_spec(find_model(name)))
    assert abs(params - published) / published < 0.02


# MoE and MLA: Mixtral-8x7B 46.7B (Mistral AI), DeepSeek-V2-Lite 15.7B and DeepSeek-V3 671B (DeepSeek papers).
@pytest.mark.parametrize("name, published", [("mixtral-8x7b", 46.7e9), ("deepseek-v2-lite", 15.7e9), ("deepseek-v3", 671e9)])
def test_moe_and_mla_within_2_percent(name, published):
    params = estimate_params(model_spec(find_model(name)))
    assert abs(params - published) / published < 0.02


def write_safetensors(path, tensors, data=False):
    """A safetensors file; with data=False it holds the header only (no tensor bytes)."""
    header, offset = {}, 0
    sizes = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (b"\0" * offset if data else b""))
    return offset


def test_header_only_safetensors_give_exact_bytes(tmp_path):
    # embed 1000 x 256 bf16 = 512,000 B; a 256 x 256 fp32 = 262,144 B; fp8 64 x 64 = 4,096 B
    tensors = {"embed": ("BF16", [1000, 256]), "w": ("F32", [256, 256]), "q": ("F8_E4M3", [64, 64])}
    write_safetensors(tmp_path / "model.safetensors", tensors)
    found = weights_from_dir(tmp_path)
    assert found.weights_bytes == 512_000 + 262_144 + 4_096
    assert found.num_params == 256_000 + 65_536 + 4_096
    full = tmp_path / "full"
    full.mkdir()
    write_safetensors(full / "model.safetensors", tensors, data=True)
    assert weights_from_dir(full).weights_bytes == found.weights_bytes


def test_index_json_shards_and_total_size(tmp_path):
    a = write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [10, 10])})
    b = write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": ("BF16", [5, 4])})
    index = {"metadata": {"total_size": a + b},
             "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights_from_dir(tmp_path).weights_bytes == 240
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    found = weights_from_dir(tmp_path)  # shard missing: the index's total_size
    assert (found.weights_bytes, found.method) == (240, "index.json total_size")


@pytest.mark.parametrize("content", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{", b"\xff" * 8 + b"x",
                                     struct.pack("<Q", 2) + b"[]"])
def test_bad_safetensors_name_the_file(tmp_path, content):
    (tmp_path / "bad.safetensors").write_bytes(content)
    with pytest.raises(InputFileError) as err:
        weights_from_dir(tmp_path)
    assert "bad.safetensors" in err.value.one_line()
