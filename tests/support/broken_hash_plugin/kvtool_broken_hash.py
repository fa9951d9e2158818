"""A deliberately broken vLLM: a general plugin that leaves a dimension out of the prefix-cache block hash.

Negative control for `kvtool vllm isolation` (tests/vllm/test_isolation_live.py).  Never install it: the test
puts this folder on the engine's PYTHONPATH, where vLLM finds the ``vllm.general_plugins`` entry point of the
scratch ``kvtool_broken_hash-0.1.dist-info`` beside it and calls :func:`register` in every vLLM process, the
engine core included (the first statement of ``EngineCore.__init__``, vLLM 0.32).

``KVTOOL_TEST_BREAK_HASH`` (comma-separated) chooses what to drop from
``vllm.v1.core.kv_cache_utils.generate_block_hash_extra_keys``, which ``request_block_hasher`` calls through the
module's globals for every block of every request:

- ``salt``: the ``("cache_salt", salt)`` key (tenants share blocks);
- ``lora-path``: the adapter path of the ``("lora", name, path)`` key (adapter versions under one name share).

Unset or empty: the plugin does nothing.
"""

from __future__ import annotations

import os


def register() -> None:
    wanted = {w.strip() for w in os.environ.get("KVTOOL_TEST_BREAK_HASH", "").split(",") if w.strip()}
    if not wanted:
        return
    from vllm.v1.core import kv_cache_utils

    if getattr(kv_cache_utils, "_kvtool_broken", None) is not None:
        return
    original = kv_cache_utils.generate_block_hash_extra_keys

    def broken(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, start_mm_idx)
        if keys is None:
            return keys, next_mm_idx
        kept = []
        for key in keys:
            if "salt" in wanted and isinstance(key, tuple) and key[:1] == ("cache_salt",):
                continue
            if "lora-path" in wanted and isinstance(key, tuple) and key[:1] == ("lora",):
                key = key[:2]
            kept.append(key)
        return (tuple(kept) or None), next_mm_idx

    kv_cache_utils.generate_block_hash_extra_keys = broken
    kv_cache_utils._kvtool_broken = sorted(wanted)
