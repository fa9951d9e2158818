"""--speculative-config: a drafter's KV layers, state blocks and weights (kvtool.estimate.spec_decode).

Figures are hand computations from vLLM's rules, cited per test; the MTP case is a real log
(tests/data/gpu-logs/qwen3.6-27b-int4-3090-tp2-v0.20.1, checked again in test_gpu_logs.py).
"""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import UsageError
from kvtool.estimate.spec_decode import SPEC_STATE_BLOCKS_RULES, padding_log_lines, parse_speculative_config
from kvtool.estimate.vllm_args import parse_vllm_serve
from kvtool.estimate.vllm_versions import pick
from tests.support import DATA

MTP_CASE = DATA / "gpu-logs" / "qwen3.6-27b-int4-3090-tp2-v0.20.1"
MTP = '{"method": "mtp", "num_speculative_tokens": 3}'
GIB = 1024**3


def _qwen36(run_cli, *args: str) -> dict:
    base = ["estimate", "--config", str(MTP_CASE), "--seq-len", "262144", "--tp", "2", "--kv-dtype", "fp8_e5m2"]
    # the logged run had 'enable_prefix_caching': True (vLLM keeps it opt-in for hybrids up to 0.27.1)
    base += ["--block-size", "64", "--kv-memory", "10.98GiB", "--enable-prefix-caching", "--json"]
    result = run_cli(*base, *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_mtp_layer_joins_the_full_group_and_state_groups_hold_speculative_blocks(run_cli):
    out = _qwen36(run_cli, "--vllm-version", "0.20.1", "--speculative-config", MTP)
    # by hand: 16 full + 1 MTP layer (mtp_num_hidden_layers 1, vllm/config/speculative.py hf_config_override) =
    # 17, 48 Gated DeltaNet layers: group_size 17 (48 >= 1.5 x 17: the smaller count,
    # _get_kv_cache_groups_uniform_page_size 0.20.1), 48 = 3 groups of 16 + 1 padding each, 48 % 17 = 14 so the log's
    # "Add 3 padding layers, may waste at most 6.25%" (3 / 48); page 1600 x 1,024 B, 10.98 GiB // 1,638,400 // 17
    # = 423; a request: cdiv(262144, 1600) = 164 full blocks + 3 state groups x (2 + 3) (MambaSpec
    # max_memory_usage_bytes "align" 0.20.1) = 179; int(423 / 179 x 262144) = 619,479 (the log's own figure)
    assert out["padding_log_lines"] == ["Add 3 padding layers, may waste at most 6.25% KV cache memory"]
    assert (out["block_size"], out["num_blocks"], out["blocks_per_request"]) == (1600, 423, 179)
    assert out["vllm_logged_tokens"] == 619_479
    sd = out["speculative"]
    assert (sd["draft_kv_layers"], sd["draft_kv_kind"], sd["speculative_state_blocks"]) == (1, "full", 3)
    # one full layer's KV per token per GPU: 2 x (4 KV heads / tp 2) x 256 x 1 B (fp8) = 1,024 B
    assert sd["draft_bytes_per_token_per_gpu"] == 1024


def test_without_the_drafter_the_same_budget_counts_more(run_cli):
    # no draft layer: 16 full vs 48 state, group_size 16, 3 state groups with no padding (48 = 3 x 16);
    # 10.98 GiB // 1,638,400 // 16 = 449 blocks, 164 + 3 x 2 = 170 a request
    out = _qwen36(run_cli, "--vllm-version", "0.20.1")
    assert (out["num_blocks"], out["blocks_per_request"], out["padding_log_lines"]) == (449, 170, [])
    assert out["speculative"] is None


def test_before_0_15_the_plan_counts_no_speculative_state_blocks(run_cli):
    # vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes (0.14.1): page_size_bytes, one block, whatever
    # num_speculative_blocks; prefix caching is off for these hybrids before 0.15 (1 block).  0.14.1's attention
    # block steps by 16 whatever --block-size says (HybridAttentionMambaModelConfig: kernel_block_alignment_size =
    # 16; 0.20.0+'s max(16, 64) gives 64 x 25 = 1,600 above).  The state per GPU at TP 2 keeps its conv rows
    # 3 + 3 speculative (qwen3_next.py passes num_spec from 0.10.2, SPEC_CONV_ROWS_RULES): 6 x (2 x 16 x 128 +
    # 48 x 128) / 2 x 2 B = 61,440 + 24 x 128 x 128 x 4 B = 1,634,304 B, 1,596 tokens of 1,024 B,
    # 16 x cdiv(1,596, 16) = 1,600, so cdiv(262,144, 1,600) = 164 + 3 x 1 = 167
    assert not pick(SPEC_STATE_BLOCKS_RULES, "0.14.1").counts_speculative_blocks
    out = _qwen36(run_cli, "--vllm-version", "0.14.1", "--speculative-config", MTP)
    assert out["speculative"]["speculative_state_blocks"] == 0
    assert (out["block_size"], out["blocks_per_request"]) == (1600, 164 + 3 * 1)


def test_ngram_adds_no_kv_layer_but_state_blocks(run_cli):
    # ngram: no drafter model (vllm/v1/spec_decode/ngram_proposer.py); the state layers still get
    # num_speculative_blocks = num_speculative_tokens (mamba/abstract.py get_kv_cache_spec, 0.20.1), and their conv
    # state keeps 3 + 4 rows (qwen3_5.py get_mamba_state_shape_from_config passes num_spec whatever the method):
    # per GPU at TP 2, 7 x (2 x 16 x 128 + 48 x 128) / 2 x 2 B = 71,680 + 24 x 128 x 128 x 4 B = 1,644,544 B, over
    # 1,024 B a token = 1606 -> 1664-token blocks (64-aligned); no draft layer, so 16 full + 48 state layers make
    # groups of 16: 10.98 GiB // (1664 x 1,024 B) // 16 = 432 blocks; a request: cdiv(262144, 1664) = 158 + 3 x (2 + 4) = 176
    out = _qwen36(
        run_cli, "--vllm-version", "0.20.1", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'
    )
    assert out["speculative"]["draft_kv_layers"] == 0
    assert out["block_size"] == 1664
    assert (out["num_blocks"], out["blocks_per_request"]) == (432, 158 + 3 * 6)


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def test_eagle_draft_from_a_local_config_joins_the_full_group(run_cli, tmp_path):
    target, draft = tmp_path / "target", tmp_path / "eagle"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps(LLAMA))
    (draft / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 1}))
    cfg = json.dumps({"method": "eagle", "model": str(draft), "num_speculative_tokens": 5})
    args = ["estimate", "--config", str(target), "--seq-len", "8192", "--kv-memory", "8GiB", "--json"]
    out = json.loads(run_cli(*args, "--speculative-config", cfg).stdout)
    # by hand: the draft layer's spec equals the target's (8 KV heads x 128 x bf16), so one group of 33 layers;
    # page = 16 x 2 x 8 x 128 x 2 B = 65,536 B; 8 GiB // 65,536 // 33 = 3,971 blocks (32 layers: 4,096)
    assert out["num_blocks"] == 8 * GIB // 65536 // 33 == 3971
    assert out["speculative"]["draft_kv_layers"] == 1
    assert out["padding_log_lines"] == []
    # per token, all layers, one GPU: 33 x 2 x 8 x 128 x 2 B
    assert out["bytes_per_token_per_gpu"] == 33 * 4096


def test_a_draft_model_not_on_disk_is_refused(run_cli):
    cfg = '{"method": "eagle3", "model": "no/such-eagle3", "num_speculative_tokens": 3}'
    result = run_cli("estimate", "--config", str(MTP_CASE), "--kv-memory", "8GiB", "--speculative-config", cfg)
    assert result.exit_code != 0
    assert result.stderr.startswith("Error: --speculative-config model 'no/such-eagle3' is not a local folder")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{method: mtp}", "is not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"method": "mtp"}', "needs num_speculative_tokens"),
        ('{"method": "spaceship", "num_speculative_tokens": 1}', "is not one of vLLM's"),
        ('{"method": "mtp", "num_speculative_tokens": 1, "colour": 1}', "does not take: colour"),
    ],
)
def test_bad_speculative_config_is_one_usage_error(text, said):
    with pytest.raises(UsageError, match=said):
        parse_speculative_config(text)


def test_a_model_without_mtp_layers_refuses_mtp(run_cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    result = run_cli("estimate", "--config", str(tmp_path), "--kv-memory", "8GiB", "--speculative-config", MTP)
    assert result.exit_code != 0 and "has no MTP layers" in result.stderr


def test_padding_lines_as_vllm_logs_them():
    # vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size (0.20.1): padding = group_size -
    # len % group_size per type, "%.2f%%" of len; gpt-oss-20b + eagle (its comment): 12 sw + 13 full, group 13
    assert padding_log_lines([12, 13], 13) == ("Add 1 padding layers, may waste at most 8.33% KV cache memory",)


def test_vllm_serve_line_reads_the_json_and_dotted_keys():
    line = parse_vllm_serve(["vllm", "serve", "m", "--speculative-config", MTP])
    assert json.loads(str(line.values()["speculative_config"])) == json.loads(MTP)
    assert "speculative-config" not in " ".join(line.warnings())
    dotted = parse_vllm_serve(
        ["vllm", "serve", "m", "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens=4"]
    )
    assert json.loads(str(dotted.values()["speculative_config"])) == {"method": "ngram", "num_speculative_tokens": 4}
    short = parse_vllm_serve(["vllm", "serve", "m", "-sc", MTP])
    assert json.loads(str(short.values()["speculative_config"]))["method"] == "mtp"


GB10_MTP_CASE = DATA / "gpu-logs" / "qwen3.6-35b-a3b-nvfp4-mtp-gb10-v0.22.1"


def _qwen36_35b(run_cli, *args: str) -> dict:
    base = ["estimate", "--config", str(GB10_MTP_CASE), "--seq-len", "262144", "--kv-dtype", "fp8"]
    base += ["--kv-memory", "74.76GiB", "--enable-prefix-caching", "--json"]
    result = run_cli(*base, *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_the_state_conv_keeps_the_speculative_rows_and_so_the_attention_block_grows(run_cli):
    # by hand (vllm/model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape (0.22.1), num_spec from
    # qwen3_next.py get_mamba_state_shape_from_config): Qwen3.6-35B-A3B's Gated DeltaNet state is a conv of
    # (4 - 1 + 2) rows x (2 x 16 x 128 + 32 x 128 = 8,192) bf16 = 81,920 B and a float32 temporal state of
    # 32 x 128 x 128 x 4 = 2,097,152 B: 2,179,072 B, exactly one fp8 attention page of 2,179,072 / (2 x 2 x 256) = 2128
    # tokens, the block the GB10 log prints ("Setting attention block size to 2128 tokens"); without the 2 rows
    # 2,146,304 B = 2096 tokens
    out = _qwen36_35b(run_cli, "--vllm-version", "0.22.1", "--speculative-config", MTP.replace("3", "2"))
    assert out["block_size"] == 2128
    assert _qwen36_35b(run_cli, "--vllm-version", "0.22.1")["block_size"] == 2096


def test_conv_rows_rule_by_release_and_model_file():
    from kvtool.estimate.spec_decode import SPEC_CONV_ROWS_RULES

    # qwen3_next.py passes num_spec from its first release (0.10.2); nemotron_h.py / mamba2.py from 0.17.0 (absent in
    # 0.16.0); granitemoehybrid.py and falcon_h1.py from 0.32.0 (absent in 0.31.0)
    assert not pick(SPEC_CONV_ROWS_RULES, "0.10.1").families
    assert pick(SPEC_CONV_ROWS_RULES, "0.16.0").families == {"qwen3_next"}
    assert "nemotron_h" in pick(SPEC_CONV_ROWS_RULES, "0.17.0").families
    assert "granitemoehybrid" not in pick(SPEC_CONV_ROWS_RULES, "0.31.0").families
    assert "falcon_h1" in pick(SPEC_CONV_ROWS_RULES, "0.32.0").families


# A DFlash drafter for the LLAMA target above: 2 layers of 4 KV heads x 64 (a spec of their own beside the
# target's 8 x 128), its config in float32 (vLLM runs it at the target's dtype all the same)
DFLASH_DRAFT = {
    **LLAMA,
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "torch_dtype": "float32",
    "dflash_config": {"mask_token_id": 1, "target_layer_ids": [1, 30]},
}


def _dflash(run_cli, tmp_path, version: str, draft: dict, *args: str, name: str = "dflash"):
    target, folder = tmp_path / "target", tmp_path / name
    target.mkdir(exist_ok=True)
    folder.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(LLAMA))
    (folder / "config.json").write_text(json.dumps(draft))
    cfg = json.dumps({"model": str(folder), "num_speculative_tokens": 4})  # "dflash" in the name picks the method
    base = ["estimate", "--config", str(target), "--seq-len", "8192", "--kv-memory", "8GiB", "--json"]
    return run_cli(*base, "--vllm-version", version, "--speculative-config", cfg, *args)


def test_dflash_layers_are_a_full_attention_group_of_their_own_at_the_target_dtype(run_cli, tmp_path):
    # vLLM 0.20.1 vllm/model_executor/models/qwen3_dflash.py: every draft layer Attention(attn_type=DECODER), full
    # attention, whatever layer_types says; vllm/config/speculative.py: the draft ModelConfig at the target's dtype.
    sliding = {
        **DFLASH_DRAFT,
        "layer_types": ["sliding_attention"] * 2,
        "sliding_window": 512,
        "use_sliding_window": True,
    }
    out = json.loads(_dflash(run_cli, tmp_path, "0.20.1", sliding).stdout)
    sd = out["speculative"]
    assert (sd["method"], sd["draft_kv_layers"], sd["draft_kv_kind"]) == ("dflash", 2, "full")
    # by hand: per token and layer 2 x 4 x 64 x 2 B (bf16, the target's; float32 would be 2,048) = 1,024 B
    assert sd["draft_bytes_per_token_per_gpu"] == 2 * 1024
    # two full specs, 32 and 2 layers: group_size 2 (32 >= 1.5 x 2), no padding; pages unify to the target's
    # 16 x 4,096 B = 65,536 B (the draft's 16-token 16,384 B page x 4: 64-token draft blocks); 17 groups of 2 layers:
    # 8 GiB // 65,536 // 2 = 65,536 blocks
    assert out["num_blocks"] == 8 * GIB // 65536 // 2
    # 0.25.0 _resolve_layer_attention: the same config's layers are sliding, with its 512-token window
    out = json.loads(_dflash(run_cli, tmp_path, "0.25.0", sliding).stdout)
    assert out["speculative"]["draft_kv_kind"] == "sliding"
    assert [g["window_tokens"] for g in out["layer_groups"] if g["kind"] == "sliding"] == [512]


def test_dflash_kv_dtype_is_the_model_dtype_until_0_22(run_cli, tmp_path):
    # 0.20.0-0.21.0: DFlashQwen3DecoderLayer gets no cache_config, so Attention's kv_cache_dtype is "auto" (bf16)
    # under --kv-cache-dtype fp8; 0.22.0 passes cache_config: fp8 (1 B)
    per_token = {}
    for version in ("0.21.0", "0.22.0"):
        out = json.loads(_dflash(run_cli, tmp_path, version, DFLASH_DRAFT, "--kv-dtype", "fp8").stdout)
        per_token[version] = out["speculative"]["draft_bytes_per_token_per_gpu"]
    # 2 layers x 2 x 4 x 64 x (2 B, 1 B)
    assert per_token == {"0.21.0": 2048, "0.22.0": 1024}


def test_dflash_is_refused_where_vllm_has_none_or_refuses_the_drafter(run_cli, tmp_path):
    result = _dflash(run_cli, tmp_path, "0.19.1", DFLASH_DRAFT)
    assert result.exit_code != 0 and "method dflash is not in vLLM 0.19.1" in result.stderr
    mixed = {**DFLASH_DRAFT, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}
    assert _dflash(run_cli, tmp_path, "0.20.1", mixed).exit_code == 0  # built all full before 0.25.0
    result = _dflash(run_cli, tmp_path, "0.25.0", mixed)
    assert result.exit_code != 0 and "mixes sliding and full attention layers" in result.stderr
    assert "Traceback" not in result.stderr
