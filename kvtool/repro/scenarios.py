"""The catalogue of `kvtool repro` scenarios: names, one-line summaries, and each bug and fix in words.

Torch-free, so ``kvtool repro --list`` and unknown-name errors never load torch.  The modules themselves
are in ``kvtool.repro.models``, the code that drives them in ``kvtool.repro.engines``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    summary: str  # one line, for --list
    bug: str  # what the buggy version does (README: two lines per scenario, this is the first)
    fix: str  # what the fixed version does differently
    schedule: str  # how requests may be grouped per forward: "single", "batch" (any subset), "fork"


SCENARIOS: tuple[ScenarioInfo, ...] = (
    ScenarioInfo(
        "shared-instance-cache",
        "the article's MultiHeadAttentionWithCache keeps the KV cache on the module instance",
        "self.shared_cache is module state: every request appends its K/V to the previous requests' cache.",
        "CorrectMHAWithCache takes the cache as an argument and returns the new one; the caller owns it.",
        "single",
    ),
    ScenarioInfo(
        "head-view-inplace",
        "per-head caches are views of one shared buffer, written in place",
        "every head's cache is a view of one [S, d_head] buffer, so each head's write overwrites the others.",
        "one [H, S, d_head] buffer whose per-head views buf[h] are disjoint.",
        "single",
    ),
    ScenarioInfo(
        "batch-expand-alias",
        "a [1,H,S,d] prompt cache expanded to the batch: all samples write the same memory",
        "expand() gives a stride-0 view, so every sample's new token is written into all samples' rows.",
        "repeat() (or clone()) copies the prompt cache, one row per sample.",
        "fork",
    ),
    ScenarioInfo(
        "layer-index",
        "a list of per-layer caches read with the wrong index",
        "layer i reads caches[i - 1]; caches[-1] wraps silently, so layer 0 reads the last layer's cache.",
        "layer i reads caches[i], the cache it wrote on the previous step.",
        "single",
    ),
    ScenarioInfo(
        "padding-mask",
        "batched requests of different lengths whose mask does not cover the cached padding",
        "the mask covers the new tokens' padding but not the cache's, so short requests attend to pad slots.",
        "the key mask spans cache + new tokens and marks every padded cache slot.",
        "batch",
    ),
    ScenarioInfo(
        "rope-offset",
        "rotary positions restart at 0 for each step instead of at the cache length",
        "each forward rotates its tokens from position 0, so a decoded token is rotated as the first token.",
        "positions continue at the cache length, and the cache stores K after rotation.",
        "single",
    ),
    ScenarioInfo(
        "prealloc-slice",
        "a preallocated KV pool whose per-request slices overlap",
        "slots are packed by prompt length, so a request's generated tokens overwrite the next request.",
        "each slot reserves prompt + max_new_tokens, so slices never overlap.",
        "single",
    ),
)

SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)


def scenario_info(name: str) -> ScenarioInfo:
    """The scenario called ``name``; KeyError if there is none (the CLI checks names first)."""
    for info in SCENARIOS:
        if info.name == name:
            return info
    raise KeyError(name)
