"""kvtool as a library: the analyses of the CLI as Python functions, their tables as pandas DataFrames.

Each function runs the code of the command it is named after, with the same options, checks and errors
(``kvtool.core.errors.KvtoolError``), and returns a result whose ``to_dict()`` is that command's ``--json``:

- :func:`estimate` -> ``EstimateResult`` (``kvtool estimate``)
- :func:`load_events` -> ``pandas.DataFrame`` of an events file's accepted rows, rejected rows in ``attrs``
- :func:`analyze` -> :class:`AnalyzeResult`: ``requests``, ``pool_timeline``, ``free_latency``,
  ``prefix_matches`` DataFrames and the ``--json`` sections (``kvtool analyze``); several files ->
  :class:`FleetResult` (one pool per engine)
- :func:`simulate` -> :class:`SimulateResult`: one row per block size (``kvtool simulate``)
- :func:`check_target` -> ``ReproReport`` (``kvtool repro --target``)

Importing this package loads no numpy, pandas, torch or matplotlib; each function imports what it needs.
The reference with examples is docs/api.md (generated from these docstrings).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from kvtool.api._estimate import estimate
    from kvtool.api._events import AnalyzeResult, FleetResult, analyze, load_events
    from kvtool.api._repro import check_target
    from kvtool.api._simulate import SimulateResult, simulate

# name -> the module defining it, imported on first use (``from kvtool.api import analyze`` loads the events
# layer only; ``import kvtool.api`` loads nothing)
_WHERE = {
    "estimate": "kvtool.api._estimate",
    "AnalyzeResult": "kvtool.api._events",
    "FleetResult": "kvtool.api._events",
    "analyze": "kvtool.api._events",
    "load_events": "kvtool.api._events",
    "check_target": "kvtool.api._repro",
    "SimulateResult": "kvtool.api._simulate",
    "simulate": "kvtool.api._simulate",
}

__all__ = [
    "AnalyzeResult",
    "FleetResult",
    "SimulateResult",
    "analyze",
    "check_target",
    "estimate",
    "load_events",
    "simulate",
]


# the modules whose results are pandas DataFrames: pandas is the `api` extra (pip install 'kvtool[api]')
_NEEDS_PANDAS = {"kvtool.api._events", "kvtool.api._simulate"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        if _WHERE[name] in _NEEDS_PANDAS:
            from kvtool.core.extras import require_installed

            require_installed("pandas", feature=f"kvtool.api.{name}")
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvtool.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
