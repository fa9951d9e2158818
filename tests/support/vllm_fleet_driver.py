"""Record a small real fleet: two vLLM engines (two processes, one tiny Llama), each with its KV events captured to
its own file by `kvtool capture`, and round-robin traffic whose shared prefixes make reuse missed across them.

Run it with kvtool's Python (the engines run under VLLM_PYTHON, tests/support/vllm_fleet_engine.py):

    python -m tests.support.vllm_fleet_driver --out tests/data/vllm-events/fleet-same-seed \
        --vllm-python /work/vllm-venv/bin/python --seeds 0 0 --report-mode full
    python -m tests.support.vllm_fleet_driver --out tests/data/vllm-events/fleet-different-seeds \
        --vllm-python /work/vllm-venv/bin/python --seeds 1 2 --report-mode incremental

--seeds sets each engine's PYTHONHASHSEED: vLLM 0.32 derives the hash of a prefix's first block from it
(vllm/v1/core/kv_cache_utils.py: init_none_hash, resolve_none_hash_seed), so equal seeds give equal block hashes for
equal content and different seeds do not.  The requests (PLAN) are sent one at a time, each run to its end before
the next starts, so which instance held which block when another computed it follows from the plan alone
(hand count in the README there).  Writes instance=a/events.jsonl, instance=b/events.jsonl and requests.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import vllm_engine_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def token_sets(seed: int = 29) -> dict[str, list[int]]:
    """The prompt pieces: two shared prefixes (S1: 2 blocks, S2: 3 blocks), tails of one block plus 4 tokens."""
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(1, 1000) for _ in range(n)]

    parts = {"S1": draw(64), "S2": draw(96), "N": draw(68)}
    for i in range(10):
        parts[f"u{i}"] = draw(36)
    return parts


# (instance, request id, prompt pieces) in the order sent; ("b", "reset", ()) resets b's prefix cache.
PLAN: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("a", "r0", ("S1", "u0")),
    ("b", "r1", ("S1", "u1")),
    ("a", "r2", ("S1", "u2")),
    ("b", "r3", ("S2", "u3")),
    ("a", "r4", ("S2", "u4")),
    ("b", "r5", ("S1", "u0")),
    ("b", "reset", ()),
    ("a", "r6", ("S2", "u6")),
    ("b", "r7", ("S2", "u7")),
    ("a", "r8", ("S1", "u1")),
    ("b", "r9", ("N",)),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "kvtool-live" / "llama-tiny")
    parser.add_argument("--seeds", type=int, nargs=2, default=(0, 0), help="PYTHONHASHSEED of engine a and b")
    parser.add_argument("--report-mode", choices=["incremental", "full"], default="full")
    parser.add_argument("--port", type=int, default=5771, help="first of four ports (a, a replay, b, b replay)")
    args = parser.parse_args()

    captures: dict[str, subprocess.Popen] = {}
    engines: dict[str, subprocess.Popen] = {}
    try:
        return _record(args, captures, engines)
    finally:
        for process in [*engines.values(), *captures.values()]:
            if process.poll() is None:
                process.terminate()


def _record(args, captures: dict, engines: dict) -> int:
    parts = token_sets()
    for index, name in enumerate(("a", "b")):
        folder = args.out / f"instance={name}"
        folder.mkdir(parents=True, exist_ok=True)
        port, replay = args.port + 2 * index, args.port + 2 * index + 1
        captures[name] = subprocess.Popen(
            [sys.executable, "-m", "kvtool", "capture", "--endpoint", f"tcp://127.0.0.1:{port}",
             "--replay-endpoint", f"tcp://127.0.0.1:{replay}", "-o", str(folder / "events.jsonl"),
             "--duration", "900", "--json"],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
    time.sleep(2.0)
    for index, name in enumerate(("a", "b")):
        port, replay = args.port + 2 * index, args.port + 2 * index + 1
        scratch = Path(tempfile.mkdtemp(prefix=f"kvtool-fleet-{name}-"))
        env = dict(vllm_engine_env(scratch), PYTHONHASHSEED=str(args.seeds[index]))
        engines[name] = subprocess.Popen(
            [args.vllm_python, str(HERE / "vllm_fleet_engine.py"), "--model-dir", str(args.model_dir),
             "--endpoint", f"tcp://127.0.0.1:{port}", "--replay-endpoint", f"tcp://*:{replay}",
             "--report-mode", args.report_mode],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=(scratch / "engine.log").open("w"),
        )  # fmt: skip
        print(f"engine {name}: log in {scratch / 'engine.log'}", file=sys.stderr)
        ready = json.loads(engines[name].stdout.readline())  # start one engine after the other (2 cores)
        print(f"engine {name} ready: {ready}", file=sys.stderr)
    records = []
    for instance, request_id, pieces in PLAN:
        engine = engines[instance]
        if request_id == "reset":
            engine.stdin.write(json.dumps({"reset": True}) + "\n")
            engine.stdin.flush()
            print(f"{instance}: {engine.stdout.readline().strip()}", file=sys.stderr)
        else:
            prompt = [t for piece in pieces for t in parts[piece]]
            engine.stdin.write(json.dumps({"id": request_id, "prompt": prompt}) + "\n")
            engine.stdin.flush()
            answer = json.loads(engine.stdout.readline())
            print(f"{instance} {request_id} {'+'.join(pieces)}: {answer}", file=sys.stderr)
            records.append(
                {
                    "request_id": request_id,
                    "instance": instance,
                    "pieces": list(pieces),
                    "prompt_token_ids": prompt,
                    "num_cached_tokens": answer["num_cached_tokens"],
                }
            )
        time.sleep(1.0)  # the batch of this request is published before the next one starts
    for engine in engines.values():
        engine.stdin.close()
        engine.wait(timeout=120)
    time.sleep(2.0)
    for name, capture in captures.items():
        capture.send_signal(signal.SIGTERM)
        out, _ = capture.communicate(timeout=60)
        print(f"capture {name}: {out.strip()}", file=sys.stderr)
    with (args.out / "requests.jsonl").open("w") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
