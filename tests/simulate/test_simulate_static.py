"""The static block-size comparison against closed forms and a hand computation on the real Azure trace."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from kvtool.simulate.lengths import lognormal_sigma, parametric_lengths
from kvtool.simulate.static import compare_block_sizes, fit_at_once
from tests.support import DATA

AZURE_CONV = DATA / "simulate" / "azure-2023-conv.csv"


@pytest.mark.parametrize("b", [8, 16, 32, 64, 128])
def test_uniform_lengths_waste_half_a_block_per_request(b):
    # Closed form: with L uniform over 1..R and R a multiple of b, (-L) mod b is uniform over {0..b-1}, so the
    # empty slots of the last block average (b-1)/2 with variance (b^2-1)/12.  Tolerance: 5 standard errors.
    n = 200_000
    lengths, _ = parametric_lengths("uniform", n, seed=7, min_tokens=1, max_tokens=1024 * 128)
    result = compare_block_sizes(lengths, np.zeros(n, dtype=np.int64), [b]).results[0]
    sigma = math.sqrt((b * b - 1) / 12 / n)
    assert abs(result.mean_waste_tokens - (b - 1) / 2) < 5 * sigma
    # and internal fragmentation is the waste over the allocated slots, by definition
    assert result.internal_fragmentation == pytest.approx(result.mean_waste_tokens * n / result.allocated_slots)


@pytest.mark.parametrize("b", [8, 16, 32, 64, 128])
def test_fixed_multiple_of_block_size_wastes_nothing(b):
    lengths = np.full(1000, 32 * b, dtype=np.int64)
    r = compare_block_sizes(lengths, np.zeros(1000, dtype=np.int64), [b]).results[0]
    assert r.internal_fragmentation == 0.0
    assert r.effective_utilization == 1.0
    assert r.mean_table_entries == r.max_table_entries == 32


@pytest.mark.parametrize("b,prefix", [(16, 200), (16, 0), (8, 7), (32, 256), (128, 500)])
def test_prefix_sharing_saves_n_minus_1_full_prefix_blocks(b, prefix):
    # Closed form: N requests whose prompts all start with the same P tokens store floor(P/b) full blocks once
    # instead of N times: (N-1) x floor(P/b) x b slots saved; the P mod b tail stays duplicated.
    n = 37
    rng = np.random.default_rng(3)
    prompt = prefix + rng.integers(1, 500, n)
    output = rng.integers(1, 100, n)
    r = compare_block_sizes(prompt, output, [b], shared_prefix_tokens=prefix).results[0]
    assert r.prefix_saving_slots == (n - 1) * (prefix // b) * b
    assert r.prefix_shared_blocks == prefix // b
    assert r.prefix_tail_tokens == prefix % b
    assert r.requests_shorter_than_prefix == 0


def _azure_lengths_by_hand():
    with open(AZURE_CONV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return np.array([int(r["ContextTokens"]) + int(r["GeneratedTokens"]) for r in rows], dtype=np.int64)


def test_azure_conv_fragmentation_matches_hand_computation(run_cli):
    # Hand computation with numpy over all 19,366 rows: L = context + generated tokens; a request holds ceil(L/b)
    # blocks; internal fragmentation = sum(ceil(L/b) b - L) / sum(ceil(L/b) b).
    lengths = _azure_lengths_by_hand()
    assert len(lengths) == 19_366
    assert lengths.mean() == pytest.approx(1365.8, abs=0.05)  # ../shared/data/traces/README.md: mean 1,365.8
    res = run_cli("simulate", "--trace", AZURE_CONV, "--json")
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ""
    out = json.loads(res.stdout)
    assert out["requests"] == 19_366
    assert [r["block_size"] for r in out["results"]] == [8, 16, 32, 64, 128]
    for r in out["results"]:
        b = r["block_size"]
        slots = np.ceil(lengths / b) * b
        assert r["internal_fragmentation"] == pytest.approx((slots - lengths).sum() / slots.sum(), rel=1e-12)
        blocks = slots / b
        assert r["mean_table_entries"] == pytest.approx(blocks.mean(), rel=1e-12)
        assert r["max_table_entries"] == blocks.max()
        assert r["p99_table_entries"] == pytest.approx(np.percentile(blocks, 99))


def test_contiguous_baseline_by_hand():
    # Lengths 100, 300, 600 with --max-model-len 500: 600 cannot be served; the others use 400 of 1000 slots.
    c = compare_block_sizes([90, 290, 590], [10, 10, 10], [16], max_model_len=500, kv_tokens=2000).contiguous
    assert c.requests_too_long == 1
    assert c.utilization == pytest.approx(400 / 1000)
    assert c.waste_fraction == pytest.approx(0.6)
    assert c.fit_at_once == 4
    # the default reservation is the longest request
    c = compare_block_sizes([90, 290, 590], [10, 10, 10], [16]).contiguous
    assert c.max_model_len == 600 and c.max_model_len_from_data
    assert c.utilization == pytest.approx(1000 / 1800)


def test_fit_at_once_windows_by_hand():
    # blocks 2, 3, 1 (cyclic) in a pool of 4: from 0: 2 (2+3 > 4) -> 1; from 1: 3+1 -> 2; from 2: 1+2 -> 2.
    assert fit_at_once(np.array([2, 3, 1]), 4).tolist() == [1, 2, 2]
    # a pool that holds everything caps at N
    assert fit_at_once(np.array([1, 1]), 100).tolist() == [2, 2]


def test_fixed_length_overstates_capacity_for_a_long_tail():
    # The seed article: a fixed-length test overstates capacity under a long-tailed distribution.
    lengths, _ = parametric_lengths("lognormal", 20_000, 1, mean=800, p99=6000)
    r = compare_block_sizes(lengths, np.zeros(len(lengths), dtype=np.int64), [16], kv_tokens=200_000).results[0]
    assert r.fit_if_fixed_mean_length > r.fit_at_once_p1


def test_lognormal_parameters_are_its_mean_and_p99():
    # mean = exp(mu + s^2/2) and p99 = exp(mu + z99 s) with z99 = 2.3263...: solve back from sigma.
    s = lognormal_sigma(1000, 5000)
    mu = math.log(1000) - s * s / 2
    assert math.exp(mu + 2.3263478740408408 * s) == pytest.approx(5000)
    draws, _ = parametric_lengths("lognormal", 400_000, 0, mean=1000, p99=5000)
    assert draws.mean() == pytest.approx(1000, rel=0.02)
    assert np.percentile(draws, 99) == pytest.approx(5000, rel=0.03)


def test_zipf_and_fixed_and_uniform_ranges():
    z, _ = parametric_lengths("zipf", 10_000, 0, min_tokens=10, max_tokens=5000, alpha=1.1)
    assert z.min() >= 10 and z.max() <= 5000
    # P(L=10)/P(L=20) = 2^1.1 for a Zipf law; check the empirical ratio loosely
    assert (z == 10).sum() / max((z == 20).sum(), 1) == pytest.approx(2**1.1, rel=0.25)
    f, _ = parametric_lengths("fixed", 5, 0, length=512)
    assert f.tolist() == [512] * 5
    u, _ = parametric_lengths("uniform", 10_000, 0, min_tokens=3, max_tokens=9)
    assert set(u.tolist()) == set(range(3, 10))


def test_fixed_length_claim_counts_the_shared_prefix_once_like_the_windows():
    # 50 requests of prompt 100 + output 28 = 128 tokens, shared prefix 64, b = 16, 1,600 KV tokens = 100 blocks.
    # Each request: ceil(128/16) = 8 blocks, floor(64/16) = 4 of them shared and stored once, so 4 own blocks;
    # the pool holds (100 - 4) // 4 = 24 requests.  Every length is the mean, so the fixed-length claim is the
    # same 24 (it used to be 100 // 8 = 12, below what the windows report).
    prompt = np.full(50, 100, dtype=np.int64)
    r = compare_block_sizes(
        prompt, np.full(50, 28, dtype=np.int64), [16], shared_prefix_tokens=64, kv_tokens=1600
    ).results[0]
    assert r.fit_at_once_p50 == 24 and r.fit_at_once_p1 == 24
    assert r.fit_if_fixed_mean_length == 24
    # without a shared prefix: 100 // 8 = 12
    r = compare_block_sizes(prompt, np.full(50, 28, dtype=np.int64), [16], kv_tokens=1600).results[0]
    assert r.fit_at_once_p50 == 12 and r.fit_if_fixed_mean_length == 12


def _fixture_config(tmp_path, name: str):
    """The config.json a vLLM parity fixture's model was built from (tests/data/simulate/vllm-groups-*.json)."""
    fx = json.loads((DATA / "simulate" / f"vllm-groups-{name}.json").read_text())
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(fx["hf_config"]))
    return path


def _lengths_trace(tmp_path, lengths):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n" + "".join(f"{n - 1},1\n" for n in lengths))
    return path


def test_sliding_group_holds_only_its_window_by_hand(run_cli, tmp_path):
    """The tiny Mistral (every layer sliding_window 64; one SlidingWindowSpec group, as vLLM formed it in
    vllm-groups-sliding-a.json), block 32, final lengths 100, 64, 10, 200.  By hand, with vLLM 0.32's
    SlidingWindowManager.get_num_skipped_tokens = max(0, L - 64 + 1) and remove_skipped_blocks freeing the blocks
    wholly before them:
      L=100: 37 skipped -> block 1 on, cdiv(100, 32) - 1 = 3 blocks (96 slots), 63 tokens read, 68 stored;
      L=64: 1 skipped -> 2 blocks (64 slots), 63 read, 64 stored;  L=10: 1 block (32), 10 read, 10 stored;
      L=200: 137 skipped -> block 4 on, 7 - 4 = 3 blocks (96), 63 read, 200 - 128 = 72 stored.
    Slots 288; empty after the last token 288 - 214 = 74; outside the window 214 - 199 = 15; read 199.
    The plain table counts every token: 4 + 2 + 1 + 7 = 14 blocks, 3.5 a request."""
    cfg = _fixture_config(tmp_path, "sliding-a")
    trace = _lengths_trace(tmp_path, [100, 64, 10, 200])
    res = run_cli("simulate", "--trace", str(trace), "--config", str(cfg), "--block-size", "32", "--json")
    assert res.exit_code == 0, res.stderr
    row = json.loads(res.stdout)["results"][0]
    assert row["mean_table_entries"] == 3.5
    (g,) = row["groups"]
    assert (g["kind"], g["window_tokens"], g["num_layers"]) == ("sliding", 64, 4)
    assert (g["blocks_held_mean"], g["blocks_held_max"], g["slots_held"], g["tokens_needed"]) == (2.25, 3, 288, 199)
    assert g["internal_fragmentation"] == pytest.approx(74 / 288)
    assert g["outside_window_fraction"] == pytest.approx(15 / 288)
    assert g["utilization"] == pytest.approx(199 / 288)
    assert row["group_blocks_held_mean"] == 2.25
    table = run_cli("simulate", "--trace", str(trace), "--config", str(cfg), "--block-size", "32")
    assert "Per KV-cache group" in table.stdout and "0 sliding 64" in table.stdout


def test_alternating_and_state_groups_by_hand(run_cli, tmp_path):
    """The tiny Gemma-2 (sliding 64 / global alternating: a SlidingWindowSpec and a FullAttentionSpec group of 2
    layers, sliding first, as in vllm-groups-alt-a.json) and the tiny Qwen3-Next (a MambaSpec and a
    FullAttentionSpec group, vllm-groups-hybrid-a.json; kvtool's bf16 state fits a 32-token block), block 32,
    lengths 100 and 10.  Full group: cdiv(L, 32) = 4 + 1 blocks, slots 160, tokens 110, 50 empty.  Sliding: 3 + 1
    (as above).  State group ('align' mode, get_num_skipped_tokens = L - 1): one state block per request, no token
    figures."""
    trace = _lengths_trace(tmp_path, [100, 10])
    gemma = run_cli(
        "simulate",
        "--trace",
        str(trace),
        "--config",
        str(_fixture_config(tmp_path, "alt-a")),
        "--block-size",
        "32",
        "--json",
    )
    assert gemma.exit_code == 0, gemma.stderr
    sliding, full = json.loads(gemma.stdout)["results"][0]["groups"]
    assert (sliding["kind"], sliding["blocks_held_mean"], sliding["slots_held"]) == ("sliding", 2.0, 128)
    assert (full["kind"], full["blocks_held_mean"], full["slots_held"], full["tokens_needed"]) == (
        "full",
        2.5,
        160,
        110,
    )
    assert full["internal_fragmentation"] == pytest.approx(50 / 160) and full["outside_window_fraction"] == 0
    qwen = run_cli(
        "simulate",
        "--trace",
        str(trace),
        "--config",
        str(_fixture_config(tmp_path, "hybrid-a")),
        "--block-size",
        "32",
        "--json",
    )
    assert qwen.exit_code == 0, qwen.stderr
    state, full = json.loads(qwen.stdout)["results"][0]["groups"]
    assert (state["kind"], state["blocks_held_mean"], state["blocks_held_max"]) == ("mamba", 1.0, 1)
    assert state["internal_fragmentation"] is None and state["tokens_needed"] is None
    assert (full["kind"], full["blocks_held_mean"]) == ("full", 2.5)
    # at block 16 vLLM would raise the hybrid's attention block to 32: said, not counted
    res = run_cli(
        "simulate",
        "--trace",
        str(trace),
        "--config",
        str(_fixture_config(tmp_path, "hybrid-b")),
        "--block-size",
        "16",
        "--json",
    )
    assert res.exit_code == 0, res.stderr
    row = json.loads(res.stdout)["results"][0]
    assert row["groups"] == [] and "raises a hybrid model's attention block to 32" in row["groups_note"]


def test_no_model_no_groups(run_cli, tmp_path):
    res = run_cli("simulate", "--trace", str(_lengths_trace(tmp_path, [100])), "--block-size", "32", "--json")
    row = json.loads(res.stdout)["results"][0]
    assert row["groups"] == [] and row["groups_note"] is None and row["group_blocks_held_mean"] is None
