"""Quantized weights: online --quantization, mxfp4 experts, GPTQ/compressed-tensors/bitsandbytes by hand."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import EXIT_USAGE
from kvtool.estimate.quant import from_quantization_config

GIB = 1024**3


def _weights(run_cli, *args):
    r = run_cli("estimate", *args, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_online_fp8_quantizes_linear_layers_only(run_cli):
    # Llama-3.1-8B: 8,030,261,248 parameters; embeddings and LM head 2 x 128,256 x 4,096 = 1,050,673,152 and the
    # norms 65 x 4,096 = 266,240 stay bf16; the 6,979,321,856 linear weights take one byte each plus a float32
    # scale per matrix (32 layers x 7 matrices = 224 x 4 B).
    out = _weights(run_cli, "--model", "llama-3.1-8b", "--quantization", "fp8")
    assert out["weights_bytes"] == 6_979_321_856 + 224 * 4 + (1_050_673_152 + 266_240) * 2
    r = run_cli("estimate", "--model", "llama-3.1-8b", "--quantization", "awq")
    assert r.exit_code == EXIT_USAGE and "not modelled for an unquantized checkpoint" in r.stderr


def test_a_quantized_checkpoint_refuses_another_method(run_cli, tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = run_cli("estimate", "--config", str(tmp_path), "--quantization", "fp8")
    assert r.exit_code == EXIT_USAGE and "already quantized" in r.stderr
    assert run_cli("estimate", "--config", str(tmp_path), "--quantization", "awq").exit_code == 0


@pytest.mark.parametrize(
    "config, rows, cols, expected",
    [
        # GPTQ 4-bit, groups of 128 (AutoGPTQ layout): qweight 4 bits, per group and output a float16 scale and a
        # 4-bit zero, an int32 g_idx per input: 4096 x 4096 -> 8,388,608 + 4096 x 32 x 2.5 + 4096 x 4
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 4096, 4096, 8_388_608 + 327_680 + 16_384),
        # compressed-tensors W4A16 (pack-quantized, group 128, bf16 scales): 8,388,608 + 4096 x 32 x 2
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}}},
            },
            4096,
            4096,
            8_388_608 + 262_144,
        ),
        # compressed-tensors W8A8 int8, per channel: one byte per weight + a bf16 scale per output row
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}},
            },
            4096,
            4096,
            16_777_216 + 4096 * 2,
        ),
        # bitsandbytes NF4: 4 bits + a float32 absmax per 64 weights
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 4096, 4096, 8_388_608 + 262_144 * 4),
        # mxfp4: 4 bits + a one-byte E8M0 scale per 32
        ({"quant_method": "mxfp4"}, 2880, 2880, 4_147_200 + 2880 * 90),
    ],
)
def test_matrix_bytes_by_hand(config, rows, cols, expected):
    quant = from_quantization_config(config, "config.json", 2)
    assert quant is not None and quant.matrix_bytes(rows, cols) == expected


def test_mxfp4_expert_bytes_per_tp_rank_as_each_release_lays_them_out():
    from kvtool.estimate.quant import MXFP4_LAYOUTS, mxfp4_expert_bytes
    from kvtool.estimate.vllm_versions import pick

    # gpt-oss-20b: hidden 2880, intermediate 2880 (huggingface.co/openai/gpt-oss-20b config.json)
    # 0.11.0 (the row fitted to its logs): intermediate 2880 -> 3072; w13 6144 x 2880 / 2 + 6144 x 90 scales,
    # w2 2880 x 3072 / 2 + 2880 x 96 scales
    old = pick(MXFP4_LAYOUTS, "0.11.0")
    assert mxfp4_expert_bytes(old, 2880, 2880) == 8_847_360 + 552_960 + 4_423_680 + 276_480
    # 0.19.0 at TP 2 (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py (0.19.0), Hopper TRITON): 1440 -> 1472
    # per rank; values (1440 -> 1472 bytes) x 2944 and (736 -> 768 bytes) x 2880 (HopperMXValueLayout pads to 64);
    # the loaded scales 2944 x 90 + 2880 x 46 and their swizzled copy, rows to 256: 3072 x 90 + 3072 x 46
    new = pick(MXFP4_LAYOUTS, "0.19.0")
    assert mxfp4_expert_bytes(new, 2880, 1440) == (
        1472 * 2944 + 768 * 2880 + 2944 * 90 + 2880 * 46 + 3072 * 90 + 3072 * 46
    )
    assert new.source.endswith("(0.19.0)") and pick(MXFP4_LAYOUTS, "0.11.1") is new
