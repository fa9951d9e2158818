"""A KV connector with a second tier, planted correct or planted defective, for `kvtool vllm isolation`'s tier dimension.

A real ``KVConnectorBase_V1`` subclass: vLLM 0.32's own disk-tier reference connector, ExampleConnector
(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py), with two settings of ours in
``kv_connector_extra_config``.  Load it with the engine's PYTHONPATH including this folder and

    --kv-transfer-config '{"kv_connector": "KvtoolTierConnector", "kv_connector_module_path": "kvtool_tier_connector",
                           "kv_role": "kv_both", "kv_connector_extra_config": {"shared_storage_path": DIR,
                           "kvtool_key": "salted" | "tokens", "kvtool_visible": "always" | "after-eviction"}}'

- ``kvtool_key``: ``"tokens"`` keeps ExampleConnector's key (``_generate_foldername_debug``: a hash of the aligned
  prompt token ids and the multimodal hashes, no ``cache_salt``, no LoRA); ``"salted"`` adds vLLM's own block hash
  of the last stored block (``request.block_hashes``, a chain whose first block carries the salt and whose every
  block carries the LoRA name and path: ``generate_block_hash_extra_keys`` in vllm/v1/core/kv_cache_utils.py), so
  the tier keeps apart exactly what the GPU prefix cache keeps apart: the correct connector.
- ``kvtool_visible``: ``"always"`` serves a stored prompt whenever the GPU cache misses (as ExampleConnector does);
  ``"after-eviction"`` serves it only once the GPU cache no longer holds any block of the request that stored it: a
  write-back tier, the shape of offloading tiers that keep what the GPU evicts.  With ``"tokens"`` this is the planted
  tier-specific defect: a tenant never meets another's blocks while they sit on the GPU (every check that does not
  evict passes), only after the fillers evicted them.

The worker side (``save_kv_layer``, ``start_load_kv``) is ExampleConnector's, unchanged: the extra key travels in
``ReqMeta.mm_hashes``, which ExampleConnector already hashes into the folder name.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    align_to_block_size,
)
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

KEYS = ("salted", "tokens")
VISIBLE = ("always", "after-eviction")


class KvtoolTierConnector(ExampleConnector):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.get_from_extra_config
        self._key_mode = extra("kvtool_key", "tokens")
        self._visible = extra("kvtool_visible", "always")
        if self._key_mode not in KEYS or self._visible not in VISIBLE:
            raise ValueError(f"kvtool_key must be one of {KEYS}, kvtool_visible one of {VISIBLE}")
        self._extra_keys: dict[str, list[str]] = {}  # request id -> what its key adds to the token ids
        self._owner_hashes: dict[str, list[Any]] = {}  # request id -> its GPU block hashes (group 0)
        self._folder_owner: dict[
            str, list[Any]
        ] = {}  # tier folder -> the GPU block hashes of the request that stored it
        self._gpu_pool: Any = None

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._gpu_pool = gpu_block_pool

    # what the key adds, per request (scheduler side: get_num_new_matched_tokens sees every new request first)
    def _remember(self, request: Any) -> list[str]:
        mm = [f.identifier for f in request.mm_features]
        n_blocks = align_to_block_size(len(request.prompt_token_ids or []) - 1, self._block_size) // self._block_size
        hashes = list(request.block_hashes[:n_blocks]) if n_blocks > 0 else []
        keys = list(mm)
        if self._key_mode == "salted" and hashes:
            keys.append("vllm-block-hash:" + bytes(hashes[-1]).hex())
        self._extra_keys[request.request_id] = keys
        self._owner_hashes[request.request_id] = [make_block_hash_with_group_id(h, 0) for h in hashes]
        return keys

    def _on_gpu(self, owner: list[Any]) -> bool:
        pool = self._gpu_pool
        return pool is not None and any(pool.cached_block_hash_to_block.get_one_block(h) is not None for h in owner)

    def _found_match_for_request(self, request: Any) -> bool:
        keys = self._extra_keys.get(request.request_id) or self._remember(request)
        tokens = list(request.prompt_token_ids or [])
        if not self._found_match_for_prompt(tokens, keys):
            return False
        if self._visible == "after-eviction":
            folder = self._folder(tokens, keys)
            owner = self._folder_owner.get(folder)
            return owner is not None and not self._on_gpu(owner)
        return True

    def _folder(self, tokens: list[int], keys: list[str]) -> str:
        n = align_to_block_size(len(tokens) - 1, self._block_size)
        return self._generate_foldername_debug(torch.tensor(tokens)[:n], keys, create_folder=False)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if len(request.prompt_token_ids or []) <= self._block_size:  # prompt embeddings, or no full block to store
            return 0, False
        self._remember(request)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """ExampleConnector's build_connector_meta, with this connector's key (the upstream one passes the prompt's
        multimodal hashes only)."""
        meta = ExampleConnectorMetadata()
        total_need_load = 0
        for new_req in scheduler_output.scheduled_new_reqs:
            token_ids = new_req.prompt_token_ids or []
            keys = self._extra_keys.get(new_req.req_id, [f.identifier for f in new_req.mm_features])
            if len(token_ids) <= self._block_size:  # prompt embeddings (no token ids), or no full block to store
                continue
            if new_req.req_id in self._requests_need_load:
                meta.add_request(token_ids=token_ids, block_ids=new_req.block_ids[0], block_size=self._block_size,
                                 is_store=False, mm_hashes=keys)  # fmt: skip
                total_need_load += 1
            elif not self._found_match_for_prompt(token_ids, keys):
                meta.add_request(token_ids=token_ids, block_ids=new_req.block_ids[0], block_size=self._block_size,
                                 is_store=True, mm_hashes=keys)  # fmt: skip
                self._folder_owner[self._folder(list(token_ids), keys)] = self._owner_hashes.get(new_req.req_id, [])
        cached_reqs = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached_reqs.req_ids):
            if req_id not in cached_reqs.resumed_req_ids or req_id not in self._requests_need_load:
                continue
            request = self._requests_need_load[req_id]
            total_tokens = cached_reqs.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            new_block_ids = cached_reqs.new_block_ids[i]
            assert new_block_ids is not None
            meta.add_request(token_ids=request.all_token_ids[:total_tokens], block_ids=new_block_ids[0],
                             block_size=self._block_size, is_store=False,
                             mm_hashes=self._extra_keys.get(req_id, []))  # fmt: skip
            total_need_load += 1
        assert total_need_load == len(self._requests_need_load)
        self._requests_need_load.clear()
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._extra_keys.pop(request.request_id, None)
        self._owner_hashes.pop(request.request_id, None)
        return super().request_finished(request, block_ids)
