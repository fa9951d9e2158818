"""`kvtool analyze --export`: every table (requests, pool timeline, prefix matches, free latency, physical blocks)
as CSV, gzip CSV or Parquet by the name, equal to the library's DataFrames (kvtool.api.analyze)."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from kvtool.api import analyze
from kvtool.events.render import export_paths
from tests.support import DATA

D = DATA / "analyze"


def test_export_paths_keep_the_name_for_requests():
    paths = export_paths(Path("out/run.csv.gz"))
    assert paths["requests"] == Path("out/run.csv.gz")
    assert paths["pool_timeline"] == Path("out/run-pool_timeline.csv.gz")
    assert export_paths(Path("x.parquet"))["prefix_matches"] == Path("x-prefix_matches.parquet")
    assert export_paths(Path("noext"))["free_latency"] == Path("noext-free_latency.csv")


def _read(path: Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas() if path.suffix == ".parquet" else pd.read_csv(path)


@pytest.mark.parametrize("name", ["tables.csv", "tables.csv.gz", "tables.parquet"])
def test_every_table_is_written_and_equals_the_api(run_cli, tmp_path, name):
    out = tmp_path / name
    result = run_cli("analyze", D / "reuse.csv", "--export", out)
    assert result.exit_code == 0, result.stderr
    api = analyze(D / "reuse.csv")
    frames = {
        "requests": api.requests,
        "pool_timeline": api.pool_timeline,
        "prefix_matches": api.prefix_matches,
        "free_latency": api.free_latency,
        "physical_timeline": api.physical_timeline,
    }
    written = export_paths(out)
    for table, frame in frames.items():
        path = written[table]
        assert f"wrote {path}" in " ".join(result.stdout.split())
        got = _read(path)
        assert list(got.columns) == list(frame.columns)
        pd.testing.assert_frame_equal(got, frame, check_dtype=False)
    if name.endswith(".gz"):
        assert gzip.open(out).read(12).startswith(b'"request_id"')


def test_csv_cells_blank_for_null(run_cli, tmp_path):
    out = tmp_path / "r.csv"
    assert run_cli("analyze", D / "basic.csv", "--export", out, "--json").exit_code == 0
    rows = list(csv.DictReader(open(tmp_path / "r-free_latency.csv")))
    # basic.csv: A frees 3 blocks 800 ms late, B 1 block 10 ms late (tests/data/analyze/README.md)
    assert [(r["request_id"], float(r["latency_ms"]), float(r["late_block_seconds"])) for r in rows] == [
        ("A", 800.0, 2.4),
        ("B", 10.0, 0.01),
    ]
    assert not (tmp_path / "r-physical_timeline.csv").exists()  # no block_ids column: no physical table


def test_unwritable_export_is_a_usage_error(run_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("analyze", D / "basic.csv", "--export", blocker / "x.csv")
    assert result.exit_code == 2
    assert result.stderr == f"Error: {blocker} is a file, not a folder (--export {blocker / 'x.csv'})\n"


@pytest.mark.parametrize(
    "name, ending",
    [
        ("x.xlsx", "ends in .xlsx"),  # it wrote CSV under that name
        ("tables.json", "ends in .json"),
        ("out", "has no suffix"),  # it wrote CSV to a file named 'out' and out-pool_timeline.csv beside it
        ("x.csv.bz2", "ends in .bz2"),
    ],
)
def test_export_to_a_name_of_another_format_is_refused_before_reading(run_cli, tmp_path, name, ending):
    out = tmp_path / name
    result = run_cli("analyze", D / "basic.csv", "--export", out, "--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"Error: --export writes CSV, gzip-compressed CSV or Parquet, chosen by the name: '{name}' {ending} "
        f"(--export {out})\nTip: name the file NAME.csv, NAME.csv.gz or NAME.parquet\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_export_into_a_missing_folder_is_refused_not_created(run_cli, tmp_path):
    # it created new/deeper/ without a word; a typo in the folder made a new tree
    out = tmp_path / "new" / "deeper" / "x.csv"
    result = run_cli("analyze", D / "basic.csv", "--export", out, "--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"Error: the folder {out.parent} does not exist (--export {out})\n"
        f"Tip: create it first (mkdir -p {out.parent}), or export into a folder that exists\n"
    )
    assert not (tmp_path / "new").exists()


def test_export_suffix_is_read_without_case(run_cli, tmp_path):
    out = tmp_path / "R.CSV"
    result = run_cli("analyze", D / "basic.csv", "--export", out, "--json")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "R-free_latency.csv",
        "R-pool_timeline.csv",
        "R-prefix_matches.csv",
        "R.CSV",
    ]
