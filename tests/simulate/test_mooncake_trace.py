"""The Mooncake trace reader on the real trace's first 40 requests (tests/data/simulate/README.md): lengths,
arrivals, and the prefix hits its hash ids imply, worked out by hand from the format (one id per 512 tokens; equal
ids are equal tokens) and vLLM's rule that only full blocks are cached."""

from __future__ import annotations

import json
import math

import pytest

from kvtool.simulate.lengths import load_trace
from kvtool.simulate.scheduler import EngineConfig, run_engine
from kvtool.simulate.workloads import build_prompts
from tests.support import DATA

TRACE = DATA / "simulate" / "mooncake-conversation-head40.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in TRACE.read_text().splitlines()]


def test_real_mooncake_rows_are_read():
    rows = _rows()
    reqs = load_trace(TRACE)
    assert reqs.prompt_tokens.tolist() == [r["input_length"] for r in rows]
    assert reqs.output_tokens.tolist() == [r["output_length"] for r in rows]
    # timestamps are milliseconds: the 11th request arrives at 3,000 ms, the 27th at 5,999 ms
    assert reqs.arrival_s[10] == 3.0 and reqs.arrival_s[26] == 5.999
    # the format's own invariant: one hash id per started 512-token block of the prompt
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / 512) for r in rows)


def test_shared_first_block_hits_only_with_blocks_inside_it():
    # Every request of the conversation trace starts with hash id 0 (512 shared tokens); the rest are its own.
    # One request at a time in a pool that never evicts: with 256-token blocks the shared 512 tokens are two full
    # blocks, so every request after the first finds 512 cached tokens; with 1,024-token blocks the first block
    # mixes id 0 with the request's own id, so no block ever matches.
    reqs = load_trace(TRACE)
    prompts = build_prompts(reqs)
    outputs = reqs.output_tokens.tolist()
    for block, hit in ((256, 512), (1024, 0)):
        blocks = 200_000 // block  # more than the longest request needs (87,169 + 402 tokens): no eviction
        run = run_engine(EngineConfig(num_blocks=blocks, block_size=block, max_num_seqs=1), prompts, outputs)
        assert run.num_cached_tokens == [0] + [hit] * (len(outputs) - 1), block
        assert run.preemptions == 0


def _one_bad_record(tmp_path, record: str):
    """The real trace's first three rows, then ``record`` (written as is: Python's json reads NaN and Infinity)."""
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(TRACE.read_text().splitlines()[:3] + [record]) + "\n")
    return path


@pytest.mark.parametrize(
    "record,message",
    [
        # a NaN arrival made the serving loop spin forever (found by the CLI audit)
        (
            '{"timestamp": NaN, "input_length": 100, "output_length": 3, "hash_ids": [0]}',
            "'timestamp' must be a finite number >= 0, got nan",
        ),
        # was an OverflowError traceback (int(inf))
        (
            '{"timestamp": 0, "input_length": Infinity, "output_length": 3, "hash_ids": [0]}',
            "'input_length' must be a finite count >= 0, got inf",
        ),
        # was silently truncated to 3 tokens
        (
            '{"timestamp": 0, "input_length": 100, "output_length": 3.5, "hash_ids": [0]}',
            "'output_length' must be a whole number of tokens, got 3.5",
        ),
        (
            '{"timestamp": 0, "input_length": 100, "hash_ids": [0]}',
            "'output_length' is missing",
        ),
        (
            '{"timestamp": 0, "input_length": 1e30, "output_length": 3, "hash_ids": [0]}',
            "'input_length' is too large",
        ),
    ],
    ids=["nan-timestamp", "infinite-length", "fractional-count", "missing-count", "huge-count"],
)
def test_non_finite_fractional_or_missing_values_are_one_error_line(run_cli, tmp_path, record, message):
    path = _one_bad_record(tmp_path, record)
    res = run_cli("simulate", "--trace", path, "--serve", "--kv-tokens", "100000", "--block-size", "16", "--json")
    assert res.exit_code == 3
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith(f"Error: {message}") and lines[0].endswith(f"({path}, record 4)")


def test_token_id_prompts_refuse_a_fractional_max_tokens(run_cli, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"prompt_token_ids": [1, 2, 3], "max_tokens": 5}\n{"prompt_token_ids": [1, 2], "max_tokens": 3.5}\n'
    )
    res = run_cli("simulate", "--trace", path, "--serve", "--kv-tokens", "1000", "--block-size", "16")
    assert res.exit_code == 3 and res.stdout == ""
    assert res.stderr == f"Error: 'max_tokens' must be a whole number of tokens, got 3.5 ({path}, record 2)\n"


def test_a_timestamp_beyond_the_arrival_range_is_an_error(run_cli, tmp_path):
    path = _one_bad_record(tmp_path, '{"timestamp": 1e300, "input_length": 100, "output_length": 3, "hash_ids": [0]}')
    res = run_cli("simulate", "--trace", path, "--json")
    assert res.exit_code == 3 and res.stdout == ""
    assert res.stderr == f"Error: 'timestamp' is out of range: 1e+300 (at most 1e+15 ms) ({path}, record 4)\n"
