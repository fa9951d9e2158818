"""Published config.json files read as a user would (`kvtool estimate --config ...`), each number against a hand
computation from the config and the transformers / vLLM rule it follows (cited per test)."""

from __future__ import annotations

import json

from tests.support import DATA

EST = DATA / "estimate"


def _json(run_cli, *args):
    out = run_cli("estimate", *args, "--json")
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)


def test_gemma3_27b_published_config_is_five_sliding_to_one_full(run_cli):
    # google/gemma-3-27b-it's config.json has no sliding_window_pattern; transformers' Gemma3TextConfig defaults it to
    # 6 (layer_types: layer i is full when (i + 1) % 6 == 0), which is what vLLM's gemma3.py reads: 10 full layers
    # (5, 11, ..., 59) and 52 sliding ones, not 62 sliding layers.
    d = _json(run_cli, "--config", EST / "gemma-3-27b-it" / "config.json", "--seq-len", "131072")
    full = 2 * 10 * 16 * 131072 * 128 * 2  # 10,737,418,240
    sliding = 2 * 52 * 16 * 1024 * 128 * 2  # 436,207,616: min(S, window 1024) tokens
    assert d["kv_bytes"] == full + sliding == 11_173_625_856
    # Gemma3TextConfig's other defaults: max_position_embeddings 131,072; vocab_size 262,208 (so the weights are known:
    # 27.0B language-model parameters of the published 27.4B, which includes the 0.4B SigLIP tower)
    assert d["max_position_embeddings"] == 131072
    assert 26.8e9 < d["weights_params"] < 27.2e9


def test_gemma3_4b_published_config_omits_heads(run_cli):
    # google/gemma-3-4b-it's text_config leaves out num_attention_heads, num_key_value_heads and head_dim;
    # transformers' Gemma3TextConfig defaults them to 8, 4 and 256.  34 layers: full at 5, 11, 17, 23, 29 (5), 29 sliding.
    d = _json(run_cli, "--config", EST / "gemma-3-4b-it" / "config.json", "--seq-len", "131072")
    full = 2 * 5 * 4 * 131072 * 256 * 2  # 2,684,354,560
    sliding = 2 * 29 * 4 * 1024 * 256 * 2  # 121,634,816
    assert d["kv_bytes"] == full + sliding == 2_805_989_376
    # 3.88B language-model parameters (the published 4.3B includes the 0.4B SigLIP tower)
    assert 3.8e9 < d["weights_params"] < 3.95e9


def test_granite_4_h_micro_dense_hybrid(run_cli):
    # ibm-granite/granite-4.0-h-micro: num_local_experts 0 (dense; vLLM's granitemoehybrid.py builds experts only when
    # num_local_experts > 0) must not be refused.  4 attention layers x 2 x 8 KV heads x 64 x 2 B = 8,192 B per token;
    # 36 Mamba-2 layers each keep conv (4 - 1) x (2 x 2048 + 2 x 1 x 128) x 2 B = 26,112 B and
    # temporal 64 heads x 64 x 128 x 2 B = 1,048,576 B per request (MambaStateShapeCalculator).
    d = _json(run_cli, "--config", EST / "granite-4.0-h-micro" / "config.json", "--seq-len", "131072")
    assert d["bytes_per_token"] == 2 * 4 * 8 * 64 * 2 == 8192
    state = 3 * (2 * 2048 + 2 * 128) * 2 + 64 * 64 * 128 * 2
    assert state == 1_074_688
    assert d["kv_bytes"] == 8192 * 131072 + 36 * state


def test_granite_4_h_small_weights_count_mamba_mixers_and_the_shared_mlp(run_cli):
    # IBM: 32B total parameters; a third-party count from the live config: 32,188,252,160.  By hand (vLLM's
    # GraniteMoeHybrid modules): tied embeddings 100,352 x 4096; per layer 72 experts x 3 x 4096 x 768, a router
    # 72 x 4096, the shared MLP 3 x 4096 x 1536 and 2 norms; 4 attention layers 2 x 4096^2 + 2 x 1024 x 4096; 36 Mamba-2
    # mixers: in_proj 4096 x (2 x 8192 + 2 x 128 + 128), out_proj 8192 x 4096, conv1d 8448 x 4 + 8448, A/D/dt_bias
    # 3 x 128, norm 8192.  Counting the Mamba layers as attention and dropping the shared MLP gave 29.28B (-9 %).
    d = _json(run_cli, "--config", EST / "granite-4.0-h-small" / "config.json", "--seq-len", "4096")
    per_layer = 72 * 3 * 4096 * 768 + 72 * 4096 + 3 * 4096 * 1536 + 2 * 4096
    attention = 2 * 4096 * 4096 + 2 * 1024 * 4096
    mamba = 4096 * (2 * 8192 + 2 * 128 + 128) + 8192 * 4096 + 8448 * 4 + 8448 + 3 * 128 + 8192
    hand = 100352 * 4096 + 4096 + 40 * per_layer + 4 * attention + 36 * mamba
    assert d["weights_params"] == hand == 32_207_337_984
    assert abs(d["weights_params"] / 32_188_252_160 - 1) < 0.001
    assert d["bytes_per_token"] == 2 * 4 * 8 * 128 * 2 == 16384  # 4 attention layers (the source: 16,384)


def test_nemotron_3_nano_weights_by_block_and_pipeline_stages(run_cli):
    # NVIDIA: 31.6B total parameters.  vLLM nemotron_h.py: each of the 52 blocks holds one mixer and one norm.
    # By hand: untied embeddings 2 x 131,072 x 2688; 23 Mamba-2 blocks (in_proj 2688 x (4096 + 6144 + 64), out_proj
    # 4096 x 2688, conv1d 6144 x 4 + 6144, 3 x 64, norm 4096); 6 attention blocks (2 x 4096 x 2688 + 2 x 256 x 2688);
    # 23 MoE blocks of 128 squared-ReLU experts (up, down: 2 x 1856 x 2688), a router 2688 x 128 + 128 bias and a
    # shared expert 2 x 3712 x 2688.  Counting every block as attention + a 3-matrix MoE gave 102.3B, which made an
    # H100 "refuse to start".
    cfg = EST / "nemotron-3-nano-30b-a3b" / "config.json"
    d = _json(run_cli, "--config", cfg, "--seq-len", "131072")
    mamba = 2688 * (4096 + 6144 + 64) + 4096 * 2688 + 6144 * 4 + 6144 + 3 * 64 + 4096 + 2688
    attention = 2 * 4096 * 2688 + 2 * 256 * 2688 + 2688
    moe = 128 * 2 * 1856 * 2688 + 2688 * 128 + 128 + 2 * 3712 * 2688 + 2688
    hand = 2 * 131072 * 2688 + 2688 + 23 * mamba + 6 * attention + 23 * moe
    assert d["weights_params"] == hand == 31_577_940_288
    # 6 attention layers x 2 x 2 KV heads x 128 x 2 B; 23 states: conv 3 x 6144 x 2 B + float32 64 x 64 x 128 x 4 B
    assert d["bytes_per_token"] == 6 * 2 * 2 * 128 * 2 == 6144
    assert d["kv_bytes"] == 6144 * 131072 + 23 * (3 * 6144 * 2 + 64 * 64 * 128 * 4)
    # --pp 2 splits the 52 blocks 26 / 26 (get_pp_indices); each half holds 3 attention blocks
    # ("MEMEM*EMEMEM*EMEMEM*EMEMEM" | "*EMEMEM*EMEMEMEM*EMEMEMEME"), so both stages get the same block count
    pp = _json(run_cli, "--config", cfg, "--seq-len", "131072", "--kv-memory", "10GiB", "--pp", "2")
    assert [s["num_layers"] for s in pp["stages"]] == [26, 26]
    assert pp["stages"][0]["num_blocks"] == pp["stages"][1]["num_blocks"]


def test_qwen3_6_published_text_config_is_sized_not_refused(run_cli):
    # The published Qwen3.5 / Qwen3.6 checkpoints nest the language model under text_config with model_type
    # qwen3_5_moe_text (vLLM sizes it as Qwen3-Next: Gated DeltaNet states + 10 attention layers); it was refused.
    # KV: 10 attention layers x 2 x 2 KV heads x 256 x 2 B = 20,480 B per token.  Weights by hand ("35B" total):
    # untied embeddings 2 x 248,320 x 2048; per layer 256 experts x 3 x 2048 x 512, a router 256 x 2048, a shared
    # expert 3 x 2048 x 512 and its gate 2048, 2 norms; 10 gated attention layers (q 2 x 16 x 256 rows, k, v 512,
    # o 4096 cols); 30 Gated DeltaNet mixers (qkvz 12,288 x 2048, ba 64 x 2048, out 2048 x 4096, conv 8192 x 4,
    # A and dt_bias 2 x 32, norm 128).  The config has no intermediate_size (every layer is MoE).
    cfg = DATA / "gpu-logs" / "qwen3.6-35b-a3b-nvfp4-5090" / "config.json"
    d = _json(run_cli, "--config", cfg, "--seq-len", "131072")
    assert d["bytes_per_token"] == 10 * 2 * 2 * 256 * 2 == 20480
    layer = 256 * 3 * 2048 * 512 + 256 * 2048 + 3 * 2048 * 512 + 2048 + 2 * 2048
    attention = 8192 * 2048 + 2 * 512 * 2048 + 2048 * 4096
    deltanet = 12288 * 2048 + 64 * 2048 + 2048 * 4096 + 8192 * 4 + 64 + 128
    hand = 2 * 248320 * 2048 + 2048 + 40 * layer + 10 * attention + 30 * deltanet
    assert d["weights_params"] == hand == 34_660_605_568


def test_minimax_m2_all_full_attention_type_list_and_no_shared_expert(run_cli, tmp_path):
    # MiniMax-M2.x's official config (its values as a public vLLM plugin's tests pin "the official contract"):
    # attn_type_list [1] * 62 (1 = softmax attention on every layer; only MiniMax-Text-01/M1 use 0, lightning
    # attention) and shared_intermediate_size 0.  kvtool refused the first as a hybrid and the second as "must be
    # positive".  KV: 2 x 62 x 8 x 128 x 2 B = 253,952 B per token.  Weights by hand (MiniMax: "230B total"):
    # untied embeddings 2 x 200,064 x 3072; per layer q 6144 x 3072, k, v 1024 x 3072, o 3072 x 6144, 256 experts
    # x 3 x 3072 x 1536, a router 256 x 3072, 2 norms (the 3 MTP modules are not loaded without speculative decoding).
    config = {
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_type": "minimax_m2",
        "hidden_size": 3072,
        "intermediate_size": 1536,
        "num_hidden_layers": 62,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rotary_dim": 64,
        "num_local_experts": 256,
        "num_experts_per_tok": 8,
        "shared_intermediate_size": 0,
        "max_position_embeddings": 204800,
        "vocab_size": 200064,
        "num_mtp_modules": 3,
        "use_mtp": True,
        "tie_word_embeddings": False,
        "attn_type_list": [1] * 62,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    d = _json(run_cli, "--config", tmp_path, "--seq-len", "32768")
    assert d["bytes_per_token"] == 2 * 62 * 8 * 128 * 2 == 253952
    layer = 6144 * 3072 + 2 * 1024 * 3072 + 3072 * 6144 + 256 * 3 * 3072 * 1536 + 256 * 3072 + 2 * 3072
    assert d["weights_params"] == 2 * 200064 * 3072 + 3072 + 62 * layer == 228_689_304_576


def test_mistral_small_3_2_published_config_has_an_untied_head(run_cli):
    # The published Mistral Small 3.2 config says nothing about tie_word_embeddings; transformers' MistralConfig
    # defaults it to False (vLLM loads a separate lm_head).  By hand: 2 x 131,072 x 5120 embeddings + 40 layers of
    # q/o 2 x 4096 x 5120, k/v 2 x 1024 x 5120, MLP 3 x 5120 x 32,768 and 2 norms + the final norm.
    d = _json(run_cli, "--config", EST / "mistral-small-3.2-24b" / "config.json", "--seq-len", "131072")
    layer = 2 * 4096 * 5120 + 2 * 1024 * 5120 + 3 * 5120 * 32768 + 2 * 5120
    assert d["weights_params"] == 2 * 131072 * 5120 + 40 * layer + 5120 == 23_572_403_200
    # vLLM 0.11 on an H100 logged "Model loading took 44.76 GiB" (tests/data/gpu-logs/mistral-small-3.2-24b-h100),
    # which also holds the ~0.4B-parameter Pixtral tower kvtool does not count; a tied head gave 42.66 GiB
    assert 0 < 44.76 - d["weights_bytes"] / 1024**3 < 1.0
