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
import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.vllm.isolation.client import (
    Client,
    EndpointError,
    parse_block_size,
    parse_cache_config,
    parse_prefix_counters,
)
from kvtool.vllm.isolation.multimodal import (
    CHAT_TEMPLATE,
    IMAGE_KIND,
    ImageSupport,
    config_takes_images,
    detect_images,
    has_chat_template,
    image_pairs,
    not_covered_combinations,
)
from kvtool.vllm.isolation.plan import (
    DIMENSIONS,
    FILLER,
    DimensionPartitions,
    Partition,
    Plan,
    PlanOptions,
    Trial,
    new_run_id,
    plan_trials,
    send_order,
    trial_requests,
)
from kvtool.vllm.isolation.record import (
    RECORD_FORMAT,
    EngineInfo,
    IsolationRecord,
    ProbeResult,
    SkippedDimension,
    redact_keys,
    relevant_events,
)
from kvtool.vllm.isolation.routing import engine_count, served_by

EVENTS_SETTLE_S = 5.0  # how long to wait for the last probe's KV events after its response
DEFAULT_BUDGET = 1500  # requests (fillers included); about 4 minutes on the tiny CPU model (docs/isolation.md)
MINIMIZE_RESERVE = 60  # of the budget, kept for minimizing the first leaking case of each dimension
# prompt lengths (full blocks) of the length dimension: both sides of every power of two, up to what the engine takes
LENGTH_LADDER = (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513)
DEFAULT_MAX_BLOCKS = 16  # when neither max_model_len (/v1/models) nor the pool size (/metrics) is known
MAX_SALT_LENGTH = 128  # vLLM 0.32 refuses longer salts (vllm/entrypoints/generate/base/protocol.py validate_cache_salt)


def salt_variants(run_id: str) -> tuple[tuple[str, str | None, str | None], ...]:
    """(case, salt 1, salt 2): pairs of salts a correct engine keeps apart although they differ only slightly.
    ``None`` is no salt at all; vLLM 0.32 refuses an empty salt (HTTP 400), which the report shows as refused."""
    s = f"kv{run_id}"
    long_a = (s + "-" + "x" * MAX_SALT_LENGTH)[: MAX_SALT_LENGTH - 1]
    return (
        ("case", f"{s}-tenant", f"{s}-TENANT"),
        ("nfc-nfd", f"{s}-caf\u00e9", f"{s}-cafe\u0301"),  # one code point vs e + combining acute
        ("nfkc", f"{s}-\ufb01le", f"{s}-file"),  # the fi ligature vs f, i
        ("whitespace", f"{s}-t", f" {s}-t "),
        ("prefix", f"{s}-t", f"{s}-t2"),
        ("long", long_a + "a", long_a + "b"),  # 128 characters, differing in the last
        ("long-prefix", long_a + "a", long_a),
        ("non-ascii", f"{s}-\u79df\u6237\u7532", f"{s}-\u79df\u6237\u4e59"),
        ("empty-absent", "", None),
    )


# the simplest salt pair of each kind, tried when minimizing a leak (after the shortest prompt is found)
SIMPLE_SALTS = {
    "": ("a", "b"),
    "case": ("a", "A"),
    "nfc-nfd": ("\u00e9", "e\u0301"),
    "nfkc": ("\ufb01", "fi"),
    "whitespace": ("a", " a"),
    "prefix": ("a", "ab"),
    "non-ascii": ("\u7532", "\u4e59"),
}


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
    budget_requests: int | None = DEFAULT_BUDGET  # at most this many requests (None: no bound)
    lengths: tuple[int, ...] = ()  # full blocks of the length dimension (default: LENGTH_LADDER up to the limits)
    minimize: bool = True
    # send each prime this many times in a row (behind a router: once per engine; kvtool.vllm.isolation.routing)
    repeat_primes: int = 1


Progress = Callable[[str], None]


def _validate(options: IsolationOptions) -> None:
    if (options.endpoint is None) == (options.model_dir is None):
        raise UsageError("give either --endpoint URL (a running server) or --model DIR (kvtool starts vLLM)")
    unknown = [d for d in options.dimensions if d not in DIMENSIONS]
    if unknown:
        raise UsageError(
            f"unknown dimension {unknown[0]!r}", where="--dimension", tip=f"one of {', '.join(DIMENSIONS)}"
        )
    if options.budget_requests is not None and options.budget_requests < 3:
        raise UsageError(f"--budget must be at least 3 requests (one trial), not {options.budget_requests}",
                         where="--budget")  # fmt: skip
    if any(n < 1 for n in options.lengths):
        raise UsageError("--length must be at least 1 full block", where="--length")
    if options.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, not {options.repeats}", where="--repeats")
    if options.repeat_primes < 1:
        raise UsageError(f"--repeat-primes must be at least 1, not {options.repeat_primes}", where="--repeat-primes")
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
    multimodal: bool | None = None  # the model takes images/audio (config.json); None: not known (endpoint mode)
    model_dir: Path | None = None  # self-started: the model folder (its config.json says whether it takes images)


@dataclasses.dataclass(frozen=True)
class _Limits:
    block_size: int
    max_blocks: int  # the longest prime the engine takes and keeps (full blocks)
    pool_blocks: int | None  # the KV pool (vllm:cache_config_info num_gpu_blocks)
    budget: int | None


def _limits(block_size: int, max_model_len: int | None, cache_config: dict[str, str] | None, budget) -> _Limits:
    pool = None
    if cache_config and str(cache_config.get("num_gpu_blocks", "")).isdigit():
        pool = int(cache_config["num_gpu_blocks"])
    caps = []
    partial = max(1, block_size // 2)
    if max_model_len:  # prompt + the one generated token fit in max_model_len
        caps.append((max_model_len - 1 - partial) // block_size)
    if pool:  # prime + its partial block, with room for the next request
        caps.append(pool // 2 - 1)
    max_blocks = max(1, min(caps)) if caps else DEFAULT_MAX_BLOCKS
    return _Limits(block_size, max_blocks, pool, budget)


def _partitions(
    setup: _Setup, options: IsolationOptions, run_id: str, limits: _Limits | None = None,
    images: ImageSupport | None = None,
) -> tuple[tuple[DimensionPartitions, ...], tuple[SkippedDimension, ...]]:  # fmt: skip
    """The partition pairs of every requested dimension, and the dimensions that cannot run here (and why)."""
    limits = limits or _Limits(16, DEFAULT_MAX_BLOCKS, None, None)
    base = Partition("base")
    salt_a = Partition("salt:a", cache_salt=f"kvtool-{run_id}-a")
    salt_b = Partition("salt:b", cache_salt=f"kvtool-{run_id}-b")
    groups: list[DimensionPartitions] = []
    skipped: list[SkippedDimension] = []

    def add(dimension: str, pairs: list[tuple[Partition, Partition]], reason: str, kind: str = "tokens", **kw) -> None:
        if dimension not in options.dimensions:
            return
        if pairs:
            groups.append(DimensionPartitions(dimension, tuple(pairs), kind, **kw))
        else:
            skipped.append(SkippedDimension(dimension, reason))

    tenants = [Partition(f"tenant:{name}", api_key=key) for name, key in options.api_keys]
    # every pair, not neighbours only: a gateway giving tenants 1 and 3 one salt passed a neighbours-only check
    pairs = list(itertools.combinations([salt_a, salt_b, base], 2)) + list(itertools.combinations(tenants, 2))
    add("salt", pairs, "")
    adapters = [Partition(f"adapter:{name}", model=name) for name in setup.adapters]
    adapter_pairs = list(itertools.combinations(adapters, 2)) + [(base, a) for a in adapters[:1]]
    add("adapter", adapter_pairs, "no LoRA adapter is served: name one with --adapter NAME")
    version_pairs = []
    v1 = v2 = None
    if len(setup.adapter_versions) == 2:
        name = f"kvtool-{run_id}-v"
        v1, v2 = (Partition(f"version:{n}", model=name, adapter_path=p) for n, p in zip((1, 2), setup.adapter_versions))
        version_pairs.append((v1, v2))
    add("adapter-version", version_pairs, "needs two adapter paths on the server: --adapter-version PATH (twice)")
    embeds = [(Partition("embeds:A"), Partition("embeds:B"))] if setup.hidden_size else []
    add("embeddings", embeds, "needs the model's hidden size: --hidden-size N", kind="embeds")
    cross = [(Partition(f"salt={n}", cache_salt=n), Partition(f"adapter={n}", model=n)) for n in setup.adapters[:1]]
    add("cross", cross, "needs a served LoRA adapter whose name is used as a salt: --adapter NAME")
    # the search beyond the fixed sample
    variants = salt_variants(run_id)
    add("salt-variant",
        [(Partition(f"{case}:1", cache_salt=a), Partition(f"{case}:2", cache_salt=b)) for case, a, b in variants],
        "", variants=("exact",), cases=tuple(case for case, _, _ in variants))  # fmt: skip
    lengths = options.lengths or tuple(n for n in LENGTH_LADDER if n <= limits.max_blocks)
    if limits.max_blocks not in lengths and not options.lengths:
        lengths += (limits.max_blocks,)
    long_a = Partition("salt:la", cache_salt=f"kvtool-{run_id}-la")
    long_b = Partition("salt:lb", cache_salt=f"kvtool-{run_id}-lb")
    add("length", [(long_a, long_b)], "", variants=("exact",), lengths=tuple(sorted(set(lengths))))
    combos: list[tuple[Partition, Partition]] = []
    cases: list[str] = []
    sa, sb = salt_a.cache_salt, salt_b.cache_salt
    for name in setup.adapters[:1]:
        combos.append((Partition(f"salt:a+{name}", model=name, cache_salt=sa),
                       Partition(f"salt:b+{name}", model=name, cache_salt=sb)))  # fmt: skip
        cases.append("one adapter, two salts")
        combos.append((Partition(f"salt:a+{name}", model=name, cache_salt=sa), salt_a))
        cases.append("one salt, adapter vs base")
    for other in setup.adapters[1:2]:
        combos.append((Partition(f"salt:a+{setup.adapters[0]}", model=setup.adapters[0], cache_salt=sa),
                       Partition(f"salt:a+{other}", model=other, cache_salt=sa)))  # fmt: skip
        cases.append("one salt, two adapters")
    if v1 is not None:
        combos.append((dataclasses.replace(v1, label="salt:a+version:1", cache_salt=sa),
                       dataclasses.replace(v1, label="salt:b+version:1", cache_salt=sb)))  # fmt: skip
        cases.append("one adapter version, two salts")
    add("salt-adapter", combos, "needs a served LoRA adapter: --adapter NAME", cases=tuple(cases))
    salted_embeds = []
    if setup.hidden_size:
        salted_embeds = [(Partition("embeds+salt:a", cache_salt=sa), Partition("embeds+salt:b", cache_salt=sb))]
    add("salt-embeds", salted_embeds, "needs the model's hidden size: --hidden-size N", kind="embeds",
        same_content=True)  # fmt: skip
    evict_pairs: list[tuple[Partition, Partition]] = []
    reason = "needs the KV pool size (vllm:cache_config_info num_gpu_blocks in /metrics)"
    fill_blocks = fill_prompt = 0
    if limits.pool_blocks:
        fill_prompt = limits.max_blocks
        fill_blocks = limits.pool_blocks + fill_prompt  # more than the pool holds: everything before is evicted
        requests = 2 * (-(-fill_blocks // fill_prompt) + 3)
        if limits.budget is not None and requests > limits.budget // 3:
            reason = (f"filling the pool ({limits.pool_blocks} blocks, {fill_prompt} per request) takes {requests} "
                      f"requests, more than a third of --budget {limits.budget}")  # fmt: skip
        else:
            evict_pairs = [(Partition("salt:ea", cache_salt=f"kvtool-{run_id}-ea"),
                            Partition("salt:eb", cache_salt=f"kvtool-{run_id}-eb"))]  # fmt: skip
    add("eviction", evict_pairs, reason, variants=("exact",), filler_blocks=fill_blocks,
        filler_prompt_blocks=fill_prompt)  # fmt: skip
    # salt x image (x adapter, x tenant): kvtool.vllm.isolation.multimodal
    images = images or ImageSupport(None, "not covered: the model was not probed for images")
    mm_pairs, mm_cases = image_pairs(images, setup.adapters, tenants, run_id)
    add("multimodal", mm_pairs, images.how + (f" ({images.fix})" if images.fix else ""), kind=IMAGE_KIND,
        variants=("exact",), cases=mm_cases)  # fmt: skip
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


REFUSABLE = {"salt-variant"}  # dimensions whose requests an engine may refuse (an empty salt): recorded, not fatal


def _run_probes(
    client: Client, plan: Plan, *, with_events: bool, hidden_size: int | None, progress: Progress,
    trials: tuple[Trial, ...] | None = None, loaded: dict[str, str] | None = None,
) -> tuple[ProbeResult, ...]:  # fmt: skip
    """Send every probe in order; load the adapter version a probe needs first.  Returns its ProbeResults."""
    results: list[ProbeResult] = []
    loaded = {} if loaded is None else loaded  # adapter name -> the path it points at now
    counters = client.counters()
    trials = plan.trials if trials is None else trials
    total = sum(len(t.fillers) + 3 for t in trials)
    n = 0
    for trial in trials:
        refused: str | None = None
        for probe in send_order(trial):
            n += 1
            if refused is not None:
                results.append(ProbeResult(probe, 0, None, time.time(), 0.0, None, None, None, None,
                                           f"not sent: {refused}"))  # fmt: skip
                continue
            partition = probe.partition
            if (
                partition.adapter_path is not None
                and partition.model
                and loaded.get(partition.model) != partition.adapter_path
            ):
                client.load_adapter(partition.model, partition.adapter_path, in_place=partition.model in loaded)
                loaded[partition.model] = partition.adapter_path
                counters = client.counters()
            try:
                reply = client.complete(probe, plan, with_events=with_events and probe.role != FILLER,
                                        hidden_size=hidden_size)  # fmt: skip
            except EndpointError as err:
                if probe.dimension not in REFUSABLE or err.status is None or not 400 <= err.status < 500:
                    raise
                refused = f"HTTP {err.status}: {err.answer}"
                results.append(ProbeResult(probe, 0, None, time.time(), 0.0, None, None, None, None, refused))
                counters = client.counters()
                continue
            after = client.counters()
            results.append(
                ProbeResult(probe, reply.cached_tokens, reply.prompt_tokens, reply.sent_at_s, reply.latency_s,
                            counters.queries_tokens, counters.hits_tokens, after.queries_tokens, after.hits_tokens,
                            engine=served_by(counters, after),
                            external_hits_before=counters.external_hits_tokens,
                            external_hits_after=after.external_hits_tokens)
            )  # fmt: skip
            counters = after
            if n % 25 == 0 or n == total:
                progress(f"probes: {n}/{total} sent")
    return tuple(results)


def _simpler(partition: Partition, salt: str) -> Partition:
    suffix = f"+{partition.model}" if partition.model else ""
    return dataclasses.replace(partition, label=f"salt={salt!r}{suffix}", cache_salt=salt)


def _minimize(
    client: Client, plan: Plan, results: tuple[ProbeResult, ...], options: IsolationOptions, setup: _Setup,
    with_events: bool, budget_left: int | None, progress: Progress, loaded: dict[str, str],
) -> tuple[list[Trial], list[ProbeResult]]:  # fmt: skip
    """For each leaking dimension, shrink its first leaking case: the shortest prompt that still leaks (a binary
    search between the longest passing and the leaking length, assuming a leak at n blocks means one at more),
    then the simplest salt pair of its kind (SIMPLE_SALTS).  Every step is one more trial, recorded; the verdicts
    pick the minimal leaking case from them (kvtool.vllm.isolation.verdicts)."""
    from kvtool.vllm.isolation.verdicts import LEAK, judge_trial

    by_trial: dict[str, dict[str, ProbeResult]] = {}
    for r in results:
        by_trial.setdefault(r.probe.trial, {})[r.probe.role] = r
    judged = {}
    for trial in plan.trials:
        got = by_trial.get(trial.id, {})
        if {"prime", "control", "victim"} <= got.keys() and not any(
            got[k].error for k in ("prime", "control", "victim")
        ):
            judged[trial.id] = judge_trial(got["prime"], got["control"], got["victim"], None, plan.block_size).verdict
    new_trials: list[Trial] = []
    new_results: list[ProbeResult] = []
    index = max((p.index for p in plan.probes), default=-1) + 1
    step = 0
    left = budget_left

    def attempt(trial: Trial, first: Partition, second: Partition, length: int) -> bool | None:
        nonlocal index, step, left
        if left is not None and left < 3:
            return None
        step += 1
        kind = trial.probes[0].kind
        fill: dict[str, Any] = {}
        if trial.fillers_after_prime:  # a second-tier trial shrinks with its fillers (kvtool.vllm.isolation.tier)
            from kvtool.vllm.isolation.tier import minimize_fields

            fill = minimize_fields(trial.fillers)
        group = DimensionPartitions(trial.dimension, ((first, second),), kind, variants=(trial.variant,),
                                    lengths=(length,), cases=(trial.case,), one_order=True,
                                    same_content=trial.dimension == "salt-embeds", **fill)  # fmt: skip
        seed = None if options.seed is None else options.seed * 7919 + step
        sub = plan_trials((group,), PlanOptions(plan.block_size, repeats=1, seed=seed,
                                                repeat_primes=options.repeat_primes), plan.run_id,
                          stage="min", first_index=index)  # fmt: skip
        if left is not None and left < trial_requests(sub.trials[0]):
            return None
        got = _run_probes(client, sub, with_events=with_events, hidden_size=setup.hidden_size,
                          progress=lambda _m: None, loaded=loaded)  # fmt: skip
        index += len(got)
        if left is not None:
            left -= len(got)
        new_trials.extend(sub.trials)
        new_results.extend(got)
        role = {r.probe.role: r for r in got}
        return judge_trial(role["prime"], role["control"], role["victim"], None, plan.block_size).verdict == LEAK

    for dimension in options.dimensions:
        leaking = [t for t in plan.trials if t.dimension == dimension and judged.get(t.id) == LEAK]
        if not leaking:
            continue
        trial = leaking[0]
        first, second = trial.probes[0].partition, trial.probes[2].partition
        passing = [t.full_blocks for t in plan.trials
                   if t.dimension == dimension and (t.first, t.second, t.case, t.variant) ==
                   (trial.first, trial.second, trial.case, trial.variant)
                   and judged.get(t.id) == "pass" and t.full_blocks < trial.full_blocks]  # fmt: skip
        lo, hi = max(passing, default=0), trial.full_blocks
        progress(f"minimizing the first leak of {dimension}: {trial.first} -> {trial.second}, {hi} blocks")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            leaked = attempt(trial, first, second, mid)
            if leaked is None:
                break
            lo, hi = (lo, mid) if leaked else (mid, hi)
        both_salted = first.cache_salt is not None and second.cache_salt is not None
        simple = SIMPLE_SALTS.get(trial.case)
        if simple is None and both_salted and trial.dimension != "salt-variant":  # salt x adapter: same kind
            simple = SIMPLE_SALTS[""] if first.cache_salt != second.cache_salt else ("a", "a")
        if simple and both_salted and (first.cache_salt, second.cache_salt) != simple:
            attempt(trial, _simpler(first, simple[0]), _simpler(second, simple[1]), hi)
    return new_trials, new_results


def _version(client: Client) -> str | None:
    try:
        value = client.get_json("/version").get("version")
    except Exception:  # an endpoint without /version is fine
        return None
    return str(value) if value is not None else None


def _check(
    client: Client, options: IsolationOptions, setup: _Setup, events_endpoint: str | None, mode: str, progress: Progress
) -> IsolationRecord:
    """Plan, probe, minimize, collect: the part both modes share."""
    models = client.models()
    served = tuple(str(m.get("id")) for m in models)
    base = options.base_model or (served[0] if served else None)
    if base is None:
        raise UsageError("the endpoint serves no model (/v1/models is empty)", where=client.base_url)
    client.base_model = base
    missing = [a for a in setup.adapters if a not in served]
    if missing and not setup.can_load_adapters:
        raise UsageError(f"adapter {missing[0]!r} is not served (served: {', '.join(served)})", where="--adapter")
    metrics_status, metrics = client.metrics_fetch()
    cache_config = parse_cache_config(metrics)
    block_size = options.block_size or discover_block_size(client)
    max_model_len = next((m.get("max_model_len") for m in models if m.get("id") == base), None)
    max_model_len = max_model_len if isinstance(max_model_len, int) else None
    limits = _limits(block_size, max_model_len, cache_config, options.budget_requests)
    run_id = new_run_id(options.seed)
    images = None
    if "multimodal" in options.dimensions:
        root = setup.model_dir or next((m.get("root") for m in models if m.get("id") == base), None)
        images = detect_images(client, config_takes_images(root) if root else None, run_id)
        progress(f"images: {images.how}")
    partitions, skipped = _partitions(setup, options, run_id, limits, images)
    if images is not None:
        images = dataclasses.replace(images, not_covered=not_covered_combinations(images, setup.adapters))
    connector = None
    if "tier" in options.dimensions:  # a second tier behind a KV connector (kvtool.vllm.isolation.tier)
        from kvtool.vllm.isolation.tier import add_tier, detect_connector

        connector = detect_connector(client, block_size, run_id)
        progress(f"KV connector {connector.text}")
        partitions, skipped = add_tier(partitions, skipped, connector, run_id, limits.pool_blocks, limits.max_blocks,
                                       options.budget_requests)  # fmt: skip
    reserve = 0 if options.budget_requests is None or not options.minimize else min(
        MINIMIZE_RESERVE, options.budget_requests // 10)  # fmt: skip
    search_budget = None if options.budget_requests is None else options.budget_requests - reserve
    plan = plan_trials(partitions, PlanOptions(block_size, repeats=options.repeats, seed=options.seed,
                                               repeat_primes=options.repeat_primes), run_id,
                       budget_requests=search_budget)  # fmt: skip
    plan = dataclasses.replace(plan, budget_requests=options.budget_requests)
    progress(f"{len(plan.trials)} trials, {len(plan.probes)} requests; block size {block_size}, prompts up to "
             f"{limits.max_blocks} blocks, pool {limits.pool_blocks or '?'} blocks")  # fmt: skip
    started = time.monotonic()
    loaded: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvtool-iso-events-") as folder:
        capture = _Capture(events_endpoint, Path(folder)) if events_endpoint else None
        if capture is not None:
            capture.start()
        last = None
        try:
            results = _run_probes(client, plan, with_events=capture is not None, hidden_size=setup.hidden_size,
                                  progress=progress, loaded=loaded)  # fmt: skip
            if options.minimize:
                left = None if options.budget_requests is None else options.budget_requests - len(results)
                extra_trials, extra = _minimize(client, plan, results, options, setup, capture is not None, left,
                                                progress, loaded)  # fmt: skip
                plan = dataclasses.replace(plan, trials=plan.trials + tuple(extra_trials))
                results = results + tuple(extra)
            last = plan.probes[-1].session_id if plan.probes else None
        finally:
            rows = capture.rows(last) if capture is not None else None
    seconds = round(time.monotonic() - started, 1)
    progress(f"{len(results)} requests in {seconds:g} s")
    events = None
    if rows is not None:
        sessions = {p.session_id for p in plan.probes}
        events = relevant_events(rows, sessions)
    engine = EngineInfo(mode, client.base_url, base, block_size, _version(client), events_endpoint, options.note,
                        cache_config, metrics_status, seconds,
                        engines=engine_count(parse_prefix_counters(metrics)),
                        kv_connector=None if connector is None else connector.text)  # fmt: skip
    # the probes are sent: from here on the record holds labels, never the tenants' keys (kvtool.vllm.isolation.record)
    return redact_keys(IsolationRecord(RECORD_FORMAT, engine, plan, results, events, skipped, images))


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
    takes_images = config_takes_images(model_dir)
    engine_args = options.engine_args
    scratch = Path(tempfile.mkdtemp(prefix="kvtool-iso-tmpl-"))
    if (takes_images and takes_images[0] and not has_chat_template(model_dir)
            and not any(a.startswith("--chat-template") for a in engine_args)):  # fmt: skip
        # the chat API needs a template to take the image probes (kvtool.vllm.isolation.multimodal)
        (scratch / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n", encoding="utf-8")
        engine_args += (f"--chat-template={scratch / 'chat_template.jinja'}",)
    spec = EngineSpec(python, model_dir, options.port or free_port(), events_port, options.block_size,
                      engine_args, options.startup_timeout_s)  # fmt: skip
    progress(f"starting vLLM on {model_dir} (port {spec.port}); this takes a while")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, True)
        engine = stack.enter_context(Engine(spec))
        progress(f"vLLM is up at {engine.url}")
        folder = engine.scratch / "adapters"
        paths = {n: write_random_adapter(folder / n, shape, str(model_dir), seed) for seed, n in enumerate("abv")}
        names = ("lora-a", "lora-b")  # a fresh engine: short names cannot collide
        client = Client(engine.url, base_model="base", api_key=options.api_key)
        for name, key in zip(names, "ab"):
            client.load_adapter(name, str(paths[key]), in_place=False)
        v2 = write_random_adapter(folder / "v2", shape, str(model_dir), 7)
        setup = _Setup(names, (str(paths["v"]), str(v2)), shape.hidden_size, can_load_adapters=True,
                       multimodal=takes_images[0] if takes_images else None, model_dir=model_dir)  # fmt: skip
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
