"""Optional live parity check against a real vLLM engine (skipped wherever vLLM is not importable).

The project's own venv never has vLLM (see docs/vllm-parity.md), so this module is skipped there and in CI.
To run it, use the separate vLLM venv, from the repository root:

    /work/vllm-venv/bin/python -m pytest tests/test_vllm_live.py -q

It builds the doc's tiny random-weight Llama in tmp_path (no hub access), starts vLLM on the CPU in a child
interpreter with an exact KV budget, on loopback and offline, and compares the engine's num_gpu_blocks and
logged capacity line with `kvtool estimate`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (optional live parity check)"
)

CAPACITY_LINE = re.compile(
    r"KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for [\d,]+ tokens per request: (?P<concurrency>\d+\.\d\d)x"
)

ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir, budget, block, max_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    config = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=512, vocab_size=1000, max_position_embeddings=2048, dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)

    from vllm import LLM
    llm = LLM(model=model_dir, skip_tokenizer_init=True, block_size=block, enable_prefix_caching=True,
              max_model_len=max_len, enforce_eager=True, kv_cache_memory_bytes=budget)
    print("LIVE_RESULT " + json.dumps({"num_gpu_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks}),
          flush=True)
    """
)


def _offline_env(scratch) -> dict[str, str]:
    """Loopback and offline, every cache under tmp_path (/work/shared/docs/vllm-on-cpu.md, "Install" step 3)."""
    env = dict(os.environ)
    dirs = {}
    for name in ("TMPDIR", "VLLM_RPC_BASE_PATH", "VLLM_CACHE_ROOT", "HF_HOME", "XDG_CACHE_HOME",
                 "TORCHINDUCTOR_CACHE_DIR"):
        path = scratch / name.lower()
        path.mkdir()
        dirs[name] = str(path)
    env.update(dirs)
    env.update({
        "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    })
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # would override kv_cache_memory_bytes
    return env


@pytest.mark.parametrize(("budget", "block", "max_len"), [(5_000_000, 32, 2000), (3_000_000, 64, 1500)])
def test_live_vllm_blocks_match_estimate(tmp_path, run_cli, budget, block, max_len):
    model_dir = tmp_path / "tiny-llama"
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(budget), str(block), str(max_len)],
        env=_offline_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("LIVE_RESULT "))[12:])
    capacity = CAPACITY_LINE.search(output)
    assert capacity is not None, output[-3000:]

    est = run_cli(
        "estimate", "--config", str(model_dir), "--kv-memory", str(budget), "--block-size", str(block),
        "--max-model-len", str(max_len), "--json",
    )
    assert est.exit_code == 0, est.stderr
    out = json.loads(est.stdout)
    assert out["num_blocks"] == result["num_gpu_blocks"]
    assert out["vllm_logged_tokens"] == int(capacity["tokens"].replace(",", ""))
    assert f"{out['max_concurrency']:.2f}" == capacity["concurrency"]
