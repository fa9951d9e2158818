"""Drive a real vLLM engine (CPU, tiny random Llama) through a workload that exercises every KV-block event.

Run it with a Python that has vLLM, under the recorder (docs/vllm-record.md):

    kvtool record -o /tmp/run.parquet -- VLLM_PYTHON tests/support/vllm_record_driver.py \
        --model-dir /tmp/tiny-llama --figures /tmp/run.vllm.json

Requests: ``--requests`` prompts given as token ids, most sharing one of three system prompts (96, 70 and 128
tokens: whole blocks, a partial block, whole blocks again), some long; a KV cache of ``--kv-blocks`` blocks of 32
tokens, small enough for prefix-cache evictions and preemptions; ``--abort`` requests aborted mid-run.  It writes
vLLM's own figures for the run to ``--figures`` (JSON): per request ``num_cached_tokens`` and ``num_preemptions``
(RequestOutput), and the engine counters ``vllm:prefix_cache_hits``, ``vllm:prefix_cache_queries`` and
``vllm:num_preemptions`` (LLM.get_metrics).  Nothing here needs network access.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from vllm_tiny import BLOCK_SIZE, BYTES_PER_TOKEN, ensure_model, offline_llm, sampling  # same folder (a script)

SYSTEM_PROMPT_TOKENS = (96, 70, 128)


def workload(count: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) per request: shared system prompts, varied tails, a few long requests."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 1000) for _ in range(n)] for n in SYSTEM_PROMPT_TOKENS]
    out = []
    for i in range(count):
        kind = i % 6
        if kind == 5:  # no shared prefix
            prompt = [rng.randrange(1, 1000) for _ in range(rng.randrange(30, 120))]
        else:
            tail = [rng.randrange(1, 1000) for _ in range(rng.randrange(10, 160))]
            prompt = systems[kind % 3] + tail
        if i % 9 == 4:  # a long request
            prompt = prompt + [rng.randrange(1, 1000) for _ in range(rng.randrange(300, 500))]
        out.append((prompt, rng.choice((16, 32, 48, 96, 160))))
    return out


def counters(llm) -> dict[str, float]:
    wanted = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "vllm:num_preemptions")
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name.removesuffix("_total")
        if name in wanted:
            found[name] = found.get(name, 0) + float(getattr(metric, "value", 0))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--figures", type=Path, required=True, help="where to write vLLM's own figures (JSON)")
    parser.add_argument("--kv-blocks", type=int, default=48, help="KV budget in blocks of 32 tokens")
    parser.add_argument("--requests", type=int, default=36)
    parser.add_argument("--abort", type=int, default=2, help="requests aborted after a few engine steps")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--arch", choices=("llama", "gemma2"), default="llama", help="gemma2: a hybrid model")
    args = parser.parse_args()

    ensure_model(args.model_dir, args.arch)
    from vllm.inputs import TokensPrompt

    llm = offline_llm(args.model_dir, args.kv_blocks * BLOCK_SIZE * BYTES_PER_TOKEN, disable_log_stats=False)
    engine = llm.llm_engine
    requests = workload(args.requests, args.seed)
    prompt_tokens = {}
    for i, (ids, max_tokens) in enumerate(requests):
        engine.add_request(f"req-{i}", TokensPrompt(prompt_token_ids=ids), sampling(max_tokens))
        prompt_tokens[f"req-{i}"] = len(ids)
    aborted = [f"req-{i}" for i in range(3, 3 + 5 * args.abort, 5)][: args.abort]
    outputs: dict[str, dict] = {}
    steps = 0
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = {
                    "num_cached_tokens": out.num_cached_tokens,
                    "num_preemptions": getattr(out.metrics, "num_preemptions", None),
                    "prompt_tokens": prompt_tokens[out.request_id],
                    "output_tokens": len(out.outputs[0].token_ids),
                    "finish_reason": out.outputs[0].finish_reason,
                }
        steps += 1
        if steps == 6 and aborted:
            engine.abort_request(aborted)
    elapsed = time.perf_counter() - started
    time.sleep(1.0)  # let the last stats reach the metrics
    figures = {
        "vllm_version": __import__("vllm").__version__,
        "num_gpu_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
        "block_size": BLOCK_SIZE,
        "requests_submitted": len(requests),
        "aborted": aborted,
        "engine_steps": steps,
        "generate_s": elapsed,
        "counters": counters(llm),
        "requests": dict(sorted(outputs.items(), key=lambda kv: int(kv[0].split("-")[1]))),
    }
    args.figures.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "requests"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
