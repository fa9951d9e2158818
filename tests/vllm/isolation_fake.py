"""A fake OpenAI-compatible server with a prefix cache, for testing the isolation run without vLLM.

It hashes prompts the way vLLM 0.32 does (vllm/v1/core/kv_cache_utils.py: a chain over full blocks, each hash
over (parent, block tokens, extra keys), extra keys = LoRA name and path, and the cache salt on the first block),
reports ``usage.prompt_tokens_details.cached_tokens`` = the longest cached chain of full blocks, capped at
prompt length - 1 and rounded down to whole blocks, and serves ``/metrics`` counters and ``/version``.
``caching=False`` keeps nothing (prefix caching off); ``drop`` names a dimension to leave out of the hash (the
negative control); ``report_cached=False`` behaves like vLLM without --enable-prompt-tokens-details
(prompt_tokens_details is null); ``refused_keys`` are answered 401 the way OpenAI's API answers a wrong key.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK = 16


class FakeVllm:
    def __init__(
        self,
        *,
        drop: frozenset[str] = frozenset(),
        report_cached: bool = True,
        adapters=("lora-a",),
        caching=True,
        salt_from_key=False,
        refused_keys: frozenset[str] = frozenset(),
    ):
        self.refused_keys = refused_keys  # keys answered 401 with OpenAI's message, which quotes the key
        self.salt_from_key = salt_from_key  # a gateway that salts each API key's requests
        self.drop = drop
        self.caching = caching  # False: prefix caching off (nothing is ever kept)
        self.report_cached = report_cached
        self.adapters = {name: f"/adapters/{name}" for name in adapters}
        self.cache: set[bytes] = set()
        self.queries = self.hits = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

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
        chain, parent = [], b""
        for i in range(len(tokens) // BLOCK):
            extra = (lora, salt if i == 0 else None, per_block[i] if per_block else None)
            parent = hashlib.sha256(repr((parent, tokens[i * BLOCK : (i + 1) * BLOCK], extra)).encode()).digest()
            chain.append(parent)
        return chain, len(tokens)

    def complete(self, body: dict) -> dict:
        chain, n = self.hashes(body)
        usable = (n - 1) // BLOCK
        hit = 0
        while hit < min(usable, len(chain)) and chain[hit] in self.cache:
            hit += 1
        if self.caching:
            self.cache.update(chain)
        self.queries += n
        self.hits += hit * BLOCK
        details = {"cached_tokens": hit * BLOCK} if self.report_cached else None
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
                    names = ["base", *fake.adapters]
                    self._send(200, {"data": [{"id": n} for n in names]})
                elif self.path == "/metrics":
                    text = (
                        f'vllm:prefix_cache_queries_total{{engine="0",model_name="base"}} {float(fake.queries)}\n'
                        f'vllm:prefix_cache_hits_total{{engine="0",model_name="base"}} {float(fake.hits)}\n'
                        f'vllm:cache_config_info{{block_size="{BLOCK}",enable_prefix_caching="True"}} 1.0\n'
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
                    self._send(200, fake.complete(body))
                elif self.path == "/v1/load_lora_adapter":
                    fake.adapters[body["lora_name"]] = body["lora_path"]
                    self._send(200, {"ok": True})
                else:
                    self._send(404, {"error": {"message": "not found"}})

        return Handler
