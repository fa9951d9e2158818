"""Check that a fleet run equals the single-file runs, figure for figure, on a folder of engine files.

    python benchmarks/fleet_equality.py DIR [--workers 2]

For every file: ``analyze_events(load_events(file))`` (the single-process run) against the fleet's pool of that
file, section by section (JSON of the dataclasses) and column by column of the per-request table; the fleet's
request table against the concatenation of the single runs'; and, with ``--workers``, the Dask run's JSON against
the in-process run's.  Prints one line per check and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SECTIONS = ("summary", "pool", "prefix_reuse", "long_requests", "anomalies", "late_frees")


def main() -> int:
    import numpy as np

    from kvtool.core.jsonable import to_jsonable
    from kvtool.events.analysis import REQUEST_COLUMNS, analyze_events
    from kvtool.events.fleet import AnalyzeOptions, analyze_fleet
    from kvtool.events.load import load_events
    from kvtool.events.render import fleet_to_json
    from kvtool.events.sources import find_pool_files

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    units = find_pool_files([str(args.folder)])
    t = time.perf_counter()
    fleet = analyze_fleet(units, AnalyzeOptions())
    print(
        f"fleet in-process: {len(fleet.pools)} pools, {fleet.summary.events:,} events, {time.perf_counter() - t:.1f} s"
    )
    bad = 0
    columns: dict[str, list] = {name: [] for name in REQUEST_COLUMNS}
    for pool in fleet.pools:
        (path,) = pool.paths
        single = analyze_events(load_events(path))
        for name in SECTIONS:
            if json.dumps(to_jsonable(getattr(single, name))) != json.dumps(to_jsonable(getattr(pool.analysis, name))):
                print(f"DIFFERENT {pool.instance} {name}")
                bad += 1
        for name in REQUEST_COLUMNS:
            columns[name].append(single.requests.column(name))
    for name in REQUEST_COLUMNS:
        mine = fleet.requests.request_ids if name == "request_id" else fleet.requests.values[name]
        if name == "request_id":
            same = tuple(r for part in columns[name] for r in part) == mine
        else:
            same = np.array_equal(np.concatenate(columns[name]), mine, equal_nan=mine.dtype.kind == "f")
        bad += not same
    print(f"pools equal to their single-file runs, request table equal to the concatenation: {bad == 0}")
    if args.workers:
        t = time.perf_counter()
        dask = analyze_fleet(units, AnalyzeOptions(), workers=args.workers)
        same = json.dumps(fleet_to_json(dask)) == json.dumps(fleet_to_json(fleet))
        same &= all(
            np.array_equal(dask.requests.values[k], v, equal_nan=v.dtype.kind == "f")
            for k, v in fleet.requests.values.items()
        )
        print(f"Dask ({args.workers} workers, {time.perf_counter() - t:.1f} s) equal to in-process: {same}")
        bad += not same
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
