"""Pipeline parallelism (``--pp``): layers and weights per stage, as vLLM 0.32 splits them.

vllm/distributed/utils.py ``get_pp_indices``: ``num_layers // pp`` layers per stage; a remainder goes one layer each
to the stages before the last, from the second-to-last backwards.  The first stage also holds the embeddings, the
last the final norm and the LM head (with tied embeddings each keeps its own copy once pp > 1).  Every stage sizes
its own KV cache and vLLM keeps the smallest block count of all (``get_kv_cache_configs``: one block pool for all
workers), so capacity is set by the most loaded stage.
"""

from __future__ import annotations

import dataclasses

from kvtool.core.errors import UsageError
from kvtool.estimate.dtypes import model_dtype_bytes
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.kinds import MAMBA


def pp_partitions(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage, vLLM's default partition."""
    if pp > num_layers:
        raise UsageError(f"--pp {pp} exceeds the {num_layers} layers of the model", where="--pp")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One pipeline stage (per tensor-parallel GPU figures)."""

    index: int
    first_layer: int
    num_layers: int
    weights_bytes_per_gpu: int
    kv_budget_bytes: int | None = None  # filled once the budget is known
    num_blocks: int | None = None


def stage_spec(spec: ModelSpec, first: int, count: int) -> ModelSpec:
    """The model as one stage sees it: its layers only (and their recurrent states, for hybrid models)."""
    blocks = spec.block_types[first : first + count]
    if blocks:  # Nemotron-H: layer_kinds lists only the Mamba and attention blocks, so split the blocks
        kinds = tuple("full" if b == "*" else MAMBA for b in blocks if b in "M*")
    else:
        kinds = spec.layer_kinds[first : first + count]
    states = count if spec.state_layers == spec.num_layers else kinds.count(MAMBA)
    return dataclasses.replace(
        spec,
        num_layers=count,
        layer_kinds=kinds,
        state_layers=states if spec.state_layers else 0,
        block_types=blocks,
    )


def stage_weights(spec: ModelSpec, weights_bytes: int, stage: int, parts: tuple[int, ...], tp: int) -> int:
    """Weights of one stage per TP rank: its share of the decoder layers plus embeddings (first) / LM head (last)."""
    vocab_bytes = (spec.vocab_size or 0) * (spec.hidden_size or 0) * model_dtype_bytes(spec.dtype)
    copies = 1 if spec.tie_word_embeddings else 2
    layers_bytes = max(0, weights_bytes - copies * vocab_bytes)
    own = layers_bytes * parts[stage] // sum(parts)
    if stage == 0:
        own += vocab_bytes
    if stage == len(parts) - 1:
        own += vocab_bytes
    return -(-own // tp)


def stages(spec: ModelSpec, weights_bytes: int, pp: int, tp: int) -> tuple[Stage, ...]:
    parts = pp_partitions(spec.num_layers, pp)
    out, first = [], 0
    for i, count in enumerate(parts):
        out.append(Stage(i, first, count, stage_weights(spec, weights_bytes, i, parts, tp)))
        first += count
    return tuple(out)
