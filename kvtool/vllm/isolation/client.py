"""A small OpenAI-compatible client for the isolation check, on the standard library (urllib).

What it sends, per probe, to ``POST /v1/completions``: ``prompt`` as token ids (no tokenizer needed) or
``prompt_embeds`` (base64 of a ``torch.save``'d ``num_tokens x hidden_size`` tensor), ``max_tokens: 1``,
``cache_salt`` when the partition has one, the partition's adapter name as ``model``, its API key as a bearer
token, and, when KV events are captured, ``session_id`` plus ``vllm_xargs.kv_cache_report_mode = "full"`` (vLLM
then re-publishes prefix hits as ``BlockStored``, so every request publishes the hashes of all its full blocks).

What it reads: ``usage.prompt_tokens_details.cached_tokens`` (vLLM fills it with
``--enable-prompt-tokens-details``; without the flag the field is null), ``/metrics``'s
``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``, and the wall time of each request.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kvtool.core.errors import KvtoolError, UsageError
from kvtool.core.redact import redact_url, without_secrets
from kvtool.vllm.isolation.multimodal import CHAT_PATH, IMAGE_KIND, chat_body
from kvtool.vllm.isolation.plan import Plan, Probe

TOKEN_LOW, TOKEN_HIGH = 10, 1000  # random prompt token ids; every real vocabulary has at least 1,000 tokens
CACHED_TOKENS_TIP = "start vLLM with --enable-prompt-tokens-details (it fills usage.prompt_tokens_details)"
METRIC_QUERIES = "vllm:prefix_cache_queries_total"
METRIC_HITS = "vllm:prefix_cache_hits_total"
# what a KV connector (a second tier) served: vLLM 0.32 vllm/v1/metrics/loggers.py, counted only with a connector
METRIC_EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
METRIC_EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.MULTILINE)


class EndpointError(KvtoolError):
    """The endpoint answered something the check cannot use (exit 2)."""

    status: int | None = None  # the HTTP status, when the endpoint answered one
    answer: str = ""  # the endpoint's message, keys masked


@dataclasses.dataclass(frozen=True)
class Completion:
    """What one probe request returned."""

    prompt_tokens: int | None  # usage.prompt_tokens
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens
    sent_at_s: float  # time.time() just before sending
    latency_s: float  # wall time of the whole request (max_tokens=1: about the time to first token)


@dataclasses.dataclass(frozen=True)
class PrefixCounters:
    """vLLM's prefix-cache counters (tokens), summed over engines; None where /metrics lacks them."""

    queries_tokens: float | None
    hits_tokens: float | None
    # vllm:prefix_cache_queries_total per ``engine`` label (several behind a router: kvtool.vllm.isolation.routing)
    queries_by_engine: tuple[tuple[str, float], ...] = ()
    external_queries_tokens: float | None = None  # vllm:external_prefix_cache_queries (KV connector lookups)
    external_hits_tokens: float | None = None  # vllm:external_prefix_cache_hits (tokens a KV connector served)


def block_tokens(seed: int, count: int) -> list[int]:
    """The token ids of one block of a probe prompt (deterministic in the seed)."""
    rng = random.Random(seed)
    return [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(count)]


def prompt_token_ids(probe: Probe, plan: Plan) -> list[int]:
    ids: list[int] = []
    for n, seed in enumerate(probe.block_seeds):
        ids += block_tokens(seed, plan.block_size if n < len(probe.block_seeds) - 1 else plan.partial_tokens)
    return ids


def prompt_embeds_b64(probe: Probe, plan: Plan, hidden_size: int) -> str:
    """base64 of ``torch.save`` of the probe's embedding rows (float32; vLLM casts to the model's dtype)."""
    from kvtool.core.extras import require

    torch = require("torch", feature="kvtool vllm isolation's prompt-embeddings probes")

    parts = []
    for n, seed in enumerate(probe.block_seeds):
        rows = plan.block_size if n < len(probe.block_seeds) - 1 else plan.partial_tokens
        parts.append(torch.randn(rows, hidden_size, generator=torch.Generator().manual_seed(seed % 2**63)) * 0.02)
    buffer = io.BytesIO()
    torch.save(torch.cat(parts), buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _http_base_url(url: str) -> str:
    """``url`` without a trailing / or /v1, refused unless it is an http(s) URL with a host (urllib's own error
    for ``junk`` or ``http://[::1`` was a traceback) and without credentials: urllib never sends a URL's
    ``user:password@`` (it took them for part of the host name), and a refused URL is quoted with them masked."""
    try:
        parts = urllib.parse.urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number from 0 to 65535)
    except ValueError:
        valid = False
    if not valid:
        raise UsageError(
            f"--endpoint must be an http(s) URL with a host, not {redact_url(url)!r}",
            where="--endpoint",
            tip="give the server's base URL, for example http://127.0.0.1:8000",
        )
    if "@" in parts.netloc:
        raise UsageError(
            f"--endpoint {redact_url(url)!r} carries credentials, which kvtool does not send",
            where="--endpoint",
            tip="give the URL without them and the API key with --key (or KVTOOL_API_KEY): it is sent as a bearer token",
        )
    return url.rstrip("/").removesuffix("/v1")


class Client:
    """HTTP to one OpenAI-compatible server (the base URL without /v1)."""

    def __init__(self, base_url: str, *, base_model: str, timeout_s: float = 120.0, api_key: str | None = None):
        self.base_url = _http_base_url(base_url)
        self.base_model = base_model
        self.timeout_s = timeout_s
        self.api_key = api_key  # used when a partition brings none

    def _request(self, method: str, path: str, body: Any = None, api_key: str | None = None) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        key = api_key or self.api_key
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as err:
            reason = without_secrets(str(getattr(err, "reason", err)), (key,))
            raise EndpointError(
                f"cannot reach {self.base_url}: {reason}", where="--endpoint", tip="check the URL and that vLLM serves"
            ) from None

    def _quote(self, text: str, api_key: str | None = None) -> str:
        """What the server answered, for an error line: its message, with the keys this client sends masked
        (OpenAI's 401 quotes the key it refused)."""
        keys = (api_key, self.api_key)
        return without_secrets(_error_text(without_secrets(text, keys)), keys)  # masked before it is cut short

    def get_json(self, path: str) -> Any:
        status, text = self._request("GET", path)
        if status != 200:
            tip = None
            if status in (401, 403):
                tip = (
                    "give the server's API key with --key (or KVTOOL_API_KEY); tenants' keys go in --api-key TENANT=KEY"
                )
            raise EndpointError(f"GET {path} answered HTTP {status}: {self._quote(text)}", where=self.base_url, tip=tip)
        return _parse_json(text, path, (self.api_key,))

    def served_models(self) -> tuple[str, ...]:
        return tuple(str(m.get("id")) for m in self.models())

    def models(self) -> list[dict[str, Any]]:
        """/v1/models' entries (vLLM's carry ``max_model_len``)."""
        data = self.get_json("/v1/models").get("data", [])
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def metrics_fetch(self) -> tuple[int, str]:
        """The HTTP status of /metrics and its text ("" unless 200)."""
        status, text = self._request("GET", "/metrics")
        return status, (text if status == 200 else "")

    def metrics_text(self) -> str:
        """/metrics as Prometheus text ("" when the endpoint has none)."""
        return self.metrics_fetch()[1]

    def counters(self) -> PrefixCounters:
        """Prefix-cache counters from /metrics; None values where absent."""
        return parse_prefix_counters(self.metrics_text())

    def load_adapter(self, name: str, path: str, *, in_place: bool) -> None:
        body = {"lora_name": name, "lora_path": path, "load_inplace": in_place}
        status, text = self._request("POST", "/v1/load_lora_adapter", body)
        if status != 200:
            tip = None
            if status == 404:
                tip = "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (runtime adapter loading)"
            raise EndpointError(
                f"loading LoRA adapter '{name}' from {path} answered HTTP {status}: {self._quote(text)}",
                where=self.base_url,
                tip=tip,
            )

    def post(self, path: str, body: Any, api_key: str | None = None) -> tuple[int, str]:
        """POST a JSON body: the HTTP status and the answer (a refusal's message, keys masked)."""
        status, text = self._request("POST", path, body, api_key)
        return status, (text if status == 200 else self._quote(text, api_key))

    def complete(self, probe: Probe, plan: Plan, *, with_events: bool, hidden_size: int | None) -> Completion:
        body = completion_body(probe, plan, with_events=with_events, hidden_size=hidden_size, base=self.base_model)
        path = CHAT_PATH if probe.kind == IMAGE_KIND else "/v1/completions"  # images: the chat API only (vLLM 0.32)
        sent = time.time()
        start = time.perf_counter()
        status, text = self._request("POST", path, body, probe.partition.api_key)
        latency = time.perf_counter() - start
        if status != 200:
            error = EndpointError(
                f"probe {probe.index} ({probe.trial} {probe.role}, {probe.partition.label}) answered HTTP {status}: "
                f"{self._quote(text, probe.partition.api_key)}",
                where=self.base_url,
                tip=_status_tip(status, text),  # fixed texts: never quotes the answer
            )
            error.status = status
            error.answer = self._quote(text, probe.partition.api_key)
            raise error
        usage = _parse_json(text, path, (probe.partition.api_key, self.api_key)).get("usage") or {}
        details = usage.get("prompt_tokens_details")
        if not isinstance(details, dict) or not isinstance(details.get("cached_tokens"), int):
            raise EndpointError(
                "the endpoint does not report cached tokens (usage.prompt_tokens_details.cached_tokens is missing)",
                where=self.base_url,
                tip=CACHED_TOKENS_TIP,
            )
        prompt_tokens = usage.get("prompt_tokens")
        return Completion(
            prompt_tokens if isinstance(prompt_tokens, int) else None, details["cached_tokens"], sent, latency
        )


def completion_body(
    probe: Probe, plan: Plan, *, with_events: bool, hidden_size: int | None, base: str
) -> dict[str, Any]:
    """The JSON body of one probe request."""
    if probe.kind == IMAGE_KIND:
        return chat_body(probe, plan, with_events=with_events, base=base)
    body: dict[str, Any] = {"model": probe.partition.model or base, "max_tokens": 1, "temperature": 0.0}
    if probe.kind == "embeds":
        if hidden_size is None:
            raise UsageError("the embeddings dimension needs the model's hidden size", where="--hidden-size")
        body["prompt_embeds"] = prompt_embeds_b64(probe, plan, hidden_size)
    else:
        body["prompt"] = prompt_token_ids(probe, plan)
    if probe.partition.cache_salt is not None:
        body["cache_salt"] = probe.partition.cache_salt
    if with_events:
        body["session_id"] = probe.session_id
        body["vllm_xargs"] = {"kv_cache_report_mode": "full"}
    return body


def parse_prefix_counters(text: str) -> PrefixCounters:
    """Sum vLLM's prefix-cache counters over every label set (one per engine) in Prometheus text."""
    totals: dict[str, float] = {}
    by_engine: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
        if name not in (METRIC_QUERIES, METRIC_HITS, METRIC_EXTERNAL_QUERIES, METRIC_EXTERNAL_HITS):
            continue
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
        engine = _ENGINE_LABEL.search(rest) if name == METRIC_QUERIES else None
        if engine is not None:
            by_engine[engine.group(1)] = by_engine.get(engine.group(1), 0.0) + value
    return PrefixCounters(totals.get(METRIC_QUERIES), totals.get(METRIC_HITS), tuple(sorted(by_engine.items())),
                          totals.get(METRIC_EXTERNAL_QUERIES), totals.get(METRIC_EXTERNAL_HITS))  # fmt: skip


_ENGINE_LABEL = re.compile(r'\bengine="([^"]*)"')


_CACHE_INFO_LINE = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config(text: str) -> dict[str, str] | None:
    """The labels of vLLM's ``vllm:cache_config_info`` (block_size, enable_prefix_caching, num_gpu_blocks, ...)."""
    match = _CACHE_INFO_LINE.search(text)
    return dict(_LABEL.findall(match.group(1))) if match else None


def parse_block_size(text: str) -> int | None:
    """The KV block size from vLLM's ``vllm:cache_config_info`` metric (labels carry the cache config)."""
    match = _CACHE_INFO.search(text)
    return int(match.group(1)) if match else None


def _parse_json(text: str, path: str, keys: tuple[str | None, ...]) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise EndpointError(f"{path} did not answer JSON: {without_secrets(text, keys)[:120]!r}") from None


def _error_text(text: str) -> str:
    """The message of an OpenAI-style error body, or the start of the body."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else None
    return str(message if message else body)[:300]


def _status_tip(status: int, text: str) -> str | None:
    lowered = text.lower()
    if "prompt_embeds" in lowered and "enable-prompt-embeds" in lowered:
        return "start vLLM with --enable-prompt-embeds, or leave out the embeddings dimension (--dimension)"
    if status == 404 and "model" in lowered:
        return "serve the adapter (vLLM: --enable-lora --lora-modules NAME=PATH) or name a served one with --adapter"
    if status in (401, 403):
        return "give each tenant's key with --api-key TENANT=KEY"
    return None
