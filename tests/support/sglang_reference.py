"""Record SGLang's own radix cache and KV-event publisher on hand traces (the reference for kvtool's port).

Run with a Python that can import SGLang (``sglang.srt.mem_cache.radix_cache`` imports on CPU with torch; see
tests/data/sglang-radix/README.md for the exact environment)::

    python -m tests.support.sglang_reference --out tests/data

It writes ``sglang-radix/traces.json`` (each trace's operations and what SGLang's ``RadixCache`` answered) and
``sglang-events/*.frames.jsonl`` (the ``(topic, seq, payload)`` frames SGLang's ``ZmqEventPublisher`` would send:
the payload is ``msgspec.msgpack.Encoder().encode(KVEventBatch(...))``, exactly as in its ``_publisher_thread``).
No part of kvtool is imported here.
"""

from __future__ import annotations

import argparse
import json
import time
from array import array
from pathlib import Path

import msgspec
import torch
from sglang.srt.disaggregation.kv_events import KVEventBatch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey


class _Allocator:
    """The two members RadixCache uses of its token_to_kv_pool_allocator when simulated: device and free_segment."""

    device = "cpu"

    def __init__(self):
        self.freed = 0

    def free_segment(self, indices, start_pos=0):
        self.freed += len(indices)


# Each trace: page size and a list of operations. Ops: ["insert", tokens], ["match", tokens], ["lock", tokens],
# ["unlock", tokens], ["evict", num_tokens], ["reset"]. Tokens are small ints so the traces can be checked by hand.
TRACES = {
    "page1-branches": {
        "page_size": 1,
        "ops": [
            ["insert", [1, 2, 3]],
            ["insert", [1, 2, 3]],
            ["insert", [1, 2, 4, 5]],
            ["insert", [1, 2, 4, 5, 6, 7]],
            ["insert", [8, 9, 10, 11, 12]],
            ["match", [1, 2, 3, 13, 14]],
            ["match", [1, 2, 4, 5, 6]],
            ["match", [9]],
            ["match", [8, 9, 10, 99]],
        ],
    },
    "page4-alignment": {
        "page_size": 4,
        "ops": [
            ["insert", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]],
            ["match", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]],
            ["match", [1, 2, 3, 4, 5, 6, 7, 0]],
            ["match", [1, 2, 3]],
            ["insert", [1, 2, 3, 4, 5, 6, 0, 0]],
            ["match", [1, 2, 3, 4, 5, 6, 0, 0, 1]],
            ["match", [1, 2, 3, 4, 5, 6, 7, 8]],
        ],
    },
    "page1-lru-evict": {
        "page_size": 1,
        "ops": [
            ["insert", [1, 2, 3, 4]],
            ["insert", [1, 2, 5, 6]],
            ["insert", [7, 8, 9]],
            ["match", [1, 2, 3, 4]],
            ["evict", 2],
            ["match", [1, 2, 5, 6]],
            ["match", [7, 8, 9]],
            ["lock", [1, 2, 3, 4]],
            ["evict", 10],
            ["match", [1, 2, 3, 4]],
            ["unlock", [1, 2, 3, 4]],
            ["evict", 3],
            ["match", [1, 2, 3, 4]],
        ],
    },
    "page2-evict-split": {
        "page_size": 2,
        "ops": [
            ["insert", [1, 2, 3, 4, 5, 6]],
            ["insert", [1, 2, 3, 4, 7, 8, 9]],
            ["insert", [10, 11]],
            ["match", [10, 11]],
            ["match", [1, 2, 3, 4, 7, 8]],
            ["evict", 1],
            ["evict", 4],
            ["match", [1, 2, 3, 4, 5, 6]],
            ["insert", [1, 2, 3, 4, 5, 6]],
            ["reset", None],
            ["match", [1, 2]],
        ],
    },
}


def _key(tokens):
    return RadixKey(token_ids=array("q", tokens))


def run_trace(name, spec, out_events: Path):
    allocator = _Allocator()
    cache = RadixCache.create_simulated(
        mock_allocator=allocator, page_size=spec["page_size"], enable_kv_cache_events=True
    )
    locks = {}
    results = []
    frames = []
    encoder = msgspec.msgpack.Encoder()
    seq = 0

    def publish():
        # SchedulerKvEventsPublisher.publish_kv_events: take the tree's events, one KVEventBatch per step;
        # ZmqEventPublisher.publish fills attn_dp_rank; _publisher_thread encodes and numbers the batch.
        nonlocal seq
        events = cache.take_events()
        if events:
            batch = KVEventBatch(ts=1_767_000_000.0 + seq, events=events)
            batch.attn_dp_rank = 0
            frames.append(
                {
                    "topic": "",
                    "seq": seq,
                    "payload_hex": encoder.encode(batch).hex(),
                    # SGLang's own reading of the payload: msgspec's typed decode, as plain values
                    "sglang_decoded": msgspec.to_builtins(
                        msgspec.msgpack.Decoder(KVEventBatch).decode(encoder.encode(batch))
                    ),
                }
            )
            seq += 1

    publish()  # the AllBlocksCleared of reset() at construction
    for op, arg in spec["ops"]:
        time.sleep(0.002)  # distinct time.monotonic() access times, so LRU order is the op order
        if op == "insert":
            res = cache.insert(InsertParams(key=_key(arg)))
            answer = {"prefix_len": res.prefix_len}
        elif op == "match":
            res = cache.match_prefix(MatchPrefixParams(key=_key(arg)))
            answer = {"prefix_len": res.device_prefix_len}
        elif op == "lock":
            node = cache.match_prefix(MatchPrefixParams(key=_key(arg))).last_device_node
            locks[tuple(arg)] = node
            answer = {"delta": cache.inc_lock_ref(node).delta}
        elif op == "unlock":
            answer = {"delta": cache.dec_lock_ref(locks.pop(tuple(arg))).delta}
        elif op == "evict":
            answer = {"evicted": cache.evict(EvictParams(num_tokens=arg)).num_tokens_evicted}
        elif op == "reset":
            cache.reset()
            answer = {}
        else:
            raise ValueError(op)
        answer.update(
            op=op,
            arg=arg,
            evictable_size=cache.evictable_size(),
            protected_size=cache.protected_size(),
            total_size=cache.total_size(),
        )
        results.append(answer)
        publish()
    out_events.write_text("".join(json.dumps(f) + "\n" for f in frames))
    return {"page_size": spec["page_size"], "steps": results, "frames_file": out_events.name}


def reencode_positional(module_path: Path, frames_path: Path) -> None:
    """Decode each batch with the current classes and encode it again with an older release's (whose events are
    msgspec ``array_like``: a positional array, tag first), keeping the fields that release declares."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_kv_events", module_path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    out = []
    for line in frames_path.read_text().splitlines():
        frame = json.loads(line)
        batch = decoder.decode(bytes.fromhex(frame["payload_hex"]))
        events = []
        for event in batch.events:
            cls = getattr(old, type(event).__name__)
            names = [f for f in cls.__struct_fields__]
            events.append(cls(**{n: getattr(event, n) for n in names}))
        old_batch = old.KVEventBatch(ts=batch.ts, events=events, attn_dp_rank=batch.attn_dp_rank)
        payload = encoder.encode(old_batch)
        decoded = msgspec.to_builtins(msgspec.msgpack.Decoder(old.KVEventBatch).decode(payload))
        out.append({**frame, "payload_hex": payload.hex(), "sglang_decoded": decoded})
    target = frames_path.with_name(frames_path.name.replace(".frames", ".positional.frames"))
    target.write_text("".join(json.dumps(f) + "\n" for f in out))


def main():
    import sglang

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--positional-kv-events",
        type=Path,
        help="an older release's sglang/srt/disaggregation/kv_events.py (array_like events, e.g. 0.5.10): the "
        "page2-evict-split batches are re-encoded with its classes into page2-evict-split.positional.frames.jsonl",
    )
    args = parser.parse_args()
    traces = {}
    for name, spec in TRACES.items():
        traces[name] = run_trace(name, spec, args.out / "sglang-events" / f"{name}.frames.jsonl")
    if args.positional_kv_events:
        reencode_positional(args.positional_kv_events, args.out / "sglang-events" / "page2-evict-split.frames.jsonl")
    record = {
        "recorded_with": {"sglang": sglang.__version__, "torch": torch.__version__, "msgspec": msgspec.__version__},
        "traces": traces,
    }
    (args.out / "sglang-radix" / "traces.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
