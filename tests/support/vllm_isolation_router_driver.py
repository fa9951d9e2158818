"""Record `kvtool vllm isolation` behind a router in front of two real vLLM engines (tests/data/isolation/README.md,
"Behind a router").

    PYTHONPATH=. python -m tests.support.vllm_isolation_router_driver --model DIR --vllm-python PY --out DIR \
        [--scenario NAME ...]

Starts two engines with kvtool's own launcher (kvtool.vllm.isolation.engine; both publish KV events to the one
port the check's capture binds), then for each scenario puts tests/support/kv_router.py in front of them and
tests/support/salt_gateway.py (tenants k1, k2, k3, three salts) in front of the router, runs the check in endpoint
mode through the gateway and writes ``vllm-0.32-router-NAME.json.gz`` into --out.  The engines are shared by the
scenarios: each run's content is fresh (its own seed), so no run can hit another's blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.engine import Engine, EngineSpec, free_port
from kvtool.vllm.isolation.record import write_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support.kv_router import KvRouter
from tests.support.salt_gateway import CORRECT, SaltGateway

ENGINE_ARGS = ("--enforce-eager", "--max-model-len=2048", "--kv-cache-memory-bytes=50000000")
TENANTS = (("t1", "k1"), ("t2", "k2"), ("t3", "k3"))
SEARCH = {"dimensions": ("salt", "salt-variant", "length"), "lengths": (1, 9)}


@dataclasses.dataclass(frozen=True)
class Scenario:
    policy: str
    defect: str | None
    options: dict  # IsolationOptions fields beyond the common ones
    seed: int


SCENARIOS = {
    "prefix-correct": Scenario("prefix", None, SEARCH, 101),
    "prefix-drop-salt": Scenario("prefix", "drop-salt", SEARCH, 102),
    "prefix-lowercase-salt": Scenario("prefix", "lowercase-salt", SEARCH, 103),
    "round-robin": Scenario("round-robin", None, {"dimensions": ("salt",), "minimize": False}, 104),
    "round-robin-repeat-primes": Scenario("round-robin", None, {"dimensions": ("salt",), "repeat_primes": 2}, 105),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kvr"))
    for name in ("VLLM_CACHE_ROOT", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[name] = str(scratch / name.lower())
    events_port = free_port()
    specs = [EngineSpec(args.vllm_python, args.model, free_port(), events_port, 32, ENGINE_ARGS) for _ in range(2)]
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, True)  # after the engines stop (the stack unwinds in reverse)
        started = time.monotonic()
        engines = [stack.enter_context(Engine(spec)) for spec in specs]
        say(f"two engines up in {time.monotonic() - started:.1f} s: {', '.join(e.url for e in engines)}")
        for name in args.scenario or list(SCENARIOS):
            scenario = SCENARIOS[name]
            router = KvRouter([e.url for e in engines], policy=scenario.policy, defect=scenario.defect, block_size=32)
            with router, SaltGateway(router.url, CORRECT) as gateway:
                note = f"router: {scenario.policy}, {scenario.defect or 'correct'}; 2 engines; tenant gateway in front"
                options = IsolationOptions(
                    endpoint=gateway.url, api_keys=TENANTS, events_endpoint=f"tcp://127.0.0.1:{events_port}",
                    repeats=1, seed=scenario.seed, note=note, **scenario.options,
                )  # fmt: skip
                started = time.monotonic()
                record = run_isolation(options, progress=say)
                wall = time.monotonic() - started
            report = judge_record(record)
            path = args.out / f"vllm-0.32-router-{name}.json"
            write_record(record, path)
            Path(str(path) + ".gz").write_bytes(gzip.compress(path.read_bytes(), mtime=0))
            path.unlink()
            headline = f" - {report.headline}" if report.headline else ""
            print(f"{name}: exit {report.exit_code} {report.verdict}{headline}; "
                  f"{ {d.dimension: d.verdict for d in report.dimensions} }; {len(record.results)} requests, "
                  f"{wall:.1f} s; routed {router.routed.count(0)}/{router.routed.count(1)}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
