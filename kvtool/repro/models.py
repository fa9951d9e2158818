"""The attention modules of `kvtool repro`: each KV-cache isolation bug and its fix, as real torch modules.

Written from the seed article kv-cache-isolation.txt (section 3.1 ``MultiHeadAttentionWithCache``,
section 3.3 ``CorrectMHAWithCache``, sections 2.3, 5.3, 7.1 and 7.2 for the other pitfalls).  Two
changes to the article's code, the same in buggy and fixed versions: every module applies a causal
mask offset by the cache length (the article's code has none, so its prefill attends to future
tokens and cached decoding could never equal a full forward), and d_model/n_heads are small so the
default run takes seconds.

This module imports torch at the top: only the repro code path imports it, never ``kvtool --help``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn


@functools.lru_cache(maxsize=512)
def causal_allowed(n_new: int, past_len: int, device) -> torch.Tensor:
    """Bool [n_new, past_len + n_new]: query i (at position past_len + i) may attend key j.

    Cached (the result is only read, never written), since the same few shapes recur every step."""
    q_pos = torch.arange(past_len, past_len + n_new, device=device)[:, None]
    k_pos = torch.arange(past_len + n_new, device=device)[None, :]
    return k_pos <= q_pos


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention; ``allowed`` broadcasts to [B, H, Sq, Sk].

    Masked scores get the dtype's most negative value instead of -inf, so a fully masked row
    (a padded query) is uniform rather than NaN.
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.matmul(F.softmax(scores, dim=-1), v)


class _Projections(nn.Module):
    """Q/K/V/output projections shared by every variant (same parameter names, so weights load across)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: torch.Tensor):
        """x [B, S, D] -> q, k, v each [B, H, S, d_head] (the article's view + transpose)."""
        b, s, _ = x.shape
        shape = (b, s, self.n_heads, self.d_head)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        return q, k, v

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """[B, H, S, d_head] -> [B, S, D] through the output projection."""
        b, _, s, _ = out.shape
        return self.out_proj(out.transpose(1, 2).contiguous().view(b, s, self.d_model))


# --- shared-instance-cache ---------------------------------------------------------------------


class MultiHeadAttentionWithCache(_Projections):
    """BUGGY (article 3.1): the cache lives on the module instance, so every request appends to it."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        # the bug: state on a module that every request shares
        self.shared_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        q, k, v = self.split(x)
        past = 0
        if use_cache:
            if self.shared_cache is None:
                self.shared_cache = (k, v)
            else:
                cached_k, cached_v = self.shared_cache
                past = cached_k.shape[2]
                k = torch.cat([cached_k, k], dim=2)
                v = torch.cat([cached_v, v], dim=2)
                self.shared_cache = (k, v)
        return self.merge(attend(q, k, v, causal_allowed(x.shape[1], past, x.device)))


class CorrectMHAWithCache(_Projections):
    """FIXED (article 3.3): the cache comes in as an argument and the new one goes out; torch.cat copies."""

    def forward(self, x: torch.Tensor, cache=None):
        q, k, v = self.split(x)
        past = 0
        if cache is not None:
            cached_k, cached_v = cache
            past = cached_k.shape[2]
            k = torch.cat([cached_k, k], dim=2)
            v = torch.cat([cached_v, v], dim=2)
        out = self.merge(attend(q, k, v, causal_allowed(x.shape[1], past, x.device)))
        return out, (k, v)


# --- head-view-inplace -------------------------------------------------------------------------


class HeadViewCacheAttention(_Projections):
    """Per-head caches preallocated for ``capacity`` tokens and written in place, one head at a time.

    ``shared_buffer=True`` is the bug (article 1 and 2.3): to "save memory" every head's cache is a view
    of one [capacity, d_head] buffer, so head h's in-place write overwrites head h-1's keys and every head
    later reads the last head's K/V.  ``False`` is the fix: one [H, capacity, d_head] buffer whose
    per-head views ``buf[h]`` are disjoint.
    """

    def __init__(self, d_model: int, n_heads: int, shared_buffer: bool):
        super().__init__(d_model, n_heads)
        self.shared_buffer = shared_buffer

    def new_cache(self, capacity: int, device, dtype) -> dict:
        def per_head_views():
            if self.shared_buffer:
                buf = torch.zeros(capacity, self.d_head, device=device, dtype=dtype)
                return [buf.view(capacity, self.d_head) for _ in range(self.n_heads)]
            buf = torch.zeros(self.n_heads, capacity, self.d_head, device=device, dtype=dtype)
            return [buf[h] for h in range(self.n_heads)]

        return {"k": per_head_views(), "v": per_head_views(), "len": 0}

    def forward(self, x: torch.Tensor, cache: dict):
        q, k, v = self.split(x)  # batch 1
        s = x.shape[1]
        pos = cache["len"]
        allowed = causal_allowed(s, pos, x.device)
        outs = []
        for h in range(self.n_heads):
            cache["k"][h][pos : pos + s] = k[0, h]  # in-place write into this head's cache
            cache["v"][h][pos : pos + s] = v[0, h]
            kh = cache["k"][h][: pos + s][None, None]
            vh = cache["v"][h][: pos + s][None, None]
            outs.append(attend(q[:, h : h + 1], kh, vh, allowed))
        cache["len"] = pos + s
        return self.merge(torch.cat(outs, dim=1)), cache


# --- batch-expand-alias ------------------------------------------------------------------------


class ForkedCacheAttention(_Projections):
    """Parallel sampling: one prompt prefilled at batch 1, its preallocated cache forked to n samples.

    ``fork='expand'`` is the bug (article 7.1): ``expand`` makes a stride-0 view, so every sample's row is
    the same memory and each sample's in-place write of its new token lands in all rows.
    ``fork='repeat'`` is the fix: ``repeat`` copies the rows.
    """

    def __init__(self, d_model: int, n_heads: int, fork: str):
        super().__init__(d_model, n_heads)
        self.fork_mode = fork

    def prefill(self, x: torch.Tensor, capacity: int):
        q, k, v = self.split(x)  # batch 1
        s = x.shape[1]
        shape = (1, self.n_heads, capacity, self.d_head)
        cache = {"k": x.new_zeros(shape), "v": x.new_zeros(shape)}
        cache["k"][:, :, :s] = k
        cache["v"][:, :, :s] = v
        out = self.merge(attend(q, k, v, causal_allowed(s, 0, x.device)))
        return out, cache, s

    def fork(self, cache: dict, n: int) -> dict:
        if self.fork_mode == "expand":
            return {name: t.expand(n, -1, -1, -1) for name, t in cache.items()}
        return {name: t.repeat(n, 1, 1, 1) for name, t in cache.items()}

    def decode_row(self, x: torch.Tensor, cache: dict, row: int, pos: int) -> torch.Tensor:
        """One new token (x [1, 1, D]) for sample ``row`` whose cache holds ``pos`` tokens."""
        q, k, v = self.split(x)
        cache["k"][row, :, pos] = k[0, :, 0]  # in place, into this sample's row
        cache["v"][row, :, pos] = v[0, :, 0]
        kr = cache["k"][row : row + 1, :, : pos + 1]
        vr = cache["v"][row : row + 1, :, : pos + 1]
        return self.merge(attend(q, kr, vr, causal_allowed(1, pos, x.device)))


# --- layer-index -------------------------------------------------------------------------------


class LayerStack(nn.Module):
    """A stack of ``CorrectMHAWithCache`` layers whose caches are one list, indexed by layer.

    ``off_by_one=True`` is the bug (article 2.3, "layer l reads layer l+1's cache"): layer i reads
    ``caches[i - 1]``, left over from 1-based layer numbering; Python's ``caches[-1]`` wraps silently,
    so layer 0 reads the last layer's cache and nothing raises.  The fix reads ``caches[i]``.
    """

    def __init__(self, d_model: int, n_heads: int, n_layers: int, off_by_one: bool):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.off_by_one = off_by_one
        self.layers = nn.ModuleList(CorrectMHAWithCache(d_model, n_heads) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, caches=None):
        new_caches = []
        for i, layer in enumerate(self.layers):
            past = None
            if caches is not None:
                past = caches[i - 1] if self.off_by_one else caches[i]
            x, new = layer(x, past)
            new_caches.append(new)
        return x, new_caches


# --- padding-mask ------------------------------------------------------------------------------


class PaddedBatchAttention(_Projections):
    """Requests of different lengths batched with left padding, past caches padded to the same length.

    ``mask_cache=False`` is the bug (article 4.1 and 5.3): the mask covers the padding of the new tokens
    but not the padding inside the cache, so shorter requests attend to padded (zero) cache slots.
    The fix builds the key mask over cache + new tokens.
    """

    def __init__(self, d_model: int, n_heads: int, mask_cache: bool):
        super().__init__(d_model, n_heads)
        self.mask_cache = mask_cache

    def forward(self, x, new_valid, past_k=None, past_v=None, past_valid=None):
        """x [B, Sn, D]; new_valid [B, Sn] bool; past_* [B, H, Sp, d] and [B, Sp] (or None)."""
        q, k, v = self.split(x)
        sn = x.shape[1]
        sp = 0 if past_k is None else past_k.shape[2]
        k_all = k if past_k is None else torch.cat([past_k, k], dim=2)
        v_all = v if past_v is None else torch.cat([past_v, v], dim=2)
        if sp and self.mask_cache:
            key_valid = torch.cat([past_valid, new_valid], dim=1)
        elif sp:  # the bug: every cache slot counts as a real token, padding included
            key_valid = torch.cat([torch.ones_like(past_valid), new_valid], dim=1)
        else:
            key_valid = new_valid
        allowed = causal_allowed(sn, sp, x.device)[None, None] & key_valid[:, None, None, :]
        return self.merge(attend(q, k_all, v_all, allowed)), k, v


# --- rope-offset -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _rope_tables(d: int, n_positions: int, device: torch.device, dtype: torch.dtype, base: float):
    """cos and sin [n_positions, d] of the rotate-half RoPE, computed in float64 once per size."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(device=device, dtype=dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(device=device, dtype=dtype)
    return cos, sin


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) of x [B, H, S, d] at integer ``positions`` [S]."""
    d = x.shape[-1]
    n = 64 * (int(positions.max()) // 64 + 1)  # table size rounded up, so a few sizes serve every call
    cos, sin = _rope_tables(d, n, x.device, x.dtype, base)
    cos, sin = cos[positions], sin[positions]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class RopeAttention(_Projections):
    """Attention with rotary positions and a caller-held cache (article 7.2).

    ``mode='restart'`` (the scenario's bug): positions start at 0 for every forward instead of at the
    cache length, so each new token is rotated as if it were the first.  ``mode='unrotated'`` (the other
    bug): the cache stores K before rotation, and later steps read keys that lost their positions.
    ``mode='correct'``: positions continue from the cache length and the cache holds rotated K.
    """

    def __init__(self, d_model: int, n_heads: int, mode: str):
        super().__init__(d_model, n_heads)
        self.mode = mode

    def forward(self, x: torch.Tensor, cache=None):
        q, k, v = self.split(x)
        s = x.shape[1]
        past = 0 if cache is None else cache[0].shape[2]
        start = 0 if self.mode == "restart" else past
        positions = torch.arange(start, start + s, device=x.device)
        q, k_rot = apply_rope(q, positions), apply_rope(k, positions)
        to_store = k if self.mode == "unrotated" else k_rot
        if cache is None:
            k_attend, new_k, new_v = k_rot, to_store, v
        else:
            k_attend = torch.cat([cache[0], k_rot], dim=2)
            new_k = torch.cat([cache[0], to_store], dim=2)
            new_v = v = torch.cat([cache[1], v], dim=2)
        out = self.merge(attend(q, k_attend, v, causal_allowed(s, past, x.device)))
        return out, (new_k, new_v)


# --- prealloc-slice ----------------------------------------------------------------------------


class SlotPoolAttention(_Projections):
    """Attention over a request's slice of a preallocated pool [H, pool_tokens, d_head] (article 4.3).

    The module itself is correct; the engine's slot allocator is where the bug lives (see
    ``kvtool.repro.engines.SlotPoolEngine``).
    """

    def forward(self, x: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, start: int, length: int):
        q, k, v = self.split(x)  # batch 1
        s = x.shape[1]
        pool_k[:, start + length : start + length + s] = k[0]  # slice assignment into the pool
        pool_v[:, start + length : start + length + s] = v[0]
        kr = pool_k[:, start : start + length + s][None]
        vr = pool_v[:, start : start + length + s][None]
        return self.merge(attend(q, kr, vr, causal_allowed(s, length, x.device)))
