"""Capture a running vLLM's KV-cache events from its ZMQ publisher into a JSON-lines file.

The socket roles follow vLLM's ``ZmqEventPublisher._socket_setup``: vLLM *binds* its PUB socket
when the endpoint contains ``*`` or ``::`` (or is ``ipc://`` / ``inproc://``) and *connects*
otherwise, so by default we do the opposite (``resolve_role``).  Gaps in the batch sequence
numbers are filled from vLLM's replay ROUTER socket when one is given (see
:mod:`kvtool.vllm.events.wire` for the frames).  Every decoded batch is written and flushed as it
arrives, so a stop by signal, ``--duration`` or ``--max-events`` loses nothing received; frames
that are not KV-event batches are counted and kept, as hex, in a ``.malformed.jsonl`` side file.

pyzmq and msgpack are the optional extra ``capture``; they are imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO

from kvtool.core.errors import UsageError
from kvtool.core.extras import require
from kvtool.core.redact import redact_url
from kvtool.vllm.events.wire import (
    END_SEQ,
    MalformedFrame,
    batch_rows,
    decode_payload,
    decode_seq,
    encode_seq,
    row_to_json,
)

ROLES = ("auto", "bind", "connect")
_TCP = re.compile(
    r"^tcp://(?P<host>\*|\[[0-9A-Fa-f:.*]+\]|[A-Za-z0-9_.\-]+|[0-9A-Fa-f:]*::[0-9A-Fa-f:]*):(?P<port>\d+)$"
)
MAX_MALFORMED_REASONS = 5  # distinct reasons kept in the result


@dataclasses.dataclass(frozen=True)
class CaptureOptions:
    endpoint: str  # the endpoint as given to vLLM's KVEventsConfig (or the address to reach it)
    output: Path
    role: str = "auto"  # auto | bind | connect: what *our* SUB socket does
    replay_endpoint: str | None = None  # vLLM's replay ROUTER address (KVEventsConfig.replay_endpoint)
    topic: str = ""  # subscription prefix; vLLM's default topic is ""
    duration_s: float | None = None  # stop after this long
    max_events: int | None = None  # stop after the batch that brings the count to this many
    replay_timeout_s: float = 2.0  # how long to wait for each replay reply
    engine: str = "vllm"  # whose publisher: "vllm" or "sglang" (the same frames; other event fields, see wire.py)


@dataclasses.dataclass(frozen=True)
class CaptureResult:
    output: str
    endpoint: str  # the address our SUB socket used
    role: str  # "bind" or "connect"
    events_written: int
    batches_written: int  # batches received live plus those recovered by replay
    first_seq: int | None
    last_seq: int | None
    gaps: int  # times the sequence jumped forward by more than one
    batches_missed: int  # batches absent from the live stream (sum over gaps)
    batches_recovered: int  # of those, filled from the replay socket
    batches_unrecovered: int  # missed and not recovered: their events are absent from the file
    sequence_resets: int  # times the sequence went backwards (publisher restarted)
    replay_error: str | None  # the last error of the replay socket itself, if any
    malformed_frames: int  # messages that were not KV-event batches (kept in malformed_file)
    malformed_reasons: tuple[str, ...]  # the first few distinct reasons
    malformed_file: str | None  # where the raw malformed frames are, as hex; None when there were none
    duration_s: float
    stopped_by: str  # duration | max-events | signal


def _import_zmq():
    zmq = require("zmq", feature="kvtool capture")
    require("msgpack", feature="kvtool capture")
    return zmq


def vllm_binds(endpoint: str) -> bool:
    """Whether vLLM's PUB socket binds this endpoint (ZmqEventPublisher._socket_setup's rule)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def validate_endpoint(endpoint: str, option: str = "--endpoint") -> None:
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return
    match = _TCP.match(endpoint)
    if match is not None and not 0 < int(match["port"]) < 65536:
        raise UsageError(
            f"{option} '{redact_url(endpoint)}': port {int(match['port'])} is not one of 1 to 65535",
            where=option,
            tip="use the port of vLLM's KVEventsConfig endpoint (vLLM's default tcp://*:5557)",
        )
    if match is None:
        raise UsageError(
            f"{option} '{redact_url(endpoint)}' is not a ZMQ endpoint",
            where=option,
            tip="use tcp://HOST:PORT (for example tcp://127.0.0.1:5557) or ipc://PATH",
        )


def _connect_address(endpoint: str) -> str:
    """A bind-style address (``tcp://*:5557``, ``tcp://[::]:5557``) -> one we can connect to."""
    match = _TCP.match(endpoint)
    if match is None:
        return endpoint
    host = match["host"]
    if host == "*":
        host = "127.0.0.1"
    elif host.strip("[]") in ("::", "*"):
        host = "[::1]"
    return f"tcp://{host}:{match['port']}"


def _is_ipv6(address: str) -> bool:
    """A tcp:// address whose host is an IPv6 literal: libzmq needs the IPV6 option for it (without it a
    bind fails with "No such device" and a connect waits forever)."""
    match = _TCP.match(address)
    return match is not None and ":" in match["host"]


def _bind_address(endpoint: str) -> str:
    match = _TCP.match(endpoint)
    if match is None:
        return endpoint
    return endpoint if match["host"] != "*" else f"tcp://0.0.0.0:{match['port']}"


def resolve_role(endpoint: str, role: str) -> tuple[str, str]:
    """(our role, the address our socket uses); ``auto`` does the opposite of what vLLM does."""
    if role not in ROLES:
        raise UsageError(f"--role must be one of {', '.join(ROLES)}, not '{role}'", where="--role")
    if role == "auto":
        role = "connect" if vllm_binds(endpoint) else "bind"
    address = _connect_address(endpoint) if role == "connect" else _bind_address(endpoint)
    return role, address


def _zmq_reason(err) -> str:
    """pyzmq's message without the " (addr='...')" it appends: the address is already in our message."""
    return re.sub(r"\s*\(addr='[^']*'\)$", "", str(err)).rstrip(".")


def _socket_tip(role: str, err, options: CaptureOptions) -> str | None:
    """What to do about a bind/connect failure; most come from binding an endpoint vLLM binds itself."""
    import errno

    if role != "bind":
        return None
    endpoint = options.endpoint
    if err.errno == errno.EADDRINUSE:
        return (
            "something already listens there: if vLLM binds this port (its endpoint has '*' or '::'), give "
            "--endpoint exactly as in its KVEventsConfig (tcp://*:PORT), or --role connect; or another capture runs"
        )
    if err.errno in (errno.EADDRNOTAVAIL, errno.ENODEV):
        return (
            "kvtool binds endpoints that vLLM connects to, so the host must be an address of this machine; "
            f"to reach a vLLM that binds on another host, use --endpoint {endpoint} --role connect"
        )
    if err.errno == errno.ENOENT and endpoint.startswith("ipc://"):
        return "create the directory of the ipc path first"
    return None


class _Writer:
    """The output file, written and flushed batch by batch, plus the lazily created side file."""

    def __init__(self, output: Path, engine: str = "vllm"):
        self.output = output
        self.engine = engine
        self.malformed_path = output.with_name(output.name + ".malformed.jsonl")
        try:
            self.handle: TextIO = output.open("w", encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot write the output file: {err.strerror or err}", where=str(output)) from None
        self.malformed_handle: TextIO | None = None
        self.failed = False  # a write failed (its UsageError is on its way up)
        self.events = 0
        self.batches = 0

    def batch(self, seq: int, batch) -> None:
        rows = batch_rows(seq, batch, self.engine)
        if rows:
            self._write(self.handle, self.output, "".join(row_to_json(r) + "\n" for r in rows))
        self.events += len(rows)
        self.batches += 1

    def malformed(self, frames: list[bytes], reason: str) -> None:
        record = {"received_ts": time.time(), "reason": reason, "frames_hex": [bytes(f).hex() for f in frames]}
        if self.malformed_handle is None:
            try:
                self.malformed_handle = self.malformed_path.open("w", encoding="utf-8")
            except OSError as err:
                self._failed(self.malformed_path, err)
        self._write(self.malformed_handle, self.malformed_path, json.dumps(record) + "\n")

    def _write(self, handle: TextIO, path: Path, text: str) -> None:
        try:
            handle.write(text)
            handle.flush()
        except OSError as err:  # a full disk, a quota, a file system gone away
            self._failed(path, err)

    def _failed(self, path: Path, err: OSError) -> NoReturn:
        self.failed = True
        raise UsageError(
            f"writing failed after {self.events:,} events in {self.batches:,} batches, which the file keeps: "
            f"{err.strerror or err}",
            where=str(path),
        ) from None

    def close(self) -> None:
        """Close both files; after a write failure, a close that fails the same way adds nothing."""
        for handle, path in ((self.handle, self.output), (self.malformed_handle, self.malformed_path)):
            if handle is None:
                continue
            try:
                handle.close()
            except OSError as err:
                if not self.failed:
                    self._failed(path, err)


class _Replayer:
    """A DEALER client of vLLM's replay ROUTER socket (which vLLM always binds).

    vLLM's example subscriber uses REQ, but the ROUTER answers one request with many messages,
    which a REQ socket cannot receive; a DEALER sending ``[b"", start_seq]`` gets them all.
    """

    def __init__(self, zmq, ctx, endpoint: str, timeout_s: float):
        self.zmq, self.ctx, self.endpoint, self.timeout_ms = zmq, ctx, endpoint, int(timeout_s * 1000)
        self.socket = None

    def _open(self):
        if self.socket is None:
            self.socket = self.ctx.socket(self.zmq.DEALER)
            self.socket.setsockopt(self.zmq.LINGER, 0)
            if _is_ipv6(self.endpoint):
                self.socket.setsockopt(self.zmq.IPV6, 1)
            self.socket.connect(self.endpoint)
        return self.socket

    def fetch(self, first: int, last: int) -> tuple[list[tuple[int, bytes]], list[tuple[list[bytes], str]], bool]:
        """Batches ``first..last`` (inclusive) as (seq, payload); malformed replies; and whether the reply
        ended with vLLM's end marker (False: the replay socket went silent for ``timeout_s``)."""
        socket = self._open()
        got: list[tuple[int, bytes]] = []
        bad: list[tuple[list[bytes], str]] = []
        socket.send_multipart([b"", encode_seq(first)])
        while True:
            if not socket.poll(self.timeout_ms):
                # No reply (dead replay socket): drop this socket so a late answer cannot be
                # mistaken for the answer to a later request.
                socket.close(linger=0)
                self.socket = None
                return got, bad, False
            frames = socket.recv_multipart()
            body = frames[1:] if frames and frames[0] == b"" else frames
            # vLLM 0.32 replies (topic, seq, payload); earlier versions (seq, payload).
            if len(body) not in (2, 3):
                bad.append((frames, f"replay reply has {len(body)} frames, expected 2 or 3"))
                continue
            try:
                seq = decode_seq(body[-2])
            except MalformedFrame as err:
                bad.append((frames, f"replay reply: {err}"))
                continue
            if seq == END_SEQ:
                break
            if first <= seq <= last:
                got.append((seq, body[-1]))
        return got, bad, True

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)


def run_capture(
    options: CaptureOptions,
    *,
    stop: threading.Event | None = None,
    on_progress: Callable[[int, int, int, int], None] | None = None,
    progress_interval_s: float = 0.25,
) -> CaptureResult:
    """Capture until ``stop`` is set, ``duration_s`` passes or ``max_events`` are written.

    ``on_progress(events, batches, batches_unrecovered, malformed)`` is called about every
    ``progress_interval_s`` seconds.  Raises UsageError for bad options or a socket that
    cannot be bound.
    """
    check_options(options)
    capture = Capture(options, on_progress=on_progress, progress_interval_s=progress_interval_s)
    return capture.run(stop or threading.Event())


def check_options(options: CaptureOptions) -> None:
    from kvtool.vllm.events.wire import ENGINES

    if options.engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {options.engine!r}", where="--engine")
    validate_endpoint(options.endpoint)
    if options.replay_endpoint is not None:
        validate_endpoint(options.replay_endpoint, "--replay-endpoint")
    if options.duration_s is not None and not options.duration_s > 0:
        raise UsageError(f"--duration must be positive, not {options.duration_s}", where="--duration")
    if options.max_events is not None and options.max_events <= 0:
        raise UsageError(f"--max-events must be positive, not {options.max_events}", where="--max-events")


@dataclasses.dataclass
class _Sequence:
    """What the batch sequence numbers said so far."""

    first: int | None = None
    last: int | None = None
    gaps: int = 0  # times the sequence jumped forward by more than one
    missed: int = 0  # batches absent from the live stream
    recovered: int = 0  # of those, filled from the replay socket
    resets: int = 0  # times the sequence went backwards


class Capture:
    """One capture: the SUB socket, the writer, the optional replayer and the counts (see :func:`run_capture`).

    A message goes through :meth:`handle`; a jump in the sequence numbers through :meth:`fill_gap`; anything that
    is not a KV-event batch through :meth:`bad_frame`.  :meth:`run` loops until a stop condition and returns the
    :class:`CaptureResult`.
    """

    def __init__(
        self,
        options: CaptureOptions,
        *,
        on_progress: Callable[[int, int, int, int], None] | None = None,
        progress_interval_s: float = 0.25,
    ):
        self.options = options
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        self.role, self.address = resolve_role(options.endpoint, options.role)
        self.zmq = _import_zmq()
        self.seq = _Sequence()
        self.malformed = 0
        self.reasons: list[str] = []
        self.replay_error: str | None = None
        self.ctx, self.sub = self._open_socket()
        try:
            self.writer = _Writer(options.output, options.engine)
        except UsageError:
            self._close_socket()
            raise
        replay = _connect_address(options.replay_endpoint) if options.replay_endpoint else None
        self.replayer = _Replayer(self.zmq, self.ctx, replay, options.replay_timeout_s) if replay else None

    def _open_socket(self):
        zmq = self.zmq
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)  # no receive limit: never drop what vLLM sent while we write
        sub.setsockopt(zmq.SUBSCRIBE, self.options.topic.encode("utf-8"))
        if _is_ipv6(self.address):
            sub.setsockopt(zmq.IPV6, 1)
        try:
            (sub.bind if self.role == "bind" else sub.connect)(self.address)
        except zmq.ZMQError as err:
            sub.close(linger=0)
            ctx.term()
            raise UsageError(
                f"cannot {self.role} {self.address}: {_zmq_reason(err)}",
                where="--endpoint",
                tip=_socket_tip(self.role, err, self.options),
            ) from None
        return ctx, sub

    def _close_socket(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()

    def bad_frame(self, frames: list[bytes], reason: str) -> None:
        """A message that is not a KV-event batch: counted, its reason kept, its frames written as hex."""
        self.malformed += 1
        if reason not in self.reasons and len(self.reasons) < MAX_MALFORMED_REASONS:
            self.reasons.append(reason)
        self.writer.malformed(frames, reason)

    def fill_gap(self, first: int, last: int) -> None:
        """Ask vLLM's replay socket for batches ``first..last`` (inclusive) and write those it returns."""
        replayer = self.replayer
        if replayer is None:
            return
        try:
            replies, bad, answered = replayer.fetch(first, last)
        except self.zmq.ZMQError as err:  # e.g. a replay address that cannot be reached at all
            self.replay_error = f"replay of batches {first}..{last} failed: {err}"
            return
        if not answered:
            self.replay_error = (
                f"replay of batches {first}..{last}: {replayer.endpoint} did not answer within "
                f"{self.options.replay_timeout_s:g} s"
            )
        for frames, reason in bad:
            self.bad_frame(frames, reason)
        seen: set[int] = set()
        for seq, payload in sorted(replies, key=lambda r: r[0]):
            if seq in seen:
                continue
            try:
                batch = decode_payload(payload, self.options.engine)
            except MalformedFrame as err:
                self.bad_frame([encode_seq(seq), payload], f"replayed batch {seq}: {err}")
                continue
            seen.add(seq)
            self.writer.batch(seq, batch)
        self.seq.recovered += len(seen)

    def handle(self, frames: list[bytes]) -> None:
        """One message from the SUB socket: decode, follow the sequence numbers, write."""
        if len(frames) != 3:
            self.bad_frame(frames, f"message has {len(frames)} frames, expected 3 (topic, seq, payload)")
            return
        try:
            seq = decode_seq(frames[1], signed=False)
            batch = decode_payload(frames[2], self.options.engine)
        except MalformedFrame as err:
            self.bad_frame(frames, str(err))
            return
        state = self.seq
        if state.last is not None and seq > state.last + 1:
            state.gaps += 1
            state.missed += seq - state.last - 1
            self.fill_gap(state.last + 1, seq - 1)
        elif state.last is not None and seq <= state.last:
            state.resets += 1
        if state.first is None:
            state.first = seq
        state.last = seq
        self.writer.batch(seq, batch)

    def _progress(self) -> None:
        if self.on_progress is not None:
            unrecovered = self.seq.missed - self.seq.recovered
            self.on_progress(self.writer.events, self.writer.batches, unrecovered, self.malformed)

    def _loop(self, stop: threading.Event, started: float) -> str:
        """Receive until a stop condition; return what stopped the capture."""
        options = self.options
        deadline = None if options.duration_s is None else started + options.duration_s
        next_progress = started
        while True:
            now = time.monotonic()
            if options.max_events is not None and self.writer.events >= options.max_events:
                return "max-events"
            if stop.is_set() or (deadline is not None and now >= deadline):
                _drain(self.sub, self.zmq, self.handle)
                return "signal" if stop.is_set() else "duration"
            if now >= next_progress:
                self._progress()
                next_progress = now + self.progress_interval_s
            wait_s = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
            if self.sub.poll(int(wait_s * 1000)):
                self.handle(self.sub.recv_multipart())

    def run(self, stop: threading.Event) -> CaptureResult:
        """Capture until ``stop`` is set, the duration passes or enough events are written; close everything."""
        started = time.monotonic()
        try:
            stopped_by = self._loop(stop, started)
        finally:
            try:
                self.writer.close()
            finally:
                if self.replayer is not None:
                    self.replayer.close()
                self._close_socket()
        self._progress()
        return self._result(stopped_by, time.monotonic() - started)

    def _result(self, stopped_by: str, duration_s: float) -> CaptureResult:
        state, writer = self.seq, self.writer
        return CaptureResult(
            output=str(self.options.output),
            endpoint=self.address,
            role=self.role,
            events_written=writer.events,
            batches_written=writer.batches,
            first_seq=state.first,
            last_seq=state.last,
            gaps=state.gaps,
            batches_missed=state.missed,
            batches_recovered=state.recovered,
            batches_unrecovered=state.missed - state.recovered,
            sequence_resets=state.resets,
            replay_error=self.replay_error,
            malformed_frames=self.malformed,
            malformed_reasons=tuple(self.reasons),
            malformed_file=str(writer.malformed_path) if self.malformed else None,
            duration_s=duration_s,
            stopped_by=stopped_by,
        )


DRAIN_LIMIT_S = 2.0  # at a stop, keep handling queued messages for at most this long


def _drain(sub, zmq, handle: Callable[[list[bytes]], Any]) -> None:
    """Handle the messages already received before stopping, so none is lost.

    Bounded in time: a publisher that never pauses cannot keep a stopped capture alive.
    """
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        try:
            frames = sub.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        handle(frames)
