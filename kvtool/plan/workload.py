"""The workload of ``kvtool plan``: how many requests at once, and how long each (given, or a trace's percentile)."""

from __future__ import annotations

import math
from pathlib import Path

from kvtool.core.errors import UsageError
from kvtool.plan.candidates import Workload


def workload_from(
    concurrency: int | None,
    seq_len: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    trace: Path | None = None,
    percentile: float | None = None,
) -> Workload:
    """``--concurrency N`` with one of ``--seq-len L``, ``--input-len I --output-len O`` (L = I + O) or
    ``--trace FILE --percentile P`` (L = the P-th percentile of the trace's prompt + output tokens)."""
    if concurrency is None or concurrency <= 0:
        raise UsageError(
            "--concurrency must be a number of requests greater than zero"
            + ("" if concurrency is None else f", not {concurrency}"),
            where="--concurrency",
            tip="e.g. --concurrency 64 --seq-len 16384",
        )
    forms = [
        name
        for name, given in (
            ("--seq-len", seq_len is not None),
            ("--input-len/--output-len", input_len is not None or output_len is not None),
            ("--trace", trace is not None),
        )
        if given
    ]
    if len(forms) != 1:
        raise UsageError(
            "give the request length one way: --seq-len, --input-len with --output-len, or --trace with --percentile"
            + (f" (got {', '.join(forms)})" if forms else ""),
            where="--seq-len",
        )
    if percentile is not None and trace is None:
        raise UsageError("--percentile needs --trace", where="--percentile")
    if trace is not None:
        return _from_trace(concurrency, trace, 99.0 if percentile is None else percentile)
    if seq_len is None:
        if input_len is None or output_len is None:
            raise UsageError("--input-len and --output-len go together", where="--input-len")
        for option, value in (("--input-len", input_len), ("--output-len", output_len)):
            if value < 0:
                raise UsageError(f"{option} must not be negative, not {value}", where=option)
        seq_len = input_len + output_len
        source = f"--input-len {input_len:,} + --output-len {output_len:,}"
    else:
        source = f"--seq-len {seq_len:,}"
    if seq_len <= 0:
        raise UsageError(f"the request length must be greater than zero, not {seq_len}", where="--seq-len")
    return Workload(concurrency, seq_len, source)


def _from_trace(concurrency: int, trace: Path, percentile: float) -> Workload:
    """The P-th percentile of the trace's request lengths, nearest rank (a length some request of the trace has)."""
    if not 0 < percentile <= 100:
        raise UsageError(f"--percentile must be in (0, 100], not {percentile:g}", where="--percentile")
    from kvtool.simulate.lengths import load_trace

    requests = load_trace(trace)
    lengths = sorted(int(x) for x in requests.prompt_tokens + requests.output_tokens)
    rank = max(1, math.ceil(percentile / 100 * len(lengths)))  # nearest-rank percentile
    seq_len = lengths[rank - 1]
    return Workload(concurrency, seq_len, f"p{percentile:g} of {requests.source} (nearest rank)")
