"""--pp: vLLM's layer partition, weights per stage, capacity by the stage with the fewest blocks."""

from __future__ import annotations

import json

import pytest

from kvtool.core.errors import UsageError
from kvtool.estimate.pipeline import pp_partitions


@pytest.mark.parametrize(
    "layers, pp, parts",
    [
        # vllm/distributed/utils.py get_pp_indices: the remainder goes to the stages before the last, from the
        # second-to-last backwards (vLLM's tests/distributed/test_pipeline_partition.py: 5 layers, pp 3 ->
        # (0, 2), (2, 4), (4, 5))
        (5, 3, (2, 2, 1)),
        (10, 4, (2, 3, 3, 2)),
        (80, 2, (40, 40)),
        (32, 1, (32,)),
    ],
)
def test_partition_as_vllm(layers, pp, parts):
    assert pp_partitions(layers, pp) == parts


def test_more_stages_than_layers_is_refused():
    with pytest.raises(UsageError):
        pp_partitions(4, 8)


def test_capacity_is_set_by_the_most_loaded_stage(run_cli):
    args = ("estimate", "--model", "llama-3.1-70b", "--gpu", "H100", "--tp", "2", "--seq-len", "8192", "--json")
    out = json.loads(run_cli(*args, "--pp", "2").stdout)
    stages = out["stages"]
    assert [s["num_layers"] for s in stages] == [40, 40]
    # the last stage holds the LM head and runs the sampler: less budget, fewer blocks, and it sets capacity
    assert stages[1]["kv_budget_bytes"] < stages[0]["kv_budget_bytes"]
    assert out["num_blocks"] == min(s["num_blocks"] for s in stages) == stages[1]["num_blocks"]
    # 40 layers x 2 (K, V) x 4 KV heads per GPU x 128 x 2 B per token, 16 tokens a block
    assert stages[1]["num_blocks"] == stages[1]["kv_budget_bytes"] // (16 * 40 * 2 * 4 * 128 * 2)
    single = json.loads(run_cli(*args).stdout)
    assert single["stages"] == [] and out["num_blocks"] > single["num_blocks"]
