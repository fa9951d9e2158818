"""Readers with bounds (issue 25): a gzip bomb, deeply nested JSON, a cut last line and a huge CSV field, each
refused or read with a one-line error and a documented exit code, never a traceback or an exhausted memory.

Each case failed before its fix: the bomb took the process to the address-space limit (pyarrow's "Out of memory"
abort), nested JSON ended in a RecursionError traceback in all four readers, a capture cut by a full disk was
refused whole (exit 3), and a 100 MB field was called "an unclosed double quote".
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys

import pytest

from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_INPUT, EXIT_OK
from kvtool.core.jsonfile import MAX_JSON_DEPTH
from tests.support import DATA

HEADER = b"ts,event,request_id,num_blocks,num_tokens\n"
ROW = b"0.5,allocate,r1,1,16\n"  # 21 bytes
ROWS_PER_MEMBER = 1 << 20  # one gzip member inflates to 21 MiB (ROW * 2**20), about 53 KB compressed


def _bomb(path, members: int) -> int:
    """A multi-member gzip CSV (valid: RFC 1952 allows concatenated members) of one repeated row; returns the
    inflated size in bytes, computed from the row count (21 bytes * 2**20 rows per member + the header)."""
    member = gzip.compress(ROW * ROWS_PER_MEMBER, compresslevel=9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(HEADER))
        for _ in range(members):
            fh.write(member)
    return len(HEADER) + members * len(ROW) * ROWS_PER_MEMBER


# ---------------------------------------------------------------------------------------------------- gzip bomb

ADDRESS_SPACE_BYTES = 3 << 29  # 1.5 GiB: kvtool analyze refusing the bomb needs well under 1 GiB of it


def test_a_gzip_bomb_is_refused_while_inflating_within_a_memory_limit(tmp_path):
    """5 MB of gzip inflating to 2.2 GB (100 members * 22,020,096 bytes + the header): the old reader held it all
    (about 100 M rows, several GB as Arrow columns) and died under a 1.5 GiB address-space limit; the cap (64 MiB,
    from the environment as an operator would set it) stops the inflation at 64 MiB."""
    bomb = tmp_path / "bomb.csv.gz"
    inflated = _bomb(bomb, members=100)
    assert inflated == 2_202_009_642 and bomb.stat().st_size < 6_000_000

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))

    env = dict(os.environ, KVTOOL_MAX_INPUT_BYTES="64MiB")
    done = subprocess.run(
        [sys.executable, "-m", "kvtool", "analyze", str(bomb)],
        preexec_fn=limit_memory,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == EXIT_INPUT, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("Error: the decompressed content is larger than --max-input-bytes (67,108,864 B")
    assert "KVTOOL_MAX_INPUT_BYTES" in lines[0] and lines[0].endswith(f"({bomb})")


def test_the_cap_is_an_option_and_a_file_under_it_is_read(run_cli, tmp_path):
    bomb = tmp_path / "bomb.csv.gz"
    inflated = _bomb(bomb, members=2)  # 44,040,234 bytes inflated
    refused = run_cli("analyze", bomb, "--max-input-bytes", "40MB")
    assert refused.exit_code == EXIT_INPUT and "--max-input-bytes (40,000,000 B" in refused.stderr
    read = run_cli("analyze", bomb, "--max-input-bytes", str(inflated), "--json")
    assert read.exit_code == EXIT_OK, read.stderr
    # every one of the 2 * 2**20 rows written is an event
    assert json.loads(read.stdout)["summary"]["events"] == 2 * ROWS_PER_MEMBER


def test_a_jsonl_gz_bomb_is_refused_too(run_cli, tmp_path):
    line = json.dumps({"seq": 0, "batch_ts": 1.0, "dp_rank": 0, "type": "AllBlocksCleared"}).encode() + b"\n"
    path = tmp_path / "events.jsonl.gz"
    path.write_bytes(gzip.compress(line * 200_000))  # 13 MB inflated
    result = run_cli("analyze", path, "--max-input-bytes", "1MiB")
    assert result.exit_code == EXIT_INPUT
    assert "--max-input-bytes (1,048,576 B" in result.stderr and str(path) in result.stderr


def test_a_bad_cap_is_a_usage_error(run_cli, tmp_path):
    result = run_cli("analyze", tmp_path / "x.csv", "--max-input-bytes", "lots")
    assert result.exit_code == 2 and "--max-input-bytes must be a size" in result.stderr


# ---------------------------------------------------------------------------------------------------- nested JSON

DEEP = "[" * 100_000  # far past the parser's recursion limit (1,000)
STORED = json.dumps({"seq": 0, "batch_ts": 1.0, "dp_rank": 0, "type": "AllBlocksCleared"})


@pytest.mark.parametrize(
    ("command", "name", "content", "where"),
    [
        (("estimate", "--config"), "config.json", DEEP, ""),
        (("simulate", "--block-size", "16", "--trace"), "trace.jsonl", '{"length": 10}\n' + DEEP + "\n", ", line 2"),
        (("vllm", "isolation", "--replay"), "run.json", DEEP, ""),
        (("analyze",), "events.jsonl", STORED + "\n" + DEEP + "\n", ", line 2"),
        (("analyze",), "first.jsonl", DEEP + "\n", ", line 1"),
    ],
)
def test_deeply_nested_json_is_refused_in_one_line(run_cli, tmp_path, command, name, content, where):
    path = tmp_path / name
    path.write_text(content)
    result = run_cli(*command, path)
    assert result.exit_code == EXIT_INPUT, result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    error = result.stderr.strip().splitlines()[0]
    assert (
        error == f"Error: JSON nested deeper than {MAX_JSON_DEPTH} levels: refused (no kvtool input nests that "
        f"deep) ({path}{where})"
    )


def test_nesting_at_the_limit_is_read_and_brackets_in_strings_do_not_count():
    from kvtool.core.jsonfile import loads_bounded

    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(at_limit, "x") is not None
    in_string = json.dumps({"text": "[" * 5000, "escaped": '\\"[[[' * 100})
    assert loads_bounded(in_string, "x")["text"] == "[" * 5000
    with pytest.raises(Exception, match="nested deeper than"):
        loads_bounded("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "x")


# ---------------------------------------------------------------------------------------------------- a cut capture


def test_a_capture_cut_mid_line_keeps_its_complete_lines(run_cli, tmp_path):
    """A full disk stops the writer mid-line: the complete lines are analysed, the cut one is a rejected line."""
    full = (DATA / "vllm-events" / "small-cache-evictions-full-report.jsonl").read_bytes()
    lines = full.splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(lines[:-1]))
    result = run_cli("analyze", cut, "--json")
    assert result.exit_code == EXIT_OK, result.stderr
    got, expected = json.loads(result.stdout), json.loads(run_cli("analyze", whole, "--json").stdout)
    assert got["counts"] == expected["counts"]  # every complete line read, the same as the file without the cut one
    assert got["rejected_lines"] == [
        [len(lines), "the last line is cut short (no newline, not complete JSON: the writer stopped mid-line)"]
    ]
    assert any(note.startswith(f"rejected line {len(lines):,}") for note in got["notes"])
    strict = run_cli("analyze", cut, "--strict")
    assert strict.exit_code == EXIT_CHECK_FAILED and f"line {len(lines)}" in strict.stderr


def test_a_broken_line_in_the_middle_is_still_an_error(run_cli, tmp_path):
    lines = (DATA / "vllm-events" / "small-cache-evictions-full-report.jsonl").read_bytes().splitlines(keepends=True)
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"".join(lines[:3]) + b'{"seq": \n' + b"".join(lines[3:]))
    result = run_cli("analyze", broken)
    assert result.exit_code == EXIT_INPUT and f"{broken}, line 4" in result.stderr


# ---------------------------------------------------------------------------------------------------- a huge field


def test_a_100_mb_field_is_named_as_such_not_as_an_unclosed_quote(run_cli, tmp_path):
    """The reader parses 8 MiB blocks (kvtool.events.load._READ_BLOCK_BYTES); a row of 100 MiB cannot fit one.
    The file has no double quote at all, so "unclosed double quote?" was wrong."""
    path = tmp_path / "big.csv"
    path.write_bytes(HEADER + b"0.1,allocate,a,1,1\n0.2,allocate," + b"x" * (100 << 20) + b",1,1\n0.3,free,a,1,\n")
    result = run_cli("analyze", path)
    assert result.exit_code == EXIT_INPUT
    assert "quote" not in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.startswith("Error: line 3 is longer than the CSV reader's block of 8,388,608 B")
    assert result.stderr.strip().endswith(f"({path})")
