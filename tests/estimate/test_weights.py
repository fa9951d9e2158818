"""Weights: config estimates against published parameter counts; safetensors headers read exactly."""

from __future__ import annotations

import json
import struct

import pytest

from kvtool.core.errors import InputFileError
from kvtool.estimate.profiles import find_model, model_spec
from kvtool.estimate.safetensors import weights_from_dir
from kvtool.estimate.weights import estimate_params, estimate_weights


# Published parameter counts (Hugging Face model cards / Meta's Llama papers): Llama-2-7B 6.74B, 13B 13.0B,
# 70B 69.0B; Llama-3-8B 8.03B; Llama-3.1-70B 70.6B; Llama-3.1-405B 405B; Mistral-7B 7.24B; Qwen2.5-7B 7.61B.
@pytest.mark.parametrize(
    "name, published",
    [
        ("llama-2-7b", 6.74e9),
        ("llama-2-13b", 13.0e9),
        ("llama-2-70b", 69.0e9),
        ("llama-3-8b", 8.03e9),
        ("llama-3.1-8b", 8.03e9),
        ("llama-3.1-70b", 70.6e9),
        ("llama-3.1-405b", 405e9),
        ("mistral-7b-v0.1", 7.24e9),
        ("qwen2.5-7b", 7.61e9),
        ("qwen2.5-72b", 72.7e9),
    ],
)
def test_dense_within_2_percent_of_published(name, published):
    params = estimate_params(model_spec(find_model(name)))
    assert abs(params - published) / published < 0.02


# MoE and MLA: Mixtral-8x7B 46.7B (Mistral AI), DeepSeek-V2-Lite 15.7B and DeepSeek-V3 671B (DeepSeek papers).
@pytest.mark.parametrize(
    "name, published", [("mixtral-8x7b", 46.7e9), ("deepseek-v2-lite", 15.7e9), ("deepseek-v3", 671e9)]
)
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
    index = {
        "metadata": {"total_size": a + b},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights_from_dir(tmp_path).weights_bytes == 240
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    found = weights_from_dir(tmp_path)  # shard missing: the index's total_size
    assert (found.weights_bytes, found.method) == (240, "index.json total_size")


@pytest.mark.parametrize(
    "content", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{", b"\xff" * 8 + b"x", struct.pack("<Q", 2) + b"[]"]
)
def test_bad_safetensors_name_the_file(tmp_path, content):
    (tmp_path / "bad.safetensors").write_bytes(content)
    with pytest.raises(InputFileError) as err:
        weights_from_dir(tmp_path)
    assert "bad.safetensors" in err.value.one_line()


# One Llama-style layer: hidden 256, 2 heads of 128, intermediate 512, vocab 1000, bf16.
_TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}


def test_fp8_block_quantized_weights_by_hand(tmp_path, run_cli):
    # One Llama-style layer, hidden 256, 2 heads of 128, intermediate 512, vocab 1000, untied, bf16, with
    # DeepSeek-V3's quantization_config (fp8, 128x128 blocks). Linear weights, 1 byte each + a float32 scale per
    # 128x128 block: q, k, v, o 256x256 (65,536 params, 2x2 = 4 scales each); gate, up 512x256 and down 256x512
    # (131,072 params, 4x2 = 8 scales each): 655,360 B + 40 x 4 B = 655,520 B. In bf16: embeddings and LM head
    # 2 x 1000 x 256 = 512,000, two layer norms and the final norm 3 x 256 = 768: 512,768 x 2 B = 1,025,536 B.
    config = {
        **_TINY_LLAMA,
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = json.loads(run_cli("estimate", "--config", str(tmp_path / "config.json"), "--json").stdout)
    assert out["weights_params"] == 655_360 + 512_768
    assert out["weights_bytes"] == 655_520 + 1_025_536
    # AWQ (AutoAWQ's layout: qweight int32 (in, out/8) = 4 bits a weight; per group of 128 inputs and per output a
    # float16 scale and a 4-bit zero in qzeros (in/128, out/8)): q, k, v, o 32,768 B + 256 x 2 groups x 2.5 B =
    # 34,048 B each; gate, up 65,536 + 512 x 2 x 2.5 = 68,096 B each; down 65,536 + 256 x 4 x 2.5 = 68,096 B.
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = json.loads(run_cli("estimate", "--config", str(tmp_path / "config.json"), "--json").stdout)
    assert out["weights_bytes"] == 4 * 34_048 + 3 * 68_096 + 1_025_536
    # a quantization method kvtool does not model is said, not silently sized at the config dtype
    config["quantization_config"] = {"quant_method": "hqq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = json.loads(run_cli("estimate", "--config", str(tmp_path / "config.json"), "--json").stdout)
    assert out["weights_bytes"] == (655_360 + 512_768) * 2 and any("'hqq' is not modelled" in n for n in out["notes"])


def test_deepseek_v3_fp8_checkpoint_fits_eight_h200s(run_cli):
    # DeepSeek-V3 README_WEIGHTS.md: 671B parameters, FP8 with 128x128 block scales, of which the 0.9B embedding
    # and 0.9B output head stay BF16: about 671e9 x 1 B + 1.85e9 x 1 B more + 671e9 / 16,384 x 4 B of scales
    # = 673.0e9 B, not the 1,342e9 B of an all-BF16 estimate.
    out = json.loads(
        run_cli(
            "estimate", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--seq-len", "8192", "--json"
        ).stdout
    )
    assert abs(out["weights_bytes"] - 673.0e9) / 673.0e9 < 0.005
    assert out["fits"] is True and out["kv_budget_bytes"] > 0  # it is served on 8 x H200 in practice


def _llama4_params(text_overrides: dict) -> int:
    from kvtool.estimate.hf_config import load_config_path, parse_config
    from tests.support import DATA

    data, path = load_config_path(DATA / "estimate" / "llama-4-scout" / "config.json")
    data["text_config"].update(text_overrides)
    params = estimate_params(parse_config(data, where=str(path)))
    assert params is not None
    return params


def test_llama4_scout_counts_its_shared_expert_in_every_moe_layer():
    # Hand count of the language model (transformers' Llama4TextMoe: 16 routed experts and 1 shared expert of
    # intermediate_size 8192, gate/up/down; router 5120 x 16; attention q/o 5120 x 5120, k/v 1024 x 5120; two norms
    # a layer; untied embeddings and head 202,048 x 5120; final norm).  Meta publishes 109B with the vision tower
    # (~0.9B), which kvtool does not count.
    h, inter, layers, vocab = 5120, 8192, 48, 202048
    per_layer = 16 * 3 * inter * h + 3 * inter * h + h * 16 + 2 * 5120 * 5120 + 2 * 1024 * 5120 + 2 * h
    assert _llama4_params({}) == layers * per_layer + 2 * vocab * h + h == 107_769_861_120


def test_llama4_maverick_interleaves_moe_and_dense_layers():
    # Maverick: 128 experts, interleave_moe_layer_step 2 (layers 1, 3, ..., 47 are MoE), dense layers use
    # intermediate_size_mlp 16384.  Meta publishes 400B total parameters.
    h, inter, dense, vocab = 5120, 8192, 16384, 202048
    attention = 2 * 5120 * 5120 + 2 * 1024 * 5120
    moe_layer = 128 * 3 * inter * h + 3 * inter * h + h * 128 + attention + 2 * h
    dense_layer = 3 * dense * h + attention + 2 * h
    params = _llama4_params({"num_local_experts": 128, "interleave_moe_layer_step": 2, "moe_layers": None})
    assert params == 24 * moe_layer + 24 * dense_layer + 2 * vocab * h + h
    assert abs(params - 400e9) / 400e9 < 0.01


def _header_file(path, header):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        # an unhashable dtype was a TypeError traceback
        ({"dtype": ["F16"], "shape": [2, 2], "data_offsets": [0, 8]}, "unknown dtype ['F16']"),
        # a header whose shape and offsets disagree (the reference implementation refuses it) was sized by its shape
        (
            {"dtype": "F16", "shape": [99_999_999_999, 99_999_999_999], "data_offsets": [0, 8]},
            "shape [99999999999, 99999999999] of F16 is 19,999,999,999,600,000,000,002 bytes but data_offsets "
            "[0, 8] span 8",
        ),
        ({"dtype": "F16", "shape": [2, 2], "data_offsets": [0]}, "bad data_offsets [0]"),
        ({"dtype": "F16", "shape": [True, 3], "data_offsets": [0, 6]}, "bad shape [True, 3]"),
    ],
)
def test_a_safetensors_header_that_lies_is_one_line_exit_3(tmp_path, run_cli, tensor, message):
    (tmp_path / "config.json").write_text(json.dumps(_TINY_LLAMA))
    _header_file(tmp_path / "model.safetensors", {"a": tensor})
    result = run_cli("estimate", "--config", tmp_path, "--gpu", "H100")
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr == f"Error: {message} ({tmp_path / 'model.safetensors'}: tensor a)\n"


@pytest.mark.parametrize(
    ("index", "message"),
    [
        # a weight_map naming no shard gave weights of 0 bytes, silently
        ({"weight_map": {}}, "not a safetensors index (needs a weight_map object naming the shards) ({index})"),
        # shard names that are not strings, and a metadata list, were tracebacks
        ({"weight_map": {"a": 5}}, "shard 5 is not a file name ({index}: weight_map a)"),
        ({"weight_map": {"a": ["x"]}}, "shard ['x'] is not a file name ({index}: weight_map a)"),
        (
            {"weight_map": {"a": "x.safetensors"}, "metadata": [1]},
            "shard named in the index is missing and there is no total_size ({dir}/x.safetensors)",
        ),
    ],
)
def test_a_bad_safetensors_index_is_one_line_exit_3(tmp_path, run_cli, index, message):
    (tmp_path / "config.json").write_text(json.dumps(_TINY_LLAMA))
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    result = run_cli("estimate", "--config", tmp_path, "--gpu", "H100")
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr == "Error: " + message.format(index=path, dir=tmp_path) + "\n"


def test_gpt_oss_20b_mxfp4_experts_per_tp_rank_on_0_19_0():
    import json
    from pathlib import Path

    from kvtool.estimate.hf_config import parse_config

    path = Path(__file__).parent.parent / "data" / "gpu-logs" / "gpt-oss-20b-h100" / "config.json"
    spec = parse_config(json.loads(path.read_text()), where=str(path))
    old = estimate_weights(spec, "0.11.0", tp=2)
    new = estimate_weights(spec, "0.19.0", tp=2)
    assert old is not None and new is not None
    # 24 layers x 32 experts, two ranks each: 7,360,640 B per expert per rank on 0.19.0 (tests/estimate/test_quant.py
    # by hand) where the 0.11.0 row pads each rank's 1440 to 1536: w13 3072 x 1440 + 3072 x 90, w2 2880 x 768 + 2880 x 48
    per_rank_old = 3072 * 1440 + 3072 * 90 + 2880 * 768 + 2880 * 48
    assert new.weights_bytes - old.weights_bytes == 24 * 32 * 2 * (7_360_640 - per_rank_old)
