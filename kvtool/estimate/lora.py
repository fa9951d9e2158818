"""The GPU memory of ``--enable-lora``: the stacked adapter buffers vLLM allocates for ``--max-loras`` adapters of
rank up to ``--max-lora-rank``, per GPU, for a dense decoder.

vLLM's LoRA model manager wraps every linear layer and the embeddings at load time (the LoRA manager is built inside
the model-loading memory measurement, so the buffers count as weights and come off the KV budget):
vllm/lora/model_manager.py (models.py before 0.12.0) ``LoRAModelManager._create_lora_modules`` wraps each module
whose suffix is in vllm/lora/utils.py ``get_supported_lora_modules`` (every LinearBase, plus the model's
``embedding_modules``: Llama's embed_tokens and lm_head, the latter through its logits processor), and calls
``create_lora_weights(lora_slots = max_loras, ...)``.  Each wrapped linear holds, per slice, in ``lora_dtype``
("auto": the model dtype; vllm/config/lora.py LoRAConfig):

    lora_a_stacked  max_loras x 1 x max_lora_rank x input_size        (input_size of this GPU's shard)
    lora_b_stacked  max_loras x 1 x output_size x max_lora_rank       (output_size of this GPU's shard)

(vllm/lora/layers/base_linear.py ``BaseLinearLayerWithLoRA.create_lora_weights``; column_parallel_linear.py
``MergedColumnParallelLinearWithLoRA.create_lora_weights`` for gate_up (2 slices) and qkv (3 slices: q, k, v with
``num_heads x head_size`` and ``num_kv_heads x head_size`` of the shard), 0.10.2-0.33.0 unchanged).  A column
parallel layer (qkv, gate_up) keeps the whole hidden input and 1/TP of its output; a row parallel layer (o, down)
1/TP of its input and the whole hidden output (row_parallel_linear.py: ``input_size_per_partition``).
The embeddings (vocab_parallel_embedding.py ``VocabParallelEmbeddingWithLoRA.create_lora_weights``) hold
``max_loras x vocab x rank`` and ``max_loras x 1 x hidden x rank``; the logits processor (logits_processor.py
``LogitsProcessorWithLoRA.create_lora_weights``) ``max_loras x 1 x rank x hidden`` and
``max_loras x 1 x vocab x rank`` - both over the whole vocabulary on every GPU.

What changes by release is a row of :data:`LORA_RULES`: up to 0.11.2 the adapters could add vocabulary
(``lora_extra_vocab_size`` 256), which grew embed_tokens by 256 x max_loras rows and lm_head by 256 (padded to
``lora_vocab_padding_size`` 256), padded the logits LoRA to 256 and kept ``embeddings_tensors`` of
``max_loras x 256 x hidden``; 0.12.0 removed it.

The dummy LoRAs of the profiling run (vllm/v1/worker/lora_model_runner_mixin.py ``maybe_setup_dummy_loras``:
max_loras adapters of rank min(max_lora_rank, 8)) are built on the CPU (model_manager.py ``create_dummy_lora``,
device "cpu") and copied into these buffers, so they add no GPU memory of their own; the punica wrapper's index
tensors (a few int64 vectors of max_num_batched_tokens) and the fp32 shrink buffers of the LoRA kernels during the
profiling forward are under a MiB at the default sizes and not counted.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from kvtool.core.errors import UsageError
from kvtool.estimate.dtypes import model_dtype_bytes
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.vllm_versions import pick

DEFAULT_MAX_LORAS = 1  # vllm/config/lora.py LoRAConfig.max_loras (0.10.0-0.33.0)
DEFAULT_MAX_LORA_RANK = 16  # LoRAConfig.max_lora_rank
VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE, vllm/model_executor/layers/vocab_parallel_embedding.py


class LoraRule(NamedTuple):
    """How one range of releases sizes the LoRA buffers."""

    since: str
    extra_vocab: int  # lora_extra_vocab_size (0: no added vocabulary)
    lora_vocab_padding: int  # lora_vocab_padding_size (the CUDA platform's, vllm/platforms/interface.py)
    ranks: tuple[int, ...]  # the max_lora_rank values LoRAConfig accepts
    source: str


LORA_RULES: tuple[LoraRule, ...] = (
    LoraRule(
        "0.10.0",
        256,
        256,
        (8, 16, 32, 64, 128, 256, 320, 512),  # LoRAConfig.__post_init__ possible_max_ranks
        "vllm/config/lora.py LoRAConfig.lora_extra_vocab_size 256 (vllm/config.py in 0.10.0-0.10.1.1); "
        "vllm/lora/layers/logits_processor.py LogitsProcessorWithLoRA.create_lora_weights pads the vocabulary to "
        "256 and keeps embeddings_tensors (0.10.0-0.11.2)",
    ),
    LoraRule(
        "0.12.0",
        0,
        0,
        (1, 8, 16, 32, 64, 128, 256, 320, 512),  # vllm/config/lora.py MaxLoRARanks
        "vllm/lora/layers/logits_processor.py LogitsProcessorWithLoRA.create_lora_weights: "
        "max_loras x 1 x vocab_size x rank, no added vocabulary (0.12.0-0.33.0)",
    ),
)


@dataclasses.dataclass(frozen=True)
class LoraOptions:
    """--enable-lora with --max-loras and --max-lora-rank, as vLLM names them."""

    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK


@dataclasses.dataclass(frozen=True)
class LoraPlan:
    """The LoRA buffers one GPU holds, by part (bytes)."""

    max_loras: int
    max_lora_rank: int
    linear_bytes_per_gpu: int  # the stacked A and B of qkv, o, gate_up, down over this GPU's layers
    vocab_bytes_per_gpu: int  # embed_tokens' and the logits processor's LoRA (and, before 0.12, the added vocab)
    method: str

    @property
    def bytes_per_gpu(self) -> int:
        return self.linear_bytes_per_gpu + self.vocab_bytes_per_gpu


def check_lora_options(max_loras: int, max_lora_rank: int, vllm_version: str) -> None:
    """Refuse what vLLM's LoRAConfig refuses: max_loras below 1, a rank the release does not accept."""
    if max_loras < 1:
        raise UsageError(f"--max-loras must be at least 1, not {max_loras}", where="--max-loras")
    ranks = pick(LORA_RULES, vllm_version).ranks
    if max_lora_rank not in ranks:
        raise UsageError(
            f"--max-lora-rank {max_lora_rank} is not one vLLM {vllm_version} accepts",
            where="--max-lora-rank",
            tip=f"use one of {', '.join(map(str, ranks))} (vllm/config/lora.py LoRAConfig)",
        )


def linear_lora_elements_per_layer(spec: ModelSpec, max_loras: int, rank: int, tp: int) -> int:
    """Elements of lora_a_stacked + lora_b_stacked of one decoder layer's qkv, o, gate_up and down on one GPU."""
    hidden = _hidden(spec)
    head_dim = spec.head_dim
    intermediate = spec.intermediate_size
    if intermediate is None:
        raise UsageError("--enable-lora needs the model's intermediate_size (give --config or --model)")
    q_rows = spec.num_attention_heads // tp * head_dim  # QKVParallelLinear num_heads per partition
    kv_rows = max(1, spec.num_kv_heads // tp) * head_dim  # num_kv_heads per partition (replicated below 1)
    mlp_rows = intermediate // tp
    qkv = 3 * rank * hidden + (q_rows + 2 * kv_rows) * rank  # 3 slices of A over the whole hidden input
    o_proj = rank * (spec.num_attention_heads * head_dim // tp) + hidden * rank  # row parallel
    gate_up = 2 * rank * hidden + 2 * mlp_rows * rank
    down = rank * mlp_rows + hidden * rank
    return max_loras * (qkv + o_proj + gate_up + down)


def embed_lora_bytes(spec: ModelSpec, rule: LoraRule, max_loras: int, rank: int, tp: int, dtype_bytes: int) -> int:
    """embed_tokens' LoRA buffers on one GPU, and the rows the added vocabulary grew it by (before 0.12.0)."""
    hidden, vocab, extra = _hidden(spec), _vocab(spec), rule.extra_vocab
    # VocabParallelEmbeddingWithLoRA: A max_loras x (org_vocab + extra) x rank, B max_loras x 1 x hidden x rank,
    # embeddings_tensors max_loras x extra x hidden
    elements = max_loras * ((vocab + extra) * rank + hidden * rank + extra * hidden)
    # vllm/model_executor/models/llama.py LlamaModel: embed_tokens of config.vocab_size + extra x max_loras rows,
    # padded to 64 (0.10.0-0.11.2), 1/TP of them a GPU
    grown_rows = _round_up(extra * max_loras, VOCAB_PADDING)
    return (elements + grown_rows // tp * hidden) * dtype_bytes


def logits_lora_bytes(spec: ModelSpec, rule: LoraRule, max_loras: int, rank: int, tp: int, dtype_bytes: int) -> int:
    """The logits processor's (lm_head's) LoRA buffers on one GPU, and lm_head's added rows (before 0.12.0)."""
    hidden, vocab, extra = _hidden(spec), _vocab(spec), rule.extra_vocab
    # LogitsProcessorWithLoRA: A max_loras x 1 x rank x hidden, B max_loras x 1 x vocab' x rank, where vocab' is the
    # logits processor's vocab_size (config.vocab_size + extra) padded to lora_vocab_padding_size before 0.12.0;
    # embeddings_tensors max_loras x extra x hidden
    logits_vocab = vocab + extra
    if rule.lora_vocab_padding:
        logits_vocab = _round_up(logits_vocab, rule.lora_vocab_padding)
    elements = max_loras * (rank * hidden + logits_vocab * rank + extra * hidden)
    grown_rows = 0
    if extra and not spec.tie_word_embeddings:
        # LlamaForCausalLM: lm_head of vocab + extra rows, padded to lora_vocab_padding_size instead of 64
        padded = _round_up(vocab, rule.lora_vocab_padding) + _round_up(extra, rule.lora_vocab_padding)
        grown_rows = padded - _round_up(vocab, VOCAB_PADDING)
    return (elements + grown_rows // tp * hidden) * dtype_bytes


def plan_lora(
    spec: ModelSpec,
    options: LoraOptions,
    *,
    tp: int,
    vllm_version: str,
    first_stage: bool = True,
    last_stage: bool = True,
) -> LoraPlan:
    """The LoRA buffers per GPU for ``spec``'s layers (one pipeline stage's, with pp > 1) at ``vllm_version``."""
    check_lora_options(options.max_loras, options.max_lora_rank, vllm_version)
    _check_dense(spec)
    rule = pick(LORA_RULES, vllm_version)
    dtype_bytes = model_dtype_bytes(spec.dtype)
    per_layer = linear_lora_elements_per_layer(spec, options.max_loras, options.max_lora_rank, tp)
    linear = per_layer * spec.num_layers * dtype_bytes
    args = (spec, rule, options.max_loras, options.max_lora_rank, tp, dtype_bytes)
    vocab = (embed_lora_bytes(*args) if first_stage else 0) + (logits_lora_bytes(*args) if last_stage else 0)
    method = (
        f"{options.max_loras} x rank {options.max_lora_rank} adapter(s): {per_layer:,} elements a layer x "
        f"{spec.num_layers} layers + embeddings and logits, {dtype_bytes} B each (vllm/lora/layers "
        f"create_lora_weights; {rule.source})"
    )
    return LoraPlan(options.max_loras, options.max_lora_rank, linear, vocab, method)


def _check_dense(spec: ModelSpec) -> None:
    """Only dense decoders are modelled: experts, MLA and recurrent layers have LoRA layers of their own."""
    if spec.num_experts or spec.is_mla or spec.state_layers or spec.block_types:
        raise UsageError(
            f"--enable-lora is modelled for dense decoders only, not {spec.model_type}",
            where="--enable-lora",
            tip="give the LoRA buffers yourself with --lora-memory",
        )


def _hidden(spec: ModelSpec) -> int:
    if spec.hidden_size is None:
        raise UsageError("--enable-lora needs the model's hidden_size (give --hidden, --config or --model)")
    return spec.hidden_size


def _vocab(spec: ModelSpec) -> int:
    if spec.vocab_size is None:
        raise UsageError("--enable-lora needs the model's vocab_size (give --config or --model)")
    return spec.vocab_size


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
