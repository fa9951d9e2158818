"""Benchmark `kvtool analyze --json` on a synthetic 5-million-event trace against pyarrow's plain CSV read.

    python benchmarks/bench_analyze.py [--events 5000000] [--keep FILE.csv] [--repeat 3]
    python benchmarks/bench_analyze.py --keep FILE.parquet          # the same trace as Parquet, against pq.read_table
    python benchmarks/bench_analyze.py --generate FILE.csv [--events N]   # only write a trace
    python benchmarks/bench_analyze.py --fleet DIR [--files 50] [--events 50000000] [--workers 2]

``--fleet`` writes (or reuses) DIR/engine-NN.csv, ``--files`` engines of events/files events each (different
seeds; 50 M events in all unless ``--events`` says otherwise), and measures ``kvtool analyze DIR --json`` in this
process and on a local Dask cluster against one interpreter reading every file with pyarrow, the three
interleaved; it prints the ratios (best against best, and of the medians; memory of the fastest run, and
kvtool's highest peak) and the per-worker throughput used for the sizing in docs/analyze.md ("Sizing a fleet").

The trace is generated with numpy (seeded): ~20,000 requests arriving as a Poisson stream (about 2,000 of them
holding blocks at any moment), a log-normal prompt length, one decode `append` row per generated token (1 block
every 16 tokens), a shared 512-token system prompt reused by 30 % of the requests (plus short accidental matches),
physical `block_ids` recycled through a pool, free latency log-normal around 5 ms with a 2 % tail at 800 ms (the
seed article's late free), 5 % of requests reserving 64 blocks they never fill, and 0.5 % of requests never
freed (leaks).  Rows are written in time order.

Both measured commands run in a fresh interpreter (start-up and imports included), each `--repeat` times,
interleaved, after kvtool's bytecode is compiled once (as a package install does); the figure is the best wall
time and the peak RSS of the child (``resource.getrusage(RUSAGE_CHILDREN)`` measured in a fresh wrapper process
per run, so one run's peak does not mask the next).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BLOCK_SIZE = 16


def generate(path: Path, n_events: int = 5_000_000, seed: int = 0) -> dict:
    """Write a synthetic events CSV (schema 1) with about ``n_events`` rows; return its shape."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    step_s = 0.03  # one decode step of a continuously batched engine
    mean_output = 240
    n_req = max(1, n_events // (mean_output + 2))
    rate_per_s = n_req / max(20.0, n_req / 285.0)  # ~285 requests/s at scale; small traces span >= 20 s
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n_req))
    prompt = np.clip(rng.lognormal(np.log(500), 0.8, n_req), 8, 16000).astype(np.int64)
    output = np.clip(rng.geometric(1.0 / mean_output, n_req), 1, 4000).astype(np.int64)
    shares = rng.random(n_req) < 0.30
    short_hit = (~shares) & (rng.random(n_req) < 0.10)
    reused_tokens = np.where(shares, 512, np.where(short_hit, BLOCK_SIZE, 0))
    reused_tokens = np.minimum(reused_tokens, (prompt // BLOCK_SIZE) * BLOCK_SIZE)
    prompt = np.maximum(prompt, reused_tokens + 1)
    reused_blocks = reused_tokens // BLOCK_SIZE
    alloc_tokens = prompt - reused_tokens
    total_blocks = -(-(prompt + output) // BLOCK_SIZE)
    alloc_blocks = -(-prompt // BLOCK_SIZE) - reused_blocks
    # 5 % reserve 64 blocks (1,024 tokens) up front that they never fill: the article's idle reservations
    reserve = np.where(rng.random(n_req) < 0.05, 64, 0)
    alloc_blocks = alloc_blocks + reserve
    total_blocks = total_blocks + reserve
    leaked = rng.random(n_req) < 0.005
    latency_ms = np.where(rng.random(n_req) < 0.02, rng.normal(800, 40, n_req), rng.lognormal(np.log(5), 0.5, n_req))
    latency_ms = np.round(np.abs(latency_ms), 3)
    alloc_latency_ms = np.round(rng.lognormal(np.log(0.2), 0.4, n_req), 3)
    finish = arrival + 0.05 + output * step_s

    # decode appends: one row per generated token; a new block when the token crosses a block boundary
    req_of_tok = np.repeat(np.arange(n_req), output)
    first = np.repeat(np.cumsum(output) - output, output)
    step = np.arange(req_of_tok.size) - first + 1  # 1..output
    tok_pos = np.repeat(prompt, output) + step  # position of this token, 1-based
    new_block = ((tok_pos - 1) % BLOCK_SIZE) == 0
    app_ts = np.repeat(arrival + 0.05, output) + step * step_s

    # physical block ids: the shared prefix owns ids 0..31; everything else cycles through a pool
    pool = 400_000
    counter = [1000]

    def take(k: int) -> str:
        start = counter[0]
        counter[0] += k
        return " ".join(str(1000 + (start + i) % pool) for i in range(k))

    alloc_ids = [take(int(k)) for k in alloc_blocks]
    reuse_ids = [" ".join(str(i) for i in range(int(k))) for k in reused_blocks]
    app_ids = np.full(req_of_tok.size, "", dtype=object)
    nb_app = int(new_block.sum())
    app_ids[new_block] = [take(1) for _ in range(nb_app)]
    # free lists every block the request holds (prefix + allocated + appended)
    held = [[] for _ in range(n_req)]
    for r in range(n_req):
        held[r].append(reuse_ids[r])
        held[r].append(alloc_ids[r])
    idx_new = np.flatnonzero(new_block)
    for i, r in zip(idx_new.tolist(), req_of_tok[idx_new].tolist()):
        held[r].append(app_ids[i])
    free_ids = [" ".join(p for p in h if p) for h in held]

    rid = np.char.add("req-", np.arange(n_req).astype(str))
    parts = []

    def part(ts, ev, req, nb, nt, ids, lat):
        parts.append((ts, np.full(len(ts), ev, dtype=object), req, nb, nt, ids, lat))

    has_reuse = reused_blocks > 0
    part(
        arrival[has_reuse],
        "reuse",
        has_reuse.nonzero()[0],
        reused_blocks[has_reuse],
        reused_tokens[has_reuse],
        np.array(reuse_ids, dtype=object)[has_reuse],
        np.full(has_reuse.sum(), np.nan),
    )
    part(
        arrival + 1e-4,
        "allocate",
        np.arange(n_req),
        alloc_blocks,
        alloc_tokens,
        np.array(alloc_ids, dtype=object),
        alloc_latency_ms,
    )
    part(
        app_ts,
        "append",
        req_of_tok,
        new_block.astype(np.int64),
        np.ones(req_of_tok.size, np.int64),
        app_ids,
        np.full(req_of_tok.size, np.nan),
    )
    fr = ~leaked
    part(
        finish[fr] + latency_ms[fr] / 1000.0,
        "free",
        fr.nonzero()[0],
        total_blocks[fr],
        np.zeros(fr.sum(), np.int64),
        np.array(free_ids, dtype=object)[fr],
        latency_ms[fr],
    )
    ts = np.concatenate([p[0] for p in parts])
    order = np.argsort(ts, kind="stable")
    cols = {
        "ts": np.round(ts[order], 6),
        "event": np.concatenate([p[1] for p in parts])[order],
        "request_id": rid[np.concatenate([p[2] for p in parts])[order]],
        "num_blocks": np.concatenate([p[3] for p in parts])[order],
        "num_tokens": np.concatenate([p[4] for p in parts])[order],
        "block_ids": np.concatenate([p[5] for p in parts])[order],
        "latency_ms": np.concatenate([p[6] for p in parts])[order],
    }
    cols["num_tokens"] = np.where(cols["event"] == "free", -1, cols["num_tokens"])
    arrays = {k: pa.array(v) for k, v in cols.items()}
    arrays["latency_ms"] = pa.array(cols["latency_ms"], mask=np.isnan(cols["latency_ms"]))  # blank, not "nan"
    arrays["num_tokens"] = pa.array(cols["num_tokens"], mask=cols["num_tokens"] < 0)  # free: empty
    table = pa.table(arrays)
    if str(path).endswith(".parquet"):
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        # Parquet has lists: block ids as list<int64> (what a recorder writing Parquet stores), not text
        ids = pc.split_pattern(table.column("block_ids"), " ")
        ids = pc.if_else(pc.equal(table.column("block_ids"), ""), pa.scalar([], pa.list_(pa.string())), ids)
        table = table.set_column(table.schema.get_field_index("block_ids"), "block_ids", ids.cast(pa.list_(pa.int64())))
        pq.write_table(table, str(path))
    else:
        pacsv.write_csv(table, str(path), pacsv.WriteOptions(quoting_style="none"))
    return {"events": int(table.num_rows), "requests": int(n_req), "bytes": path.stat().st_size}


def _measure(argv: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + system) of one child process."""
    wrapper = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
        "wall = time.perf_counter() - t\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps([wall, u.ru_maxrss * 1024, u.ru_utime + u.ru_stime, p.returncode]))\n"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True, check=True)
    wall, rss, cpu, code = json.loads(out.stdout)
    if code != 0:
        raise SystemExit(f"{argv} exited with {code}")
    return wall, rss, cpu


def compile_kvtool() -> None:
    """Compile kvtool's bytecode once, as installing a package does: with PYTHONDONTWRITEBYTECODE set (as on these
    machines) every run would otherwise compile kvtool's sources again (~0.1 s) while pyarrow's are compiled."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO_ROOT / "kvtool")], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, help="events in all (default 5,000,000; --fleet: 50,000,000)")
    parser.add_argument("--keep", type=Path, help="write (or reuse) the trace at this path")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--generate", type=Path, help="only write a synthetic trace to this path and exit")
    parser.add_argument("--fleet", type=Path, help="benchmark a fleet: engine files in this folder")
    parser.add_argument("--files", type=int, default=50, help="--fleet: how many engine files")
    parser.add_argument("--workers", type=int, default=2, help="--fleet: Dask worker processes")
    args = parser.parse_args()
    if args.fleet:
        args.events = args.events or 50_000_000
        return fleet_benchmark(args)
    args.events = args.events or 5_000_000
    if args.generate:
        shape = generate(args.generate, args.events)
        print(f"wrote {args.generate}: {shape['events']:,} events, {shape['requests']:,} requests")
        return

    tmp = None
    if args.keep:
        path = args.keep
    else:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "events.csv"
    if not path.exists():
        t = time.perf_counter()
        shape = generate(path, args.events)
        print(
            f"generated {shape['events']:,} events, {shape['requests']:,} requests, "
            f"{shape['bytes'] / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
        )
    env_py = [sys.executable]
    if str(path).endswith(".parquet"):
        read = [*env_py, "-c", f"import pyarrow.parquet as q; q.read_table({str(path)!r})"]
    else:
        read = [*env_py, "-c", f"import pyarrow.csv as c; c.read_csv({str(path)!r})"]
    os.environ["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    analyze = [*env_py, "-m", "kvtool", "analyze", str(path), "--json"]
    compile_kvtool()
    measured: dict[str, list[tuple[float, int, float]]] = {"pyarrow_read": [], "kvtool_analyze_json": []}
    for _ in range(args.repeat):  # interleaved: a busy moment of the machine falls on both
        measured["pyarrow_read"].append(_measure(read))
        measured["kvtool_analyze_json"].append(_measure(analyze))
    results = {}
    for name, runs in measured.items():
        results[name] = {
            "wall_s": min(r[0] for r in runs),
            "peak_rss_mb": min(r[1] for r in runs) / 2**20,
            "cpu_s": min(r[2] for r in runs),
        }
    a, r = results["kvtool_analyze_json"], results["pyarrow_read"]
    results["time_ratio"] = a["wall_s"] / r["wall_s"]
    results["memory_ratio"] = a["peak_rss_mb"] / r["peak_rss_mb"]
    results["cpu_ratio"] = a["cpu_s"] / r["cpu_s"]
    results["machine"] = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    results["file_mb"] = path.stat().st_size / 1e6
    print(json.dumps(results, indent=2))
    if tmp is not None:
        tmp.cleanup()


def fleet_benchmark(args) -> None:
    """Many engines' files: pyarrow reading them all, kvtool in one process, kvtool on a local Dask cluster."""
    folder: Path = args.fleet
    folder.mkdir(parents=True, exist_ok=True)
    per_file = args.events // args.files
    for i in range(args.files):
        path = folder / f"engine-{i:02d}.csv"
        if not path.exists():
            shape = generate(path, per_file, seed=i)
            print(f"wrote {path}: {shape['events']:,} events", file=sys.stderr)
    files = sorted(str(p) for p in folder.glob("engine-*.csv"))[: args.files]
    os.environ["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    read = [sys.executable, "-c", f"import pyarrow.csv as c\nfor f in {files!r}: c.read_csv(f)"]
    kvtool = [sys.executable, "-m", "kvtool", "analyze", *files, "--json"]
    runs = {
        "pyarrow_read_all": read,
        "kvtool_in_process": kvtool,
        f"kvtool_dask_{args.workers}_workers": [*kvtool, "--workers", str(args.workers)],
    }
    results: dict[str, object] = {"files": len(files), "file_mb": sum(Path(f).stat().st_size for f in files) / 1e6}
    events = 0
    for f in files:  # rows = lines - 1 (the generator writes no blank line and no quoted newline)
        with open(f, "rb") as fh:
            events += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 24), b"")) - 1
    results["events"] = events
    compile_kvtool()
    measured: dict[str, list[tuple[float, int, float]]] = {name: [] for name in runs}
    for _ in range(args.repeat):  # interleaved, as for one file: a busy moment of the machine falls on each
        for name, argv in runs.items():
            measured[name].append(_measure(argv))
    for name, runs_of in measured.items():
        wall, rss, cpu = min(runs_of, key=lambda r: r[0])
        results[name] = {
            "wall_s": wall,
            "peak_rss_mb": rss / 2**20,
            "cpu_s": cpu,
            "events_per_s": events / wall,
            "wall_s_median": sorted(r[0] for r in runs_of)[len(runs_of) // 2],
            "peak_rss_mb_max": max(r[1] for r in runs_of) / 2**20,
        }
    process, read_all = results["kvtool_in_process"], results["pyarrow_read_all"]
    assert isinstance(process, dict) and isinstance(read_all, dict)
    results["time_ratio"] = process["wall_s"] / read_all["wall_s"]  # best against best, as for one file
    results["time_ratio_median"] = process["wall_s_median"] / read_all["wall_s_median"]
    results["memory_ratio"] = process["peak_rss_mb"] / read_all["peak_rss_mb"]
    results["memory_ratio_worst"] = process["peak_rss_mb_max"] / read_all["peak_rss_mb"]  # kvtool's highest peak
    results["per_worker_events_per_cpu_s"] = events / process["cpu_s"]
    results["machine"] = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
