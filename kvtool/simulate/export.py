"""The events of a serving simulation in `kvtool analyze`'s events schema (schema 1).

Per admission: a ``reuse`` row (prefix-cache blocks attached, with their tokens) when the lookup hit, and an
``allocate`` row (blocks taken for the first chunk, its tokens); per later scheduled chunk or decode step an
``append`` row (tokens scheduled, blocks taken); a ``free`` row when the request finishes (at the end of its last
step) or is preempted (at the start of the step that preempted it; a later admission of the same request_id is its
recompute).  Rows carry the step's start time, frees at a step's end its end time; rows are sorted by time, frees
first at a tie.  Blocks are counted per request, so a prefix block shared by several requests appears in each
(analyze's per-request view); the simulator's pool figures count it once.
"""

from __future__ import annotations

from pathlib import Path

from kvtool.core.errors import UsageError
from kvtool.events.load import APPEND, EVENT_TYPES, FREE
from kvtool.simulate.serving import ServeTrace


def _run_rows(run, requests, b: int):
    """One run's rows as numpy columns (ts, kind order, event code, request, blocks, tokens)."""
    import numpy as np

    start = np.asarray(run.step_start_s)
    end = np.asarray(run.step_end_s)
    rows = np.array(run.event_rows or [], dtype=np.int64).reshape(-1, 6)
    step, code, req, blocks, tokens, at_end = (rows[:, i] for i in range(6))
    ts = np.where(at_end == 1, end[step - 1], start[step - 1])
    kind = np.where(code == FREE, 0, 1 + (code != 2))  # frees first, then reuse, then the rest
    cols = [(ts, kind, code, requests[req], blocks, np.where(code == FREE, -1, tokens))]
    for first, k, rids, c0 in run.event_jumps or []:
        rid = np.repeat(np.asarray(rids, dtype=np.int64), k)
        j = np.tile(np.arange(k, dtype=np.int64), len(rids))
        c = np.repeat(np.asarray(c0, dtype=np.int64), k) + j
        cols.append(
            (
                start[first - 1 + j],
                np.full(len(rid), 2),
                np.full(len(rid), APPEND),
                requests[rid],
                (c % b == 0).astype(np.int64),
                np.ones(len(rid), dtype=np.int64),
            )
        )
    return [np.concatenate([c[i] for c in cols]) for i in range(6)]


def events_table(trace: ServeTrace, request_ids=None):
    """The simulated events as a pyarrow table in the events schema, sorted by time (frees first at a tie)."""
    import numpy as np
    import pyarrow as pa

    parts = []
    for run, index in zip(trace.runs, trace.request_index):
        if run.event_rows is None:
            raise ValueError("the simulation ran without record_events")
        parts.append(_run_rows(run, np.asarray(index, dtype=np.int64), trace.block_size))
    ts, kind, code, req, nblocks, ntok = (np.concatenate([p[i] for p in parts]) for i in range(6))
    order = np.lexsort((kind, ts))
    n_req = int(sum(len(i) for i in trace.request_index))
    names = pa.array(EVENT_TYPES)
    ids = pa.array(request_ids if request_ids is not None else [f"r{i}" for i in range(n_req)])
    ntok_sorted = ntok[order]
    return pa.table(
        {
            "ts": pa.array(ts[order]),
            "event": pa.DictionaryArray.from_arrays(pa.array(code[order].astype(np.int32)), names),
            "request_id": pa.DictionaryArray.from_arrays(pa.array(req[order].astype(np.int32)), ids),
            "num_blocks": pa.array(nblocks[order]),
            "num_tokens": pa.array(ntok_sorted, mask=ntok_sorted < 0),
            "block_size": pa.array(np.full(len(ts), trace.block_size, dtype=np.int64)),
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
