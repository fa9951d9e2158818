"""Record what `kvtool estimate --json` and `kvtool simulate --json` print for ~60 varied command lines, to check a
refactor changes nothing (issue 24: estimate's orchestration as a straight pass).

    python -m tests.support.estimate_snapshot record before.json
    python -m tests.support.estimate_snapshot record after.json
    python -m tests.support.estimate_snapshot diff before.json after.json

Each entry keeps the arguments, the exit code, stdout (parsed when it is JSON) and stderr.  A Hugging Face cache with
one model (tests/data/estimate/tiny-llama under acme/tiny-llama) is made in a temporary HF_HOME, so that the cached
form of --model is covered without the network.  The commands run in one interpreter through typer's CliRunner
(the same path as ``kvtool``), which keeps the run short on a small machine.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = "tests/data/estimate"

E = ["estimate", "--json"]
S = ["simulate", "--json"]

COMMANDS: list[list[str]] = [
    # profiles, no budget
    [*E, "--model", "llama-2-7b", "--seq-len", "2048", "--kv-dtype", "fp16"],
    [*E, "--model", "llama-3.1-8b"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h100-80gb"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "L4"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--seq-len", "8192", "--batch", "32"],
    [*E, "--model", "llama-3.1-70b", "--gpu", "h100-80gb", "--tp", "4", "--seq-len", "32768"],
    [*E, "--model", "llama-3.1-70b", "--gpu", "h100-80gb", "--tp", "2", "--pp", "2", "--seq-len", "8192"],
    [*E, "--model", "llama-3.1-70b", "--gpu", "l4", "--seq-len", "8192", "--batch", "8"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h200", "--kv-dtype", "fp8", "--seq-len", "4096,8192,16384"],
    [*E, "--model", "llama-3.1-8b", "--gpu-memory", "24GiB", "--seq-len", "4096", "--batch", "1,4,16"],
    [*E, "--model", "llama-3.1-8b", "--kv-memory", "10GiB", "--seq-len", "8192"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "b200", "--gpu-memory-utilization", "0.95"],
    [*E, "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--tp", "2", "--compare"],
    [*E, "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--seq-len", "16384"],
    [*E, "--model", "deepseek-v3", "--kv-dtype", "fp8_ds_mla", "--seq-len", "4096", "--compare"],
    [*E, "--model", "gpt-oss-120b", "--gpu", "h100-80gb", "--seq-len", "131072"],
    [*E, "--model", "gpt-oss-20b", "--gpu", "l40s", "--no-async-scheduling"],
    [*E, "--model", "qwen3-next-80b", "--gpu", "h200", "--tp", "2", "--no-enable-prefix-caching"],
    [*E, "--model", "qwen2.5-7b", "--gpu", "rtx-4090", "--quantization", "fp8", "--seq-len", "16384"],
    [*E, "--model", "qwen2.5-72b", "--gpu", "mi300x", "--tp", "2", "--block-size", "32"],
    [*E, "--model", "phi-3-mini", "--gpu", "a10g", "--enforce-eager", "--max-num-seqs", "64"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--max-num-batched-tokens", "4096", "--reserve", "3GiB"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--activation-memory", "2GiB", "--cudagraph-memory", "0"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "l4", "--seq-len", "131072", "--batch", "4"],
    [*E, "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "1024"],
    [*E, "--model", "llama-3.1-8b", "--seq-len", "200000"],
    [*E, "--model", "llama-2-7b", "--dtype", "float32", "--seq-len", "4096"],
    # configs
    [*E, "--config", f"{DATA}/tiny-llama", "--seq-len", "1024"],
    [*E, "--config", f"{DATA}/tiny-llama/config.json", "--gpu-memory", "8GiB"],
    [*E, "--config", f"{DATA}/deepseek-v2-lite", "--gpu", "h100-80gb"],
    [*E, "--config", f"{DATA}/gemma-2-9b", "--gpu", "l40s", "--seq-len", "8192", "--compare"],
    [*E, "--config", f"{DATA}/gemma-3-27b-it", "--gpu", "h100-80gb", "--seq-len", "32768"],
    [*E, "--config", f"{DATA}/gemma-3n-e4b-it", "--kv-memory", "4GiB", "--seq-len", "8192"],
    [*E, "--config", f"{DATA}/gemma-4-31b-it", "--kv-memory", "20GiB", "--seq-len", "32768"],
    [*E, "--config", f"{DATA}/gemma-4-e4b-it", "--kv-memory", "4GiB", "--seq-len", "8192"],
    [*E, "--config", f"{DATA}/granite-4.0-h-micro", "--kv-memory", "10GiB", "--seq-len", "8192"],
    [*E, "--config", f"{DATA}/granite-4.0-h-small", "--kv-memory", "20GiB", "--seq-len", "8192", "--tp", "2"],
    [*E, "--config", f"{DATA}/llama-4-scout", "--kv-memory", "30GiB", "--seq-len", "65536"],
    [*E, "--config", f"{DATA}/mistral-7b-v0.1", "--gpu", "a100-40gb", "--seq-len", "8192,32768"],
    [*E, "--config", f"{DATA}/mistral-small-3.2-24b", "--gpu", "h100-80gb", "--kv-dtype", "fp8"],
    [*E, "--config", f"{DATA}/nemotron-3-nano-30b-a3b", "--kv-memory", "20GiB", "--seq-len", "8192"],
    [*E, "--config", f"{DATA}/falcon-7b", "--gpu", "a10", "--seq-len", "2048", "--batch", "4"],
    # manual
    [*E, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--seq-len", "8192", "--batch", "4"],
    [*E, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-memory", "16GiB", "--kv-dtype", "int4"],
    # cached Hugging Face model
    [*E, "--model", "acme/tiny-llama", "--seq-len", "1024"],
    # errors
    [*E, "--model", "nope"],
    [*E, "--model", "acme/absent"],
    [*E, "--model", "llama-3.1-8b", "--tp", "3"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--gpu-memory", "80GiB"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--block-size", "8"],
    [*E, "--model", "llama-3.1-8b", "--gpu-memory", "80"],
    [*E, "--model", "llama-3.1-8b", "--kv-memory", "10GiB", "--reserve", "1GiB"],
    [*E, "--model", "llama-3.1-8b", "--seq-len", "0"],
    [*E, "--model", "", "--seq-len", "1024"],
    [*E, "--config", f"{DATA}/tiny-llama", "--model", "llama-3.1-8b"],
    [*E, "--model", DATA + "/tiny-llama"],
    [*E, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--quantization", "bogus"],
    # simulate
    [*S, "--dist", "fixed", "--length", "100", "--requests", "10"],
    [*S, "--dist", "lognormal", "--mean", "1000", "--p99", "6000", "--requests", "200", "--block-size", "16,32"],
    [*S, "--dist", "uniform", "--min", "100", "--max", "4000", "--requests", "300", "--gpu", "h100-80gb"],
    [*S, "--dist", "lognormal", "--mean", "800", "--p99", "5000", "--requests", "300", "--serve", "--qps", "20"],
    [*S, "--dist", "fixed", "--length", "2000", "--requests", "200", "--serve", "--gpu", "h100-80gb", "--block-sizes", "16"],
    [*S, "--dist", "fixed", "--length", "2000", "--requests", "200", "--serve", "--gpu", "l4", "--model", "llama-3.1-8b", "--block-size", "16,32"],
    [*S, "--dist", "fixed", "--length", "1500", "--requests", "100", "--serve", "--gpu", "a100-80gb", "--max-num-seqs", "64", "--block-sizes", "16"],
    [*S, "--dist", "fixed", "--length", "1000", "--requests", "100", "--serve", "--config", f"{DATA}/mistral-7b-v0.1", "--gpu", "h200", "--block-sizes", "16"],
    [*S, "--dist", "fixed", "--length", "100", "--requests", "10", "--block-sizes", "0"],
    [*S, "--dist", "fixed", "--length", "100", "--requests", "10", "--gpu", "nope"],
]  # fmt: skip


def _fake_cache(home: Path) -> None:
    """acme/tiny-llama in huggingface_hub's cache layout (refs/main -> snapshots/<hash>/config.json)."""
    repo = home / "hub" / "models--acme--tiny-llama"
    (repo / "snapshots" / "0123abc").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc\n")
    config = (ROOT / DATA / "tiny-llama" / "config.json").read_text()
    (repo / "snapshots" / "0123abc" / "config.json").write_text(config)


def record(out: Path) -> None:
    from typer.testing import CliRunner

    from kvtool.cli import app

    os.chdir(ROOT)
    entries = []
    with tempfile.TemporaryDirectory(prefix="kvtool-snap-") as home:
        os.environ.pop("HF_HUB_CACHE", None)
        os.environ["HF_HOME"] = home
        os.environ.pop("KVTOOL_PROFILES", None)
        _fake_cache(Path(home))
        runner = CliRunner()
        for args in COMMANDS:
            r = runner.invoke(app, args)
            try:
                stdout: object = json.loads(r.stdout)
            except ValueError:
                stdout = r.stdout
            stderr = r.stderr.replace(home, "$HF_HOME")
            entries.append({"args": args, "exit_code": r.exit_code, "stdout": _scrub(stdout, home), "stderr": stderr})
    out.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    print(f"{len(entries)} commands recorded in {out}", file=sys.stderr)


def _scrub(value: object, home: str) -> object:
    """The temporary HF_HOME's path replaced by a constant, so two recordings compare."""
    if isinstance(value, str):
        return value.replace(home, "$HF_HOME")
    if isinstance(value, list):
        return [_scrub(v, home) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v, home) for k, v in value.items()}
    return value


def diff(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    changed = 0
    for x, y in zip(a, b, strict=True):
        if x != y:
            changed += 1
            print(" ".join(x["args"]))
            for key in ("exit_code", "stdout", "stderr"):
                if x[key] != y[key]:
                    _show(key, x[key], y[key])
    print(f"{changed} of {len(a)} commands differ", file=sys.stderr)
    return 1 if changed else 0


def _show(key: str, x: object, y: object) -> None:
    if isinstance(x, dict) and isinstance(y, dict):
        for field in sorted(set(x) | set(y)):
            if x.get(field) != y.get(field):
                print(f"  {key}.{field}: {json.dumps(x.get(field))[:300]}\n    -> {json.dumps(y.get(field))[:300]}")
        return
    print(f"  {key}: {json.dumps(x)[:400]}\n    -> {json.dumps(y)[:400]}")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        record(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "diff":
        return diff(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
