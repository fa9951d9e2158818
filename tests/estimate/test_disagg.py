"""Prefill/decode disaggregation (kvtool.estimate.disagg) against hand computations from published configs.

Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json: 32 layers, 8 KV heads, head_dim 128, bfloat16): one token of
every layer is 2 (K, V) x 32 x 8 x 128 x 2 B = 131,072 B; one block of 16 tokens of every layer is 2,097,152 B.
The connector moves whole blocks (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py
get_num_new_matched_tokens, 0.33.0: every prompt token; one descriptor per layer and block), and the decode scheduler
holds the blocks of each request in WAITING_FOR_REMOTE_KVS (vllm/v1/core/sched/scheduler.py Scheduler.schedule).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.core.errors import EXIT_USAGE, UsageError
from kvtool.estimate.disagg import parse_transfer_config
from kvtool.estimate.estimator import estimate
from kvtool.estimate.request import EstimateRequest

LLAMA = "meta-llama/Llama-3.1-8B"
GIB = 2**30
NIXL = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'


def _llama(**kw: object) -> EstimateRequest:
    base: dict[str, object] = dict(model=LLAMA, seq_lens=(8192,), kv_transfer_config=NIXL)
    base.update(kw)
    return EstimateRequest(**base)  # type: ignore[arg-type]


def test_llama_8b_8192_tokens_is_one_gib_per_handoff() -> None:
    # 8,192 / 16 = 512 blocks x 2,097,152 B = 8,192 x 131,072 B = 2**30 B
    r = estimate(_llama())
    assert r.handoff_blocks == 512
    assert r.handoff_bytes == GIB
    assert r.handoff_bytes_per_gpu == GIB
    assert (r.kv_connector, r.kv_role) == ("NixlConnector", "kv_both")


def test_tp_2_halves_the_bytes_per_gpu() -> None:
    # 4 KV heads per decode GPU: 2**30 / 2 per GPU, 2**30 in all
    r = estimate(_llama(tp=2))
    assert r.handoff_bytes_per_gpu == GIB // 2
    assert r.handoff_bytes == GIB


def test_block_rounding() -> None:
    # 8,193 tokens take 513 blocks: 513 x 2,097,152 = 1,075,838,976 B, not 8,193 x 131,072 = 1,073,872,896 B
    r = estimate(_llama(prompt_len=8193))
    assert r.handoff_blocks == 513
    assert r.handoff_bytes == 1_075_838_976


def test_fp8_kv_halves_the_handoff() -> None:
    # 1 B per element: 2**29 B
    assert estimate(_llama(kv_dtype="fp8")).handoff_bytes == GIB // 2


def test_link_bandwidth_for_a_ttft_budget() -> None:
    # 2**30 B in 0.2 s = 5,368,709,120 B/s = 5.37 GB/s; TP 2: half per GPU pair, 2.68 GB/s
    assert estimate(_llama(ttft_budget_ms=200)).link_gb_s_for_ttft == pytest.approx(5.36870912)
    assert estimate(_llama(tp=2, ttft_budget_ms=200)).link_gb_s_for_ttft == pytest.approx(2.68435456)
    # 100 ms of the 200 spent on prefill: 2**30 B in 0.1 s = 10.74 GB/s
    r = estimate(_llama(ttft_budget_ms=200, prefill_ms=100))
    assert r.link_gb_s_for_ttft == pytest.approx(10.73741824)


def test_transfers_in_flight_default_bound_and_given() -> None:
    # 10 GiB of KV / 2,097,152 B per block = 5,120 blocks, one of them vLLM's null block: 5,119 // 512 = 9
    # transfers in flight hold 9 x 512 = 4,608 blocks
    r = estimate(_llama(kv_memory="10GiB"))
    assert r.num_blocks == 5120
    assert (r.transfers_in_flight, r.transfer_blocks_in_flight) == (9, 4608)
    given = estimate(_llama(kv_memory="10GiB", transfers_in_flight=3))
    assert given.transfer_blocks_in_flight == 3 * 512
    over = estimate(_llama(kv_memory="10GiB", transfers_in_flight=12))
    assert over.transfer_blocks_in_flight == 6144
    assert any("more than the decode pool's 5,119" in w for w in over.warnings)
    # without a budget there is no pool to bound the count
    assert estimate(_llama()).transfers_in_flight is None


def test_mla_latent_is_whole_on_every_decode_gpu() -> None:
    # DeepSeek-V3 (config.json: kv_lora_rank 512 + qk_rope_head_dim 64, 61 layers, bf16): 576 x 2 B x 61 = 70,272 B
    # per token; 4,096 tokens = 256 blocks of 16 = 287,834,112 B on each GPU, the latent replicated at TP 8
    r = estimate(EstimateRequest(model="deepseek-ai/DeepSeek-V3", seq_lens=(4096,), tp=8, prompt_len=4096))
    assert r.handoff_bytes_per_gpu == 287_834_112
    assert r.handoff_bytes == 8 * 287_834_112


def test_sliding_window_models_are_refused() -> None:
    with pytest.raises(UsageError, match="full-attention and MLA layers only, not sliding"):
        estimate(EstimateRequest(model="google/gemma-2-9b", seq_lens=(8192,), kv_transfer_config=NIXL))


def test_transfer_config_reads_two_keys_and_names_the_rest() -> None:
    c = parse_transfer_config('{"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cuda"}')
    assert (c.kv_connector, c.kv_role) == ("NixlConnector", "kv_consumer")
    assert c.warnings == (
        "--kv-transfer-config: 'kv_buffer_device' is not modelled (kvtool reads kv_connector and kv_role only)",
    )
    other = parse_transfer_config('{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}')
    assert "LMCacheConnectorV1 is sized as NixlConnector moves KV" in other.warnings[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-transfer-config", "{nope"], "Error: --kv-transfer-config is not JSON"),
        (["--kv-transfer-config", '{"kv_connector": "NixlConnector"}'], "Error: --kv-transfer-config names a"),
        (["--kv-transfer-config", '{"kv_connector": "X", "kv_role": "both"}'], "Error: --kv-transfer-config's kv_role"),
        (["--ttft-budget-ms", "100", "--prefill-ms", "100"], "Error: --prefill-ms 100 leaves no time"),
        (["--prefill-ms", "10"], "Error: --prefill-ms needs --ttft-budget-ms"),
        (["--transfers-in-flight", "0"], "Error: --transfers-in-flight must be greater than zero"),
        (["--ttft-budget-ms", "-1"], "Error: --ttft-budget-ms must be greater than zero"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    out = CliRunner().invoke(app, ["estimate", "--model", LLAMA, "--seq-len", "8192", *args])
    assert out.exit_code == EXIT_USAGE, out.output
    assert out.stderr.startswith(message), out.stderr
    assert "Traceback" not in out.output


def test_cli_json_fields_and_table_rows() -> None:
    args = ["estimate", "--model", LLAMA, "--seq-len", "8192", "--tp", "2", "--kv-transfer-config", NIXL]
    out = CliRunner().invoke(app, [*args, "--ttft-budget-ms", "200", "--kv-memory", "10GiB", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert d["handoff_bytes"] == GIB
    assert d["handoff_bytes_per_gpu"] == GIB // 2
    assert d["link_gb_s_for_ttft"] == pytest.approx(2.68435456)
    # 10 GiB per GPU at 1 MiB per block per GPU: 10,240 blocks; 10,239 // 512 = 19 transfers, 9,728 blocks
    assert (d["transfers_in_flight"], d["transfer_blocks_in_flight"]) == (19, 9728)
    table = CliRunner().invoke(app, [*args, "--ttft-budget-ms", "200", "-v"])
    assert table.exit_code == 0, table.output
    assert "prefill -> decode handoff" in table.stdout
    assert "2.68 GB/s" in table.stdout
    assert "how the handoff was counted" in table.stdout


def test_vllm_serve_line_kv_transfer_config() -> None:
    # vllm serve's own flag, whole and in its dotted form (FlexibleArgumentParser gathers --kv-transfer-config.X)
    for line in (
        ["--kv-transfer-config", NIXL],
        ["--kv-transfer-config.kv_connector", "NixlConnector", "--kv-transfer-config.kv_role", "kv_consumer"],
    ):
        out = CliRunner().invoke(
            app, ["estimate", "--json", "--", "vllm", "serve", LLAMA, "--max-model-len", "8192", *line]
        )
        assert out.exit_code == 0, out.output
        d = json.loads(out.stdout)
        assert d["handoff_bytes"] == GIB
        assert d["kv_connector"] == "NixlConnector"
