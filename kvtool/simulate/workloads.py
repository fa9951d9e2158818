"""Prompts with prefix structure for the serving simulation's prefix cache.

Three sources, each giving every request a :class:`~kvtool.simulate.scheduler.Prompt` (its length and which leading
tokens may be shared with other requests):

- token-id prompts from JSON lines: ``{"prompt_token_ids": [...], "max_tokens": N}`` (``output_tokens`` also
  accepted; optional ``arrival_s``): the prefix cache compares the ids themselves, as vLLM does;
- the Mooncake trace format: ``{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}``, one hash
  id per 512-token block of the prompt (equal ids = equal 512 tokens; the last id may cover a partial block);
- any length-only source with ``--shared-prefix S``: every prompt starts with the same S-token system prompt (or its
  whole length when shorter), the rest private; ``--prefix-variant-share F`` gives a fraction F of the requests a
  variant whose last system-prompt token differs (a trailing whitespace tokenised differently), each variant
  different from every other (the worst case), which breaks the match from the block holding that token on.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kvtool.core.errors import InputFileError
from kvtool.simulate.limits import MAX_ARRIVAL_S, MAX_REQUEST_TOKENS
from kvtool.simulate.scheduler import Prompt

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids cover 512 tokens each (FAST'25 trace release)


def is_prefix_trace(columns: dict[str, list[Any]]) -> bool:
    return "prompt_token_ids" in columns or "hash_ids" in columns


@dataclasses.dataclass(frozen=True)
class PrefixTrace:
    """Requests read from a prefix-structured trace (the fields of ``lengths.RequestSet``)."""

    prompt_tokens: Any  # numpy int64
    output_tokens: Any
    arrival_s: Any | None  # seconds from the first request, sorted
    source: str
    shared: list[tuple[str, Any]]
    sessions: list[Any] | None = None  # the rows' 'session_id' (a string or an integer; None where absent)


def prefix_trace_requests(columns: dict[str, list[Any]], path: Path) -> PrefixTrace:
    """The requests of JSON-lines columns holding token ids or Mooncake hash ids."""
    import numpy as np

    n = len(next(iter(columns.values())))
    shared: list[tuple[str, Any]] = []
    prompt = np.zeros(n, dtype=np.int64)
    output = np.zeros(n, dtype=np.int64)
    arrival = None
    if "prompt_token_ids" in columns:
        outs = columns.get("max_tokens") or columns.get("output_tokens")
        if outs is None:
            raise InputFileError("token-id prompts need 'max_tokens' (or 'output_tokens')", where=str(path))
        for i, ids in enumerate(columns["prompt_token_ids"]):
            if (
                not isinstance(ids, list)
                or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
            ):
                raise InputFileError(
                    "'prompt_token_ids' must be a non-empty list of integers", where=f"{path}, record {i + 1}"
                )
            prompt[i] = len(ids)
            output[i] = _count(outs[i], "max_tokens", path, i)
            shared.append(("tokens", ids))
        if "arrival_s" in columns:
            arrival = np.array(
                [float(_count(v, "arrival_s", path, i, number=True)) for i, v in enumerate(columns["arrival_s"])]
            )
        kind = "token-id prompts"
    else:
        for key in ("input_length", "output_length"):
            if key not in columns:
                raise InputFileError(f"a Mooncake trace needs '{key}'", where=str(path))
        for i, ids in enumerate(columns["hash_ids"]):
            p = _count(columns["input_length"][i], "input_length", path, i)
            if not isinstance(ids, list) or len(ids) * MOONCAKE_BLOCK_TOKENS < p:
                raise InputFileError(
                    f"'hash_ids' must list one id per {MOONCAKE_BLOCK_TOKENS} prompt tokens",
                    where=f"{path}, record {i + 1}",
                )
            prompt[i] = p
            output[i] = _count(columns["output_length"][i], "output_length", path, i)
            pieces = [(("mc", h), min(MOONCAKE_BLOCK_TOKENS, p - j * MOONCAKE_BLOCK_TOKENS)) for j, h in enumerate(ids)]
            shared.append(("pieces", [x for x in pieces if x[1] > 0]))
        if "timestamp" in columns:
            arrival = (
                np.array(
                    [float(_count(v, "timestamp", path, i, number=True)) for i, v in enumerate(columns["timestamp"])]
                )
                / 1e3
            )
        kind = "Mooncake trace"
    sessions = _sessions(columns.get("session_id"), path)
    if arrival is not None:
        order = np.argsort(arrival, kind="stable")
        arrival = arrival[order] - arrival[order][0]
        prompt, output = prompt[order], output[order]
        shared = [shared[i] for i in order]
        sessions = None if sessions is None else [sessions[i] for i in order]
    return PrefixTrace(prompt, output, arrival, f"{kind} {path.name} ({n:,} rows)", shared, sessions)


def _sessions(values: list[Any] | None, path: Path) -> list[Any] | None:
    """The rows' 'session_id' (a string or a whole number; null where a row has none), or None without any."""
    if values is None or all(v is None for v in values):
        return None
    for i, v in enumerate(values):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            raise InputFileError(
                f"'session_id' must be a string or an integer, got {json.dumps(v)[:40]}",
                where=f"{path}, record {i + 1}",
            )
    return list(values)


def _count(value: Any, name: str, path: Path, i: int, number: bool = False):
    """A JSON count (whole, >= 0, at most MAX_REQUEST_TOKENS) or, with ``number``, a finite number >= 0.

    NaN and Infinity (which Python's json reads) are refused: a NaN arrival made the serving loop spin forever and
    an infinite length ended in an OverflowError; a fractional count is refused rather than truncated."""
    import math

    where = f"{path}, record {i + 1}"
    kind = "number" if number else "count"
    if value is None:
        raise InputFileError(f"'{name}' is missing", where=where)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not math.isfinite(value))
        or value < 0
    ):
        shown = json.dumps(value)[:40] if isinstance(value, (bool, list, dict)) else repr(value)[:40]
        raise InputFileError(f"'{name}' must be a finite {kind} >= 0, got {shown}", where=where)
    if number:
        most, unit = (MAX_ARRIVAL_S * 1e3, "ms") if name == "timestamp" else (MAX_ARRIVAL_S, "s")  # Mooncake: ms
        if value > most:  # a larger one overflowed the arrival arithmetic
            raise InputFileError(f"'{name}' is out of range: {value!r} (at most {most:.0e} {unit})", where=where)
        return value
    if isinstance(value, float) and not value.is_integer():
        raise InputFileError(f"'{name}' must be a whole number of tokens, got {value!r}", where=where)
    if value > MAX_REQUEST_TOKENS:
        raise InputFileError(f"'{name}' is too large: {value:,} tokens (at most {MAX_REQUEST_TOKENS:,})", where=where)
    return int(value)


def build_prompts(requests, shared_prefix_tokens: int = 0, variant_share: float = 0.0, seed: int = 0) -> list[Prompt]:
    """One Prompt per request: the source's own structure, else the synthetic system prompt, else all private."""
    import numpy as np

    P = requests.prompt_tokens.tolist()
    if requests.shared is not None:
        return [Prompt(p, content, kind) for p, (kind, content) in zip(P, requests.shared)]
    if not shared_prefix_tokens:
        return [Prompt(p) for p in P]
    rng = np.random.default_rng(seed)
    variant = rng.random(len(P)) < variant_share
    S = shared_prefix_tokens
    out = []
    for i, (p, v) in enumerate(zip(P, variant.tolist())):
        s = min(p, S)
        if v and s == S:
            pieces: list[tuple[object, int]] = [("system", S - 1), (("system-variant", i), 1)]
        else:
            pieces = [("system", s)]
        out.append(Prompt(p, [x for x in pieces if x[1] > 0]))
    return out
