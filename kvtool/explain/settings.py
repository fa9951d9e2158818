"""The settings a start-up log ran with (version, engine arguments, GPU memory), as kvtool's estimate request takes
them: what the log says, vLLM's defaults for what it leaves out, and where each came from."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtool.core.errors import KvtoolError
from kvtool.core.units import parse_size
from kvtool.estimate.capacity import DEFAULT_BLOCK_SIZE
from kvtool.estimate.request import EstimateRequest
from kvtool.estimate.vllm_log_lines import releases_logging
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, resolve_vllm_version, version_key
from kvtool.explain.parse import StartupLog, gib_bytes

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vllm/config/cache.py CacheConfig.gpu_memory_utilization (every release)


@dataclasses.dataclass(frozen=True)
class Given:
    """What the user gave beside the log: the model when its id does not resolve here, the GPU when the log has no
    device total, a version to use instead of the logged one."""

    model: str | None = None
    config: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None
    vllm_version: str | None = None
    profile_dirs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """The engine as the log describes it, in estimate's terms."""

    vllm_version: str  # the modelled release whose rules apply
    version_source: str  # in words: the logged line, the call sites, --vllm-version or the default
    model: str | None
    config: str | None
    max_model_len: int | None
    gpu_memory_utilization: float
    kv_dtype: str
    tp: int
    pp: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    block_size: int
    enforce_eager: bool
    prefix_caching: bool | None  # None: not in the log, vLLM's default for the model and release
    quantization: str | None
    dtype: str | None  # the dtype engine argument (None: auto)
    async_scheduling: bool
    kv_cache_memory_bytes: int | None  # --kv-cache-memory(-bytes): the budget set by hand
    gpu: str | None
    gpu_memory_bytes: int | None  # the device total: --gpu-memory, else the suggestion line's
    gpu_memory_rounding_bytes: int  # how far the logged total may be off (0 when given)
    gpu_memory_source: str | None
    profile_dirs: tuple[str, ...]
    warnings: tuple[str, ...]

    def request(self, **changes: Any) -> EstimateRequest:
        """The estimate request of these settings (``changes`` by EstimateRequest field)."""
        base = EstimateRequest(
            model=self.model,
            config=self.config,
            seq_lens=(self.max_model_len,) if self.max_model_len else (),
            kv_dtype=self.kv_dtype,
            tp=self.tp,
            pp=self.pp,
            gpu=self.gpu,
            gpu_memory=None if self.gpu_memory_bytes is None else str(self.gpu_memory_bytes),
            gpu_memory_utilization=self.gpu_memory_utilization,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            quantization=self.quantization,
            dtype=self.dtype,
            async_scheduling=self.async_scheduling,
            enforce_eager=self.enforce_eager,
            prefix_caching=self.prefix_caching,
            vllm_version=self.vllm_version,
            profile_dirs=self.profile_dirs,
            suggest=False,
        )
        return dataclasses.replace(base, **changes)


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("True", "False"):
        return value == "True"
    return None


def _release(log: StartupLog, given: Given) -> tuple[str, str, tuple[str, ...]]:
    """The release whose rules apply, how it was found, and a warning when it was not logged as a release."""
    if given.vllm_version:
        return resolve_vllm_version(given.vllm_version), f"--vllm-version {given.vllm_version}", ()
    if log.version:
        try:
            return resolve_vllm_version(log.version), f"logged: vLLM {log.version} (line {log.version_line})", ()
        except KvtoolError:
            pass  # a source build ("0.1.dev8168+g475c1a0") or a release kvtool does not model: try the call sites
    sites = [set(releases_logging(file, line, text)) for file, line, text in log.call_sites]
    sites = [s for s in sites if s]
    if sites and (common := set.intersection(*sites)):
        newest = max(common, key=version_key)
        return newest, f"from the source lines of its log calls ({', '.join(sorted(common, key=version_key))})", ()
    said = f"vLLM {log.version}" if log.version else "no vLLM version"
    return (
        NEWEST_RELEASE,
        f"not logged as a modelled release: {NEWEST_RELEASE} (kvtool's newest)",
        (f"the log names {said}; the rules of {NEWEST_RELEASE} are used (give --vllm-version to choose)",),
    )


def _gpu_memory(log: StartupLog, given: Given, util: float) -> tuple[int | None, int, str | None]:
    """The device total: --gpu-memory, the suggestion line's, else the DEBUG "Requested memory" over the
    utilisation (requested = util x total, gpu_worker.py determine_available_memory)."""
    if given.gpu_memory:
        return parse_size(given.gpu_memory, option="--gpu-memory"), 0, "--gpu-memory"
    if given.gpu:
        return None, 0, "--gpu"
    suggestion = next((r.suggestion for r in [log.explained_rank, *log.ranks] if r.suggestion), None)
    if suggestion is not None:
        return (
            gib_bytes(suggestion.total_gib),
            gib_bytes(0.005),
            f"logged: device total {suggestion.total_gib} GiB (line {suggestion.line})",
        )
    requested = next((r.requested_gib for r in [log.explained_rank, *log.ranks] if r.requested_gib), None)
    if requested is not None:
        return (
            gib_bytes(requested.value / util),
            gib_bytes(requested.rounding / util),
            f"logged requested {requested.value} GiB / {util} (line {requested.line})",
        )
    return None, 0, None


def log_settings(log: StartupLog, given: Given) -> LogSettings:
    """The settings of the log's engine: its non-default args, its engine config line, else vLLM's defaults."""
    args, config = log.args, log.engine_config
    release, version_source, warnings = _release(log, given)
    util = float(args.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    total, rounding, total_source = _gpu_memory(log, given, util)
    kv_memory = args.get("kv_cache_memory_bytes", args.get("kv_cache_memory"))
    eager = _flag(args.get("enforce_eager", config.get("enforce_eager")))
    caching = _flag(args.get("enable_prefix_caching", config.get("enable_prefix_caching")))
    quantization = args.get("quantization") or config.get("quantization")
    return LogSettings(
        vllm_version=release,
        version_source=version_source,
        model=given.model or (None if given.config else log.model),
        config=given.config,
        max_model_len=log.max_model_len,
        gpu_memory_utilization=util,
        kv_dtype=str(args.get("kv_cache_dtype") or config.get("kv_cache_dtype") or "auto"),
        tp=log.tp,
        pp=log.pp,
        max_num_seqs=log.max_num_seqs,
        max_num_batched_tokens=log.max_num_batched_tokens,
        # the hybrid attention block ("Setting attention block size") estimate derives itself; a platform's
        # override is what the engine ran with
        block_size=log.block_size_override or _int(args.get("block_size")) or DEFAULT_BLOCK_SIZE,
        enforce_eager=bool(eager),
        prefix_caching=caching,
        quantization=None if quantization in (None, "None") else str(quantization),
        dtype=None if args.get("dtype") in (None, "auto") else str(args["dtype"]),
        async_scheduling=_async_scheduling(args, config),
        kv_cache_memory_bytes=_int(kv_memory),
        gpu=given.gpu,
        gpu_memory_bytes=total,
        gpu_memory_rounding_bytes=rounding,
        gpu_memory_source=total_source,
        profile_dirs=given.profile_dirs,
        warnings=warnings,
    )


def _async_scheduling(args: dict[str, Any], config: dict[str, str]) -> bool:
    """The log's async scheduling: its argument, else off on the CPU backend (vllm/platforms/cpu.py
    check_and_update_config sets scheduler_config.async_scheduling = False), else on (estimate's default)."""
    given = _flag(args.get("async_scheduling", config.get("async_scheduling")))
    if given is not None:
        return given
    return config.get("device_config") != "cpu"


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
