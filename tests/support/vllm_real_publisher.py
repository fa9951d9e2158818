"""Publish KV-event batches with vLLM's own ZmqEventPublisher, losing some on the live socket.

Run with a Python that has vLLM (see tests/vllm/test_vllm_live.py):

    VLLM_PYTHON tests/support/vllm_real_publisher.py --endpoint tcp://127.0.0.1:PORT --replay-endpoint 'tcp://*:RPORT' \
        --batches 6 --lose 2,3

Batches are real msgspec KVEventBatch objects (BlockStored with int hashes, BlockRemoved,
AllBlocksCleared); the batches named by --lose are kept in vLLM's replay buffer but never sent on
the PUB socket, as if lost on the way, so a subscriber has to fetch them from the replay ROUTER.
Prints the expected rows (without batch_ts) as one JSON list.
"""

from __future__ import annotations

import argparse
import json
import time

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher


def batch(seq: int) -> KVEventBatch:
    events = [
        BlockStored(
            block_hashes=[seq * 100 + 1, 2**64 - 1 - seq],
            parent_block_hash=None if seq == 0 else seq,
            token_ids=list(range(32)),
            block_size=16,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            session_id=f"s{seq % 2}",
        ),
        BlockRemoved(block_hashes=[seq], medium="GPU"),
    ]
    if seq % 3 == 2:
        events.append(AllBlocksCleared())
    return KVEventBatch(ts=time.time(), events=events)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--replay-endpoint", required=True)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--lose", default="2,3")
    args = parser.parse_args()
    lose = {int(x) for x in args.lose.split(",") if x}

    publisher = ZmqEventPublisher(0, endpoint=args.endpoint, replay_endpoint=args.replay_endpoint)
    real_send = publisher._pub.send_multipart

    def lossy_send(frames, *a, **k):
        if int.from_bytes(frames[1], "big") in lose:
            return None
        return real_send(frames, *a, **k)

    publisher._pub.send_multipart = lossy_send
    time.sleep(2.0)  # let the subscriber's connection and subscription arrive (PUB drops until then)
    expected = []
    for seq in range(args.batches):
        b = batch(seq)
        publisher.publish(b)
        for event in b.events:
            row = {"seq": seq, "dp_rank": 0, "type": type(event).__name__}
            row.update({f: getattr(event, f) for f in event.__struct_fields__})
            expected.append(row)
    time.sleep(4.0)  # serve replay requests (the publisher thread polls its ROUTER)
    publisher.shutdown()
    print(json.dumps(expected))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
