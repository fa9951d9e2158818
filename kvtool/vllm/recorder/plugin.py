"""kvtool's vLLM general plugin: the KV-event recorder, inert unless ``KVTOOL_RECORD`` names a file.

Registered as the ``vllm.general_plugins`` entry point ``kvtool_record`` (pyproject.toml; ``kvtool record``
generates the same entry point for a vLLM that does not have kvtool installed).  vLLM 0.32 loads that group in
every process it starts; in the engine-core process that is the first statement of ``EngineCore.__init__``,
before the scheduler exists.  So :func:`register` only wraps ``Scheduler.__init__``; each scheduler created
afterwards (one per engine, i.e. per data-parallel rank) gets its own recorder and writer thread.  Other
processes (the API server, the workers) never create a scheduler and record nothing.

Environment (read when the plugin loads):

- ``KVTOOL_RECORD``: the events file, ``.csv`` or ``.parquet`` (``.dpN`` inserted per data-parallel rank when
  there are several);
- ``KVTOOL_RECORD_SAMPLE``: the share of requests recorded (0 < rate <= 1, default 1), by a hash of the id;
- ``KVTOOL_RECORD_APPENDS``: ``all`` (default) or ``blocks``: record only the appends that add blocks;
- ``KVTOOL_RECORD_FORCE=1``: record on a vLLM version other than the supported ones.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from kvtool.vllm.recorder.recorder import APPENDS, Recorder, RecorderOptions, say
from kvtool.vllm.recorder.writer import kvtool_version

SUPPORTED_VLLM = ("0.32.",)  # the versions whose scheduler and KV-cache manager these hooks were read from
ENV_PATH, ENV_SAMPLE, ENV_APPENDS, ENV_FORCE = (
    "KVTOOL_RECORD",
    "KVTOOL_RECORD_SAMPLE",
    "KVTOOL_RECORD_APPENDS",
    "KVTOOL_RECORD_FORCE",
)
ENTRY_POINT = "kvtool_record"
SUFFIXES = (".csv", ".parquet")

_state: dict[str, Any] = {"registered": False}
_closers: list[Any] = []  # one per recording engine in this process: flush, stop the writer, write the meta file


def options_from_env(env: dict[str, str] | os._Environ) -> RecorderOptions | None:
    """The recorder's options, None when ``KVTOOL_RECORD`` is unset; ValueError for a bad value."""
    path = env.get(ENV_PATH, "").strip()
    if not path:
        return None
    if not path.lower().endswith(SUFFIXES):
        raise ValueError(f"{ENV_PATH}={path!r} must end in .csv or .parquet")
    text = env.get(ENV_SAMPLE, "1").strip() or "1"
    try:
        sample = float(text)
    except ValueError:
        raise ValueError(f"{ENV_SAMPLE}={text!r} is not a number") from None
    if not 0 < sample <= 1:
        raise ValueError(f"{ENV_SAMPLE}={text!r} must be a share in (0, 1]")
    appends = env.get(ENV_APPENDS, "all").strip().lower() or "all"
    if appends not in APPENDS:
        raise ValueError(f"{ENV_APPENDS}={appends!r} must be one of {', '.join(APPENDS)}")
    return RecorderOptions(path=os.path.abspath(path), sample=sample, appends=appends)


def supported(version: str) -> bool:
    return version.startswith(SUPPORTED_VLLM)


def register() -> None:
    """The entry point: wrap ``Scheduler.__init__`` when ``KVTOOL_RECORD`` is set; otherwise do nothing at all."""
    if _state["registered"]:
        return
    try:
        options = options_from_env(os.environ)
    except ValueError as err:
        say(f"{err}; not recording")
        return
    if options is None:
        return
    _state["registered"] = True
    try:
        import vllm
        from vllm.v1.core.sched.scheduler import Scheduler
    except Exception as err:  # not a vLLM with the v1 engine
        say(f"cannot import vLLM's scheduler ({type(err).__name__}: {err}); not recording")
        return
    version = getattr(vllm, "__version__", "unknown")
    if not supported(version) and os.environ.get(ENV_FORCE) != "1":
        say(
            f"vLLM {version} is not a supported version (kvtool {kvtool_version()} supports "
            f"{', '.join(v + 'x' for v in SUPPORTED_VLLM)}); not recording. Set {ENV_FORCE}=1 to try anyway"
        )
        return
    _wrap_scheduler_init(Scheduler, options)
    try:
        from vllm.v1.engine.core import EngineCore

        _close_before(EngineCore)
    except Exception as err:  # the recording still closes at scheduler shutdown or at exit
        say(f"cannot hook EngineCore.shutdown ({type(err).__name__}: {err})")


def close_all() -> None:
    for close in list(_closers):
        try:
            close()
        except Exception as err:
            say(f"closing the recording failed: {type(err).__name__}: {err}")


def _close_before(engine_cls: Any) -> None:
    """Close the recordings first thing in ``EngineCore.shutdown``.

    vLLM shuts the model executor down before the scheduler, and may kill the engine-core process while it waits
    for its workers, so neither ``Scheduler.shutdown`` nor ``atexit`` is sure to run.
    """
    original = engine_cls.shutdown
    if getattr(original, "_kvtool_recorder", False):
        return

    @functools.wraps(original)
    def shutdown(self, *args, **kwargs):
        close_all()
        return original(self, *args, **kwargs)

    shutdown._kvtool_recorder = True  # type: ignore[attr-defined]
    engine_cls.shutdown = shutdown


def _wrap_scheduler_init(scheduler_cls: Any, options: RecorderOptions) -> None:
    original = scheduler_cls.__init__
    if getattr(original, "_kvtool_recorder", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            start_recording(self, options)
        except Exception as err:
            say(f"not recording: {type(err).__name__}: {err}")

    __init__._kvtool_recorder = True  # type: ignore[attr-defined]
    scheduler_cls.__init__ = __init__


@dataclasses.dataclass(frozen=True)
class EngineFacts:
    """What the scheduler knows about its engine, written to the ``.meta.json`` beside the events."""

    vllm_version: str
    dp_rank: int
    dp_size: int
    block_size: int  # tokens per block of the first KV-cache group (the ``block_size`` column)
    num_blocks: int  # blocks in the pool, the null block included
    # (spec class, block size, sliding window in tokens or None) of each KV-cache group; files recorded before
    # kvtool issue 28 hold (spec class, block size) pairs
    groups: tuple[tuple[str, int, int | None], ...]
    request_ids_randomized: bool  # vLLM added a random suffix to request ids (stripped in the file)


def engine_facts(scheduler: Any) -> EngineFacts:
    import vllm
    from vllm import envs

    parallel = scheduler.vllm_config.parallel_config
    groups = tuple(
        (type(g.kv_cache_spec).__name__, int(g.kv_cache_spec.block_size), _window(g.kv_cache_spec))
        for g in scheduler.kv_cache_config.kv_cache_groups
    )
    return EngineFacts(
        vllm_version=vllm.__version__,
        dp_rank=int(getattr(parallel, "data_parallel_rank", 0) or 0),
        dp_size=int(getattr(parallel, "data_parallel_size", 1) or 1),
        block_size=groups[0][1] if groups else int(scheduler.block_size),
        num_blocks=int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks),
        groups=groups,
        request_ids_randomized=not envs.VLLM_DISABLE_REQUEST_ID_RANDOMIZATION,
    )


def _window(spec: Any) -> int | None:
    """A sliding-window spec's window in tokens (``SlidingWindowSpec.sliding_window``), else None."""
    window = getattr(spec, "sliding_window", None)
    return int(window) if isinstance(window, int) and window > 0 else None


def windowed_groups(scheduler: Any) -> tuple[int, ...]:
    """KV-cache groups whose manager can release blocks mid-request (sliding window, chunked local, Mamba)."""
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager as Base

    out = []
    for i, manager in enumerate(scheduler.kv_cache_manager.coordinator.single_type_managers):
        cls = type(manager)
        if cls.remove_skipped_blocks is not Base.remove_skipped_blocks or (
            cls.get_num_skipped_tokens is not Base.get_num_skipped_tokens
        ):
            out.append(i)
    return tuple(out)


def start_recording(scheduler: Any, options: RecorderOptions) -> Recorder:
    """A recorder, its writer thread and the hooks for one scheduler; closed at shutdown or at exit."""
    from vllm.v1.request import RequestStatus

    from kvtool.vllm.recorder.hooks import Hooks

    facts = engine_facts(scheduler)
    recorder, close = open_recording(facts, options)
    hooks = Hooks(scheduler, recorder, RequestStatus.FINISHED_ABORTED)
    hooks.install(windowed_groups(scheduler))
    original_shutdown = scheduler.shutdown

    def shutdown(*args, **kwargs):
        try:
            close()
        except Exception as err:  # never stand in the way of vLLM's own shutdown
            say(f"closing the recording failed: {type(err).__name__}: {err}")
        return original_shutdown(*args, **kwargs)

    scheduler.shutdown = shutdown
    return recorder


def open_recording(facts: EngineFacts, options: RecorderOptions) -> tuple[Recorder, Callable[[], None]]:
    """The recorder and writer thread of one engine, and the function that closes them (also run at exit).

    Everything an engine's recording does except the hooks on vLLM's scheduler (so it is tested without vLLM): the
    meta file is written now, marked open, and again at close.
    """
    from kvtool.vllm.recorder.writer import RowWriter, output_paths, strip_request_id, write_meta

    paths = output_paths(options.path, facts.dp_rank, facts.dp_size)
    writer = RowWriter(paths, facts.block_size, facts.request_ids_randomized, hybrid=len(facts.groups) > 1)
    recorder = Recorder(
        options,
        writer.put,
        spare=writer.spare,
        client_id=lambda rid: strip_request_id(rid, facts.request_ids_randomized),
        groups=len(facts.groups),
        sink_error=lambda: writer.error,
    )
    started = time.time()
    # written now and again at close: an engine killed before closing (vllm serve's shutdown kills its engine core)
    # still leaves what kvtool record needs to finish the file
    write_meta(paths, {**_base_meta(facts, options, started), "open": True})
    close = functools.partial(_close, recorder, writer, paths, facts, options, started)
    _closers.append(close)
    atexit.register(close)
    sampled = "" if options.sample >= 1 else f", {options.sample:g} of requests"
    say(f"recording KV-block events of DP rank {facts.dp_rank} to {paths.target}{sampled}")
    return recorder, close


def _base_meta(facts: EngineFacts, options: RecorderOptions, started: float) -> dict[str, Any]:
    return {
        "kvtool_version": kvtool_version(),
        **dataclasses.asdict(facts),
        "sample": options.sample,
        "appends": options.appends,
        "started_ts": started,
    }


def _close(recorder: Recorder, writer: Any, paths: Any, facts: EngineFacts, options: RecorderOptions, started: float):
    """Flush the last rows, stop the writer, convert a Parquet spool, write the meta file (once)."""
    from kvtool.vllm.recorder.writer import describe_write_error, finish_output

    if recorder.closed:
        return
    recorder.closed = True
    recorder.hand_over()
    recorder.on = False
    writer.close()
    if writer.error is not None and (recorder.off_reason or "the writer thread").startswith("the writer thread"):
        # the writer's own error says more than the recorder's "turned off after an error in the writer thread"
        recorder.off_reason = describe_write_error(paths.spool, writer.error)
        say(f"{recorder.off_reason}; the file holds what was written before")
    meta = {
        **_base_meta(facts, options, started),
        "open": False,
        "rows": writer.rows_written,
        "steps": recorder.step,
        "recorder_s": recorder.cost_ns / 1e9,  # the recorder's code on the engine thread
        "writer_cpu_s": writer.cpu_s,  # formatting and writing on the writer thread
        "closed_ts": time.time(),
        "turned_off": recorder.off_reason,
    }
    finish_output(paths, meta, say)
    say(f"wrote {writer.rows_written:,} rows over {recorder.step:,} engine steps to {paths.target}")
