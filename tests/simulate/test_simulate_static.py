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
