"""``kvtool simulate --engine``: which engines' models run (vllm, sglang, or vllm,sglang side by side), the options
that belong to SGLang, and the options SGLang's model does not take.  Shared by the CLI and kvtool.api.simulate.

``--engine`` is spelled as estimate's (kvtool.estimate.sglang.engines.parse_engines).  With ``--engine sglang`` alone
``--block-size`` is taken as the page size and ``--max-num-seqs`` / ``--max-num-batched-tokens`` as
``--max-running-requests`` / ``--chunked-prefill-size`` when SGLang's own are not given; with ``vllm,sglang`` each
engine reads its own options (``--block-size`` vLLM's, default 16; ``--page-size`` SGLang's, default 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtool.core.errors import UsageError
from kvtool.estimate.sglang.versions import NEWEST_RELEASE
from kvtool.simulate.sglang.run import SglangOptions, parse_page_sizes

# SGLang's options of `kvtool simulate` (its launch_server names), refused without sglang in --engine
SGLANG_OPTIONS = (
    "page_size",
    "max_running_requests",
    "chunked_prefill_size",
    "mem_fraction_static",
    "schedule_policy",
    "sglang_version",
)
# what only vLLM's simulation models: refused when SGLang's runs too
VLLM_ONLY = ("replicas", "router", "sweep", "plot", "export_events", "split_pools", "kv_offloading_size")
VLLM_DEFAULT_BLOCK_SIZE = "16"  # vllm serve's --block-size, the vLLM column of --engine vllm,sglang by default


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_simulate_engines(text: str) -> tuple[str, ...]:
    """``"vllm,sglang"`` -> ("vllm", "sglang"), as estimate's --engine."""
    from kvtool.estimate.sglang.engines import parse_engines

    return parse_engines(text)


def check_engine_options(engines: tuple[str, ...], given: Mapping[str, Any]) -> None:
    """An option of an engine not asked, or one SGLang's model does not take, is a usage error naming it."""
    if "sglang" not in engines:
        for name in SGLANG_OPTIONS:
            if given.get(name) is not None:
                raise UsageError(
                    f"{_flag(name)} is SGLang's", where=_flag(name), tip="add --engine sglang (or --engine vllm,sglang)"
                )
        return
    for name in VLLM_ONLY:
        if given.get(name) is not None:
            raise UsageError(
                f"{_flag(name)} runs vLLM's simulation only, not SGLang's",
                where=_flag(name),
                tip="drop it, or drop sglang from --engine",
            )
    if engines == ("sglang",):
        for name, value in (
            ("long_prefill_token_threshold", given.get("long_prefill_token_threshold") or None),
            ("slo_ttft_ms", given.get("slo_ttft_ms")),
        ):
            if value is not None:
                raise UsageError(
                    f"{_flag(name)} is vLLM's: SGLang's model does not read it",
                    where=_flag(name),
                    tip="drop it, or give --engine vllm,sglang (it applies to the vLLM column)",
                )
    if given.get("prefix_cache") is False:
        raise UsageError(
            "kvtool's SGLang model always runs the radix cache (SGLang's --disable-radix-cache is not modelled)",
            where="--no-prefix-cache",
            tip="drop --no-prefix-cache, or drop sglang from --engine",
        )
    for name in ("max_running_requests", "chunked_prefill_size"):
        value = given.get(name)
        if value is not None and value <= 0:
            raise UsageError(f"{_flag(name)} must be a positive integer, got {value}", where=_flag(name))


def sglang_options(engines: tuple[str, ...], given: Mapping[str, Any]) -> SglangOptions:
    """SGLang's settings from the options by name (see the module docstring for what --engine sglang alone reads)."""
    page = given.get("page_size")
    if page is None and engines == ("sglang",) and given.get("block_size") is not None:
        page = given["block_size"]
    return SglangOptions(
        page_sizes=parse_page_sizes(page),
        max_running_requests=given.get("max_running_requests"),
        chunked_prefill_size=given.get("chunked_prefill_size"),
        mem_fraction_static=given.get("mem_fraction_static"),
        schedule_policy=given.get("schedule_policy") or "fcfs",
        sglang_version=given.get("sglang_version") or NEWEST_RELEASE,
    )


def engine_inputs(engines: tuple[str, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """The simulate inputs for SGLang's runs: the serving simulation on (its options are read), and with both
    engines vLLM's block size 16 unless --block-size says otherwise."""
    out = dict(given, serve=True)
    if engines == ("sglang",):
        out["block_size"] = None  # the page sizes are SGLang's (sglang_options); vLLM's block sizes are not run
        out["max_num_seqs"] = out["max_num_batched_tokens"] = None
    elif out.get("block_size") is None:
        out["block_size"] = VLLM_DEFAULT_BLOCK_SIZE
    return out


def simulate_engines(reqs, options, engines: tuple[str, ...], given: Mapping[str, Any]):
    """SGLang's report (``engines == ("sglang",)``), or both engines side by side (kvtool.simulate.sglang.compare)."""
    from kvtool.simulate.sglang.compare import compare_engines
    from kvtool.simulate.sglang.run import simulate_sglang_report

    sglang = sglang_options(engines, given)
    if engines == ("sglang",):
        return simulate_sglang_report(
            reqs,
            options,
            sglang,
            fallback_running=given.get("max_num_seqs"),
            fallback_chunked=given.get("max_num_batched_tokens"),
        )
    return compare_engines(reqs, options, sglang)
