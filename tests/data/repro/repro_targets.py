"""Targets for `kvtool repro --target` tests: one correct module and subtle bugs that are NOT built-in scenarios.

Imported as ``repro_targets:<factory>`` with tests/data/repro on sys.path.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

D_MODEL = 16
N_HEADS = 2


class Attention(nn.Module):
    """Correct: the caller's cache in, a new (k, v) out, built with torch.cat."""

    def __init__(self, d_model: int = D_MODEL, n_heads: int = N_HEADS):
        super().__init__()
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def project(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=-1)
        return [t.view(b, s, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, v)]

    def attend(self, q, k, v):
        s, total = q.shape[2], k.shape[2]
        allowed = torch.arange(total)[None, :] <= torch.arange(total - s, total)[:, None]
        scores = (q @ k.transpose(-2, -1) / math.sqrt(self.d_head)).masked_fill(~allowed, float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        b = q.shape[0]
        return self.out(out.transpose(1, 2).reshape(b, s, self.d_model))

    def forward(self, x, cache=None):
        q, k, v = self.project(x)
        if cache is not None:
            k = torch.cat([cache["k"], k], dim=2)
            v = torch.cat([cache["v"], v], dim=2)
        return self.attend(q, k, v), {"k": k, "v": v, "layers": [k.shape[2]]}


# A module-level scratch buffer "to avoid an allocation per step": every request's cache is a view of it.
_SCRATCH = torch.zeros(2, 1, N_HEADS, 64, D_MODEL // N_HEADS)


class ScratchAliasAttention(Attention):
    """Subtle bug: the concatenated K/V are copied into one module-level scratch buffer and the cache
    returned is a view of it.  One request at a time works; two live requests overwrite each other."""

    def forward(self, x, cache=None):
        q, k, v = self.project(x)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        n = k.shape[2]
        _SCRATCH[0, :, :, :n] = k
        _SCRATCH[1, :, :, :n] = v
        return self.attend(q, k, v), (_SCRATCH[0, :, :, :n], _SCRATCH[1, :, :, :n])


class TrimmedCacheAttention(Attention):
    """Subtle bug: the cache is "trimmed to the longest prompt" (8 tokens) to bound memory, so after 8
    tokens the oldest keys silently fall out.  Deterministic and isolated, but the cache is too short."""

    max_len = 8

    def forward(self, x, cache=None):
        q, k, v = self.project(x)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        out = self.attend(q, k, v)
        return out, (k[:, :, -self.max_len :], v[:, :, -self.max_len :])


class InstanceCacheAttention(Attention):
    """The article's pattern under the fixed signature: the cache argument is ignored and the module keeps
    its own, so every request continues the previous one."""

    def __init__(self):
        super().__init__()
        self.state = None

    def forward(self, x, cache=None):
        q, k, v = self.project(x)
        if self.state is not None:
            k = torch.cat([self.state[0], k], dim=2)
            v = torch.cat([self.state[1], v], dim=2)
        self.state = (k, v)
        return self.attend(q, k, v), self.state


class RaisingAttention(Attention):
    """forward raises once a cache comes back in."""

    def forward(self, x, cache=None):
        if cache is not None:
            raise RuntimeError("cache layout [B, H, S, d] not supported")
        return super().forward(x, cache)


class NanAttention(Attention):
    """Its outputs are NaN (a diverged checkpoint, a division by zero): nothing leaks, nothing can be compared."""

    def forward(self, x, cache=None):
        out, new = super().forward(x, cache)
        return out * float("nan"), new


class ScalarOutAttention(Attention):
    """Returns a flat vector instead of [batch, seq, d_model]."""

    def forward(self, x, cache=None):
        out, new = super().forward(x, cache)
        return out.flatten(), new


class TypoProtocolAttention(Attention):
    """Correct, but its protocol attribute is misspelt."""

    kvtool_protocol = "token"


class HugeAttention(Attention):
    """Claims a d_model no memory holds inputs for."""

    def __init__(self):
        super().__init__()
        self.d_model = 10**15  # more bytes of inputs than any address space holds


class DeepCacheAttention(Attention):
    """Correct, its cache wrapped in 5,000 nested lists."""

    def forward(self, x, cache=None):
        inner = cache
        while isinstance(inner, list):
            inner = inner[0]
        out, new = super().forward(x, inner)
        for _ in range(5000):
            new = [new]
        return out, new


class ChattyAttention(Attention):
    """Correct, and prints each step's cache shape and data_ptr, as the article's third habit advises."""

    def forward(self, x, cache=None):
        out, new = super().forward(x, cache)
        print(f"cache k {tuple(new['k'].shape)} data_ptr {new['k'].data_ptr():#x}")
        return out, new


class KVCache:
    """A cache object rather than a tuple or dict: kvtool must look at its attributes."""

    __slots__ = ("k", "v")

    def __init__(self, k, v):
        self.k, self.v = k, v


class ObjectCacheAttention(Attention):
    """Correct, with the cache as a ``KVCache`` object."""

    def forward(self, x, cache=None):
        out, new = super().forward(x, None if cache is None else {"k": cache.k, "v": cache.v})
        return out, KVCache(new["k"], new["v"])


_HANDLES: dict[int, dict] = {}


class HandleCacheAttention(Attention):
    """Correct outputs, but the "cache" it returns is an int handle into a module-level table."""

    def forward(self, x, cache=None):
        out, new = super().forward(x, None if cache is None else _HANDLES[cache])
        handle = len(_HANDLES)
        _HANDLES[handle] = new
        return out, handle


class NoDModel(Attention):
    def __init__(self):
        super().__init__()
        del self.d_model
        self.width = D_MODEL

    def project(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(self.width, dim=-1)
        return [t.view(b, s, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, v)]

    def attend(self, q, k, v):
        self.d_model = self.width
        try:
            return super().attend(q, k, v)
        finally:
            del self.d_model


def _seeded(cls):
    """A factory: the same seeded weights on every call."""

    def factory():
        torch.manual_seed(0)
        return cls()

    return factory


correct = _seeded(Attention)
scratch_alias = _seeded(ScratchAliasAttention)
trimmed = _seeded(TrimmedCacheAttention)
instance_cache = _seeded(InstanceCacheAttention)
raising = _seeded(RaisingAttention)
nan_outputs = _seeded(NanAttention)
scalar_out = _seeded(ScalarOutAttention)
typo_protocol = _seeded(TypoProtocolAttention)
huge = _seeded(HugeAttention)
deep_cache = _seeded(DeepCacheAttention)
object_cache = _seeded(ObjectCacheAttention)
handle_cache = _seeded(HandleCacheAttention)
no_d_model = _seeded(NoDModel)


def chatty():
    print("loading chatty attention")
    torch.manual_seed(0)
    return ChattyAttention()


def exits():
    sys.exit("no GPU found, exiting")


def not_a_module():
    return 42


NOT_CALLABLE = 3


def broken_factory():
    raise FileNotFoundError("weights.pt not found")


class CtrlCAttention(Attention):
    """Correct, but the user presses Ctrl-C during the second check (after 12 forwards: determinism
    runs request r0, 5 + 4 positions in 5 calls, twice = 10 calls)."""

    calls = 0

    def forward(self, x, cache=None):
        CtrlCAttention.calls += 1
        if CtrlCAttention.calls == 12:
            raise KeyboardInterrupt
        return super().forward(x, cache)


def ctrl_c():
    CtrlCAttention.calls = 0
    torch.manual_seed(0)
    return CtrlCAttention()
