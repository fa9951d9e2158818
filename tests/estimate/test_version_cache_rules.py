"""The KV cache rules that changed between vLLM releases (kvtool.estimate.capacity's version-keyed tables), each
checked against the upstream line it is read from (/work/vllm-src/X.Y.Z/vllm/..., fetched by
tests/support/fetch_vllm_sources.py) and against real start-up logs of the release (tests/data/gpu-logs): given the
logged KV budget (two decimals of GiB, so +-0.005 GiB), the logged token count and concurrency of that release."""

from __future__ import annotations

import json

import pytest
import yaml

from kvtool.estimate.capacity import (
    GROUP_SIZE_RULES,
    IN_FLIGHT_RULES,
    LOGGED_TOKENS_RULES,
    KvGroup,
    hybrid_group_size,
    logged_tokens,
    max_in_flight_tokens,
)
from kvtool.estimate.hybrid_block import ATTENTION_BLOCK_RULES, HYBRID_PREFIX_RULES
from kvtool.estimate.vllm_versions import MODELLED_RELEASES, pick
from tests.estimate.test_hybrid import QWEN3_NEXT
from tests.support import DATA

LOGS = DATA / "gpu-logs"


def _estimate(run_cli, config_dir, *args: str) -> dict:
    r = run_cli("estimate", "--config", str(config_dir), "--json", *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _bracket(run_cli, config_dir, kv_gib: float, *args: str) -> tuple[dict, dict]:
    """kvtool at the low and high ends of a budget logged to two decimals of GiB."""
    low = _estimate(run_cli, config_dir, "--kv-memory", f"{kv_gib - 0.005:.3f}GiB", *args)
    high = _estimate(run_cli, config_dir, "--kv-memory", f"{kv_gib + 0.005:.3f}GiB", *args)
    return low, high


def _assert_logged(low: dict, high: dict, tokens: int, concurrency: str) -> None:
    assert low["vllm_logged_tokens"] <= tokens <= high["vllm_logged_tokens"]
    assert f"{low['max_concurrency']:.2f}" <= concurrency <= f"{high['max_concurrency']:.2f}"


def test_every_table_covers_every_modelled_release():
    for table in (LOGGED_TOKENS_RULES, GROUP_SIZE_RULES, IN_FLIGHT_RULES, HYBRID_PREFIX_RULES, ATTENTION_BLOCK_RULES):
        assert table[0].since == MODELLED_RELEASES[0]
        for release in MODELLED_RELEASES:
            assert "vllm/" in pick(table, release).source


# --- the logged token count -----------------------------------------------------------------------------------


def test_logged_tokens_per_group_blocks_up_to_0_20_0_then_concurrency_times_max_model_len():
    # vllm/v1/core/kv_cache_utils.py _report_kv_cache_config (0.20.0): num_blocks // len(kv_cache_groups) *
    # min_block_size; (0.20.1): int(max_concurrency * max_model_len).  gpt-oss (18 sliding + 18 full layers, as
    # 0.10.1 groups them: 2 groups), 1,000 blocks of 16 tokens, 8,000-token requests needing 500 + 10 blocks:
    groups = (KvGroup("full", 18, None), KvGroup("sliding", 18, 128))
    concurrency = 1000 / 510
    assert logged_tokens(groups, 1000, 16, concurrency, 8000, "0.10.1") == 500 * 16  # 1000 // 2 x 16
    assert logged_tokens(groups, 1000, 16, concurrency, 8000, "0.20.0") == 8000
    assert logged_tokens(groups, 1000, 16, concurrency, 8000, "0.20.1") == int(1000 / 510 * 8000)  # 15,686
    assert logged_tokens(groups, 1000, 16, concurrency, 8000, "0.33.0") == 15686


def test_logged_tokens_before_0_20_1_ignore_state_groups_block_size():
    # 0.10.2 gives state layers block_size = max_model_len (vllm/v1/worker/gpu_model_runner.py get_kv_cache_spec):
    # min_block_size is the attention block.  4 groups (1 full, 3 state), 7,162 blocks of 544: 7162 // 4 x 544.
    groups = (KvGroup("full", 12, None), *(KvGroup("mamba", 12, None, 1) for _ in range(3)))
    assert logged_tokens(groups, 7162, 544, 14.77, 262144, "0.10.2") == 1790 * 544


def test_qwen3_next_on_0_10_2_logs_973760_tokens_and_14_77x(run_cli, tmp_path):
    # tests/data/gpu-logs/qwen3-next-80b-a3b-h200-tp2-v0.10.2: TP 2, max_model_len 262,144, 44.59 GiB per rank,
    # "Setting attention block size to 544 tokens", "GPU KV cache size: 973,760 tokens", "14.77x".  Config: the
    # published Qwen3-Next-80B-A3B-Instruct values (tests/estimate/test_hybrid.py QWEN3_NEXT).  Prefix caching is
    # refused for Mamba layers on 0.10.2, so state groups hold one block; tokens = num_blocks // 4 groups x 544.
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_NEXT))
    args = ("--tp", "2", "--seq-len", "262144", "--vllm-version", "0.10.2")
    low, high = _bracket(run_cli, tmp_path, 44.59, *args)
    assert low["block_size"] == 544
    _assert_logged(low, high, 973_760, "14.77")
    # the same budget under 0.33's rules: int(concurrency x max_model_len) and two state blocks ("align")
    newest = _estimate(run_cli, tmp_path, "--kv-memory", "44.59GiB", "--tp", "2", "--seq-len", "262144")
    assert newest["vllm_logged_tokens"] > 3_000_000


def _case(name: str) -> dict:
    return yaml.safe_load((LOGS / name / "case.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("name", "release"),
    [
        ("qwen3.6-35b-a3b-nvfp4-dgx-spark-v0.20", "0.20.0"),  # tokens = num_blocks // 4 groups x 2,096
        ("qwen3.6-35b-a3b-nvfp4-5090", "0.24.0"),  # tokens = int(concurrency x max_model_len)
    ],
)
def test_qwen3_6_hybrids_log_their_release_token_count(run_cli, name, release):
    case = _case(name)
    logged = case["logged"]
    args = ["--seq-len", str(case["seq_len"]), "--vllm-version", release, "--block-size", str(case["block_size"])]
    if case.get("kv_dtype"):
        args += ["--kv-dtype", case["kv_dtype"]]
    if "enable_prefix_caching" in case["engine_args"]:  # vLLM keeps it opt-in for hybrids up to 0.27.1
        args.append(f"--{'' if case['engine_args']['enable_prefix_caching'] else 'no-'}enable-prefix-caching")
    low, high = _bracket(run_cli, LOGS / name, logged["kv_gib"], *args)
    _assert_logged(low, high, logged["tokens"], logged["concurrency"])


# --- layers per group -----------------------------------------------------------------------------------------


def test_group_size_min_then_1_25x_then_1_5x():
    # vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: group_size = min(...) (0.11.0);
    # "if max_num_layers < min_num_layers * 1.25: group_size = max_num_layers" (0.12.0); "* 1.5" (0.18.0)
    assert hybrid_group_size([20, 24], "0.11.2") == 20
    assert hybrid_group_size([20, 24], "0.12.0") == 24  # 24 < 25
    assert hybrid_group_size([20, 28], "0.17.1") == 20  # 28 >= 25
    assert hybrid_group_size([20, 28], "0.18.0") == 28  # 28 < 30
    assert hybrid_group_size([12, 36], "0.33.0") == 12


# --- sliding / chunked in-flight allowance --------------------------------------------------------------------


def test_in_flight_one_batch_before_0_26_then_the_batches_in_flight():
    # vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request: sliding_window - 1 +
    # max_num_batched_tokens (0.20.0); + max_in_flight_tokens (0.26.0), vllm/config/vllm.py
    # max_concurrent_batches * max_num_batched_tokens, 2 batches with async scheduling at pp 1
    assert max_in_flight_tokens(2048, async_scheduling=True, vllm_version="0.25.1") == 2048
    assert max_in_flight_tokens(2048, async_scheduling=True, vllm_version="0.26.0") == 4096
    assert max_in_flight_tokens(2048, async_scheduling=False, vllm_version="0.26.0") == 2048


def test_sliding_window_blocks_per_request_follow_the_release(run_cli, tmp_path):
    # Mistral-style config with a 4,096-token window on every layer (one sliding group): a 32k request needs
    # cdiv(4095 + in_flight, 16) + 1 blocks: in_flight 8,192 on 0.21 (one batch) -> 769; 16,384 on 0.32 (2) -> 1281
    config = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    common = ("--kv-memory", "10GiB", "--seq-len", "32768", "--max-num-batched-tokens", "8192")
    old = _estimate(run_cli, tmp_path, *common, "--vllm-version", "0.21.0")
    new = _estimate(run_cli, tmp_path, *common, "--vllm-version", "0.32.0")
    assert old["blocks_per_request"] == 769
    assert new["blocks_per_request"] == 1281


# --- state blocks of hybrid models ----------------------------------------------------------------------------


def test_state_blocks_one_before_0_15_then_two_in_align_mode(run_cli, tmp_path):
    # vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes: page_size_bytes (0.10.0);
    # 'align': page_size_bytes * (2 + num_speculative_blocks), else * (1 + ...) (0.15.0). Qwen3-Next (no
    # SupportsMambaPrefixCaching) at 262,144 tokens: 482 attention blocks of 544 + 3 state groups x (1 or 2);
    # --enable-prefix-caching given, as vLLM keeps it opt-in for hybrids up to 0.27.1
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_NEXT))
    common = ("--kv-memory", "20GiB", "--seq-len", "262144", "--enable-prefix-caching")
    old = _estimate(run_cli, tmp_path, *common, "--vllm-version", "0.14.1")
    new = _estimate(run_cli, tmp_path, *common, "--vllm-version", "0.15.0")
    off = _estimate(run_cli, tmp_path, "--kv-memory", "20GiB", "--seq-len", "262144", "--no-enable-prefix-caching")
    assert (old["blocks_per_request"], new["blocks_per_request"], off["blocks_per_request"]) == (485, 488, 485)


# --- mixed sliding + full models at the logged max_num_batched_tokens -----------------------------------------


def test_gemma_2_on_0_19_0_at_the_h100_batch_default_logs_20_60x():
    # tests/data/gpu-logs/gemma-2-9b-it-h100-v0.19.0: 54.12 GiB, 42 layers (21 sliding 4096 + 21 full), 8 KV heads x
    # 256 at bf16: a page of 16 x 8 x 256 x 2 x 2 = 131,072 B; 2 groups of 21 layers, num_blocks = 54.12 GiB //
    # 131,072 // 21 = 21,111; logged 168,880 tokens (21,111 // 2 x 16) and 20.60x.  A request of 8,192 needs 512 full
    # blocks and, with vllm serve's H100 max_num_batched_tokens 8192 (one batch in flight on 0.19.0),
    # cdiv(min(4095 + 8192, 8192), 16) + 1 = 513 sliding ones: 21,111 / 1,025 = 20.596.  With the unknown-device
    # default 2048 the sliding group would need cdiv(6143, 16) + 1 = 385 blocks: 23.53x, not the log's.
    in_flight = max_in_flight_tokens(8192, async_scheduling=False, vllm_version="0.19.0")
    full, sliding = KvGroup("full", 21, None), KvGroup("sliding", 21, 4096)
    per_request = full.blocks_for(8192, 16, in_flight) + sliding.blocks_for(8192, 16, in_flight)
    assert per_request == 1025
    assert f"{21111 / per_request:.2f}" == "20.60"
    assert sliding.blocks_for(8192, 16, 2048) == 385
    assert logged_tokens((full, sliding), 21111, 16, 21111 / per_request, 8192, "0.19.0") == 168_880


def test_gemma_4_31b_full_blocks_of_32_tokens_and_the_release_in_flight_allowance():
    # Gemma 4 31B (tests/data/estimate/gemma-4-31b-it): 50 sliding (1024; 16 KV heads x 256) + 10 full layers
    # (attention_k_eq_v: 4 global KV heads x global_head_dim 512, K and V both cached, vllm/model_executor/models/
    # gemma4.py Gemma4DecoderLayer (0.26.0)).  Pages at 16 tokens: 262,144 B sliding, 131,072 B full, so the full
    # group's block holds 32 tokens (unify_kv_cache_spec_page_size); 6 groups of 10 layers.
    # 0.26.0 on a B300 (gemma-4-31b-b300-v0.26.0): 182.37 GiB // 262,144 // 10 = 74,698 blocks; max_num_batched_tokens
    # 8192 logged, 2 batches in flight (async scheduling): sliding cdiv(min(1023 + 16384, 16384), 16) + 1 = 1,025,
    # full 16,384 / 32 = 512; 5 x 1,025 + 512 = 5,637 blocks: 13.25x (logged), int(13.2514 x 16384) = 217,112.
    in_flight = max_in_flight_tokens(8192, async_scheduling=True, vllm_version="0.26.0")
    assert in_flight == 16384
    full, sliding = KvGroup("full", 10, None, block_size=32), KvGroup("sliding", 10, 1024)
    groups = (full, *(sliding,) * 5)
    per_request = sum(g.blocks_for(16384, 16, in_flight) for g in groups)
    assert per_request == 5 * 1025 + 512
    nb_low, nb_high = (int(gib * 1024**3) // 262_144 // 10 for gib in (182.365, 182.375))
    assert f"{nb_low / per_request:.2f}" <= "13.25" <= f"{nb_high / per_request:.2f}"
    assert logged_tokens(groups, nb_low, 16, nb_low / per_request, 16384, "0.26.0") <= 217_116
    assert 217_116 <= logged_tokens(groups, nb_high, 16, nb_high / per_request, 16384, "0.26.0")
    # 0.23.0 (gemma-4-31b-kaggle-v0.23.0): one batch of 8192 in flight; 32,768-token requests: sliding
    # cdiv(1023 + 8192, 16) + 1 = 577, full 32,768 / 32 = 1,024; 5 x 577 + 1,024 = 3,909; 28.41 GiB -> 11,637 blocks,
    # 11,637 / 3,909 = 2.977 (logged 2.98x), int(2.977 x 32768) = 97,548 (logged 97,541 at the budget's low end)
    in_flight = max_in_flight_tokens(8192, async_scheduling=True, vllm_version="0.23.0")
    assert in_flight == 8192
    per_request = sum(g.blocks_for(32768, 16, in_flight) for g in groups)
    assert per_request == 3909
    nb_low, nb_high = (int(gib * 1024**3) // 262_144 // 10 for gib in (28.405, 28.415))
    assert f"{nb_low / per_request:.2f}" <= "2.98" <= f"{nb_high / per_request:.2f}"
    assert logged_tokens(groups, nb_low, 16, nb_low / per_request, 32768, "0.23.0") <= 97_541
    assert 97_541 <= logged_tokens(groups, nb_high, 16, nb_high / per_request, 32768, "0.23.0")


@pytest.mark.parametrize(
    "name",
    [
        "gemma-2-9b-it-h100-v0.19.0",
        "gemma-3-4b-it-h100-v0.19.0",
        "gemma-3-27b-it-h100-v0.19.0",
        "gemma-4-31b-b300-v0.26.0",
        "gemma-4-31b-kaggle-v0.23.0",
        "gpt-oss-20b-h100-tp2-v0.19",
    ],
)
def test_mixed_sliding_logs_need_their_max_num_batched_tokens(run_cli, name):
    # each log runs at max_num_batched_tokens 8192 ('Chunked prefill is enabled with max_num_batched_tokens=8192'
    # or, where that part of the log was not copied, vllm serve's >= 70 GiB default): at 8192 the logged count and
    # concurrency come out; at the 2048 kvtool takes when the device is unknown they do not
    case = _case(name)
    logged = case["logged"]
    args = ["--seq-len", str(case["seq_len"]), "--vllm-version", str(case["vllm_version"])]
    args += ["--tp", str(case.get("tp", 1))]
    assert case["engine_args"]["max_num_batched_tokens"] == 8192
    low, high = _bracket(run_cli, LOGS / name, logged["kv_gib"], *args, "--max-num-batched-tokens", "8192")
    _assert_logged(low, high, logged["tokens"], logged["concurrency"])
    low, high = _bracket(run_cli, LOGS / name, logged["kv_gib"], *args, "--max-num-batched-tokens", "2048")
    assert not f"{low['max_concurrency']:.2f}" <= logged["concurrency"] <= f"{high['max_concurrency']:.2f}"
