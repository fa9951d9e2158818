"""`kvtool vllm isolation`: help, usage errors, and the recorded real vLLM runs replayed (no vLLM needed)."""

from __future__ import annotations

import json

import pytest

from kvtool.vllm.isolation.adapters import LORA_RANK, AttentionShape, attention_shape, write_random_adapter
from kvtool.vllm.isolation.client import parse_block_size, parse_prefix_counters
from tests.support import DATA

ISOLATION = DATA / "isolation"


def test_help_lists_both_modes_and_the_exit_codes(run_cli):
    result = run_cli("vllm", "isolation", "--help")
    assert result.exit_code == 0
    for text in ("--endpoint", "--model", "--api-key", "--record", "--replay", "Exit codes: 0"):
        assert text in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give either --endpoint URL"),
        (("--endpoint", "http://127.0.0.1:9", "--model", "m"), "give either --endpoint URL"),
        (("--endpoint", "http://127.0.0.1:9", "--api-key", "acme"), "--api-key takes TENANT=KEY"),
        (("--endpoint", "http://127.0.0.1:9", "--api-key", "a=1"), "needs at least two tenants"),
        (("--endpoint", "http://127.0.0.1:9", "--dimension", "colour"), "unknown dimension 'colour'"),
        (("--endpoint", "http://127.0.0.1:9", "--adapter-version", "/one"), "exactly two paths"),
        (("--endpoint", "http://127.0.0.1:9", "--repeats", "0"), "--repeats must be at least 1"),
        (("--replay", "x.json", "--endpoint", "http://127.0.0.1:9"), "leave out --endpoint"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(run_cli, args, message):
    result = run_cli("vllm", "isolation", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_endpoint_is_a_clear_error(run_cli):
    result = run_cli("vllm", "isolation", "--endpoint", "http://127.0.0.1:9")  # port 9 (discard): nothing listens
    assert result.exit_code == 2 and "cannot reach http://127.0.0.1:9" in result.stderr


@pytest.mark.parametrize("endpoint", ["junk", "ftp://x", "http://", "http://[::1", "http://127.0.0.1:99999"])
def test_an_endpoint_that_is_not_an_http_url_is_one_line_exit_2(run_cli, endpoint):
    # urllib's ValueError ('unknown url type', 'Invalid IPv6 URL', port out of range) was a traceback
    result = run_cli("vllm", "isolation", "--endpoint", endpoint)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"Error: --endpoint must be an http(s) URL with a host, not {endpoint!r} (--endpoint)\n"
        "Tip: give the server's base URL, for example http://127.0.0.1:8000\n"
    )


def test_a_file_that_is_not_a_record_exits_3(run_cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    result = run_cli("vllm", "isolation", "--replay", bad)
    assert result.exit_code == 3 and "not an isolation record" in result.stderr


def test_prefix_counters_from_vllm_metrics_text():
    # lines as vLLM 0.32's /metrics printed them (tests/data/isolation/README.md)
    text = (ISOLATION / "metrics-vllm-0.32.txt").read_text()
    counters = parse_prefix_counters(text)
    assert (counters.queries_tokens, counters.hits_tokens) == (72.0, 32.0)
    assert parse_block_size(text) == 32  # the engine ran with --block-size 32
    assert parse_block_size("vllm:prefix_cache_hits_total 1.0") is None


def test_random_adapters_are_peft_shaped(tmp_path):
    shape = attention_shape(DATA / "isolation")  # the tiny Llama's config.json
    # hand: 8 heads x head_dim 32 = 256 for q, 2 KV heads x 32 = 64 for v
    assert shape == AttentionShape(num_layers=4, hidden_size=256, q_out_features=256, v_out_features=64)
    folder = write_random_adapter(tmp_path / "a", shape, "base", seed=1)
    from kvtool.estimate.safetensors import read_header

    header = read_header(folder / "adapter_model.safetensors")
    assert len(header) == 4 * 2 * 2  # layers x (q, v) x (A, B)
    assert header["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"]["shape"] == [64, LORA_RANK]
    assert json.loads((folder / "adapter_config.json").read_text())["target_modules"] == ["q_proj", "v_proj"]


def test_labels_are_printed_as_they_are(run_cli):
    # rich would turn "salt:b:" into an emoji and "[...]" into markup; cells are plain Text
    result = run_cli("vllm", "isolation", "--replay", ISOLATION / "vllm-0.32-broken-salt.json")
    assert result.exit_code == 1
    assert "salt:a -> salt:b: reused 128 tokens of salt:a" in " ".join(result.stdout.split())


MODEL_DIR = DATA / "repro" / "hf_llama"  # any folder with a config.json


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # each was used as given: sent to the server, passed to vLLM, or waited on
        (("--endpoint", "http://127.0.0.1:9", "--hidden-size", "0"), "--hidden-size must be positive, not 0"),
        (("--endpoint", "http://127.0.0.1:9", "--events", "junk"), "--events 'junk' is not a ZMQ endpoint"),
        (("--model", MODEL_DIR, "--port", "99999"), "--port must be one of 1 to 65535, not 99999"),
        (("--model", MODEL_DIR, "--events-port", "-5"), "--events-port must be one of 1 to 65535, not -5"),
        (("--model", MODEL_DIR, "--startup-timeout", "nan"), "--startup-timeout must be positive, not nan"),
    ],
)
def test_bad_values_are_refused_before_any_request_or_launch(run_cli, args, line):
    result = run_cli("vllm", "isolation", *args)
    assert (result.exit_code, result.stdout) == (2, "")
    option = line.split()[0]
    assert result.stderr.splitlines()[0] == f"Error: {line} ({option})"
