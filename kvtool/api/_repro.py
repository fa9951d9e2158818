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
    new instances from the factory).  The same function runs the CLI's ``--target`` (``kvtool.repro.run``).

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
    (True, ['determinism', 'isolation', 'no-shared-storage', 'cache-length'])
    """
    from kvtool.repro.run import run_repro

    return run_repro(
        None, device=device, dtype=dtype, seed=seed, interleavings=interleavings, target=target, d_model=d_model
    )
