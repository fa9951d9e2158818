"""Published config.json files read as a user would (`kvtool estimate --config ...`), each number against a hand
computation from the config and the transformers / vLLM rule it follows (cited per test)."""

from __future__ import annotations

import json

from tests.support import DATA

EST = DATA / "estimate"


def _json(run_cli, *args):
    out = run_cli("estimate", *args, "--json")
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)


def test_gemma3_27b_published_config_is_five_sliding_to_one_full(run_cli):
    # google/gemma-3-27b-it's config.json has no sliding_window_pattern; transformers' Gemma3TextConfig defaults it to
    # 6 (layer_types: layer i is full when (i + 1) % 6 == 0), which is what vLLM's gemma3.py reads: 10 full layers
    # (5, 11, ..., 59) and 52 sliding ones, not 62 sliding layers.
    d = _json(run_cli, "--config", EST / "gemma-3-27b-it" / "config.json", "--seq-len", "131072")
    full = 2 * 10 * 16 * 131072 * 128 * 2  # 10,737,418,240
    sliding = 2 * 52 * 16 * 1024 * 128 * 2  # 436,207,616: min(S, window 1024) tokens
    assert d["kv_bytes"] == full + sliding == 11_173_625_856
    # Gemma3TextConfig's other defaults: max_position_embeddings 131,072; vocab_size 262,208 (so the weights are known:
    # 27.0B language-model parameters of the published 27.4B, which includes the 0.4B SigLIP tower)
    assert d["max_position_embeddings"] == 131072
    assert 26.8e9 < d["weights_params"] < 27.2e9
