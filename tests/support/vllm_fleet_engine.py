"""One vLLM engine (CPU) of a small recorded fleet: it publishes its KV-cache events over ZMQ and serves requests
read from stdin, one at a time, so a driver decides the order of work across instances.

Used to record tests/data/vllm-events/fleet-*/ (see the README there) through tests/support/vllm_fleet_driver.py.
Run it with a Python that has vLLM installed (never kvtool's own venv):

    VLLM_PYTHON tests/support/vllm_fleet_engine.py --model-dir DIR --endpoint tcp://127.0.0.1:PORT \
        --replay-endpoint 'tcp://*:RPORT' --report-mode full

stdin, one JSON object a line: ``{"id": "r0", "prompt": [token ids]}`` runs that request to the end and answers
``{"id": "r0", "num_cached_tokens": N}`` on stdout; ``{"reset": true}`` resets the prefix cache (one
AllBlocksCleared event, published with a short flush request that stores no block) and answers ``{"reset": true}``;
end of input stops the engine.  The model is the tiny random Llama of tests/support/vllm_tiny.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MAX_TOKENS = 4  # a prompt of 32 m + 4 tokens then holds 32 m + 7 computed tokens: m full blocks, all of the prompt
KV_BLOCKS = 1024  # a cache large enough that nothing is evicted in these runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--replay-endpoint", default=None)
    parser.add_argument("--report-mode", choices=["incremental", "full"], default="full")
    args = parser.parse_args()
    # the answers go to the real stdout; vLLM logs to stdout too, so from here on fd 1 is stderr
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(obj: dict) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllm_tiny import BLOCK_SIZE, BYTES_PER_TOKEN, ensure_model, kv_events, offline_llm, reset_and_flush, sampling

    ensure_model(args.model_dir)
    from vllm.inputs import TokensPrompt

    llm = offline_llm(
        args.model_dir,
        KV_BLOCKS * BLOCK_SIZE * BYTES_PER_TOKEN,
        kv_events_config=kv_events(args.endpoint, args.replay_endpoint),
    )
    params = sampling(MAX_TOKENS, extra_args={"kv_cache_report_mode": args.report_mode})
    engine = llm.llm_engine
    answer({"ready": True, "vllm_version": __import__("vllm").__version__})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("reset"):
            reset_and_flush(llm)  # one AllBlocksCleared event, published with a flush request
            answer({"reset": True})
            continue
        engine.add_request(command["id"], TokensPrompt(prompt_token_ids=command["prompt"]), params)
        cached = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    cached = out.num_cached_tokens
        answer({"id": command["id"], "num_cached_tokens": cached})
    time.sleep(2.0)  # let the publisher thread send the last batches
    return 0


if __name__ == "__main__":
    sys.exit(main())
