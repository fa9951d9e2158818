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

from kvtool.api._estimate import estimate
from kvtool.api._events import AnalyzeResult, FleetResult, analyze, load_events
from kvtool.api._repro import check_target
from kvtool.api._simulate import SimulateResult, simulate

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
