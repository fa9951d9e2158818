"""Deliberately broken vLLMs of a second kind: defects that keep the salt in the hash most of the time.

tests/support/broken_hash_plugin drops a whole dimension; a security reviewer's defects are subtler, and the fixed
sample of the first isolation check passed them (kvtool issue 31).  Like that plugin this is a vLLM general plugin
found through the scratch ``kvtool_planted_defect-0.1.dist-info`` entry point on the engine's PYTHONPATH (nothing is
installed); :func:`register` runs in every vLLM process, the engine core included, and wraps
``vllm.v1.core.kv_cache_utils.generate_block_hash_extra_keys`` (vLLM 0.32; ``request_block_hasher`` calls it through
the module's globals for every block).  ``KVTOOL_TEST_DEFECT`` (comma-separated) picks the family:

- ``casefold``: salts compared case-insensitively (the salt key holds ``salt.casefold()``);
- ``normalize``: salts compared after NFKC, strip and casefold (a "canonicalising" gateway pushed into the engine);
- ``salt-after:N``: the salt ignored for prompts longer than N full blocks (a length-limited salt check);
- ``adapter-shared``: the salt ignored on LoRA requests (tenants share on one adapter);
- ``evict``: the salt ignored once the pool has evicted a cached block (``BlockPool._maybe_evict_cached_block``
  returned True): a defect on the eviction path, invisible to any check that never fills the pool;
- ``mm-shared``: the salt dropped from a block's extra keys when the block carries multimodal features (an
  ``("mm", identifier, offset)`` key from ``_gen_mm_extra_hash_keys``): tenants share image prompts, while text
  prompts keep their salt (a defect on the multimodal path, invisible to any check that sends no image).

Unset or empty: the plugin does nothing.
"""

from __future__ import annotations

import os
import unicodedata


def register() -> None:
    wanted = [w.strip() for w in os.environ.get("KVTOOL_TEST_DEFECT", "").split(",") if w.strip()]
    if not wanted:
        return
    from vllm.v1.core import kv_cache_utils

    if getattr(kv_cache_utils, "_kvtool_planted", None) is not None:
        return
    original = kv_cache_utils.generate_block_hash_extra_keys
    after = [int(w.split(":", 1)[1]) for w in wanted if w.startswith("salt-after:")]

    def planted(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, start_mm_idx)
        if keys is None:
            return keys, next_mm_idx
        block = max(1, end_token_idx - start_token_idx)
        kept = []
        for key in keys:
            if isinstance(key, tuple) and key[:1] == ("cache_salt",):
                salt = key[1]
                if "casefold" in wanted:
                    salt = salt.casefold()
                if "normalize" in wanted:
                    salt = unicodedata.normalize("NFKC", salt).strip().casefold()
                if after and request.num_prompt_tokens // block > after[0]:
                    continue
                if "adapter-shared" in wanted and request.lora_request is not None:
                    continue
                if "evict" in wanted and evicted[0] > 0:
                    continue
                if "mm-shared" in wanted and any(isinstance(k, tuple) and k[:1] == ("mm",) for k in keys):
                    continue
                key = ("cache_salt", salt)
            kept.append(key)
        return (tuple(kept) or None), next_mm_idx

    evicted = [0]
    if "evict" in wanted:
        from vllm.v1.core.block_pool import BlockPool

        original_evict = BlockPool._maybe_evict_cached_block

        def counting_evict(self, block):
            done = original_evict(self, block)
            if done:
                evicted[0] += 1
            return done

        BlockPool._maybe_evict_cached_block = counting_evict

    kv_cache_utils.generate_block_hash_extra_keys = planted
    kv_cache_utils._kvtool_planted = wanted
