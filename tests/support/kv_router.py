"""A small OpenAI-compatible router in front of several engines, for `kvtool vllm isolation --endpoint` behind a
router (docs/isolation.md "Behind a router"; kvtool issue 31).  Standard library only.

What it forwards:

- ``POST /v1/completions`` to one backend, picked by ``policy``:
  ``round-robin`` (backend 0, 1, 0, ...), or ``prefix``: the SHA-256 of the prompt's first block of token ids
  modulo the number of backends, as KV-aware routers score a request by its leading block(s).  Like the scorers
  users report, it hashes the tokens only and ignores ``cache_salt``: one prompt goes to one engine whoever sends
  it, which routes but shares nothing (the engine's block hash still carries the salt).  A prompt of embeddings
  has no token ids to score: it goes by the hash of its ``model`` (one engine per model).
- ``POST /v1/load_lora_adapter`` to every backend; ``GET /v1/models``, ``/version`` from backend 0; ``/health``
  200 when every backend answers 200.
- ``GET /metrics``: every backend's metrics, one Prometheus family at a time, each sample's ``engine`` label set to
  the backend's index (vLLM labels its samples ``engine="0"``; its own data-parallel engines count 0, 1, ... the
  same way), so a client sees the engines and which one a request moved.

``defect`` plants what users report of layers in front of vLLM: ``drop-salt`` forwards the body without
``cache_salt`` (a forwarder that rebuilds requests from the OpenAI fields it knows), ``lowercase-salt`` forwards it
lower-cased (a layer that normalizes it).  ``None`` is the correct router.  The Authorization header goes through
unchanged (a tenant gateway such as tests/support/salt_gateway.py may sit in front).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler

from tests.support.local_http import LocalHttpServer

POLICIES = ("round-robin", "prefix")
DEFECTS = ("drop-salt", "lowercase-salt")
_ENGINE = re.compile(r'\bengine="[^"]*"')


def merge_metrics(texts: list[str]) -> str:
    """The backends' Prometheus texts as one: each family's HELP/TYPE once, then its samples from every backend in
    backend order, each sample labelled ``engine="<backend index>"`` (replacing the engine label it had)."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for index, text in enumerate(texts):
        family = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split()
                family = parts[2] if len(parts) > 2 else family
                headers, _ = families.setdefault(family, ([], []))
                if line not in headers:  # every backend's HELP/TYPE lines are the same: once
                    headers.append(line)
                continue
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            if not family or not name.startswith(family):
                family = name
            label = f'engine="{index}"'
            if _ENGINE.search(line):
                line = _ENGINE.sub(label, line, count=1)
            elif "{" in line.split(" ", 1)[0]:
                line = line.replace("{", "{" + label + ",", 1)
            else:
                line = f"{name}{{{label}}}{line[len(name) :]}"
            families.setdefault(family, ([], []))[1].append(line)
    out = [line for headers, samples in families.values() for line in (*headers, *samples)]
    return "\n".join(out) + "\n"


class KvRouter(LocalHttpServer):
    def __init__(self, backends: list[str], *, policy: str = "prefix", defect: str | None = None,
                 block_size: int = 32, port: int = 0):  # fmt: skip
        if policy not in POLICIES or (defect is not None and defect not in DEFECTS):
            raise ValueError(f"policy {policy!r} / defect {defect!r}")
        self.backends = [b.rstrip("/") for b in backends]
        self.policy, self.defect, self.block_size = policy, defect, block_size
        self.turn = itertools.count()
        self.lock = threading.Lock()
        self.routed: list[int] = []  # the backend of each completion, in order (for tests)
        super().__init__(self._handler(), port)

    def pick(self, body: dict) -> int:
        """The backend of one completion request."""
        if self.policy == "round-robin":
            with self.lock:
                return next(self.turn) % len(self.backends)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list):
            key = json.dumps(prompt[: self.block_size]).encode()
        elif isinstance(prompt, str):
            key = prompt[: 4 * self.block_size].encode()
        else:  # prompt embeddings: no tokens to score
            key = str(body.get("model")).encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % len(self.backends)

    def rewrite(self, body: dict) -> dict:
        """The body as forwarded (the planted defects change only cache_salt)."""
        if self.defect == "drop-salt":
            return {k: v for k, v in body.items() if k != "cache_salt"}
        if self.defect == "lowercase-salt" and isinstance(body.get("cache_salt"), str):
            return dict(body, cache_salt=body["cache_salt"].lower())
        return body

    def _handler(self):
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _call(self, base: str, method: str, data: bytes | None) -> tuple[int, bytes, str]:
                request = urllib.request.Request(base + self.path, data=data, method=method)
                if data is not None:
                    request.add_header("Content-Type", "application/json")
                if self.headers.get("Authorization"):
                    request.add_header("Authorization", self.headers["Authorization"])
                try:
                    with urllib.request.urlopen(request, timeout=300) as response:
                        kind = response.headers.get("Content-Type", "application/json")
                        return response.status, response.read(), kind
                except urllib.error.HTTPError as err:
                    return err.code, err.read(), "application/json"
                except (urllib.error.URLError, OSError) as err:
                    return (
                        502,
                        json.dumps({"error": {"message": f"backend {base}: {err}"}}).encode(),
                        "application/json",
                    )

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/metrics":
                    answers = [self._call(b, "GET", None) for b in router.backends]
                    bad = next((a for a in answers if a[0] != 200), None)
                    if bad is not None:
                        self._send(*bad)
                        return
                    text = merge_metrics([a[1].decode("utf-8", "replace") for a in answers])
                    self._send(200, text.encode(), "text/plain; version=0.0.4")
                elif self.path == "/health":
                    answers = [self._call(b, "GET", None) for b in router.backends]
                    self._send(200 if all(a[0] == 200 for a in answers) else 503, b"", "text/plain")
                else:
                    self._send(*self._call(router.backends[0], "GET", None))

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/v1/load_lora_adapter"):
                    answers = [self._call(b, "POST", raw) for b in router.backends]
                    self._send(*next((a for a in answers if a[0] != 200), answers[0]))
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, b'{"error": {"message": "not JSON"}}', "application/json")
                    return
                index = router.pick(body) if isinstance(body, dict) else 0
                with router.lock:
                    router.routed.append(index)
                forwarded = router.rewrite(body) if isinstance(body, dict) else body
                self._send(*self._call(router.backends[index], "POST", json.dumps(forwarded).encode()))

        return Handler
