"""The recorder's memory over one million requests: bounded by the requests in flight, not by the requests seen.

The recorder and its writer thread run as inside vLLM (kvtool.vllm.recorder: Recorder, RowWriter, the scheduler
hooks), driven through the miniature of vLLM's scheduler that the tests use (tests/support/fake_vllm.py): each request
is admitted with 6 tokens; each engine step admits --per-step new requests, appends one token to every running
request and finishes the --per-step oldest, so --in-flight requests run at any time (appends recorded as
``--block-appends-only`` records them).  Prints the process's resident memory at checkpoints, after the writer
drained what it was handed; flat figures past the first checkpoint are the aim.

    python benchmarks/bench_recorder_memory.py [--requests 1000000] [--in-flight 256] [--per-step 8]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtool.vllm.recorder.hooks import Hooks  # noqa: E402
from kvtool.vllm.recorder.recorder import Recorder, RecorderOptions  # noqa: E402
from kvtool.vllm.recorder.writer import RowWriter, output_paths  # noqa: E402
from tests.support.fake_vllm import KVCacheManager, Request, RequestStatus, Scheduler  # noqa: E402


def _resident_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _report(requests: int, writer: RowWriter) -> None:
    while not writer._work.empty():  # let the writer drain what it was handed
        time.sleep(0.01)
    time.sleep(0.1)
    gc.collect()
    print(f"{requests:>9,}  {_resident_mib():>14.1f}  {writer.rows_written:>12,}  {len(writer._ids):>15,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--per-step", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        manager = KVCacheManager(num_blocks=4 * args.in_flight + 16, block_size=4)
        scheduler = Scheduler(manager)
        writer = RowWriter(output_paths(Path(scratch) / "e.csv", 0, 1), 4, randomized_ids=True, hybrid=False)
        recorder = Recorder(RecorderOptions(path="e.csv", appends="blocks"), writer.put, spare=writer.spare)
        Hooks(scheduler, recorder, RequestStatus.FINISHED_ABORTED).install(())
        checkpoints = {args.requests // 10 * k for k in (1, 2, 5, 10)}
        running: list[Request] = []
        started = time.perf_counter()
        print("requests  resident (MiB)  rows written  writer ids held")
        admitted = 0
        while admitted < args.requests:
            scheduler.schedule()
            for _ in range(args.per_step):
                admitted += 1
                request = Request(f"req-{admitted}-0123abcd", 6)  # vLLM's random 8-hex suffix, stripped by the writer
                manager.allocate_slots(request, 6)
                running.append(request)
                if admitted in checkpoints:
                    _report(admitted, writer)
            for request in running:
                manager.allocate_slots(request, 1)
            while len(running) > args.in_flight:
                scheduler.finish(running.pop(0))
            scheduler.update_from_output()
        writer.close()
        elapsed = time.perf_counter() - started
        print(f"{args.requests:,} requests in {elapsed:.1f} s; writer ids kept at the end: {len(writer._ids)}")


if __name__ == "__main__":
    main()
