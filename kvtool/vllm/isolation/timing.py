"""Timing as statistics: does a request's latency tell a prefix-cache hit from a miss?

Two samples, ``a`` (misses: the primes) and ``b`` (hits: the controls).  The statistics, all on the standard
library:

- the Mann-Whitney U of ``a`` over ``b`` (ties count half) and its AUC = U / (n_a n_b), the probability that a miss
  is slower than a hit (Mann & Whitney 1947; Bamber 1975 for U / (n_a n_b) as the area under the ROC curve);
- a two-sided p-value from U's normal approximation with the tie-corrected variance
  ``n_a n_b / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1)))`` and a continuity correction of 0.5;
- the AUC's 95% interval by Hanley & McNeil (1982, Radiology 143:29): ``Q1 = A / (2 - A)``,
  ``Q2 = 2 A^2 / (1 + A)``, ``SE^2 = (A(1 - A) + (n_a - 1)(Q1 - A^2) + (n_b - 1)(Q2 - A^2)) / (n_a n_b)``;
- the samples per side that tell this AUC from 0.5 at two-sided alpha 0.05 with power 0.8, by Noether (1987,
  JASA 82:645) for equal groups: ``n = (z_0.975 + z_0.8)^2 / (6 (AUC - 0.5)^2)``.

Timing decides only when the interval excludes 0.5; otherwise the report says timing cannot decide and how many
samples would.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from statistics import median

Z_975 = 1.959963984540054  # the standard normal's 0.975 quantile
Z_80 = 0.8416212335729143  # its 0.8 quantile (power 0.8)


@dataclasses.dataclass(frozen=True)
class TwoSample:
    auc: float
    u: float
    p_value: float
    ci_low: float
    ci_high: float
    samples_for_power: int | None  # per side; None when the AUC is 0.5 (no effect to detect)
    median_a: float
    median_b: float


def mann_whitney_u(a: list[float], b: list[float]) -> float:
    """U of ``a`` over ``b``: pairs where the ``a`` value is larger, ties counting half."""
    return sum((x > y) + 0.5 * (x == y) for x in a for y in b)


def u_test_p_value(a: list[float], b: list[float], u: float) -> float:
    n_a, n_b = len(a), len(b)
    n = n_a + n_b
    ties = sum(t**3 - t for t in Counter([*a, *b]).values())
    variance = n_a * n_b / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 1.0
    z = max(0.0, abs(u - n_a * n_b / 2) - 0.5) / math.sqrt(variance)
    return math.erfc(z / math.sqrt(2))


def hanley_mcneil_ci(auc: float, n_a: int, n_b: int) -> tuple[float, float]:
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    var = (auc * (1 - auc) + (n_a - 1) * (q1 - auc**2) + (n_b - 1) * (q2 - auc**2)) / (n_a * n_b)
    se = math.sqrt(max(var, 0.0))
    return max(0.0, auc - Z_975 * se), min(1.0, auc + Z_975 * se)


def samples_for_power(auc: float) -> int | None:
    effect = abs(auc - 0.5)
    if effect < 1e-9:
        return None
    return math.ceil((Z_975 + Z_80) ** 2 / (6 * effect**2))


def compare(a: list[float], b: list[float]) -> TwoSample:
    """``a`` against ``b`` (both non-empty)."""
    u = mann_whitney_u(a, b)
    auc = u / (len(a) * len(b))
    low, high = hanley_mcneil_ci(auc, len(a), len(b))
    return TwoSample(auc, u, u_test_p_value(a, b, u), low, high, samples_for_power(auc), median(a), median(b))
