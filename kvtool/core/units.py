"""Byte sizes in: parse ``10GiB`` / ``10GB`` / ``10737418240`` exactly (kvtool.core.format prints them)."""

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


def parse_override_size(text: str, *, option: str) -> int:
    """A memory term's override (--activation-memory, --lora-memory, --draft-memory ...): a size as
    :func:`parse_size` takes it, or zero (``0``, ``0B``, ``0GiB``, ``0GB``: the term is absent)."""
    if str(text).strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return parse_size(text, option=option)
