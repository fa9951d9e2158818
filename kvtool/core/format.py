"""Numbers for people: the one place where figures become text in tables (JSON keeps the raw values).

A figure that does not exist (``None``: nothing was measured; NaN or infinity: no request ran, a division by zero)
prints as ``-`` everywhere, so a table never shows ``nan``.
"""

from __future__ import annotations

import math
from typing import Any

from kvtool.core.units import GB, GIB

MISSING = "-"  # what a table shows for a figure that does not exist


def is_missing(value: Any) -> bool:
    """True for ``None`` and for a float that is NaN or infinite."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def fmt_num(value: Any, spec: str | None = None, suffix: str = "") -> str:
    """``format(value, spec) + suffix``, or ``-`` for a missing figure.

    Without ``spec``: floats get ``,.3f`` (``1,234.500``), anything else ``,`` (``1,234``).
    """
    if is_missing(value):
        return MISSING
    if spec is None:
        spec = ",.3f" if isinstance(value, float) else ","
    return f"{value:{spec}}{suffix}"


def fmt_pct(share: float | None, decimals: int = 1, space: bool = False) -> str:
    """A share in [0, 1] as a percentage: ``fmt_pct(0.1234) == '12.3%'``; ``space=True`` gives ``'12.3 %'``."""
    if share is None or not math.isfinite(share):
        return MISSING
    return f"{100 * share:.{decimals}f}{' ' if space else ''}%"


def fmt_bytes(n: int | None) -> str:
    """``1,073,741,824 B (1.00 GiB, 1.07 GB)``: exact bytes, then binary and decimal units, labelled; ``-`` for None."""
    if n is None:
        return MISSING
    if abs(n) < 1000**2:
        return f"{n:,} B ({n / 1024:,.2f} KiB, {n / 1000:,.2f} KB)"
    if abs(n) < 1000**3:
        return f"{n:,} B ({n / 1024**2:,.2f} MiB, {n / 1000**2:,.2f} MB)"
    return f"{n:,} B ({n / GIB:,.2f} GiB, {n / GB:,.2f} GB)"


def fmt_count(n: int) -> str:
    """``6.74 billion`` / ``2.74 million``: a parameter count for people."""
    if n >= 10**9:
        return f"{n / 1e9:,.2f} billion"
    if n >= 10**6:
        return f"{n / 1e6:,.2f} million"
    return f"{n:,}"


def fmt_plural(count: int, noun: str) -> str:
    """``1 request``, ``3 requests``, ``1,024 requests``: a count and its noun, singular for one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
