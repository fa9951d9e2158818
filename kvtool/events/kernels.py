"""The compiled loops of ``kvtool analyze`` (``_kernels.c``), or None where they are not built.

The extension is optional: ``pip install`` compiles it where a C compiler is at hand, and every caller keeps the
numpy version of the same step as its reference and fallback.  ``KVTOOL_NO_KERNELS=1`` in the environment runs
the numpy versions (tests/events/test_kernels.py runs both and compares).
"""

from __future__ import annotations

import os
from types import ModuleType

NO_KERNELS_ENV = "KVTOOL_NO_KERNELS"


def compiled() -> ModuleType | None:
    """The compiled module, or None when it is not built or KVTOOL_NO_KERNELS is set."""
    if os.environ.get(NO_KERNELS_ENV, "") not in ("", "0"):
        return None
    try:
        from kvtool.events import _kernels  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _kernels


def counting_argsort(keys, n_keys: int, perm=None):
    """Stable argsort of integer keys in [0, n_keys) (equal keys in ``perm``'s order), or None without kernels.

    Used where n_keys is at most a few times the number of keys: one histogram and one scatter.
    """
    import numpy as np

    kernels = compiled()
    if kernels is None:
        return None
    out = np.empty(keys.size, dtype=np.int64)
    perm = None if perm is None else np.ascontiguousarray(perm, dtype=np.int64)
    kernels.counting_argsort(np.ascontiguousarray(keys, dtype=np.int64), int(n_keys), perm, out)
    return out
