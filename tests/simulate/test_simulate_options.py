"""`kvtool simulate` takes estimate's option names and estimate's defaults (issue 24).

- max_num_seqs and max_num_batched_tokens default to vllm serve's for the GPU, from the one rule estimate states
  (kvtool.estimate.serve_defaults; vLLM 0.32 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: 1024 and 8192
  on an H100, 256 and 2048 on an A100 or an L4). simulate used 256 "(vLLM's default)" on every GPU.
- --block-size takes a comma list, as estimate's --seq-len does; --block-sizes is a deprecated alias.
- --gpu-memory and --profiles, as estimate takes them.
"""

from __future__ import annotations

import json

from kvtool.core.errors import EXIT_USAGE

FIXED = ("simulate", "--dist", "fixed", "--length", "1000", "--requests", "50")


def _json(run_cli, *args):
    r = run_cli(*args, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_serve_takes_vllm_serves_max_num_seqs_for_the_gpu(run_cli):
    for gpu, seqs, tokens in (("h100-80gb", 1024, 8192), ("a100-80gb", 256, 2048), ("l4", 256, 2048)):
        out = _json(run_cli, *FIXED, "--serve", "--gpu", gpu, "--model", "llama-3.1-8b", "--block-size", "16")
        setup = out["serve_setup"]
        assert (setup["max_num_seqs"], setup["max_num_batched_tokens"]) == (seqs, tokens), gpu
        est = _json(run_cli, "estimate", "--model", "llama-3.1-8b", "--gpu", gpu)
        assert (est["max_num_seqs"], est["max_num_batched_tokens"]) == (seqs, tokens)
        said = setup["scheduler_defaults"]
        assert said[0].startswith(f"max-num-seqs {seqs} (vllm serve's default on ") and said[0] in est["defaults"]


def test_serve_says_which_default_it_took(run_cli):
    r = run_cli(*FIXED, "--serve", "--block-size", "16")  # the default pair: llama-2-7b on an H100-80GB
    assert r.exit_code == 0, r.stderr
    assert "max_num_seqs 1024" in r.stdout
    assert "Scheduler defaults: max-num-seqs 1024 (vllm serve's default on non-A100 GPUs with >= 70 GiB)" in r.stdout
    given = _json(run_cli, *FIXED, "--serve", "--block-size", "16", "--max-num-seqs", "64")["serve_setup"]
    assert given["max_num_seqs"] == 64
    assert [s.split(" (")[0] for s in given["scheduler_defaults"]] == ["max-num-batched-tokens 8192"]


def test_block_size_takes_a_comma_list(run_cli):
    out = _json(run_cli, *FIXED, "--block-size", "16,32")
    assert out["block_sizes"] == [16, 32]
    # 1,000 tokens: 63 blocks of 16 (1,008 slots) and 32 of 32 (1,024 slots)
    assert [row["allocated_slots"] for row in out["results"]] == [50 * 1008, 50 * 1024]
    assert _json(run_cli, *FIXED, "--block-size", "64")["block_sizes"] == [64]


def test_block_sizes_is_a_deprecated_alias_said_on_stderr(run_cli):
    r = run_cli(*FIXED, "--block-sizes", "16,32", "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["block_sizes"] == [16, 32]
    assert (
        r.stderr
        == "Warning: --block-sizes is deprecated: use --block-size 16,32 (a comma list, as estimate's --seq-len)\n"
    )
    assert "--block-sizes" not in run_cli("simulate", "--help").stdout  # hidden
    both = run_cli(*FIXED, "--block-size", "16", "--block-sizes", "32")
    assert both.exit_code == EXIT_USAGE and "give --block-size only" in both.stderr


def test_gpu_memory_sizes_the_pool_as_estimate_does(run_cli):
    est = _json(run_cli, "estimate", "--model", "llama-2-7b", "--gpu-memory", "40GiB")
    out = _json(run_cli, *FIXED, "--model", "llama-2-7b", "--gpu-memory", "40GiB", "--block-size", "16")
    assert out["kv_tokens"] == est["kv_budget_bytes"] // est["bytes_per_token_per_gpu"]
    assert out["kv_tokens_text"] == "kvtool estimate's plan for llama-2-7b on a 40GiB GPU"


def test_gpu_memory_with_serve_needs_the_rates(run_cli):
    r = run_cli(*FIXED, "--serve", "--gpu-memory", "80GiB", "--block-size", "16")
    assert r.exit_code == EXIT_USAGE
    assert r.stderr.splitlines() == [
        "Error: --gpu-memory gives the memory only: the step times need the GPU's bandwidth and peak (--gpu-memory)",
        "Tip: give --bandwidth-gb-s and --peak-tflops, or --gpu NAME ('kvtool models' lists the GPUs)",
    ]
    args = (
        "--serve",
        "--gpu-memory",
        "80GiB",
        "--bandwidth-gb-s",
        "3350",
        "--peak-tflops",
        "989",
        "--block-size",
        "16",
    )
    setup = _json(run_cli, *FIXED, *args)["serve_setup"]
    # 80 GiB alone cannot be told from an A100-80GB: the non-A100 case, and the words say what an A100 would use
    assert setup["max_num_seqs"] == 1024
    assert "an A100 would use 256" in setup["scheduler_defaults"][0]
    for bad, where in ((("--gpu", "h100-80gb", "--gpu-memory", "80GiB"), "(--gpu)"), (("--gpu-memory", ""), "empty")):
        r = run_cli(*FIXED, *bad)
        assert r.exit_code == EXIT_USAGE and where in r.stderr


def test_profiles_reach_the_gpu_and_the_model(run_cli, tmp_path):
    gpus = tmp_path / "mine" / "gpus"
    gpus.mkdir(parents=True)
    (gpus / "toy.yaml").write_text(
        "name: toy\nmemory: 40GiB\nmemory_bandwidth_gb_s: 1000\npeak_dense_tflops: {fp16: 100, bf16: 100}\n"
    )
    out = _json(run_cli, *FIXED, "--serve", "--gpu", "toy", "--profiles", str(tmp_path / "mine"), "--block-size", "16")
    assert out["serve_setup"]["hardware"]["gpu"] == "toy"
    assert "memory bandwidth 1,000 GB/s (GPU profile toy)" in out["serve_setup"]["cost_text"]
    est = _json(run_cli, "estimate", "--model", "llama-2-7b", "--gpu", "toy", "--profiles", str(tmp_path / "mine"))
    assert out["serve_setup"]["hardware"]["kv_budget_bytes_per_gpu"] == est["kv_budget_bytes"]
    r = run_cli(*FIXED, "--gpu", "toy")
    assert r.exit_code == EXIT_USAGE and "unknown GPU 'toy'" in r.stderr
