"""Gemma 3n and Gemma 4: per-layer KV shapes and KV-sharing layers, sized as vLLM 0.32 sizes them.

References, independent of kvtool's code:
- the published configs in tests/data/estimate/ (README there), with bytes per token computed by hand below;
- tests/data/estimate/vllm-specs/cases.json: what vLLM 0.32's own sizing functions (kv_cache_utils
  get_kv_cache_groups / get_kv_cache_config_from_groups / get_max_concurrency_for_kv_cache_config) returned for
  those configs' KV layers (record.py beside it; re-run live in tests/estimate/test_vllm_live_sizing.py);
- the tiny-engine runs in tests/data/vllm-sizing/gemma* (checked in tests/estimate/test_vllm_parity.py).
"""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import EXIT_USAGE
from tests.support import DATA

ESTIMATE = DATA / "estimate"
SPECS = json.loads((ESTIMATE / "vllm-specs" / "cases.json").read_text())


def _json(run_cli, *args):
    r = run_cli("estimate", *args, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


# (config, [(kind, layers, KV heads, head size)], bytes per token while S <= window), by hand from the configs:
# - Gemma 3n E4B: 35 layers, the last 15 KV-sharing, every 5th full: layers 0-19 hold KV, 16 sliding + 4 full, each
#   2 KV heads x 256 x 2 (K, V) x 2 B = 2,048 B: 20 x 2,048 = 40,960 B;
# - Gemma 4 E4B: 42 layers, the last 18 KV-sharing, every 6th full: layers 0-23, 20 sliding x 2 x 256 (2,048 B) +
#   4 full x 2 x 512 (global_head_dim; attention_k_eq_v false, so 2 KV heads: 4,096 B) = 40,960 + 16,384 = 57,344 B;
# - Gemma 4 31B: 60 layers, none shared: 50 sliding x 16 x 256 (16,384 B) + 10 full x 4 x 512 (8,192 B) = 901,120 B.
PUBLISHED = [
    ("gemma-3n-e4b-it", [("full", 4, 2, 256), ("sliding", 16, 2, 256)], 40_960),
    ("gemma-4-e4b-it", [("full", 4, 2, 512), ("sliding", 20, 2, 256)], 57_344),
    ("gemma-4-31b-it", [("full", 10, 4, 512), ("sliding", 50, 16, 256)], 901_120),
]


@pytest.mark.parametrize(("config", "groups", "per_token"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_configs_per_layer_kv(run_cli, config, groups, per_token):
    out = _json(run_cli, "--config", str(ESTIMATE / config), "--seq-len", "256")
    found = [(g["kind"], g["num_layers"], g["kv_heads_per_gpu"], g["elements_per_head"]) for g in out["layer_groups"]]
    assert found == groups
    assert out["bytes_per_token"] == per_token
    # S = 256 is inside every window, so every layer holds all 256 tokens
    assert out["kv_bytes"] == 256 * per_token


def test_gemma4_31b_request_at_32k_by_hand(run_cli):
    # Sliding layers keep min(S, 1024) tokens: 50 x 16,384 x 1,024 + 10 x 8,192 x 32,768 = 838,860,800 +
    # 2,684,354,560 = 3,523,215,360 B.
    out = _json(run_cli, "--config", str(ESTIMATE / "gemma-4-31b-it"), "--seq-len", "32768")
    assert out["kv_bytes"] == 3_523_215_360


def _layers_by_hand(config: dict) -> list[list]:
    """Each KV-holding layer as [kind, KV heads, head size, window], read from the config without kvtool."""
    text = config["text_config"]
    shared = text.get("num_kv_shared_layers") or 0
    types = text["layer_types"][: text["num_hidden_layers"] - shared]
    global_heads = text["num_global_key_value_heads"] if text.get("attention_k_eq_v") else None
    full = [global_heads or text["num_key_value_heads"], text.get("global_head_dim", text["head_dim"])]
    sliding = [text["num_key_value_heads"], text["head_dim"]]
    return [
        ["full", *full, None] if t == "full_attention" else ["sliding", *sliding, text["sliding_window"]] for t in types
    ]


@pytest.mark.parametrize("name", sorted(SPECS["cases"]))
def test_vllm_spec_cases_list_the_published_layers(name):
    case = SPECS["cases"][name]
    config = json.loads((ESTIMATE / case["config"] / "config.json").read_text())
    assert case["layers"] == _layers_by_hand(config)


@pytest.mark.parametrize("name", sorted(SPECS["cases"]))
def test_capacity_matches_vllm_sizing_functions(run_cli, name):
    case, vllm = SPECS["cases"][name], SPECS["vllm"][name]
    args = [
        "--config",
        str(ESTIMATE / case["config"]),
        "--kv-memory",
        str(case["kv_cache_memory_bytes"]),
        "--block-size",
        str(case["block_size"]),
        "--max-model-len",
        str(case["max_model_len"]),
        "--max-num-batched-tokens",
        str(case["max_num_batched_tokens"]),
    ]
    if not case["async_scheduling"]:
        args.append("--no-async-scheduling")
    out = _json(run_cli, *args)
    assert out["max_in_flight_tokens"] == case["max_in_flight_tokens"]
    assert out["num_blocks"] == vllm["num_blocks"]
    assert out["vllm_logged_tokens"] == vllm["logged_tokens"]
    assert out["max_concurrency"] == pytest.approx(vllm["max_concurrency"], rel=1e-12)
    assert out["blocks_per_request"] == round(vllm["num_blocks"] / vllm["max_concurrency"])


def test_gemma4_31b_capacity_by_hand(run_cli):
    # Pages at block 16: sliding 16 x 16,384 = 262,144 B, full 16 x 8,192 = 131,072 B, which divides it: the full
    # layers' blocks hold 32 tokens. Groups of 10 layers (5 sliding + 1 full): 2,621,440 B per block;
    # 60 GiB // 2,621,440 = 24,576 blocks. Per request at 65,536 tokens with 16,384 in flight: sliding
    # 5 x (cdiv(min(1,023 + 16,384, 65,536), 16) + 1) = 5 x 1,089 = 5,445, full cdiv(65,536, 32) = 2,048.
    out = _json(
        run_cli,
        *("--config", str(ESTIMATE / "gemma-4-31b-it"), "--kv-memory", "60GiB", "--block-size", "16"),
        *("--max-model-len", "65536", "--max-num-batched-tokens", "8192"),
    )
    assert (out["num_blocks"], out["blocks_per_request"]) == (24_576, 5_445 + 2_048)
    assert "full blocks of 32 tokens" in out["capacity_method"]


def test_tensor_parallel_splits_each_kind_of_layer(run_cli):
    # Gemma 4 31B at tp 8: sliding 16 KV heads -> 2 per GPU, full 4 KV heads -> replicated, 1 per GPU (vLLM's
    # Gemma4Attention: max(1, kv_heads // tp)); tp 3 divides neither.
    out = _json(run_cli, "--config", str(ESTIMATE / "gemma-4-31b-it"), "--seq-len", "256", "--tp", "8")
    assert [(g["kind"], g["kv_heads_per_gpu"]) for g in out["layer_groups"]] == [("full", 1), ("sliding", 2)]
    r = run_cli("estimate", "--config", str(ESTIMATE / "gemma-4-31b-it"), "--tp", "3")
    assert r.exit_code == EXIT_USAGE and "--tp 3 does not divide" in r.stderr


def test_pipeline_parallel_with_kv_sharing_is_refused(run_cli):
    r = run_cli("estimate", "--config", str(ESTIMATE / "gemma-3n-e4b-it"), "--pp", "2", "--kv-memory", "8GiB")
    assert r.exit_code == EXIT_USAGE
    assert r.stderr.splitlines()[0].startswith("Error: --pp 2 with gemma-3n-e4b-it's 15 KV-sharing layers")


def test_weights_are_not_guessed_for_per_layer_embedding_models(run_cli):
    out = _json(run_cli, "--config", str(ESTIMATE / "gemma-4-e4b-it"), "--seq-len", "256")
    assert out["weights_bytes"] is None
    assert any(n.startswith("weights unknown: gemma4_text's layers") for n in out["notes"])
    r = run_cli("estimate", "--config", str(ESTIMATE / "gemma-4-e4b-it"), "--gpu", "H100")
    assert r.exit_code == EXIT_USAGE
    assert r.stderr.splitlines()[0] == (
        "Error: GPU planning needs the weights: put the safetensors files (headers suffice) beside "
        "config.json, or give --kv-memory (--gpu)"
    )


def test_per_layer_config_reads_as_global_head_dim(run_cli, tmp_path):
    # transformers 5.19 writes Gemma 4's full-layer shapes as per_layer_config (no global_head_dim), as in the
    # recorded tiny model; the same model written the older way must size the same.
    recorded = DATA / "vllm-sizing" / "gemma4-31b-like-4mb-b32-mnbt256" / "config.json"
    config = json.loads(recorded.read_text())
    assert config["per_layer_config"] == {
        "05": {"head_dim": 64, "num_key_value_heads": 1},
        "11": {"head_dim": 64, "num_key_value_heads": 1},
    }
    older = {k: v for k, v in config.items() if k != "per_layer_config"}
    older.update(global_head_dim=64, num_global_key_value_heads=1)
    (tmp_path / "config.json").write_text(json.dumps(older))
    a = _json(run_cli, "--config", str(recorded.parent), "--seq-len", "300")
    b = _json(run_cli, "--config", str(tmp_path), "--seq-len", "300")
    assert a["layer_groups"] == b["layer_groups"]
    # 7 sliding x 4 x 32 (512 B) + 1 full x 1 x 64 (256 B): 3,840 B per token
    assert a["bytes_per_token"] == 3_840


def test_gemma4_without_global_head_dim_takes_transformers_default(run_cli, tmp_path):
    # Gemma4TextConfig.__post_init__: kwargs.pop("global_head_dim", 512)
    text = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hidden_size": 1024,
        "sliding_window": 512,
        "dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(text))
    out = _json(run_cli, "--config", str(tmp_path), "--seq-len", "256")
    assert [(g["kind"], g["num_layers"], g["elements_per_head"]) for g in out["layer_groups"]] == [
        ("full", 1, 512),
        ("sliding", 5, 128),
    ]
    assert any("global_head_dim not in the config: 512" in n for n in out["notes"])
