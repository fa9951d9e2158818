"""The vision encoder of multimodal checkpoints (kvtool.estimate.multimodal): parameter counts by hand from the
config dimensions, the profiling terms, and the options --limit-mm-per-prompt / --mm-encoder-tp-mode."""

from __future__ import annotations

import json

from kvtool.estimate.multimodal import DATA_MODE, WEIGHTS_MODE, plan_encoder, vision_encoder
from tests.support import DATA

LOGS = DATA / "gpu-logs"
GIB = 1024**3


def _config(name: str) -> dict:
    return json.loads((LOGS / name / "config.json").read_text(encoding="utf-8"))


def test_siglip_of_gemma_3_27b_by_hand():
    # vllm/model_executor/models/siglip.py (0.19.0), h 1152, inter 4304, 27 layers, patch 14, image 896:
    # per layer qkv+out 4 h^2 = 5,308,416, fc1+fc2 2 h inter = 9,916,416, biases 4 h + inter + h = 10,064,
    # 2 LayerNorms 4 h = 4,608 -> 15,239,504 x 27 = 411,466,608; patch conv 3 x 14 x 14 x 1152 + 1152 = 678,528;
    # positions 64^2 x 1152 = 4,718,592; post LayerNorm 2,304; gemma3_mm.py projector 1152 x 5376 = 6,193,152 and
    # its RMSNorm 1,152 -> 423,060,336
    enc = vision_encoder(_config("gemma-3-27b-it-h100-v0.19.0"), 5376)
    assert enc is not None and enc.num_params == 423_060_336
    assert enc.tokens_per_item == 256 and enc.patches_per_item == 4096


def test_pixtral_of_mistral_small_by_hand():
    # pixtral.py / mistral3.py (0.19.0), h 1024, inter 4096, 24 layers, text hidden 5120, no biases:
    # per layer 4 h^2 + 3 h inter = 16,777,216 + 2 RMSNorms 2,048 -> x 24 = 402,702,336; patch conv 602,112;
    # ln_pre 1,024; projector norm 1,024, merger 4 h^2 = 4,194,304, linear_1 h x 5120 = 5,242,880,
    # linear_2 5120^2 = 26,214,400 -> 438,958,080
    enc = vision_encoder(_config("mistral-small-3.1-24b-h100-v0.19.0"), 5120)
    assert enc is not None and enc.num_params == 438_958_080
    # 1540 / (14 x 2) = 55 -> 3,025 tokens per image (PixtralHFEncoderInfo.get_num_image_tokens)
    assert enc.tokens_per_item == 3025


def test_llama4_vision_split_over_tp_or_replicated():
    # mllama4.py (0.19.0): per layer 4 h^2 + 2 h inter = 23,789,568 (h 1408, inter 5632) x 34 = 808,845,312,
    # unfold conv 588 x 1408 = 827,904, adapter 5632 x 4096 + 4096^2 = 39,845,888, projector 4096 x 5120
    # = 20,971,520 -> split 870,490,624; replicated: class 1408, positions 577 x 1408 = 812,416, 2 pre/post
    # LayerNorms 5,632, per layer (2 LayerNorms 5,632 + biases 4 h + inter + h 12,672) x 34 = 622,336 -> 1,441,792
    enc = vision_encoder(_config("llama-4-scout-h100-tp4-v0.19.0"), 5120)
    assert enc is not None and (enc.split_params, enc.replicated_params) == (870_490_624, 1_441_792)
    common = dict(dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=8192,
                  limit_mm_per_prompt=None, vllm_version="0.19.0")  # fmt: skip
    split = plan_encoder(enc, tp=4, tp_mode=WEIGHTS_MODE, **common)
    data = plan_encoder(enc, tp=4, tp_mode=DATA_MODE, **common)
    assert split.weights_bytes_per_gpu == (870_490_624 // 4 + 1_441_792) * 2
    assert data.weights_bytes_per_gpu == (870_490_624 + 1_441_792) * 2
    # before 0.10.2 there is no data mode: the option is refused (checked through the CLI below)


def test_profiling_batch_by_hand():
    # encoder budget max(8192, 256) = 8192 -> 32 dummy 896x896 images (MultiModalBudget._get_max_items, 0.19.0);
    # resident: pixels 32 x 3 x 896^2 + outputs 32 x 256 x 5376, bf16 = 2 x (77,070,336 + 44,040,192) bytes
    enc = vision_encoder(_config("gemma-3-27b-it-h100-v0.19.0"), 5376)
    assert enc is not None
    plan = plan_encoder(enc, dtype_bytes=2, tp=1, max_num_batched_tokens=8192, max_num_seqs=256,
                        max_model_len=8192, limit_mm_per_prompt=None, tp_mode=WEIGHTS_MODE, vllm_version="0.19.0")  # fmt: skip
    assert plan.items == 32 and plan.resident_bytes == 2 * (77_070_336 + 44_040_192)
    # --limit-mm-per-prompt '{"image": 2}': at most max_num_seqs x 2 items, still 32 here; max_num_seqs 4 -> 8
    few = plan_encoder(enc, dtype_bytes=2, tp=1, max_num_batched_tokens=8192, max_num_seqs=4, max_model_len=8192,
                       limit_mm_per_prompt={"image": 2}, tp_mode=WEIGHTS_MODE, vllm_version="0.19.0")  # fmt: skip
    assert few.items == 8


def _mistral(run_cli, *args):
    result = run_cli(
        "estimate", "--config", str(LOGS / "mistral-small-3.1-24b-h100-v0.19.0"), "--seq-len", "8192",
        "--gpu-memory", "79.19GiB", "--gpu-memory-utilization", "0.95", "--vllm-version", "0.19.0", "--json", *args,
    )  # fmt: skip
    return result


def test_mistral_small_against_its_gpu_log(run_cli):
    # tests/data/gpu-logs/mistral-small-3.1-24b-h100-v0.19.0: weights 44.76 GiB, activation 2.03, KV 28.19 logged
    out = json.loads(_mistral(run_cli).stdout)
    assert abs(out["weights_bytes_per_gpu"] / GIB - 44.76) <= 0.25
    assert abs(out["activation_bytes"] / GIB - 2.03) <= 0.05
    assert abs(out["kv_budget_bytes"] / GIB - 28.19) <= 0.25
    assert out["encoder_weights_bytes"] == 438_958_080 * 2 and out["encoder_activation_bytes"] > 0
    assert not any("encoder is not counted" in w for w in out["warnings"])


def test_limit_mm_per_prompt_zero_skips_the_encoder(run_cli):
    # profile_run skips the encoder (budget 0), and since 0.15.0 the tower is not built (_mark_tower_model)
    with_encoder = json.loads(_mistral(run_cli).stdout)
    out = json.loads(_mistral(run_cli, "--limit-mm-per-prompt", '{"image": 0}').stdout)
    assert out["encoder_weights_bytes"] == 0 and out["encoder_activation_bytes"] == 0
    gained = out["kv_budget_bytes"] - with_encoder["kv_budget_bytes"]
    assert gained == with_encoder["encoder_weights_bytes"] + with_encoder["encoder_activation_bytes"]


def test_bad_multimodal_options(run_cli):
    bad = _mistral(run_cli, "--limit-mm-per-prompt", "image=0")
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: --limit-mm-per-prompt is not JSON")
    bad = _mistral(run_cli, "--mm-encoder-tp-mode", "foo")
    assert bad.exit_code == 2 and "unknown --mm-encoder-tp-mode 'foo'" in bad.stderr
    old = run_cli("estimate", "--config", str(LOGS / "llama-4-scout-h100-tp4-v0.19.0"), "--seq-len", "8192",
                  "--gpu", "h100-80gb", "--tp", "4", "--vllm-version", "0.10.1", "--mm-encoder-tp-mode", "data")  # fmt: skip
    assert old.exit_code == 2 and "has no --mm-encoder-tp-mode" in old.stderr
