"""``kvtool.api.check_target``: ``kvtool repro --target``'s isolation checks on a module in hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from kvtool.repro.results import ReproReport


def check_target(
    target: Any | Callable[[], Any] | str,
    *,
    d_model: int | None = None,
    device: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    interleavings: int = 200,
) -> ReproReport:
    """Run ``kvtool repro --target``'s checks on your own attention module (docs/repro.md).

    ``target``: a ``torch.nn.Module``, a factory returning one, or ``"package.module:factory"`` as the CLI takes
    it.  Its ``forward(x, cache)`` takes x ``[batch, seq, d_model]`` and the request's cache (``None`` on its first
    call) and returns ``(out, new_cache)``.  ``d_model`` defaults to the module's ``d_model`` attribute.  The module
    is moved to ``device``/``dtype`` and put in eval mode; fresh copies for the reference runs are deep copies (or
    new instances from the factory).  It runs through the CLI's ``--target`` code (``kvtool.repro.run``): an
    object is named by :func:`target_spec` (its ``module:qualname``, or a registered name).

    Returns the :class:`~kvtool.repro.results.ReproReport`: ``passed``, ``target.checks`` (determinism,
    isolation, no-shared-storage, cache-length, each with its evidence), ``to_dict()`` = ``--json``'s object.

    Example: a cache that grows by concatenation, one per request, passes every check:

    >>> import torch
    >>> from kvtool.api import check_target
    >>> class Attention(torch.nn.Module):
    ...     d_model = 8
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.qkv = torch.nn.Linear(8, 24)
    ...     def forward(self, x, cache=None):
    ...         q, k, v = self.qkv(x).chunk(3, dim=-1)
    ...         if cache is not None:
    ...             k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
    ...         n, total = x.shape[1], k.shape[1]
    ...         mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
    ...         out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ...         return out, (k, v)
    >>> report = check_target(Attention, interleavings=5)
    >>> report.passed, [check.name for check in report.target.checks if check.passed]
    (True, ['determinism', 'isolation', 'consistency', 'no-shared-storage', 'no-aliasing', 'cache-length', 'batch'])
    """
    from kvtool.core.extras import require

    require("torch", feature="kvtool.api.check_target")
    from kvtool.repro.run import run_repro

    return run_repro(
        None,
        device=device,
        dtype=dtype,
        seed=seed,
        interleavings=interleavings,
        target=target_spec(target),
        d_model=d_model,
    )


TARGETS_MODULE = "kvtool_api_targets"  # where objects given to check_target are registered (in sys.modules)


def target_spec(target: Any) -> str:
    """The ``package.module:factory`` that names ``target`` for the CLI's code path (``--target``).

    A string is the spec itself.  A factory importable by its own ``module:qualname`` (a top-level class or
    function of a module on the path) is named so, as a user would name it on the command line.  Anything else (a
    module instance, a lambda, a class defined in a notebook) is registered in a module of its own,
    ``kvtool_api_targets``, under its name, and named there; an instance gets a factory that returns it.
    """
    import importlib
    import sys
    import types

    if isinstance(target, str):
        return target
    if isinstance(target, type) or (callable(target) and not hasattr(target, "forward")):
        module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
        if module and qualname and module != "__main__" and "<" not in qualname:
            try:
                found: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    found = getattr(found, part)
            except (ImportError, AttributeError):
                found = None
            if found is target:
                return f"{module}:{qualname}"
        factory, name = target, getattr(target, "__name__", "factory")
    else:
        instance = target

        def factory(*args: Any, **kwargs: Any) -> Any:
            return instance

        name = type(target).__name__
    registry = sys.modules.setdefault(TARGETS_MODULE, types.ModuleType(TARGETS_MODULE))
    key = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "target"
    taken = vars(registry)
    unique, n = key, 1
    while unique in taken and taken[unique] is not factory:
        n += 1
        unique = f"{key}_{n}"
    setattr(registry, unique, factory)
    return f"{TARGETS_MODULE}:{unique}"
