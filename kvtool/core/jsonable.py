"""Plain JSON values from kvtool's results: dataclasses, tuples, numpy scalars, non-finite floats."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, tuples, numpy scalars and non-finite floats into plain JSON values.

    Non-finite floats become ``null`` so the output is strict JSON.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    # numpy scalars and similar: use their Python value
    item = getattr(value, "item", None)
    if callable(item):
        return to_jsonable(item())
    return str(value)
