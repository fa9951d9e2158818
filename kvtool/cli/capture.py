"""`kvtool capture`: record a running vLLM's (or SGLang's) KV-cache events (ZMQ + msgpack) as JSON lines."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any, Optional

import typer

from kvtool.cli.options import JsonOpt, path_option
from kvtool.cli.output import handle_errors
from kvtool.cli.progress import StderrProgress


def capture_line(events: int, batches: int, unrecovered: int, malformed: int) -> str:
    """The live count of a capture: 'captured 1,234 events in 56 batches, 2 batches missed'."""
    text = f"captured {events:,} events in {batches:,} batches"
    if unrecovered:
        text += f", {unrecovered:,} batches missed"
    if malformed:
        text += f", {malformed:,} malformed frames"
    return text


def _install_stop_handlers(stop: threading.Event) -> dict[signal.Signals, Any]:
    """SIGINT and SIGTERM end the capture cleanly (flush, summary, exit 0); returns the handlers they replace."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, lambda *_: stop.set())
    return previous


def register(app: typer.Typer) -> None:
    @app.command("capture")
    @handle_errors
    def command(
        endpoint: str = typer.Option(
            "tcp://127.0.0.1:5557",
            "--endpoint",
            "-e",
            help="vLLM's KV-event endpoint, as in its KVEventsConfig (tcp://HOST:PORT or ipc://PATH).",
        ),
        output: Path = path_option(
            ...,
            "--output",
            "-o",
            empty_tip="give the JSON-lines file to write (NAME.jsonl)",
            help="The JSON-lines file to write (one event per line).",
        ),
        role: str = typer.Option(
            "auto",
            "--role",
            help="bind or connect our SUB socket; auto does the opposite of vLLM, which binds only "
            "endpoints with '*' or '::' (or ipc://) and connects to the others.",
        ),
        replay_endpoint: Optional[str] = typer.Option(
            None, "--replay-endpoint", help="vLLM's replay ROUTER endpoint, to fill gaps in the sequence numbers."
        ),
        topic: str = typer.Option("", "--topic", help="Topic prefix to subscribe to (vLLM's default topic is '')."),
        duration_s: Optional[float] = typer.Option(None, "--duration", help="Stop after this many seconds."),
        max_events: Optional[int] = typer.Option(
            None, "--max-events", help="Stop after the batch that brings the count to this many events."
        ),
        engine: str = typer.Option(
            "vllm",
            "--engine",
            help='Whose publisher: vllm, or sglang (--kv-events-config \'{"publisher": "zmq"}\': the same '
            'frames, endpoint tcp://*:5557 and topic \'\', its own event fields; rows get "engine": "sglang").',
        ),
        json_output: JsonOpt = False,
    ) -> None:
        """Capture a running vLLM's (or SGLang's) KV-cache events (ZMQ publisher) into a JSON-lines file."""
        from kvtool.cli.output import print_json, stdout_console
        from kvtool.vllm.events.capture import CaptureOptions, run_capture
        from kvtool.vllm.events.render import capture_table

        options = CaptureOptions(
            endpoint=endpoint,
            output=output,
            role=role,
            replay_endpoint=replay_endpoint,
            topic=topic,
            duration_s=duration_s,
            max_events=max_events,
            engine=engine,
        )
        stop = threading.Event()
        previous = _install_stop_handlers(stop)
        try:
            with StderrProgress() as progress:
                show = None if json_output else (lambda *counts: progress.line(capture_line(*counts)))
                result = run_capture(options, stop=stop, on_progress=show)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if json_output:
            print_json(result)
            return
        stdout_console().print(capture_table(result))
        if result.events_written == 0 and result.malformed_frames == 0:
            from kvtool.cli.output import warn

            if engine == "sglang":
                warn(
                    f"no events received ({result.role} {result.endpoint}): check that SGLang runs with "
                    f'--kv-events-config \'{{"publisher": "zmq", "endpoint": "tcp://*:5557"}}\' and the '
                    "radix cache on (no --disable-radix-cache)"
                )
                return
            warn(
                f"no events received ({result.role} {result.endpoint}): check that vLLM runs with "
                f"KVEventsConfig(enable_kv_cache_events=True, publisher='zmq', endpoint='{endpoint}') and "
                "prefix caching on"
            )
