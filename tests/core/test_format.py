"""The one number formatter: closed-form cases worked by hand."""

from __future__ import annotations

import math

import pytest

from kvtool.core.format import MISSING, fmt_bytes, fmt_count, fmt_num, fmt_pct


@pytest.mark.parametrize("missing", [None, math.nan, math.inf, -math.inf])
def test_a_missing_figure_is_a_dash(missing):
    assert fmt_num(missing) == fmt_num(missing, ",.1f", " s") == fmt_pct(missing) == MISSING == "-"


def test_numbers():
    assert fmt_num(1234) == "1,234"  # integers: thousands separators, no decimals
    assert fmt_num(1234.5) == "1,234.500"  # floats: three decimals
    assert fmt_num(0.0) == "0.000"
    assert fmt_num(1234.56, ",.1f") == "1,234.6"
    assert fmt_num(2.5, ",.3f", " s") == "2.500 s"
    assert fmt_num(7, ",d") == "7"


def test_percentages():
    assert fmt_pct(0.1234) == "12.3%"
    assert fmt_pct(0.1234, decimals=2) == "12.34%"
    assert fmt_pct(0.5, space=True) == "50.0 %"
    assert fmt_pct(1.0) == "100.0%"
    assert fmt_pct(0.0) == "0.0%"
    assert fmt_pct(0.123) == f"{0.123:.1%}"  # the same rounding as Python's own % format


def test_bytes_name_both_units():
    # the seed articles' worked example: 7B, MHA, FP16, 2048 tokens = 2 x 32 x 32 x 128 x 2 x 2048 = 2^30 bytes
    assert fmt_bytes(2**30) == "1,073,741,824 B (1.00 GiB, 1.07 GB)"
    assert fmt_bytes(524_288) == "524,288 B (512.00 KiB, 524.29 KB)"  # 2^19 B = 512 KiB
    assert fmt_bytes(10**6) == "1,000,000 B (0.95 MiB, 1.00 MB)"  # 10^6 / 2^20 = 0.9537
    assert fmt_bytes(None) == "-"


def test_counts():
    assert fmt_count(6_738_415_616) == "6.74 billion"
    assert fmt_count(2_740_000) == "2.74 million"
    assert fmt_count(999_999) == "999,999"
