"""The weights per GPU term by term (kvtool.estimate.budget.WeightTerms) in -v and --json, and the overrides of the
terms that had none: --encoder-memory (the vision tower's weights per GPU) and --draft-memory (the drafter's)."""

from __future__ import annotations

import json
import math

import pytest

from kvtool.core.errors import EXIT_USAGE
from tests.support import DATA

GIB = 1024**3
GEMMA = ["--config", str(DATA / "estimate" / "gemma-3-4b-it"), "--gpu", "H100", "--vllm-version", "0.19.0"]
QWEN36 = [
    "--config", str(DATA / "gpu-logs" / "qwen3.6-27b-int4-3090-tp2-v0.20.1"), "--gpu", "rtx-3090", "--tp", "2",
    "--vllm-version", "0.20.1", "--seq-len", "262144", "--block-size", "64", "--kv-dtype", "fp8_e5m2",
    "--max-num-batched-tokens", "8192", "--max-num-seqs", "2",
    "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}',
]  # fmt: skip

# gemma-3-4b-it at bf16 (2 B a parameter), by hand:
# - its SigLIP tower as test_multimodal.py counts gemma-3-27b's (423,060,336), with the 4b's text hidden 2560 in the
#   projector instead of 5376: 423,060,336 - 1152 x 5376 + 1152 x 2560 = 419,816,304 parameters -> 839,632,608 B;
# - its rotary caches (kvtool.estimate.rope): (1,048,576 + 131,072) positions x 256 x 2 B = 603,979,776 B.
GEMMA_ENCODER = 419_816_304 * 2
GEMMA_ROTARY = (1_048_576 + 131_072) * 256 * 2


def _json(run_cli, *args: str) -> dict:
    out = run_cli("estimate", *args, "--json")
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)


def test_the_terms_add_up_to_what_the_budget_subtracts(run_cli):
    out = _json(run_cli, *GEMMA)
    assert out["encoder_weights_bytes"] == GEMMA_ENCODER
    assert out["rotary_cache_bytes_per_gpu"] == GEMMA_ROTARY
    assert out["language_model_weights_bytes_per_gpu"] == out["weights_bytes"]  # tp 1: the whole language model
    assert out["draft_weights_bytes_per_gpu"] is None and out["lora_bytes"] is None
    assert out["weights_bytes_per_gpu"] == out["weights_bytes"] + GEMMA_ENCODER + GEMMA_ROTARY
    assert out["kv_budget_bytes"] == out["requested_memory_bytes"] - out["weights_bytes_per_gpu"] - out["reserve_bytes"]
    # vllm/v1/worker/gpu_model_runner.py profile_run (0.19.0): max(8,192 batched tokens, 256) // 256 = 32 images
    assert (out["encoder_budget_tokens"], out["encoder_profiling_items"]) == (8192, 32)


def _text(stdout: str) -> str:
    """The table's words in order, a wrapped cell's lines joined (its continuation lines have an empty first cell)."""
    return " ".join(stdout.replace("│", " ").split())


def test_the_table_shows_each_term_and_the_budget_agrees(run_cli):
    out = run_cli("estimate", *GEMMA, "-v")
    text = _text(out.stdout)
    # 839,632,608 B = 0.78 GiB, 603,979,776 B = 0.56 GiB; the language model 7,760,491,520 B = 7.23 GiB
    assert "weights per GPU 8.57 GiB = language model 7.23 + vision tower 0.78 + rotary caches 0.56 GiB" in text
    assert "- weights 8.57 GiB - reserve" in text
    assert "vision tower (--encoder-memory) 0.78 GiB (siglip encoder 419,816,304 parameters" in text
    assert "budget of 8192 tokens, and profiled with 32 image items" in text
    short = _text(run_cli("estimate", *GEMMA).stdout)  # without -v the budget row names the terms
    assert "- weights 8.57 GiB (language model 7.23 + vision tower 0.78 + rotary caches 0.56) - reserve" in short


def test_encoder_memory_replaces_the_modelled_tower_exactly(run_cli):
    modelled = _json(run_cli, *GEMMA)
    given = _json(run_cli, *GEMMA, "--encoder-memory", "1GiB")
    assert given["encoder_weights_bytes"] == GIB
    assert given["weights_bytes_per_gpu"] == modelled["weights_bytes"] + GIB + GEMMA_ROTARY
    # the KV budget loses 1 GiB - 839,632,608 B = 234,109,216 B, the reserve (the profiling run) unchanged
    assert given["reserve_bytes"] == modelled["reserve_bytes"]
    assert modelled["kv_budget_bytes"] - given["kv_budget_bytes"] == GIB - GEMMA_ENCODER == 234_109_216


def test_encoder_memory_adds_a_tower_kvtool_does_not_model(run_cli):
    # Qwen3.6's vision_config (qwen3_5's) is not one of kvtool's towers: the config estimate leaves it out and warns
    modelled = _json(run_cli, *QWEN36)
    assert any("encoder is not counted" in w for w in modelled["warnings"])
    given = _json(run_cli, *QWEN36, "--encoder-memory", "600MiB")
    assert given["encoder_weights_bytes"] == 600 * 2**20
    assert modelled["kv_budget_bytes"] - given["kv_budget_bytes"] == 600 * 2**20
    assert not any("encoder is not counted" in w for w in given["warnings"])


def test_draft_memory_replaces_the_modelled_drafter_exactly(run_cli):
    # the MTP drafter by kvtool's model: 744,519,680 B (one full-attention layer) + 104,888,320 B (eh_proj, norms)
    # = 849,408,000 B, split over TP 2 as the language model is: 424,704,000 B per GPU
    modelled = _json(run_cli, *QWEN36)
    assert modelled["speculative"]["draft_weights_bytes"] == 849_408_000
    assert modelled["draft_weights_bytes_per_gpu"] == 424_704_000
    lm = modelled["language_model_weights_bytes_per_gpu"]
    assert lm == math.ceil((modelled["weights_bytes"] - 849_408_000) / 2)
    assert modelled["weights_bytes_per_gpu"] == lm + 424_704_000 + modelled["rotary_cache_bytes_per_gpu"]
    given = _json(run_cli, *QWEN36, "--draft-memory", "1GiB")
    assert given["draft_weights_bytes_per_gpu"] == GIB
    assert given["weights_bytes_per_gpu"] == lm + GIB + modelled["rotary_cache_bytes_per_gpu"]
    # the budget loses 1,073,741,824 - 424,704,000 = 649,037,824 B per GPU; the KV layers are the drafter's still
    assert modelled["kv_budget_bytes"] - given["kv_budget_bytes"] == 649_037_824
    assert given["speculative"]["draft_kv_layers"] == 1
    assert given["speculative"]["draft_weights_method"] == "--draft-memory 1GiB per GPU"


def test_draft_memory_zero_drops_the_drafter(run_cli):
    modelled = _json(run_cli, *QWEN36)
    given = _json(run_cli, *QWEN36, "--draft-memory", "0")
    assert given["draft_weights_bytes_per_gpu"] == 0
    assert given["kv_budget_bytes"] - modelled["kv_budget_bytes"] == 424_704_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "llama-3.1-8b", "--gpu", "H100", "--draft-memory", "1GiB"], "Error: --draft-memory needs --speculative-config"),
        (
            ["-m", "llama-3.1-8b", "--gpu", "H100", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}',
             "--draft-memory", "1GiB"],
            "Error: --draft-memory: ngram has no drafter model",
        ),
        (["-m", "llama-3.1-8b", "--gpu", "H100", "--encoder-memory", "1GiB"], "Error: --encoder-memory: the model has no vision"),
        ([*GEMMA, "--encoder-memory", "lots"], "Error: --encoder-memory must be a size"),
    ],
)  # fmt: skip
def test_overrides_refused_where_there_is_nothing_to_replace(run_cli, args, message):
    out = run_cli("estimate", *args)
    assert out.exit_code == EXIT_USAGE
    assert out.stderr.startswith(message), out.stderr
