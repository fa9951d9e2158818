"""LMCache's in-process connector (LMCacheConnectorV1) keys a tier entry without the cache salt, from LMCache's own
code: tests/data/isolation/lmcache-0.5.6-keys.json was written by tests/support/lmcache_key_fixture.py, which ran
LMCache 0.5.6's ``extract_request_configs_from_sampling_params`` and ``ChunkedTokenDatabase.process_tokens``
(lmcache/v1/token_database.py; keys are lmcache/utils.py ``CacheEngineKey``) on two tenants' requests (same 600
tokens, salts 'tenant-a' / 'tenant-b').  LMCache is not needed here, nor installed anywhere.  A tier keyed like that is
what the fake engine's ``tier="tokens"`` plants, and kvtool's tier dimension convicts it."""

from __future__ import annotations

import json

from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support import DATA
from tests.vllm.isolation_fake import FakeVllm

FIXTURE = json.loads((DATA / "isolation" / "lmcache-0.5.6-keys.json").read_text(encoding="utf-8"))


def test_lmcache_derives_the_same_keys_for_two_tenants():
    a, b = FIXTURE["tenants"]["tenant-a"], FIXTURE["tenants"]["tenant-b"]
    assert a["cache_salt"] != b["cache_salt"]
    # 600 tokens in chunks of 256 (ChunkedTokenDatabase's default, save_unfull_chunk): 3 keys each
    assert FIXTURE["chunk_size"] == 256 and len(a["keys"]) == 3
    assert a["keys"] == b["keys"]  # model@world_size@worker_id@chunk_hash@dtype: no salt, no tag
    assert all(key.startswith("base@1@0@") and key.endswith("@bfloat16") for key in a["keys"])
    # the key does follow the content: other tokens, other keys
    assert set(FIXTURE["other_tokens_keys"]).isdisjoint(a["keys"])
    # neither the vLLM adapter nor the key derivation mentions cache_salt at all
    assert set(FIXTURE["cache_salt_mentions"].values()) == {0}
    # the multiprocess connector's key (IPCCacheServerKey) does keep the tenants apart
    assert FIXTURE["mp_connector_keys_equal"] is False


def test_kvtool_convicts_a_tier_keyed_that_way_on_the_tier_dimension():
    with FakeVllm(tier="tokens") as fake:
        record = run_isolation(IsolationOptions(endpoint=fake.url, dimensions=("tier",), repeats=1, seed=2))
    report = judge_record(record)
    tier = next(d for d in report.dimensions if d.dimension == "tier")
    assert tier.verdict == "leak" and report.exit_code == 1
    assert tier.minimal.evidence[0].startswith("reused 16 tokens of salt='a' after the fillers")
