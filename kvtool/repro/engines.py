"""The callers of the repro modules: tiny language models and the "servers" that hold their caches.

An *engine* is one model instance serving several requests, as an inference server would: each call to
``step`` runs one forward for a group of requests (their prompts, or one new token each) and returns
each request's logits.  Whether the requests' caches stay apart is up to the implementation: that is
what the checks in ``kvtool.repro.checks`` find out.  A fresh engine is a fresh model (same weights,
no state).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kvtool.repro import models as m

D_MODEL = 32
N_HEADS = 4
N_LAYERS = 2  # layer-index only; the other scenarios have one attention layer
VOCAB = 64
CAPACITY = 32  # tokens per request a preallocated cache holds (prompt + generated)


@dataclass(frozen=True)
class CacheEntry:
    """A cache tensor a request holds, what it should look like, and which dimension is the head."""

    label: str  # "L0 k"
    tensor: torch.Tensor
    expected_shape: tuple[int, ...]
    head_dim: int | None  # split into per-head views along this dimension (None: already one head)


class TinyLM(nn.Module):
    """Token embedding -> the scenario's attention core -> vocabulary projection (no residual, no MLP,
    so whatever the attention reads shows in the logits)."""

    def __init__(self, core: nn.Module, d_model: int = D_MODEL, vocab: int = VOCAB):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.core: Any = core  # the scenario's attention module: each has its own cache interface
        self.head = nn.Linear(d_model, vocab)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens)[None]  # [1, S, D]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


class Engine:
    """Base: per-request bookkeeping of tokens seen."""

    def __init__(self, lm: TinyLM):
        self.lm = lm
        self.seen: dict[int, int] = {}

    def step(self, group: list[tuple[int, torch.Tensor]]) -> list[torch.Tensor]:
        raise NotImplementedError

    def cache_entries(self, rid: int) -> list[CacheEntry]:
        raise NotImplementedError

    def _count(self, rid: int, n: int) -> None:
        self.seen[rid] = self.seen.get(rid, 0) + n

    def _kv_shape(self, rid: int) -> tuple[int, ...]:
        core = self.lm.core  # a LayerStack or one attention module: both carry n_heads and d_model
        heads, d_model = int(core.n_heads), int(core.d_model)
        return (1, heads, self.seen[rid], d_model // heads)


def _kv_entries(cache, expected: tuple[int, ...]) -> list[CacheEntry]:
    """Entries of a (k, v) cache, or of a list of per-layer (k, v) caches; tensors are [1, H, S, d]."""
    layers = cache if isinstance(cache, list) else [cache]
    entries = []
    for i, (k, v) in enumerate(layers):
        entries.append(CacheEntry(f"L{i} k", k, expected, 1))
        entries.append(CacheEntry(f"L{i} v", v, expected, 1))
    return entries


class SharedInstanceEngine(Engine):
    """The article's usage of ``MultiHeadAttentionWithCache``: ``model(x, use_cache=True)`` per request."""

    def step(self, group):
        outs = []
        for rid, tokens in group:
            h = self.lm.core(self.lm.embed_tokens(tokens), use_cache=True)
            self._count(rid, len(tokens))
            outs.append(self.lm.logits(h)[0])
        return outs

    def cache_entries(self, rid):
        return _kv_entries(self.lm.core.shared_cache, self._kv_shape(rid))


class CallerCacheEngine(Engine):
    """``out, cache = model(x, cache)``: the caller keeps one cache per request."""

    def __init__(self, lm):
        super().__init__(lm)
        self.caches: dict[int, object] = {}

    def step(self, group):
        outs = []
        for rid, tokens in group:
            h, self.caches[rid] = self.lm.core(self.lm.embed_tokens(tokens), self.caches.get(rid))
            self._count(rid, len(tokens))
            outs.append(self.lm.logits(h)[0])
        return outs

    def cache_entries(self, rid):
        return _kv_entries(self.caches[rid], self._kv_shape(rid))


class HeadViewEngine(Engine):
    """Per-request preallocated per-head caches (``HeadViewCacheAttention.new_cache``)."""

    def __init__(self, lm):
        super().__init__(lm)
        self.caches: dict[int, dict] = {}

    def step(self, group):
        outs = []
        for rid, tokens in group:
            x = self.lm.embed_tokens(tokens)
            if rid not in self.caches:
                self.caches[rid] = self.lm.core.new_cache(CAPACITY, x.device, x.dtype)
            h, _ = self.lm.core(x, self.caches[rid])
            self._count(rid, len(tokens))
            outs.append(self.lm.logits(h)[0])
        return outs

    def cache_entries(self, rid):
        cache, n = self.caches[rid], self.seen[rid]
        d_head = self.lm.core.d_head
        return [
            CacheEntry(f"L0 {kind} h{h}", cache[kind][h][:n], (n, d_head), None)
            for kind in ("k", "v")
            for h in range(self.lm.core.n_heads)
        ]


class ForkEngine(Engine):
    """Parallel sampling: the first step prefills one prompt shared by the whole group and forks it."""

    def __init__(self, lm):
        super().__init__(lm)
        self.cache: dict | None = None
        self.rows: dict[int, int] = {}

    def step(self, group):
        core = self.lm.core
        if self.cache is None:
            prompt = group[0][1]
            if any(not torch.equal(tokens, prompt) for _, tokens in group):
                raise ValueError("a fork starts from one prompt shared by the whole group")
            h, cache, _ = core.prefill(self.lm.embed_tokens(prompt), CAPACITY)
            self.cache = core.fork(cache, len(group))
            logits = self.lm.logits(h)[0]
            for row, (rid, tokens) in enumerate(group):
                self.rows[rid] = row
                self._count(rid, len(tokens))
            return [logits for _ in group]
        outs = []
        for rid, tokens in group:
            h = core.decode_row(self.lm.embed_tokens(tokens), self.cache, self.rows[rid], self.seen[rid])
            self._count(rid, 1)
            outs.append(self.lm.logits(h)[0])
        return outs

    def cache_entries(self, rid):
        row, n = self.rows[rid], self.seen[rid]
        expected = self._kv_shape(rid)[1:]
        return [CacheEntry(f"L0 {kind}", self.cache[kind][row, :, :n], expected, 0) for kind in ("k", "v")]


class PaddedBatchEngine(Engine):
    """Continuous batching: each step left-pads the group's new tokens and its caches to one batch."""

    def __init__(self, lm):
        super().__init__(lm)
        self.caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def step(self, group):
        core = self.lm.core
        xs = [self.lm.embed_tokens(tokens)[0] for _, tokens in group]
        sn = max(len(x) for x in xs)
        pasts = [self.caches.get(rid) for rid, _ in group]
        sp = max((p[0].shape[2] for p in pasts if p is not None), default=0)
        like = xs[0]
        x = like.new_zeros(len(group), sn, like.shape[-1])
        new_valid = torch.zeros(len(group), sn, dtype=torch.bool, device=like.device)
        kv_shape = (len(group), core.n_heads, sp, core.d_head)
        past_k, past_v = like.new_zeros(kv_shape), like.new_zeros(kv_shape)
        past_valid = torch.zeros(len(group), sp, dtype=torch.bool, device=like.device)
        for b, (xb, past) in enumerate(zip(xs, pasts)):
            x[b, sn - len(xb) :] = xb
            new_valid[b, sn - len(xb) :] = True
            if past is not None:
                n = past[0].shape[2]
                past_k[b, :, sp - n :], past_v[b, :, sp - n :] = past[0][0], past[1][0]
                past_valid[b, sp - n :] = True
        h, k, v = core(x, new_valid, past_k if sp else None, past_v if sp else None, past_valid)
        outs = []
        for b, ((rid, tokens), past) in enumerate(zip(group, pasts)):
            n = len(tokens)
            kb, vb = k[b : b + 1, :, sn - n :], v[b : b + 1, :, sn - n :]
            if past is not None:
                kb, vb = torch.cat([past[0], kb], dim=2), torch.cat([past[1], vb], dim=2)
            self.caches[rid] = (kb, vb)
            self._count(rid, n)
            outs.append(self.lm.logits(h[b, sn - n :]))
        return outs

    def cache_entries(self, rid):
        return _kv_entries(self.caches[rid], self._kv_shape(rid))


class SlotPoolEngine(Engine):
    """One preallocated KV pool [H, pool_tokens, d] for all requests; each request gets a slot at arrival.

    ``packed=True`` is the prealloc-slice bug: the allocator advances by the prompt length, forgetting the
    tokens the request will generate, so its slice runs into the next request's.  ``packed=False``
    reserves ``CAPACITY`` tokens per slot.
    """

    POOL_SLOTS = 4

    def __init__(self, lm, packed: bool):
        super().__init__(lm)
        self.packed = packed
        core = lm.core
        p = next(core.parameters())
        shape = (core.n_heads, CAPACITY * self.POOL_SLOTS, core.d_head)
        self.pool_k = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.pool_v = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.next_free = 0
        self.starts: dict[int, int] = {}

    def step(self, group):
        outs = []
        for rid, tokens in group:
            if rid not in self.starts:
                self.starts[rid] = self.next_free
                self.next_free += len(tokens) if self.packed else CAPACITY
            h = self.lm.core(
                self.lm.embed_tokens(tokens), self.pool_k, self.pool_v, self.starts[rid], self.seen.get(rid, 0)
            )
            self._count(rid, len(tokens))
            outs.append(self.lm.logits(h)[0])
        return outs

    def cache_entries(self, rid):
        start, n = self.starts[rid], self.seen[rid]
        expected = self._kv_shape(rid)[1:]
        return [
            CacheEntry("L0 k", self.pool_k[:, start : start + n], expected, 0),
            CacheEntry("L0 v", self.pool_v[:, start : start + n], expected, 0),
        ]


@dataclass
class Implementation:
    """One side (buggy or fixed) of a scenario: a model and how to start a fresh engine on it."""

    kind: str
    lm: TinyLM
    make_engine: Callable[[TinyLM], Engine]
    stateful: bool  # the module itself holds request state: a fresh engine needs a fresh copy of it

    def new_engine(self) -> Engine:
        lm = copy.deepcopy(self.lm) if self.stateful else self.lm
        return self.make_engine(lm)

    def reference(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [T, vocab] of the request alone on a fresh model, all tokens in one forward."""
        return self.new_engine().step([(0, tokens)])[0]


@dataclass(frozen=True)
class _Recipe:
    """How to build one scenario: its two attention cores and the engines that drive them."""

    buggy_core: Callable[[], nn.Module]
    fixed_core: Callable[[], nn.Module]
    buggy_engine: Callable[[TinyLM], Engine]
    fixed_engine: Callable[[TinyLM], Engine]
    buggy_stateful: bool = False  # the buggy module keeps request state on itself


def _recipe(name: str) -> _Recipe:
    d, h = D_MODEL, N_HEADS
    recipes = {
        "shared-instance-cache": _Recipe(
            lambda: m.MultiHeadAttentionWithCache(d, h),
            lambda: m.CorrectMHAWithCache(d, h),
            SharedInstanceEngine,
            CallerCacheEngine,
            buggy_stateful=True,
        ),
        "head-view-inplace": _Recipe(
            lambda: m.HeadViewCacheAttention(d, h, shared_buffer=True),
            lambda: m.HeadViewCacheAttention(d, h, shared_buffer=False),
            HeadViewEngine,
            HeadViewEngine,
        ),
        "batch-expand-alias": _Recipe(
            lambda: m.ForkedCacheAttention(d, h, fork="expand"),
            lambda: m.ForkedCacheAttention(d, h, fork="repeat"),
            ForkEngine,
            ForkEngine,
        ),
        "layer-index": _Recipe(
            lambda: m.LayerStack(d, h, N_LAYERS, off_by_one=True),
            lambda: m.LayerStack(d, h, N_LAYERS, off_by_one=False),
            CallerCacheEngine,
            CallerCacheEngine,
        ),
        "padding-mask": _Recipe(
            lambda: m.PaddedBatchAttention(d, h, mask_cache=False),
            lambda: m.PaddedBatchAttention(d, h, mask_cache=True),
            PaddedBatchEngine,
            PaddedBatchEngine,
        ),
        "rope-offset": _Recipe(
            lambda: m.RopeAttention(d, h, mode="restart"),
            lambda: m.RopeAttention(d, h, mode="correct"),
            CallerCacheEngine,
            CallerCacheEngine,
        ),
        "prealloc-slice": _Recipe(
            lambda: m.SlotPoolAttention(d, h),
            lambda: m.SlotPoolAttention(d, h),
            lambda lm: SlotPoolEngine(lm, packed=True),
            lambda lm: SlotPoolEngine(lm, packed=False),
        ),
    }
    return recipes[name]


def init_weights(module: nn.Module, generator: torch.Generator) -> None:
    """Seeded initialisation independent of torch's global RNG: U(-1/sqrt(fan_in), +) for linear
    layers (torch's default bound), N(0, 1) for embeddings."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "embed" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
                bound = fan_in**-0.5
                p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)


def build_pair(name: str, seed: int, dtype: torch.dtype, device: torch.device, rope_mode: str | None = None):
    """(buggy, fixed) implementations of scenario ``name`` with identical seeded weights.

    ``rope_mode`` picks the rope-offset bug ('restart', default, or 'unrotated').
    """
    recipe = _recipe(name)
    buggy_core, fixed_core = recipe.buggy_core(), recipe.fixed_core()
    if rope_mode is not None and name == "rope-offset":
        buggy_core = m.RopeAttention(D_MODEL, N_HEADS, rope_mode)
    generator = torch.Generator().manual_seed(seed)
    buggy_lm, fixed_lm = TinyLM(buggy_core), TinyLM(fixed_core)
    init_weights(buggy_lm, generator)
    fixed_lm.load_state_dict(buggy_lm.state_dict())
    for lm in (buggy_lm, fixed_lm):
        lm.to(device=device, dtype=dtype).eval()
    return (
        Implementation("buggy", buggy_lm, recipe.buggy_engine, recipe.buggy_stateful),
        Implementation("fixed", fixed_lm, recipe.fixed_engine, False),
    )
