"""Throughput of vLLM KV-event analysis and capture.  Run: python benchmarks/vllm_events.py [EVENTS]

1. Analysis: a synthetic JSON-lines file shaped like vLLM's (BlockStored of 1-8 blocks with a parent
   link, BlockRemoved of evicted blocks, a 2,000-block cache) is analysed by analyze_vllm_events.
2. Capture: an in-process publisher sends batches of 4 events over tcp://127.0.0.1 to run_capture,
   which decodes and writes them; the figure is events written per second of capture.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvtool.vllm.events.analysis import analyze_vllm_events  # noqa: E402


def synthetic_file(path: Path, events: int, cache_blocks: int = 2000) -> None:
    rng = random.Random(0)
    cached: deque[int] = deque()
    next_hash = 1
    with path.open("w") as out:
        written = seq = 0
        while written < events:
            rows = []
            for _ in range(4):
                if len(cached) > cache_blocks:
                    rows.append({"type": "BlockRemoved", "block_hashes": [cached.popleft()], "medium": "GPU"})
                    continue
                n = rng.randint(1, 8)
                parent = cached[-1] if cached and rng.random() < 0.5 else None
                hashes = list(range(next_hash, next_hash + n))
                next_hash += n
                cached.extend(hashes)
                rows.append(
                    {
                        "type": "BlockStored",
                        "block_hashes": hashes,
                        "parent_block_hash": parent,
                        "token_ids": [0] * (16 * n),
                        "block_size": 16,
                        "lora_id": None,
                        "medium": "GPU",
                    }
                )
            for row in rows:
                out.write(json.dumps({"seq": seq, "batch_ts": seq * 0.01, "dp_rank": 0, **row}) + "\n")
            written += len(rows)
            seq += 1


def bench_analysis(events: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        synthetic_file(path, events)
        size_mb = path.stat().st_size / 1e6
        start = time.perf_counter()
        result = analyze_vllm_events(path)
        took = time.perf_counter() - start
    print(
        f"analysis: {result.counts.block_stored_events + result.counts.block_removed_events:,} events "
        f"({size_mb:.0f} MB) in {took:.2f} s = {events / took:,.0f} events/s"
    )


def bench_capture(batches: int) -> None:
    import msgpack
    import zmq

    from kvtool.vllm.events.capture import CaptureOptions, run_capture

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    event = {
        "type": "BlockStored",
        "block_hashes": [2**63 + 5],
        "parent_block_hash": None,
        "token_ids": [7] * 16,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        options = CaptureOptions(
            endpoint=f"tcp://127.0.0.1:{port}", output=Path(tmp) / "e.jsonl", max_events=batches * 4, duration_s=120
        )
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("r", run_capture(options)))
        thread.start()
        ctx = zmq.Context()
        pub = ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        pub.connect(options.endpoint)
        pub.poll(10000)
        pub.recv()
        start = time.perf_counter()
        for seq in range(batches):
            pub.send_multipart([b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), [event] * 4, 0])])
        thread.join()
        took = time.perf_counter() - start
        pub.close(linger=0)
        ctx.term()
    r = box["r"]
    print(
        f"capture: {r.events_written:,} events in {r.batches_written:,} batches in {took:.2f} s = "
        f"{r.events_written / took:,.0f} events/s (gaps {r.gaps}, malformed {r.malformed_frames})"
    )


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    bench_analysis(n)
    bench_capture(n // 4 // 4)
