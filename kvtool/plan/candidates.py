"""The workload a plan must hold and the grid of candidate deployments it tries (``kvtool plan``'s options, parsed).

A candidate is one ``vllm serve`` configuration: a GPU profile, a tensor- and a pipeline-parallel size, a KV-cache
dtype, a gpu_memory_utilization and a quantization, on one vLLM release.  The grid is the product of the lists
given; a candidate over ``--max-gpus`` is left out and counted, never dropped silently.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from kvtool.core.errors import UsageError

DEFAULT_TP_RANGE = "1-8"  # the GPUs of one node
DEFAULT_PP = "1"


@dataclasses.dataclass(frozen=True)
class Workload:
    """What must fit at once: ``concurrency`` requests of ``seq_len`` tokens each (prompt and output)."""

    concurrency: int
    seq_len: int  # tokens per request, prompt + output: vLLM's max_model_len for the plan
    source: str  # where the length came from, in words ("--seq-len 16384", "p99 of trace x.csv (1,000 requests)")


class Candidate(NamedTuple):
    """One configuration to try (a NamedTuple: a 2,000-candidate grid is built in well under a millisecond)."""

    gpu: str  # GPU profile name as given (resolved through kvtool.estimate.profiles)
    tp: int
    pp: int
    kv_dtype: str  # vLLM's --kv-cache-dtype
    gpu_memory_utilization: float
    quantization: str | None  # vLLM's --quantization; None: the checkpoint as it is

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp


@dataclasses.dataclass(frozen=True)
class Grid:
    """Every candidate of the options, and how many ``--max-gpus`` left out."""

    candidates: tuple[Candidate, ...]
    over_max_gpus: int  # candidates left out for needing more than --max-gpus GPUs


def parse_sizes(text: str, option: str, *, powers_of_two_in_ranges: bool) -> tuple[int, ...]:
    """``"1,2,4"`` or ``"1-8"`` (with ``powers_of_two_in_ranges``, the powers of two in the range: 1, 2, 4, 8; else
    every whole number in it); each value once, in the order given."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise UsageError(
                f"{option} takes whole numbers separated by commas or a range such as 1-8, not {text!r}", where=option
            ) from None
        if first <= 0 or last < first:
            raise UsageError(f"{option} {part} is not a range of sizes greater than zero", where=option)
        if dash and powers_of_two_in_ranges:
            values.extend(2**k for k in range(math.ceil(math.log2(first)), int(math.log2(last)) + 1))
        else:
            values.extend(range(first, last + 1))
    return tuple(dict.fromkeys(values))


def parse_names(text: str, option: str) -> tuple[str, ...]:
    """A comma list of names, each once; an empty item is refused (``--gpu H100,,L40S``)."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise UsageError(f"{option} has an empty item in {text!r}", where=option)
    return tuple(dict.fromkeys(names))


def parse_utilizations(text: str) -> tuple[float, ...]:
    """``--gpu-memory-utilization 0.85,0.9,0.95``: each in (0, 1], as vLLM takes it."""
    option = "--gpu-memory-utilization"
    values = []
    for part in parse_names(text, option):
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f"{option} takes fractions such as 0.9, not {part!r}", where=option) from None
        if not 0 < value <= 1:
            raise UsageError(f"{option} must be in (0, 1], not {part}", where=option)
        values.append(value)
    return tuple(dict.fromkeys(values))


def build_grid(
    gpus: Sequence[str],
    tps: Sequence[int],
    pps: Sequence[int],
    kv_dtypes: Sequence[str],
    utilizations: Sequence[float],
    quantizations: Sequence[str | None],
    max_gpus: int | None = None,
) -> Grid:
    """The product of the lists, in that order, less the candidates needing more than ``max_gpus`` GPUs."""
    if max_gpus is not None and max_gpus <= 0:
        raise UsageError(f"--max-gpus must be greater than zero, not {max_gpus}", where="--max-gpus")
    kept: list[Candidate] = []
    over = 0
    for gpu, tp, pp, kv, util, quant in itertools.product(gpus, tps, pps, kv_dtypes, utilizations, quantizations):
        if max_gpus is not None and tp * pp > max_gpus:
            over += 1
            continue
        kept.append(Candidate(gpu, tp, pp, kv, util, quant))
    return Grid(tuple(kept), over)
