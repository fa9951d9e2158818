"""A fake OpenAI-compatible server with a prefix cache, for testing the isolation run without vLLM.

It hashes prompts the way vLLM 0.32 does (vllm/v1/core/kv_cache_utils.py: a chain over full blocks, each hash
over (parent, block tokens, extra keys), extra keys = LoRA name and path, and the cache salt on the first block),
reports ``usage.prompt_tokens_details.cached_tokens`` = the longest cached chain of full blocks, capped at
prompt length - 1 and rounded down to whole blocks, and serves ``/metrics`` counters and ``/version``.
``caching=False`` keeps nothing (prefix caching off, and says so in ``vllm:cache_config_info`` as vLLM 0.32 does);
``drop`` names a dimension to leave out of the hash (the negative control); ``defects`` plants the families of
docs/isolation.md "Negative controls" (``casefold``: salts compared case-insensitively; ``salt-after:N``: the salt
ignored for prompts over N full blocks; ``adapter-shared``: the salt ignored on LoRA requests; ``evict``: the salt
ignored once the pool has evicted); ``pool_blocks`` bounds the cache (LRU, reported as ``num_gpu_blocks``);
``key_salts`` maps API keys to salts like a gateway; ``metrics=False`` answers /metrics with 404; salts are
validated as vLLM 0.32 does (non-empty, at most 128 characters: vllm/entrypoints/generate/base/protocol.py); ``report_cached=False`` behaves like vLLM without --enable-prompt-tokens-details
(prompt_tokens_details is null); ``refused_keys`` are answered 401 the way OpenAI's API answers a wrong key.
``tier`` adds a second tier behind a KV connector, shaped like vLLM 0.32's ExampleConnector
(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py): whole prompts stored under a key of their
aligned tokens, served when the GPU cache misses, counted in ``vllm:external_prefix_cache_*``; ``"salted"`` adds the
salt and the adapter to the key, ``"tokens"`` does not (ExampleConnector's ``_generate_foldername_debug``); ``tier_lazy`` makes an
entry visible only once the GPU cache has evicted its owner's blocks (a write-back tier); ``tier_keeps=False`` is a
tier that stores nothing; ``hold_blocks`` keeps more blocks than ``num_gpu_blocks`` says (fillers sized from it fall
short).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler

from tests.support.local_http import LocalHttpServer

BLOCK = 16


class FakeVllm(LocalHttpServer):
    def __init__(
        self,
        *,
        drop: frozenset[str] = frozenset(),
        report_cached: bool = True,
        adapters=("lora-a",),
        caching=True,
        salt_from_key=False,
        refused_keys: frozenset[str] = frozenset(),
        defects: frozenset[str] = frozenset(),
        pool_blocks: int = 400,
        key_salts: dict[str, str] | None = None,
        metrics: bool = True,
        max_model_len: int = 512,
        models_status: int = 200,
        tier: str | None = None,
        tier_lazy: bool = False,
        tier_keeps: bool = True,
        hold_blocks: int | None = None,
    ):
        self.hold_blocks = hold_blocks or pool_blocks  # the blocks it really keeps (more: num_gpu_blocks understates)
        self.tier = tier
        self.tier_lazy = tier_lazy
        self.tier_keeps = tier_keeps
        self.tier_store: dict[tuple, list[bytes]] = {}  # key -> the GPU chain of the request that stored it
        self.external_queries = self.external_hits = 0
        self.defects = defects
        self.pool_blocks = pool_blocks
        self.key_salts = key_salts
        self.metrics = metrics
        self.max_model_len = max_model_len
        self.models_status = models_status
        self.evictions = 0
        self.refused_keys = refused_keys  # keys answered 401 with OpenAI's message, which quotes the key
        self.salt_from_key = salt_from_key  # a gateway that salts each API key's requests
        self.drop = drop
        self.caching = caching  # False: prefix caching off (nothing is ever kept)
        self.report_cached = report_cached
        self.adapters = {name: f"/adapters/{name}" for name in adapters}
        self.cache: OrderedDict[bytes, None] = OrderedDict()  # LRU, at most pool_blocks
        self.queries = self.hits = 0
        super().__init__(self._handler())

    def hashes(self, body: dict) -> tuple[list[bytes], int]:
        if "prompt_embeds" in body:
            import torch

            rows = torch.load(io.BytesIO(base64.b64decode(body["prompt_embeds"])), weights_only=True)
            tokens = [0] * rows.shape[0]  # placeholder ids; the content enters through the extra key
            per_block = [
                hashlib.sha256(rows[i * BLOCK : (i + 1) * BLOCK].numpy().tobytes()).digest()
                for i in range(rows.shape[0] // BLOCK)
            ]
        else:
            tokens, per_block = list(body["prompt"]), []
        model = body.get("model")
        lora = None if model not in self.adapters else (model, self.adapters[model])
        if lora and "lora-path" in self.drop:
            lora = (model,)
        salt = None if "salt" in self.drop else body.get("cache_salt")
        if salt is not None and "casefold" in self.defects:
            salt = salt.casefold()
        after = [int(d.split(":")[1]) for d in self.defects if d.startswith("salt-after:")]
        if after and len(tokens) // BLOCK > after[0]:
            salt = None
        if lora and "adapter-shared" in self.defects:
            salt = None
        if "evict" in self.defects and self.evictions:
            salt = None
        chain, parent = [], b""
        for i in range(len(tokens) // BLOCK):
            extra = (lora, salt if i == 0 else None, per_block[i] if per_block else None)
            parent = hashlib.sha256(repr((parent, tokens[i * BLOCK : (i + 1) * BLOCK], extra)).encode()).digest()
            chain.append(parent)
        return chain, len(tokens)

    def tier_key(self, body: dict, usable: int) -> tuple | None:
        if "prompt" not in body or not usable:
            return None
        if self.tier == "salted":  # the salt and the adapter in the key, as vLLM's own block hash has them
            return (tuple(body["prompt"][: usable * BLOCK]), body.get("model"), body.get("cache_salt"))
        return (tuple(body["prompt"][: usable * BLOCK]),)

    def complete(self, body: dict) -> dict:
        chain, n = self.hashes(body)
        usable = (n - 1) // BLOCK
        hit = 0
        while hit < min(usable, len(chain)) and chain[hit] in self.cache:
            hit += 1
        for h in chain[:hit]:
            self.cache.move_to_end(h)
        external = 0
        if self.tier is not None and self.caching:
            key = self.tier_key(body, usable)
            if hit < usable:
                self.external_queries += n - hit * BLOCK
                owner = self.tier_store.get(key) if key else None
                if owner is not None and not (self.tier_lazy and any(h in self.cache for h in owner)):
                    external = usable - hit
            if key and key not in self.tier_store and self.tier_keeps:
                self.tier_store[key] = chain[:usable]
        self.external_hits += external * BLOCK
        if self.caching:
            for h in chain:
                self.cache[h] = None
                self.cache.move_to_end(h)
            while len(self.cache) > self.hold_blocks:
                self.cache.popitem(last=False)
                self.evictions += 1
        self.queries += n
        self.hits += hit * BLOCK
        details = {"cached_tokens": (hit + external) * BLOCK} if self.report_cached else None
        return {"usage": {"prompt_tokens": n, "completion_tokens": 1, "prompt_tokens_details": details}}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload, content_type="application/json"):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    if fake.models_status != 200:
                        self._send(fake.models_status, {"error": {"message": "Unauthorized"}})
                        return
                    names = ["base", *fake.adapters]
                    self._send(200, {"data": [{"id": n, "max_model_len": fake.max_model_len} for n in names]})
                elif self.path == "/metrics" and not fake.metrics:
                    self._send(404, {"error": {"message": "not found"}})
                elif self.path == "/metrics":
                    text = (
                        f'vllm:prefix_cache_queries_total{{engine="0",model_name="base"}} {float(fake.queries)}\n'
                        f'vllm:prefix_cache_hits_total{{engine="0",model_name="base"}} {float(fake.hits)}\n'
                        f'vllm:external_prefix_cache_queries_total{{engine="0",model_name="base"}} '
                        f"{float(fake.external_queries)}\n"
                        f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="base"}} '
                        f"{float(fake.external_hits)}\n"
                        f'vllm:cache_config_info{{block_size="{BLOCK}",enable_prefix_caching="{fake.caching}",'
                        f'num_gpu_blocks="{fake.pool_blocks}"}} 1.0\n'
                    )
                    self._send(200, text.encode(), "text/plain")
                elif self.path == "/version":
                    self._send(200, {"version": "fake"})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/completions":
                    if body.get("model") not in ("base", *fake.adapters):
                        self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                        return
                    key = self.headers.get("Authorization")
                    if key and key.removeprefix("Bearer ") in fake.refused_keys:
                        # the body OpenAI's API answers for a wrong key (it quotes the key it refused)
                        message = f"Incorrect API key provided: {key.removeprefix('Bearer ')}."
                        self._send(401, {"error": {"message": message, "type": "invalid_request_error"}})
                        return
                    if fake.salt_from_key and key:
                        body = dict(body, cache_salt=key)
                    if fake.key_salts is not None and key:
                        body = dict(body, cache_salt=fake.key_salts[key.removeprefix("Bearer ")])
                    salt = body.get("cache_salt")
                    if salt is not None and (not salt or len(salt) > 128):
                        message = "Parameter 'cache_salt' must be a non-empty string if provided."
                        self._send(400, {"error": {"message": message, "type": "BadRequestError"}})
                        return
                    self._send(200, fake.complete(body))
                elif self.path == "/v1/load_lora_adapter":
                    fake.adapters[body["lora_name"]] = body["lora_path"]
                    self._send(200, {"ok": True})
                else:
                    self._send(404, {"error": {"message": "not found"}})

        return Handler
