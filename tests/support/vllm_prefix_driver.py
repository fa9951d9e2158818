"""Drive a real vLLM engine through one request per prefix-cache outcome (kvtool issue 28), on three tiny models.

Run it with a Python that has vLLM, under the recorder and with kvtool capture listening (tests/data/vllm-record/
PREFIX.md has the exact commands):

    kvtool record -o /tmp/p/llama.parquet -- VLLM_PYTHON tests/support/vllm_prefix_driver.py \
        --arch llama --model-dir /tmp/p/llama --endpoint tcp://127.0.0.1:5771 --prompts-out /tmp/p/llama.prompts.jsonl

Models (random weights, hidden 256, 4 layers, 2 KV heads, head_dim 32, bf16): ``llama`` (full attention), ``mistral``
(every layer a 64-token sliding window: one SlidingWindowSpec group), ``gemma2`` (sliding-window and global layers
alternate: two KV-cache groups).  Block size 32, prefix caching on, a small pool (``--kv-blocks`` blocks of 32 tokens
of the Llama's 1,024 bytes per token).

Requests, run in phases (each request runs to its end before the next phase unless said), ids name the intent:

- ``hit-a`` = S + 20 tokens, then ``hit-b`` = S + 20 other tokens (S: 128 tokens, 4 whole blocks);
- ``unshared`` (100 fresh tokens), then ``short`` (the first 20 tokens of ``unshared``, then 80 others);
- ``evict-a`` = Q + 20 tokens (Q: 96 tokens), then ``filler-0..7`` (300 fresh tokens each, one at a time), then
  ``evict-b`` = Q + 20 other tokens;
- ``ws-a`` = P + [7] (P: 127 tokens), decoding 150 tokens; once it has 40 output tokens, ``wsfill-0..7`` one at a
  time while it runs, then ``ws-b`` = P + [8]: the same prompt with one different trailing token;
- ``sys-a`` = T + [7] + 100 tokens (T: 160 tokens, a system prompt), then ``sys-b`` = T + [8] + 100 other tokens:
  the seed's trailing whitespace after a shared system prompt.

It writes ``--prompts-out``: one JSON line per request, in submission order, with its prompt token ids and vLLM's
``num_cached_tokens`` (RequestOutput).  Nothing here needs network access.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from vllm_tiny import BLOCK_SIZE, BYTES_PER_TOKEN, ensure_model, kv_events, offline_llm, sampling  # a script


class Run:
    """The engine and the outputs so far; requests are stepped to their end (or to a condition)."""

    def __init__(self, engine):
        self.engine = engine
        self.order: list[str] = []
        self.prompts: dict[str, list[int]] = {}
        self.outputs: dict[str, dict] = {}
        self.generated: dict[str, int] = {}

    def add(self, rid: str, ids: list[int], max_tokens: int) -> None:
        from vllm.inputs import TokensPrompt

        self.engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), sampling(max_tokens))
        self.order.append(rid)
        self.prompts[rid] = ids

    def step(self) -> None:
        for out in self.engine.step():
            self.generated[out.request_id] = len(out.outputs[0].token_ids)
            if out.finished:
                self.outputs[out.request_id] = {
                    "num_cached_tokens": out.num_cached_tokens,
                    "output_tokens": len(out.outputs[0].token_ids),
                }

    def finish(self, rid: str) -> None:
        while rid not in self.outputs:
            self.step()

    def one(self, rid: str, ids: list[int], max_tokens: int = 8) -> None:
        self.add(rid, ids, max_tokens)
        self.finish(rid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=("llama", "mistral", "gemma2"), required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--endpoint", required=True, help="KVEventsConfig.endpoint (kvtool capture binds it)")
    parser.add_argument("--prompts-out", type=Path, required=True)
    parser.add_argument("--kv-blocks", type=int, default=40, help="KV budget in blocks of 32 tokens x 1,024 bytes")
    parser.add_argument("--fillers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=28)
    args = parser.parse_args()

    ensure_model(args.model_dir, args.arch)
    llm = offline_llm(
        args.model_dir,
        args.kv_blocks * BLOCK_SIZE * BYTES_PER_TOKEN,
        disable_log_stats=False,
        kv_events_config=kv_events(args.endpoint),
    )
    rng = random.Random(args.seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(10, 1000) for _ in range(n)]

    run = Run(llm.llm_engine)
    shared_s = fresh(128)
    run.one("hit-a", shared_s + fresh(20))
    run.one("hit-b", shared_s + fresh(20))
    unshared = fresh(100)
    run.one("unshared", unshared)
    run.one("short", unshared[:20] + fresh(80))
    shared_q = fresh(96)
    run.one("evict-a", shared_q + fresh(20))
    for i in range(args.fillers):
        run.one(f"filler-{i}", fresh(300), max_tokens=1)
    run.one("evict-b", shared_q + fresh(20))
    shared_p = fresh(127)
    run.add("ws-a", shared_p + [7], max_tokens=150)
    while run.generated.get("ws-a", 0) < 40:
        run.step()
    for i in range(args.fillers):
        run.one(f"wsfill-{i}", fresh(300), max_tokens=1)
    if "ws-a" in run.outputs:
        raise SystemExit("ws-a finished before ws-b arrived: raise its max_tokens")
    run.one("ws-b", shared_p + [8])
    run.finish("ws-a")
    system = fresh(160)
    run.one("sys-a", system + [7] + fresh(100))
    run.one("sys-b", system + [8] + fresh(100))
    with args.prompts_out.open("w") as fh:
        for rid in run.order:
            row = {"request_id": rid, "prompt_token_ids": run.prompts[rid], **run.outputs[rid]}
            fh.write(json.dumps(row) + "\n")
    summary = {
        "vllm_version": __import__("vllm").__version__,
        "num_gpu_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
        "cached": {rid: run.outputs[rid]["num_cached_tokens"] for rid in run.order if "fill" not in rid},
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
