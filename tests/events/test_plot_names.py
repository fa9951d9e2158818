"""Pool names in file names: whatever an instance is called, `--plot DIR` writes only inside DIR.

Before, a pool's chart folder was its name with characters other than letters, digits and ``-_.=`` replaced:
``..`` was kept as it is, so ``--plot out/plots/deeper`` wrote the charts of instance ``..`` into ``out/plots/``.
The names in the tables stay as they are (escaped for rich), only the folder names change.
"""

from __future__ import annotations

import csv
import json
import os
import shutil

import pytest

from kvtool.events.plots import CHARTS, MAX_NAME_CHARS, pool_plot_folder, safe_file_name
from tests.support import DATA

BASIC = DATA / "analyze" / "basic.csv"  # a small schema-1 events file (tests/data/analyze/README.md)
HOSTILE = ["..", "../x", "/abs", "a/b", "a_b", "nul\x00name", "L" * 300, ".", ".hidden", "a\\..\\b", ""]


def _rows():
    with BASIC.open(newline="") as handle:
        return list(csv.DictReader(handle))


def fleet_with_instance_column(path, names):
    """basic.csv's rows once per instance name, in an ``instance`` column (request ids kept apart by name)."""
    rows = _rows()
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["instance", *rows[0]])
        writer.writeheader()
        for name in names:
            writer.writerows({"instance": name, **r} for r in rows)
    return path


def written_files(root):
    return [os.path.join(folder, f) for folder, _, files in os.walk(root) for f in files]


def inside(path, folder) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root and real != root


def test_charts_of_hostile_instance_names_stay_in_the_plot_folder(run_cli, tmp_path):
    names = [n for n in HOSTILE if n]  # a blank instance is the file's own pool (docs/analyze.md)
    events = fleet_with_instance_column(tmp_path / "fleet.csv", names)
    out = tmp_path / "out" / "plots" / "deeper"
    result = run_cli("analyze", events, "--plot", out, "--top", "100", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert sorted(i["instance"] for i in report["instances"]) == sorted(names)  # names reported as they are
    everything = written_files(tmp_path)
    charts = [f for f in everything if f.endswith(".png")]
    assert charts and all(inside(f, out) for f in charts), [f for f in charts if not inside(f, out)]
    assert sorted(everything) == sorted([str(events), *charts])  # nothing else written anywhere
    folders = {os.path.dirname(f) for f in charts}
    assert len(folders) == len(names)  # one folder per pool: "a/b" and "a_b" do not share one
    assert all(os.path.dirname(f) == str(out) for f in folders)  # each directly in the folder given
    assert all(len(os.path.basename(f)) <= MAX_NAME_CHARS + 9 for f in folders)


def test_a_hive_folder_named_dot_dot_stays_in_the_plot_folder(run_cli, tmp_path):
    # instance=.. is a legal folder name whose instance is ".."; before, its charts landed in out/plots/
    for name in ("..", "a"):
        (tmp_path / "fleet" / f"instance={name}").mkdir(parents=True)
        shutil.copy(BASIC, tmp_path / "fleet" / f"instance={name}" / "part-0.csv")
    out = tmp_path / "out" / "plots" / "deeper"
    result = run_cli("analyze", tmp_path / "fleet", "--plot", out, "--top", "10")
    assert result.exit_code == 0, result.stderr
    charts = [f for f in written_files(tmp_path / "out") if f.endswith(".png")]
    assert len(charts) == 2 * len(CHARTS) and all(inside(f, out) for f in charts)
    assert "│ .." in result.stdout or " .. " in result.stdout  # the table shows the name as it is


@pytest.mark.parametrize("name", HOSTILE)
def test_every_name_is_one_plain_child_of_the_folder(tmp_path, name):
    folder = pool_plot_folder(tmp_path, name)
    assert folder.parent == tmp_path and folder.resolve().parent == tmp_path.resolve()
    leaf = folder.name
    assert leaf and not leaf.startswith(".") and "/" not in leaf and "\x00" not in leaf and leaf.isascii()


def test_safe_names_are_kept_and_changed_ones_stay_distinct():
    assert safe_file_name("engine-a_rank=1.v2") == "engine-a_rank=1.v2"  # nothing to change: the name itself
    changed = [safe_file_name(n) for n in ("a/b", "a_b", "a:b", "a b")]
    assert len(set(changed)) == 4 and changed[1] == "a_b"
