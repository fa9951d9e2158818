"""The parser against real vLLM start-up logs: every figure read must equal the value hand-copied into the case's
``logged:`` (tests/data/gpu-logs/*/case.yaml, copied from the public source by whoever added the case, independently
of this parser)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtool.core.errors import EXIT_INPUT, InputFileError
from kvtool.core.units import GIB
from kvtool.estimate.vllm_log_lines import releases_logging
from kvtool.estimate.vllm_versions import NEWEST_RELEASE, resolve_vllm_version
from kvtool.explain.parse import Figure, parse_startup_log
from kvtool.explain.reproduce import filled_rank, logged_terms
from kvtool.explain.settings import Given, log_settings
from tests.support import REPO_ROOT

GPU_LOGS = REPO_ROOT / "tests" / "data" / "gpu-logs"
# logs kept for explain's own figures (the DEBUG profiling line, the 0.27+ "consumed memory" suggestion)
EXPLAIN_LOGS = REPO_ROOT / "tests" / "data" / "explain"
# (case, figure) the source gives beside the quoted lines: qwen3-next-class-3090-tp2's "measured 2 x 4.99 GiB pool"
# and "ceil(262144/1568)" are the reporter's words, not vLLM lines
NOT_IN_THE_LINES = {
    ("qwen3-next-class-3090-tp2", "kv_gib"),
    ("qwen3-next-class-3090-tp2", "block_size"),
    # the source quotes "took -0.55 GiB" without the line's opening ("Graph capturing finished in N secs, ...")
    ("devstral-small-2-24b-awq-rtx5090-v0.15.1", "cudagraph_gib"),
    # "the exact KV cache capacity reported by vLLM" is the source's prose, not a quoted line
    ("devstral-small-2-24b-awq-rtx5090-v0.15.1", "tokens"),
}


def _log_text(case) -> str | None:
    """The case's verbatim log: log.txt, else a multi-line `log:` (older cases); None for a table row."""
    if (case / "log.txt").exists():
        return (case / "log.txt").read_text()
    text = yaml.safe_load((case / "case.yaml").read_text()).get("log") or ""
    return text if ("KV cache memory" in text or "KV cache size" in text) else None


CASES = {c.name: c for root in (GPU_LOGS, EXPLAIN_LOGS) for c in root.iterdir() if c.is_dir()}
LOG_CASES = sorted(name for name, case in CASES.items() if _log_text(case) is not None)


def test_the_real_logs_are_found():
    assert len(LOG_CASES) >= 12  # log.txt cases, the older multi-line `log:` ones, explain's own


# The `logged:` key schema (tests/data/gpu-logs/README.md "logged: keys"): each key and the log line it is copied from
SCHEMA = {
    "kv_gib": "Available KV cache memory: X GiB",
    "tokens": "GPU KV cache size: N tokens",
    "concurrency": "Maximum concurrency for L tokens per request: Xx",
    "weights_gib": "Model loading took X GiB (else the DEBUG 'weights memory', else the suggestion's 'for weight')",
    "activation_gib": "DEBUG 'torch peak memory increase' (else the suggestion's 'for peak activation')",
    "non_torch_gib": "DEBUG 'non-torch forward increase memory' (else the suggestion's 'for non-torch memory')",
    "consumed_gib": "0.27+ 'total consumed (from mem_get_info)' / 'GiB for consumed memory (weights + non-torch)'",
    "profile_non_kv_gib": "DEBUG 'Total non KV cache memory'",
    "requested_gib": "DEBUG 'Requested memory: U (util), X GiB' (else the suggestion's 'Desired ... (U, X GiB)')",
    "cudagraph_gib": "the captured pool: 'Graph capturing finished ... took X GiB' / 'X GiB (actual)' / suggestion",
    "cudagraph_estimate_gib": "vLLM's estimate: 'Estimated CUDA graph memory: X GiB total' / 'X GiB (estimated)'",
    "free_gib": "'Free memory on device (X/Y GiB)': X",
    "gpu_total_gib": "'Free memory on device (X/Y GiB)': Y",
    "block_size": "Setting attention block size to N tokens",
    "num_gpu_blocks": "'num_gpu_blocks is: N' (the metrics cache_config_info line)",
    "kv_cache_memory_suggestion_bytes": "the first `--kv-cache-memory=N` (to fit into requested memory)",
    "kv_cache_memory_to_gpu_bytes": "the second `--kv-cache-memory=N` (to fully utilize gpu memory)",
    "kv_cache_memory_in_use_bytes": "'Current kv cache memory in use is N bytes' (0.10.2-0.11.0)",
    "kv_cache_memory_in_use_gib": "'Current kv cache memory in use is X GiB' (0.11.1+)",
}


def _parsed_figures(text: str, name: str, pp: int) -> dict[str, float | None]:
    log = parse_startup_log(text, name)
    if log.pp == 1 and pp > 1:  # the excerpt cut the engine arguments; the case has them from its source
        log = dataclasses.replace(log, pp=pp)
    rank = filled_rank(log)
    terms = logged_terms(rank)
    s = rank.suggestion

    def gib(term):
        return None if term[0] is None else term[0] / GIB

    def value(figure):
        return None if figure is None else figure.value

    consumed = rank.profile_consumed_gib or (s and s.consumed_gib is not None and s.consumed_gib)
    found = {
        "kv_gib": gib(terms.available),
        "tokens": value(log.kv_cache_tokens),
        "concurrency": value(log.concurrency),
        "weights_gib": gib(terms.weights),
        "activation_gib": gib(terms.activation),
        "non_torch_gib": gib(terms.non_torch),
        "consumed_gib": consumed.value if isinstance(consumed, Figure) else (consumed or None),
        "profile_non_kv_gib": value(rank.profile_non_kv_gib),
        "requested_gib": gib(terms.requested),
        "cudagraph_gib": gib(terms.cudagraph_captured),
        "cudagraph_estimate_gib": gib(terms.cudagraph_estimate),
        "free_gib": value(rank.free_on_startup_gib) or (s and s.free_gib),
        "gpu_total_gib": value(rank.device_total_gib) or (s and s.total_gib),
        "block_size": log.attention_block_size,
        "num_gpu_blocks": log.num_gpu_blocks,
        "kv_cache_memory_suggestion_bytes": s and s.to_requested_bytes,
        "kv_cache_memory_to_gpu_bytes": s and s.to_gpu_bytes,
        "kv_cache_memory_in_use_bytes": s.current_kv_gib * GIB if s and s.current_kv_unit == "bytes" else None,
        "kv_cache_memory_in_use_gib": s.current_kv_gib if s and s.current_kv_unit == "GiB" else None,
    }
    assert set(found) == set(SCHEMA)
    return found


def _non_torch_derived(text: str, name: str) -> bool:
    rank = filled_rank(parse_startup_log(text, name))
    s = rank.suggestion
    return rank.profile_non_torch_gib is None and (s is None or s.non_torch_gib is None)


def _case_meta(name: str) -> dict:
    return yaml.safe_load((CASES[name] / "case.yaml").read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_uses_the_logged_key_schema(name):
    unknown = set(_case_meta(name).get("logged") or {}) - set(SCHEMA)
    assert not unknown, f"{name}: logged: keys not in the schema (tests/data/gpu-logs/README.md): {sorted(unknown)}"


# open: TP4 x PP2 on 0.10.1 prints one "GPU KV cache size" per worker (stage 0: 6,654,432; stage 1: 6,167,536);
# the case copied stage 0's (the explained rank under PP), the parser keeps the smallest (the unified pool)
OPEN = {"qwen3-30b-a3b-2507-gh200-tp4-pp2-v0.10.1"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.xfail(strict=True)) if n in OPEN else n for n in LOG_CASES]
)
def test_each_logged_figure_is_read_as_the_case_copied_it(name):
    """Both ways: each figure of `logged:` is read with its value, and each figure the parser reads from the log is
    in `logged:` (a figure read but never hand-checked would go unnoticed)."""
    meta = _case_meta(name)
    logged = meta["logged"]
    found = _parsed_figures(_log_text(CASES[name]) or "", name, int(meta.get("pp") or 1))
    for key, want in logged.items():
        if (name, key) in NOT_IN_THE_LINES:
            continue
        want = float(want)
        got = found[key]
        assert got is not None, f"{name}: {key} not read"
        # the references are the log's own decimals; a figure read from another line of the same log (the
        # suggestion line prints two decimals, "Model loading took" four) agrees to the coarser rounding
        assert abs(got - want) <= 0.005 + 1e-9 * abs(want) or (key.endswith("bytes") and abs(got - want) < 1), (
            f"{name}: {key} read {got}, case says {want}"
        )
    # 0.27+ print no non-torch term: explain derives it (consumed - weights), so it is not a logged figure
    derived = {"non_torch_gib"} if _non_torch_derived(_log_text(CASES[name]) or "", name) else set()
    unchecked = {key for key, got in found.items() if got is not None and key not in logged and key not in derived}
    assert not unchecked, f"{name}: read from the log but not in its logged: {sorted(unchecked)}"
    assert logged


# logs that print no version line and no "[file.py:NNN]" prefix: explain cannot find their release (it uses kvtool's
# newest and warns), so the case's version comes from its source (case.yaml `vllm_version:` says where)
NO_VERSION_EVIDENCE = {
    "devstral-small-2-24b-awq-rtx5090-v0.15.1",
    "gemma-4-e2b-l4-v0.21",
    "llama-2-7b-a100-80gb-v0.19.0",
    "qwen3-14b-l40s-v0.28.0",
}
# dev builds whose source lines are a neighbouring release's: (case, the releases their call sites allow)
DEV_BUILD_LINES = {
    "glm-5.1-fp8-h200-tp8-v0.20": {"0.20.0"},  # 0.20.1.dev1: one commit after 0.20.0
    "qwen3.6-27b-int4-3090-tp2-dflash-v0.20.2": {"0.21.0"},  # 0.20.2rc1.dev9 on main: its lines moved as in 0.21.0
}


@pytest.mark.parametrize("name", sorted(c.name for c in GPU_LOGS.iterdir() if (c / "log.txt").exists()))
def test_each_log_is_parsed_and_its_version_is_the_cases(name):
    """No case with a log.txt is left out of the figure check, and the version explain finds is the case's: the
    printed one equals `vllm_version` or `vllm_build`; without a version line, the releases its call sites allow
    (kvtool/estimate/vllm_log_lines.py, read from each release's source) hold the case's release."""
    assert name in LOG_CASES, f"{name}: log.txt holds no KV cache line the parser reads"
    meta = _case_meta(name)
    log = parse_startup_log((GPU_LOGS / name / "log.txt").read_text(), name)
    found = log_settings(log, Given())
    if log.version is not None:
        # vllm_build may carry words after the build ("0.10.1.2.dev0+g... (a build after 0.10.1.1 ...)")
        assert log.version in {str(meta.get("vllm_version")), str(meta.get("vllm_build")).split(" ")[0]}, name
        return
    if name in NO_VERSION_EVIDENCE:
        assert not log.call_sites and found.vllm_version == NEWEST_RELEASE
        return
    sites = [set(releases_logging(*site)) for site in log.call_sites]
    allowed = set.intersection(*[s for s in sites if s])
    assert found.vllm_version in allowed
    assert allowed == DEV_BUILD_LINES.get(name, allowed)
    if name not in DEV_BUILD_LINES:
        assert resolve_vllm_version(str(meta["vllm_version"])) in allowed, f"{name}: lines of {sorted(allowed)}"


def test_a_file_that_is_not_a_vllm_log_names_the_line_expected():
    with pytest.raises(InputFileError) as err:
        parse_startup_log("hello\nworld\n", "notes.txt")
    assert err.value.exit_code == EXIT_INPUT
    assert "no 'Available KV cache memory: N GiB' line" in err.value.one_line()
    assert err.value.one_line().endswith("(notes.txt)")


_PIECES = st.sampled_from(
    [
        "Available KV cache memory: ",
        "GPU KV cache size: ",
        "Maximum concurrency for ",
        " tokens per request: ",
        "Model loading took ",
        " GiB",
        "(Worker_TP1 pid=3) ",
        "non-default args: {",
        "Free memory on device (",
        "1,024",
        "-0.5",
        "x",
        "\n",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40))
def test_any_text_is_read_or_refused_with_one_line(parts):
    """Fragments of vLLM's lines in any order never crash the parser: a StartupLog or the one-line refusal."""
    try:
        parse_startup_log("".join(parts), "fuzz.log")
    except InputFileError as err:
        assert "\n" not in err.one_line()
