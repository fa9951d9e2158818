"""`kvtool vllm isolation`: does a serving engine's prefix cache keep tenants, adapters and embeddings apart?"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from kvtool.cli.options import JsonOpt, path_option
from kvtool.cli.output import handle_errors
from kvtool.core.errors import UsageError

EXAMPLES = """
Examples:

  kvtool vllm isolation --endpoint http://127.0.0.1:8000 --adapter my-lora --hidden-size 4096

  kvtool vllm isolation --model ./tiny-llama --vllm-python /opt/vllm/bin/python --record run.json

  kvtool vllm isolation --replay run.json --json

Exit codes: 0 every dimension passed, 1 a leak, 4 inconclusive, 2 a usage error, 3 a --replay file that is not a
record.
"""


def _tenant_keys(values: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        tenant, sep, key = value.partition("=")
        if not sep or not tenant or not key:
            # the value is not quoted: without its '=' it may be a key alone
            what = "no '='" if not sep else "an empty tenant" if not tenant else f"tenant {tenant!r} with an empty key"
            raise UsageError(f"--api-key takes TENANT=KEY; the value given has {what}", where="--api-key")
        pairs.append((tenant, key))
    return tuple(pairs)


def _progress(message: str) -> None:
    sys.stderr.write(message + "\n")


def _judge_and_print(replay: Path | None, options, record: Path | None, json_out: bool) -> int:
    """Run (or read) the check, print its report, and return the exit code."""
    from kvtool.cli.output import print_json, stdout_console
    from kvtool.vllm.isolation.record import read_record, write_record
    from kvtool.vllm.isolation.render import report_renderables
    from kvtool.vllm.isolation.verdicts import judge_record

    if replay is not None:
        recorded = read_record(replay)
    else:
        from kvtool.vllm.isolation.check import run_isolation

        recorded = run_isolation(options, progress=_progress)
        if record is not None:
            write_record(recorded, record)
    report = judge_record(recorded)
    if json_out:
        print_json(report)
    else:
        console = stdout_console()
        for renderable in report_renderables(report):
            console.print(renderable)
    return report.exit_code


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Check a running vLLM (or one kvtool starts) from the outside.", no_args_is_help=True)
    app.add_typer(group, name="vllm")

    @group.command("isolation", epilog=EXAMPLES)
    @handle_errors
    def isolation(
        endpoint: Optional[str] = typer.Option(
            None, "--endpoint", help="A running OpenAI-compatible server (base URL)."
        ),
        model: Optional[Path] = path_option(
            None,
            "--model",
            empty_tip="give a model folder ('.' for the current one)",
            help="A model folder: kvtool starts vLLM on it itself.",
        ),
        vllm_python: Optional[str] = typer.Option(
            None, "--vllm-python", help="The Python with vLLM (--model mode; default: $VLLM_PYTHON or this one)."
        ),
        served_model: Optional[str] = typer.Option(
            None, "--served-model", help="The base model's served name (default: the first of /v1/models)."
        ),
        dimension: list[str] = typer.Option(
            [],
            "--dimension",
            help="salt, adapter, adapter-version, embeddings or cross (repeat; default: all that can run).",
        ),
        adapter: list[str] = typer.Option([], "--adapter", help="A served LoRA adapter name (repeat; endpoint mode)."),
        adapter_version: list[str] = typer.Option(
            [],
            "--adapter-version",
            help="An adapter path on the server; give two: kvtool loads both under one name (needs runtime LoRA loading).",
        ),
        api_key: list[str] = typer.Option(
            [],
            "--api-key",
            help="TENANT=KEY, for gateways that derive the salt from credentials (repeat, at least two).",
        ),
        key: Optional[str] = typer.Option(
            None, "--key", help="API key for every other request.", envvar="KVTOOL_API_KEY"
        ),
        hidden_size: Optional[int] = typer.Option(
            None, "--hidden-size", help="The model's hidden size, for the embeddings dimension (endpoint mode)."
        ),
        block_size: Optional[int] = typer.Option(
            None,
            "--block-size",
            help="KV block size in tokens (default: vLLM's cache_config_info metric; --model: passed to vLLM).",
        ),
        events: Optional[str] = typer.Option(
            None, "--events", help="vLLM's ZMQ KV-event endpoint as in its --kv-events-config (endpoint mode)."
        ),
        port: Optional[int] = typer.Option(
            None, "--port", help="--model mode: the HTTP port on 127.0.0.1 (default: a free one)."
        ),
        events_port: Optional[int] = typer.Option(
            None, "--events-port", help="--model mode: the KV-event port (default: a free one)."
        ),
        engine_arg: list[str] = typer.Option(
            [], "--engine-arg", help="--model mode: one more vLLM argument, e.g. --engine-arg=--enforce-eager (repeat)."
        ),
        startup_timeout: float = typer.Option(
            600.0, "--startup-timeout", help="--model mode: seconds to wait for vLLM."
        ),
        repeats: int = typer.Option(2, "--repeats", help="Trials per ordered pair and variant, each on fresh content."),
        repeat_primes: int = typer.Option(
            1,
            "--repeat-primes",
            help="Send each prime N times in a row: behind a router over N engines, every engine then holds it.",
        ),
        budget: int = typer.Option(
            1500, "--budget", help="At most this many requests (0: no bound); the report lists what it left out."
        ),
        length: list[int] = typer.Option(
            [], "--length", help="Full blocks of the length dimension's prompts (repeat; default: 1 up to the limit)."
        ),
        minimize: bool = typer.Option(
            True, "--minimize/--no-minimize", help="Shrink each dimension's first leak to its shortest, simplest case."
        ),
        seed: Optional[int] = typer.Option(None, "--seed", help="Fix the random content (default: fresh every run)."),
        record: Optional[Path] = path_option(
            None,
            "--record",
            empty_tip="give the JSON file to write",
            help="Write what the run observed (responses, counters, KV events) as JSON.",
        ),
        replay: Optional[Path] = path_option(
            None,
            "--replay",
            empty_tip="give a file written by --record",
            help="Judge a recorded run again instead of probing.",
        ),
        json_output: JsonOpt = False,
    ) -> None:
        """Check that tenants, LoRA adapters, adapter versions and embeddings never share KV blocks.

        Per dimension, a control pair that must share runs right before each isolation pair that must not.

        Fresh random prompts, both orders, exact and shared-prefix variants; see docs/isolation.md.
        """
        if replay is not None:
            if endpoint or model:
                raise UsageError("--replay judges a recorded run: leave out --endpoint and --model", where="--replay")
            raise typer.Exit(_judge_and_print(replay, None, None, json_output))
        from kvtool.vllm.isolation.check import IsolationOptions
        from kvtool.vllm.isolation.plan import DIMENSIONS

        options = IsolationOptions(
            endpoint=endpoint, model_dir=model, vllm_python=vllm_python, base_model=served_model,
            dimensions=tuple(dimension) or DIMENSIONS, adapters=tuple(adapter),
            adapter_versions=tuple(adapter_version), api_keys=_tenant_keys(api_key), api_key=key,
            hidden_size=hidden_size, block_size=block_size, events_endpoint=events, port=port,
            events_port=events_port, repeats=repeats, seed=seed, engine_args=tuple(engine_arg),
            startup_timeout_s=startup_timeout, budget_requests=budget or None, lengths=tuple(length),
            minimize=minimize, repeat_primes=repeat_primes,
        )  # fmt: skip
        raise typer.Exit(_judge_and_print(None, options, record, json_output))
