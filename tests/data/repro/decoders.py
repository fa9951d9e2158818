"""Small decoders of the shapes real code has, correct and with one bug each, for `kvtool repro --target` tests.

Written for kvtool after the public designs they imitate (sizes tiny: d_model 64, 4 heads, 2 layers):

- gpt-fast (pytorch-labs/gpt-fast ``model.py``): ``KVCache`` is an ``nn.Module`` with preallocated
  ``k_cache``/``v_cache`` buffers ``[B, H, max_seq, D]`` written by ``index_copy_`` at ``input_pos``; the
  attention masks with ``causal_mask[input_pos]`` over all ``max_seq`` positions.
- litgpt (Lightning-AI/litgpt ``model.py``): one ``KVCache`` module per block, ``forward(idx, input_pos,
  input_pos_maxp1)``; attention uses the first ``input_pos_maxp1`` cache positions; without ``input_pos`` the
  model takes the training path (no cache).
- Hugging Face adapters over ``LlamaForCausalLM`` (random weights from ``hf_llama/config.json``).

Each factory is ``name(bug=None)``-free: one module-level function per variant (kvtool names a factory).
The token-id protocol: ``kvtool_protocol = "tokens"``, ``forward(ids, positions, cache)``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, D_MODEL, N_HEADS, N_LAYERS, MAX_SEQ = 128, 64, 4, 2, 32
HEAD_DIM = D_MODEL // N_HEADS
HERE = Path(__file__).resolve().parent


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, H, S, D] at positions [S] (or [B, S])."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32, device=x.device) / half))
    angles = positions.to(torch.float32)[..., None] * freqs  # [S, half] or [B, S, half]
    if angles.dim() == 3:
        angles = angles[:, None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attend(q, k, v, allowed):
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL)
        self.wqkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.wo = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 2 * D_MODEL), nn.GELU(), nn.Linear(2 * D_MODEL, D_MODEL))

    def qkv(self, x):
        b, s, _ = x.shape
        q, k, v = self.wqkv(self.norm(x)).split(D_MODEL, dim=-1)
        return [t.view(b, s, N_HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v)]

    def finish(self, x, y):
        b, _, s, _ = y.shape
        x = x + self.wo(y.transpose(1, 2).reshape(b, s, D_MODEL))
        return x + self.mlp(x)


class Decoder(nn.Module):
    """Weights shared by every style: embedding, blocks, head."""

    kvtool_protocol = "tokens"
    vocab_size = VOCAB

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)


# --- gpt-fast style ------------------------------------------------------------------------------------


class KVCache(nn.Module):
    """gpt-fast's KVCache: preallocated buffers, index_copy_ at input_pos."""

    def __init__(self, batch: int = 1, max_seq: int = MAX_SEQ, dtype=torch.float32):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(batch, N_HEADS, max_seq, HEAD_DIM, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(batch, N_HEADS, max_seq, HEAD_DIM, dtype=dtype))

    def update(self, input_pos, k, v):
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        return self.k_cache, self.v_cache


class GptFast(Decoder):
    """forward(ids, positions, cache): cache is the request's list of KVCache modules (one per layer)."""

    bug: str | None = None

    def __init__(self):
        super().__init__()
        self.register_buffer("causal_mask", torch.tril(torch.ones(MAX_SEQ, MAX_SEQ, dtype=torch.bool)))
        self.memo: dict[int, tuple] = {}

    def kvtool_begin_request(self, batch_size):
        dtype = self.head.weight.dtype
        if self.bug == "shared-layer-cache":
            return [KVCache(batch_size, dtype=dtype)] * N_LAYERS  # every layer the same cache object
        return [KVCache(batch_size, dtype=dtype) for _ in range(N_LAYERS)]

    def mask(self, input_pos):
        if self.bug == "mask-ignores-offset":  # built for the new tokens as if they started at 0
            return self.causal_mask[: input_pos.shape[0]]
        return self.causal_mask[input_pos]

    def forward(self, ids, positions, cache):
        input_pos = positions[0]
        if self.bug == "memo-by-prompt-length" and ids.shape[1] > 1 and ids.shape[1] in self.memo:
            logits, kvs = self.memo[ids.shape[1]]  # "the same prompt length: reuse the prefill"
            for c, (k, v) in zip(cache, kvs):
                c.k_cache.copy_(k)
                c.v_cache.copy_(v)
            return logits.clone()
        x = self.embed(ids)
        for i, (block, c) in enumerate(zip(self.blocks, cache)):
            q, k, v = block.qkv(x)
            rope_pos = torch.arange(ids.shape[1]) if self.bug == "rope-restart" else input_pos
            q, k = rope(q, rope_pos), rope(k, rope_pos)
            keys, values = c.update(input_pos, k, v)
            if self.bug == "layer-index":  # reads the previous layer's cache (layer 0: the last one)
                keys, values = cache[i - 1].k_cache, cache[i - 1].v_cache
            x = block.finish(x, attend(q, keys, values, self.mask(input_pos)))
        logits = self.head(x)
        if self.bug == "memo-by-prompt-length" and ids.shape[1] > 1:
            self.memo[ids.shape[1]] = (logits.clone(), [(c.k_cache.clone(), c.v_cache.clone()) for c in cache])
        return logits


class NextPosition(GptFast):
    """The adapter keeps the next position in the cache (a dict) instead of taking kvtool's positions."""

    def kvtool_begin_request(self, batch_size):
        return {"layers": super().kvtool_begin_request(batch_size), "written": 0}

    def forward(self, ids, positions, cache):
        n = ids.shape[1]
        start = cache["written"]
        if self.bug == "next-pos-last-index" and start:
            start -= 1  # "the next position is the last index written"
        pos = torch.arange(start, start + n).expand(ids.shape[0], -1)
        cache["written"] += n
        return super().forward(ids, pos, cache["layers"])


class HeadViewCache(nn.Module):
    """Per-head caches as views: correct, one [B, H, S, D] buffer and a view per head; buggy, every head a
    view of one [B, S, D] buffer (the article's opening bug)."""

    def __init__(self, batch: int, shared: bool, dtype):
        super().__init__()
        if shared:
            buf = torch.zeros(batch, MAX_SEQ, HEAD_DIM, dtype=dtype)
            self.k_heads = [buf.view(batch, MAX_SEQ, HEAD_DIM) for _ in range(N_HEADS)]
            vbuf = torch.zeros(batch, MAX_SEQ, HEAD_DIM, dtype=dtype)
            self.v_heads = [vbuf.view(batch, MAX_SEQ, HEAD_DIM) for _ in range(N_HEADS)]
        else:
            kbuf, vbuf = torch.zeros(2, batch, N_HEADS, MAX_SEQ, HEAD_DIM, dtype=dtype)
            self.k_heads = [kbuf[:, h] for h in range(N_HEADS)]
            self.v_heads = [vbuf[:, h] for h in range(N_HEADS)]

    def update(self, input_pos, k, v):
        for h in range(N_HEADS):
            self.k_heads[h].index_copy_(1, input_pos, k[:, h])
            self.v_heads[h].index_copy_(1, input_pos, v[:, h])
        return torch.stack(self.k_heads, dim=1), torch.stack(self.v_heads, dim=1)


class HeadViews(GptFast):
    def kvtool_begin_request(self, batch_size):
        dtype = self.head.weight.dtype
        return [HeadViewCache(batch_size, self.bug == "head-view-inplace", dtype) for _ in range(N_LAYERS)]


class ExpandBatch(GptFast):
    """Batch caches made with expand ("one zero buffer for the whole batch"), each row written through its
    own view: all rows are one memory."""

    def kvtool_begin_request(self, batch_size):
        caches = super().kvtool_begin_request(batch_size)
        if self.bug == "batch-expand-alias":
            for c in caches:
                zeros = torch.zeros(1, N_HEADS, MAX_SEQ, HEAD_DIM, dtype=self.head.weight.dtype)
                c.k_cache = zeros.expand(batch_size, -1, -1, -1)
                c.v_cache = zeros.clone().expand(batch_size, -1, -1, -1)
                c.update = _row_update(c)
        return caches


def _row_update(c):
    def update(input_pos, k, v):
        for row in range(k.shape[0]):
            c.k_cache[row].index_copy_(1, input_pos, k[row])
            c.v_cache[row].index_copy_(1, input_pos, v[row])
        return c.k_cache, c.v_cache

    return update


class SlotPool(GptFast):
    """gpt-fast's one cache for max_batch_size rows, used as a pool of slots: a request gets a row on begin
    and gives it back on end.  The buggy pool hands out slots round robin over 2 rows, live or not."""

    POOL = 8

    def __init__(self):
        super().__init__()
        self.pool = nn.ModuleList(KVCache(self.POOL) for _ in range(N_LAYERS))  # moved by .to() with the model
        self.free = list(range(self.POOL))
        self.handed = 0

    def kvtool_begin_request(self, batch_size):
        if self.bug == "prealloc-slice":
            slot = self.handed % 2
            self.handed += 1
        else:
            slot = self.free.pop(0)
        views = []
        for c in self.pool:
            view = KVCache.__new__(KVCache)
            nn.Module.__init__(view)
            view.k_cache = c.k_cache[slot : slot + batch_size]
            view.v_cache = c.v_cache[slot : slot + batch_size]
            views.append(view)
        for v in views:
            v.k_cache.zero_()
            v.v_cache.zero_()
        return {"slot": slot, "layers": views}

    def kvtool_end_request(self, cache):
        if self.bug != "prealloc-slice":
            self.free.append(cache["slot"])

    def forward(self, ids, positions, cache):
        return super().forward(ids, positions, cache["layers"])


class InstanceCache(GptFast):
    """gpt-fast as written: setup_caches once, the caches live on the model; every request uses them."""

    def __init__(self):
        super().__init__()
        self.caches = nn.ModuleList(KVCache(1) for _ in range(N_LAYERS))

    def kvtool_begin_request(self, batch_size):
        return list(self.caches)


class ReportingCache:
    """A cache that says what it is, through kvtool's two optional methods."""

    def __init__(self, layers):
        self.layers, self.length = layers, 0

    def kvtool_tensors(self):
        return {f"L{i}.{name}": t for i, c in enumerate(self.layers) for name, t in (("k", c.k_cache), ("v", c.v_cache))}

    def kvtool_valid_length(self):
        return self.length


class Reporting(GptFast):
    """Correct: the length advances by every token.  Buggy: only prompts advance it (decode steps forgotten)."""

    def kvtool_begin_request(self, batch_size):
        return ReportingCache(super().kvtool_begin_request(batch_size))

    def forward(self, ids, positions, cache):
        out = super().forward(ids, positions, cache.layers)
        if self.bug != "length-not-advanced" or ids.shape[1] > 1:
            cache.length += ids.shape[1]
        return out


# --- litgpt style --------------------------------------------------------------------------------------


class LitKVCache(nn.Module):
    def __init__(self, batch: int = 1, dtype=torch.float32):
        super().__init__()
        self.register_buffer("k", torch.zeros(batch, N_HEADS, MAX_SEQ, HEAD_DIM, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(batch, N_HEADS, MAX_SEQ, HEAD_DIM, dtype=dtype), persistent=False)

    def forward(self, input_pos, k, v):
        return self.k.index_copy_(2, input_pos, k), self.v.index_copy_(2, input_pos, v)


class LitGpt(Decoder):
    """forward(idx, input_pos, input_pos_maxp1) as in litgpt, behind a token-protocol adapter."""

    bug: str | None = None

    def __init__(self):
        super().__init__()
        self.register_buffer("mask_cache", torch.tril(torch.ones(MAX_SEQ, MAX_SEQ, dtype=torch.bool)))

    def kvtool_begin_request(self, batch_size):
        return [LitKVCache(batch_size, self.head.weight.dtype) for _ in range(N_LAYERS)]

    def model(self, idx, cache, input_pos=None, input_pos_maxp1=None):
        x = self.embed(idx)
        n = idx.shape[1]
        for block, kv in zip(self.blocks, cache):
            q, k, v = block.qkv(x)
            pos = torch.arange(n) if input_pos is None else input_pos
            q, k = rope(q, pos), rope(k, pos)
            if input_pos is None:  # training path: no cache
                allowed = self.mask_cache[:n, :n]
            else:
                k, v = kv(input_pos, k, v)
                allowed = self.mask_cache.index_select(0, input_pos)
                if input_pos_maxp1 is not None:
                    k, v, allowed = k[..., :input_pos_maxp1, :], v[..., :input_pos_maxp1, :], allowed[:, :input_pos_maxp1]
            x = block.finish(x, attend(q, k, v, allowed))
        return self.head(x)

    def forward(self, ids, positions, cache):
        input_pos = positions[0]
        if self.bug == "prompt-training-path" and ids.shape[1] > 1:
            return self.model(ids, cache)  # the prompt never reaches the cache
        maxp1 = int(input_pos.max()) + (0 if self.bug == "maxp1-without-plus-one" else 1)
        return self.model(ids, cache, input_pos, maxp1)


# --- Hugging Face --------------------------------------------------------------------------------------


def _hf_llama():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(HERE / "hf_llama"))


class HfAdapter(nn.Module):
    """A thin token-protocol adapter over an HF model, as users write them: its own DynamicCache per request."""

    kvtool_protocol = "tokens"
    bug: str | None = None

    def __init__(self):
        super().__init__()
        self.lm = _hf_llama()
        self.vocab_size = self.lm.config.vocab_size

    def kvtool_begin_request(self, batch_size):
        from transformers import DynamicCache

        return DynamicCache(config=self.lm.config)

    def forward(self, ids, positions, cache):
        if self.bug == "rope-restart":
            positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        if self.bug == "prompt-training-path" and ids.shape[1] > 1:
            return self.lm(input_ids=ids, use_cache=False).logits
        return self.lm(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True).logits


# --- factories -----------------------------------------------------------------------------------------


def _factory(cls, bug=None):
    def make():
        torch.manual_seed(0)
        module = cls()
        module.bug = bug
        return module

    make.__name__ = f"{cls.__name__}_{bug or 'correct'}"
    return make


gptfast = _factory(GptFast)
gptfast_shared_layer_cache = _factory(GptFast, "shared-layer-cache")
gptfast_mask_ignores_offset = _factory(GptFast, "mask-ignores-offset")
gptfast_rope_restart = _factory(GptFast, "rope-restart")
gptfast_layer_index = _factory(GptFast, "layer-index")
gptfast_memo_by_prompt_length = _factory(GptFast, "memo-by-prompt-length")
nextpos = _factory(NextPosition)
nextpos_last_index = _factory(NextPosition, "next-pos-last-index")
headviews = _factory(HeadViews)
headviews_inplace = _factory(HeadViews, "head-view-inplace")
expand_batch = _factory(ExpandBatch)
expand_batch_alias = _factory(ExpandBatch, "batch-expand-alias")
slot_pool = _factory(SlotPool)
slot_pool_overlap = _factory(SlotPool, "prealloc-slice")
instance_cache = _factory(InstanceCache)
reporting = _factory(Reporting)
reporting_stale_length = _factory(Reporting, "length-not-advanced")
litgpt = _factory(LitGpt)
litgpt_maxp1 = _factory(LitGpt, "maxp1-without-plus-one")
litgpt_training_path = _factory(LitGpt, "prompt-training-path")
hf_adapter = _factory(HfAdapter)
hf_adapter_rope_restart = _factory(HfAdapter, "rope-restart")
hf_adapter_training_path = _factory(HfAdapter, "prompt-training-path")


def hf_llama():
    """The bare transformers model, as a user tries first."""
    return _hf_llama()


def hf_llama_rope_restart():
    """A PreTrainedModel whose forward restarts the rotary positions at 0 on every call (driven natively)."""
    from transformers import LlamaForCausalLM

    class RestartingLlama(LlamaForCausalLM):
        def forward(self, input_ids=None, position_ids=None, **kwargs):
            position_ids = torch.arange(input_ids.shape[1]).expand(input_ids.shape[0], -1)
            return super().forward(input_ids=input_ids, position_ids=position_ids, **kwargs)

    torch.manual_seed(0)
    return RestartingLlama(_hf_llama().config)


def gptfast_on(device="cpu", dtype=torch.float32):
    """A factory taking device and dtype, as gpt-fast's loaders do."""
    torch.manual_seed(0)
    return GptFast().to(device=device, dtype=dtype)


def hf_llama_ignores_padding():
    """A PreTrainedModel whose forward drops the attention_mask (a padding-mask bug): alone it is right, in a
    left-padded batch the shorter prompts attend to the pad tokens."""
    from transformers import LlamaForCausalLM

    class PaddingBlindLlama(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            return super().forward(input_ids=input_ids, **kwargs)

    torch.manual_seed(0)
    return PaddingBlindLlama(_hf_llama().config)
