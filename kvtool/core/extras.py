"""The optional extras (pyproject.toml): which extra brings which module, and the check made before importing one.

``pip install kvtool`` installs what estimate, analyze and simulate need.  Everything else is an extra, and each
place that imports one calls :func:`require` first, so a missing one is one ``Error:`` line naming the feature and
a ``Tip:`` naming the extra, with exit code ``EXIT_MISSING_EXTRA`` (README "Exit codes"), not a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from kvtool.core.errors import MissingExtraError

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of CPU-only wheels


@dataclass(frozen=True)
class Extra:
    """One optional module and the pip extra of kvtool that installs it."""

    module: str  # what kvtool imports: "torch", "dask.distributed"
    title: str  # what its users call it: "PyTorch"
    extra: str  # the extra of kvtool (pyproject.toml [project.optional-dependencies]) that installs it
    distribution: str  # its name on PyPI, as that extra lists it: "torch", "pyzmq"
    also: str = ""  # the end of the Tip, where there is more to say than the extra

    def tip(self) -> str:
        return f"pip install 'kvtool[{self.extra}]'{self.also}"


EXTRAS: dict[str, Extra] = {
    extra.module: extra
    for extra in (
        Extra(
            "torch",
            "PyTorch",
            "repro",
            "torch",
            also=f" (without a GPU, first the CPU-only wheel: pip install torch --index-url {TORCH_CPU_INDEX})",
        ),
        Extra("matplotlib", "matplotlib", "plots", "matplotlib"),
        Extra("pandas", "pandas", "api", "pandas"),
        Extra("transformers", "transformers", "hf", "transformers"),
        Extra("zmq", "pyzmq", "capture", "pyzmq"),
        Extra("msgpack", "msgpack", "capture", "msgpack"),
        Extra("dask.distributed", "Dask", "fleet", "dask"),
        Extra("fsspec", "fsspec", "fleet", "fsspec"),
        Extra("prometheus_client", "prometheus-client", "watch", "prometheus-client"),
    )
}


def require(module: str, *, feature: str, where: str | None = None) -> ModuleType:
    """Import the optional ``module`` (a key of :data:`EXTRAS`) for ``feature`` ("kvtool repro"), and return it.

    Raises :class:`~kvtool.core.errors.MissingExtraError` when it is not installed ("kvtool repro needs PyTorch,
    which is not installed", Tip: its extra) or when it is installed but does not import (a broken install: the
    first line of the error).  ``where`` is the option or file the error names, if any.
    """
    import importlib

    extra = EXTRAS[module]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or module
        # a module the optional one needs (its own dependency) is named; installing the extra brings it too
        detail = "" if _top(missing) == _top(module) else f" (no module named '{missing}')"
        message = f"{feature} needs {extra.title}, which is not installed{detail}"
        raise MissingExtraError(message, where=where, tip=extra.tip()) from None
    except (ImportError, OSError) as err:  # installed, but broken: a missing shared library, a version clash
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        message = f"{feature} needs {extra.title}, which is installed but does not import: {first}"
        raise MissingExtraError(message, where=where, tip=f"reinstall it: {extra.tip()}") from None


def require_installed(module: str, *, feature: str, where: str | None = None) -> None:
    """:func:`require`'s error where ``module`` is not installed, without importing it (the import stays lazy)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or a broken entry in sys.modules
        found = False
    if not found:
        require(module, feature=feature, where=where)  # raises, naming the extra


def _top(module: str) -> str:
    return module.split(".")[0]
