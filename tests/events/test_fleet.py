"""`kvtool analyze` on a fleet: several files, one pool per engine, in-process and on a local Dask cluster.

The reference for every pool is the single-file analysis of the same rows (`analyze_events(load_events(file))`,
which the other tests check against hand computations); fleet percentiles are recomputed here with numpy from the
concatenated single-file per-request tables, by their definition (linear interpolation; nearest rank for counts).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvtool.core.errors import UsageError
from kvtool.core.jsonable import to_jsonable
from kvtool.events.analysis import REQUEST_COLUMNS, analyze_events
from kvtool.events.fleet import AnalyzeOptions, analyze_fleet
from kvtool.events.load import load_events, write_events
from kvtool.events.sources import find_pool_files
from tests.support import heavy_modules_loaded_by

SECTIONS = ("summary", "pool", "prefix_reuse", "long_requests", "anomalies", "late_frees")


def trace(seed: int, n_req: int = 40) -> dict:
    """A small engine trace: allocate (some via a reused prefix), decode appends, a free with a latency."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("ts", "event", "request_id", "num_blocks", "num_tokens", "latency_ms")}
    cols["block_ids"] = []

    def row(ts, ev, rid, nb, nt, lat=None, ids=""):
        for k, v in zip(cols, (ts, ev, rid, nb, nt, lat, ids)):
            cols[k].append(v)

    next_id = 0
    for r in range(n_req):
        t0 = float(rng.uniform(0, 10))
        prompt = int(rng.integers(1, 200))
        blocks = -(-prompt // 16)
        rid = f"req-{r}"
        if rng.random() < 0.3:
            row(t0, "reuse", rid, 1, 16)
        row(t0, "allocate", rid, blocks, prompt, 0.2, " ".join(str(next_id + i) for i in range(blocks)))
        next_id += blocks
        for k in range(int(rng.integers(0, 5))):
            row(t0 + 0.05 * (k + 1), "append", rid, 1, 16, None, str(next_id))
            next_id += 1
        if rng.random() < 0.95:  # a few leak
            late = 900.0 if rng.random() < 0.1 else float(rng.exponential(5))
            row(t0 + float(rng.uniform(0.5, 3)), "free", rid, 1000, None, late)
    return cols


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    for i in range(6):
        write_events(root / f"engine-{i}.csv", trace(i))
    return root


def _single(path):
    return analyze_events(load_events(path))


def _same_analysis(a, b) -> None:
    for name in SECTIONS:
        assert to_jsonable(getattr(a, name)) == to_jsonable(getattr(b, name)), name
    for name in REQUEST_COLUMNS:
        x, y = a.requests.column(name), b.requests.column(name)
        if name == "request_id":
            assert x == y
        else:
            assert np.array_equal(np.asarray(x), np.asarray(y), equal_nan=np.asarray(x).dtype.kind == "f"), name


def test_fleet_equals_the_single_file_runs(fleet_dir):
    fleet = analyze_fleet(find_pool_files([str(fleet_dir)]), AnalyzeOptions())
    files = sorted(fleet_dir.glob("*.csv"))
    assert [p.instance for p in fleet.pools] == [f.stem for f in files]
    singles = [_single(f) for f in files]
    for pool, single in zip(fleet.pools, singles):
        _same_analysis(pool.analysis, single)
    # the fleet per-request table is the concatenation, and its percentiles are those of the concatenation
    holding = np.concatenate([s.requests.holding_time_s for s in singles])
    assert np.array_equal(fleet.requests.values["holding_time_s"], holding)
    assert fleet.requests.request_ids == tuple(r for s in singles for r in s.requests.request_ids)
    p50, p95, p99 = np.percentile(holding, [50, 95, 99])
    f = fleet.summary
    assert (f.holding_time_s_p50, f.holding_time_s_p95, f.holding_time_s_p99) == (p50, p95, p99)
    lat = np.concatenate([s.free_latencies_ms for s in singles])
    assert f.free_latency_ms_p99 == np.percentile(lat, 99) and f.free_latency_ms_max == lat.max()
    peaks = np.sort(np.concatenate([s.requests.peak_blocks for s in singles]))
    assert f.peak_blocks_p99 == peaks[math.ceil(0.99 * peaks.size) - 1]  # nearest rank: a count that occurred
    assert f.events == sum(s.summary.events for s in singles)
    assert f.late_free_requests == sum(s.late_frees.requests for s in singles)
    token_s = sum(float(s.requests.token_seconds.sum()) for s in singles)
    slot_s = sum(float(s.requests.slot_seconds.sum()) for s in singles)
    assert f.utilization == pytest.approx(token_s / slot_s, rel=1e-12)
    # the worst requests are the top of the concatenated table by wasted slot-seconds
    wasted = np.concatenate([s.requests.wasted_slot_seconds for s in singles])
    assert fleet.worst_requests[0].wasted_slot_seconds == wasted.max()


def test_a_fleet_without_step_curves_has_every_other_figure(fleet_dir):
    # what the CLI runs without --plot: the same report; the pools' step curves are empty instead of kept
    from kvtool.events.render import fleet_to_json

    units = find_pool_files([str(fleet_dir)])
    kept, light = analyze_fleet(units, AnalyzeOptions()), analyze_fleet(units, AnalyzeOptions(keep_timelines=False))
    assert json.dumps(fleet_to_json(light)) == json.dumps(fleet_to_json(kept))
    for name, values in kept.requests.values.items():
        assert np.array_equal(light.requests.values[name], values, equal_nan=True), name
    for full, pool, single in zip(kept.pools, light.pools, (_single(f) for f in sorted(fleet_dir.glob("*.csv")))):
        assert full.analysis.timeline.time_s.tolist() == single.timeline.time_s.tolist()  # below 20,000 steps
        assert full.analysis.timeline.blocks_in_use.tolist() == single.timeline.blocks_in_use.tolist()
        tl = pool.analysis.timeline
        assert tl.time_s.size == tl.blocks_in_use.size == tl.long_blocks_in_use.size == 0
        assert tl.physical_time_s is not None and tl.physical_time_s.size == 0  # block_ids: present, not kept


def test_cli_fleet_plot_draws_the_worst_pools_step_curves(fleet_dir, tmp_path, monkeypatch, run_cli):
    from kvtool.events import plots

    drawn = []
    real = plots.write_plots
    monkeypatch.setattr(plots, "write_plots", lambda analysis, folder: drawn.append(analysis) or real(analysis, folder))
    result = run_cli("analyze", fleet_dir, "--plot", tmp_path / "charts", "--json")
    assert result.exit_code == 0 and drawn
    worst = json.loads(result.stdout)["worst_instances"]
    assert sorted(p.name for p in (tmp_path / "charts").iterdir()) == sorted(worst)
    for analysis in drawn:  # with --plot the curves are kept: each chart has its pool's blocks in use
        assert analysis.timeline.time_s.size > 0
        assert analysis.timeline.blocks_in_use.max() == analysis.pool.peak_blocks_in_use


def test_kept_apart_results_are_copies_of_the_same_values(fleet_dir):
    # a fleet keeps each pool's arrays in a mapping of their own (outside the malloc heap): equal values, and
    # nothing shared with the arrays the analysis made
    from kvtool.events.fleet import _arrays_of, _kept_apart

    analysis = _single(fleet_dir / "engine-0.csv")
    apart = _kept_apart(analysis)
    before, after = [], []
    _arrays_of(analysis, before)
    _arrays_of(apart, after)
    assert len(before) == len(after) > 20
    for a, b in zip(before, after):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        assert not np.shares_memory(a, b)
    _same_analysis(apart, analysis)


def test_fleet_on_a_local_dask_cluster_equals_in_process(fleet_dir, tmp_path):
    import dask.distributed  # noqa: F401  (the fleet extra, in dev: imported, not skipped)

    from kvtool.events.render import fleet_to_json

    units = find_pool_files([str(fleet_dir / "*.csv")])
    local = analyze_fleet(units, AnalyzeOptions())
    seen = []
    dask = analyze_fleet(units, AnalyzeOptions(), workers=2, progress=lambda d, t, r, u: seen.append(u.name))
    assert sorted(seen) == [u.name for u in units]  # progress once per unit (one file each here)
    assert json.dumps(fleet_to_json(dask)) == json.dumps(fleet_to_json(local))
    for name, values in local.requests.columns().items():
        other = dask.requests.columns()[name]
        assert list(other) == list(values) if isinstance(values, list) else np.array_equal(other, values, True)


def test_hive_partitions_make_one_pool_per_instance(tmp_path):
    day1, day2 = trace(1, 10), trace(2, 10)
    day2["ts"] = [t + 100 for t in day2["ts"]]  # the next day's file
    day2["request_id"] = [f"{r}-b" for r in day2["request_id"]]
    for day, cols in (("2026-11-29", day1), ("2026-11-30", day2)):
        folder = tmp_path / "instance=a" / f"date={day}"
        folder.mkdir(parents=True)
        write_events(folder / "part-0.parquet", cols)
    (tmp_path / "instance=b" / "date=2026-11-30").mkdir(parents=True)
    write_events(tmp_path / "instance=b" / "date=2026-11-30" / "part-0.parquet", trace(3, 10))
    units = find_pool_files([str(tmp_path / "instance=*" / "*" / "*.parquet")])
    assert [(u.name, len(u.paths)) for u in units] == [("a", 2), ("b", 1)]
    fleet = analyze_fleet(units, AnalyzeOptions())
    # reference for pool a: both days in one file
    both = {k: day1[k] + day2[k] for k in day1}
    write_events(tmp_path / "a.csv", both)
    _same_analysis(fleet.pools[0].analysis, _single(tmp_path / "a.csv"))


def test_an_instance_column_splits_one_file_into_pools(tmp_path, run_cli):
    a, b = trace(4, 12), trace(5, 12)
    write_events(tmp_path / "a.csv", a)
    write_events(tmp_path / "b.csv", b)
    mixed = tmp_path / "mixed.csv"
    header = "ts,event,request_id,num_blocks,num_tokens,latency_ms,instance\n"
    lines = [
        ",".join("" if v is None else str(v) for v in (*row, name)) + "\n"
        for name, cols in (("a", a), ("b", b))
        for row in zip(*(cols[k] for k in ("ts", "event", "request_id", "num_blocks", "num_tokens", "latency_ms")))
    ]
    mixed.write_text(header + "".join(lines))
    for path in ("a.csv", "b.csv"):  # the references without block_ids, as in the mixed file
        cols = a if path == "a.csv" else b
        write_events(tmp_path / path, {k: v for k, v in cols.items() if k != "block_ids"})
    fleet = analyze_fleet(find_pool_files([str(mixed)]), AnalyzeOptions())
    assert [p.instance for p in fleet.pools] == ["a", "b"]
    _same_analysis(fleet.pools[0].analysis, _single(tmp_path / "a.csv"))
    _same_analysis(fleet.pools[1].analysis, _single(tmp_path / "b.csv"))
    result = run_cli("analyze", mixed, "--json")  # one file with two instances: a fleet report
    doc = json.loads(result.stdout)
    assert [i["instance"] for i in doc["instances"]] == ["a", "b"] and doc["fleet"]["instances"] == 2


def test_same_instance_in_two_engines_files_is_refused(tmp_path):
    for name in ("x.csv", "y.csv"):
        (tmp_path / name).write_text("ts,event,request_id,num_blocks,num_tokens,instance\n0,allocate,r,1,1,a\n")
    with pytest.raises(UsageError, match="instance 'a' has rows in files of different engines"):
        analyze_fleet(find_pool_files([str(tmp_path)]), AnalyzeOptions())


def test_fsspec_urls(fleet_dir):
    import fsspec

    memory = fsspec.filesystem("memory")
    for path in sorted(fleet_dir.glob("*.csv"))[:2]:
        memory.pipe(f"/fleet/{path.name}", path.read_bytes())
    fleet = analyze_fleet(find_pool_files(["memory://fleet/"]), AnalyzeOptions())
    assert [p.instance for p in fleet.pools] == ["engine-0", "engine-1"]
    _same_analysis(fleet.pools[0].analysis, _single(fleet_dir / "engine-0.csv"))
    url = analyze_fleet(find_pool_files([f"file://{fleet_dir}/engine-1.csv", str(fleet_dir / "engine-0.csv")]),
                        AnalyzeOptions())  # fmt: skip
    assert len(url.pools) == 2


def test_cli_fleet_report_progress_export_and_refused_file(fleet_dir, tmp_path, run_cli):
    (tmp_path / "empty.csv").write_bytes(b"")
    out = tmp_path / "requests.csv"
    result = run_cli("analyze", fleet_dir / "engine-0.csv", fleet_dir / "engine-1.csv", tmp_path / "empty.csv",
                     "--export", out, "--strict")  # fmt: skip
    assert result.exit_code == 1  # --strict: a refused file (and any leak) is an anomaly
    assert "analyze: file 3/3" in result.stderr and "empty.csv: refused (the events file is empty" in result.stderr
    assert "fleet of 2 pools from 3 files" in result.stdout and "Pool health per instance" in result.stdout
    import csv

    rows = list(csv.reader(out.read_text().splitlines()))
    assert rows[0] == ["instance", *REQUEST_COLUMNS]
    assert {r[0] for r in rows[1:]} == {"fleet0/engine-0", "fleet0/engine-1"}  # below the common folder


def test_one_file_never_imports_dask(fleet_dir):
    codes, _, heavy = heavy_modules_loaded_by(
        ["analyze", str(fleet_dir / "engine-0.csv"), "--json"], modules=("dask", "distributed")
    )
    assert codes == [0] and heavy == []


def test_fleet_json_written_in_chunks_is_one_valid_object(fleet_dir, monkeypatch, run_cli):
    from kvtool.events import render

    whole = run_cli("analyze", fleet_dir, "--json").stdout  # one chunk
    monkeypatch.setattr(render, "ROWS_PER_CHUNK", 7)  # many chunk boundaries on a small fleet
    chunked = run_cli("analyze", fleet_dir, "--json").stdout
    doc = json.loads(chunked)
    assert len(doc["requests"]) == doc["fleet"]["requests"] == sum(i["summary"]["requests"] for i in doc["instances"])
    assert doc["requests"][0]["instance"] == "engine-0"
    assert chunked == whole  # the same text, rows in the same order


def test_workers_with_one_file_runs_in_process_and_says_so(fleet_dir, run_cli):
    result = run_cli("analyze", fleet_dir / "engine-0.csv", "--workers", "2", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["file"].endswith("engine-0.csv")
    assert "one file is analysed in this process" in result.stderr


@pytest.mark.parametrize("what", ["glob", "empty folder", "folder without events files", "url"])
def test_no_events_files_found_is_an_input_error(tmp_path, run_cli, what):
    # README "Exit codes": 3 is an input that is missing or empty; these exited 2 (a usage error)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no events here\n")
    argument = {
        "glob": str(tmp_path / "*.csv"),
        "empty folder": str(tmp_path / "empty"),
        "folder without events files": str(tmp_path / "notes"),
        "url": f"file://{tmp_path / 'empty'}",
    }[what]
    result = run_cli("analyze", argument, "--json")
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr == (
        f"Error: no events files found ({argument})\n"
        "Tip: give files, a directory with .csv, .csv.gz, .parquet, .pq files, or a glob\n"
    )


def test_a_fleet_whose_every_file_is_refused_is_an_input_error(tmp_path, run_cli):
    # it exited 0 with a "fleet of 0 pools" report of dashes
    (tmp_path / "a.csv").write_bytes(b"ts,event,request_id,num_blocks,num_tokens\n0,allocate,caf\xe9,1,5\n")
    (tmp_path / "b.csv").write_bytes(b"")
    result = run_cli("analyze", tmp_path, "--json")
    assert result.exit_code == 3 and result.stdout == ""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert result.stderr.splitlines()[-2:] == [
        f"Error: every events file was refused (2 of 2): there is no pool to analyse ({a}, {b})",
        f"Tip: the first one: no event row is accepted: 1 row rejected (1 invalid UTF-8; first: row 2) ({a})",
    ]
    # one readable file among refused ones is a fleet of one pool, as before
    (tmp_path / "c.csv").write_text("ts,event,request_id,num_blocks,num_tokens\n0,allocate,r,1,1\n1,free,r,1,\n")
    result = run_cli("analyze", tmp_path, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["fleet"]["files_refused"] == 2


def test_a_fleet_in_this_process_puts_arrow_on_the_heap_and_one_file_does_not(fleet_dir):
    # the CLI's fleet reads file after file: Arrow's pool becomes glibc's kept heap (kvtool.core.memory); one file
    # keeps Arrow's default pool, from which each column's pages go back to the system
    import subprocess
    import sys

    from tests.support import REPO_ROOT

    def backend_after(*argv: str) -> str:
        code = "import pyarrow as pa\nfrom kvtool.cli import run\n"
        code += f"assert run({list(argv)!r}) == 0\nprint(pa.default_memory_pool().backend_name)"
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[-1]

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's heap")
    assert backend_after("analyze", str(fleet_dir), "--json") == "system"
    assert backend_after("analyze", str(fleet_dir / "engine-0.csv"), "--json") != "system"


@pytest.mark.parametrize("json_output", [True, False])
def test_analyze_does_not_import_pandas_or_torch(fleet_dir, json_output):
    # pandas alone costs ~0.16 s of start-up; pyarrow's pa.array()/pa.scalar() import it to check their input
    one_file = ["analyze", str(fleet_dir / "engine-0.csv"), *(["--json"] if json_output else [])]
    fleet = ["analyze", str(fleet_dir), *(["--json"] if json_output else [])]
    for argv in (one_file, fleet):
        codes, _, heavy = heavy_modules_loaded_by(argv, modules=("pandas", "torch"))
        assert codes == [0] and heavy == [], argv


def test_lost_slot_seconds_use_the_rows_block_size(tmp_path, run_cli):
    # Hand computation.  Engine a (rows: block_size 32): A holds 2 blocks with 64 tokens for 1 s (2 x 32 = 64 slots,
    # all used: wasted 0) and its free waits 500 ms: late-free block-seconds 2 x 0.5 = 1.0, lost slot-seconds
    # 0 + 1.0 x 32 = 32.  Engine b (no block_size column: --block-size, 16): B holds 1 block with 16 tokens (wasted
    # 0), its free waits 1,500 ms: 1 x 1.5 = 1.5 block-seconds, lost 1.5 x 16 = 24.  So a is the worst pool.
    # It was 1.0 x 16 = 16 for a (the default block size, not the rows'), which ranked b first.
    (tmp_path / "a.csv").write_text(
        "ts,event,request_id,num_blocks,num_tokens,latency_ms,block_size\n0,allocate,A,2,64,,32\n1,free,A,2,,500,32\n"
    )
    (tmp_path / "b.csv").write_text(
        "ts,event,request_id,num_blocks,num_tokens,latency_ms\n0,allocate,B,1,16,\n1,free,B,1,,1500\n"
    )
    fleet = analyze_fleet(find_pool_files([str(tmp_path)]), AnalyzeOptions())
    lost = {h.instance: (h.wasted_slot_seconds, h.late_free_block_seconds, h.lost_slot_seconds) for h in fleet.health}
    assert lost == {"a": (0.0, 1.0, 32.0), "b": (0.0, 1.5, 24.0)}
    assert [h.instance for h in fleet.worst_instances] == ["a", "b"]
    doc = json.loads(run_cli("analyze", tmp_path, "--json").stdout)
    assert {i["instance"]: i["health"]["lost_slot_seconds"] for i in doc["instances"]} == {"a": 32.0, "b": 24.0}
