"""`kvtool models` (and `estimate --list`) with a broken user profile: the file is named in one warning and
skipped, the rest is listed (issue 25: one bad profile made the whole listing fail); `estimate --model` of that
very profile still fails."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kvtool.estimate.catalog import model_catalog
from tests.estimate.test_profiles import MY_MODEL

GOOD = MY_MODEL  # a valid user profile (tests/estimate/test_profiles.py)
BROKEN = GOOD.replace("my-model", "my-broken")
BAD_MODELS = [
    # (file text, what the warning must say after the file name)
    (BROKEN + "    colour: red\n", ": field colour)"),
    (BROKEN.replace("num_hidden_layers: 4", "num_hidden_layers: four"), ": config: field num_hidden_layers)"),
    (BROKEN + "  bad: [unclosed\n", ")"),  # a YAML syntax error: the line is named, there is no field
]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _profiles(root: Path, broken_text: str) -> Path:
    _write(root / "models" / "my-model.yaml", GOOD)
    _write(root / "gpus" / "toy.yaml", "name: toy\nmemory: 1GiB\n")
    return _write(root / "models" / "my-broken.yaml", broken_text)


@pytest.mark.parametrize(("text", "tail"), BAD_MODELS)
@pytest.mark.parametrize("command", [("models",), ("estimate", "--list")])
def test_a_broken_profile_is_one_warning_and_the_rest_is_listed(run_cli, tmp_path, command, text, tail):
    broken = _profiles(tmp_path, text)
    result = run_cli(*command, "--profiles", tmp_path)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Warning: skipped a profile that does not load: ")
    assert lines[0].endswith(f"({broken}{tail}")
    for name in ("my-model", "llama-2-7b", "toy", "H100-80GB"):  # the good user profiles and the built-in ones
        assert name in result.stdout
    assert "my-broken" not in result.stdout


@pytest.mark.parametrize(("text", "tail"), BAD_MODELS[:1])
def test_json_carries_the_warning_and_nothing_else_on_stderr(run_cli, tmp_path, text, tail):
    broken = _profiles(tmp_path, text)
    result = run_cli("models", "--json", "--profiles", tmp_path)
    assert result.exit_code == 0 and result.stderr == ""
    data = json.loads(result.stdout)
    assert len(data["warnings"]) == 1 and data["warnings"][0].endswith(f"({broken}{tail}")
    names = {m["name"] for m in data["models"]}
    assert "my-model" in names and "llama-2-7b" in names and "my-broken" not in names
    assert "toy" in {g["name"] for g in data["gpus"]}


def test_a_broken_gpu_profile_and_the_env_variable(run_cli, tmp_path, monkeypatch):
    _write(tmp_path / "models" / "my-model.yaml", GOOD)
    bad = _write(tmp_path / "gpus" / "toy.yaml", "name: toy\nmemory: lots\n")
    monkeypatch.setenv("KVTOOL_PROFILES", str(tmp_path))
    catalog = model_catalog()
    assert [s.file for s in catalog.skipped] == [str(bad)] and "field memory" in catalog.skipped[0].reason
    assert "my-model" in {m.name for m in catalog.models} and "toy" not in {g.name for g in catalog.gpus}
    result = run_cli("models")
    assert result.exit_code == 0 and result.stderr.count("\n") == 1 and f"({bad}: field memory)" in result.stderr


def test_a_good_catalog_warns_nothing(run_cli):
    result = run_cli("models")
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(run_cli("models", "--json").stdout)["warnings"] == []


@pytest.mark.parametrize(("text", "tail"), BAD_MODELS)
def test_estimating_the_broken_profile_itself_still_fails(run_cli, tmp_path, text, tail):
    broken = _profiles(tmp_path, text)
    result = run_cli("estimate", "--model", "my-broken", "--gpu", "H100-80GB", "--profiles", tmp_path)
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr.startswith("Error: ") and f"({broken}{tail}" in result.stderr.splitlines()[0]
