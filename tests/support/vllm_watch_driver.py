"""Drive a real vLLM engine (CPU, tiny random Llama) through phases with planted KV-cache conditions.

Run it with a Python that has vLLM, under the recorder, with tests/support/delay_free_plugin on PYTHONPATH:

    kvtool record -o /tmp/run.csv -- VLLM_PYTHON tests/support/vllm_watch_driver.py --model-dir DIR \
        --phases healthy:12 --marks /tmp/marks.json --flag /tmp/delay.flag

Every request shares one 64-token system prompt, then a tail picked from a few (so prompts repeat and hit the
prefix cache), at ``--concurrency`` requests in flight, 16 generated tokens each.  Phases (NAME:SECONDS):

- ``healthy``: just that;
- ``long``: a flood of long requests (the system prompt and 600 more tokens, 64 generated), six in flight:
  long requests hold most of the pool;
- ``slow``: the flag file exists, so the delay-free plugin makes each free wait 300 ms (the seed's 800 ms case);
- ``vary``: the system prompt's last token of its first block varies per request (the seed's trailing space),
  so no prompt's first block matches any other: prefix hits collapse.

Request ids name their phase (``healthy-3``, ``long-0``, ...).  ``--marks`` gets each phase's wall start and end,
its engine steps and the time spent in ``engine.step()`` (the step time of benchmarks/bench_watch.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from vllm_tiny import BLOCK_SIZE, BYTES_PER_TOKEN, build_model  # same folder (run as a script)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--phases", default="healthy:12", help="NAME:SECONDS,... (healthy, long, slow, vary)")
    parser.add_argument("--marks", type=Path, required=True)
    parser.add_argument("--flag", type=Path, required=True, help="the delay-free plugin's flag file")
    parser.add_argument("--kv-blocks", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    if not (args.model_dir / "config.json").exists():
        build_model(args.model_dir)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(args.model_dir),
        skip_tokenizer_init=True,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        max_model_len=1024,
        enforce_eager=True,
        kv_cache_memory_bytes=args.kv_blocks * BLOCK_SIZE * BYTES_PER_TOKEN,
    )
    engine = llm.llm_engine
    rng = random.Random(3)
    system = [rng.randrange(1, 1000) for _ in range(64)]
    tails = [[rng.randrange(1, 1000) for _ in range(rng.randrange(20, 60))] for _ in range(4)]
    long_tail = [rng.randrange(1, 1000) for _ in range(600)]
    marks: list[dict] = []
    counter = {"n": 0}
    in_flight: set[str] = set()

    def submit(phase: str, i: int) -> None:
        prompt = system + tails[i % len(tails)]
        tokens = 16
        if phase == "long":
            prompt, tokens = system + long_tail + [i % 997 + 1], 64
        elif phase == "vary":
            prompt = list(prompt)
            prompt[BLOCK_SIZE - 1] = counter["n"] % 997 + 1  # the first block's last token
            counter["n"] += 1
        rid = f"{phase}-{i}"
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, detokenize=False)
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
        in_flight.add(rid)

    for spec in args.phases.split(","):
        phase, seconds = spec.split(":")
        args.flag.unlink(missing_ok=True)
        if phase == "slow":
            args.flag.write_text("on")
        start = time.time()
        concurrency = 6 if phase == "long" else args.concurrency
        i = steps = 0
        step_s = 0.0
        while time.time() - start < float(seconds):
            while len(in_flight) < concurrency:
                submit(phase, i)
                i += 1
            began = time.perf_counter()
            outputs = engine.step()
            step_s += time.perf_counter() - began
            steps += 1
            for out in outputs:
                if out.finished:
                    in_flight.discard(out.request_id)
        marks.append(
            {"phase": phase, "start_s": start, "end_s": time.time(), "requests": i, "steps": steps, "step_s": step_s}
        )
    args.flag.unlink(missing_ok=True)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                in_flight.discard(out.request_id)
    args.marks.write_text(json.dumps(marks, indent=2) + "\n")
    print(json.dumps(marks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
