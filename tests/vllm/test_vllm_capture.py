"""kvtool capture against a real in-process ZMQ publisher speaking vLLM's wire protocol.

The publisher below follows vllm/distributed/kv_events.py (ZmqEventPublisher): three frames
(topic, seq as 8-byte big-endian, msgpack payload), payload [ts, [events...], dp_rank], and a
ROUTER replay socket answering [identity, b"", start_seq] with one [identity, b"", topic, seq,
payload] per buffered batch with seq >= start_seq, then [identity, b"", b"", -1 (8 bytes signed),
b""] (vLLM 0.32.0's installed source; earlier versions send no topic frame in replies).
It uses an XPUB socket (wire-identical to PUB for a SUB peer) only so the test can wait for the
subscription instead of sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from itertools import groupby

import msgpack  # the capture extra, in dev: imported, not skipped
import pytest
import zmq

from kvtool.core.errors import EXIT_MISSING_EXTRA
from kvtool.vllm.events.capture import CaptureOptions, resolve_role, run_capture, vllm_binds
from tests.support import DATA, REPO_ROOT

EVENTS = DATA / "vllm-events"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeVllmPublisher:
    """vLLM's publisher side: PUB-like socket that connects, ROUTER replay socket that binds."""

    def __init__(
        self, endpoint: str, replay_endpoint: str | None = None, topic: bytes = b"", replay_topic_frame: bool = True
    ):
        self.replay_topic_frame = replay_topic_frame
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.connect(endpoint)
        self.topic = topic
        self.buffer: dict[int, bytes] = {}
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        if replay_endpoint:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.bind(replay_endpoint)
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def wait_subscribed(self, timeout_s: float = 10.0) -> None:
        assert self.pub.poll(int(timeout_s * 1000)), "the capture never subscribed"
        self.pub.recv()  # b"\x01" + topic

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, empty, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            head = [client, b""] + ([self.topic] if self.replay_topic_frame else [])
            for seq in sorted(self.buffer):
                if seq >= start_seq:
                    self.router.send_multipart(head + [seq.to_bytes(8, "big"), self.buffer[seq]])
            self.router.send_multipart(head + [(-1).to_bytes(8, "big", signed=True), b""])

    def publish(self, seq: int, payload: bytes, *, live: bool = True) -> None:
        self.buffer[seq] = payload
        if live:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self.router.close(linger=0)
        self.pub.close(linger=0)
        self.ctx.term()


def start_capture(options: CaptureOptions):
    box: dict = {}
    stop = threading.Event()

    def target():
        try:
            box["result"] = run_capture(options, stop=stop)
        except Exception as err:  # surfaced by the test
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, stop, box


def recorded_batches(name: str):
    """The rows of a recorded file grouped back into (seq, ts, dp_rank, events) batches."""
    rows = [json.loads(line) for line in (EVENTS / name).read_text().splitlines() if line.strip()]
    out = []
    for seq, group in groupby(rows, key=lambda r: r["seq"]):
        group = list(group)
        events = [{k: v for k, v in r.items() if k not in ("seq", "batch_ts", "dp_rank")} for r in group]
        out.append((seq, group[0]["batch_ts"], group[0]["dp_rank"], events))
    return out


def test_role_follows_vllm_bind_rule():
    # vLLM binds when the endpoint has '*' or '::' (ZmqEventPublisher._socket_setup), else connects.
    assert vllm_binds("tcp://*:5557") and vllm_binds("tcp://[::]:5557")
    assert not vllm_binds("tcp://127.0.0.1:5557")
    assert resolve_role("tcp://127.0.0.1:5557", "auto") == ("bind", "tcp://127.0.0.1:5557")
    assert resolve_role("tcp://*:5557", "auto") == ("connect", "tcp://127.0.0.1:5557")
    assert resolve_role("tcp://localhost:5557", "connect") == ("connect", "tcp://localhost:5557")
    assert resolve_role("tcp://*:5557", "bind") == ("bind", "tcp://0.0.0.0:5557")


@pytest.mark.parametrize("replay_topic_frame", [True, False], ids=["vllm-0.32-replay", "older-replay"])
def test_capture_rebuilds_a_recorded_file_exactly_with_gap_replay_and_malformed_frames(tmp_path, replay_topic_frame):
    """Replaying a real vLLM recording over the wire gives back the same file, line for line.

    Batches 3 and 4 are kept off the live stream (only in the replay buffer); two malformed
    messages are sent between batches.  Expected: gaps 1, missed 2, recovered 2, malformed 2.
    """
    batches = recorded_batches("small-cache-evictions-incremental.jsonl")
    total_events = sum(len(b[3]) for b in batches)
    port, replay_port = free_port(), free_port()
    out = tmp_path / "events.jsonl"
    options = CaptureOptions(
        endpoint=f"tcp://127.0.0.1:{port}",
        output=out,
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
        max_events=total_events,
        duration_s=30,
    )
    thread, stop, box = start_capture(options)
    pub = FakeVllmPublisher(options.endpoint, options.replay_endpoint, replay_topic_frame=replay_topic_frame)
    try:
        pub.wait_subscribed()
        for seq, ts, dp_rank, events in batches:
            payload = msgpack.packb([ts, events, dp_rank])  # vLLM 0.32: array_like batch, tagged-map events
            pub.publish(seq, payload, live=seq not in (3, 4))
            if seq == 6:
                pub.send_raw([b"", (7).to_bytes(8, "big")])  # two frames, not three
                pub.send_raw([b"", (7).to_bytes(8, "big"), b"\xc1not msgpack"])
        thread.join(30)
    finally:
        stop.set()
        pub.close()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert out.read_text() == (EVENTS / "small-cache-evictions-incremental.jsonl").read_text()
    assert (result.events_written, result.batches_written) == (total_events, len(batches))
    assert (result.gaps, result.batches_missed, result.batches_recovered, result.batches_unrecovered) == (1, 2, 2, 0)
    assert pub.replay_requests == [3]
    assert result.malformed_frames == 2
    assert result.stopped_by == "max-events"
    kept = [json.loads(line) for line in open(result.malformed_file)]
    assert [len(k["frames_hex"]) for k in kept] == [2, 3]
    assert "expected 3" in kept[0]["reason"] and "not msgpack" in kept[1]["reason"]


def test_positional_and_map_forms_and_bytes_hashes(tmp_path):
    """Older vLLM (array_like events) and map batches decode to the same row shape; unknown fields are kept."""
    port = free_port()
    out = tmp_path / "events.jsonl"
    options = CaptureOptions(endpoint=f"tcp://127.0.0.1:{port}", output=out, max_events=4, duration_s=30, topic="kv")
    thread, stop, box = start_capture(options)
    pub = FakeVllmPublisher(options.endpoint, topic=b"kv")
    try:
        pub.wait_subscribed()
        # positional form, as in vLLM's examples/online_serving/kv_events_subscriber.py types
        pub.publish(
            0,
            msgpack.packb(
                [1.5, [["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None, "GPU"], ["AllBlocksCleared"]], 0]
            ),
        )
        # map batch (EventBatch without array_like), bytes hashes (sha256 block hashing)
        pub.publish(
            1,
            msgpack.packb(
                {
                    "ts": 2.5,
                    "events": [
                        {
                            "type": "BlockStored",
                            "block_hashes": [b"\x01\xff"],
                            "parent_block_hash": b"\x00\x02",
                            "token_ids": [5, 6],
                            "block_size": 2,
                            "lora_id": None,
                            "medium": "GPU",
                            "lora_name": None,
                            "x_new_field": 7,
                        },
                        {"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "GPU"},
                    ],
                    "data_parallel_rank": 1,
                }
            ),
        )
        thread.join(30)
    finally:
        stop.set()
        pub.close()
    assert "error" not in box, box.get("error")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # Fields left out on the wire (omit_defaults) come back as null, in vLLM 0.32's field order.
    later_stored = dict.fromkeys(
        [
            "lora_name",
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind",
            "kv_cache_spec_sliding_window",
            "locality",
            "ownership",
            "session_id",
        ]
    )
    later_removed = dict.fromkeys(["group_idx", "locality", "ownership"])
    assert rows == [
        {
            "seq": 0,
            "batch_ts": 1.5,
            "dp_rank": 0,
            "type": "BlockStored",
            "block_hashes": [11, 12],
            "parent_block_hash": None,
            "token_ids": [1, 2, 3, 4],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
            **later_stored,
        },
        {"seq": 0, "batch_ts": 1.5, "dp_rank": 0, "type": "AllBlocksCleared"},
        {
            "seq": 1,
            "batch_ts": 2.5,
            "dp_rank": 1,
            "type": "BlockStored",
            "block_hashes": ["01ff"],
            "parent_block_hash": "0002",
            "token_ids": [5, 6],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
            **later_stored,
            "x_new_field": 7,
        },
        {
            "seq": 1,
            "batch_ts": 2.5,
            "dp_rank": 1,
            "type": "BlockRemoved",
            "block_hashes": [18446744073709551615],
            "medium": "GPU",
            **later_removed,
        },
    ]
    assert list(rows[0]) == [
        "seq",
        "batch_ts",
        "dp_rank",
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        *later_stored,
    ]


def test_gap_with_dead_replay_endpoint_is_counted_unrecovered(tmp_path):
    port = free_port()
    out = tmp_path / "events.jsonl"
    options = CaptureOptions(
        endpoint=f"tcp://127.0.0.1:{port}",
        output=out,
        replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
        max_events=2,
        duration_s=30,
        replay_timeout_s=0.3,
    )
    thread, stop, box = start_capture(options)
    pub = FakeVllmPublisher(options.endpoint)
    try:
        pub.wait_subscribed()
        for seq in (0, 3):  # batches 1 and 2 never arrive and cannot be replayed
            pub.publish(seq, msgpack.packb([float(seq), [{"type": "AllBlocksCleared"}], 0]))
        thread.join(30)
    finally:
        stop.set()
        pub.close()
    result = box["result"]
    assert (result.gaps, result.batches_missed, result.batches_recovered, result.batches_unrecovered) == (1, 2, 0, 2)
    assert [json.loads(line)["seq"] for line in out.read_text().splitlines()] == [0, 3]
    # Why they were lost is said, not left for the user to guess.
    assert result.replay_error == f"replay of batches 1..2: {options.replay_endpoint} did not answer within 0.3 s"


def test_max_events_stops_after_the_whole_batch(tmp_path):
    port = free_port()
    out = tmp_path / "events.jsonl"
    options = CaptureOptions(endpoint=f"tcp://127.0.0.1:{port}", output=out, max_events=3, duration_s=30)
    thread, stop, box = start_capture(options)
    pub = FakeVllmPublisher(options.endpoint)
    try:
        pub.wait_subscribed()
        for seq in range(5):  # 2 events per batch: the count reaches 3 inside batch 1
            pub.publish(seq, msgpack.packb([float(seq), [{"type": "AllBlocksCleared"}] * 2, 0]))
        thread.join(30)
    finally:
        stop.set()
        pub.close()
    result = box["result"]
    assert (result.events_written, result.batches_written, result.stopped_by) == (4, 2, "max-events")
    assert len(out.read_text().splitlines()) == 4


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_full_disk_is_one_error_line_not_a_traceback(tmp_path):
    port = free_port()
    proc = _capture_process("--endpoint", f"tcp://127.0.0.1:{port}", "-o", "/dev/full", "--duration", "30")
    pub = FakeVllmPublisher(f"tcp://127.0.0.1:{port}")
    try:
        pub.wait_subscribed(timeout_s=30)
        pub.publish(0, msgpack.packb([1.0, [{"type": "AllBlocksCleared"}], 0]))
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
    assert proc.returncode == 2
    assert (stdout, stderr) == (
        "",
        "Error: writing failed after 0 events in 0 batches, which the file keeps: No space left on device (/dev/full)\n",
    )


def test_a_write_failure_mid_capture_names_what_the_file_keeps(tmp_path):
    from kvtool.core.errors import UsageError
    from kvtool.vllm.events.capture import _Writer

    class FailsOnThirdFlush:  # a disk that fills up after two batches
        def __init__(self, real):
            self.real, self.flushes = real, 0

        def write(self, text):
            return self.real.write(text)

        def flush(self):
            self.flushes += 1
            if self.flushes == 3:
                raise OSError(28, "No space left on device")
            self.real.flush()

        def close(self):
            self.real.close()

    out = tmp_path / "events.jsonl"
    writer = _Writer(out)
    writer.handle = FailsOnThirdFlush(writer.handle)
    batch = [1.0, [{"type": "AllBlocksCleared"}] * 2, 0]
    from kvtool.vllm.events.wire import decode_payload

    writer.batch(0, decode_payload(msgpack.packb(batch)))
    writer.batch(1, decode_payload(msgpack.packb(batch)))
    with pytest.raises(UsageError) as caught:
        writer.batch(2, decode_payload(msgpack.packb(batch)))
    writer.close()
    assert caught.value.one_line() == (
        f"writing failed after 4 events in 2 batches, which the file keeps: No space left on device ({out})"
    )
    assert [json.loads(line)["seq"] for line in out.read_text().splitlines()][:4] == [0, 0, 1, 1]


def _capture_process(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "kvtool", "capture", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_flushes_every_event_received(tmp_path, signum):
    port = free_port()
    out = tmp_path / "events.jsonl"
    proc = _capture_process("--endpoint", f"tcp://127.0.0.1:{port}", "-o", str(out), "--json")
    pub = FakeVllmPublisher(f"tcp://127.0.0.1:{port}")
    try:
        pub.wait_subscribed(timeout_s=30)
        sent = 0
        for seq in range(50):
            events = [
                {
                    "type": "BlockStored",
                    "block_hashes": [seq * 10 + i],
                    "parent_block_hash": None,
                    "token_ids": [0] * 16,
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                }
                for i in range(3)
            ]
            pub.publish(seq, msgpack.packb([time.time(), events, 0]))
            sent += len(events)
        time.sleep(1.0)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
    assert proc.returncode == 0, stderr
    assert stderr == ""
    summary = json.loads(stdout)
    assert summary["stopped_by"] == "signal"
    assert summary["events_written"] == sent == 150
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["block_hashes"][0] for r in rows] == [seq * 10 + i for seq in range(50) for i in range(3)]


def test_dead_endpoint_with_duration_reports_zero(run_cli, tmp_path):
    out = tmp_path / "events.jsonl"
    result = run_cli("capture", "--endpoint", f"tcp://*:{free_port()}", "-o", out, "--duration", "0.3", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["events_written"], summary["role"], summary["stopped_by"]) == (0, "connect", "duration")
    assert out.read_text() == ""


def test_table_output(run_cli, tmp_path):
    result = run_cli(
        "capture", "--endpoint", f"tcp://127.0.0.1:{free_port()}", "-o", tmp_path / "e.jsonl", "--duration", "0.2"
    )
    assert result.exit_code == 0
    assert "events written" in result.stdout and "duration" in result.stdout
    assert result.stderr.startswith("Warning: no events received (bind tcp://127.0.0.1:")


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:5557", "tcp://127.0.0.1", "5557", "tcp://a b:1"])
def test_invalid_endpoint_is_a_usage_error(run_cli, tmp_path, endpoint):
    result = run_cli("capture", "--endpoint", endpoint, "-o", tmp_path / "e.jsonl", "--duration", "1")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: --endpoint '{endpoint}' is not a ZMQ endpoint (--endpoint)\nTip: ")
    assert not (tmp_path / "e.jsonl").exists()


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_a_port_out_of_range_is_said(run_cli, tmp_path, port):
    # it was "is not a ZMQ endpoint", which tcp://127.0.0.1:99999 is in form
    endpoint = f"tcp://127.0.0.1:{port}"
    result = run_cli("capture", "--endpoint", endpoint, "-o", tmp_path / "e.jsonl", "--duration", "1")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"Error: --endpoint '{endpoint}': port {port} is not one of 1 to 65535 (--endpoint)\n"
        "Tip: use the port of vLLM's KVEventsConfig endpoint (vLLM's default tcp://*:5557)\n"
    )


def test_bad_values_are_usage_errors(run_cli, tmp_path):
    out = tmp_path / "e.jsonl"
    # each error names its option as the place (STYLE: "Error: <what> (<where>)")
    result = run_cli("capture", "-o", out, "--duration", "0")
    assert (result.exit_code, result.stderr) == (2, "Error: --duration must be positive, not 0.0 (--duration)\n")
    result = run_cli("capture", "-o", out, "--duration", "nan")
    assert (result.exit_code, result.stderr) == (2, "Error: --duration must be positive, not nan (--duration)\n")
    result = run_cli("capture", "-o", out, "--max-events", "0")
    assert (result.exit_code, result.stderr) == (2, "Error: --max-events must be positive, not 0 (--max-events)\n")
    result = run_cli("capture", "-o", out, "--role", "listen")
    assert (result.exit_code, result.stderr.splitlines()[0]) == (
        2,
        "Error: --role must be one of auto, bind, connect, not 'listen' (--role)",
    )
    result = run_cli("capture", "-o", out, "--replay-endpoint", "nope")
    assert result.stderr.splitlines()[0] == "Error: --replay-endpoint 'nope' is not a ZMQ endpoint (--replay-endpoint)"


def test_port_in_use_is_a_usage_error(run_cli, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "capture", "--endpoint", f"tcp://127.0.0.1:{port}", "-o", tmp_path / "e.jsonl", "--duration", "1"
        )
    assert result.exit_code == 2
    # The likely cause: vLLM binds this port itself (endpoint tcp://*:PORT) and we were told 127.0.0.1.
    assert result.stderr.splitlines() == [
        f"Error: cannot bind tcp://127.0.0.1:{port}: Address already in use (--endpoint)",
        "Tip: something already listens there: if vLLM binds this port (its endpoint has '*' or '::'), give "
        "--endpoint exactly as in its KVEventsConfig (tcp://*:PORT), or --role connect; or another capture runs",
    ]


def test_binding_an_address_of_another_host_says_to_connect(run_cli, tmp_path):
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this machine, so the bind fails.
    result = run_cli("capture", "--endpoint", "tcp://192.0.2.1:5557", "-o", tmp_path / "e.jsonl", "--duration", "1")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: cannot bind tcp://192.0.2.1:5557: Cannot assign requested address (--endpoint)",
        "Tip: kvtool binds endpoints that vLLM connects to, so the host must be an address of this machine; "
        "to reach a vLLM that binds on another host, use --endpoint tcp://192.0.2.1:5557 --role connect",
    ]
    assert not (tmp_path / "e.jsonl").exists()


def test_ipc_bind_in_a_missing_directory(run_cli, tmp_path):
    sock = tmp_path / "no-dir" / "kv.sock"
    result = run_cli("capture", "-e", f"ipc://{sock}", "--role", "bind", "-o", tmp_path / "e.jsonl", "--duration", "1")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"Error: cannot bind ipc://{sock}: No such file or directory")
    assert "addr=" not in lines[0] and lines[0].endswith("(--endpoint)")
    assert lines[1:] == ["Tip: create the directory of the ipc path first"]


def test_missing_pyzmq_gives_one_line_and_the_install_tip(run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zmq", None)
    result = run_cli("capture", "-o", tmp_path / "e.jsonl", "--duration", "1")
    assert result.exit_code == EXIT_MISSING_EXTRA
    assert (
        result.stderr
        == "Error: kvtool capture needs pyzmq, which is not installed\nTip: pip install 'kvtool[capture]'\n"
    )


def test_unwritable_output_is_a_usage_error(run_cli, tmp_path):
    target = tmp_path / "missing-dir" / "e.jsonl"
    result = run_cli("capture", "--endpoint", f"tcp://127.0.0.1:{free_port()}", "-o", target, "--duration", "1")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: cannot write the output file: No such file or directory ({target})")


def test_ipc_endpoint_vllm_binds_and_we_connect(tmp_path):
    """vLLM binds ipc:// endpoints (ZmqEventPublisher._is_bind_endpoint), so capture connects."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="kvc")  # ipc paths must stay short
    endpoint = f"ipc://{folder}/kv.sock"
    assert resolve_role(endpoint, "auto") == ("connect", endpoint)
    out = tmp_path / "events.jsonl"
    result = _one_batch_from_a_binding_publisher(endpoint, out)
    assert result.role == "connect"
    assert out.read_text() == '{"seq": 0, "batch_ts": 1.0, "dp_rank": 0, "type": "AllBlocksCleared"}\n'


def _one_batch_from_a_binding_publisher(endpoint: str, out, ipv6: bool = False):
    """vLLM's side when it binds: one batch once the capture has subscribed; returns the capture's result."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.IPV6, int(ipv6))
    pub.bind(endpoint)
    thread, stop, box = start_capture(CaptureOptions(endpoint=endpoint, output=out, max_events=1, duration_s=30))
    try:
        assert pub.poll(10000), "the capture never subscribed"
        pub.recv()
        pub.send_multipart([b"", (0).to_bytes(8, "big"), msgpack.packb([1.0, [{"type": "AllBlocksCleared"}], 0])])
        thread.join(30)
    finally:
        stop.set()
        pub.close(linger=0)
        ctx.term()
    return box["result"]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_endpoint(tmp_path):
    """vLLM binds an endpoint with '::' (its _is_bind_endpoint) and sets zmq.IPV6 for an IPv6 node address;
    without that option on our side libzmq's connect to [::1] silently never happens."""
    result = _one_batch_from_a_binding_publisher(f"tcp://[::1]:{free_port()}", tmp_path / "e.jsonl", ipv6=True)
    assert (result.role, result.events_written) == ("connect", 1)
