"""Record `kvtool vllm isolation` through a tenant gateway in front of a real vLLM (tests/data/isolation/README.md).

    PYTHONPATH=. python -m tests.support.vllm_isolation_search_driver --model DIR --vllm-python PY \
        --gateway third-tenant-shares|correct --record FILE

Starts vLLM with kvtool's own launcher (kvtool.vllm.isolation.engine), puts tests/support/salt_gateway.py in front
of it and runs the salt dimension in endpoint mode with three tenants (keys k1, k2, k3) through the gateway.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvtool.vllm.isolation.check import IsolationOptions, run_isolation
from kvtool.vllm.isolation.engine import Engine, EngineSpec, free_port
from kvtool.vllm.isolation.record import write_record
from kvtool.vllm.isolation.verdicts import judge_record
from tests.support.salt_gateway import CORRECT, THIRD_TENANT_SHARES, SaltGateway


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--gateway", choices=("third-tenant-shares", "correct"), required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--port", type=int, default=21690)
    args = parser.parse_args()
    events_port = free_port()
    spec = EngineSpec(args.vllm_python, args.model, args.port, events_port, 32,
                      ("--enforce-eager", "--max-model-len=2048", "--kv-cache-memory-bytes=50000000"))  # fmt: skip
    salts = THIRD_TENANT_SHARES if args.gateway == "third-tenant-shares" else CORRECT
    with Engine(spec) as engine, SaltGateway(engine.url, salts) as gateway:
        options = IsolationOptions(
            endpoint=gateway.url, dimensions=("salt",), api_keys=(("t1", "k1"), ("t2", "k2"), ("t3", "k3")),
            events_endpoint=f"tcp://127.0.0.1:{events_port}", repeats=1, note=f"gateway: {args.gateway}",
        )  # fmt: skip
        record = run_isolation(options, progress=lambda m: print(m, file=sys.stderr))
    write_record(record, args.record)
    report = judge_record(record)
    print(report.verdict, {d.dimension: d.verdict for d in report.dimensions})
    return report.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
