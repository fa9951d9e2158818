"""How kvtool calls a --target: three protocols behind one small interface.

- ``embeds`` (the first protocol): ``forward(x, cache) -> (out, new_cache)``, x ``[batch, seq, d_model]`` float;
  the cache is None on a request's first call.  Driven with batch 1.
- ``tokens``: ``forward(ids, positions, cache) -> logits`` or ``(logits, new_cache)``; ids and positions are
  ``[batch, seq]`` int64, positions explicit (0 for a request's first token).  A module returning logits only
  keeps its cache object and updates it in place.  Chosen by ``kvtool_protocol = "tokens"`` on the module.
- ``hf``: a transformers ``PreTrainedModel``, driven through its own cache API (``kvtool.repro.hf``).

Hooks, all optional, on the module: ``kvtool_begin_request(batch_size)`` returns a request's empty cache (a
slot of a pool, fresh ``KVCache`` modules; default None), ``kvtool_end_request(cache)`` is called when kvtool
is done with a request, so slot pools can free the slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# What the user's code may raise into kvtool: any exception, and SystemExit (a module that runs argparse
# at import, a factory that calls sys.exit("no GPU")), which would otherwise end kvtool with the
# target's exit code (1 would read as "checks failed").  KeyboardInterrupt still stops kvtool.
USER_ERRORS = (Exception, SystemExit)

BEGIN_HOOK = "kvtool_begin_request"
END_HOOK = "kvtool_end_request"
PROTOCOL_ATTRIBUTE = "kvtool_protocol"


class TargetFailure(Exception):
    """The target misbehaved during a check (raised, or returned something unusable)."""


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


@dataclass
class Live:
    """One live request (or batch of requests) of a driver: its cache and how many tokens it has seen."""

    cache: Any
    seen: int = 0


class Driver:
    """Calls one target module; subclasses know its protocol.  ``inputs`` rows are [batch, seq, ...]."""

    protocol = "embeds"
    supports_batch = False

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def with_module(self, module: torch.nn.Module) -> Driver:
        """The same driver on another instance (a fresh copy)."""
        return type(self)(module)

    def begin(self, batch: int) -> Live:
        hook = getattr(self.module, BEGIN_HOOK, None)
        if not callable(hook):
            return Live(None)
        try:
            return Live(hook(batch))
        except USER_ERRORS as err:  # noqa: BLE001 - the target's exception is the finding
            raise TargetFailure(f"{BEGIN_HOOK} raised {_one_line(err)}") from None

    def end(self, live: Live) -> None:
        hook = getattr(self.module, END_HOOK, None)
        if callable(hook):
            try:
                hook(live.cache)
            except USER_ERRORS as err:  # noqa: BLE001
                raise TargetFailure(f"{END_HOOK} raised {_one_line(err)}") from None

    def step(self, live: Live, inputs: torch.Tensor) -> torch.Tensor:
        """Feed ``inputs`` [batch, seq, ...] as the next tokens of ``live``; the output, cloned."""
        return self.step_layers(live, inputs, layers=False)[0]

    def step_layers(
        self, live: Live, inputs: torch.Tensor, layers: bool = True
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Like step, with the per-layer hidden states where the protocol gives them (HF; else empty)."""
        positions = torch.arange(live.seen, live.seen + inputs.shape[1], device=inputs.device)
        positions = positions.expand(inputs.shape[0], -1)
        try:
            out, live.cache, states = self._call(inputs, positions, live.cache, layers)
        except TargetFailure:
            raise
        except USER_ERRORS as err:  # noqa: BLE001 - the target's exception is the finding
            raise TargetFailure(f"forward raised {_one_line(err)}") from None
        if out.dim() < 2 or tuple(out.shape[:2]) != tuple(inputs.shape[:2]):  # the checks slice [batch, seq, ...]
            raise TargetFailure(
                f"forward returned an output of shape {list(out.shape)} for inputs of shape {list(inputs.shape)}; "
                "expected [batch, seq, ...]"
            )
        if out.is_floating_point() and not bool(torch.isfinite(out).all()):
            # every check compares outputs: NaN never equals itself, so a NaN output read as a leak between requests
            raise TargetFailure(
                f"forward returned NaN or inf for {inputs.shape[1]} new token(s) after {live.seen} seen; "
                "outputs that are not finite cannot be compared"
            )
        live.seen += inputs.shape[1]
        # clone: a later step must not change this output
        return out.detach().clone(), tuple(h.detach().clone() for h in states)

    def _call(self, inputs: torch.Tensor, positions: torch.Tensor, cache: Any, layers: bool) -> tuple[Any, Any, Any]:
        result = self.module(inputs, cache)
        if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.Tensor)):
            raise TargetFailure(f"forward returned {type(result).__name__}, expected (out tensor, new_cache)")
        return result[0], result[1], ()

    def full(self, inputs: torch.Tensor) -> tuple[torch.Tensor, Live, tuple[torch.Tensor, ...]]:
        """One forward over all of ``inputs`` from an empty cache: (output, the live request, per-layer states)."""
        live = self.begin(inputs.shape[0])
        out, states = self.step_layers(live, inputs)
        return out, live, states


class TokensDriver(Driver):
    protocol = "tokens"
    supports_batch = True

    def _call(self, inputs: torch.Tensor, positions: torch.Tensor, cache: Any, layers: bool) -> tuple[Any, Any, Any]:
        result = self.module(inputs, positions, cache)
        if isinstance(result, torch.Tensor):
            return result, cache, ()
        if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.Tensor):
            return result[0], result[1], ()
        raise TargetFailure(f"forward returned {type(result).__name__}, expected logits or (logits, new_cache)")


def vocab_size_of(module: torch.nn.Module) -> int | None:
    """``vocab_size`` of the module or its config, else the size of its first nn.Embedding."""
    for owner in (module, getattr(module, "config", None)):
        size = getattr(owner, "vocab_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    for sub in module.modules():
        if isinstance(sub, torch.nn.Embedding):
            return int(sub.num_embeddings)
    return None
