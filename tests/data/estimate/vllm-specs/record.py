"""Size real Gemma 3n / Gemma 4 configs' KV layers with vLLM 0.32's own sizing functions (no engine, no weights).

Documentation of how cases.json's "vllm" figures were made, and run by tests/estimate/test_vllm_live_sizing.py where
vLLM is installed. For each case it builds the KV cache spec of every layer that holds KV, as vLLM's model runner
would (vllm/model_executor/layers/attention/attention.py ``get_kv_cache_spec``: a SlidingWindowSpec for sliding
layers, a FullAttentionSpec for the others; KV-sharing layers get none, gpu_model_runner.py ``get_kv_cache_spec``),
then calls vllm/v1/core/kv_cache_utils.py ``get_kv_cache_groups`` (page unification and grouping),
``get_kv_cache_config_from_groups`` (num_blocks) and ``get_max_concurrency_for_kv_cache_config`` (the logged
"Maximum concurrency"; the logged token count is int(concurrency x max_model_len), ``get_kv_cache_capacity``).
The layer list of each case is written out by hand from the published config (tests/data/estimate/README.md).
The KV cache layout is LBNHC: what vLLM resolves for Gemma 4 on CUDA (TRITON_ATTN, forced for its heterogeneous
head sizes, declares no layout, so the default preference's first block-compact layout wins).

    /work/vllm-venv/bin/python tests/data/estimate/vllm-specs/record.py tests/data/estimate/vllm-specs/cases.json
"""


import json
import sys
from types import SimpleNamespace

import torch
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout


def layer_specs(case: dict) -> dict:
    """One spec per KV-holding layer: [kind, KV heads, head size, window] as listed in the case."""
    specs = {}
    for i, (kind, heads, head_size, window) in enumerate(case["layers"]):
        common = {"block_size": case["block_size"], "num_kv_heads": heads, "head_size": head_size,
                  "dtype": torch.bfloat16}
        name = f"model.layers.{i}.self_attn.attn"
        specs[name] = FullAttentionSpec(**common) if kind == "full" else SlidingWindowSpec(**common, sliding_window=window)
    return specs


def vllm_config(case: dict) -> SimpleNamespace:
    """The fields of VllmConfig these functions read, as `vllm serve` sets them."""
    cache = SimpleNamespace(kv_cache_layout=case["layout"], num_gpu_blocks_override=None,
                            prefix_cache_retention_interval=None,
                            get_resolved_kv_cache_layout=lambda: KVCacheLayout[case["layout"]])
    return SimpleNamespace(
        cache_config=cache, scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=SimpleNamespace(hisparse_config=None),
        model_config=SimpleNamespace(max_model_len=case["max_model_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=case["max_in_flight_tokens"], speculative_config=None,
    )


def size(case: dict) -> dict:
    config = vllm_config(case)
    groups = kv_cache_utils.get_kv_cache_groups(config, layer_specs(case))
    kv_config = kv_cache_utils.get_kv_cache_config_from_groups(config, groups, case["kv_cache_memory_bytes"])
    concurrency = kv_cache_utils.get_max_concurrency_for_kv_cache_config(config, kv_config)
    return {
        "num_blocks": kv_config.num_blocks,
        "max_concurrency": concurrency,
        "logged_tokens": int(concurrency * case["max_model_len"]),
        "groups": [[type(g.kv_cache_spec).__name__, len(g.layer_names), g.kv_cache_spec.block_size,
                    g.kv_cache_spec.page_size_bytes] for g in groups],
    }


if __name__ == "__main__":
    cases = json.loads(open(sys.argv[1]).read())["cases"]
    print("SPEC_RESULT " + json.dumps({name: size(case) for name, case in cases.items()}), flush=True)
