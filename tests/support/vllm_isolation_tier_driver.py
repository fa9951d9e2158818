"""Record `kvtool vllm isolation` through a KV connector on a real vLLM (tests/data/isolation/README.md, "tier").

    python -m tests.support.vllm_isolation_tier_driver --model DIR --vllm-python PY \
        --connector shipped|salted|tokens-after-eviction --port PORT --record FILE [--repeats 1] [--dimension D]...

Runs ``python -m kvtool vllm isolation --model DIR`` (the default search, every dimension) with vLLM started with
``--kv-transfer-config``: ``shipped`` is vLLM 0.32's own ExampleConnector (a disk tier,
vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py); ``salted`` and ``tokens-after-eviction`` are
tests/support/tier_connector/kvtool_tier_connector.py (planted correct: the tier keyed with vLLM's own block hash;
planted defect: a write-back tier keyed by tokens only).  The tier's files go to a scratch folder, removed after.
Prints the exit code and each dimension's verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONNECTOR_DIR = REPO / "tests" / "support" / "tier_connector"
CONNECTORS = {
    "shipped": {"kv_connector": "ExampleConnector"},
    "salted": {"kvtool_key": "salted", "kvtool_visible": "after-eviction"},
    "tokens-after-eviction": {"kvtool_key": "tokens", "kvtool_visible": "after-eviction"},
}
KV_CACHE_BYTES = 5_000_000  # 152 blocks of 32 tokens on the tiny Llama (shared/docs/vllm-on-cpu.md): few fillers


def kv_transfer_config(connector: str, storage: Path) -> dict:
    extra = {"shared_storage_path": str(storage)}
    if connector == "shipped":
        return {"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
    extra.update(CONNECTORS[connector])
    return {"kv_connector": "KvtoolTierConnector", "kv_connector_module_path": "kvtool_tier_connector",
            "kv_role": "kv_both", "kv_connector_extra_config": extra}  # fmt: skip


def run(model: Path, vllm_python: str, connector: str, port: int, record: Path, repeats: int, timeout_s: float,
        extra: tuple[str, ...] = ()) -> tuple[int, dict]:  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="kvt"))  # short: vLLM's ipc socket paths stay under 107 characters
    try:
        storage = scratch / "tier"
        storage.mkdir()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(REPO), str(CONNECTOR_DIR))))
        for name in ("VLLM_CACHE_ROOT", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
            env[name] = str(scratch / "cache")
        config = json.dumps(kv_transfer_config(connector, storage))
        command = [
            sys.executable, "-m", "kvtool", "vllm", "isolation", "--model", str(model), "--vllm-python", vllm_python,
            "--port", str(port), "--events-port", str(port + 1), "--block-size", "32", "--engine-arg=--enforce-eager",
            "--engine-arg=--max-model-len=2048", f"--engine-arg=--kv-cache-memory-bytes={KV_CACHE_BYTES}",
            f"--engine-arg=--kv-transfer-config={config}", "--repeats", str(repeats), "--record", str(record),
            "--json", *extra,
        ]  # fmt: skip
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode not in (0, 1, 4):
            raise RuntimeError(f"kvtool exited {proc.returncode}: {proc.stderr[-3000:]}")
        return proc.returncode, json.loads(proc.stdout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--connector", choices=tuple(CONNECTORS), required=True)
    parser.add_argument("--port", type=int, default=21820)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dimension", action="append", default=[], help="passed to kvtool (default: every one)")
    args = parser.parse_args()
    extra = tuple(f"--dimension={d}" for d in args.dimension)
    code, report = run(args.model, args.vllm_python, args.connector, args.port, args.record, args.repeats, 3600, extra)
    print(code, {d["dimension"]: d["verdict"] for d in report["dimensions"]})
    return code


if __name__ == "__main__":
    raise SystemExit(main())
