"""The isolation run end to end against a fake OpenAI server whose prefix cache hashes like vLLM 0.32
(tests/vllm/isolation_fake.py), with and without a dimension dropped from its hash; no vLLM needed."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import KvtoolError
from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.verdicts import judge_record
from tests.vllm.isolation_fake import BLOCK, FakeVllm

SEARCHED = ("salt", "adapter", "adapter-version", "embeddings", "cross", "salt-variant", "length", "salt-adapter",
            "salt-embeds", "eviction")  # fmt: skip


# every dimension whose pairs differ by the salt: a hash without the salt leaks in all of them
SALTED = {"salt", "salt-variant", "length", "salt-adapter", "salt-embeds", "eviction"}


def verdicts(report) -> dict[str, str]:
    return {d.dimension: d.verdict for d in report.dimensions}


def run(fake: FakeVllm, **options):
    return judge_record(run_isolation(IsolationOptions(endpoint=fake.url, repeats=1, seed=3, **options)))


def test_a_correct_cache_passes_every_dimension_that_can_run():
    with FakeVllm() as fake:
        report = run(fake, adapters=("lora-a",), adapter_versions=("/p/v1", "/p/v2"), hidden_size=8)
    assert report.verdict == "pass" and report.exit_code == 0
    assert verdicts(report) == {**dict.fromkeys(SEARCHED, "pass"), "multimodal": "not run", "tier": "not run"}
    assert report.engine.block_size == BLOCK  # read from vllm:cache_config_info
    salt = report.dimensions[0]
    # all 3 pairs of salt:a, salt:b, base x 2 orders x 2 variants x 1 repeat; the exact control reuses all 4 full
    # blocks, the prefix one 2
    assert salt.trials == 12
    assert {(r.variant, r.control_expected_tokens) for r in salt.rows} == {("exact", 4 * BLOCK), ("prefix", 2 * BLOCK)}
    assert all(t.metric_clean_probes == 3 for t in salt.trial_verdicts)  # nothing else moved the counters


@pytest.mark.parametrize(
    ("drop", "leaking"),
    [({"salt"}, SALTED), ({"lora-path"}, {"adapter-version"}), ({"salt", "lora-path"}, {*SALTED, "adapter-version"})],
)
def test_a_dropped_dimension_leaks_there_and_nowhere_else(drop, leaking):
    with FakeVllm(drop=frozenset(drop)) as fake:
        report = run(fake, adapters=("lora-a",), adapter_versions=("/p/v1", "/p/v2"), hidden_size=8)
    assert report.verdict == "leak" and report.exit_code == 1
    assert {d for d, v in verdicts(report).items() if v == "leak"} == leaking
    assert all(v in ("pass", "not run") for d, v in verdicts(report).items() if d not in leaking)
    salt_rows = [r for r in report.dimensions[0].rows if r.first == "salt:a" and r.variant == "exact"]
    if "salt" in drop:  # the victim reused the prime's 4 full blocks
        assert salt_rows[0].victim_cached_tokens == (4 * BLOCK,)


@pytest.mark.parametrize(("salted", "verdict"), [(True, "pass"), (False, "leak")])
def test_tenants_by_api_key(salted, verdict):
    # a gateway that derives the salt from the key keeps tenants apart; one that does not lets them share
    with FakeVllm(salt_from_key=salted, adapters=()) as fake:
        report = run(fake, api_keys=(("acme", "k1"), ("globex", "k2")), dimensions=("salt",))
    rows = [r for r in report.dimensions[0].rows if r.first.startswith("tenant:")]
    assert {r.verdict for r in rows} == {verdict} and len(rows) == 4  # 2 orders x 2 variants
    assert report.verdict == verdict


def test_prefix_caching_off_is_inconclusive_never_pass():
    # every victim misses, but so does every control: the misses prove nothing
    with FakeVllm(caching=False) as fake:
        report = run(fake, adapters=("lora-a",))
    assert report.verdict == "inconclusive" and report.exit_code == 4  # not 2, a usage error's code
    assert {d.verdict for d in report.dimensions if d.verdict != "not run"} == {"inconclusive"}
    # no control that ran shared (the salt variants' empty salt is refused, so its control never ran)
    assert all(t.control_cached_tokens == 0 for d in report.dimensions for t in d.trial_verdicts)


def test_dimensions_without_what_they_need_are_not_run_and_say_why():
    with FakeVllm(adapters=()) as fake:
        report = run(fake)
    assert verdicts(report) == {
        "salt": "pass", "adapter": "not run", "adapter-version": "not run", "embeddings": "not run", "cross": "not run",
        "salt-variant": "pass", "length": "pass", "salt-adapter": "not run", "salt-embeds": "not run",
        "eviction": "pass", "multimodal": "not run", "tier": "not run",
    }  # fmt: skip
    reasons = {d.dimension: d.skipped_reason for d in report.dimensions}
    assert "--adapter NAME" in reasons["adapter"] and "--hidden-size" in reasons["embeddings"]
    assert report.exit_code == 0


def test_an_endpoint_without_cached_token_reporting_is_a_clear_error():
    with FakeVllm(report_cached=False) as fake, pytest.raises(KvtoolError) as err:
        run(fake)
    assert "does not report cached tokens" in err.value.message
    assert "--enable-prompt-tokens-details" in err.value.tip
    assert err.value.exit_code == 2


def test_cli_against_the_fake_endpoint(run_cli):
    with FakeVllm() as fake:
        result = run_cli("vllm", "isolation", "--endpoint", fake.url, "--adapter", "lora-a", "--repeats", "1", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"] == "pass" and data["engine"]["mode"] == "endpoint"
    assert [d["verdict"] for d in data["dimensions"]] == [
        "pass", "pass", "not run", "not run", "pass", "pass", "pass", "pass", "not run", "pass", "not run", "not run"
    ]  # fmt: skip


def test_cli_leak_exits_1_and_names_the_dimension(run_cli, tmp_path):
    record = tmp_path / "run.json"
    with FakeVllm(drop=frozenset({"salt"})) as fake:
        result = run_cli("vllm", "isolation", "--endpoint", fake.url, "--repeats", "1", "--record", record)
    assert result.exit_code == 1
    assert "Tenants (cache_salt): leak" in result.stdout
    replayed = run_cli("vllm", "isolation", "--replay", record, "--json")
    assert replayed.exit_code == 1 and json.loads(replayed.stdout)["verdict"] == "leak"
