"""`--model org/name` reads the local Hugging Face cache offline, or maps to a built-in profile."""

from __future__ import annotations

import json

from kvtool.core.errors import EXIT_USAGE
from tests.support import DATA


def _cache(tmp_path, monkeypatch):
    # huggingface_hub's layout: <HF_HOME>/hub/models--<org>--<name>/{refs/main, snapshots/<hash>/config.json}
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    repo = tmp_path / "hub" / "models--acme--tiny-llama"
    (repo / "snapshots" / "0123abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc\n")
    config = (DATA / "estimate" / "tiny-llama" / "config.json").read_text()
    (repo / "snapshots" / "0123abc" / "config.json").write_text(config)
    return repo


def test_model_id_found_in_the_cache(run_cli, tmp_path, monkeypatch):
    repo = _cache(tmp_path, monkeypatch)
    r = run_cli("estimate", "--model", "acme/tiny-llama", "--seq-len", "1024", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["source"] == str(repo / "snapshots" / "0123abc" / "config.json")


def test_model_id_maps_to_a_profile_else_says_only_local_files(run_cli, tmp_path, monkeypatch):
    _cache(tmp_path, monkeypatch)
    out = json.loads(run_cli("estimate", "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "1024", "--json").stdout)
    assert out["model"] == "llama-3.1-8b"
    r = run_cli("estimate", "--model", "acme/absent")
    assert r.exit_code == EXIT_USAGE and "reads only local files" in r.stderr


def test_a_cached_model_is_named_by_its_repository(run_cli, tmp_path, monkeypatch):
    # it was named by the snapshot's commit hash ("0123abc")
    _cache(tmp_path, monkeypatch)
    out = json.loads(run_cli("estimate", "--model", "acme/tiny-llama", "--seq-len", "1024", "--json").stdout)
    assert out["model"] == "acme/tiny-llama"


def test_the_tip_for_a_model_not_in_the_cache_names_hf_download(run_cli, tmp_path, monkeypatch):
    # huggingface_hub 1.x installs the `hf` command only (`huggingface-cli` was deprecated in 0.34 and removed);
    # `hf download REPO_ID [FILENAMES]...` fetches into the cache kvtool reads
    _cache(tmp_path, monkeypatch)
    r = run_cli("estimate", "--model", "acme/absent")
    assert r.stderr.splitlines()[-1] == (
        "Tip: fetch its config first (hf download acme/absent config.json), or pass --config DIR"
    )
