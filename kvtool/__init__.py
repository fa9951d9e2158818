"""kvtool: diagnostics and capacity planning for the KV cache of LLM inference.

The library is :mod:`kvtool.api` (docs/api.md).  ``kvtool.load_events``, ``kvtool.analyze`` and
``kvtool.check_target`` are also here, loaded on first use so that ``import kvtool`` stays light.
``estimate`` and ``simulate`` are only in ``kvtool.api``: ``kvtool.estimate`` and ``kvtool.simulate`` are the
packages that implement them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# name -> the kvtool.api attribute it is (the functions whose name is not also a subpackage's)
_LAZY = ("AnalyzeResult", "FleetResult", "SimulateResult", "analyze", "check_target", "load_events")


def __getattr__(name: str) -> Any:
    if name == "api" or name in _LAZY:
        import importlib

        api = importlib.import_module("kvtool.api")
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'kvtool' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "api", *_LAZY})
