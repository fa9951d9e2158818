"""Byte sizes in and out: parse ``10GiB`` / ``10GB`` / ``10737418240`` and label GiB and GB correctly."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from kvtool.core.errors import UsageError

GIB = 1024**3
GB = 1000**3

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, *, option: str) -> int:
    """Bytes from ``10GiB``, ``10GB``, ``1.5TiB`` or a plain integer (bytes); > 0, exact.

    A fractional result is rounded down to whole bytes.  Anything else is a UsageError naming ``option``.
    """
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(
            f"{option} must be a size such as 10GiB, 10GB or a number of bytes, not {text!r}",
            where=option,
            tip="units: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)",
        )
    try:
        value = Decimal(match.group(1).replace("_", "").replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex admits only digits
        raise UsageError(f"{option}: {text!r} is not a number", where=option) from None
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"{option} must be greater than zero, not {text!r}", where=option)
    return size


def format_bytes(n: int) -> str:
    """``1,073,741,824 B (1.00 GiB, 1.07 GB)``: exact bytes, then binary and decimal units, labelled."""
    if abs(n) < 1000**2:
        return f"{n:,} B ({n / 1024:,.2f} KiB, {n / 1000:,.2f} KB)"
    if abs(n) < 1000**3:
        return f"{n:,} B ({n / 1024**2:,.2f} MiB, {n / 1000**2:,.2f} MB)"
    return f"{n:,} B ({n / GIB:,.2f} GiB, {n / GB:,.2f} GB)"


def format_gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def format_count(n: int) -> str:
    """``6.74 billion`` / ``2.74 million``: a parameter count for people."""
    if n >= 10**9:
        return f"{n / 1e9:,.2f} billion"
    if n >= 10**6:
        return f"{n / 1e6:,.2f} million"
    return f"{n:,}"
