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
from kvtool.explain.parse import parse_startup_log
from kvtool.explain.reproduce import filled_rank, logged_terms
from tests.support import REPO_ROOT

GPU_LOGS = REPO_ROOT / "tests" / "data" / "gpu-logs"
# logs kept for explain's own figures (the DEBUG profiling line, the 0.27+ "consumed memory" suggestion)
EXPLAIN_LOGS = REPO_ROOT / "tests" / "data" / "explain"
# figures of `logged:` that are not lines of a start-up log (read by the case's author from elsewhere)
NOT_LOG_FIGURES = {"num_gpu_blocks"}
# (case, figure) the source gives beside the quoted lines: qwen3-next-class-3090-tp2's "measured 2 x 4.99 GiB pool"
# and "ceil(262144/1568)" are the reporter's words, not vLLM lines
NOT_IN_THE_LINES = {("qwen3-next-class-3090-tp2", "kv_gib"), ("qwen3-next-class-3090-tp2", "block_size")}


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


def _parsed_figures(text: str, name: str, pp: int) -> dict[str, float | None]:
    log = parse_startup_log(text, name)
    if log.pp == 1 and pp > 1:  # the excerpt cut the engine arguments; the case has them from its source
        log = dataclasses.replace(log, pp=pp)
    rank = filled_rank(log)
    terms = logged_terms(rank)
    s = rank.suggestion

    def gib(term):
        return None if term[0] is None else term[0] / GIB

    return {
        "kv_gib": gib(terms.available),
        "tokens": log.kv_cache_tokens and log.kv_cache_tokens.value,
        "concurrency": log.concurrency and log.concurrency.value,
        "weights_gib": gib(terms.weights),
        "activation_gib": gib(terms.activation),
        "non_torch_gib": gib(terms.non_torch),
        "cudagraph_gib": gib(terms.cudagraph),
        "block_size": log.attention_block_size,
        "kv_cache_memory_suggestion_bytes": s and s.to_requested_bytes,
        "kv_cache_memory_in_use_bytes": s and s.current_kv_gib * GIB,
        "free_memory_on_startup_gib": s and s.free_gib,
        "consumed_gib": s and s.consumed_gib,
        "requested_gib": gib(terms.requested),
        "profile_non_kv_gib": rank.profile_non_kv_gib and rank.profile_non_kv_gib.value,
    }


@pytest.mark.parametrize("name", LOG_CASES)
def test_each_logged_figure_is_read_as_the_case_copied_it(name):
    case = CASES[name]
    meta = yaml.safe_load((case / "case.yaml").read_text())
    logged = meta["logged"]
    found = _parsed_figures(_log_text(case) or "", name, int(meta.get("pp") or 1))
    checked = 0
    for key, want in logged.items():
        if key in NOT_LOG_FIGURES or (name, key) in NOT_IN_THE_LINES:
            continue
        want = float(want)
        got = found[key]
        assert got is not None, f"{name}: {key} not read"
        # the references are the log's own decimals; a figure read from another line of the same log (the
        # suggestion line prints two decimals, "Model loading took" four) agrees to the coarser rounding
        assert abs(got - want) <= 0.005 + 1e-9 * abs(want) or (key.endswith("bytes") and abs(got - want) < 1), (
            f"{name}: {key} read {got}, case says {want}"
        )
        checked += 1
    assert checked >= 2


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
