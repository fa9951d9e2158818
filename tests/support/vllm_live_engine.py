"""Run a real vLLM engine (CPU) on a tiny random Llama and publish its KV-cache events over ZMQ.

Used to record tests/data/vllm-events/live-capture-*.jsonl (see RECORD.md there) and by the
optional live test.  Run it with a Python that has vLLM installed (never kvtool's own venv):

    VLLM_PYTHON tests/support/vllm_live_engine.py --model-dir DIR --endpoint tcp://127.0.0.1:PORT \
        --replay-endpoint 'tcp://*:RPORT' --kv-blocks 40

It builds the model in --model-dir when missing (recipe: docs in shared/docs/vllm-on-cpu.md),
sends --prompts requests given as token ids (half share a 64-token prefix) with session ids
sess-0..3, runs them to the end, resets the prefix cache (one AllBlocksCleared) and waits for the
publisher to flush.  Nothing here needs network access.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from vllm_tiny import BLOCK_SIZE, BYTES_PER_TOKEN, ensure_model, kv_events, offline_llm, reset_and_flush, sampling


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 1000) for _ in range(64)]
    out = []
    for i in range(count):
        length = rng.randrange(40, 300)
        tail = [rng.randrange(1, 1000) for _ in range(length)]
        out.append(shared + tail if i % 2 == 0 else tail)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--endpoint", required=True, help="KVEventsConfig.endpoint")
    parser.add_argument("--replay-endpoint", default=None, help="KVEventsConfig.replay_endpoint")
    parser.add_argument("--kv-blocks", type=int, default=40, help="KV budget in blocks of 32 tokens")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--report-mode", choices=["incremental", "full"], default="full")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    ensure_model(args.model_dir)
    from vllm.inputs import TokensPrompt

    kv_bytes = args.kv_blocks * BLOCK_SIZE * BYTES_PER_TOKEN
    llm = offline_llm(args.model_dir, kv_bytes, kv_events_config=kv_events(args.endpoint, args.replay_endpoint))
    params = sampling(args.max_tokens, extra_args={"kv_cache_report_mode": args.report_mode})
    engine = llm.llm_engine
    for i, ids in enumerate(prompts(args.prompts, args.seed)):
        engine.add_request(f"req-{i}", TokensPrompt(prompt_token_ids=ids), params, session_id=f"sess-{i % 4}")
    finished = 0
    while engine.has_unfinished_requests():
        finished += sum(1 for out in engine.step() if out.finished)
    reset_and_flush(llm)
    time.sleep(2.0)  # let the publisher thread send the last batches
    summary = {
        "num_gpu_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
        "kv_cache_memory_bytes": kv_bytes,
        "finished_requests": finished,
        "vllm_version": __import__("vllm").__version__,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
