"""`kvtool analyze` through the real entry point: --json, --export, --plot, --strict, errors and exit codes."""

from __future__ import annotations

import csv
import json

import pytest

from kvtool.core.errors import EXIT_CHECK_FAILED, EXIT_INPUT, EXIT_USAGE
from tests.support import DATA, run_subprocess

D = DATA / "analyze"


def test_help(run_cli):
    result = run_cli("analyze", "--help")
    assert result.exit_code == 0
    assert "holding time versus utilization" in result.stdout
    for option in (
        "--json", "--export", "--plot", "--strict", "--long-threshold", "--long-share-alert", "--late-free-ms",
        "--workers", "--scheduler",
    ):  # fmt: skip
        assert option in result.stdout
    # typer 0.19 under click 8.5 drops an argument's help= text, so the accepted formats are in the docstring
    text = " ".join(result.stdout.split())
    assert "EVENTS: .csv, .csv.gz or .parquet in the events schema 1" in text


def test_tables(run_cli):
    result = run_cli("analyze", D / "basic.csv")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    for title in ("Culprits", "Pool", "Prefix reuse", "Long requests", "Anomalies"):
        assert title in result.stdout
    assert "79.2 %" in result.stdout  # pool utilization 152/192 (hand computation in test_analyze.py)


def test_json_has_summary_and_requests(run_cli):
    result = run_cli("analyze", D / "basic.csv", "--json")
    assert result.exit_code == 0
    assert result.stderr == ""
    data = json.loads(result.stdout)
    s = data["summary"]
    for key in (
        "requests",
        "events",
        "rejected_rows",
        "leaked_requests",
        "leaked_blocks",
        "peak_blocks_in_use",
        "utilization",
        "free_latency_ms_p95",
    ):
        assert key in s
    assert (s["requests"], s["events"], s["peak_blocks_in_use"]) == (2, 6, 4)
    assert s["free_latency_ms_p95"] == pytest.approx(760.5)  # 10 + 0.95 * (800 - 10)
    reqs = {r["request_id"]: r for r in data["requests"]}
    for key in ("request_id", "holding_time_s", "utilization", "block_seconds", "peak_blocks", "leaked"):
        assert key in reqs["A"]
    assert reqs["A"]["utilization"] == pytest.approx(0.75)  # 120 / 160
    assert reqs["A"]["leaked"] is False
    assert data["culprits"][0]["request_id"] == "A"
    assert data["schema_version"] == 1


def test_json_null_for_undefined_utilization(run_cli, tmp_path):
    f = tmp_path / "e.csv"
    f.write_text("ts,event,request_id,num_blocks,num_tokens\n1,allocate,a,1,1\n1,free,a,1,\n")
    data = json.loads(run_cli("analyze", f, "--json").stdout)
    assert data["requests"][0]["utilization"] is None  # empty holding interval
    assert data["summary"]["utilization"] is None


def test_export_csv(run_cli, tmp_path):
    out = tmp_path / "sub" / "requests.csv"
    out.parent.mkdir()  # --export writes into a folder that exists (a missing one is refused: test_analyze_export)
    result = run_cli("analyze", D / "leak_preempt.csv", "--export", out)
    assert result.exit_code == 0, result.stderr
    rows = {r["request_id"]: r for r in csv.DictReader(out.open())}
    assert float(rows["L"]["holding_time_s"]) == pytest.approx(6.0)  # leaked: measured to the trace end
    assert rows["L"]["leaked"] == "true"
    assert int(rows["P"]["preemptions"]) == 1
    assert rows["P"]["free_latency_ms_max"] == ""  # no latency column: blank, not 0


def test_plot_writes_four_pngs(run_cli, tmp_path):
    result = run_cli("analyze", D / "reuse.csv", "--plot", tmp_path / "charts", "--json")
    assert result.exit_code == 0, result.stderr
    json.loads(result.stdout)  # --json output stays pure
    names = sorted(p.name for p in (tmp_path / "charts").iterdir())
    assert names == [
        "blocks_in_use.png",
        "free_latency_hist.png",
        "holding_vs_utilization.png",
        "match_length_hist.png",
    ]
    for p in (tmp_path / "charts").iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_strict_fails_on_anomalies_only(run_cli):
    ok = run_cli("analyze", D / "basic.csv", "--strict")
    assert ok.exit_code == 0
    leak = run_cli("analyze", D / "leak_preempt.csv", "--strict", "--json")
    assert leak.exit_code == EXIT_CHECK_FAILED
    json.loads(leak.stdout)  # the report is still printed
    assert leak.stderr.splitlines()[0] == (
        f"Error: 1 anomalies: 0 rejected rows, 0 over-frees, 1 leaked requests ({D / 'leak_preempt.csv'})"
    )
    bad = run_cli("analyze", D / "bad_rows.csv", "--strict")
    assert bad.exit_code == EXIT_CHECK_FAILED
    assert "8 rejected rows" in bad.stderr
    # without --strict the same anomalies are reported, exit 0
    assert run_cli("analyze", D / "bad_rows.csv").exit_code == 0


def test_long_request_alert(run_cli, tmp_path):
    # long request L (100 tokens > threshold 50) holds 7 blocks, short S holds 3 on [1,2):
    # share of blocks in use = 7/7 on [0,1) (above 0.6), 7/10 on [1,2) (above), 0 after -> 2 s above the alert
    f = tmp_path / "e.csv"
    f.write_text(
        "ts,event,request_id,num_blocks,num_tokens\n0,allocate,L,7,100\n1,allocate,S,3,40\n2,free,L,7,\n2,free,S,3,\n"
    )
    data = json.loads(run_cli("analyze", f, "--json", "--long-threshold", "50").stdout)
    lr = data["long_requests"]
    assert lr["alert"] is True and lr["long_requests"] == 1
    assert lr["time_above_alert_s"] == pytest.approx(2.0)
    assert lr["peak_share"] == pytest.approx(1.0)
    # against a 20-block pool: 7/20 = 0.35 < 0.6 -> no alert
    data = json.loads(run_cli("analyze", f, "--json", "--long-threshold", "50", "--pool-blocks", "20").stdout)
    assert data["long_requests"]["alert"] is False
    assert data["long_requests"]["peak_share"] == pytest.approx(0.35)


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "Error: the events file is empty"),
        (b"\x00\x01\x02binary", "Error: not a CSV or Parquet events file (binary content)"),
        (
            b"a,b\n1,2\n",
            "Error: missing required column(s) ts, event, request_id, num_blocks, num_tokens; columns found: a, b",
        ),
        (b"\x1f\x8bnot really gzip", "Error: not a valid gzip file"),
    ],
)
def test_bad_files_one_line_exit_3(run_cli, tmp_path, content, expected):
    f = tmp_path / "e.csv"
    f.write_bytes(content)
    result = run_cli("analyze", f)
    assert result.exit_code == EXIT_INPUT
    assert result.stderr.splitlines()[0].startswith(expected)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_missing_file(run_cli, tmp_path):
    result = run_cli("analyze", tmp_path / "nope.csv")
    assert result.exit_code == EXIT_INPUT
    assert result.stderr == f"Error: events file not found ({tmp_path / 'nope.csv'})\n"


def test_missing_jsonl_file_is_an_input_error(run_cli, tmp_path):
    # .jsonl goes to the vLLM events analysis (tests/events/test_analyze_dispatch.py); a missing one is still exit 3.
    result = run_cli("analyze", tmp_path / "events.jsonl")
    assert result.exit_code == EXIT_INPUT
    assert result.stderr.startswith("Error: ")
    assert "events.jsonl" in result.stderr


@pytest.mark.parametrize(
    "option, value", [("--block-size", "0"), ("--long-share-alert", "1.5"), ("--top", "-1"), ("--pool-blocks", "0")]
)
def test_bad_option_values_exit_2(run_cli, option, value):
    result = run_cli("analyze", D / "basic.csv", option, value)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("Error: ")


def test_out_of_range_block_size_is_one_usage_line(run_cli):
    # beyond int64 it overflowed in the analysis: an OverflowError traceback.  (An empty --export, once a ValueError
    # traceback after the whole analysis, is in tests/cli/test_cli.py with every other path option.)
    result = run_cli("analyze", D / "basic.csv", "--block-size", "99999999999999999999", "--json")
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert result.stderr == (
        "Error: --block-size is too large: 99,999,999,999,999,999,999 tokens (at most 2,147,483,647) (--block-size)\n"
    )


def test_export_to_a_folder_is_refused_before_reading(run_cli, tmp_path):
    result = run_cli("analyze", D / "basic.csv", "--export", tmp_path, "--json")
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: --export takes a file name (NAME.csv, NAME.csv.gz or NAME.parquet), not a folder (--export {tmp_path})\n"
    )


def test_export_to_the_current_folder_is_named_as_given(run_cli, tmp_path, monkeypatch):
    # '.' is a folder like any other: the message names it as typed (it once said "--export ''")
    monkeypatch.chdir(tmp_path)
    result = run_cli("analyze", D / "basic.csv", "--export", ".", "--json")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr == (
        "Error: --export takes a file name (NAME.csv, NAME.csv.gz or NAME.parquet), not a folder (--export .)\n"
    )


def test_an_empty_events_argument_is_a_usage_error(run_cli):
    # Path("") is the current folder: every events file below it was analysed as a fleet
    result = run_cli("analyze", "", "--json")
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert result.stderr == (
        "Error: an empty argument names no events file (EVENTS)\n"
        "Tip: give files, a directory ('.' for the current one) or a glob\n"
    )


def test_vllm_events_in_a_fleet_are_refused_in_one_short_line(run_cli):
    # the refusal listed a whole JSON line as the "columns found"
    vllm = DATA / "vllm-events" / "small-cache-evictions-incremental.jsonl"
    result = run_cli("analyze", D / "basic.csv", vllm, "--json")
    assert result.exit_code == 0, result.stderr
    refused = [f for f in json.loads(result.stdout)["files"] if f["refused"]]
    assert [f["refused"] for f in refused] == [f"not a CSV or Parquet events file: it is JSON lines ({vllm})"]


def test_export_below_a_file_names_the_file(run_cli, tmp_path):
    # it was "cannot write the export file: [Errno 17] File exists: '...'", after the whole analysis
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    result = run_cli("analyze", D / "basic.csv", "--export", blocker / "out" / "requests.csv", "--json")
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: {blocker} is a file, not a folder (--export {blocker / 'out' / 'requests.csv'})\n"
    )


@pytest.mark.parametrize(
    "args, lines",
    [
        # distributed's ValueError ("missing port number in address ''") was a traceback
        (["--scheduler", ""], ["Error: not a Dask scheduler address: '' (--scheduler)", "Tip: give tcp://HOST:8786"]),
        (
            ["--scheduler", "nonsense"],
            ["Error: not a Dask scheduler address: 'nonsense' (--scheduler)", "Tip: give tcp://HOST:8786"],
        ),
        (["--workers", "0"], ["Error: --workers must be a positive number of processes, got 0 (--workers)"]),
    ],
    ids=["empty-scheduler", "scheduler-without-port", "zero-workers"],
)
def test_bad_dask_options_are_one_usage_line(run_cli, args, lines):
    result = run_cli("analyze", D / "basic.csv", D / "reuse.csv", *args, "--json")
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert [line for line in result.stderr.splitlines() if not line.startswith("analyze: file")] == lines


def test_subprocess_json_and_exit_code():
    proc = run_subprocess("analyze", D / "leak_preempt.csv", "--json", "--strict")
    assert proc.returncode == EXIT_CHECK_FAILED
    assert json.loads(proc.stdout)["summary"]["leaked_requests"] == 1
    assert "Traceback" not in proc.stderr


def test_progress_bar_only_on_a_terminal(run_cli, monkeypatch):
    import sys

    import kvtool.cli.analyze as command

    monkeypatch.setattr(command, "PROGRESS_MIN_BYTES", 0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    result = run_cli("analyze", D / "basic.csv", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["summary"]["requests"] == 2  # stdout stays pure JSON


def test_json_lines_match_the_records(tmp_path):
    # the fast column-wise JSON writer must agree with the plain per-record conversion
    import io

    from kvtool.events.analysis import analyze_events
    from kvtool.events.load import load_events
    from kvtool.events.render import request_records, write_json

    f = tmp_path / "e.csv"
    f.write_text(
        'ts,event,request_id,num_blocks,num_tokens\n0,allocate,"a, ""b""",1,5\n1,free,"a, ""b""",1,\n'
        "2,allocate,z,1,1\n2,free,z,1,\n"
    )
    analysis = analyze_events(load_events(f))
    out = io.StringIO()
    write_json(analysis, out)
    assert json.loads(out.getvalue())["requests"] == request_records(analysis)


def test_json_rows_read_back_every_float_exactly_and_as_a_float():
    # Arrow formats the numbers: integral values ("5", "-0", "1e+15" in Arrow's words) must still read back as
    # floats, every value bit for bit (json.loads of Python's own repr is the reference), NaN/inf as null
    import math

    import numpy as np

    from kvtool.events.render import ROW_SEPARATOR, _row_lines

    values = [5.0, -0.0, 1e15, 1e16, 1e22, 1e-5, 1e-7, 0.1 + 0.2, 2.5e-300, 1.7976931348623157e308, 123456789.0]
    values += [float("nan"), float("inf"), -float("inf"), 3.0e-324]
    floats = np.array(values)
    ids = [f'r"{i}' for i in range(len(values))]
    text = _row_lines([("request_id", ids), ("holding_time_s", floats), ("events", np.arange(len(values)))])
    rows = [json.loads(line) for line in text.split(ROW_SEPARATOR)]
    assert [r["request_id"] for r in rows] == ids
    assert [r["events"] for r in rows] == list(range(len(values)))
    for value, row in zip(values, rows):
        got = row["holding_time_s"]
        if math.isfinite(value):
            assert type(got) is float and got == value and math.copysign(1, got) == math.copysign(1, value), (
                value,
                got,
            )
        else:
            assert got is None


@pytest.mark.parametrize(
    "ids",
    [
        ["req-1", "cmpl-3f2a9c-0", "", " spaced ", "a'b", "~!#$%^&*()[]{}"],  # plain: quoted in one join
        ["req-1", 'say "hi"', "x"],  # a quote inside: escaped
        ["back\\slash", "req-2"],
        ["tab\there", "nul\x00", "del\x7f"],  # control characters
        ["café", "日本", "emoji \U0001f600"],  # non-ASCII: \u escapes, as json.dumps writes them
        ["req-1", None, "req-3"],  # a null
        ['"', '""', "a"],  # quotes only
    ],
)
def test_json_rows_text_columns_equal_json_dumps(ids):
    # the reference is Python's own json.dumps of each value (ensure_ascii, as the rest of --json)
    import numpy as np

    from kvtool.events.render import ROW_SEPARATOR, _row_lines

    text = _row_lines([("request_id", ids), ("events", np.arange(len(ids)))])
    lines = text.split(ROW_SEPARATOR)
    assert lines == [f'{{"request_id": {json.dumps(v)}, "events": {i}}}' for i, v in enumerate(ids)]


def test_request_ids_are_not_rich_markup(run_cli, tmp_path):
    f = tmp_path / "e.csv"
    f.write_text(
        "ts,event,request_id,num_blocks,num_tokens\n0,allocate,[/bold]x,2,1\n1,free,[/bold]x,2,\n"
        "0,allocate,[red]leak,1,1\n"
    )
    result = run_cli("analyze", f)
    assert result.exit_code == 0, result.stderr
    assert "[/bold]x" in result.stdout and "[red]leak" in result.stdout


def test_empty_charts_say_why(tmp_path):
    # leak_preempt.csv has no latency_ms column and no reuse rows: those two charts used to be bare axes (or one
    # bar at 0 tokens for every request); they now say what is missing.  reuse.csv has hits: a real histogram.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvtool.events import plots as event_plots
    from kvtool.events.analysis import analyze_events
    from kvtool.events.load import load_events

    def texts(path, painter):
        fig, ax = plt.subplots()
        painter(analyze_events(load_events(path)), ax)
        found = [t.get_text() for t in ax.texts]
        plt.close(fig)
        return found

    assert texts(D / "leak_preempt.csv", event_plots._free_latency) == [
        "no free latency recorded (no latency_ms on free rows)"
    ]
    assert texts(D / "leak_preempt.csv", event_plots._match_lengths) == [
        "no prefix-cache hits in the file (no reuse rows, or none with tokens)"
    ]
    assert texts(D / "reuse.csv", event_plots._match_lengths) == []
    # basic.csv: frees of 10 ms and 800 ms.  The 800 ms one (request A, 3 blocks x 0.8 s = 2.4 block-seconds) is
    # above the 100 ms threshold: named on the chart, whose axes are linear (a log count axis hid a single bar)
    assert texts(D / "basic.csv", event_plots._free_latency) == ["A: 800 ms, 2.40 block-s"]
    fig, ax = plt.subplots()
    event_plots._free_latency(analyze_events(load_events(D / "basic.csv")), ax)
    assert ax.get_yscale() == "linear" and ax.get_xscale() == "linear"
    plt.close(fig)


def test_top_zero_does_not_claim_there_are_no_culprits(run_cli):
    # basic.csv: A holds 20 tokens in 2 blocks of 16 for its first second, so it wastes slots (wasted > 0); with
    # --top 0 the table is not listed, which is not the same as "no request holds unused slots".
    result = run_cli("analyze", D / "basic.csv", "--top", "0")
    assert result.exit_code == 0, result.stderr
    assert "Culprits: not listed (--top 0)" in result.stdout
    assert "no request holds unused slots" not in result.stdout


def test_match_length_counts_have_thousands_separators(run_cli, tmp_path):
    # 1,200 requests that each allocate one block and never hit the prefix cache: 1,200 matches of 0 tokens.
    path = tmp_path / "many.csv"
    rows = "".join(f"{i},allocate,q{i},1,16\n{i + 0.5},free,q{i},1,\n" for i in range(1200))
    path.write_text("ts,event,request_id,num_blocks,num_tokens\n" + rows)
    result = run_cli("analyze", path)
    assert result.exit_code == 0, result.stderr
    assert "0 tok x 1,200" in result.stdout


def test_compression_is_read_from_the_content_not_the_name(run_cli, tmp_path):
    # Plain text named .csv.gz and gzip named .csv both read; the figures are those of the plain file.
    import gzip

    plain = (D / "basic.csv").read_bytes()
    mislabelled_plain = tmp_path / "plain.csv.gz"
    mislabelled_plain.write_bytes(plain)
    mislabelled_gzip = tmp_path / "packed.csv"
    mislabelled_gzip.write_bytes(gzip.compress(plain))
    reference = json.loads(run_cli("analyze", D / "basic.csv", "--json").stdout)["summary"]
    for path in (mislabelled_plain, mislabelled_gzip):
        result = run_cli("analyze", path, "--json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["summary"] == reference
