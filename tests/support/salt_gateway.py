"""A tenant gateway in front of an OpenAI-compatible engine: it maps each API key to a ``cache_salt``.

Negative control for `kvtool vllm isolation --api-key` (tests/data/isolation/README.md): started with a map that
gives two tenants the same salt (``k1`` and ``k3`` below), it is the gateway of kvtool issue 31 that a check of
neighbouring tenants only (1-2, 2-3) passed.  Standard library only; requests without a known key are answered 401;
requests without a key pass through unchanged (the operator's own traffic, with or without a body salt); GET
/v1/models, /metrics and /version pass through.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler

from tests.support.local_http import LocalHttpServer

THIRD_TENANT_SHARES = {"k1": "tenant-salt-1", "k2": "tenant-salt-2", "k3": "tenant-salt-1"}  # the planted defect
CORRECT = {"k1": "tenant-salt-1", "k2": "tenant-salt-2", "k3": "tenant-salt-3"}


class SaltGateway(LocalHttpServer):
    def __init__(self, upstream: str, key_salts: dict[str, str], port: int = 0):
        self.upstream = upstream.rstrip("/")
        self.key_salts = key_salts
        super().__init__(self._handler(), port)

    def _handler(self):
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, method: str, data: bytes | None):
                request = urllib.request.Request(gateway.upstream + self.path, data=data, method=method)
                if data is not None:
                    request.add_header("Content-Type", "application/json")
                try:
                    with urllib.request.urlopen(request, timeout=300) as response:
                        status, body = response.status, response.read()
                        kind = response.headers.get("Content-Type", "application/json")
                except urllib.error.HTTPError as err:
                    status, body, kind = err.code, err.read(), "application/json"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._forward("GET", None)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                if self.path.startswith("/v1/completions") and key:
                    if key not in gateway.key_salts:
                        data = json.dumps({"error": {"message": "unknown API key"}}).encode()
                        self.send_response(401)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    body["cache_salt"] = gateway.key_salts[key]
                self._forward("POST", json.dumps(body).encode())

        return Handler
