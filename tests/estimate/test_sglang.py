"""kvtool estimate --engine sglang: SGLang's rules against hand computations from its source (python/sglang/srt in
each release's wheel, `pip download sglang==X --no-deps`), the CLI and its errors."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import UsageError
from kvtool.estimate.sglang.args import is_sglang_line, parse_sglang_launch
from kvtool.estimate.sglang.pool import LoggedMemory, SglangRequest, estimate_sglang, pool_tokens
from kvtool.estimate.sglang.rules import (
    PrefillGraphInputs,
    default_mem_fraction_static,
    gpu_defaults,
    prefill_graph_tokens,
    running_requests,
    vlm_fraction,
)
from kvtool.estimate.sglang.versions import resolve_sglang_version

H100_MIB = 81559  # nvidia-smi's total of an H100 80GB HBM3 (profiles/gpus/h100-80gb.yaml)
H200_MIB = 143771  # nvidia-smi's total of an H200 (profiles/gpus/h200.yaml)
B200_MIB = 183359  # nvidia-smi's total of a B200 (profiles/gpus/b200.yaml)
RTX4090_MIB = 24564


@pytest.mark.parametrize(
    ("mib", "tp", "version", "expected"),
    [
        # 0.4.0-0.4.5: by TP alone (server_args.py __post_init__)
        (H100_MIB, 1, "0.4.3.post2", 0.88),
        (H100_MIB, 8, "0.4.3.post2", 0.81),
        (None, 16, "0.4.1", 0.79),
        # 0.4.6.post2-0.4.7.post1 above 96 GiB: min(0.88 + 48*1024*0.12/143771, (143771 - 18432)/143771) = 0.87180
        (H200_MIB, 1, "0.4.6.post5", (H200_MIB - 18432) / H200_MIB),
        # 0.4.6: above 81920 MiB, (gpu_mem - 13312) / gpu_mem
        (H200_MIB, 1, "0.4.6", (H200_MIB - 13312) / H200_MIB),
        # 0.4.8-0.5.2: reserved (2.8 + 1/10) GiB below 35 GiB: round((16303 - 2969.6) / 16303, 3) = 0.818
        (16303, 1, "0.4.10.post2", 0.818),
        # H100 at TP 2: reserved (9.5 + 2/2) GiB = 10752 MiB: round((81559 - 10752) / 81559, 3) = 0.868
        (H100_MIB, 2, "0.5.2", 0.868),
        # 0.5.3+: 512 + 8192*1.5 + 256*2 + 1/8*1024 = 13440 MiB: round((81559 - 13440) / 81559, 3) = 0.835
        (H100_MIB, 1, "0.5.6", 0.835),
        # 24 GiB RTX 4090 (24564 MiB) at 0.5.6: 512 + 2048*1.5 + 24*2 + 128 = 3760: round(20804 / 24564, 3) = 0.847
        (24564, 1, "0.5.6", 0.847),
        # the same at 0.5.4 (cuda_graph_max_bs 16): 512 + 3072 + 32 + 128 = 3744: round(20820 / 24564, 3) = 0.848
        (24564, 1, "0.5.4", 0.848),
    ],
)
def test_mem_fraction_static_defaults(mib, tp, version, expected):
    tiers = gpu_defaults(mib, tp, version)
    value, _ = default_mem_fraction_static(mib, tp, 1, tiers.chunked_prefill_size, tiers.cuda_graph_max_bs, version)
    assert value == pytest.approx(expected)


# Releases after 0.5.6.post2, by hand from each wheel's python/sglang/srt.  The prefill CUDA graph's token counts up
# to N are 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096 step 256, 4608..N step 512
# (server_args.py _generate_piecewise_cuda_graph_tokens, 0.5.10): 42 up to 2048, 50 up to 4096, 58 up to 8192, 74 up
# to 16384.  Its reserve is 8 MiB each for a non-MLA model, 1.5 GiB for MLA, added before the 10 GiB floor
# (_handle_gpu_memory_settings 0.5.10-0.5.18, arg_groups/memory_hook.py handle_gpu_memory_settings 0.5.19+).
@pytest.mark.parametrize(
    ("mib", "tp", "version", "inputs", "running", "expected"),
    [
        # 0.5.7-0.5.9: the piecewise graph is opt-in (enable_piecewise_cuda_graph=False), so 0.5.6's 13440 MiB holds
        (H100_MIB, 1, "0.5.7", {}, None, 0.835),
        (H100_MIB, 1, "0.5.9", {}, None, 0.835),
        # 0.5.10: on by default: 13440 + 58 x 8 = 13904: round(67655 / 81559, 3) = 0.83
        (H100_MIB, 1, "0.5.10", {}, None, 0.83),
        # B200 at 0.5.10: 512 + 16384*1.5 + 512*2 + 128 + 74 x 8 = 26832: round(156527 / 183359, 3) = 0.854, the
        # default of tests/data/sglang-logs/qwen3-8b-b200-v0.5.10 (whose log compiles 74 token counts)
        (B200_MIB, 1, "0.5.10.post1", {}, None, 0.854),
        # model_path containing "llama-2" caps the largest count at 4096: 26240 + 50 x 8 = 26640: 0.855
        (B200_MIB, 1, "0.5.10", {"model_path": "meta-llama/Llama-2-7b-hf"}, None, 0.855),
        # --max-total-tokens 3000 caps it too: 26240 + 45 x 8 = 26600: round(156759 / 183359, 3) = 0.855
        (B200_MIB, 1, "0.5.11", {"max_total_tokens": 3000}, None, 0.855),
        # 0.5.13-0.5.16 clamp it to --context-length: 13440 + 42 x 8 = 13776: 0.831; 0.5.17 dropped the clamp: 0.83
        (H100_MIB, 1, "0.5.13", {"context_length": 2048}, None, 0.831),
        (H100_MIB, 1, "0.5.17", {"context_length": 2048}, None, 0.83),
        # MLA: 13440 + 1536 = 14976: round(66583 / 81559, 3) = 0.816; 0.5.16-0.5.17's breakable prefill graph is off
        # for MLA (_disable_breakable_cudagraph_if_incompatible): 0.835; 0.5.18 takes MLA again: 0.816
        (H100_MIB, 1, "0.5.15", {"mla": True}, None, 0.816),
        (H100_MIB, 1, "0.5.16", {"mla": True}, None, 0.835),
        (H100_MIB, 1, "0.5.18", {"mla": True}, None, 0.816),
        # an architecture the prefill graph is off for (model_config.py piecewise_cuda_graph_disabled_model_archs)
        (H100_MIB, 1, "0.5.10", {"architectures": ("LLaDAModelLM",)}, None, 0.835),
        # 24 GiB RTX 4090 at 0.5.19: 512 + 2048*1.5 + 24*2 + 128 + 42 x 8 = 4096: round(20468 / 24564, 3) = 0.833
        (RTX4090_MIB, 1, "0.5.19", {}, None, 0.833),
        # 0.5.20: the 20-35 GiB tier takes chunked_prefill_size 4096 and max_bs 48: 512 + 6144 + 96 + 128 + 50 x 8
        # = 7280: round(17284 / 24564, 3) = 0.704
        (RTX4090_MIB, 1, "0.5.20", {}, None, 0.704),
        # 0.5.22: a default max_bs above --max-running-requests 64 is cut to it: 512 + 12288 + 128 + 128 + 464 =
        # 13520: round(68039 / 81559, 3) = 0.834 (0.5.21 keeps 256: 0.83)
        (H100_MIB, 1, "0.5.22", {}, 64, 0.834),
        (H100_MIB, 1, "0.5.21", {}, 64, 0.83),
        # no GPU memory known: 0.88 to 0.5.19, 0.95 from 0.5.20
        (None, 1, "0.5.19", {}, None, 0.88),
        (None, 1, "0.5.20", {}, None, 0.95),
    ],
)
def test_mem_fraction_static_defaults_after_0_5_6(mib, tp, version, inputs, running, expected):
    tiers = gpu_defaults(mib, tp, version, running)
    value, _ = default_mem_fraction_static(
        mib, tp, 1, tiers.chunked_prefill_size, tiers.cuda_graph_max_bs, version, PrefillGraphInputs(**inputs)
    )
    assert value == pytest.approx(expected)


def test_prefill_graph_tokens():
    # the logs' own counts: 74 compiled at chunked_prefill_size 16384 (tests/data/sglang-logs/qwen3-8b-b200-v0.5.10),
    # 58 captured at 8192 (apertus-8b-gh200-tp4-v0.5.10.post1's "Capture cuda graph num tokens [4, 8, ..., 8192]")
    assert len(prefill_graph_tokens(16384)) == 74 and len(prefill_graph_tokens(8192)) == 58
    assert prefill_graph_tokens(8192)[:9] == [4, 8, 12, 16, 20, 24, 28, 32, 48]
    assert prefill_graph_tokens(8192)[-3:] == [7168, 7680, 8192]


def test_chunked_prefill_size_after_0_5_6():
    # memory_hook.py handle_gpu_memory_settings 0.5.20+: 20-35 GiB takes 4096 (2048 before), TP >= 4 max_bs 160 (80)
    assert gpu_defaults(RTX4090_MIB, 1, "0.5.19").chunked_prefill_size == 2048
    assert gpu_defaults(RTX4090_MIB, 4, "0.5.19").cuda_graph_max_bs == 80
    tiers = gpu_defaults(RTX4090_MIB, 4, "0.5.20")
    assert tiers == gpu_defaults(RTX4090_MIB, 4, "0.5.23")
    assert (tiers.chunked_prefill_size, tiers.cuda_graph_max_bs) == (4096, 160)


@pytest.mark.parametrize(
    ("tokens", "cap", "version", "expected"),
    [
        # 0.4.7-0.5.9 (model_runner.py init_memory_pool): the pool holds the cap given; logged min(cap, pool)
        (2467713, 8000, "0.5.9", (8000, 8000)),
        # 0.5.10-0.5.13 (model_runner_kv_cache_mixin.py _resolve_max_num_reqs): the cap is cut to the estimate
        # min(max(int(2467713 / 32768 * 512), 2048), 4096) = 4096
        (2467713, 8000, "0.5.10", (4096, 4096)),
        (2467713, 256, "0.5.10.post1", (256, 256)),  # tests/data/sglang-logs/apertus-8b-gh200-tp4-v0.5.10.post1
        # 0.5.14+ (kv_cache_configurator.py resolve_max_num_reqs from 0.5.16): cut to tokens // 2 instead
        (10000, 8000, "0.5.14", (5000, 5000)),
        (2467713, 8000, "0.5.23", (8000, 8000)),
        # no cap: min(estimate, tokens // 2) in every release (the 0.5.18 case: int(208651 / 40960 * 512) = 2608)
        (208651, None, "0.5.18", (2608, 2608)),
        (3000, None, "0.5.10", (1500, 1500)),
        (3000, None, "0.5.9", (2048, 1500)),
    ],
)
def test_running_requests(tokens, cap, version, expected):
    context_len = 40960 if tokens == 208651 else 32768
    assert running_requests(tokens, context_len, cap, version) == expected


def test_allocation_line_names_the_dtype_from_0_5_13():
    # srt/mem_cache/memory_pool.py 0.5.13+: "KV Cache is allocated. dtype: {self.dtype}, #tokens: ..."
    logged = LoggedMemory(78.81, 63.72)
    new = estimate_sglang(SglangRequest(model="llama-3.1-8b", sglang_version="0.5.13"), logged).log_lines[0]
    old = estimate_sglang(SglangRequest(model="llama-3.1-8b", sglang_version="0.5.12"), logged).log_lines[0]
    assert new.startswith("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 444520, K size: 27.13 GB")
    assert old.startswith("KV Cache is allocated. #tokens: 444520, K size: 27.13 GB")


@pytest.mark.parametrize(
    ("dtype", "version", "message"),
    [
        # --kv-cache-dtype choices of srt/server_args.py add_cli_args (0.5.16) and arg_groups/fields/model.py (0.5.21)
        ("nvfp4", "0.5.16", "SGLang 0.5.16's --kv-cache-dtype nvfp4 keeps scale buffers beside the cache"),
        ("fp4_e2m1", "0.5.10", "SGLang 0.5.10's --kv-cache-dtype fp4_e2m1 keeps scale buffers"),
        ("nvfp4", "0.5.15", "--kv-cache-dtype nvfp4 is not one SGLang 0.5.15 takes"),
        ("fp4_e2m1", "0.5.21", "--kv-cache-dtype fp4_e2m1 is not one SGLang 0.5.21 takes"),
    ],
)
def test_unmodelled_kv_dtypes_are_refused(dtype, version, message):
    with pytest.raises(UsageError, match=message):
        estimate_sglang(SglangRequest(model="llama-3.1-8b", gpu="H100", kv_cache_dtype=dtype, sglang_version=version))


def test_chunked_prefill_size_defaults():
    assert gpu_defaults(24564, 1, "0.4.3").chunked_prefill_size == 2048  # below 25,000 MiB
    assert gpu_defaults(H100_MIB, 1, "0.4.3").chunked_prefill_size == 8192
    assert gpu_defaults(46068, 1, "0.5.6").chunked_prefill_size == 4096  # L40S: 35-60 GiB
    assert gpu_defaults(183359, 8, "0.5.6").chunked_prefill_size == 16384  # B200: 160 GiB and more


def test_pool_tokens_is_profile_max_num_token():
    # Llama-3.1-8B on an H100 (tests/data/sglang-logs/llama-3.1-8b-h100-v0.4.1): rest = 63.72 - 78.81 * 0.12
    # = 54.2628 GiB; cell = 8 x 128 x 32 x 2 x 2 = 131,072 B; int(54.2628 * 2**30 // 131072) = 444,520
    assert pool_tokens(63.72 - 78.81 * (1 - 0.88), 131072) == 444520


def test_mla_and_fp8_cells():
    # DeepSeek-V2-Lite: (kv_lora_rank 512 + qk_rope_head_dim 64) x 27 layers x 2 bytes = 31,104; fp8: 15,552
    mla = estimate_sglang(SglangRequest(model="deepseek-v2-lite", gpu="H100"))
    assert (mla.attention, mla.cell_bytes_per_token) == ("MLA", 31104)
    fp8 = estimate_sglang(SglangRequest(model="deepseek-v2-lite", gpu="H100", kv_cache_dtype="fp8_e4m3"))
    assert fp8.cell_bytes_per_token == 15552 and fp8.log_lines[0].endswith("GB") and "KV size" in fp8.log_lines[0]


def test_page_size_rounds_the_pool_down():
    logged = LoggedMemory(78.81, 63.72)
    paged = estimate_sglang(SglangRequest(model="llama-3.1-8b", sglang_version="0.4.6", page_size=64), logged)
    assert paged.max_total_num_tokens == 444520 // 64 * 64
    with pytest.raises(UsageError, match="new in SGLang 0.4.4"):
        estimate_sglang(SglangRequest(model="llama-3.1-8b", sglang_version="0.4.3", page_size=64), logged)


def test_max_running_requests():
    # 0.4.7+: ReqToTokenPool(size=max_num_reqs); max_num_reqs = min(max(int(444520/131072*512), 2048), 4096) = 2048
    pool = estimate_sglang(SglangRequest(model="llama-3.1-8b", sglang_version="0.4.9"), LoggedMemory(78.81, 63.72))
    assert (pool.max_num_reqs, pool.max_running_requests) == (2048, 2048)


def test_versions():
    assert resolve_sglang_version("0.4") == "0.4.10.post2"
    assert resolve_sglang_version("v0.4.6.post5") == "0.4.6.post5"
    assert resolve_sglang_version("0.5.2rc1") == "0.5.2"
    assert resolve_sglang_version("0.5") == "0.5.23"  # the newest release on PyPI when this was written
    assert resolve_sglang_version("0.5.10.post1") == "0.5.10.post1"
    with pytest.raises(UsageError, match=r"0\.5\.24 is not a release kvtool models") as err:
        resolve_sglang_version("0.5.24")
    assert "0.5.23" in (err.value.tip or "")


def test_unmodelled_layers_are_refused():
    with pytest.raises(UsageError, match="sliding-window"):
        estimate_sglang(SglangRequest(model="gemma-2-9b", gpu="H100"))
    # 0.4.9.post3 on: a model whose SGLang class reports a window gets SWAKVPool (model_runner.py ModelRunner.__init__)
    with pytest.raises(UsageError, match="0.4.9.post3 sizes those pools apart"):
        estimate_sglang(SglangRequest(model="gemma-2-9b", gpu="H100", sglang_version="0.4.9.post3"))


def test_windowed_layers_get_full_slots_before_the_hybrid_pool():
    # 0.4.0-0.4.9.post2: init_memory_pool's MHATokenToKVPool has a slot in all num_hidden_layers; Gemma 2 9B:
    # 8 KV heads x 256 x 42 layers x 2 (K, V) x 2 bytes = 344,064 bytes a token
    pool = estimate_sglang(SglangRequest(model="gemma-2-9b", sglang_version="0.4.9.post2"), LoggedMemory(78.81, 61.0))
    assert pool.cell_bytes_per_token == 8 * 256 * 42 * 2 * 2
    assert any("get a full slot" in note for note in pool.notes)


@pytest.mark.parametrize(
    ("arch", "given", "vit", "version", "expected"),
    [
        # 0.4.0-0.4.4.post3: ModelRunner.model_specific_adjustment, x 0.95 whatever the fraction
        ("Gemma3ForConditionalGeneration", False, None, "0.4.4.post2", 0.88 * 0.95),
        ("Qwen2VLForConditionalGeneration", True, None, "0.4.1", 0.88 * 0.95),
        # 0.4.4.post4-0.4.8.post1: x 0.90; from 0.4.6 Gemma 3 and Llama 4 are text-only by default (mm_disabled_models)
        ("Gemma3ForConditionalGeneration", False, None, "0.4.5", 0.88 * 0.90),
        ("Gemma3ForConditionalGeneration", False, None, "0.4.6", 0.88),
        ("Qwen2_5_VLForConditionalGeneration", True, None, "0.4.8", 0.88 * 0.90),
        # 0.4.9-0.4.9.post2: ServerArgs cuts its own default only
        ("Qwen2_5_VLForConditionalGeneration", True, None, "0.4.9", 0.88),
        ("Qwen2_5_VLForConditionalGeneration", False, None, "0.4.9.post2", 0.88 * 0.90),
        # 0.4.9.post3 on, adjust_mem_fraction_for_vlm: 32 layers x 1280^2 against 24 x 1024^2 is 2.0833,
        # 0.95 x (1 - 0.1 x 1.0833) = 0.84708
        ("Qwen2_5_VLForConditionalGeneration", False, (32, 1280), "0.5.3", 0.88 * 0.95 * (1 - 0.1 * (32 * 1280**2 / (24 * 1024**2) - 1))),
        ("LlamaForCausalLM", False, None, "0.4.4.post2", 0.88),
    ],
)  # fmt: skip
def test_multimodal_fraction(arch, given, vit, version, expected):
    fraction, _ = vlm_fraction(0.88, given, (arch,), vit, version)
    assert fraction == pytest.approx(expected)
    with pytest.raises(UsageError, match="Mamba state"):
        estimate_sglang(SglangRequest(model="qwen3-next-80b", gpu="H200", tp=4))


def test_launch_line():
    words = "python3 -m sglang.launch_server --model-path Qwen/QwQ-32B --tp 4 --trust-remote-code --port 30000".split()
    assert is_sglang_line(words) and not is_sglang_line(["vllm", "serve", "m"])
    line = parse_sglang_launch(words)
    assert line.values() == {"model": "Qwen/QwQ-32B", "tp": 4}
    assert line.warnings() == ("SGLang line: ignored (kvtool does not model them): --trust-remote-code, --port",)
    with pytest.raises(UsageError, match="speculative decoding"):
        parse_sglang_launch(["sglang", "serve", "--model-path", "m", "--speculative-algorithm", "EAGLE"])


def test_cli_sglang_json(run_cli):
    result = run_cli("estimate", "-m", "llama-3.1-8b", "--gpu", "H100", "--engine", "sglang", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    # the default release is the newest, 0.5.23 (srt/arg_groups/memory_hook.py handle_gpu_memory_settings): 512 +
    # 8192*1.5 + 256*2 + 1024/8 + 58 prefill-graph token counts (4..8192) x 8 = 13904: round(67655 / 81559, 3) = 0.83
    assert data["engine"] == "sglang" and data["sglang_version"] == "0.5.23" and data["mem_fraction_static"] == 0.83
    assert data["cell_bytes_per_token"] == 131072 and data["max_total_num_tokens"] > 0


def test_cli_launch_line_means_sglang(run_cli):
    result = run_cli(
        "estimate", "--gpu", "L4", "--json", "--", "python", "-m", "sglang.launch_server", "--model-path",
        "llama-3.1-8b", "--tp-size", "2", "--mem-fraction-static", "0.8",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["engine"], data["tp"], data["mem_fraction_static"]) == ("sglang", 2, 0.8)


@pytest.mark.parametrize(
    ("version", "fraction"),
    [("0.5.9", 0.835), ("0.5.10.post1", 0.83), ("v0.5.19", 0.83), ("0.5", 0.83)],
)
def test_cli_sglang_version(run_cli, version, fraction):
    result = run_cli(
        "estimate", "-m", "llama-3.1-8b", "--gpu", "H100", "--engine", "sglang", "--sglang-version", version, "--json"
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["sglang_version"] == resolve_sglang_version(version) and data["mem_fraction_static"] == fraction
    # the pool from the H100 profile (79.22 GiB less the 0.41 GiB context) and kvtool's weights, at that fraction
    assert data["max_total_num_tokens"] == pytest.approx(
        (data["available_gpu_memory_gib"] - data["total_gpu_memory_gib"] * (1 - fraction)) * 2**30 / 131072, abs=1
    )


def test_cli_sglang_version_launch_line(run_cli):
    result = run_cli(
        "estimate", "--gpu", "H100", "--sglang-version", "0.5.13", "--json", "--", "sglang", "serve", "--model-path",
        "llama-3.1-8b", "--context-length", "2048",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    # 0.5.13 clamps the prefill graph to --context-length 2048: 13440 + 42 x 8 MiB: 0.831 (see above)
    assert (data["sglang_version"], data["context_len"], data["mem_fraction_static"]) == ("0.5.13", 2048, 0.831)
    assert data["log_lines"][0].startswith("KV Cache is allocated. dtype: torch.bfloat16, #tokens: ")


def test_cli_side_by_side(run_cli):
    result = run_cli("estimate", "-m", "llama-3.1-8b", "--gpu", "H100", "--engine", "vllm,sglang", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    ratio = data["sglang"]["max_total_num_tokens"] / data["vllm"]["kv_cache_tokens"]
    assert data["sglang_over_vllm_tokens"] == pytest.approx(ratio)
    table = run_cli("estimate", "-m", "llama-3.1-8b", "--gpu", "H100", "--engine", "vllm,sglang")
    assert "KV pool tokens" in table.stdout and "SGLang's pool holds" in table.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mem-fraction-static", "0.8"], "Error: --mem-fraction-static is SGLang's (--mem-fraction-static)"),
        (["--engine", "sglang", "--gpu-memory-utilization", "0.8"], "Error: --gpu-memory-utilization is vLLM's"),
        (["--engine", "tgi"], "Error: --engine takes vllm, sglang or vllm,sglang, not 'tgi' (--engine)"),
        (["--engine", "sglang", "--kv-cache-dtype", "fp8"], "Error: --kv-cache-dtype fp8 is not one SGLang"),
        # 0.5.14+ (kv_cache_configurator.py _profile_available_bytes): the weights exceed the static budget
        (
            ["--engine", "sglang", "--mem-fraction-static", "0.05"],
            "Error: SGLang 0.5.23 would stop: 'Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.05. Raise --mem-fraction-static above 0.",
        ),
        (
            ["--engine", "sglang", "--mem-fraction-static", "0.05", "--sglang-version", "0.5.13"],
            "Error: SGLang 0.5.13 would stop: 'Not enough memory. Please try to increase --mem-fraction-static.'",
        ),
        (
            ["--engine", "sglang", "--sglang-version", "0.5.24"],
            "Error: SGLang 0.5.24 is not a release kvtool models (it models 0.4.0 to 0.5.23) (--sglang-version)",
        ),
        (
            ["--engine", "sglang", "--sglang-version", "0.5.20", "--kv-cache-dtype", "mxfp8"],
            "Error: SGLang 0.5.20's --kv-cache-dtype mxfp8 keeps scale buffers beside the cache, which kvtool does not",
        ),
    ],
)
def test_cli_errors(run_cli, argv, message):
    result = run_cli("estimate", "-m", "llama-3.1-8b", "--gpu", "H100", *argv)
    assert result.exit_code != 0 and result.stdout == ""
    assert result.stderr.startswith(message), result.stderr
    assert "Traceback" not in result.stderr
