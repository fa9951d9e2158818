"""`kvtool estimate` and `kvtool models` through the real entry point: output contract, sweeps, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtool.core.errors import EXIT_INPUT, EXIT_USAGE
from tests.support import DATA, heavy_modules_loaded_by

EST = DATA / "estimate"

CONTRACT_KEYS = {
    "bytes_per_token",
    "kv_bytes",
    "kv_bytes_per_gpu",
    "weights_bytes",
    "num_blocks",
    "kv_cache_tokens",
    "vllm_logged_tokens",
    "max_concurrency",
    "max_seq_len",
    "fits",
    "seq_len",
    "batch",
    "kv_dtype",
    "block_size",
}


def test_table_shows_formula_bytes_gib_and_gb(run_cli):
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "2048", "-v")
    assert r.exit_code == 0 and r.stderr == ""
    out = " ".join(r.stdout.split())
    assert "2 x 32 x 32 x 2048 x 128 x 2 x 1 = 1,073,741,824 bytes" in out
    assert "1,073,741,824 B (1.00 GiB, 1.07 GB)" in out
    assert "Defaults used: batch 1; kv-dtype auto" in out


def test_json_contract(run_cli):
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "2048", "--batch", "16", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    out = json.loads(r.stdout)
    assert CONTRACT_KEYS <= set(out)
    assert out["kv_bytes"] == 17_179_869_184 and out["bytes_per_token"] == 524_288
    assert out["num_blocks"] is None and out["fits"] is None  # no budget asked
    assert isinstance(out["weights_bytes"], int)
    assert not any(d.startswith("batch") for d in out["defaults"])  # given, so not a default


def _numbers_with_bytes_in_their_name(value, key=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers_with_bytes_in_their_name(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers_with_bytes_in_their_name(v, key)
    elif "bytes" in key and value is not None:
        yield key, value


@pytest.mark.parametrize("model", ["llama-2-7b", "gemma-3-27b", "deepseek-v3"])
def test_every_byte_count_in_json_is_an_integer(run_cli, model):
    # Llama-2-7B per layer: 2 x 32 heads x 128 x 2 B = 16,384 B per token (it was printed as 16384.0)
    out = json.loads(
        run_cli(
            "estimate", "--model", model, "--seq-len", "1024,2048", "--compare", "--kv-memory", "10GiB", "--json"
        ).stdout
    )
    found = dict(_numbers_with_bytes_in_their_name(out))
    assert "bytes_per_token_per_layer" in found
    assert all(type(v) is int for _, v in _numbers_with_bytes_in_their_name(out)), found
    if model == "llama-2-7b":
        assert out["layer_groups"][0]["bytes_per_token_per_layer"] == 16_384


def test_manual_mode_states_its_default_dtype(run_cli):
    # manual mode has no config to read a dtype from: float16 is kvtool's choice, so it is a stated default
    out = json.loads(run_cli("estimate", "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--json").stdout)
    assert out["model_dtype"] == "float16" and any(d.startswith("dtype float16") for d in out["defaults"])
    out = json.loads(
        run_cli(
            "estimate", "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--dtype", "bfloat16", "--json"
        ).stdout
    )
    assert not any(d.startswith("dtype") for d in out["defaults"])


def test_default_seq_len_is_stated(run_cli):
    out = json.loads(run_cli("estimate", "--model", "llama-3-8b", "--json").stdout)
    assert out["seq_len"] == 8192
    assert any("seq-len 8,192" in d for d in out["defaults"])


def test_sweep(run_cli):
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "1024,2048", "--batch", "1,16", "--json")
    points = json.loads(r.stdout)["sweep"]
    assert [(p["seq_len"], p["batch"]) for p in points] == [(1024, 1), (1024, 16), (2048, 1), (2048, 16)]
    assert points[3]["kv_bytes"] == 17_179_869_184 and points[0]["kv_bytes"] == 536_870_912
    table = run_cli(
        "estimate", "--model", "llama-2-7b", "--seq-len", "1024,2048", "--batch", "1,16", "--kv-memory", "20GiB"
    )
    assert table.exit_code == 0 and "Sweep" in table.stdout


def test_compare(run_cli):
    out = json.loads(run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "2048", "--compare", "--json").stdout)
    rows = {row["label"]: row for row in out["compare"]}
    assert rows["as-is"]["kv_bytes"] == 1_073_741_824
    assert rows["GQA-8"]["kv_bytes"] == 1_073_741_824 // 4
    assert rows["MQA"]["kv_bytes"] == 1_073_741_824 // 32
    assert rows["fp8 KV"]["kv_bytes"] == rows["int8 KV"]["kv_bytes"] == 1_073_741_824 // 2
    r = run_cli("estimate", "--model", "deepseek-v2-lite", "--seq-len", "4096", "--compare")
    assert r.exit_code == 0 and "MLA" in r.stdout


def test_manual_mode_and_huge_values_exact(run_cli):
    out = json.loads(
        run_cli(
            "estimate",
            "--layers",
            "32",
            "--kv-heads",
            "32",
            "--head-dim",
            "128",
            "--seq-len",
            str(10**12),
            "--batch",
            str(10**6),
            "--json",
        ).stdout
    )
    assert out["kv_bytes"] == 2 * 32 * 32 * 128 * 2 * 10**12 * 10**6
    assert out["weights_bytes"] is None


def test_fp32_config_runs_in_bf16_under_auto_and_fp32_when_asked(run_cli, tmp_path):
    # vLLM 0.32's dtype "auto" downcasts a float32 checkpoint to bfloat16 (vllm/config/model.py
    # _resolve_auto_dtype; recorded in tests/data/vllm-sizing/llama-fp32-auto-1gib-b32: 32,768 blocks), and the
    # doc's "1 GiB, fp32 model" row (16,384 blocks, 524,288 tokens) is what vLLM gives with dtype="float32".
    config = json.loads((EST / "tiny-llama" / "config.json").read_text())
    config["dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = (
        "estimate",
        "--config",
        tmp_path,
        "--kv-memory",
        str(1024**3),
        "--block-size",
        "32",
        "--max-model-len",
        "2048",
        "--json",
    )
    auto = json.loads(run_cli(*args).stdout)
    assert (auto["kv_dtype"], auto["num_blocks"], auto["vllm_logged_tokens"]) == ("bf16", 32_768, 1_048_576)
    fp32 = json.loads(run_cli(*args, "--dtype", "float32").stdout)
    assert (fp32["kv_dtype"], fp32["num_blocks"], fp32["vllm_logged_tokens"]) == ("fp32", 16_384, 524_288)


def test_gpu_verdict_table(run_cli):
    r = run_cli("estimate", "--model", "llama-2-7b", "--gpu", "a10g", "--seq-len", "4096", "--batch", "64", "-v")
    assert r.exit_code == 0
    out = " ".join(r.stdout.split())
    assert "Does not fit" in out and "vLLM would log" in out and "reserve per GPU (vLLM 0.33.0 profiling)" in out
    assert out.startswith("64 requests of 4,096 tokens on A10G fit: no, ")  # the question answered first


def test_list_and_models(run_cli):
    r = run_cli("estimate", "--list")
    assert r.exit_code == 0 and "deepseek-v3" in r.stdout and "MI300X" in r.stdout
    out = json.loads(run_cli("models", "--json").stdout)
    assert len(out["models"]) >= 16 and len(out["gpus"]) >= 10


def test_models_table_keeps_every_name_whole_at_80_columns(run_cli, monkeypatch):
    # The name is what the user types next; at 80 columns rich used to cut "deepseek-v2-lite" to "deepse…".
    monkeypatch.setenv("COLUMNS", "80")
    r = run_cli("models")
    assert r.exit_code == 0
    names = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    listed = json.loads(run_cli("models", "--json").stdout)
    assert {m["name"] for m in listed["models"]} <= names and {g["name"] for g in listed["gpus"]} <= names
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 80


def test_unknown_gpu_tip_names_a_command_that_exists(run_cli):
    r = err(run_cli, "--model", "llama-2-7b", "--gpu", "h1000")
    assert r.exit_code == EXIT_USAGE and "H100-80GB" in r.stderr
    tip = r.stderr.split("Tip: ", 1)[1]
    command = tip.split("'")[1].split()  # the command the tip names, e.g. ['kvtool', 'models']
    assert command[0] == "kvtool" and run_cli(*command[1:]).exit_code == 0  # 'kvtool models --gpus' did not exist


def test_tp_that_vllm_refuses_is_a_usage_error(run_cli):
    # Falcon-7B has 71 attention heads (tiiuae/falcon-7b config.json): vLLM's verify_with_parallel_config refuses
    # tp 8 ("Total number of attention heads (71) must be divisible by tensor parallel size (8)").
    r = err(run_cli, "--model", "falcon-7b", "--tp", "8")
    assert (
        r.exit_code == EXIT_USAGE
        and "71 attention heads" in r.stderr
        and "Tip: use a --tp that divides 71: 1, 71" in r.stderr
    )
    # Qwen2.5-7B: 28 heads, 4 KV heads; tp 7 divides the heads but can neither split nor replicate 4 KV heads.
    r = err(run_cli, "--model", "qwen2.5-7b", "--tp", "7")
    assert r.exit_code == EXIT_USAGE and "4 KV heads" in r.stderr
    # Valid: Llama-3-8B (32 heads, 8 KV heads) at tp 16 replicates each KV head on 2 GPUs: 1 head per GPU,
    # 2 x 32 layers x 1 x 128 x 2 B = 16,384 B per token per GPU; DeepSeek-V3's MLA latent at tp 8 is replicated.
    out = json.loads(run_cli("estimate", "--model", "llama-3-8b", "--tp", "16", "--json").stdout)
    assert out["bytes_per_token_per_gpu"] == 16_384
    assert run_cli("estimate", "--model", "deepseek-v3", "--tp", "8").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ("--kv-memory", "10GiB", "--reserve", "1GiB"),  # --kv-memory is the KV budget: nothing to reserve from
        ("--kv-memory", "10GiB", "--gpu-memory-utilization", "0.5"),  # vLLM ignores it beside kv_cache_memory_bytes
        ("--reserve", "1GiB"),  # no GPU: no budget for these to change
        ("--gpu-memory-utilization", "0.95"),
    ],
)
def test_gpu_budget_options_are_never_ignored_silently(run_cli, args):
    r = err(run_cli, "--model", "llama-2-7b", *args)
    assert r.exit_code == EXIT_USAGE and "would be ignored" in r.stderr


def test_gpu_memory_utilization_and_reserve_apply_with_a_gpu(run_cli):
    # Llama-2-7B on an H100 at 0.95, no reserve. The driver reports 79.22 GiB = 85,061,827,297 B
    # (vLLM's total_gpu_memory, github.com/vllm-project/vllm/pull/12126): ceil(x 0.95) = 80,808,735,933;
    # minus 6,738,415,616 params x 2 B = 13,476,831,232 -> 67,331,904,701 B.
    out = json.loads(
        run_cli(
            "estimate",
            "--model",
            "llama-2-7b",
            "--gpu",
            "h100",
            "--gpu-memory-utilization",
            "0.95",
            "--reserve",
            "0",
            "--json",
        ).stdout
    )
    # less the rotary cos/sin cache vLLM builds with the model (kvtool.estimate.rope): 4,096 positions x 128 x 2 B
    assert out["kv_budget_bytes"] == 67_331_904_701 - 4_096 * 128 * 2
    assert not any("gpu-memory-utilization" in d or d.startswith("reserve") for d in out["defaults"])


def test_does_not_fit_verdict_never_offers_zero(run_cli):
    # Manual 1 layer x 1 KV head x 64, fp16: 2 x 64 x 2 = 256 B per token, a 16-token block 4,096 B; 12,288 B
    # = 3 blocks, 2 usable (one is the null block). 4 requests of 16 tokens need 4 blocks: 2 fit, and 4 requests
    # fit at no length (each needs at least one block).
    r = run_cli(
        "estimate",
        "--layers",
        "1",
        "--kv-heads",
        "1",
        "--head-dim",
        "64",
        "--seq-len",
        "16",
        "--batch",
        "4",
        "--kv-memory",
        "12288",
    )
    out = " ".join(r.stdout.split())
    assert (
        "Largest that fit: 2 requests of 16 tokens, or no length at which 4 requests fit (one request: 32 tokens)"
        in out
    )
    assert " of 0 tokens" not in out and "0 request(s)" not in out


MANUAL_TINY = ("--layers", "1", "--kv-heads", "1", "--head-dim", "64", "--kv-memory", "12288")


def test_one_request_that_does_not_fit_is_said_in_english(run_cli):
    # The manual model above: 12,288 B = 3 blocks of 16 tokens, 2 usable (one is vLLM's null block), so the
    # longest request is 2 x 16 = 32 tokens.  One request of 64 tokens needs 4 blocks: none fits at that length.
    # Issue 24: the headline said "1 request of ... fit: no, 0 do".
    r = run_cli("estimate", *MANUAL_TINY, "--seq-len", "64")
    first = r.stdout.splitlines()[0]
    assert first == "1 request of 64 tokens fits: no; longest that fits: 32 tokens"
    out = " ".join(r.stdout.split())
    assert "Does not fit: 1 request of 64 tokens needs 4 blocks; 2 are usable." in out
    assert "request(s)" not in out and " 0 do" not in out


def test_counts_of_one_are_singular(run_cli):
    # 2 requests of 32 tokens need 2 x 2 = 4 blocks, 2 usable: exactly one fits (the headline said "1 do").
    r = run_cli("estimate", *MANUAL_TINY, "--seq-len", "32", "--batch", "2")
    assert r.stdout.splitlines()[0] == "2 requests of 32 tokens fit: no, only 1 does"
    out = " ".join(r.stdout.split())
    assert "Largest that fit: 1 request of 32 tokens, or 2 of 16 tokens" in out
    assert "--seq-len 16 fits 2 requests" in out
    # exactly 2 usable blocks of 32 tokens: one request of 32 tokens fits, and up to one
    r = run_cli("estimate", *MANUAL_TINY, "--seq-len", "32")
    out = " ".join(r.stdout.split())
    assert r.stdout.startswith("1 request of 32 tokens fits: yes, up to 1")
    assert "Fits: 1 request of 32 tokens fits; up to 1 request of 32 tokens" in out


def test_suggestions_say_one_request_not_one_requests(run_cli):
    # Llama-3.1-8B's whole context (131,072 tokens) on one L4 does not fit; at --tp 2 exactly one such request
    # does (the --tp 2 run's own max_batch), and the suggestion said "up to 1 requests" (issue 24).
    asked = ("estimate", "--model", "llama-3.1-8b", "--gpu", "L4", "-s", "131072")
    assert json.loads(run_cli(*asked, "--tp", "2", "--json").stdout)["max_batch"] == 1
    out = " ".join(run_cli(*asked).stdout.split())
    assert "--tp 2 fits (up to 1 request of 131,072 tokens)" in out and "1 requests" not in out
    # vLLM 0.33 (the default; Model Runner V2, whose 0.33 sampler warm-up profiles as V1's): 22.05 GiB x 0.9 -
    # weights 14.96 GiB - reserve (sampler 256 x 128,256 x 14.3 B = 0.44 GiB + two resident hidden copies
    # 2 x 2,048 x 4,096 x 2 B = 0.03 GiB; non-torch 0.25; CUDA graphs 0.84 GiB, a dense model at 512 capture
    # sizes) - the rotary cos/sin cache (kvtool.estimate.rope: 131,072 x 128 x 2 B = 32 MiB, 16 blocks) = 3.30 GiB =
    # 1,688 blocks of 16 x 128 KiB; one is the null block: 1,687 x 16 = 26,992 tokens
    assert "--seq-len 26,992 fits 1 request." in out


def test_the_default_screen_is_the_answer_and_verbose_has_the_rest(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    asked = ("estimate", "--model", "llama-3.1-8b", "--gpu", "L4", "-s", "8192", "-b", "4")
    short, long = run_cli(*asked).stdout, run_cli(*asked, "--verbose").stdout
    detail = ("per token", "reserve per GPU", "vLLM would log", "how blocks were counted", "Defaults used", "Source:")
    assert short.startswith("4 requests of 8,192 tokens on L4 fit: no, only 3 do")
    for must in ("2 x 32 x 8 x 8192 x 128 x 2 x 4 = 4,294,967,296", "KV budget per GPU", "Does not fit", "Would fit"):
        assert must in " ".join(short.split())
    assert not [d for d in detail if d in short]
    assert all(d in long for d in detail)
    assert len(short.splitlines()) <= 25 < len(long.splitlines())  # about 50 lines before (issue 24)
    assert run_cli(*asked, "-v").stdout == long


def err(run_cli, *args):
    r = run_cli("estimate", *map(str, args))
    assert r.stdout == ""
    assert r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
    return r


def test_unknown_model_suggests(run_cli):
    r = err(run_cli, "--model", "llama2-7b")
    assert r.exit_code == EXIT_USAGE
    assert r.stderr.splitlines()[0] == "Error: unknown model 'llama2-7b' (--model)"
    assert "llama-2-7b" in r.stderr.splitlines()[1]


def test_bad_config_names_file_and_field(run_cli, tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2}')
    r = err(run_cli, "--config", tmp_path)
    assert r.exit_code == EXIT_INPUT
    assert str(tmp_path / "config.json") in r.stderr and "num_attention_heads" in r.stderr
    (tmp_path / "config.json").write_text("{")
    r = err(run_cli, "--config", tmp_path)
    assert r.exit_code == EXIT_INPUT and "not valid JSON" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--seq-len", "0"),
        ("--seq-len", "-5"),
        ("--seq-len", "abc"),
        ("--batch", "0"),
        ("--batch", "1,x"),
        ("--tp", "0"),
        ("--tp", "two"),
        ("--kv-memory", "0"),
        ("--kv-memory", "-1GiB"),
        ("--kv-memory", "ten"),
        ("--kv-memory", "10XB"),
        ("--block-size", "0"),
        ("--kv-dtype", "fp9"),
        ("--gpu", "h1000"),
        ("--gpu-memory-utilization", "1.5", "--gpu", "h100"),
        ("--gpu-memory", "0GiB"),
    ],
)
def test_bad_sizes_are_usage_errors(run_cli, args):
    r = err(run_cli, "--model", "llama-2-7b", *args)
    assert r.exit_code == EXIT_USAGE
    assert len(r.stderr.splitlines()) <= 2


def test_needs_exactly_one_model_source(run_cli):
    assert err(run_cli).exit_code == EXIT_USAGE
    assert err(run_cli, "--model", "llama-2-7b", "--config", EST / "falcon-7b").exit_code == EXIT_USAGE
    assert err(run_cli, "--layers", "2").exit_code == EXIT_USAGE


def test_estimate_does_not_import_torch_or_pandas(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_UNKNOWN_TYPE_CONFIG))  # warned about, with no heavy import
    codes, _, heavy = heavy_modules_loaded_by(
        ["--help"],
        ["estimate", "--model", "llama-2-7b", "--gpu", "h100", "--compare"],
        ["estimate", "--config", str(tmp_path)],
    )
    assert codes == [0, 0, 0]
    assert heavy == []


def test_manual_mode_with_kv_memory_and_gpu_needs_weights(run_cli):
    out = json.loads(
        run_cli(
            "estimate",
            "--layers",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "32",
            "--dtype",
            "bfloat16",
            "--kv-memory",
            "5000000",
            "--block-size",
            "32",
            "--seq-len",
            "2048",
            "--json",
        ).stdout
    )
    assert (out["bytes_per_token"], out["num_blocks"]) == (1024, 152)  # same as the tiny Llama config
    r = err(run_cli, "--layers", "4", "--kv-heads", "2", "--head-dim", "32", "--gpu", "l4")
    assert r.exit_code == EXIT_USAGE and "weights" in r.stderr


def test_profiles_env_var_through_cli(run_cli, tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "toy.yaml").write_text(
        "name: toy\nhf_repo: me/toy\nconfig:\n  hidden_size: 64\n  num_hidden_layers: 2\n  num_attention_heads: 4\n"
    )
    monkeypatch.setenv("KVTOOL_PROFILES", str(tmp_path))
    out = json.loads(run_cli("estimate", "--model", "toy", "--seq-len", "10", "--json").stdout)
    # 2 x 2 layers x 4 heads x 10 tokens x 16 dims x 2 bytes (no dtype: float32, which vLLM's dtype auto
    # runs in bfloat16)
    assert out["kv_bytes"] == 2 * 2 * 4 * 10 * 16 * 2
    assert "toy" in run_cli("models").stdout


def test_reserve_zero_and_conflicting_budgets(run_cli):
    out = json.loads(
        run_cli(
            "estimate",
            "--model",
            "llama-2-7b",
            "--gpu-memory",
            "24GiB",
            "--reserve",
            "0",
            "--gpu-memory-utilization",
            "1",
            "--json",
        ).stdout
    )
    # weights and the rotary cos/sin cache (kvtool.estimate.rope: 4,096 positions x 128 x 2 B)
    assert out["kv_budget_bytes"] == 24 * 1024**3 - 6_738_415_616 * 2 - 4_096 * 128 * 2
    # --kv-memory on a GPU is vllm serve --kv-cache-memory-bytes: the budget as given; the L4 (under 70 GiB) still
    # sets vllm serve's defaults, max_num_seqs 256 (vllm/engine/arg_utils.py get_batch_defaults)
    on_gpu = json.loads(
        run_cli("estimate", "--model", "llama-2-7b", "--gpu", "l4", "--kv-memory", "1GiB", "--json").stdout
    )
    assert on_gpu["kv_budget_bytes"] == 1024**3 and on_gpu["max_num_seqs"] == 256
    # gpu_memory_utilization is what vLLM ignores once kv_cache_memory_bytes is set: refused
    assert (
        err(
            run_cli, "--model", "llama-2-7b", "--gpu", "l4", "--kv-memory", "1GiB", "--gpu-memory-utilization", "0.8"
        ).exit_code
        == EXIT_USAGE
    )


def test_config_dir_with_header_only_safetensors(run_cli, tmp_path):
    import shutil
    import struct

    shutil.copy(EST / "tiny-llama" / "config.json", tmp_path / "config.json")
    header = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [1000, 256], "data_offsets": [0, 512000]}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)  # header, no tensor data
    out = json.loads(run_cli("estimate", "--config", tmp_path, "--seq-len", "2048", "--json").stdout)
    assert (out["weights_bytes"], out["weights_method"]) == (512_000, "safetensors headers")


def test_seq_len_beyond_the_models_context_is_sized_and_warned(run_cli):
    # Llama-2-7B's config.json: max_position_embeddings 4096. vLLM refuses --max-model-len 8192 for it
    # ("User-specified max_model_len (8192) is greater than the derived max_model_len ..."); kvtool sizes it
    # (2 x 32 x 32 x 8192 x 128 x 2 = 4,294,967,296 B) and says vLLM would refuse.
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "2048,8192")
    assert r.exit_code == 0
    warnings = [line for line in r.stderr.splitlines() if line]
    assert len(warnings) == 1 and warnings[0].startswith("Warning: --seq-len 8,192 exceeds")
    assert "max_position_embeddings 4,096" in warnings[0] and "vLLM refuses to start" in warnings[0]
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "8192", "--json")
    assert r.exit_code == 0 and r.stderr == ""  # --json: the warning is a field, stderr stays empty
    out = json.loads(r.stdout)
    assert out["kv_bytes"] == 4_294_967_296 and out["max_position_embeddings"] == 4096
    assert len(out["warnings"]) == 1 and "vLLM refuses to start" in out["warnings"][0]
    # at the context length itself (vLLM's default max_model_len) there is nothing to warn about
    r = run_cli("estimate", "--model", "llama-2-7b", "--json")
    assert json.loads(r.stdout)["warnings"] == [] and r.stderr == ""


def test_longest_request_is_capped_by_the_models_context_in_the_verdict(run_cli):
    # Llama-2-7B on an A100 80GB (79.15 GiB as the driver reports it): ceil(84,986,665,369 x 0.9)
    # - 13,476,831,232 B weights - 2 GiB = 60,863,683,953 B; / (16 x 524,288 B) = 7,255 blocks: memory would hold
    # (7,255 - 1) x 16 = 116,064 tokens, but the model's context is 4,096, so the verdict offers 4,096.
    args = ("estimate", "--model", "llama-2-7b", "--seq-len", "1024", "--gpu", "A100-80GB", "--reserve", "2GiB")
    out = " ".join(run_cli(*args).stdout.split())
    assert "or one request of up to 4,096 tokens, the model's context (memory would hold 116,064)" in out
    assert (
        json.loads(run_cli(*args, "--json").stdout)["max_seq_len"] == 116_064
    )  # the JSON keeps vLLM's figure  # the JSON keeps vLLM's memory figure


def test_kv_heads_that_do_not_divide_the_attention_heads_are_refused(run_cli, tmp_path):
    # vLLM's Attention layer asserts num_heads % num_kv_heads == 0 (vllm/attention/layer.py): 12 KV heads for 32
    # query heads cannot serve whole groups. Both a config and manual mode sized it as GQA-12.
    config = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 32}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 12}))
    r = run_cli("estimate", "--config", tmp_path)
    assert (r.exit_code, r.stdout) == (EXIT_INPUT, "")
    assert r.stderr == (
        "Error: num_key_value_heads 12 does not divide the 32 attention heads; vLLM's attention asserts "
        f"num_heads % num_kv_heads == 0 ({tmp_path / 'config.json'}: field num_key_value_heads)\n"
    )
    r = run_cli("estimate", "--layers", "2", "--kv-heads", "12", "--head-dim", "128", "--heads", "32", "--json")
    assert (r.exit_code, r.stdout) == (EXIT_USAGE, "")
    assert r.stderr == (
        "Error: --kv-heads 12 does not divide the 32 attention heads; vLLM's attention asserts "
        "num_heads % num_kv_heads == 0 (--kv-heads)\n"
    )
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 8}))
    assert run_cli("estimate", "--config", tmp_path).exit_code == 0


@pytest.mark.parametrize(
    ("args", "option", "tip"),
    [
        # an empty --gpu (an unset shell variable) dropped the GPU planning silently, exit 0
        (("--model", "llama-2-7b", "--gpu", ""), "--gpu", "'kvtool models' lists the known GPUs"),
        (("--model", "llama-2-7b", "--gpu-memory", " "), "--gpu-memory", "give a size such as 80GiB"),
        (("--model", ""), "--model", "'kvtool models' lists the known models"),
        (("--model", "llama-2-7b", "--config", ""), "--config", "give a config.json or a model folder holding one"),
        # Path("") is the current folder: an empty --profiles read "." for profiles
        (("--model", "llama-2-7b", "--profiles", ""), "--profiles", "give a folder of profile YAML files"),
    ],
)
def test_an_empty_option_is_an_error_not_left_out(run_cli, args, option, tip):
    r = run_cli("estimate", *args, "--json")
    assert (r.exit_code, r.stdout) == (EXIT_USAGE, "")
    assert r.stderr == f"Error: {option} is empty ({option})\nTip: {tip}\n"


def test_models_refuses_an_empty_profiles_folder(run_cli):
    r = run_cli("models", "--profiles", "")
    assert (r.exit_code, r.stdout) == (EXIT_USAGE, "")
    assert r.stderr == "Error: --profiles is empty (--profiles)\nTip: give a folder of profile YAML files\n"


def test_a_length_given_twice_is_one_sweep_row(run_cli):
    # --seq-len 1024,1024 --batch 2,2 printed four identical rows
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "1024,2048,1024", "--batch", "2,2", "--json")
    points = json.loads(r.stdout)["sweep"]
    # llama-2-7b: 2 x 32 layers x 32 heads x 128 x 2 B = 524,288 B per token; x 1024 x 2 = 1 GiB
    assert [(p["seq_len"], p["batch"], p["kv_bytes"]) for p in points] == [
        (1024, 2, 1_073_741_824),
        (2048, 2, 2_147_483_648),
    ]


def test_an_empty_config_file_is_said_to_be_empty(run_cli, tmp_path):
    # it was "not valid JSON: Expecting value at line 1 column 1"
    (tmp_path / "config.json").write_text("\n")
    r = run_cli("estimate", "--config", tmp_path, "--json")
    assert (r.exit_code, r.stdout) == (EXIT_INPUT, "")
    assert r.stderr == (
        f"Error: the file is empty ({tmp_path / 'config.json'})\nTip: a config.json holds one JSON object\n"
    )


def test_a_local_folder_given_to_model_is_read_as_vllm_serve_reads_it(run_cli, tmp_path, monkeypatch):
    # `vllm serve --model DIR` and `kvtool vllm isolation --model DIR` take a folder; estimate refused it ("is a
    # local path; --model takes a profile name or a Hugging Face id"). tiny-llama: 4 layers x 2 KV heads x 32 dims
    # (hidden 256 / 8 heads), bfloat16: 2 (K, V) x 4 x 2 x 32 x 2 B = 1,024 B per token
    # (tests/data/estimate/tiny-llama/config.json)
    folder = tmp_path / "my-tiny"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "estimate" / "tiny-llama" / "config.json").read_text())
    r = run_cli("estimate", "--model", folder, "--seq-len", "1024", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["model"], out["bytes_per_token"]) == ("my-tiny", 1024)
    assert out == json.loads(run_cli("estimate", "--config", folder, "--seq-len", "1024", "--json").stdout)
    monkeypatch.chdir(tmp_path)
    for relative in ("./my-tiny", "my-tiny"):
        got = json.loads(run_cli("estimate", "--model", relative, "--seq-len", "1024", "--json").stdout)
        assert got == {**out, "source": str(Path(relative) / "config.json")}
    # a file is --config's; a folder without config.json is said so
    r = run_cli("estimate", "--model", "my-tiny/config.json")
    assert (r.exit_code, r.stdout) == (EXIT_USAGE, "")
    assert r.stderr == (
        "Error: my-tiny/config.json is a file; --model takes a profile name, a Hugging Face id or a model folder "
        "(--model)\nTip: pass it as --config my-tiny/config.json\n"
    )
    (tmp_path / "empty").mkdir()
    r = run_cli("estimate", "--model", "empty")
    assert r.exit_code == EXIT_INPUT and r.stderr.startswith("Error: no config.json found (empty)")
    (tmp_path / "llama-2-7b").mkdir()  # a folder named like a profile does not shadow the profile
    assert json.loads(run_cli("estimate", "--model", "llama-2-7b", "--json").stdout)["model"] == "llama-2-7b"


def test_a_config_file_is_named_by_its_folder_or_its_name_or_path(run_cli, tmp_path):
    # `--config dir/config.json` named the model "config.json"
    r = run_cli("estimate", "--config", DATA / "estimate" / "tiny-llama" / "config.json", "--seq-len", "64", "--json")
    assert json.loads(r.stdout)["model"] == "tiny-llama"
    data = json.loads((DATA / "estimate" / "tiny-llama" / "config.json").read_text())
    for given, named in (("acme/Tiny-Llama-1B", "acme/Tiny-Llama-1B"), ("/models/tiny-llama-ft/", "tiny-llama-ft")):
        folder = tmp_path / "checkpoint-500"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({**data, "_name_or_path": given}))
        for path in (folder, folder / "config.json"):
            out = json.loads(run_cli("estimate", "--config", path, "--seq-len", "64", "--json").stdout)
            assert out["model"] == named


def test_without_a_gpu_the_first_line_is_the_kv_bytes(run_cli):
    # the seed articles' worked example: Llama-2-7B (MHA, fp16) at 2,048 tokens = 1,073,741,824 bytes; the first
    # line was the table's title (layers and heads), the bytes three rows down
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "2048")
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0] == "KV cache of 1 request of 2,048 tokens: 1,073,741,824 B (1.00 GiB, 1.07 GB)"
    r = run_cli("estimate", "--model", "llama-2-7b", "--seq-len", "2048", "--batch", "2", "--tp", "2")
    assert r.stdout.splitlines()[0] == (
        "KV cache of 2 requests of 2,048 tokens: 2,147,483,648 B (2.00 GiB, 2.15 GB); 1,073,741,824 B (1.00 GiB, "
        "1.07 GB) per GPU (tp 2)"
    )


def test_compare_with_fp8_ds_mla_gives_plain_fp8_to_the_rows_without_mla(run_cli):
    # --kv-dtype fp8_ds_mla --compare on DeepSeek-V3 refused the whole command ("applies only to MLA models")
    r = run_cli("estimate", "--model", "deepseek-v3", "--kv-dtype", "fp8_ds_mla", "--compare", "--json")
    assert r.exit_code == 0, r.stderr
    rows = {row["label"]: (row["kv_dtype"], row["bytes_per_token"]) for row in json.loads(r.stdout)["compare"]}
    # as-is: vLLM's fp8_ds_mla, 656 B per token per layer x 61 layers = 40,016 B; MHA without MLA: K and V of
    # 128 heads x (qk_nope 128 + qk_rope 64) x 61 layers x 1 B = 2,998,272 B (DeepSeek-V3 config.json)
    assert rows["as-is"] == ("fp8_ds_mla", 40_016)
    assert rows["MHA"] == ("fp8", 2_998_272)


# A decoder of a model_type kvtool does not know: 32 layers, 32 query heads, 8 KV heads, hidden 4096 (head_dim 128).
_UNKNOWN_TYPE_CONFIG = {
    "model_type": "acme_decoder",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "dtype": "bfloat16",
}
_SIZED_AS_A_DECODER = (
    ": it was sized as a standard decoder from num_hidden_layers, num_key_value_heads and head_dim; check the "
    "figure (vLLM's start-up log prints it as 'GPU KV cache size')"
)


@pytest.mark.parametrize(
    ("drop", "warning"),
    [
        ((), "model_type 'acme_decoder' is not one kvtool knows" + _SIZED_AS_A_DECODER),
        (("model_type",), "the config names no model_type" + _SIZED_AS_A_DECODER),
    ],
    ids=["unknown", "absent"],
)
def test_an_unknown_model_type_is_sized_and_warned_about(run_cli, tmp_path, drop, warning):
    # it was sized silently as a generic decoder
    config = {k: v for k, v in _UNKNOWN_TYPE_CONFIG.items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps(config))
    # hand computation: 2 (K and V) x 32 layers x 8 KV heads x 128 head_dim x 2 B (bfloat16) x 2048 tokens
    expected_kv_bytes = 2 * 32 * 8 * 128 * 2 * 2048
    assert expected_kv_bytes == 268_435_456
    r = run_cli("estimate", "--config", tmp_path, "--seq-len", "2048")
    assert r.exit_code == 0
    assert r.stderr == f"Warning: {warning}\n"  # one line on stderr
    assert "268,435,456" in r.stdout and "Warning" not in r.stdout
    r = run_cli("estimate", "--config", tmp_path, "--seq-len", "2048", "--json")
    assert (r.exit_code, r.stderr) == (0, "")  # --json: the warning is a field, as the context warning is
    out = json.loads(r.stdout)
    assert out["kv_bytes"] == expected_kv_bytes
    assert out["warnings"] == [warning]


_REAL_CONFIGS = sorted(p.parent for p in DATA.glob("*/**/config.json"))
# published configs whose model_type kvtool does not know, so the warning is right: xai-org/grok-2 says "git",
# swiss-ai Apertus says "apertus"
_WARNED_CONFIGS = {"grok-2-fp8-h100-tp8-v0.5.2", "apertus-8b-gh200-tp4-v0.5.10.post1"}


def test_the_real_configs_are_all_found():
    # the published configs kept in tests/data (estimate/, gpu-logs/, vllm-sizing/, repro/, isolation/)
    names = {p.relative_to(DATA).parts[0] for p in _REAL_CONFIGS}
    assert {"estimate", "gpu-logs", "vllm-sizing"} <= names
    # 12 published configs, plus gemma-3n-e4b-it, gemma-4-e4b-it and gemma-4-31b-it (per-layer KV shapes) and
    # qwen3.5-4b (vllm-project/vllm#40696)
    assert len([p for p in _REAL_CONFIGS if p.parent.name == "estimate"]) == 16


@pytest.mark.parametrize(
    "folder", [p for p in _REAL_CONFIGS if p.name not in _WARNED_CONFIGS], ids=lambda p: str(p.relative_to(DATA))
)
def test_no_real_config_is_warned_about_its_model_type(run_cli, folder):
    r = run_cli("estimate", "--config", folder, "--json")
    assert r.exit_code == 0, r.stderr
    assert not [w for w in json.loads(r.stdout)["warnings"] if "model_type" in w]
    r = run_cli("estimate", "--config", folder)
    assert r.exit_code == 0 and "model_type" not in r.stderr


def test_no_built_in_profile_is_warned_about_its_model_type(run_cli):
    models = json.loads(run_cli("models", "--json").stdout)["models"]
    assert len(models) == 20  # profiles/models/*.yaml
    for model in models:
        r = run_cli("estimate", "--model", model["name"], "--json")
        assert r.exit_code == 0, (model["name"], r.stderr)
        assert not [w for w in json.loads(r.stdout)["warnings"] if "model_type" in w], model["name"]


def test_suggestions_count_one_request_in_the_singular(run_cli):
    # it said "--tp 2 fits (up to 1 requests ...)" and "--seq-len 25,152 fits 1 requests". Llama-3.1-8B at its
    # 131,072-token context: 128 KiB per token (2 x 32 layers x 8 KV heads x 128 x 2 B) is 16 GiB a request, more
    # than an L4's KV budget; at TP 2 each GPU holds half of it, and one request fits
    out = json.loads(run_cli("estimate", "--model", "llama-3.1-8b", "--gpu", "L4", "--json").stdout)
    assert out["bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert out["suggestions"][0] == "--tp 2 fits (up to 1 request of 131,072 tokens)"
    assert out["suggestions"][-1].endswith(" fits 1 request")


def test_headline_is_not_recoloured_by_rich_on_a_terminal(run_cli, monkeypatch):
    # _print_estimate meant to turn rich's regex highlighter off ("numbers are formatted already") but set an
    # attribute rich never reads (console.highlight; rich keeps console._highlight), so on a terminal every digit
    # run of the headline was wrapped in colour codes, and each run compiled the highlighter's ~10 regexes.
    # FORCE_COLOR makes rich colour as on a terminal. The figures: 2 x 32 layers x 32 KV heads x 128 x 2 B x 4,096
    # tokens = 2,147,483,648 B (Llama-2-7B at its 4,096-token context).
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    r = run_cli("estimate", "--model", "llama-2-7b")
    assert r.exit_code == 0
    headline = r.stdout.splitlines()[0]  # bold as a whole (its markup), the figures in it left alone
    assert "KV cache of 1 request of 4,096 tokens: 2,147,483,648 B (2.00 GiB, 2.15 GB)" in headline
