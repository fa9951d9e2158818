"""Globs and directory walks over folders with symlinks: never round a loop, each real file read once.

Before, ``glob.glob("**", recursive=True)`` followed a directory symlink back into its own parent until the kernel
refused the path (ELOOP after 40 links): one loop read the same file 41 times, two loops branch at every level and
the expansion was still running after 60 s; a symlinked file was a second pool of the same rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal

import pytest

from kvtool.events.sources import find_pool_files
from tests.support import DATA

BASIC = DATA / "analyze" / "basic.csv"  # a small schema-1 events file (tests/data/analyze/README.md)
TIMEOUT_S = 20  # the old expansion of two loops ran past 60 s; the fixed one takes milliseconds


class StillExpanding(BaseException):
    """Raised by the alarm: not an OSError (TimeoutError is one), which the expansion and the CLI would catch."""


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (StillExpanding) rather than hang when the expansion does not end."""

    def stop(signum, frame):
        raise StillExpanding(f"still expanding after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def looped_fleet(tmp_path, loops: int = 2):
    """fleet/instance=a/part-0.csv, with ``loops`` directory symlinks pointing back up the tree."""
    folder = tmp_path / "fleet" / "instance=a"
    (folder / "deeper").mkdir(parents=True)
    shutil.copy(BASIC, folder / "part-0.csv")
    os.symlink("..", folder / "up")  # instance=a/up -> fleet
    if loops > 1:
        os.symlink("../..", folder / "deeper" / "back")  # instance=a/deeper/back -> fleet
    return tmp_path / "fleet"


@pytest.mark.parametrize("loops", [1, 2])
@pytest.mark.parametrize("form", ["glob", "directory", "glob below the loop"])
def test_a_symlink_loop_is_never_followed_round(tmp_path, loops, form):
    fleet = looped_fleet(tmp_path, loops)
    argument = {
        "glob": f"{fleet}/**/*.csv",
        "directory": str(fleet),
        "glob below the loop": f"{fleet}/instance=*/**/*.csv",
    }[form]
    with deadline(TIMEOUT_S):
        units = find_pool_files([argument])
    assert [(u.name, u.paths) for u in units] == [("a", (str(fleet / "instance=a" / "part-0.csv"),))]


def test_a_symlinked_file_is_not_a_second_pool(tmp_path):
    fleet = tmp_path / "fleet"
    (fleet / "instance=a").mkdir(parents=True)
    (fleet / "instance=b").mkdir()
    shutil.copy(BASIC, fleet / "instance=a" / "part-0.csv")
    os.symlink("../instance=a/part-0.csv", fleet / "instance=b" / "part-0.csv")
    for argument in (str(fleet), f"{fleet}/**/*.csv", f"{fleet}/instance=*/*.csv"):
        units = find_pool_files([argument])
        assert [u.name for u in units] == ["a"], argument  # the first path to the file, in name order, is kept


def test_one_file_named_twice_by_two_paths_is_read_once(tmp_path):
    shutil.copy(BASIC, tmp_path / "x.csv")
    os.symlink("x.csv", tmp_path / "y.csv")
    units = find_pool_files([str(tmp_path / "x.csv"), str(tmp_path / "." / "x.csv"), str(tmp_path / "y.csv")])
    assert [u.paths for u in units] == [(str(tmp_path / "x.csv"),)]


def test_a_symlinked_folder_that_is_no_loop_is_still_read(tmp_path):
    # logs kept elsewhere and linked into the fleet folder are events like any others
    elsewhere = tmp_path / "disk2" / "engine-b"
    elsewhere.mkdir(parents=True)
    shutil.copy(BASIC, elsewhere / "part-0.csv")
    fleet = looped_fleet(tmp_path, loops=1)
    os.symlink(elsewhere, fleet / "instance=b")
    for argument in (str(fleet), f"{fleet}/**/*.csv"):
        with deadline(TIMEOUT_S):
            units = find_pool_files([argument])
        assert [u.name for u in units] == ["a", "b"], argument


def test_analyze_reads_the_looped_file_once(run_cli, tmp_path):
    fleet = looped_fleet(tmp_path, loops=2)
    with deadline(TIMEOUT_S):
        result = run_cli("analyze", f"{fleet}/**/*.csv", "--json")
    assert result.exit_code == 0, result.stderr
    fleet_json = json.loads(result.stdout)
    assert fleet_json["fleet"]["files"] == 1 and fleet_json["fleet"]["instances"] == 1
