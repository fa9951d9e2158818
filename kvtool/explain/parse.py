"""A vLLM start-up log read into a :class:`StartupLog`: the version, the engine arguments and every memory figure,
each with the line it came from.

The format strings are vLLM's own, read from each release's source (0.10.0-0.33.0):

- ``Available KV cache memory: %.2f GiB`` (0.10-0.18) / ``%s GiB`` (format_gib, 0.19+):
  vllm/v1/worker/gpu_worker.py determine_available_memory
- ``Model loading took %.4f GiB and %.6f seconds`` (0.10-0.12), ``... GiB memory and ...`` (0.13+):
  vllm/v1/worker/gpu_model_runner.py load_model
- ``Memory profiling takes ... Total non KV cache memory: ...GiB; torch peak memory increase: ...GiB;
  non-torch forward increase memory: ...GiB; weights memory: ...GiB.`` (0.10-0.26), ``total consumed (from
  mem_get_info): ...GiB`` in place of the non-torch term (0.27+): vllm/utils/mem_utils.py MemoryProfilingResult
  __repr__ (vllm/utils/__init__.py in 0.10-0.11.0), logged at DEBUG
- ``GPU KV cache size: %s tokens`` and ``Maximum concurrency for %s tokens per request: %.2fx`` on two lines
  (0.10-0.27), on one line (0.28+), ``%s KV cache size`` with the device name (``GPU``, ``CPU``; 0.31+):
  vllm/v1/core/kv_cache_utils.py _report_kv_cache_config / update_kv_cache_capacity
- ``Graph capturing finished in %.0f secs, took %.2f GiB`` (the captured pool): gpu_model_runner.py capture_model;
  ``Estimated CUDA graph memory: %.2f GiB total`` (0.18+): gpu_model_runner.py profile_cudagraph_memory;
  ``CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: ...`` (0.18+, round(x, 2)):
  gpu_worker.py compile_or_warm_up_model; whether the estimate was taken from the budget: ``CUDA graph memory
  profiling is enabled`` / ``... is disabled`` (0.18+) and ``In v0.19, CUDA graph memory profiling will be enabled
  by default`` (0.18-0.19, printed when it is not): gpu_worker.py determine_available_memory
- ``Free memory on device (F/T GiB) on startup. Desired GPU memory utilization is (U, R GiB). Actual usage is ...
  --kv-cache-memory=N ... --kv-cache-memory=M ... Current kv cache memory in use is K GiB.``: gpu_worker.py
  compile_or_warm_up_model (DEBUG until 0.2x, INFO in 0.33), with "W GiB for weight, A GiB for peak activation,
  N GiB for non-torch memory, and G GiB for CUDAGraph memory" or, 0.27+, "C GiB for consumed memory (weights +
  non-torch), A GiB for peak activation, and G GiB for CUDAGraph memory" (G is the captured pool, capture_model's
  return value); its opening ``Free memory on device (F/T GiB)`` is also read alone (excerpts cut the line there)
- ``... num_gpu_blocks is: N`` (vllm/v1/metrics/loggers.py, the engine's cache_config_info)
- the version: ``vLLM API server version %s`` (vllm/entrypoints/openai/api_server.py), the banner's ``version %s``
  (vllm/entrypoints/utils.py), ``vLLM server version %s, serving model %s`` (0.33), ``Initializing a V1 LLM engine
  (v%s) with config: ...`` (vllm/v1/engine/core.py); ``non-default args: %s`` (vllm/entrypoints/openai/cli_args.py,
  later utils.py / api_utils.py / common/startup.py); ``Using max model len %s`` (vllm/config/model.py);
  ``Chunked prefill is enabled with max_num_batched_tokens=%d.`` (vllm/config/scheduler.py);
  ``Setting attention block size to %d tokens`` (vllm/model_executor/models/config.py, later interface.py)

Lines are matched anywhere in the line, so any prefix (``(EngineCore_DP0 pid=1) INFO 09-12 10:00:00 [file.py:1]``,
``(VllmWorker rank=3 pid=..)``, ``(Worker_PP1_TP0 pid=..)``, none at all) is read; the prefix names the rank.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any

from kvtool.core.errors import InputFileError
from kvtool.core.units import GIB

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


@dataclasses.dataclass(frozen=True)
class Figure:
    """One number read from the log, with where it came from."""

    value: (
        float  # as logged, in the line's unit (GiB for memory, tokens, x for concurrency, bytes for --kv-cache-memory)
    )
    line: int  # 1-based line number in the log
    decimals: int  # the decimals the log printed (the rounding of ``value``: +-0.5 x 10^-decimals)

    @property
    def rounding(self) -> float:
        """Half a unit of the last printed decimal: how far the true value may be from the logged one."""
        return 0.5 * 10.0**-self.decimals


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """vLLM's ``--kv-cache-memory`` suggestion line (gpu_worker.py compile_or_warm_up_model, 0.10.2+)."""

    line: int
    free_gib: float  # free memory on device at start-up
    total_gib: float  # the device's total memory
    gpu_memory_utilization: float
    requested_gib: float  # util x total
    weights_gib: float | None  # 0.10-0.26 ("GiB for weight")
    non_torch_gib: float | None  # 0.10-0.26
    consumed_gib: float | None  # 0.27+: weights + non-torch ("GiB for consumed memory")
    activation_gib: float
    cudagraph_gib: float
    to_requested_bytes: int  # the first --kv-cache-memory=N ("to fit into requested memory")
    to_gpu_bytes: int  # the second ("to fully utilize gpu memory")
    current_kv_gib: float  # "Current kv cache memory in use" (0.10.2-0.11.0 print bytes: converted)
    current_kv_unit: str = "GiB"  # the unit the line printed it in ("bytes" in 0.10.2-0.11.0)


@dataclasses.dataclass(frozen=True)
class RankFigures:
    """The figures one worker (one TP/PP rank) logged about its own memory."""

    rank: str  # as the prefix names it: "0", "TP1", "PP1_TP0"; "-" when the line has no worker prefix
    available_kv_gib: Figure | None = None
    weights_gib: Figure | None = None  # "Model loading took"
    profile_non_kv_gib: Figure | None = None  # DEBUG "Total non KV cache memory"
    profile_torch_peak_gib: Figure | None = None  # DEBUG "torch peak memory increase"
    profile_non_torch_gib: Figure | None = None  # DEBUG "non-torch forward increase memory" (0.10-0.26)
    profile_consumed_gib: Figure | None = None  # DEBUG "total consumed (from mem_get_info)" (0.27+)
    profile_weights_gib: Figure | None = None  # DEBUG "weights memory"
    cudagraph_estimate_gib: Figure | None = None  # "Estimated CUDA graph memory" (0.19+)
    cudagraph_captured_gib: Figure | None = None  # "Graph capturing finished in .. took" (the captured pool)
    # "CUDA graph pool memory: A GiB (actual), E GiB (estimated)" (0.18+): the captured pool and the estimate again
    cudagraph_pool_actual_gib: Figure | None = None
    cudagraph_pool_estimate_gib: Figure | None = None
    free_on_startup_gib: Figure | None = None  # "Free memory on device (F/T GiB)": F, or "Initial free memory: F GiB"
    device_total_gib: Figure | None = None  # ... T
    requested_gib: Figure | None = None  # DEBUG "Requested memory: U (util), R GiB" (gpu_worker.py, 0.10+)
    suggestion: Suggestion | None = None

    @property
    def sort_key(self) -> tuple[int, ...]:
        """PP stage first, then TP rank (a bare ``rank=N`` is global already); no prefix sorts first."""
        numbers = [int(n) for n in re.findall(r"\d+", self.rank)]
        return tuple(numbers) if numbers else (-1,)


@dataclasses.dataclass(frozen=True)
class StartupLog:
    """Everything kvtool read from one vLLM start-up log."""

    source: str  # the file name, or "<stdin>"
    version: str | None
    version_line: int | None
    args: dict[str, Any]  # "non-default args" as vLLM printed them (values it could not read back as text)
    args_line: int | None
    engine_config: dict[str, str]  # selected key=value pairs of "Initializing a V1 LLM engine ... with config:"
    model: str | None  # the served model id or path
    tp: int
    pp: int
    max_model_len: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None  # the args', else the DEBUG "Setting max_num_seqs to N" default
    attention_block_size: int | None  # "Setting attention block size to N tokens" (hybrid models)
    block_size_override: int | None  # the platform's block size over the asked one ("requires block_size=N")
    ranks: tuple[RankFigures, ...]  # sorted by rank
    kv_pool: str  # "GPU", "CPU", ...: the device the KV cache size line names
    kv_cache_tokens: Figure | None  # the pool's (the smallest when each worker printed one)
    concurrency: Figure | None  # "Maximum concurrency ... : N x", paired with kv_cache_tokens
    concurrency_max_model_len: int | None  # the "for N tokens per request" of that line
    # "CUDA graph memory profiling is enabled/disabled" (gpu_worker.py determine_available_memory, 0.19+): whether
    # the estimate was taken from the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS); None when not logged
    cudagraph_estimate_subtracted: bool | None
    num_gpu_blocks: int | None  # the engine's "num_gpu_blocks is: N" (metrics cache_config_info); None when not logged
    # (file, source line, text) of each KV line's "[file.py:NNN]" prefix: the releases it can come from
    call_sites: tuple[tuple[str, int, str], ...]

    @property
    def explained_rank(self) -> RankFigures:
        """The rank whose figures set the pool. vLLM sizes every worker's cache to the smallest number of blocks
        (vllm/v1/core/kv_cache_utils.py get_kv_cache_configs / unify_kv_cache_configs): under TP every rank holds the
        same layers, so that is the rank with the least available KV memory (ties: the lowest rank). Pipeline
        stages hold different layers, so their GiB do not compare: with PP the first rank (stage 0) is explained."""
        with_kv = [r for r in self.ranks if r.available_kv_gib is not None]
        if not with_kv:
            return self.ranks[0] if self.ranks else RankFigures("-")
        if self.pp > 1:
            return with_kv[0]
        return min(with_kv, key=lambda r: (r.available_kv_gib.value if r.available_kv_gib else 0.0, r.sort_key))


_RANK_PATTERNS = (
    re.compile(r"^\((?:VllmWorker|Worker)[ _]?rank=(\d+)"),
    re.compile(r"^\((?:VllmWorker|Worker)[ _]((?:DP\d+_)?(?:PP\d+_?)?(?:TP\d+)?(?:_EP\d+)?)\b"),
    re.compile(r"^\((?:VllmWorker|Worker|RayWorkerWrapper)\S*\s+rank=(\d+)"),
)

_VERSION_PATTERNS = (
    re.compile(r"vLLM (?:API )?server version (\S+?)(?:,|\s|$)"),
    re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)"),
    re.compile(r"Initializing an? (?:V0 )?LLM engine \(v([^)]+)\)"),
    re.compile(r"\bversion (\d+\.\d+\.\d+\S*)\s*$"),  # the banner (vllm/entrypoints/utils.py)
)

_FIGURES: dict[str, re.Pattern[str]] = {
    "available_kv_gib": re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB"),
    "weights_gib": re.compile(r"Model loading took " + _NUM + r" ?GiB"),
    "profile_non_kv_gib": re.compile(r"Total non KV cache memory: " + _NUM + r" ?GiB"),
    "profile_torch_peak_gib": re.compile(r"torch peak memory increase: " + _NUM + r" ?GiB"),
    "profile_non_torch_gib": re.compile(r"non-torch forward increase memory: (-?" + _NUM[1:] + r" ?GiB"),
    "profile_consumed_gib": re.compile(r"total consumed \(from mem_get_info\): " + _NUM + r" ?GiB"),
    "profile_weights_gib": re.compile(r"; weights memory: " + _NUM + r" ?GiB"),
    "cudagraph_estimate_gib": re.compile(r"Estimated CUDA graph memory: " + _NUM + r" ?GiB"),
    "requested_gib": re.compile(r"Requested memory: [0-9.]+ \(util\), " + _NUM + r" ?GiB"),
    "cudagraph_captured_gib": re.compile(r"Graph capturing finished in \S+ secs?, took (-?" + _NUM[1:] + r" ?GiB"),
    "cudagraph_pool_actual_gib": re.compile(r"CUDA graph pool memory: (-?" + _NUM[1:] + r" GiB \(actual\)"),
    "cudagraph_pool_estimate_gib": re.compile(r"CUDA graph pool memory: .*?, (-?" + _NUM[1:] + r" GiB \(estimated\)"),
    # the same init_snapshot.free_memory: "Initial free memory: F GiB; Requested memory" (DEBUG, determine_available_memory)
    "free_on_startup_gib": re.compile(r"(?:Free memory on device \(|Initial free memory: )" + _NUM + r"(?:/| GiB; )"),
    "device_total_gib": re.compile(r"Free memory on device \([0-9.,]+/" + _NUM + r" GiB\)"),
}
# figures vLLM prints with "%s" of round(x, 2): "0.7" is 0.70 to two decimals
_TWO_DECIMALS = {"cudagraph_pool_actual_gib", "cudagraph_pool_estimate_gib"}
_KV_SIZE = re.compile(r"(\w+(?: \+ host)?) KV cache size: " + _NUM + r" tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r" ?x")
_SUGGESTION = re.compile(
    r"Free memory on device \(" + _NUM + r"/" + _NUM + r" GiB\) on startup\. Desired GPU memory utilization is "
    r"\(" + _NUM + r", " + _NUM + r" GiB\)\. Actual usage is (?P<usage>.*?)\. Replace gpu_memory_utilization "
    r"config with `--kv-cache-memory=(-?\d+)`.*?`--kv-cache-memory=(-?\d+)`.*?"
    r"Current kv cache memory in use is " + _NUM + r" (GiB|bytes)"
)
_USAGE_OLD = re.compile(
    _NUM + r" GiB for weight, " + _NUM + r" GiB for peak activation, (-?" + _NUM[1:] + r" GiB for non-torch memory, "
    r"and (-?" + _NUM[1:] + r" GiB for CUDAGraph memory"
)
_USAGE_NEW = re.compile(
    _NUM
    + r" GiB for consumed memory \(weights \+ non-torch\), "
    + _NUM
    + r" GiB for peak activation, and (-?"
    + _NUM[1:]
    + r" GiB for CUDAGraph memory"
)
_ARGS = re.compile(r"non-default args: (\{.*\})\s*$")
_ENGINE_CONFIG = re.compile(r"LLM engine \(v[^)]*\) with config: (.*)$")
_ENGINE_KEYS = (
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_seq_len",
    "kv_cache_dtype",
    "quantization",
    "enforce_eager",
    "enable_prefix_caching",
    "dtype",
    "device_config",
    "async_scheduling",
)
_MAX_MODEL_LEN = re.compile(r"Using max model len (\d+)")
_BATCHED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
# vllm/engine/arg_utils.py _set_default_args (DEBUG): the usage context's defaults
_DEFAULT_SEQS = re.compile(r"Setting max_num_seqs to (\d+) for \w+ usage context")
_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
# vllm/platforms/cpu.py check_and_update_config: "CPU MLA backend requires block_size=16, overriding user-specified
# block_size=32."
_BLOCK_OVERRIDE = re.compile(r"requires block_size=(\d+), overriding user-specified block_size=\d+")
_CG_PROFILING = re.compile(r"CUDA graph memory profiling (is enabled|is disabled|will be enabled by default)")
_NUM_GPU_BLOCKS = re.compile(r"num_gpu_blocks is: (\d+)")
_CALL_SITE = re.compile(r"\[(?:[\w/]*/)?(\w+\.py):(\d+)\] (.*)$")
_SITE_TEXTS = ("Available KV cache memory", "Model loading took", "KV cache size", "Maximum concurrency for")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def _figure(text: str, line: int) -> Figure:
    return Figure(_number(text), line, _decimals(text))


def _rank_of(line: str) -> str:
    for pattern in _RANK_PATTERNS:
        m = pattern.match(line)
        if m and m.group(1):
            return m.group(1)
    return "-"


def _read_args(text: str) -> dict[str, Any]:
    """vLLM prints the dict with repr(); a value it cannot read back (``<Enum: 1>``) is kept as its text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    found: dict[str, Any] = {}
    for m in re.finditer(r"'(\w+)': ('[^']*'|[^,}]+)", text):
        try:
            found[m.group(1)] = ast.literal_eval(m.group(2).strip())
        except (ValueError, SyntaxError):
            found[m.group(1)] = m.group(2).strip()
    return found


def _read_engine_config(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for key in _ENGINE_KEYS:
        m = re.search(r"(?:^|, )" + key + r"=('[^']*'|[^,]+)", text)
        if m:
            found[key] = m.group(1).strip("'")
    return found


def _read_suggestion(m: re.Match[str], line: int) -> Suggestion | None:
    usage = m.group("usage")
    old, new = _USAGE_OLD.search(usage), _USAGE_NEW.search(usage)
    if old is None and new is None:
        return None
    groups = m.groups()
    free, total, util, requested = (_number(g) for g in groups[:4])
    to_requested, to_gpu, current = int(groups[5]), int(groups[6]), _number(groups[7])
    if groups[8] == "bytes":  # 0.10.2-0.11.0 print the bytes
        current = current / GIB
    weights: float | None = None
    non_torch: float | None = None
    consumed: float | None = None
    if old is not None:  # 0.10-0.26: weights and non-torch apart
        weights, activation, non_torch, graphs = (_number(g) for g in old.groups())
    else:  # 0.27+: their sum, "consumed memory"
        assert new is not None
        consumed, activation, graphs = (_number(g) for g in new.groups())
    return Suggestion(
        line,
        free,
        total,
        util,
        requested,
        weights,
        non_torch,
        consumed,
        activation,
        graphs,
        to_requested,
        to_gpu,
        current,
        groups[8],
    )


@dataclasses.dataclass
class _Reader:
    """The state of one pass over the log (what each line added)."""

    version: tuple[str, int] | None = None
    args: tuple[dict[str, Any], int] | None = None
    engine_config: dict[str, str] = dataclasses.field(default_factory=dict)
    ranks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    kv_pool: str = "GPU"
    kv_tokens: list[Figure] = dataclasses.field(default_factory=list)  # one per worker in some releases (0.10.2)
    concurrency: list[Figure] = dataclasses.field(default_factory=list)
    concurrency_len: int | None = None
    max_model_len: int | None = None
    batched: int | None = None
    block: int | None = None
    cg_subtracted: bool | None = None
    block_override: int | None = None
    default_seqs: int | None = None
    num_gpu_blocks: int | None = None
    sites: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)

    def rank(self, name: str) -> dict[str, Any]:
        return self.ranks.setdefault(name, {})

    def read(self, text: str, number: int) -> None:
        self._read_settings(text, number)
        figures = self.rank(_rank_of(text)) if "GiB" in text else None
        if figures is not None:
            for name, pattern in _FIGURES.items():
                if name not in figures and (m := pattern.search(text)):
                    figure = _figure(m.group(1), number)
                    if name in _TWO_DECIMALS:
                        figure = dataclasses.replace(figure, decimals=max(figure.decimals, 2))
                    figures[name] = figure
            if "suggestion" not in figures and (m := _SUGGESTION.search(text)):
                if (suggestion := _read_suggestion(m, number)) is not None:
                    figures["suggestion"] = suggestion
        if m := _KV_SIZE.search(text):
            self.kv_pool = m.group(1)
            self.kv_tokens.append(_figure(m.group(2), number))
        if m := _CONCURRENCY.search(text):
            self.concurrency_len = int(_number(m.group(1)))
            self.concurrency.append(_figure(m.group(2), number))

    def pool(self) -> tuple[Figure | None, Figure | None]:
        """The size and concurrency of the pool: the smallest pair when each worker printed its own (the engine
        keeps the minimum: get_kv_cache_configs)."""
        if not self.kv_tokens:
            return None, self.concurrency[0] if self.concurrency else None
        index = min(range(len(self.kv_tokens)), key=lambda i: (self.kv_tokens[i].value, i))
        concurrency = self.concurrency[index] if index < len(self.concurrency) else None
        return self.kv_tokens[index], concurrency or (self.concurrency[0] if self.concurrency else None)

    def _read_settings(self, text: str, number: int) -> None:
        if self.version is None:
            for pattern in _VERSION_PATTERNS:
                if m := pattern.search(text):
                    self.version = (m.group(1).lstrip("v"), number)
                    break
        if self.args is None and (m := _ARGS.search(text)):
            self.args = (_read_args(m.group(1)), number)
        if not self.engine_config and (m := _ENGINE_CONFIG.search(text)):
            self.engine_config = _read_engine_config(m.group(1))
        if self.max_model_len is None and (m := _MAX_MODEL_LEN.search(text)):
            self.max_model_len = int(m.group(1))
        if self.batched is None and (m := _BATCHED.search(text)):
            self.batched = int(m.group(1))
        if self.block is None and (m := _BLOCK.search(text)):
            self.block = int(m.group(1))
        if self.default_seqs is None and (m := _DEFAULT_SEQS.search(text)):
            self.default_seqs = int(m.group(1))
        if self.block_override is None and (m := _BLOCK_OVERRIDE.search(text)):
            self.block_override = int(m.group(1))
        if self.cg_subtracted is None and (m := _CG_PROFILING.search(text)):
            self.cg_subtracted = m.group(1) == "is enabled"  # "will be enabled by default (..=1)": it is not yet
        if self.num_gpu_blocks is None and (m := _NUM_GPU_BLOCKS.search(text)):
            self.num_gpu_blocks = int(m.group(1))
        if any(t in text for t in _SITE_TEXTS) and (m := _CALL_SITE.search(text)):
            self.sites.append((m.group(1), int(m.group(2)), m.group(3)))


def _int_setting(args: dict[str, Any], config: dict[str, str], arg: str, key: str, default: int) -> int:
    for value in (args.get(arg), config.get(key)):
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                continue
    return default


def parse_startup_log(text: str, source: str) -> StartupLog:
    """Read a vLLM start-up log; raise :class:`InputFileError` naming the first line expected when it has none of
    the KV cache lines (``Available KV cache memory``, ``KV cache size``)."""
    reader = _Reader()
    for number, line in enumerate(text.splitlines(), start=1):
        reader.read(line, number)
    ranks = tuple(
        sorted((RankFigures(rank=name, **figures) for name, figures in reader.ranks.items() if figures), key=_key)
    )
    if not any(r.available_kv_gib for r in ranks) and not reader.kv_tokens:
        raise InputFileError(
            "not a vLLM start-up log kvtool can read: no 'Available KV cache memory: N GiB' line "
            "(vllm/v1/worker/gpu_worker.py) and no 'GPU KV cache size: N tokens' line",
            where=source,
            tip="give the engine's whole start-up log, up to the 'Maximum concurrency' line",
        )
    args, args_line = reader.args if reader.args else ({}, None)
    config = reader.engine_config
    model = args.get("model") or args.get("model_tag") or config.get("model")
    kv_tokens, concurrency = reader.pool()
    return StartupLog(
        source=source,
        version=reader.version[0] if reader.version else None,
        version_line=reader.version[1] if reader.version else None,
        args=args,
        args_line=args_line,
        engine_config=config,
        model=None if model is None else str(model),
        tp=_int_setting(args, config, "tensor_parallel_size", "tensor_parallel_size", 1),
        pp=max(_int_setting(args, config, "pipeline_parallel_size", "pipeline_parallel_size", 1), _stages(ranks)),
        max_model_len=_max_model_len(args, config, reader),
        max_num_batched_tokens=_optional_int(args.get("max_num_batched_tokens")) or reader.batched,
        max_num_seqs=_optional_int(args.get("max_num_seqs")) or reader.default_seqs,
        attention_block_size=reader.block,
        block_size_override=reader.block_override,
        ranks=ranks,
        kv_pool=reader.kv_pool,
        kv_cache_tokens=kv_tokens,
        concurrency=concurrency,
        concurrency_max_model_len=reader.concurrency_len,
        cudagraph_estimate_subtracted=reader.cg_subtracted,
        num_gpu_blocks=reader.num_gpu_blocks,
        call_sites=tuple(reader.sites),
    )


def _stages(ranks: tuple[RankFigures, ...]) -> int:
    """Pipeline stages named by the ranks' prefixes (``Worker_PP1_TP0``): the largest PP index + 1."""
    stages = [int(m.group(1)) for r in ranks if (m := re.search(r"PP(\d+)", r.rank))]
    return max(stages) + 1 if stages else 1


def _key(r: RankFigures) -> tuple[int, ...]:
    return r.sort_key


def _optional_int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _max_model_len(args: dict[str, Any], config: dict[str, str], reader: _Reader) -> int | None:
    """The max_model_len vLLM ran with: "Using max model len", the engine config, the concurrency line, the args."""
    for value in (reader.max_model_len, config.get("max_seq_len"), reader.concurrency_len, args.get("max_model_len")):
        if (n := _optional_int(value)) is not None:
            return n
    return None


def gib_bytes(gib: float) -> int:
    """A logged GiB figure in bytes."""
    return round(gib * GIB)
