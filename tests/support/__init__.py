"""Helpers shared by the tests (paths, subprocess runners); fixtures stay in tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DATA = REPO_ROOT / "tests" / "data"


def run_subprocess(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    """Run ``python -m kvtool ARGS...`` in a fresh interpreter (for import and exit-code checks)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "kvtool", *map(str, args)],
        cwd=cwd or REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def heavy_modules_loaded_by(*invocations: list[str], modules=("torch", "pandas", "numpy", "matplotlib")):
    """Run each ``kvtool`` argument list in one fresh interpreter; return (exit codes, stdout, heavy modules loaded).

    The start-up rule (README, STYLE.md): `kvtool --help` and `kvtool estimate` never import torch or pandas.
    """
    code = "import sys\nfrom kvtool.cli import run\ncodes = []\n"
    code += "".join(f"codes.append(run({list(argv)!r}))\n" for argv in invocations)
    code += f"print('CODES', codes, 'HEAVY', [m for m in {list(modules)!r} if m in sys.modules])\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import ast

    last = proc.stdout.strip().splitlines()[-1]
    codes_text, heavy_text = last.removeprefix("CODES ").split(" HEAVY ")
    return ast.literal_eval(codes_text), proc.stdout, ast.literal_eval(heavy_text)


def vllm_engine_env(scratch: Path, base: dict | None = None) -> dict[str, str]:
    """The environment of a real vLLM run here: offline, loopback only, every cache under ``scratch``.

    Recipe: shared/docs/vllm-on-cpu.md.  ``scratch`` must be a short path (vLLM's ipc socket paths stay under 107
    characters), so not pytest's tmp_path.
    """
    folders = {
        "TMPDIR": "tmp",
        "VLLM_RPC_BASE_PATH": "rpc",
        "VLLM_CACHE_ROOT": "cache",
        "HF_HOME": "hf",
        "XDG_CACHE_HOME": "xdg",
        "TORCHINDUCTOR_CACHE_DIR": "inductor",
    }
    env = dict(os.environ if base is None else base)
    env.update(
        VLLM_HOST_IP="127.0.0.1",
        VLLM_LOOPBACK_IP="127.0.0.1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    for name, folder in folders.items():
        (scratch / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / folder)
    return env
