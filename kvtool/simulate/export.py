"""Per-request figures of a serving simulation, and its events in `kvtool analyze`'s events schema (schema 1).

Each running segment of a request becomes: a ``reuse`` row (prefix-cache blocks it attached, if any), an
``allocate`` row (its prefill), one ``append`` row per decode step (1 token; 1 block when the step crosses a block
boundary, else 0), and a ``free`` row at the end of its last step.  A preemption is a free followed, later, by a new
allocate under the same request_id.  Rows are sorted by time; at equal times frees come first.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.events.load import ALLOCATE, APPEND, EVENT_TYPES, FREE, REUSE
from kvtool.simulate.serving import ServeTrace, segment_integrals


@dataclasses.dataclass(frozen=True)
class RequestFigures:
    """Per-request figures with analyze's definitions (numpy arrays indexed by request; nan when never run)."""

    holding_time_s: Any  # time with blocks > 0, summed over segments
    block_seconds: Any  # integral of blocks held (shared prefix blocks counted for every request holding them)
    utilization: Any  # integral of tokens / (block_size x integral of blocks)
    peak_blocks: Any
    preemptions: Any


def request_figures(trace: ServeTrace, requests: int) -> RequestFigures:
    import numpy as np

    held, token_s, block_s, end_blocks = segment_integrals(trace)
    rid = trace.seg_request
    hold = np.bincount(rid, held, minlength=requests)
    blocks = np.bincount(rid, block_s, minlength=requests)
    tokens = np.bincount(rid, token_s, minlength=requests)
    peak = np.zeros(requests, dtype=np.int64)
    np.maximum.at(peak, rid, end_blocks)
    ran = np.bincount(rid, minlength=requests) > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        util = tokens / (trace.block_size * blocks)
    nan = np.full(requests, np.nan)
    return RequestFigures(
        holding_time_s=np.where(ran, hold, nan),
        block_seconds=np.where(ran, blocks, nan),
        utilization=np.where(ran & (blocks > 0), util, nan),
        peak_blocks=peak,
        preemptions=np.bincount(rid, trace.seg_preempted.astype(np.int64), minlength=requests),
    )


def events_table(trace: ServeTrace, request_ids=None):
    """The simulated events as a pyarrow table in the events schema, sorted by time (frees first at a tie)."""
    import numpy as np
    import pyarrow as pa

    b = trace.block_size
    start, end = trace.step_start_s, trace.step_end_s
    rid = trace.seg_request
    s0, s1, x0 = trace.seg_first_step, trace.seg_last_step, trace.seg_start_tokens
    reused = trace.seg_shared_blocks - trace.seg_shared_new
    b0 = -(-x0 // b)
    x_end = x0 + (s1 - s0)
    # appends: one per step after the first
    n_app = s1 - s0
    seg_of = np.repeat(np.arange(len(rid)), n_app)
    j = np.arange(int(n_app.sum())) - np.repeat(np.cumsum(n_app) - n_app, n_app) + 1
    step = s0[seg_of] + j
    tokens_now = x0[seg_of] + j
    crosses = (tokens_now - 1) % b == 0  # token k x b + 1 opens a new block
    has_reuse = reused > 0
    parts = [
        # (ts, kind order, event code, segment, num_blocks, num_tokens)
        (end[s1], 0, FREE, np.arange(len(rid)), -(-x_end // b), None),
        (start[s0][has_reuse], 1, REUSE, np.flatnonzero(has_reuse), reused[has_reuse], reused[has_reuse] * b),
        (start[s0], 2, ALLOCATE, np.arange(len(rid)), b0 - reused, x0 - reused * b),
        (start[step], 3, APPEND, seg_of, crosses.astype(np.int64), np.ones(len(step), dtype=np.int64)),
    ]
    ts = np.concatenate([p[0] for p in parts])
    kind = np.concatenate([np.full(len(p[3]), p[1]) for p in parts])
    code = np.concatenate([np.full(len(p[3]), p[2]) for p in parts])
    seg = np.concatenate([p[3] for p in parts])
    nblocks = np.concatenate([p[4] for p in parts])
    ntok = np.concatenate([np.full(len(p[3]), -1) if p[5] is None else p[5] for p in parts])
    order = np.lexsort((kind, ts))
    names = pa.array(EVENT_TYPES)  # indexed by analyze's event codes
    req = rid[seg[order]]
    ids = pa.array(request_ids if request_ids is not None else [f"r{i}" for i in range(len(trace.arrival_s))])
    ntok_sorted = ntok[order]
    return pa.table(
        {
            "ts": pa.array(ts[order]),
            "event": pa.DictionaryArray.from_arrays(pa.array(code[order].astype(np.int32)), names),
            "request_id": pa.DictionaryArray.from_arrays(pa.array(req.astype(np.int32)), ids),
            "num_blocks": pa.array(nblocks[order]),
            "num_tokens": pa.array(ntok_sorted, mask=ntok_sorted < 0),
            "block_size": pa.array(np.full(len(ts), b, dtype=np.int64)),
        }
    )


def export_paths(path: str | Path, block_sizes: list[int]) -> dict[int, Path]:
    """One file per block size: the path itself for one block size, else NAME-b16.csv beside it."""
    path = Path(path)
    if len(block_sizes) == 1:
        return {block_sizes[0]: path}
    suffix = "".join(path.suffixes) or ".csv"
    stem = path.name[: -len(suffix)] if path.name.endswith(suffix) else path.name
    return {b: path.with_name(f"{stem}-b{b}{suffix}") for b in block_sizes}


def write_events(trace: ServeTrace, path: Path) -> int:
    """Write the events file, in the format its name says (like analyze's loader reads): ``.parquet``, gzip-
    compressed CSV for ``.gz``, else CSV.  Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = events_table(trace)
    name = str(path).lower()
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            pq.write_table(table, str(path))
        else:
            with pa.output_stream(str(path), compression="gzip" if name.endswith(".gz") else None) as fh:
                fh.write((",".join(table.column_names) + "\n").encode())
                pacsv.write_csv(table, fh, write_options=pacsv.WriteOptions(include_header=False, quoting_style="none"))
    except (OSError, pa.ArrowException) as err:
        raise UsageError(
            f"cannot write the events file: {getattr(err, 'strerror', None) or err}", where=str(path)
        ) from None
    return table.num_rows
