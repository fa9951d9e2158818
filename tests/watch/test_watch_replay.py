"""kvtool watch without vLLM: recorded files replayed and followed through the watcher's live path.

References: ``kvtool analyze`` (analyze_events on load_events of the same file) for the since-start figures; a
brute-force integration of the definitions of docs/analyze.md for the window; vLLM's own per-request preemption
counts (recorded-48-blocks.vllm.json) for the preemption storm's requests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvtool.events.analysis import analyze_events
from kvtool.events.load import FREE, load_events
from kvtool.watch.alerts import AlertRules
from kvtool.watch.rows import rows_of_table
from kvtool.watch.session import WatchOptions, WatchSession
from kvtool.watch.sources import FileFollower
from kvtool.watch.state import Watcher, figures_of
from tests.support import DATA

RECORD = DATA / "vllm-record"
FIXTURES = ("recorded-48-blocks.parquet", "recorded-gemma2-hybrid.parquet", "killed-driver.parquet")


def _fed(path: Path, **kwargs) -> Watcher:
    table = load_events(path)
    watcher = Watcher(str(path), columns=table.columns_found, default_block_size=table.default_block_size, **kwargs)
    for row in rows_of_table(table):
        watcher.add(row)
    return watcher


@pytest.mark.parametrize("name", FIXTURES)
def test_the_whole_run_is_what_analyze_says_of_the_file(name):
    path = RECORD / name
    reference = analyze_events(load_events(path))
    since = _fed(path).since_start(force=True)
    assert since.summary == reference.summary
    assert since.pool == reference.pool
    assert since.prefix_reuse == reference.prefix_reuse
    assert since.long_requests == reference.long_requests
    assert since.late_frees == reference.late_frees


def test_a_followed_recording_written_in_odd_pieces_reads_the_same_rows(tmp_path):
    """The recorder's CSV appended in pieces that cut lines (and the header) anywhere, polled between pieces."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    source = RECORD / "recorded-48-blocks.parquet"
    text_file = tmp_path / "whole.csv"
    pacsv.write_csv(pq.read_table(source), text_file)
    data = text_file.read_bytes()
    target = tmp_path / "live.csv"
    watcher = Watcher(str(target))
    follower = FileFollower(target, watcher)
    assert follower.poll() == 0  # nothing there yet
    cut, step = 0, 7
    with target.open("wb") as out:
        while cut < len(data):
            out.write(data[cut : cut + step])
            out.flush()
            cut += step
            step = step * 3 % 4093 + 1
            follower.poll()
    follower.poll()
    assert watcher.store.count == 1893 and watcher.store.rejected == 0  # tests/data/vllm-record/README.md
    assert watcher.since_start(force=True).summary == analyze_events(load_events(source)).summary


def _reference_window(path: Path, start: float):
    """Blocks held and tokens held per request as step functions, integrated over [start, end] by hand."""
    table = load_events(path)
    end = float(table.ts.max())
    by_request: dict[int, list[int]] = {}
    for i in range(table.events):
        by_request.setdefault(int(table.request[i]), []).append(i)
    block_seconds = token_seconds = slot_seconds = 0.0
    for rows in by_request.values():
        b = added = 0
        for k, i in enumerate(rows):
            if table.event[i] == FREE:
                b = max(0, b - int(table.num_blocks[i]))
            else:
                added = int(table.num_tokens[i]) if b == 0 else added + int(table.num_tokens[i])
                b += int(table.num_blocks[i])
            bs = int(table.block_size[i])
            n = min(added, b * bs)
            t0 = float(table.ts[i])
            t1 = float(table.ts[rows[k + 1]]) if k + 1 < len(rows) else end
            lo, hi = max(t0, start), max(t1, start)
            block_seconds += b * (hi - lo)
            token_seconds += n * (hi - lo)
            slot_seconds += b * bs * (hi - lo)
    return block_seconds, token_seconds / slot_seconds


@pytest.mark.parametrize("name", FIXTURES[:2])
def test_a_window_integrates_the_same_holding_as_the_whole_file_from_its_start(name):
    path = RECORD / name
    watcher = _fed(path, window_s=5.0)
    since = watcher.since_start(force=True)
    end = since.summary.trace_end_s
    window, opening, span = watcher.analyze_window(end, watcher.capacity(since))
    assert opening > 0  # requests were holding blocks 5 s before the end
    block_seconds, utilization = _reference_window(path, end - 5.0)
    assert window.summary.block_seconds == pytest.approx(block_seconds, rel=1e-9)
    assert window.pool.utilization == pytest.approx(utilization, rel=1e-9)
    figures = figures_of(window, "window", span, opening)
    assert figures.events == int((load_events(path).ts >= end - 5.0).sum())


def _replayed(path: Path, **options) -> WatchSession:
    session = WatchSession(WatchOptions(replay=path, speed=0, **options))
    session.replay_in_trace_time()
    return session


def test_the_preemption_storm_names_the_requests_vllm_preempted():
    # the real run preempted 14 times in 12 s (README of tests/data/vllm-record): above 1/s over a 10 s window
    session = _replayed(RECORD / "recorded-48-blocks.parquet")
    assert set(session.tracker.first_fired_s) == {"preemption_storm"}
    figures = json.loads((RECORD / "recorded-48-blocks.vllm.json").read_text())["requests"]
    preempted = {rid for rid, r in figures.items() if r["num_preemptions"]}
    alert = session.latest.alerts[0]
    assert alert.rule == "preemption_storm" and set(alert.request_ids) <= preempted and alert.request_ids


def test_a_request_that_stops_freeing_is_a_leak(tmp_path):
    """The same real run with req-7's free rows taken out: it holds its blocks, with no row, to the end."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(RECORD / "recorded-48-blocks.parquet")
    keep = pc.invert(pc.and_(pc.equal(table["request_id"], "req-7"), pc.equal(table["event"], "free")))
    planted = tmp_path / "leak.parquet"
    pq.write_table(table.filter(keep), planted)
    rules = AlertRules(leak_after_s=2.0, preemptions_per_s=100.0)
    session = _replayed(planted, rules=rules)
    assert set(session.tracker.first_fired_s) == {"leak"}
    (alert,) = session.latest.alerts
    assert alert.request_ids == ("req-7",)
    last_row = float(pc.max(table.filter(pc.equal(table["request_id"], "req-7"))["ts"]).as_py())
    # fires within one refresh (0.5 s) of the leak threshold passing
    assert 2.0 < session.tracker.first_fired_s["leak"] - last_row <= 2.5 + 1e-6


def test_no_alert_on_a_run_of_the_fixture_with_the_storm_threshold_above_it():
    session = _replayed(RECORD / "recorded-48-blocks.parquet", rules=AlertRules(preemptions_per_s=2.0))
    assert not session.tracker.ever_fired


def test_the_metrics_text_parses_and_matches_the_snapshot():
    from prometheus_client.parser import text_string_to_metric_families

    from kvtool.watch.exporter import exposition

    session = _replayed(RECORD / "recorded-48-blocks.parquet")
    snap = session.latest
    samples = {}
    for family in text_string_to_metric_families(exposition(lambda: snap)):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    w, since = snap.window, snap.since_start
    assert samples[("kvtool_utilization_ratio", (("scope", "window"),))] == w.utilization
    assert samples[("kvtool_utilization_ratio", (("scope", "since_start"),))] == since.utilization
    assert samples[("kvtool_prefix_hit_ratio", (("scope", "since_start"),))] == since.prefix_hit_share
    p99 = samples[("kvtool_free_latency_p99_seconds", (("scope", "window"),))]
    assert p99 == pytest.approx(w.free_latency_ms_p99 / 1000)
    assert samples[("kvtool_preemptions", (("scope", "window"),))] == w.preemptions
    assert samples[("kvtool_pool_capacity_blocks", ())] == 47  # 48 blocks, one the null block
    assert samples[("kvtool_alert_firing", (("rule", "preemption_storm"),))] == 1
    assert samples[("kvtool_alert_firing", (("rule", "leak"),))] == 0


def test_the_exporter_serves_over_http():
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from kvtool.watch.exporter import serve

    session = _replayed(RECORD / "recorded-48-blocks.parquet")
    server, port = serve("127.0.0.1:0", lambda: session.latest)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"kvtool_utilization_ratio", "kvtool_alert_firing", "kvtool_pool_in_use_blocks"} <= names


def test_vllm_metrics_rates_are_the_counters_change_over_the_window():
    from kvtool.watch.engine import MetricsSource

    pages = iter(
        [
            'vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:prefix_cache_queries_total{engine="0"} 1000\n'
            'vllm:prefix_cache_hits_total{engine="0"} 400\nvllm:num_preemptions_total{engine="0"} 3\n',
            'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:prefix_cache_queries_total{engine="0"} 1600\n'
            'vllm:prefix_cache_hits_total{engine="0"} 700\nvllm:num_preemptions_total{engine="0"} 3\n'
            'vllm:num_requests_running{engine="0"} 7\n',
        ]
    )
    source = MetricsSource("http://x/metrics", 60.0, fetch=lambda url: next(pages))
    source.poll()
    figures = source.poll()
    assert figures.kv_cache_usage_ratio == 0.5
    assert figures.prefix_cache_hit_ratio_window == pytest.approx(300 / 600)  # (700 - 400) / (1600 - 1000)
    assert figures.preemptions_per_s_window == 0.0
    assert figures.requests_running == 7 and math.isnan(figures.requests_waiting)


def test_once_exit_codes_and_json(run_cli, tmp_path):
    path = RECORD / "recorded-48-blocks.parquet"
    alerts = tmp_path / "alerts.jsonl"
    result = run_cli("watch", "--replay", path, "--once", "--json", "--alerts-file", alerts)
    assert result.exit_code == 5, result.stderr
    report = json.loads(result.stdout)
    assert [rule for rule, _ in report["fired"]] == ["preemption_storm"]
    assert report["snapshot"]["since_start"]["events"] == 1893
    logged = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert logged[0]["state"] == "firing" and logged[0]["rule"] == "preemption_storm" and logged[0]["request_ids"]
    healthy = run_cli("watch", "--replay", path, "--once", "--alert-preemptions-per-s", "2")
    assert healthy.exit_code == 0, healthy.stderr
    assert "since start" in healthy.stdout and "no alert" in healthy.stdout


def test_bad_input_is_one_line(run_cli, tmp_path):
    result = run_cli("watch")
    assert result.exit_code == 2 and result.stderr.startswith("Error: nothing to watch")
    result = run_cli("watch", "--replay", tmp_path / "missing.csv", "--once")
    assert result.exit_code == 2 and "no such file" in result.stderr
    result = run_cli("watch", "--replay", RECORD / "recorded-48-blocks.parquet", "--speed", "-1", "--once")
    assert result.exit_code == 2 and "--speed must be >= 0" in result.stderr
    result = run_cli("watch", "--replay", RECORD / "recorded-48-blocks.parquet", "--alert-long-share", "2")
    assert result.exit_code == 2 and "--alert-long-share" in result.stderr


def test_every_metric_the_grafana_dashboard_queries_is_exported():
    import re

    from prometheus_client.parser import text_string_to_metric_families

    from kvtool.watch.exporter import exposition
    from tests.support import REPO_ROOT

    dashboard = json.loads((REPO_ROOT / "docs" / "grafana-kvtool.json").read_text())
    queried = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"kvtool_\w+", t["expr"])}
    snap = _replayed(RECORD / "recorded-48-blocks.parquet").latest
    exported = {f.name for f in text_string_to_metric_families(exposition(lambda: snap))}
    assert queried and queried <= exported, queried - exported
