"""The workload of ``kvtool plan``: how many requests at once, and how long each (given, or a trace's percentile);
or requests per second with a TTFT/TPOT target, for the serving simulation (:mod:`kvtool.plan.slo`)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from kvtool.core.errors import UsageError
from kvtool.estimate.request import EstimateRequest
from kvtool.plan.candidates import Workload

if TYPE_CHECKING:
    from kvtool.plan.result import SloTarget
    from kvtool.plan.slo import ServingAsk


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


DEFAULT_SERVING_REQUESTS = 1_000  # requests simulated for --input-len/--output-len (a trace: its rows)
DEFAULT_SLO_PERCENTILE = 99.0  # the tail a TTFT/TPOT target is usually stated at (simulate's --slo-ttft-ms: p99)


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """``kvtool plan``'s options of the serving form, as given (None: not given)."""

    qps: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    slo_percentile: float | None = None
    requests: int | None = None
    seed: int | None = None
    max_num_batched_tokens: int | None = None

    def given(self) -> list[str]:
        """The serving options given, by flag."""
        flags = (
            ("--qps", self.qps),
            ("--ttft-ms", self.ttft_ms),
            ("--tpot-ms", self.tpot_ms),
            ("--slo-percentile", self.slo_percentile),
            ("--requests", self.requests),
            ("--seed", self.seed),
        )
        return [flag for flag, value in flags if value is not None]


def serving_workload_from(
    base: EstimateRequest,
    serving: ServingOptions,
    concurrency: int | None,
    seq_len: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    trace: Path | None = None,
    percentile: float | None = None,
) -> tuple[Workload, ServingAsk]:
    """The requests per second form: ``--qps R`` with ``--input-len I --output-len O`` (``--requests`` of them) or
    ``--trace FILE`` (its requests, ``--requests`` sampled with replacement, and its timestamps unless ``--qps``),
    and ``--ttft-ms``/``--tpot-ms`` at ``--slo-percentile``.  The memory check is ``--concurrency`` (default 1) of the
    longest request; the simulation then decides."""
    from kvtool.plan.result import ServingWorkload
    from kvtool.plan.slo import ServingAsk
    from kvtool.simulate.run import SimulateOptions, arrivals_for

    if serving.qps is None and serving.ttft_ms is None and serving.tpot_ms is None:
        flag = serving.given()[0]
        raise UsageError(
            f"{flag} applies to the requests-per-second form (the serving simulation)",
            where=flag,
            tip="add --qps R with --ttft-ms T and/or --tpot-ms P",
        )
    if seq_len is not None or percentile is not None:
        flag = "--seq-len" if seq_len is not None else "--percentile"
        raise UsageError(
            f"{flag} is the concurrency form's: with --qps the simulation takes every request's prompt and output",
            where=flag,
            tip="give --input-len I --output-len O, or --trace FILE",
        )
    target = _target(serving)
    if concurrency is not None and concurrency <= 0:
        raise UsageError(f"--concurrency must be greater than zero, not {concurrency}", where="--concurrency")
    seed = 0 if serving.seed is None else serving.seed
    if seed < 0:
        raise UsageError(f"--seed must be 0 or more, not {seed}", where="--seed")
    if serving.requests is not None and serving.requests <= 0:
        raise UsageError(f"--requests must be greater than zero, not {serving.requests}", where="--requests")
    requests = _serving_requests(input_len, output_len, trace, serving.requests, seed)
    if serving.qps is None and requests.arrival_s is None:
        raise UsageError(
            "a TTFT/TPOT target needs an arrival rate: --qps R (requests per second)"
            + ("; the trace has no timestamps" if trace is not None else ""),
            where="--qps",
            tip="e.g. --qps 10 --ttft-ms 500",
        )
    if serving.qps is not None and not 0 < serving.qps < math.inf:
        raise UsageError(f"--qps must be a positive number, not {serving.qps:g}", where="--qps")
    if target.tpot_ms is not None and int(requests.output_tokens.max()) <= 1:
        raise UsageError(
            "--tpot-ms needs requests of 2 or more output tokens (TPOT is the time between output tokens)",
            where="--tpot-ms",
        )
    options = SimulateOptions(
        block_sizes=[base.block_size],
        serve=True,
        qps=serving.qps,
        seed=seed,
        max_num_seqs=base.max_num_seqs,
        max_num_batched_tokens=serving.max_num_batched_tokens,
        model=base.model,
        config=base.config,
        profile_dirs=base.profile_dirs,
        vllm_version=base.vllm_version,
    )
    longest = int(requests.lengths.max())
    workload = Workload(concurrency or 1, longest, f"the longest of {requests.source}")
    described = ServingWorkload(
        requests=requests.count,
        source=requests.source,
        arrivals=arrivals_for(requests, options).text,
        qps=serving.qps,
        seed=seed,
        block_size=base.block_size,
        target=target,
    )
    return workload, ServingAsk(requests, options, target, described)


def _target(serving: ServingOptions) -> SloTarget:
    from kvtool.plan.result import SloTarget

    if serving.ttft_ms is None and serving.tpot_ms is None:
        raise UsageError(
            "--qps needs a target to judge the configurations by: --ttft-ms and/or --tpot-ms",
            where="--qps",
            tip="e.g. --qps 10 --ttft-ms 500 --tpot-ms 50 (at --slo-percentile, default 99)",
        )
    for flag, value in (("--ttft-ms", serving.ttft_ms), ("--tpot-ms", serving.tpot_ms)):
        if value is not None and not 0 < value < math.inf:
            raise UsageError(f"{flag} must be a positive number of milliseconds, not {value:g}", where=flag)
    q = DEFAULT_SLO_PERCENTILE if serving.slo_percentile is None else serving.slo_percentile
    if not 0 < q <= 100:
        raise UsageError(f"--slo-percentile must be in (0, 100], not {q:g}", where="--slo-percentile")
    return SloTarget(serving.ttft_ms, serving.tpot_ms, q)


def _serving_requests(input_len: int | None, output_len: int | None, trace: Path | None, count: int | None, seed: int):
    """The requests to simulate: ``count`` of I + O tokens, or the trace's (``count`` sampled, as simulate does)."""
    import numpy as np

    from kvtool.simulate.lengths import RequestSet, load_trace, sample_requests

    if trace is not None:
        if input_len is not None or output_len is not None:
            raise UsageError(
                "give the requests one way: --input-len with --output-len, or --trace (got both)",
                where="--input-len",
            )
        requests = load_trace(trace)
        return sample_requests(requests, count, seed) if count is not None else requests
    if (input_len is None) != (output_len is None):
        raise UsageError("--input-len and --output-len go together", where="--input-len")
    if input_len is None or output_len is None:
        raise UsageError(
            "--qps needs the requests: --input-len I --output-len O, or --trace FILE",
            where="--input-len",
            tip="e.g. --qps 10 --input-len 1000 --output-len 200 --ttft-ms 500",
        )
    for option, value, least in (("--input-len", input_len, 1), ("--output-len", output_len, 1)):
        if value < least:
            raise UsageError(f"{option} must be {least} or more with --qps, not {value}", where=option)
    n = DEFAULT_SERVING_REQUESTS if count is None else count
    return RequestSet(
        np.full(n, input_len, dtype=np.int64),
        np.full(n, output_len, dtype=np.int64),
        None,
        f"{n:,} requests of --input-len {input_len:,} + --output-len {output_len:,} tokens",
    )
