"""Check that a serving engine's prefix cache keeps partitions apart: tenants (``cache_salt``), LoRA adapters,
adapter versions, prompt embeddings and collisions across them.

Two modes: against an engine kvtool starts itself (a model folder and a Python with vLLM), or against a running
OpenAI-compatible endpoint.  Either way the run sends the probes of :mod:`kvtool.vllm.isolation.plan` one at a
time, reads each response's cached tokens and the prefix-cache counters around it, captures KV events when an
endpoint for them is known, and returns an :class:`~kvtool.vllm.isolation.record.IsolationRecord`; the verdicts
come from :func:`kvtool.vllm.isolation.verdicts.judge_record`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.vllm.isolation.client import Client, parse_block_size
from kvtool.vllm.isolation.plan import (
    DIMENSIONS,
    DimensionPartitions,
    Partition,
    Plan,
    PlanOptions,
    new_run_id,
    plan_trials,
)
from kvtool.vllm.isolation.record import (
    RECORD_FORMAT,
    EngineInfo,
    IsolationRecord,
    ProbeResult,
    SkippedDimension,
    keep_event,
    redact_keys,
)

EVENTS_SETTLE_S = 5.0  # how long to wait for the last probe's KV events after its response


@dataclasses.dataclass(frozen=True)
class IsolationOptions:
    endpoint: str | None = None  # a running server's base URL; None = start one from model_dir
    model_dir: Path | None = None
    vllm_python: str | None = None  # the Python that runs vLLM (self-started mode)
    base_model: str | None = None  # served base model name; default: the first of /v1/models
    dimensions: tuple[str, ...] = DIMENSIONS
    adapters: tuple[str, ...] = ()  # served LoRA names (endpoint mode)
    adapter_versions: tuple[str, ...] = ()  # two adapter paths on the server, loaded under one name
    api_keys: tuple[tuple[str, str], ...] = ()  # (tenant, key): tenants whose gateway derives the salt
    api_key: str | None = None  # the key for every other request
    hidden_size: int | None = None  # for prompt embeddings (endpoint mode; read from config.json otherwise)
    block_size: int | None = None  # default: vLLM's cache_config_info metric
    events_endpoint: str | None = None  # vLLM's ZMQ KV-event endpoint, as in its KVEventsConfig
    port: int | None = None  # self-started: HTTP port (default: a free one)
    events_port: int | None = None  # self-started: KV-event port (default: a free one)
    repeats: int = 2
    seed: int | None = None
    engine_args: tuple[str, ...] = ()
    startup_timeout_s: float = 600.0
    note: str | None = None  # recorded as is (tests name deliberately broken engines)


Progress = Callable[[str], None]


def _validate(options: IsolationOptions) -> None:
    if (options.endpoint is None) == (options.model_dir is None):
        raise UsageError("give either --endpoint URL (a running server) or --model DIR (kvtool starts vLLM)")
    unknown = [d for d in options.dimensions if d not in DIMENSIONS]
    if unknown:
        raise UsageError(
            f"unknown dimension {unknown[0]!r}", where="--dimension", tip=f"one of {', '.join(DIMENSIONS)}"
        )
    if options.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, not {options.repeats}", where="--repeats")
    if options.block_size is not None and options.block_size < 1:
        raise UsageError(f"--block-size must be positive, not {options.block_size}", where="--block-size")
    # checked before any request or launch: these were used as given (a 0 hidden size, port 99999, a NaN timeout)
    if options.hidden_size is not None and options.hidden_size < 1:
        raise UsageError(f"--hidden-size must be positive, not {options.hidden_size}", where="--hidden-size")
    for option, port in (("--port", options.port), ("--events-port", options.events_port)):
        if port is not None and not 0 < port < 65536:
            raise UsageError(f"{option} must be one of 1 to 65535, not {port}", where=option)
    if not options.startup_timeout_s > 0:
        raise UsageError(
            f"--startup-timeout must be positive, not {options.startup_timeout_s:g}", where="--startup-timeout"
        )
    if options.events_endpoint is not None:
        from kvtool.vllm.events.capture import validate_endpoint

        validate_endpoint(options.events_endpoint, "--events")
    if len(options.adapter_versions) not in (0, 2):
        raise UsageError("--adapter-version takes exactly two paths (given twice)", where="--adapter-version")
    if len(options.api_keys) == 1:
        raise UsageError("--api-key TENANT=KEY needs at least two tenants to compare", where="--api-key")


def discover_block_size(client: Client) -> int:
    """The engine's block size from vLLM's ``vllm:cache_config_info`` metric."""
    block_size = parse_block_size(client.metrics_text())
    if block_size is None:
        raise UsageError(
            "cannot tell the engine's KV block size (no vllm:cache_config_info in /metrics)", where="--block-size",
            tip="give --block-size (vLLM's default is 16 on GPUs)",
        )  # fmt: skip
    return block_size


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What the partitions need that a self-started engine provides."""

    adapters: tuple[str, ...]  # served adapter names
    adapter_versions: tuple[str, ...]  # two paths to load under one name
    hidden_size: int | None
    can_load_adapters: bool


def _partitions(
    setup: _Setup, options: IsolationOptions, run_id: str
) -> tuple[tuple[DimensionPartitions, ...], tuple[SkippedDimension, ...]]:
    """The partition pairs of every requested dimension, and the dimensions that cannot run here (and why)."""
    base = Partition("base")
    salt_a = Partition("salt:a", cache_salt=f"kvtool-{run_id}-a")
    salt_b = Partition("salt:b", cache_salt=f"kvtool-{run_id}-b")
    groups: list[DimensionPartitions] = []
    skipped: list[SkippedDimension] = []

    def add(dimension: str, pairs: list[tuple[Partition, Partition]], reason: str, kind: str = "tokens") -> None:
        if dimension not in options.dimensions:
            return
        if pairs:
            groups.append(DimensionPartitions(dimension, tuple(pairs), kind))
        else:
            skipped.append(SkippedDimension(dimension, reason))

    tenants = [Partition(f"tenant:{name}", api_key=key) for name, key in options.api_keys]
    add("salt", [(salt_a, salt_b), (base, salt_a)] + list(zip(tenants, tenants[1:])), "")
    adapters = [Partition(f"adapter:{name}", model=name) for name in setup.adapters]
    adapter_pairs = list(zip(adapters, adapters[1:])) + [(base, a) for a in adapters[:1]]
    add("adapter", adapter_pairs, "no LoRA adapter is served: name one with --adapter NAME")
    version_pairs = []
    if len(setup.adapter_versions) == 2:
        name = f"kvtool-{run_id}-v"
        v1, v2 = (Partition(f"version:{n}", model=name, adapter_path=p) for n, p in zip((1, 2), setup.adapter_versions))
        version_pairs.append((v1, v2))
    add("adapter-version", version_pairs, "needs two adapter paths on the server: --adapter-version PATH (twice)")
    embeds = [(Partition("embeds:A"), Partition("embeds:B"))] if setup.hidden_size else []
    add("embeddings", embeds, "needs the model's hidden size: --hidden-size N", kind="embeds")
    cross = [(Partition(f"salt={n}", cache_salt=n), Partition(f"adapter={n}", model=n)) for n in setup.adapters[:1]]
    add("cross", cross, "needs a served LoRA adapter whose name is used as a salt: --adapter NAME")
    return tuple(groups), tuple(skipped)


class _Capture:
    """kvtool's own ZMQ capture (kvtool.vllm.events.capture) on a background thread, into a temporary file."""

    def __init__(self, endpoint: str, folder: Path):
        from kvtool.vllm.events.capture import CaptureOptions

        self.path = folder / "events.jsonl"
        self.options = CaptureOptions(endpoint=endpoint, output=self.path)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="kvtool-isolation-capture", daemon=True)

    def _run(self) -> None:
        from kvtool.vllm.events.capture import run_capture

        try:
            run_capture(self.options, stop=self.stop)
        except BaseException as err:  # reported by rows()
            self.error = err

    def start(self) -> None:
        self.thread.start()
        time.sleep(0.3)  # let the SUB socket bind or connect before the first probe
        if self.error is not None:
            raise self.error

    def rows(self, wait_for_session: str | None) -> list[dict[str, Any]]:
        """Stop after the given session's events arrived (or EVENTS_SETTLE_S passed); return every row."""
        from kvtool.vllm.events.wire import iter_event_rows

        deadline = time.monotonic() + EVENTS_SETTLE_S
        while wait_for_session and time.monotonic() < deadline and self.path.exists():
            if wait_for_session in self.path.read_text(encoding="utf-8"):
                break
            time.sleep(0.1)
        self.stop.set()
        self.thread.join(timeout=10)
        if self.error is not None:
            raise self.error
        if not self.path.exists():
            return []
        return [row for _, row in iter_event_rows(self.path) if isinstance(row, dict)]


def _run_probes(client: Client, plan: Plan, *, with_events: bool, hidden_size: int | None, progress: Progress):
    """Send every probe in order; load the adapter version a probe needs first.  Returns its ProbeResults."""
    results: list[ProbeResult] = []
    loaded: dict[str, str] = {}  # adapter name -> the path it points at now
    counters = client.counters()
    probes = plan.probes
    for n, probe in enumerate(probes, start=1):
        partition = probe.partition
        if (
            partition.adapter_path is not None
            and partition.model
            and loaded.get(partition.model) != partition.adapter_path
        ):
            client.load_adapter(partition.model, partition.adapter_path, in_place=partition.model in loaded)
            loaded[partition.model] = partition.adapter_path
            counters = client.counters()
        reply = client.complete(probe, plan, with_events=with_events, hidden_size=hidden_size)
        after = client.counters()
        results.append(
            ProbeResult(probe, reply.cached_tokens, reply.prompt_tokens, reply.sent_at_s, reply.latency_s,
                        counters.queries_tokens, counters.hits_tokens, after.queries_tokens, after.hits_tokens)
        )  # fmt: skip
        counters = after
        if n % 10 == 0 or n == len(probes):
            progress(f"probes: {n}/{len(probes)} sent")
    return tuple(results)


def _version(client: Client) -> str | None:
    try:
        value = client.get_json("/version").get("version")
    except Exception:  # an endpoint without /version is fine
        return None
    return str(value) if value is not None else None


def _check(
    client: Client, options: IsolationOptions, setup: _Setup, events_endpoint: str | None, mode: str, progress: Progress
) -> IsolationRecord:
    """Plan, probe, collect: the part both modes share."""
    served = client.served_models()
    base = options.base_model or (served[0] if served else None)
    if base is None:
        raise UsageError("the endpoint serves no model (/v1/models is empty)", where=client.base_url)
    client.base_model = base
    missing = [a for a in setup.adapters if a not in served]
    if missing and not setup.can_load_adapters:
        raise UsageError(f"adapter {missing[0]!r} is not served (served: {', '.join(served)})", where="--adapter")
    block_size = options.block_size or discover_block_size(client)
    run_id = new_run_id(options.seed)
    partitions, skipped = _partitions(setup, options, run_id)
    plan = plan_trials(partitions, PlanOptions(block_size, repeats=options.repeats, seed=options.seed), run_id)
    progress(f"{len(plan.trials)} trials, {len(plan.probes)} probes; block size {block_size}")
    with tempfile.TemporaryDirectory(prefix="kvtool-iso-events-") as folder:
        capture = _Capture(events_endpoint, Path(folder)) if events_endpoint else None
        if capture is not None:
            capture.start()
        try:
            results = _run_probes(client, plan, with_events=capture is not None, hidden_size=setup.hidden_size,
                                  progress=progress)  # fmt: skip
        finally:
            last = plan.probes[-1].session_id if plan.probes else None
            rows = capture.rows(last) if capture is not None else None
    events = None
    if rows is not None:
        sessions = {p.session_id for p in plan.probes}
        events = tuple(keep_event(r) for r in rows if r.get("session_id") in sessions or r.get("type") != "BlockStored")
    engine = EngineInfo(mode, client.base_url, base, block_size, _version(client), events_endpoint, options.note)
    # the probes are sent: from here on the record holds labels, never the tenants' keys (kvtool.vllm.isolation.record)
    return redact_keys(IsolationRecord(RECORD_FORMAT, engine, plan, results, events, skipped))


@contextlib.contextmanager
def _self_started(options: IsolationOptions, progress: Progress) -> Iterator[tuple[Client, _Setup, str]]:
    """Start vLLM on the model folder, write and load random adapters; yield (client, setup, events endpoint)."""
    from kvtool.vllm.isolation.adapters import attention_shape, write_random_adapter
    from kvtool.vllm.isolation.engine import Engine, EngineSpec, free_port

    assert options.model_dir is not None
    model_dir = Path(options.model_dir)
    shape = attention_shape(model_dir)
    python = options.vllm_python or _default_vllm_python()
    events_port = options.events_port or free_port()
    spec = EngineSpec(python, model_dir, options.port or free_port(), events_port, options.block_size,
                      options.engine_args, options.startup_timeout_s)  # fmt: skip
    progress(f"starting vLLM on {model_dir} (port {spec.port}); this takes a while")
    with Engine(spec) as engine:
        progress(f"vLLM is up at {engine.url}")
        folder = engine.scratch / "adapters"
        paths = {n: write_random_adapter(folder / n, shape, str(model_dir), seed) for seed, n in enumerate("abv")}
        names = ("lora-a", "lora-b")  # a fresh engine: short names cannot collide
        client = Client(engine.url, base_model="base", api_key=options.api_key)
        for name, key in zip(names, "ab"):
            client.load_adapter(name, str(paths[key]), in_place=False)
        v2 = write_random_adapter(folder / "v2", shape, str(model_dir), 7)
        setup = _Setup(names, (str(paths["v"]), str(v2)), shape.hidden_size, can_load_adapters=True)
        yield client, setup, f"tcp://127.0.0.1:{events_port}"


def _default_vllm_python() -> str:
    import importlib.util
    import os
    import sys

    if os.environ.get("VLLM_PYTHON"):
        return os.environ["VLLM_PYTHON"]
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise UsageError("vLLM is not installed here", where="--vllm-python",
                     tip="give --vllm-python PATH (a Python with vLLM), set VLLM_PYTHON, or use --endpoint URL")  # fmt: skip


def run_isolation(options: IsolationOptions, progress: Progress | None = None) -> IsolationRecord:
    """Run the whole check in either mode and return what it observed."""
    say = progress or (lambda _message: None)
    _validate(options)
    if options.endpoint is not None:
        client = Client(options.endpoint, base_model=options.base_model or "", api_key=options.api_key)
        setup = _Setup(options.adapters, options.adapter_versions, options.hidden_size, can_load_adapters=False)
        return _check(client, options, setup, options.events_endpoint, "endpoint", say)
    with _self_started(options, say) as (client, setup, events_endpoint):
        return _check(client, options, setup, events_endpoint, "self-started", say)
