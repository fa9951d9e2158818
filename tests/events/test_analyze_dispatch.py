"""`kvtool analyze` routes vLLM's JSON-lines KV events to the vLLM analysis and CSV-schema files to the
per-request analysis (issue 6 section 3 wired into issue 4's command)."""

from __future__ import annotations

import json
import shutil

from kvtool.core.errors import EXIT_INPUT, EXIT_USAGE
from tests.support import DATA

INCREMENTAL = DATA / "vllm-events" / "small-cache-evictions-incremental.jsonl"


def _count_types(path):
    # Independent count straight from the file: one event per line with its "type".
    counts = {}
    for line in path.read_text().splitlines():
        if line.strip():
            kind = json.loads(line)["type"]
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def test_jsonl_goes_to_the_vllm_analysis(run_cli):
    result = run_cli("analyze", INCREMENTAL, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["kind"] == "vllm-kv-events"
    expected = _count_types(INCREMENTAL)  # the data README's table says 28 / 25 / 1
    assert (expected["BlockStored"], expected["BlockRemoved"], expected["AllBlocksCleared"]) == (28, 25, 1)
    assert report["counts"]["block_stored_events"] == expected["BlockStored"]
    assert report["counts"]["block_removed_events"] == expected["BlockRemoved"]


def test_vllm_events_recognised_by_content_without_suffix(run_cli, tmp_path):
    plain = tmp_path / "events.log"
    shutil.copy(INCREMENTAL, plain)
    result = run_cli("analyze", plain, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["kind"] == "vllm-kv-events"


def test_export_is_refused_for_vllm_events(run_cli):
    result = run_cli("analyze", INCREMENTAL, "--export", "x.csv")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("Error: --export writes the per-request table")
    assert result.stdout == ""


def test_jsonl_that_is_not_vllm_events(run_cli, tmp_path):
    bogus = tmp_path / "other.jsonl"
    bogus.write_text('{"hello": 1}\n')
    result = run_cli("analyze", bogus)
    assert result.exit_code == EXIT_INPUT
    assert result.stderr.startswith("Error:")
    assert "Traceback" not in result.stderr


def test_per_request_options_on_vllm_events_are_named_not_dropped(run_cli):
    # --top and --block-size mean nothing for events without request ids: a warning names them, the JSON stays pure
    result = run_cli("analyze", INCREMENTAL, "--json", "--top", "3", "--block-size", "32")
    assert result.exit_code == 0
    json.loads(result.stdout)
    assert result.stderr == (
        "Warning: --block-size, --top do not apply to vLLM's KV events (no request ids, "
        "no per-request table): ignored\n"
    )


def test_strict_fails_on_lost_vllm_batches(run_cli, tmp_path):
    # Drop the batches with seq 3 and 4 from a file whose seqs run 0..N without gaps: 2 sequence numbers are
    # missing between the first and the last, so --strict exits 1; the complete file passes --strict.
    from kvtool.core.errors import EXIT_CHECK_FAILED

    lines = [line for line in INCREMENTAL.read_text().splitlines() if line.strip()]
    seqs = sorted({json.loads(line)["seq"] for line in lines})
    assert seqs == list(range(seqs[0], seqs[-1] + 1)) and len(seqs) > 6
    gappy = tmp_path / "gappy.jsonl"
    gappy.write_text("\n".join(line for line in lines if json.loads(line)["seq"] not in (3, 4)) + "\n")
    result = run_cli("analyze", gappy, "--strict", "--json")
    assert result.exit_code == EXIT_CHECK_FAILED
    json.loads(result.stdout)  # the report is still printed
    assert result.stderr.splitlines()[0] == (
        f"Error: 2 batch sequence numbers are missing: those events were lost ({gappy})"
    )
    assert run_cli("analyze", INCREMENTAL, "--strict").exit_code == 0


def test_vllm_lifetime_metric_is_told_apart_from_residency(run_cli):
    # vLLM's kv_block_lifetime_seconds runs from get_new_blocks to the next get_new_blocks of the same block
    # (vllm/v1/core/block_pool.py calls on_block_allocated / on_block_evicted there, sampled at 1 %): the note
    # says so, and how it relates to kvtool's residency and turnover
    result = run_cli("analyze", INCREMENTAL, "--json")
    notes = " ".join(json.loads(result.stdout)["notes"])
    assert "kv_block_lifetime_seconds" in notes and "residency plus turnover" in notes


def test_vllm_events_with_a_byte_order_mark_are_read(run_cli, tmp_path):
    # json.loads refused the BOM: "not a vLLM KV-event file: its first line is not a JSON object ..."
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + INCREMENTAL.read_bytes())
    result = run_cli("analyze", path, "--json")
    assert result.exit_code == 0, result.stderr
    counts = json.loads(result.stdout)["counts"]
    assert counts["block_stored_events"] == _count_types(INCREMENTAL)["BlockStored"]


def test_a_truncated_gzip_capture_says_so(run_cli, tmp_path):
    # cut inside the first line it was "not a vLLM KV-event file"; cut later, "cannot read the file: Compressed file
    # ended before the end-of-stream marker was reached"
    import gzip

    packed = gzip.compress(INCREMENTAL.read_bytes())
    for cut in (200, len(packed) * 2 // 3):
        path = tmp_path / f"cut{cut}.jsonl.gz"
        path.write_bytes(packed[:cut])
        result = run_cli("analyze", path, "--json")
        assert result.exit_code == EXIT_INPUT
        assert result.stdout == ""
        assert result.stderr == f"Error: not a valid gzip file (corrupt or truncated) ({path})\n"


def test_the_data_parallel_row_reads_as_rank_ids_not_a_count(run_cli):
    # "data-parallel ranks  0" read as "no ranks" for a capture of one engine, rank 0
    result = run_cli("analyze", INCREMENTAL)
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "data-parallel" in line)
    assert [cell.strip() for cell in row.strip("│ ").split("│")] == ["data-parallel rank ids", "0"]


def test_a_non_finite_batch_time_is_one_error_line(run_cli, tmp_path):
    # NaN, Infinity and -1e308 reached numpy: "autodetected range of [nan, nan] is not finite" tracebacks, or
    # (NaN after a few good lines) a report with a meaningless duration
    good = INCREMENTAL.read_text().splitlines()[:3]
    for value, shown in (("NaN", "nan"), ("Infinity", "inf"), ("-1e308", "-1e+308")):
        path = tmp_path / f"events-{shown}.jsonl"
        bad = f'{{"seq": 99, "batch_ts": {value}, "dp_rank": 0, "type": "BlockRemoved", "block_hashes": [1]}}'
        path.write_text("\n".join([*good, bad]) + "\n")
        result = run_cli("analyze", path, "--json")
        assert result.exit_code == EXIT_INPUT
        assert result.stdout == ""
        assert result.stderr == (
            f"Error: field 'batch_ts' is not a time in seconds (finite, at most 1e+12): {shown} ({path}, line 4)\n"
        )
