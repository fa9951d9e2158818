"""Decoding of vLLM KV-event wire batches (vllm/distributed/kv_events.py's msgspec structs)."""

from __future__ import annotations

import json

import msgpack  # the capture extra, in dev: imported, not skipped
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.vllm.events.wire import (
    END_SEQ,
    MalformedFrame,
    batch_rows,
    decode_payload,
    decode_seq,
    encode_seq,
    row_to_json,
)


def test_sequence_numbers():
    assert decode_seq((5).to_bytes(8, "big")) == 5
    # vLLM's end-of-replay marker: (-1).to_bytes(8, "big", signed=True)
    assert decode_seq(b"\xff" * 8) == END_SEQ == -1
    assert decode_seq(encode_seq(2**40)) == 2**40
    with pytest.raises(MalformedFrame, match="sequence frame has 4 bytes"):
        decode_seq(b"\x00" * 4)


def test_array_batch_without_dp_rank():
    # EventBatch omits data_parallel_rank when it holds its default (omit_defaults=True)
    batch = decode_payload(msgpack.packb([3.25, [["AllBlocksCleared"]]]))
    assert (batch.ts, batch.dp_rank, batch.events) == (3.25, None, ({"type": "AllBlocksCleared"},))
    assert batch_rows(9, batch) == [{"seq": 9, "batch_ts": 3.25, "dp_rank": None, "type": "AllBlocksCleared"}]


def test_unknown_event_types_are_kept():
    batch = decode_payload(msgpack.packb([1, [["BlockMoved", 1, 2], {"type": "Future", "x": b"\x0a"}], 0]))
    assert batch.events == ({"type": "BlockMoved", "fields": [1, 2]}, {"type": "Future", "x": "0a"})


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xc1", "payload is not msgpack"),
        (msgpack.packb(5), "not a [ts, events, dp_rank] batch"),
        (msgpack.packb(["x", [], 0]), "timestamp is not a finite number"),
        (msgpack.packb([float("nan"), [], 0]), "timestamp is not a finite number"),
        (msgpack.packb([1.0, [{"type": "X", "v": float("inf")}], 0]), "non-finite number inf"),
        (msgpack.packb([1.0, [{"type": "X", "v": msgpack.ExtType(1, b"")}], 0]), "unexpected ExtType value"),
        (msgpack.packb([1.0, 5, 0]), "events is not an array"),
        (msgpack.packb([1.0, [], "r"]), "data_parallel_rank is not an integer"),
        (msgpack.packb([1.0, [5], 0]), "event is a int"),
        (msgpack.packb([1.0, [{"block_hashes": []}], 0]), "no string 'type' tag"),
        (msgpack.packb([1.0, [[7, 1]], 0]), "does not start with a string tag"),
    ],
)
def test_malformed_payloads(payload, reason):
    with pytest.raises(MalformedFrame, match=reason.replace("[", r"\[").replace("]", r"\]")):
        decode_payload(payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(data):
    try:
        decode_payload(data)
    except MalformedFrame:
        pass


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
events = st.one_of(
    msgpack_values,
    st.builds(
        lambda tag, rest: [tag, *rest],
        st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "X"]),
        st.lists(msgpack_values, max_size=16),
    ),
    st.builds(
        lambda tag, rest: {"type": tag, **rest},
        st.sampled_from(["BlockStored", "BlockRemoved", "Y"]),
        st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(msgpack_values, st.tuples(msgpack_values, st.lists(events, max_size=4), msgpack_values).map(list)))
def test_any_msgpack_value_decodes_to_strict_json_or_is_malformed(value):
    try:
        batch = decode_payload(msgpack.packb(value))
    except MalformedFrame:
        return
    for row in batch_rows(0, batch):
        assert json.loads(row_to_json(row))["type"] == row["type"]
